/* eldr/reply_experts.h — routed_experts out of a whole vLLM reply body, in
 * every layout vLLM has shipped (docs/vllm.md, "Layouts"):
 *
 *   npy         vLLM main (vllm/entrypoints/openai/completion/protocol.py,
 *               CompletionResponseChoice.routed_experts): per choice a base64
 *               .npy string, shape (rows, layers, top_k), dtype u1/u2/i2/i4/i8.
 *               The rows cover the sequence (prompt + generated - 1), less
 *               the prompt rows a request skipped (routed_experts_prompt_start)
 *               or, in eldr's emulator, the prefix-cached ones: the split into
 *               prompt and generated rows uses usage.prompt_tokens and the
 *               choice's generated token count (below).
 *   v021-lists  vLLM 0.21: the prompt's rows in a top-level
 *               `prompt_routed_experts`, the generated rows in
 *               `choices[i].routed_experts`, both nested JSON lists [n][L][K].
 *   v021-base64 the same split, each value a compact object
 *               {"encoding":"base64","dtype":"int16","shape":[n,L,K],"data":..}
 *               (dtype one of uint8 uint16 int16 int32 int64, little-endian).
 *   lists       vLLM PR #38939, the first OpenAI form: per choice nested lists
 *               of the whole sequence, no `prompt_routed_experts` key; split
 *               like npy. (Any per-choice value without that key is.)
 *
 * The shape is taken from the payload (npy header, "shape", list lengths)
 * and checked against what the caller expects (the artifact's layers and
 * top_k; 0 = any). Every rejection carries one counted reason
 * (eldr_re_reason, with a stable metric label) and a message.
 *
 * Safety: any byte string is accepted as input; nothing is read out of
 * bounds; sizes are overflow-checked; ids are range-checked (negative, or
 * >= num_experts) in the layers of the mask before a view is returned, so a
 * view's ids can be counted without further checks.
 *
 * Readers: eldr_reply_experts_read (a jansson tree of the body),
 * eldr_reply_experts_from_json (a tree the caller parsed) and
 * eldr_reply_experts_scan (the body's bytes, no tree: the router's
 * signature path) are one reader over two value sources; they give the same
 * answers (fuzz_reply_experts compares them on every input).
 *
 * Ownership: the result owns every buffer its views point into (decoded
 * base64, converted lists) unless they came from the caller's scratch
 * (eldr_re_opts.scratch); eldr_reply_experts_free releases what it owns. The body
 * is not referenced after the call returns. Threads: no global state; one
 * result per thread.
 */
#ifndef ELDR_REPLY_EXPERTS_H
#define ELDR_REPLY_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/jscan.h" /* eldr_js_span */
#include "eldr/routed_experts.h" /* eldr_re_view */

/* Which OpenAI endpoint produced the reply: checked against "object" (the
 * endpoint's, or its stream chunk's: "chat.completion.chunk"). */
typedef enum eldr_re_api { ELDR_RE_COMPLETIONS = 0, ELDR_RE_CHAT } eldr_re_api;

typedef enum eldr_re_layout {
  ELDR_RE_LAYOUT_NONE = 0, /* the reply carries no routed_experts at all */
  ELDR_RE_LAYOUT_NPY,
  ELDR_RE_LAYOUT_V021_LISTS,
  ELDR_RE_LAYOUT_V021_BASE64,
  ELDR_RE_LAYOUT_LISTS, /* vLLM PR #38939 (first OpenAI form): per choice nested
                           lists of the whole sequence, no prompt_routed_experts */
  ELDR_RE_LAYOUT_COMPACT, /* not routed_experts at all: the prompt's counts in
                             kv_transfer_params (eldr/reply_compact.h); an emitter's
                             choice only, the readers never report it */
} eldr_re_layout;

/* "npy", "v021-lists", "v021-base64", "lists", "compact" ("none" for NONE). */
const char *eldr_re_layout_name(eldr_re_layout l);
/* Parse a layout name (not "none"); -1 when unknown. */
int eldr_re_layout_parse(const char *s, eldr_re_layout *out);

/* Can arrays of array_layers layer rows be read onto L MoE layers at model
 * layers layer_ids (NULL: exactly L rows)? The readers' rule (eldr_re_opts,
 * "The layer axis"): 1 for array_layers == L, or more rows than L with
 * layer_ids strictly increasing, below array_layers and not 0..L-1 (ids
 * 0..L-1 say there is no dense layer: more rows are another model); else 0. */
int eldr_re_layers_fit(size_t array_layers, uint32_t L, const uint32_t *layer_ids);

/* Why a reply was rejected. The labels are stable metric label values. */
typedef enum eldr_re_reason {
  ELDR_RE_OK = 0,
  ELDR_RE_NOT_JSON,           /* not_json: not a JSON object */
  ELDR_RE_WRONG_OBJECT,       /* wrong_object: "object" is not this endpoint's */
  ELDR_RE_NO_CHOICES,         /* no_choices: choices missing or not an array */
  ELDR_RE_BAD_TYPE,           /* bad_type: a value of the wrong JSON type */
  ELDR_RE_BAD_BASE64,         /* bad_base64 */
  ELDR_RE_BAD_NPY,            /* bad_npy: magic, header dict, fortran order */
  ELDR_RE_UNKNOWN_DTYPE,      /* unknown_dtype */
  ELDR_RE_UNKNOWN_ENCODING,   /* unknown_encoding */
  ELDR_RE_BAD_SHAPE,          /* bad_shape: not 3-d, ragged, layers/top_k out of bounds */
  ELDR_RE_SHAPE_MISMATCH,     /* shape_mismatch: layers/top_k differ from the expected */
  ELDR_RE_LENGTH_MISMATCH,    /* length_mismatch: data length != shape */
  ELDR_RE_ROWS_EXCEED_TOKENS, /* rows_exceed_tokens: more rows than the usage's tokens */
  ELDR_RE_NEGATIVE_ID,        /* negative_id */
  ELDR_RE_ID_OUT_OF_RANGE,    /* id_out_of_range: id >= num_experts */
  ELDR_RE_TOO_LARGE,          /* too_large: sizes overflow */
  ELDR_RE_NO_MEMORY,          /* out_of_memory */
  ELDR_RE_BAD_COUNTS,         /* bad_counts: compact counts no prompt of their tokens gives */
  ELDR_RE__N
} eldr_re_reason;

const char *eldr_re_reason_name(eldr_re_reason r);

/* Decode buffers a caller reuses from one reply to the next (the router:
 * one set per pending signature-cache store). With one, the reader decodes
 * base64 and converts lists into these slots (grown with realloc, never
 * freed by a read) instead of allocating per reply, and the result's views
 * point into them: valid until the next read with the same scratch.
 * Zero-initialise; release with eldr_re_scratch_free. A reply needing more
 * than ELDR_RE_SCRATCH_SLOTS buffers (many choices) gets malloc'd buffers
 * for the rest, owned by the result as without scratch. */
#define ELDR_RE_SCRATCH_SLOTS 6
typedef struct eldr_re_scratch {
  struct {
    void *p;
    size_t cap;
  } slot[ELDR_RE_SCRATCH_SLOTS];
  size_t used; /* slots handed out by the current read */
} eldr_re_scratch;

/* Free the slots holding more than keep bytes (a bound on what stays
 * allocated after a large reply), or every slot with keep 0. */
void eldr_re_scratch_trim(eldr_re_scratch *s, size_t keep);
void eldr_re_scratch_free(eldr_re_scratch *s);

/* What the caller expects; 0 / NULL = accept any.
 *
 * The layer axis (docs/vllm.md, "The layer axis"): vLLM's capturer sends a
 * row for every hidden layer of the model, the MoE layers' ids at their
 * layer index and the dense layers' rows zero (the all-layers form: Llama-4
 * Maverick (rows, 48, 1), 24 of them MoE); older builds and SGLang send the
 * MoE layers only. With num_layers L and layer_ids (the model layer of each
 * of the L MoE layers, the artifact's), an array of L layers is read as is
 * and an array of more is read at rows layer_ids[0..L) (eldr_re_layers_fit:
 * not when the ids are 0..L-1, which leave no room for a dense layer): the views hold the
 * L MoE layers either way, so everything downstream (counts, signature
 * cache, records) sees one shape. The dense rows are never read, whatever
 * they hold. Without layer_ids only L layers are accepted. */
typedef struct eldr_re_opts {
  eldr_re_api api;
  uint32_t num_layers;       /* the artifact's L (MoE layers) */
  uint32_t top_k;            /* the artifact's K */
  uint32_t num_experts;      /* ids must be < this (0: < ELDR_MAX_EXPERTS) */
  const uint8_t *layer_mask; /* num_layers flags: ids are checked only in these
                                layers (the ones the caller will read) */
  eldr_re_scratch *scratch;  /* NULL: buffers are allocated per reply */
  uint32_t *counts;          /* non-NULL (needs num_layers, top_k, num_experts):
                                the first choice's prompt rows are counted here
                                (L*E, accumulated, the mask's layers) in the
                                same pass that range-checks them; the result's
                                `counted` says so. On an error counts may hold
                                a partial sum: discard them. */
  const uint32_t *layer_ids; /* num_layers entries, strictly increasing: the model
                                layer of each MoE layer (the artifact's
                                layer_ids); NULL: an array must have exactly
                                num_layers layers */
  int drop_dense;            /* with num_layers 0: layers whose rows are a dense
                                layer's fill (every id <= 0, and top_k >= 2 or an
                                id negative: a top-k row never repeats an id) are
                                dropped, decided on the first array with rows;
                                the result's layer_ids name the layers kept */
  eldr_count_planes *planes; /* with counts, may be NULL: the counted rows'
                                16-token blocks' bit planes kept here where the
                                bit-sliced kernel counts them (eldr/counts.h:
                                for the signature cache's store) */
} eldr_re_opts;

/* A view of rows: eldr_re_view (eldr/routed_experts.h). */

typedef struct eldr_re_choice {
  int64_t index;         /* choices[i].index (i when absent) */
  eldr_re_view prompt;   /* prompt rows */
  eldr_re_view generated;/* generated-token rows */
} eldr_re_choice;

typedef struct eldr_reply_experts {
  eldr_re_layout layout;
  int64_t prompt_tokens; /* usage.prompt_tokens, -1 when absent */
  size_t nchoices;
  eldr_re_choice *choices; /* owned */
  void **bufs;             /* owned buffers the views point into */
  size_t nbufs;
  int counted;             /* opts->counts holds choices[0].prompt's counts */
  size_t array_layers;     /* layer rows of the arrays as sent (0: none read) */
  const uint32_t *layer_ids; /* the model layer of each view layer, when the
                                arrays were cut down to their MoE layers (all-layers
                                form, drop_dense); NULL when the views' layers are
                                the arrays' (owned with the views) */
} eldr_reply_experts;

/* Read a whole non-streaming reply body. Returns 0 (out filled; a reply
 * without routed_experts gives layout NONE and absent views), or an
 * ELDR_E* code with *why (may be NULL) set to the reason and a message in d;
 * out is then empty (safe to free). opts may be NULL (accept any). */
int eldr_reply_experts_read(const char *body, size_t len, const eldr_re_opts *opts,
                            eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d);
/* The same on a reply the caller already parsed with jansson (root is a
 * json_t *, borrowed; the views do not point into it, so it may be freed
 * right after). For a router that parses the prefill reply once. */
int eldr_reply_experts_from_json(const void *root, const eldr_re_opts *opts,
                                 eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d);
/* The same on the reply's bytes, without a tree: the document is validated
 * by the byte scanner (include/eldr/jscan.h, which accepts and rejects what
 * jansson does on a body without NUL bytes) and the routed_experts values
 * are read in place, the base64 text (or number lists) handed to the codec
 * as it lies in body. Same results, reasons and messages as
 * eldr_reply_experts_read, except the wording of a NOT_JSON message. The
 * views do not point into body. For the router's signature path. */
int eldr_reply_experts_scan(const char *body, size_t len, const eldr_re_opts *opts, eldr_reply_experts *out,
                            eldr_re_reason *why, eldr_diag *d);
/* The same on a document eldr_js_scan already accepted (the caller
 * vouches: nothing is validated again, so the text is read once less).
 * A top-level value other than an object is NOT_JSON. known (optional:
 * type ELDR_JS_NONE for none): a string value of doc, quotes included, as
 * that scan found it (the prefill reply's routed_experts blob): the reader
 * takes its end from the span instead of searching megabytes for it again
 * (eldr_js_iter_known). A span that is not one of that scan makes the read
 * wrong. */
int eldr_reply_experts_scanned(const char *doc, size_t len, const eldr_re_opts *opts, eldr_js_span known,
                               eldr_reply_experts *out,
                               eldr_re_reason *why, eldr_diag *d);
/* eldr_reply_experts_scanned for a caller that holds the counts of the
 * prompt's first tokens already (the router's signature cache): with
 * opts->counts, the first choice's rows of prompt tokens before
 * skip_tokens are left out: not counted, not range-checked, and in the npy
 * layout not even decoded (their base64 text is not read, so not validated
 * either); its prompt view (and first_token) then starts after them, as if
 * the reply had sent only the later rows. At least the prompt's last row
 * is kept. Needs usage.prompt_tokens and, for a whole-sequence array, the
 * generated token count (token_ids, or usage.completion_tokens with one
 * choice): without them nothing is left out. skip_tokens 0 is
 * eldr_reply_experts_scanned. */
int eldr_reply_experts_scanned_skip(const char *doc, size_t len, const eldr_re_opts *opts, eldr_js_span known,
                                    size_t skip_tokens, eldr_reply_experts *out, eldr_re_reason *why,
                                    eldr_diag *d);
void eldr_reply_experts_free(eldr_reply_experts *r);

/* A reply's rows over the model's MoE layers, whatever its layer axis (for
 * a record: eldr serve --record). root is a jansson tree of the whole reply,
 * read as eldr_reply_experts_from_json with num_experts and no other
 * expectation but the layers: first as the artifact's (art: its L and K,
 * art_ids its layer ids; NULL: none) in either form; else as the MoE layers
 * of the preset the reply's "model" names (eldr_tracegen_served_layers)
 * when the arrays have that preset's hidden layers and top_k; else the
 * arrays' layers less those holding only a dense layer's fill
 * (drop_dense). ids (ELDR_MAX_LAYERS capacity) receives the model layer of
 * each view layer. Errors: the last attempt's, as from_json's. */
int eldr_reply_experts_moe_rows(const void *root, eldr_re_api api, uint32_t num_experts, const eldr_shape *art,
                                const uint32_t *art_ids, eldr_reply_experts *out, uint32_t *ids);

/* ---- emitting (the emulated worker) ------------------------------------- */

/* Attach routed_experts in the given layout to a reply being built:
 * prompt_rows rows of the prompt and gen_rows of generated tokens, each row
 * L*K host-order ids < shape->num_experts. npy: one string in choice
 * (prompt rows then generated rows, '|u1' when E <= 256 else '<u2');
 * lists: the same rows as one nested list in choice;
 * v021-*: body["prompt_routed_experts"] (once per body; pass body NULL for
 * the second and later choices) and choice["routed_experts"] (int16 for
 * v021-base64). body and choice are jansson json_t objects (void* here so
 * this header does not need jansson). Returns 0, ELDR_EINVAL or
 * ELDR_ENOMEM. */
int eldr_reply_experts_emit(void *body, void *choice, eldr_re_layout layout,
                            const uint16_t *prompt, size_t prompt_rows, const uint16_t *gen,
                            size_t gen_rows, const eldr_shape *shape);
/* The same in vLLM's all-layers form: each row spread over hidden_layers
 * layers, MoE layer l at layer_ids[l] (strictly increasing, < hidden_layers),
 * every other (dense) layer's ids 0, as vLLM's capturer leaves them.
 * hidden_layers == shape->num_layers is eldr_reply_experts_emit. */
int eldr_reply_experts_emit_layers(void *body, void *choice, eldr_re_layout layout, const uint16_t *prompt,
                                   size_t prompt_rows, const uint16_t *gen, size_t gen_rows,
                                   const eldr_shape *shape, const uint32_t *layer_ids,
                                   uint32_t hidden_layers);

#endif
