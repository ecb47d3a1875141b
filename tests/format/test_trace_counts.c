/* test_trace_counts.c — the compact ("counts") trace form: token -> counts
 * round trips (counts equal eldr_trace_request_counts of the token form),
 * the record writer (eldr_trace_format_counts, with a serve object), mixed
 * files, and every validation error with its line and field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/trace_expect.h"

#include "eldr/preset_files.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"

#define ASSERT_MSG(d, sub) eldr_test_msg_has(&(d), (sub))

static char *tmp_path(const char *tag) {
  static char buf[4][256];
  static int i;
  char *p = buf[i++ & 3];
  snprintf(p, 256, "/tmp/eldr_test_tcounts_%ld_%s.jsonl", (long)getpid(), tag);
  return p;
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)sz + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
  b[sz] = '\0';
  fclose(f);
  *n = (size_t)sz;
  return b;
}

/* A generated token-form trace (Qwen3-like shape, realistic workload). */
static eldr_trace *gen_trace(size_t n) {
  eldr_shape s = {6, 32, 4};
  eldr_tracegen *g = NULL;
  eldr_diag d = {{0}};
  if (eldr_tracegen_new(&s, "qwen3-test", "realistic", 7, &g, &d)) fail_msg("%s", d.msg);
  eldr_tracegen_set_lengths(g, 0, 24, 48);
  eldr_trace *t = NULL;
  if (eldr_tracegen_generate(g, n, &t, &d)) fail_msg("%s", d.msg);
  eldr_tracegen_free(g);
  return t;
}

/* The counts-form twin of token trace t (serve objects on even requests). */
static eldr_trace *to_counts(const eldr_trace *t) {
  eldr_trace *c = eldr_trace_new(t->model, &t->shape, t->layer_ids);
  assert_non_null(c);
  assert_int_equal(eldr_trace_set_generator(c, t->generator), 0);
  const size_t LE = eldr_shape_cells(&t->shape);
  uint32_t *pre = malloc(LE * 4), *dec = malloc(LE * 4);
  assert_true(pre && dec);
  for (size_t i = 0; i < t->n; i++) {
    const eldr_request *r = &t->req[i];
    eldr_trace_request_counts(t, r, 0, pre);
    eldr_trace_request_counts(t, r, 1, dec);
    char serve[128];
    snprintf(serve, sizeof serve, "{\"decoder\":\"127.0.0.1:%zu\",\"similarity\":[0.5,0.25]}",
             8000 + i);
    eldr_diag d = {{0}};
    int rc = eldr_trace_append_counts(c, r->id, r->domain >= 0 ? t->domains[r->domain] : NULL,
                                      r->prompt, r->arrival, pre, r->n_prefill,
                                      i % 3 == 2 ? NULL : dec, r->n_decode,
                                      i % 2 ? NULL : serve, &d);
    if (rc < 0) fail_msg("append_counts: %s", d.msg);
  }
  free(pre);
  free(dec);
  return c;
}

static void test_roundtrip(void **state) {
  (void)state;
  eldr_trace *t = gen_trace(40);
  eldr_trace *c = to_counts(t);
  char *p = tmp_path("rt");
  eldr_diag d = {{0}};
  if (eldr_trace_save(p, c, &d)) fail_msg("%s", d.msg);
  eldr_trace *back = NULL;
  if (eldr_trace_load(p, &back, &d)) fail_msg("%s", d.msg);
  assert_int_equal(back->n, t->n);
  assert_string_equal(back->model, t->model);
  assert_string_equal(back->generator, t->generator);
  assert_memory_equal(back->layer_ids, t->layer_ids, t->shape.num_layers * 4);
  const size_t LE = eldr_shape_cells(&t->shape);
  uint32_t *a = malloc(LE * 4), *b = malloc(LE * 4);
  for (size_t i = 0; i < t->n; i++) {
    const eldr_request *x = &t->req[i], *y = &back->req[i];
    assert_true(eldr_request_is_counts(y));
    assert_null(y->prefill);
    assert_null(y->decode);
    assert_string_equal(x->id, y->id);
    assert_string_equal(t->domains[x->domain], back->domains[y->domain]);
    assert_int_equal(x->n_prefill, y->n_prefill);
    assert_int_equal(x->n_decode, y->n_decode);
    for (int side = 0; side < 2; side++) {
      eldr_trace_request_counts(t, x, side, a);
      eldr_trace_request_counts(back, y, side, b);
      if (side == 1 && i % 3 == 2) {
        assert_null(y->decode_counts);
        assert_false(eldr_request_has_decode(y));
        for (size_t j = 0; j < LE; j++) assert_int_equal(b[j], 0);
      } else {
        assert_memory_equal(a, b, LE * 4);
      }
    }
    if (i % 2) assert_null(y->serve);
    else assert_non_null(strstr(y->serve, "\"similarity\":[0.5,0.25]"));
  }
  free(a);
  free(b);
  /* saving what was read gives the same bytes */
  char *p2 = tmp_path("rt2");
  if (eldr_trace_save(p2, back, &d)) fail_msg("%s", d.msg);
  size_t n1, n2;
  char *b1 = slurp(p, &n1), *b2 = slurp(p2, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  /* and it is smaller than the token form */
  char *p3 = tmp_path("tok");
  if (eldr_trace_save(p3, t, &d)) fail_msg("%s", d.msg);
  size_t n3;
  char *b3 = slurp(p3, &n3);
  assert_true(n1 < n3);
  free(b1);
  free(b2);
  free(b3);
  unlink(p);
  unlink(p2);
  unlink(p3);
  eldr_trace_free(back);
  eldr_trace_free(c);
  eldr_trace_free(t);
}

/* The record writer: one line with a serve object, read back field by field. */
static void test_format_counts(void **state) {
  (void)state;
  const eldr_shape s = {2, 3, 2};
  const uint32_t layers[2] = {5, 9};
  const uint32_t pc[6] = {3, 2, 1, 2, 2, 2}, dc[6] = {1, 1, 0, 0, 1, 1};
  eldr_counts_line ln = {.id = "req-1",
                         .domain = "code",
                         .model = "m",
                         .shape = &s,
                         .layer_ids = layers,
                         .arrival = 12.5,
                         .prefill_tokens = 3,
                         .decode_tokens = 1,
                         .prefill_counts = pc,
                         .decode_counts = dc,
                         .serve = "{\"decoder\":\"10.0.0.2:8200\",\"ttft_ms\":12.5}"};
  char *buf = NULL;
  size_t len = 0, cap = 0;
  eldr_diag d = {{0}};
  if (eldr_trace_format_counts(&ln, &buf, &len, &cap, &d)) fail_msg("%s", d.msg);
  ln.id = "req-2";
  ln.decode_counts = NULL;
  ln.decode_tokens = 7; /* unknown selections, known count */
  ln.serve = NULL;
  ln.arrival = -1;
  if (eldr_trace_format_counts(&ln, &buf, &len, &cap, &d)) fail_msg("%s", d.msg);
  assert_int_equal(buf[len - 1], '\n');
  const char *want1 =
      "{\"id\":\"req-1\",\"domain\":\"code\",\"model\":\"m\",\"num_experts\":3,\"top_k\":2,"
      "\"layers\":[5,9],\"arrival\":12.5,\"form\":\"counts\",\"prefill_tokens\":3,"
      "\"decode_tokens\":1,\"prefill_counts\":[[3,2,1],[2,2,2]],\"decode_counts\":[[1,1,0],"
      "[0,1,1]],\"serve\":{\"decoder\":\"10.0.0.2:8200\",\"ttft_ms\":12.5}}\n";
  assert_memory_equal(buf, want1, strlen(want1));
  eldr_trace *t = NULL;
  if (eldr_trace_parse(buf, len, &t, &d)) fail_msg("%s", d.msg);
  assert_int_equal(t->n, 2);
  assert_int_equal(t->layer_ids[1], 9);
  assert_memory_equal(t->req[0].prefill_counts, pc, sizeof pc);
  assert_memory_equal(t->req[0].decode_counts, dc, sizeof dc);
  assert_string_equal(t->req[0].serve, "{\"decoder\":\"10.0.0.2:8200\",\"ttft_ms\":12.5}");
  assert_true(t->req[0].arrival == 12.5);
  assert_null(t->req[1].decode_counts);
  assert_int_equal(t->req[1].n_decode, 7);
  assert_true(t->req[1].arrival < 0);
  eldr_trace_free(t);

  /* refusals leave the buffer's length alone */
  const size_t before = len;
  const uint32_t bad_sum[6] = {3, 2, 0, 2, 2, 2}, bad_max[6] = {4, 1, 1, 2, 2, 2};
  ln.prefill_counts = bad_sum;
  assert_int_equal(eldr_trace_format_counts(&ln, &buf, &len, &cap, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "request 'req-2': prefill_counts: layer 0: sums to 5, expected 3 tokens * top_k 2 = 6");
  ln.prefill_counts = bad_max;
  assert_int_equal(eldr_trace_format_counts(&ln, &buf, &len, &cap, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "layer 0 expert 0: count 4 > 3 tokens");
  ln.prefill_counts = pc;
  ln.serve = "{\"a\":1";
  assert_int_equal(eldr_trace_format_counts(&ln, &buf, &len, &cap, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "serve");
  ln.serve = "[1]";
  assert_int_equal(eldr_trace_format_counts(&ln, &buf, &len, &cap, &d), ELDR_EPARSE);
  ln.serve = NULL;
  ln.shape = NULL;
  assert_int_equal(eldr_trace_format_counts(&ln, &buf, &len, &cap, &d), ELDR_EINVAL);
  assert_int_equal(len, before);
  free(buf);
}

/* A file may mix the two forms line by line. */
#define HEAD "\"model\":\"m\",\"num_experts\":4,\"top_k\":2,\"layers\":[1,3]"
#define TOK "{\"id\":\"t\"," HEAD ",\"prefill\":[[[0,1],[2,3]]],\"decode\":[[[1,0],[2,3]]]}"
#define CNT_BODY "\"form\":\"counts\",\"prefill_tokens\":1,\"decode_tokens\":0"
#define CNT_ROWS "\"prefill_counts\":[[1,1,0,0],[0,0,1,1]]"
#define CNT "{\"id\":\"c\"," HEAD "," CNT_BODY "," CNT_ROWS "}"

static void test_mixed(void **state) {
  (void)state;
  const char *text = TOK "\n" CNT "\n";
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  if (eldr_trace_parse(text, strlen(text), &t, &d)) fail_msg("%s", d.msg);
  assert_int_equal(t->n, 2);
  assert_false(eldr_request_is_counts(&t->req[0]));
  assert_true(eldr_request_is_counts(&t->req[1]));
  uint32_t a[8], b[8];
  eldr_trace_request_counts(t, &t->req[0], 0, a);
  eldr_trace_request_counts(t, &t->req[1], 0, b);
  assert_memory_equal(a, b, sizeof a);
  assert_true(eldr_request_has_decode(&t->req[0]));
  assert_false(eldr_request_has_decode(&t->req[1]));
  eldr_trace_free(t);
  /* white space and 9-digit counts take the general path: the same matrix */
  const char *spaced = "{\"id\":\"s\"," HEAD "," CNT_BODY ",\"prefill_counts\": [ [1, 1,0,0] ,[0,0 ,1,1 ]],"
                       "\"decode_counts\":null}\n"
                       "{\"id\":\"big\"," HEAD ",\"form\":\"counts\",\"prefill_tokens\":999999999,"
                       "\"decode_tokens\":0,\"prefill_counts\":[[999999999,999999999,0,0],[0,0,"
                       "999999999,999999999]]}\n";
  if (eldr_trace_parse(spaced, strlen(spaced), &t, &d)) fail_msg("%s", d.msg);
  assert_memory_equal(t->req[0].prefill_counts, b, sizeof b);
  assert_int_equal(t->req[1].prefill_counts[7], 999999999);
  eldr_trace_free(t);
}

/* the parse of a line fails with err naming sub1 (and sub2) */
#define expect_err eldr_test_trace_parse_fails

#define CL(rest) TOK "\n{\"id\":\"c\"," HEAD "," rest "}\n"

static void test_validation(void **state) {
  (void)state;
  /* sums, bounds */
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0],[0,0,1,0]]"), ELDR_ERANGE,
             "line 2: field 'prefill_counts': layer 1: sums to 1, expected 1 tokens * top_k 2 = 2",
             NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[2,0,0,0],[0,0,1,1]]"), ELDR_ERANGE,
             "line 2: field 'prefill_counts': layer 0 expert 0: count 2 > 1 tokens", NULL);
  expect_err(CL(CNT_BODY "," CNT_ROWS ",\"decode_counts\":[[1,1,0,0],[0,0,1,1]]"), ELDR_ERANGE,
             "line 2: field 'decode_counts': layer 0 expert 0: count 1 > 0 tokens", NULL);
  /* shape */
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0],[0,0,1,1]]"), ELDR_ESHAPE,
             "field 'prefill_counts': layer 0: 3 counts, expected num_experts 4", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0,0],[0,0,1,1]]"), ELDR_ESHAPE,
             "layer 0: more than num_experts 4 counts", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0]]"), ELDR_ESHAPE,
             "1 layer rows, expected 2", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0],[0,0,1,1],[1,1,0,0]]"), ELDR_ESHAPE,
             "more than 2 layer rows", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[]"), ELDR_ESHAPE, "0 layer rows", NULL);
  /* values */
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0],[0,0,1,-1]]"), ELDR_EPARSE,
             "layer 1 expert 3: expected a non-negative integer", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0],[0,0,1,1.0]]"), ELDR_EPARSE,
             "layer 1 expert 3", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0],[0,0,01,1]]"), ELDR_EPARSE,
             "layer 1 expert 2", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":[[1,1,0,0],[0,0,1,4294967296]]"), ELDR_EPARSE,
             "below 2^32", NULL);
  expect_err(CL("\"form\":\"counts\",\"prefill_tokens\":-1,\"decode_tokens\":0," CNT_ROWS),
             ELDR_ERANGE, "field 'prefill_tokens': negative", NULL);
  expect_err(CL("\"form\":\"counts\",\"prefill_tokens\":1.5,\"decode_tokens\":0," CNT_ROWS),
             ELDR_EPARSE, "field 'prefill_tokens'", NULL);
  /* fields by form */
  expect_err(CL("\"form\":\"count\"," CNT_ROWS), ELDR_EPARSE, "line 2: field 'form': expected \"counts\"",
             NULL);
  expect_err(CL("\"form\":\"counts\",\"decode_tokens\":0," CNT_ROWS), ELDR_EPARSE,
             "line 2: field 'prefill_tokens': missing", NULL);
  expect_err(CL("\"form\":\"counts\",\"prefill_tokens\":1," CNT_ROWS), ELDR_EPARSE,
             "field 'decode_tokens': missing", NULL);
  expect_err(CL(CNT_BODY), ELDR_EPARSE, "field 'prefill_counts': missing", NULL);
  expect_err(CL(CNT_BODY ",\"prefill_counts\":null"), ELDR_EPARSE, "field 'prefill_counts'", NULL);
  expect_err(CL(CNT_BODY "," CNT_ROWS ",\"prefill\":[]"), ELDR_EPARSE,
             "field 'prefill': per-token rows are not allowed", NULL);
  expect_err(CL(CNT_BODY "," CNT_ROWS ",\"prefill_gates\":[]"), ELDR_EPARSE,
             "field 'prefill_gates': per-token rows are not allowed", NULL);
  expect_err(CL("\"prefill\":[],\"decode\":[]," CNT_ROWS), ELDR_EPARSE,
             "field 'prefill_counts': only allowed with \"form\":\"counts\"", NULL);
  expect_err(CL("\"prefill\":[],\"decode\":[],\"decode_counts\":[[0]]"), ELDR_EPARSE,
             "field 'decode_counts': only allowed", NULL);
  expect_err(CL("\"prefill\":[],\"decode\":[],\"prefill_tokens\":3"), ELDR_EPARSE,
             "field 'prefill_tokens': only allowed", NULL);
  expect_err(CL(CNT_BODY "," CNT_ROWS ",\"serve\":[1]"), ELDR_EPARSE,
             "field 'serve': expected an object", NULL);
  expect_err(CL(CNT_BODY "," CNT_ROWS ",\"serve\":{\"a\":}"), ELDR_EPARSE, "field 'serve'", NULL);
  expect_err(CL(CNT_BODY "," CNT_ROWS ",\"form\":\"counts\""), ELDR_EPARSE,
             "field 'form': duplicated", NULL);
  /* the shape check against line 1 still applies in counts form */
  expect_err(TOK "\n{\"id\":\"c\",\"model\":\"m\",\"num_experts\":4,\"top_k\":2,\"layers\":[1,4],"
                 CNT_BODY "," CNT_ROWS "}\n",
             ELDR_ESHAPE, "line 2: field 'layers'", NULL);
  /* null decode_counts and serve are absent */
  const char *ok = CL(CNT_BODY "," CNT_ROWS ",\"decode_counts\":null,\"serve\":null");
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  if (eldr_trace_parse(ok, strlen(ok), &t, &d)) fail_msg("%s", d.msg);
  assert_null(t->req[1].decode_counts);
  assert_null(t->req[1].serve);
  eldr_trace_free(t);
}

/* eldr_trace_append_counts checks rows like the reader. */
static void test_append_counts(void **state) {
  (void)state;
  eldr_shape s = {1, 3, 2};
  eldr_trace *t = eldr_trace_new("m", &s, NULL);
  const uint32_t ok[3] = {2, 1, 1}, bad[3] = {2, 2, 1};
  eldr_diag d = {{0}};
  assert_int_equal(eldr_trace_append_counts(t, "a", "x", NULL, 1.0, ok, 2, NULL, 5, NULL, &d), 0);
  assert_int_equal(eldr_trace_append_counts(t, "b", NULL, NULL, -1, bad, 2, NULL, 0, NULL, &d),
                   ELDR_ERANGE);
  ASSERT_MSG(d, "request 'b': prefill_counts: layer 0: sums to 5");
  assert_int_equal(eldr_trace_append_counts(t, "c", NULL, NULL, -1, ok, 2, bad, 2, NULL, &d),
                   ELDR_ERANGE);
  ASSERT_MSG(d, "decode_counts");
  assert_int_equal(eldr_trace_append_counts(t, NULL, NULL, NULL, -1, ok, 2, NULL, 0, NULL, &d),
                   ELDR_EINVAL);
  assert_int_equal(t->n, 1);
  eldr_request r = t->req[0];
  t->n = 0;
  eldr_request_release(&r);
  assert_null(r.prefill_counts);
  assert_int_equal(r.domain, -1);
  eldr_trace_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_format_counts),
      cmocka_unit_test(test_mixed),         cmocka_unit_test(test_validation),
      cmocka_unit_test(test_append_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
