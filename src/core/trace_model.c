/* trace_model.c — the in-memory expert-selection trace (see
 * eldr/trace_model.h): construction, appends, per-request counts. The JSONL
 * codec is src/format/trace.c. */
#include "eldr/trace_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"

eldr_trace *eldr_trace_new(const char *model, const eldr_shape *shape, const uint32_t *layer_ids) {
  if (!shape || eldr_shape_validate(shape, NULL) != ELDR_OK) return NULL;
  eldr_trace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->model = strdup(model ? model : "");
  t->layer_ids = malloc(sizeof(uint32_t) * shape->num_layers);
  if (!t->model || !t->layer_ids) {
    eldr_trace_free(t);
    return NULL;
  }
  t->shape = *shape;
  for (uint32_t l = 0; l < shape->num_layers; l++) t->layer_ids[l] = layer_ids ? layer_ids[l] : l;
  return t;
}

static void request_release(eldr_request *r) {
  free(r->id);
  free(r->prompt);
  free(r->prefill);
  free(r->decode);
  free(r->prefill_gates);
  free(r->prefill_counts);
  free(r->decode_counts);
  free(r->serve);
}

void eldr_request_release(eldr_request *r) {
  if (!r) return;
  request_release(r);
  memset(r, 0, sizeof *r);
  r->domain = -1;
}

void eldr_trace_free(eldr_trace *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) request_release(&t->req[i]);
  free(t->req);
  for (size_t i = 0; i < t->n_domains; i++) free(t->domains[i]);
  free(t->domains);
  free(t->layer_ids);
  free(t->model);
  free(t->generator);
  free(t);
}

int eldr_trace_reserve(eldr_trace *t, size_t n) {
  return eldr_grow_array(t->req, t->cap, n);
}

int eldr_trace_set_generator(eldr_trace *t, const char *generator) {
  char *g = NULL;
  if (generator && !(g = strdup(generator))) return ELDR_ENOMEM;
  free(t->generator);
  t->generator = g;
  return ELDR_OK;
}

int eldr_trace_domain_intern(eldr_trace *t, const char *name) {
  if (!t || !name) return ELDR_EINVAL;
  for (size_t i = 0; i < t->n_domains; i++)
    if (!strcmp(t->domains[i], name)) return (int)i;
  if (t->n_domains >= (size_t)0x7fffffff) return ELDR_ERANGE;
  char **nd = realloc(t->domains, (t->n_domains + 1) * sizeof *nd);
  if (!nd) return ELDR_ENOMEM; /* one slot at a time: domains are few */
  t->domains = nd;
  char *s = strdup(name);
  if (!s) return ELDR_ENOMEM;
  t->domains[t->n_domains] = s;
  return (int)t->n_domains++;
}

static size_t row_elems(const eldr_shape *s) { return (size_t)s->num_layers * s->top_k; }

/* *dst = a malloc'd copy of n bytes of src (at least 1 byte allocated). */
static int dup_bytes(void *dst, const void *src, size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) return ELDR_ENOMEM;
  if (n) memcpy(p, src, n);
  *(void **)dst = p;
  return ELDR_OK;
}

/* Copy the fields every request has into r (whose arrays are set), intern
 * its domain and append it; r is released on failure. */
static int finish_append(eldr_trace *t, eldr_request *r, const char *id, const char *domain_name,
                         const char *prompt, double arrival) {
  r->domain = -1;
  r->arrival = arrival;
  if (eldr_trace_reserve(t, t->n + 1) || !(r->id = strdup(id)) ||
      (prompt && !(r->prompt = strdup(prompt))))
    goto oom;
  if (domain_name) {
    int di = eldr_trace_domain_intern(t, domain_name);
    if (di < 0) goto oom;
    r->domain = di;
  }
  t->req[t->n] = *r;
  return (int)t->n++;
oom:
  request_release(r);
  return ELDR_ENOMEM;
}

int eldr_trace_append(eldr_trace *t, const char *id, const char *domain_name, const char *prompt,
                      double arrival, const uint16_t *prefill, uint32_t n_prefill,
                      const uint16_t *decode, uint32_t n_decode, const float *prefill_gates) {
  if (!t || !id || t->shape.num_layers == 0) return ELDR_EINVAL;
  if ((n_prefill && !prefill) || (n_decode && !decode)) return ELDR_EINVAL;
  const size_t re = row_elems(&t->shape);
  const size_t np = (size_t)n_prefill * re, nd = (size_t)n_decode * re;
  for (size_t i = 0; i < np; i++)
    if (prefill[i] >= t->shape.num_experts) return ELDR_ERANGE;
  for (size_t i = 0; i < nd; i++)
    if (decode[i] >= t->shape.num_experts) return ELDR_ERANGE;
  eldr_request r = {0};
  r.n_prefill = n_prefill;
  r.n_decode = n_decode;
  if ((np && dup_bytes(&r.prefill, prefill, np * sizeof(uint16_t))) ||
      (nd && dup_bytes(&r.decode, decode, nd * sizeof(uint16_t))) ||
      (prefill_gates && dup_bytes(&r.prefill_gates, prefill_gates, np * sizeof(float)))) {
    request_release(&r);
    return ELDR_ENOMEM;
  }
  return finish_append(t, &r, id, domain_name, prompt, arrival);
}

int eldr_counts_rows_check(const eldr_shape *s, const uint32_t *counts, uint32_t ntok,
                           eldr_diag *d) {
  if (!s || !counts) return eldr_diag_fail(d, ELDR_EINVAL, "counts missing");
  const uint32_t L = s->num_layers, E = s->num_experts;
  const uint64_t want = (uint64_t)ntok * s->top_k;
  for (uint32_t l = 0; l < L; l++) {
    const uint32_t *row = counts + (size_t)l * E;
    uint64_t sum = 0;
    for (uint32_t e = 0; e < E; e++) {
      if (row[e] > ntok)
        return eldr_diag_fail(d, ELDR_ERANGE,
                              "layer %u expert %u: count %u > %u tokens (top-k experts are "
                              "distinct per token)",
                              l, e, row[e], ntok);
      sum += row[e];
    }
    if (sum != want)
      return eldr_diag_fail(d, ELDR_ERANGE,
                            "layer %u: sums to %llu, expected %u tokens * top_k %u = %llu", l,
                            (unsigned long long)sum, ntok, s->top_k, (unsigned long long)want);
  }
  return ELDR_OK;
}

int eldr_trace_append_counts(eldr_trace *t, const char *id, const char *domain_name,
                             const char *prompt, double arrival, const uint32_t *prefill_counts,
                             uint32_t n_prefill, const uint32_t *decode_counts, uint32_t n_decode,
                             const char *serve_json, eldr_diag *d) {
  if (!t || !id || !prefill_counts || t->shape.num_layers == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "trace, id or prefill_counts missing");
  int rc = eldr_counts_rows_check(&t->shape, prefill_counts, n_prefill, d);
  if (rc) {
    eldr_diag_prefix(d, "request '%.60s': prefill_counts", id);
    return rc;
  }
  if (decode_counts && (rc = eldr_counts_rows_check(&t->shape, decode_counts, n_decode, d))) {
    eldr_diag_prefix(d, "request '%.60s': decode_counts", id);
    return rc;
  }
  const size_t bytes = eldr_shape_cells(&t->shape) * sizeof(uint32_t);
  eldr_request r = {0};
  r.n_prefill = n_prefill;
  r.n_decode = n_decode;
  if (dup_bytes(&r.prefill_counts, prefill_counts, bytes) ||
      (decode_counts && dup_bytes(&r.decode_counts, decode_counts, bytes)) ||
      (serve_json && !(r.serve = strdup(serve_json)))) {
    request_release(&r);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  rc = finish_append(t, &r, id, domain_name, prompt, arrival);
  return rc < 0 ? eldr_diag_fail(d, rc, "out of memory") : rc;
}

void eldr_trace_request_counts(const eldr_trace *t, const eldr_request *r, int decode,
                               uint32_t *out) {
  const size_t cells = eldr_shape_cells(&t->shape);
  if (r->prefill_counts) {
    const uint32_t *src = decode ? r->decode_counts : r->prefill_counts;
    if (src) memcpy(out, src, cells * sizeof *out);
    else memset(out, 0, cells * sizeof *out);
    return;
  }
  memset(out, 0, cells * sizeof *out);
  const uint16_t *sel = decode ? r->decode : r->prefill;
  size_t n = decode ? r->n_decode : r->n_prefill;
  if (n && sel) (void)eldr_counts_accumulate(&t->shape, sel, ELDR_SEL_U16, n, out, NULL);
}

uint32_t eldr_trace_request_prefix_counts(const eldr_trace *t, const eldr_request *r, double fraction,
                                          uint32_t *out) {
  memset(out, 0, eldr_shape_cells(&t->shape) * sizeof *out);
  if (r->prefill_counts || !r->prefill || !(fraction > 0)) return 0;
  double x = floor(fraction * (double)r->n_prefill);
  uint32_t n = x >= (double)r->n_prefill ? r->n_prefill : (uint32_t)x;
  if (n) (void)eldr_counts_accumulate(&t->shape, r->prefill, ELDR_SEL_U16, n, out, NULL);
  return n;
}

