/* eldr/reply_sglang.h — SGLang's routed_experts wire form (docs/sglang.md,
 * "Routed experts"): base64 of the raw little-endian int32 bytes of a
 * (rows, hidden layers, top_k) array in C order, no header, no shape
 * (detokenizer_manager.py, _extract_routed_experts; read back with
 * np.frombuffer(..., dtype=np.int32)). It travels as "sglext":
 * {"routed_experts": "..."} at the top of an OpenAI-format reply (one per
 * reply: the first item's) and as meta_info.routed_experts per item of a
 * /generate reply. The capturer's buffer has a row per hidden layer of the
 * model; dense layers stay 0.
 *
 * Since no shape travels, the reader takes it from what it knows: the
 * rows are the prompt's tokens (a PD prefill's rows: seqlen - 1 with one
 * sampled token), top_k is the model's, and the hidden layers are then
 * the payload's length / (rows x top_k x 4), which must be a whole number
 * at least the last MoE layer's id + 1.
 *
 * Safety: any bytes are accepted; sizes are overflow-checked; ids are
 * checked (0 <= id < num_experts) in the MoE layers read, before anything
 * is returned. Ownership: out buffers are the caller's (grown with
 * realloc). Threads: any.
 */
#ifndef ELDR_REPLY_SGLANG_H
#define ELDR_REPLY_SGLANG_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/reply_experts.h"

/* rows x L x K host-order ids (MoE layer l at model layer layer_ids[l],
 * NULL: l) as SGLang sends them: base64 of rows x hidden x K int32, the
 * layers that are not MoE zero. *out malloc'd, NUL-terminated, *out_len
 * (may be NULL) without the NUL. ELDR_EINVAL (hidden below the last MoE
 * layer + 1, a bad shape) or ELDR_ENOMEM. */
int eldr_sglang_experts_emit(const uint16_t *sel, size_t rows, const eldr_shape *shape,
                             const uint32_t *layer_ids, uint32_t hidden, char **out, size_t *out_len);

typedef struct eldr_sglang_opts {
  size_t rows;               /* the rows the array must have (usage's prompt tokens) */
  uint32_t num_layers;       /* L: the MoE layers to read */
  const uint32_t *layer_ids; /* their model layer ids, strictly increasing (NULL: 0..L-1) */
  uint32_t top_k, num_experts;
  const uint8_t *layer_mask; /* L flags: only these layers are checked and kept (NULL: all) */
} eldr_sglang_opts;

/* Decode b64[0..len) into *buf (rows x L x K int32 little-endian, the MoE
 * layers only, in layer order; the masked-out layers' ids zero; *cap grown
 * with realloc and kept for the next call) and count them into counts
 * (L*E, accumulated; NULL: not counted). *hidden receives the layers the
 * array had. 0, or an ELDR_E* code with *why (eldr_re_reason) and a
 * message in d: bad_base64, length_mismatch (not a whole number of rows x
 * K int32 values, or fewer hidden layers than the MoE ids need),
 * negative_id, id_out_of_range, too_large, out_of_memory. */
int eldr_sglang_experts_read(const char *b64, size_t len, const eldr_sglang_opts *o, uint8_t **buf,
                             size_t *cap, uint32_t *hidden, uint32_t *counts, eldr_re_reason *why,
                             eldr_diag *d);

/* An SGLang reply's routed experts, read from the reply's bytes without a
 * tree: "sglext": {"routed_experts": "<base64>"} at the top of an
 * OpenAI-format reply or streamed chunk (serving_completions.py /
 * serving_chat.py; protocol.py SglExt), or meta_info.routed_experts of a
 * /generate reply (a batched /generate reply, a JSON list of items: its
 * first item's). The rows are o->rows, or when that is 0 the reply's
 * usage.prompt_tokens (meta_info.prompt_tokens), as SGLang's PD prefill
 * sends the prompt's rows (docs/sglang.md "Routed experts"); *rows
 * receives the rows used. A string with JSON escapes is decoded first
 * (into a temporary copy). Returns 0 (read as eldr_sglang_experts_read
 * reads it), 1 (the reply has no routed experts: the member absent or
 * null), or an ELDR_E* code with *why: not_json (not a JSON object),
 * bad_type (the member not a string, no usable prompt_tokens when o->rows
 * is 0, sglext not an object), or eldr_sglang_experts_read's reasons; a
 * list whose first item is not an object is not_json. */
int eldr_sglang_reply_experts(const char *doc, size_t n, const eldr_sglang_opts *o, uint8_t **buf, size_t *cap,
                              uint32_t *hidden, size_t *rows, uint32_t *counts, eldr_re_reason *why, eldr_diag *d);

#endif
