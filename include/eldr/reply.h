/* eldr/reply.h — what the router reads of a worker's reply, one API
 * (docs/serve.md, "The wire protocol"; docs/vllm.md for the layouts):
 *
 *   eldr_reply_prefill_*     a prefill reply, read once when it arrives: its
 *                            kv_transfer_params and usage.prompt_tokens_details
 *                            as JSON text (what the decode leg and the decode
 *                            reply take from it), prompt_tokens, cached_tokens,
 *                            choice 0's routed_experts string and the compact
 *                            counts' span (eldr/reply_compact.h) where they lie
 *                            in its bytes; by the byte scanner, without a tree,
 *                            or by jansson when the caller needs the tree;
 *   eldr_reply_decode_counts the generated rows of a decode reply's first
 *                            choice, counted (the watch's live rho, the
 *                            recorder's decode counts);
 *   eldr_reply_prompt_rows   the prompt rows of a reply's tree over the model's
 *                            MoE layers (the recorder's prompt counts).
 *
 * The routed_experts values in them are read by eldr/reply_experts.h (every
 * layout vLLM ships), the compact counts by eldr/reply_compact.h, a
 * stream's last routed_experts event by eldr/reply_stream.h; the decode
 * reply's edits (the prefill's values put in) by eldr/reply_splice.h.
 *
 * Ownership: an eldr_reply_prefill owns its tree, its copy of the reply and
 * the text of its two objects; routed_experts and compact point into that
 * copy (or into the tree). It is zeroed before its first read; a read into
 * one that was read before reuses its copy's buffer. Errors: ELDR_EPARSE
 * (not JSON, or not an object) or ELDR_ENOMEM, with a message. Threads: no
 * global state; one reply per thread.
 */
#ifndef ELDR_REPLY_H
#define ELDR_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/jscan.h"
#include "eldr/reply_experts.h"

/* ---- the prefill reply ------------------------------------------------------ */

typedef struct eldr_reply_prefill {
  void *root;                 /* owned json_t *: the whole reply, or NULL (read by the scanner) */
  void *kv_transfer_params;   /* borrowed json_t * of root, NULL when absent or no tree */
  const char *routed_experts; /* choices[0].routed_experts when a string: its text (the
                                 tree's, or as it lies in raw, escapes kept), NULL when absent */
  size_t routed_experts_len;
  int64_t prompt_tokens;      /* usage.prompt_tokens, -1 when absent */
  int64_t cached_tokens;      /* usage.prompt_tokens_details.cached_tokens, 0 when absent */
  /* the JSON text of kv_transfer_params ([0, kv_len)), without eldr's
   * compact counts (never sent on), and of usage.prompt_tokens_details
   * ([kv_len, kv_len + det_len)), objects only (length 0: absent) */
  char *bytes;
  size_t kv_len, det_len;
  /* a copy of the reply (NUL-terminated at raw_len; owned) when the scanner
   * accepted it: the signature path reads routed_experts from these bytes,
   * the decode reply's edits insert its values, eldr_reply_prefill_root
   * parses it on first use */
  char *raw;
  size_t raw_len, raw_cap;
  /* kv_transfer_params.eldr_expert_counts (eldr/reply_compact.h): an object
   * span of raw (type NONE: absent, or no copy) */
  eldr_js_span compact;
} eldr_reply_prefill;

/* Read a prefill reply into out (zeroed, or read before: its copy's buffer
 * is reused). need_tree: parsed by jansson too (root set; the recorder and
 * prompt_logprobs need it), a large routed_experts string cut out of the
 * document before the parser sees it and put back as a plain string.
 * Otherwise, when the reply has no NUL byte and the scanner accepts it, no
 * tree (root NULL, kv_transfer_params NULL; the other fields as the tree
 * would give them). A reply the scanner refuses goes to jansson, which
 * decides and names the error. */
int eldr_reply_prefill_read(const char *body, size_t len, int need_tree, eldr_reply_prefill *out, eldr_diag *d);
/* The same without the copy: *buf (capacity *cap > *len, owned by the
 * caller) holds the reply's *len bytes; when the scanner reads it, that
 * buffer becomes out's copy and *buf / *cap take out's previous buffer
 * (maybe NULL, 0) in exchange, *len 0 (it holds nothing now). Else (the
 * tree path, or *buf NULL) as eldr_reply_prefill_read, *buf, *cap and *len
 * untouched. */
int eldr_reply_prefill_adopt(char **buf, size_t *cap, size_t *len, int need_tree, eldr_reply_prefill *out,
                             eldr_diag *d);
/* The jansson path alone (out need not be initialised): root set, raw NULL. */
int eldr_reply_prefill_parse(const char *body, size_t len, eldr_reply_prefill *out, eldr_diag *d);
/* The reply's tree (a json_t *), parsed on first use from the copy as
 * eldr_reply_prefill_parse does. NULL: out of memory, or jansson refused
 * what the scanner took (fuzz_jscan rules that out). */
void *eldr_reply_prefill_root(eldr_reply_prefill *pr);
/* Drop what the last read left but keep the copy's buffer (raw, raw_cap). */
void eldr_reply_prefill_clear(eldr_reply_prefill *p);
/* Free everything; p is zeroed. */
void eldr_reply_prefill_free(eldr_reply_prefill *p);

/* ---- the decode reply's generated rows -------------------------------------- */

/* The generated rows of a (non-streaming) decode reply's first choice, or a
 * stream's routed_experts event (eldr/reply_stream.h), counted. body[0..len)
 * is read by the span reader (a body with a NUL byte: by jansson), every
 * layout, against shape (L, K, E all checked; layer_ids, the model layer of
 * each of the L layers or NULL, read an all-layers array at those rows).
 * prompt_tokens: the prefill's usage.prompt_tokens (-1: unknown); when the
 * reply's own split leaves no generated rows (a reply without usage or
 * token_ids counts every row as the prompt's), its rows past prompt_tokens
 * are taken as generated. counts: L*E, zeroed here when rows are counted.
 * *completion_tokens (may be NULL): usage.completion_tokens, unchanged when
 * absent. Returns the rows counted, or -1: no routed_experts, a rejected
 * reply, no generated rows, or rows a trace cannot hold (an expert repeated
 * within a token's top-k: eldr_counts_rows_check); counts are then
 * meaningless. Any thread (no state). */
int64_t eldr_reply_decode_counts(const char *body, size_t len, eldr_re_api api, const eldr_shape *shape,
                                 const uint32_t *layer_ids, int64_t prompt_tokens, uint32_t *counts,
                                 int64_t *completion_tokens);

/* ---- a reply's prompt rows, for a record ------------------------------------ */

/* The first choice's prompt rows of a reply tree (root: a json_t *) over
 * the model's MoE layers (eldr_reply_experts_moe_rows: the artifact's
 * layers when art is given and they fit, else the preset the reply's model
 * names, else less the dense layers' rows). 0: *v views rows > 0 of at
 * most UINT32_MAX tokens, top_k <= num_experts, *shape is (v's layers,
 * num_experts, v's top_k), ids (ELDR_MAX_LAYERS capacity) the model layer
 * of each; rex owns what v points into (eldr_reply_experts_free). -1: none
 * (rex is then empty). */
int eldr_reply_prompt_rows(const void *root, eldr_re_api api, uint32_t num_experts, const eldr_shape *art,
                           const uint32_t *art_ids, eldr_reply_experts *rex, eldr_re_view *v, eldr_shape *shape,
                           uint32_t *ids);

#endif
