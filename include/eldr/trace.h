/* eldr/trace.h — expert-selection traces: the JSONL format of
 * ../shared/traces/README.md, general in layers, experts and k.
 *
 * One JSON object per line, one request per object:
 *   id (string), domain (string, optional), model (string), num_experts (int),
 *   top_k (int), layers (array of MoE layer ids), prefill[t][l][k],
 *   decode[t][l][k] (int expert ids), and optional extensions:
 *   arrival (number, seconds since trace start), prompt (string),
 *   prefill_gates[t][l][k] (numbers: gate probabilities, for the gate/logit
 *   representations).
 * Every line of a file must agree on model, num_experts, top_k and layers.
 *
 * Reader details: blank lines are skipped; a missing final newline is fine;
 * fields may come in any order; unknown fields are ignored (but must be
 * valid JSON); a JSON null optional field counts as absent; a duplicated
 * known field, an empty "layers", a repeated layer id, a negative arrival,
 * non-finite gates and strings with \u0000 or invalid UTF-8 are errors.
 * Keys are matched literally (a key spelled with \u escapes is unknown).
 * Expert ids must be JSON integers (no fraction or exponent), 0 <= id < E.
 * The writer emits compact JSON in the field order id, domain, model,
 * num_experts, top_k, layers, arrival, prompt, prefill, decode,
 * prefill_gates (arrival "%.17g", gates "%.9g": both read back bit-exact),
 * so a file in that compact form (like the real llama4 trace) round-trips
 * byte for byte.
 *
 * Ownership: an eldr_trace owns all its requests and strings; free it with
 * eldr_trace_free(). Errors name the line number (1-based) and the field.
 */
#ifndef ELDR_TRACE_H
#define ELDR_TRACE_H

#include <stdint.h>
#include <stdio.h>

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

/* Load a JSONL file. On error returns < 0, *out = NULL, and d names the line
 * and field (e.g. "trace.jsonl:17: field 'prefill': expert id 130 >= num_experts 128").
 * Rejects: empty file, truncated last line (no closing brace / bad JSON),
 * missing or mistyped fields, ragged arrays, expert ids out of range, lines
 * that disagree on the shape. */
int eldr_trace_load(const char *path, eldr_trace **out, eldr_diag *d);

/* Parse a whole in-memory JSONL buffer (same rules as eldr_trace_load). */
int eldr_trace_parse(const char *buf, size_t len, eldr_trace **out, eldr_diag *d);

/* Parse one line (no newline needed) and append it to t. If t has no
 * requests yet and t->shape.num_layers == 0, the line defines the shape.
 * lineno is used only in messages. On error t is unchanged. */
int eldr_trace_parse_line(eldr_trace *t, const char *line, size_t len, size_t lineno,
                          eldr_diag *d);

/* Append a request, deep-copying its arrays and strings. domain_name may be
 * NULL. prefill/decode hold n_prefill*L*K / n_decode*L*K ids, each < E
 * (else ELDR_ERANGE). gates may be NULL. Returns the new index or < 0. */
int eldr_trace_append(eldr_trace *t, const char *id, const char *domain_name,
                      const char *prompt, double arrival, const uint16_t *prefill,
                      uint32_t n_prefill, const uint16_t *decode, uint32_t n_decode,
                      const float *prefill_gates);

/* Index of a domain label, adding it if new. < 0 on allocation failure. */
int eldr_trace_domain_intern(eldr_trace *t, const char *name);

/* Write one request as a single JSONL line (with '\n'). Returns 0,
 * ELDR_EINVAL, ELDR_ERANGE (a non-finite gate), ELDR_ENOMEM or ELDR_EIO. */
int eldr_trace_write_request(FILE *f, const eldr_trace *t, const eldr_request *r);

/* Write the whole trace. Writes to path via a temp file + rename. */
int eldr_trace_save(const char *path, const eldr_trace *t, eldr_diag *d);

/* Per-request counts: out (L*E, zeroed here) = counts of the prefill (or
 * decode, when decode != 0) selections of r. */
void eldr_trace_request_counts(const eldr_trace *t, const eldr_request *r, int decode,
                               uint32_t *out);

#endif
