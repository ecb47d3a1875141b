/* reply_layers_int.h — the layer axis of a routed_experts array, internal
 * to src/format (reply_layers.c): which of an array's layer rows are the
 * model's MoE layers, and the rows cut down to them (or spread out to every
 * hidden layer, for the emulator).
 *
 * vLLM's capturer sizes its buffer by the model's num_hidden_layers and
 * writes each MoE layer's ids at that layer's index; a dense layer's row
 * keeps the zeros the buffer was cleared to (docs/vllm.md, "The layer
 * axis"). So a reply of a model with dense layers (Llama-4 Maverick,
 * DeepSeek-V3) carries more layer rows than the model has MoE layers, and
 * an older build or SGLang may carry the MoE layers only. The readers
 * (reply_experts.c) map either form onto the caller's MoE layers with these
 * functions, so the router, the recorder and the fit share one mapping.
 *
 * Ownership: nothing here allocates; data is the caller's. Errors: none
 * (the callers name them). Threads: no state. */
#ifndef ELDR_FORMAT_REPLY_LAYERS_INT_H
#define ELDR_FORMAT_REPLY_LAYERS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"

/* Can an array of La layer rows be read as the L layers at model layers
 * ids (NULL: 0..L-1)? 1 when La == L (the MoE-only form), or when La > L,
 * ids is given, strictly increasing, its last id < La and ids are not
 * 0..L-1 (the all-layers form: MoE layer l is row ids[l]; ids 0..L-1 say
 * the model has no dense layer among them, so more rows are another
 * model's); else 0. */
int eldr__re_layers_mappable(size_t La, uint32_t L, const uint32_t *ids);

/* Is a value a dense layer's fill? vLLM's rows of dense layers are 0 (its
 * buffer is zeroed before every step), other builds write -1; a real top-k
 * row never repeats an id, so a layer whose every id is <= 0 is dense when
 * some id is negative or top_k >= 2. With top_k 1 a layer of zeros is
 * ambiguous (every token may have picked expert 0) and counts as MoE.
 * dense[l] (La flags) is set for the dense layers of rows x La x K ids of
 * dtype t; returns how many. rows 0: none is dense. */
size_t eldr__re_dense_layers(const void *data, eldr_sel_dtype t, size_t rows, size_t La, size_t K,
                             uint8_t *dense);

/* Cut rows x La x K ids of itemsize isz, in place, to rows x n x K: row t's
 * layer i becomes its layer keep[i] (keep strictly increasing, < La). */
void eldr__re_keep_layers(void *data, size_t isz, size_t rows, size_t La, size_t K, const uint32_t *keep,
                          size_t n);

/* Spread rows x L x K host-order ids over La layers into out (rows x La x
 * K): MoE layer l at row ids[l], every other layer's ids 0 (vLLM's fill). */
void eldr__re_spread_layers(const uint16_t *in, size_t rows, size_t L, size_t K, const uint32_t *ids, size_t La,
                            uint16_t *out);

#endif
