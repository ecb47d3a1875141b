/* eldr/reply_compact.h — the compact signature form (docs/vllm.md, "The
 * compact form"): a prefill reply's per-(MoE layer, expert) prompt counts,
 * computed next to the engine (contrib/vllm-eldr-counts, or `eldr worker
 * --routed-experts-layout compact`) and carried in the reply's
 * kv_transfer_params under one key, so the routed_experts array of
 * megabytes never has to leave the engine:
 *
 *   "kv_transfer_params": {..., "eldr_expert_counts": {
 *       "encoding": "base64", "dtype": "uint16", "shape": [L, E],
 *       "layers": [l0, ..., l(L-1)], "top_k": K, "tokens": T, "first_token": F,
 *       "data": "<base64 of L x E little-endian uint16, row-major>"}}
 *
 * Row r counts, for each expert, the prompt tokens [F, F + T) that selected
 * it at model layer layers[r] (strictly increasing); counts saturate at
 * 65535. first_token is optional (0). A valid row of a MoE layer sums to
 * T x K with no entry above T (a token's top-k ids are distinct), unless
 * an entry saturated.
 *
 * Reading maps the rows onto the caller's MoE layers by layer id (the
 * artifact's; every one must be present) and reads only the rows of the
 * layers in the mask, which it checks; with no layers given it reads every
 * row that can be a MoE layer's (a row whose expert-0 count exceeds T is a
 * dense layer's zero ids, and is dropped). Rejections carry an
 * eldr_re_reason (the routed_experts reasons, bad_counts for counts no
 * prompt gives) and a message.
 *
 * Ownership: nothing is kept; counts and ids are the caller's. Threads: any.
 */
#ifndef ELDR_REPLY_COMPACT_H
#define ELDR_REPLY_COMPACT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/jscan.h"
#include "eldr/reply_experts.h"

#define ELDR_COMPACT_KEY "eldr_expert_counts"

typedef struct eldr_compact_opts {
  uint32_t num_layers;       /* the artifact's L; 0: read every MoE-looking row */
  const uint32_t *layer_ids; /* their model layer ids (NULL: 0..L-1) */
  uint32_t num_experts;      /* E must equal it (0: any) */
  uint32_t top_k;            /* K must equal it (0: any) */
  const uint8_t *layer_mask; /* num_layers flags: only these rows are read (NULL: all) */
} eldr_compact_opts;

typedef struct eldr_compact_info {
  size_t tokens, first_token;
  uint32_t rows, experts, top_k; /* as sent */
  uint32_t layers;               /* rows read into counts (with num_layers 0: their count) */
} eldr_compact_info;

/* Read the compact object v (a span of doc the scanner accepted) into
 * counts (accumulated): num_layers x E entries in the artifact's layer
 * order, or with num_layers 0 the rows kept, in order, their model layer
 * ids into ids (ELDR_MAX_LAYERS capacity). counts NULL: checked, info
 * filled, nothing counted (to size a buffer). 0, or an ELDR_E* code with
 * *why and a message in d (counts may then hold a partial sum: discard them). */
int eldr_compact_read(const char *doc, eldr_js_span v, const eldr_compact_opts *o, uint32_t *counts,
                      uint32_t *ids, eldr_compact_info *info, eldr_re_reason *why, eldr_diag *d);

/* The counts of rows x L x K host-order ids (ids < shape->num_experts) as
 * the compact object, set as kv[ELDR_COMPACT_KEY] (kv: a jansson object,
 * void* so this header needs no jansson), rows at the model layers
 * layer_ids (L entries, NULL: 0..L-1), tokens = rows starting at
 * first_token. 0, ELDR_EINVAL or ELDR_ENOMEM. */
int eldr_compact_emit(void *kv, const uint16_t *sel, size_t rows, const eldr_shape *shape,
                      const uint32_t *layer_ids, size_t first_token);

#endif
