/* eldr/trace_model.h — the in-memory expert-selection trace (core layer):
 * the requests, their per-token expert selections for L layers, top-k, and
 * the constructors that keep it valid (every expert id < num_experts).
 *
 * Two forms of request (a trace may mix them):
 *  - token form: per-token expert ids (prefill, decode, optional gates);
 *  - counts form ("form":"counts" on disk): per-(layer, expert) counts
 *    prefill_counts[l*E+e] (and decode_counts, or NULL when the decode
 *    selections are unknown); prefill/decode/prefill_gates are NULL and
 *    n_prefill/n_decode are the token counts the counts cover. A valid
 *    counts row (one layer) sums to tokens*top_k and no entry exceeds
 *    tokens (top-k ids are distinct per token).
 * eldr_trace_request_counts() works for both forms; code that needs token
 * rows checks eldr_request_is_counts() and fails naming the request.
 * The JSONL codec (load, parse, save) is eldr/trace.h in the format layer.
 *
 * Ownership: an eldr_trace owns all its requests and strings; free it with
 * eldr_trace_free().
 * Errors: ELDR_EINVAL (missing argument or shape), ELDR_ERANGE (an expert
 * id >= num_experts, or a counts row that is not valid), ELDR_ENOMEM.
 * Threads: a trace is not locked; readers may share a finished trace.
 */
#ifndef ELDR_TRACE_MODEL_H
#define ELDR_TRACE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"

typedef struct eldr_request {
  char *id;            /* owned, never NULL */
  int domain;          /* index into eldr_trace.domains, or -1 when absent */
  char *prompt;        /* owned, NULL when absent */
  double arrival;      /* seconds, < 0 when absent */
  uint32_t n_prefill;  /* prompt tokens with selections (may be 0) */
  uint32_t n_decode;   /* generated tokens with selections (may be 0) */
  uint16_t *prefill;   /* owned, n_prefill * L * K expert ids */
  uint16_t *decode;    /* owned, n_decode * L * K expert ids */
  float *prefill_gates;/* owned, n_prefill * L * K, or NULL when absent */
  uint32_t *prefill_counts; /* owned, L * E: counts form only, else NULL */
  uint32_t *decode_counts;  /* owned, L * E: counts form with known decode
                               selections, else NULL */
  char *serve;         /* owned: the "serve" JSON object (eldr serve --record's
                          decision) as compact text, or NULL when absent */
} eldr_request;

/* Nonzero when r is in counts form (prefill_counts set). */
static inline int eldr_request_is_counts(const eldr_request *r) {
  return r->prefill_counts != NULL;
}

/* Nonzero when r carries decode selections: token rows in token form,
 * decode_counts in counts form. */
static inline int eldr_request_has_decode(const eldr_request *r) {
  return r->prefill_counts ? r->decode_counts != NULL : r->n_decode > 0;
}

typedef struct eldr_trace {
  char *model;         /* owned */
  char *generator;     /* owned; NULL for a trace nobody generated (real data):
                          e.g. "eldr-tracegen workload=realistic seed=1" */
  eldr_shape shape;
  uint32_t *layer_ids; /* owned, shape.num_layers entries */
  eldr_request *req;   /* owned array of n requests */
  size_t n, cap;
  char **domains;      /* owned, n_domains distinct labels in first-seen order */
  size_t n_domains;
} eldr_trace;

/* New empty trace of a given shape (layer_ids may be NULL: 0..L-1).
 * Returns NULL on allocation failure or an invalid shape. */
eldr_trace *eldr_trace_new(const char *model, const eldr_shape *shape, const uint32_t *layer_ids);

/* Free a trace and everything it owns. NULL-safe. */
void eldr_trace_free(eldr_trace *t);

/* Append a request, deep-copying its arrays and strings. domain_name may be
 * NULL. prefill/decode hold n_prefill*L*K / n_decode*L*K ids, each < E
 * (else ELDR_ERANGE). gates may be NULL. Returns the new index or < 0. */
int eldr_trace_append(eldr_trace *t, const char *id, const char *domain_name,
                      const char *prompt, double arrival, const uint16_t *prefill,
                      uint32_t n_prefill, const uint16_t *decode, uint32_t n_decode,
                      const float *prefill_gates);

/* Append a request in counts form, deep-copying. prefill_counts: L*E
 * counts of n_prefill prompt tokens (required); decode_counts: L*E counts of
 * n_decode generated tokens, or NULL when unknown (n_decode may still be >
 * 0). serve_json: a JSON object as text (copied as is; the caller vouches
 * for its syntax), or NULL. Rows are checked as eldr_counts_rows_check
 * (ELDR_ERANGE, message in d). Returns the new index or < 0. */
int eldr_trace_append_counts(eldr_trace *t, const char *id, const char *domain_name,
                             const char *prompt, double arrival, const uint32_t *prefill_counts,
                             uint32_t n_prefill, const uint32_t *decode_counts, uint32_t n_decode,
                             const char *serve_json, eldr_diag *d);

/* Check one side's counts (L*E) of ntok tokens: every layer's row sums to
 * ntok*top_k and no entry exceeds ntok. 0, or ELDR_ERANGE with d naming the
 * layer index (and expert), e.g. "layer 3: sums to 17, expected 8 tokens *
 * top_k 2 = 16". */
int eldr_counts_rows_check(const eldr_shape *s, const uint32_t *counts, uint32_t ntok,
                           eldr_diag *d);

/* Release everything r owns and zero it (for a request taken out of a
 * trace, e.g. by a streaming reader's visitor). NULL-safe. */
void eldr_request_release(eldr_request *r);

/* Make room for n requests in all (t->cap >= n). 0 or ELDR_ENOMEM. */
int eldr_trace_reserve(eldr_trace *t, size_t n);

/* Replace t's generator string (NULL clears it). ELDR_ENOMEM on failure
 * (t unchanged). */
int eldr_trace_set_generator(eldr_trace *t, const char *generator);

/* Index of a domain label, adding it if new. < 0 on allocation failure. */
int eldr_trace_domain_intern(eldr_trace *t, const char *name);

/* Per-request counts: out (L*E, zeroed here) = counts of the prefill (or
 * decode, when decode != 0) selections of r; in counts form a copy of
 * prefill_counts / decode_counts (all zero when decode_counts is NULL:
 * check eldr_request_has_decode first where that matters). */
void eldr_trace_request_counts(const eldr_trace *t, const eldr_request *r, int decode,
                               uint32_t *out);

/* The prefill counts of the first floor(fraction * n_prefill) prompt
 * tokens of a per-token request into out (L*E, zeroed here): what is known
 * of a prompt of which only that part has been seen (eldr sim and eldr rho
 * --known-fraction). Returns the tokens counted; 0 for a counts-form
 * request (no token rows) or fraction <= 0. */
uint32_t eldr_trace_request_prefix_counts(const eldr_trace *t, const eldr_request *r, double fraction,
                                          uint32_t *out);

#endif
