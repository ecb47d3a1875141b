/* fuzz_trace.c — libFuzzer target for the JSONL trace parser.
 *
 * Any input: eldr_trace_parse returns an error (no trace, a message) or a
 * trace; an accepted trace must survive write -> parse unchanged and its
 * per-request counts must sum to tokens * L * K, otherwise the target
 * aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/trace.h"

static int same(const eldr_trace *a, const eldr_trace *b) {
  if (strcmp(a->model, b->model) || memcmp(&a->shape, &b->shape, sizeof a->shape)) return 0;
  if (memcmp(a->layer_ids, b->layer_ids, a->shape.num_layers * sizeof(uint32_t))) return 0;
  if (a->n != b->n || a->n_domains != b->n_domains) return 0;
  for (size_t i = 0; i < a->n_domains; i++)
    if (strcmp(a->domains[i], b->domains[i])) return 0;
  const size_t re = (size_t)a->shape.num_layers * a->shape.top_k;
  for (size_t i = 0; i < a->n; i++) {
    const eldr_request *x = &a->req[i], *y = &b->req[i];
    if (strcmp(x->id, y->id) || x->domain != y->domain) return 0;
    if (!x->prompt != !y->prompt || (x->prompt && strcmp(x->prompt, y->prompt))) return 0;
    if (memcmp(&x->arrival, &y->arrival, sizeof x->arrival) && !(x->arrival < 0 && y->arrival < 0))
      return 0;
    if (x->n_prefill != y->n_prefill || x->n_decode != y->n_decode) return 0;
    if (x->n_prefill && memcmp(x->prefill, y->prefill, x->n_prefill * re * 2)) return 0;
    if (x->n_decode && memcmp(x->decode, y->decode, x->n_decode * re * 2)) return 0;
    if (!x->prefill_gates != !y->prefill_gates) return 0;
    if (x->prefill_gates && x->n_prefill &&
        memcmp(x->prefill_gates, y->prefill_gates, x->n_prefill * re * sizeof(float)))
      return 0;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_trace *t = NULL;
  eldr_diag d;
  d.msg[0] = '\0';
  int rc = eldr_trace_parse((const char *)data, size, &t, &d);
  if (rc != 0) {
    if (t != NULL || d.msg[0] == '\0') abort();
    return 0;
  }
  if (!t || t->n == 0) abort();
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) abort();
  for (size_t i = 0; i < t->n; i++)
    if (eldr_trace_write_request(f, t, &t->req[i]) != 0) abort();
  fclose(f);
  eldr_trace *b = NULL;
  if (eldr_trace_parse(buf, len, &b, &d) != 0 || !same(t, b)) abort();
  uint32_t *c = malloc(eldr_shape_cells(&t->shape) * sizeof *c);
  if (!c) abort();
  for (size_t i = 0; i < t->n; i++)
    for (int dec = 0; dec < 2; dec++) {
      eldr_trace_request_counts(t, &t->req[i], dec, c);
      uint64_t sum = 0;
      for (size_t j = 0; j < eldr_shape_cells(&t->shape); j++) sum += c[j];
      uint64_t want = (uint64_t)(dec ? t->req[i].n_decode : t->req[i].n_prefill) *
                      t->shape.num_layers * t->shape.top_k;
      if (sum != want) abort();
    }
  free(c);
  eldr_trace_free(b);
  free(buf);
  eldr_trace_free(t);
  return 0;
}
