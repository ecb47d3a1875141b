/* eldr/trace_model.h — the in-memory expert-selection trace (core layer):
 * the requests, their per-token expert selections for L layers, top-k, and
 * the constructors that keep it valid (every expert id < num_experts).
 * The JSONL codec (load, parse, save) is eldr/trace.h in the format layer.
 *
 * Ownership: an eldr_trace owns all its requests and strings; free it with
 * eldr_trace_free().
 * Errors: ELDR_EINVAL (missing argument or shape), ELDR_ERANGE (an expert
 * id >= num_experts), ELDR_ENOMEM.
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
} eldr_request;

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

/* Make room for n requests in all (t->cap >= n). 0 or ELDR_ENOMEM. */
int eldr_trace_reserve(eldr_trace *t, size_t n);

/* Replace t's generator string (NULL clears it). ELDR_ENOMEM on failure
 * (t unchanged). */
int eldr_trace_set_generator(eldr_trace *t, const char *generator);

/* Index of a domain label, adding it if new. < 0 on allocation failure. */
int eldr_trace_domain_intern(eldr_trace *t, const char *name);

/* Per-request counts: out (L*E, zeroed here) = counts of the prefill (or
 * decode, when decode != 0) selections of r. */
void eldr_trace_request_counts(const eldr_trace *t, const eldr_request *r, int decode,
                               uint32_t *out);

#endif
