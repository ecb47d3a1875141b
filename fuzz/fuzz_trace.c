/* fuzz_trace.c — libFuzzer target for the JSONL trace parser (both the
 * per-token and the counts form).
 *
 * Any input: eldr_trace_parse returns an error (no trace, a message) or a
 * trace; an accepted trace must survive write -> parse unchanged and its
 * per-request counts must sum to tokens * L * K (0 for unknown decode
 * selections), otherwise the target aborts. The same bytes as a file go
 * through the torn-tolerant readers (eldr_trace_load_inputs and the
 * streaming eldr_trace_foreach), which must agree with each other, and with
 * the strict parse whenever no torn last line was skipped. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

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
    if ((x->n_prefill && !x->prefill != !y->prefill) || (x->n_decode && !x->decode != !y->decode))
      return 0;
    if (x->prefill && x->n_prefill && memcmp(x->prefill, y->prefill, x->n_prefill * re * 2))
      return 0;
    if (x->decode && x->n_decode && memcmp(x->decode, y->decode, x->n_decode * re * 2)) return 0;
    if (!x->prefill_gates != !y->prefill_gates) return 0;
    if (x->prefill_gates && x->n_prefill &&
        memcmp(x->prefill_gates, y->prefill_gates, x->n_prefill * re * sizeof(float)))
      return 0;
    const size_t cells = eldr_shape_cells(&a->shape) * sizeof(uint32_t);
    if (!x->prefill_counts != !y->prefill_counts || !x->decode_counts != !y->decode_counts)
      return 0;
    if (x->prefill_counts && memcmp(x->prefill_counts, y->prefill_counts, cells)) return 0;
    if (x->decode_counts && memcmp(x->decode_counts, y->decode_counts, cells)) return 0;
    if (!x->serve != !y->serve || (x->serve && strcmp(x->serve, y->serve))) return 0;
  }
  return 1;
}

static int count_visit(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  if (t->n != 0 || index != *(size_t *)ud) abort();
  (*(size_t *)ud)++;
  return 0;
}

/* The file readers on the same bytes; strict_rc/strict_n: eldr_trace_parse's result. */
static void check_file_readers(const uint8_t *data, size_t size, int strict_rc, size_t strict_n) {
  int fd = memfd_create("trace", 0);
  if (fd < 0) return;
  if (size && write(fd, data, size) != (ssize_t)size) abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  char *paths[1] = {path};
  eldr_trace *t = NULL;
  eldr_trace_read_info info, sinfo;
  eldr_diag d = {{0}}, sd = {{0}};
  int rc = eldr_trace_load_inputs(paths, 1, &t, &info, &d);
  size_t seen = 0;
  int src = eldr_trace_foreach_inputs(paths, 1, count_visit, &seen, &sinfo, &sd);
  if (rc != src || (rc == 0 && (t->n != seen || info.torn != sinfo.torn))) abort();
  if (rc && (t || !d.msg[0] || !sd.msg[0])) abort();
  if (strict_rc == 0 && (rc != 0 || t->n != strict_n || info.torn)) abort();
  if (rc == 0 && info.torn == 0 && strict_rc != 0) abort();
  if (rc == 0 && info.torn && (strict_rc == 0 || !info.note[0])) abort();
  eldr_trace_free(t);
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_trace *t = NULL;
  eldr_diag d;
  d.msg[0] = '\0';
  int rc = eldr_trace_parse((const char *)data, size, &t, &d);
  check_file_readers(data, size, rc, rc == 0 ? t->n : 0);
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
      const eldr_request *r = &t->req[i];
      uint64_t want = (uint64_t)(dec ? r->n_decode : r->n_prefill) * t->shape.num_layers *
                      t->shape.top_k;
      if (dec && !eldr_request_has_decode(r)) want = 0;
      if (sum != want) abort();
    }
  free(c);
  eldr_trace_free(b);
  free(buf);
  eldr_trace_free(t);
  return 0;
}
