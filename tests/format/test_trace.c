/* test_trace.c — the JSONL trace reader/writer: the real llama4 trace (when
 * ../shared exists), round trips, counting, and every malformed input with
 * its line number and field. */
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

#include "support/proc.h"

#include "eldr/trace.h"

#define ASSERT_MSG(d, sub) eldr_test_msg_has(&(d), (sub))

static void assert_traces_equal(const eldr_trace *a, const eldr_trace *b) {
  assert_string_equal(a->model, b->model);
  assert_int_equal(a->shape.num_layers, b->shape.num_layers);
  assert_int_equal(a->shape.num_experts, b->shape.num_experts);
  assert_int_equal(a->shape.top_k, b->shape.top_k);
  assert_memory_equal(a->layer_ids, b->layer_ids, a->shape.num_layers * sizeof(uint32_t));
  assert_int_equal(a->n, b->n);
  assert_int_equal(a->n_domains, b->n_domains);
  for (size_t i = 0; i < a->n_domains; i++) assert_string_equal(a->domains[i], b->domains[i]);
  const size_t re = (size_t)a->shape.num_layers * a->shape.top_k;
  for (size_t i = 0; i < a->n; i++) {
    const eldr_request *x = &a->req[i], *y = &b->req[i];
    assert_string_equal(x->id, y->id);
    assert_int_equal(x->domain, y->domain);
    if (x->prompt || y->prompt) {
      assert_non_null(x->prompt);
      assert_non_null(y->prompt);
      assert_string_equal(x->prompt, y->prompt);
    }
    assert_true(x->arrival == y->arrival || (x->arrival < 0 && y->arrival < 0));
    assert_int_equal(x->n_prefill, y->n_prefill);
    assert_int_equal(x->n_decode, y->n_decode);
    if (x->n_prefill) assert_memory_equal(x->prefill, y->prefill, x->n_prefill * re * 2);
    if (x->n_decode) assert_memory_equal(x->decode, y->decode, x->n_decode * re * 2);
    assert_true((x->prefill_gates == NULL) == (y->prefill_gates == NULL));
    if (x->prefill_gates && x->n_prefill)
      assert_memory_equal(x->prefill_gates, y->prefill_gates, x->n_prefill * re * sizeof(float));
  }
}

static char *tmp_path(const char *tag) {
  static char buf[4][256];
  static int i;
  char *p = buf[i++ & 3];
  snprintf(p, 256, "/tmp/eldr_test_trace_%ld_%s.jsonl", (long)getpid(), tag);
  return p;
}

static eldr_trace *roundtrip(const eldr_trace *t) {
  char *p = tmp_path("rt");
  eldr_diag d = {{0}};
  int rc = eldr_trace_save(p, t, &d);
  if (rc) fail_msg("save: %s", d.msg);
  eldr_trace *back = NULL;
  rc = eldr_trace_load(p, &back, &d);
  if (rc) fail_msg("load: %s", d.msg);
  unlink(p);
  return back;
}

/* ---- the real trace ------------------------------------------------------ */

static void test_real_llama4(void **state) {
  (void)state;
  const char *path = ELDR_SHARED_DIR "/traces/llama4-mmlu-dev.jsonl";
  if (access(path, R_OK) != 0) skip();
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  int rc = eldr_trace_load(path, &t, &d);
  if (rc) fail_msg("%s", d.msg);
  assert_int_equal(t->n, 259);
  assert_int_equal(t->shape.num_layers, 24);
  assert_int_equal(t->shape.num_experts, 128);
  assert_int_equal(t->shape.top_k, 1);
  assert_string_equal(t->model, "Llama-4-Maverick-17B-128E-Instruct");
  for (uint32_t l = 0; l < 24; l++) assert_int_equal(t->layer_ids[l], 2 * l + 1);
  assert_int_equal(t->n_domains, 3);
  assert_string_equal(t->domains[0], "abstract_algebra");
  assert_string_equal(t->req[0].id, "abstract_algebra/0");
  assert_int_equal(t->req[0].domain, 0);
  /* the file's first selections: prefill[0] = [[106],[85],[27],...] */
  assert_int_equal(t->req[0].prefill[0], 106);
  assert_int_equal(t->req[0].prefill[1], 85);
  assert_int_equal(t->req[0].prefill[2], 27);
  size_t tot_pre = 0;
  for (size_t i = 0; i < t->n; i++) {
    assert_true(t->req[i].n_decode <= 128);
    assert_true(t->req[i].n_decode > 0);
    assert_null(t->req[i].prompt);
    assert_null(t->req[i].prefill_gates);
    assert_true(t->req[i].arrival < 0);
    tot_pre += t->req[i].n_prefill;
  }
  assert_true(tot_pre > 259);
  /* counts of one request sum to tokens * L * K */
  uint32_t *c = malloc(sizeof(uint32_t) * 24 * 128);
  eldr_trace_request_counts(t, &t->req[5], 1, c);
  size_t sum = 0;
  for (size_t i = 0; i < 24 * 128; i++) sum += c[i];
  assert_int_equal(sum, (size_t)t->req[5].n_decode * 24);
  free(c);
  eldr_trace *back = roundtrip(t);
  assert_traces_equal(t, back);
  eldr_trace_free(back);
  /* the writer reproduces the file byte for byte (same compact form) */
  char *p = tmp_path("llama");
  assert_int_equal(eldr_trace_save(p, t, &d), 0);
  FILE *a = fopen(path, "rb"), *b = fopen(p, "rb");
  assert_non_null(a);
  assert_non_null(b);
  int ca, cb;
  size_t pos = 0;
  do {
    ca = fgetc(a);
    cb = fgetc(b);
    if (ca != cb) fail_msg("saved trace differs from the original at byte %zu", pos);
    pos++;
  } while (ca != EOF);
  fclose(a);
  fclose(b);
  unlink(p);
  eldr_trace_free(t);
}

/* ---- round trip with every extension ------------------------------------- */

static void test_roundtrip_extensions(void **state) {
  (void)state;
  eldr_shape s = {3, 300, 2};
  uint32_t lids[3] = {0, 4, 9};
  eldr_trace *t = eldr_trace_new("m/\"odd\" name", &s, lids);
  assert_non_null(t);
  uint64_t x = 42;
  for (int r = 0; r < 20; r++) {
    uint32_t np = (uint32_t)(r % 4), nd = (uint32_t)(r % 5);
    uint16_t pre[4 * 6], dec[5 * 6];
    float g[4 * 6];
    for (size_t i = 0; i < np * 6u; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      pre[i] = (uint16_t)((x >> 33) % 300);
      g[i] = (float)((x >> 11) & 0xffffff) / (float)0x1000000 * (i % 2 ? 1e-7f : 3.0f);
    }
    for (size_t i = 0; i < nd * 6u; i++) dec[i] = (uint16_t)((i * 37 + (size_t)r) % 300);
    char id[32];
    snprintf(id, sizeof id, "req-%d", r);
    const char *dom = r % 3 == 0 ? NULL : r % 3 == 1 ? "code" : "m\u00e4th \"q\"";
    const char *prompt = r % 2 ? "line1\nline2\t\"quoted\" \\ back \x01 ctl \u20ac" : NULL;
    double arrival = r % 5 == 0 ? -1.0 : r * 0.1 + 1e-9;
    int idx = eldr_trace_append(t, id, dom, prompt, arrival, pre, np, dec, nd, r % 3 ? g : NULL);
    assert_int_equal(idx, r);
  }
  eldr_trace *back = roundtrip(t);
  assert_traces_equal(t, back);
  /* and again: the writer's output is a fixed point */
  eldr_trace *back2 = roundtrip(back);
  assert_traces_equal(back, back2);
  eldr_trace_free(back2);
  eldr_trace_free(back);
  eldr_trace_free(t);
}

static void test_write_request_and_parse(void **state) {
  (void)state;
  eldr_shape s = {2, 4, 2};
  eldr_trace *t = eldr_trace_new("m", &s, NULL);
  uint16_t pre[8] = {0, 1, 2, 3, 3, 2, 1, 0}, dec[4] = {1, 1, 2, 2};
  assert_int_equal(eldr_trace_append(t, "a", "d", NULL, 0.5, pre, 2, dec, 1, NULL), 0);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_int_equal(eldr_trace_write_request(f, t, &t->req[0]), 0);
  fclose(f);
  assert_string_equal(buf, "{\"id\":\"a\",\"domain\":\"d\",\"model\":\"m\",\"num_experts\":4,\"top_k\":2,"
                           "\"layers\":[0,1],\"arrival\":0.5,\"prefill\":[[[0,1],[2,3]],[[3,2],[1,0]]],"
                           "\"decode\":[[[1,1],[2,2]]]}\n");
  /* the batching form appends the same bytes after what the buffer holds */
  char *fb = NULL;
  size_t fl = 0, fc = 0;
  assert_int_equal(eldr_trace_format_request(t, &t->req[0], &fb, &fl, &fc), 0);
  assert_int_equal(eldr_trace_format_request(t, &t->req[0], &fb, &fl, &fc), 0);
  assert_int_equal(fl, 2 * len);
  assert_memory_equal(fb, buf, len);
  assert_memory_equal(fb + len, buf, len);
  free(fb);
  eldr_trace *p = NULL;
  assert_int_equal(eldr_trace_parse(buf, len, &p, NULL), 0);
  assert_traces_equal(t, p);
  /* request counts = naive counts through eldr_counts_accumulate */
  uint32_t c[8];
  eldr_trace_request_counts(p, &p->req[0], 0, c);
  const uint32_t want_pre[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  assert_memory_equal(c, want_pre, sizeof c);
  eldr_trace_request_counts(p, &p->req[0], 1, c);
  const uint32_t want_dec[8] = {0, 2, 0, 0, 0, 0, 2, 0};
  assert_memory_equal(c, want_dec, sizeof c);
  eldr_trace_free(p);
  free(buf);
  eldr_trace_free(t);
}

static void test_append_and_new(void **state) {
  (void)state;
  eldr_shape bad = {0, 4, 2};
  assert_null(eldr_trace_new("m", &bad, NULL));
  eldr_shape s = {1, 4, 1};
  eldr_trace *t = eldr_trace_new(NULL, &s, NULL);
  uint16_t sel[2] = {3, 4};
  assert_int_equal(eldr_trace_append(t, "x", NULL, NULL, -1, sel, 2, NULL, 0, NULL), ELDR_ERANGE);
  assert_int_equal(t->n, 0);
  assert_int_equal(eldr_trace_append(t, "x", "a", NULL, -1, sel, 1, NULL, 0, NULL), 0);
  assert_int_equal(eldr_trace_append(t, "y", "b", NULL, -1, sel, 1, sel, 1, NULL), 1);
  assert_int_equal(eldr_trace_append(t, "z", "a", NULL, -1, NULL, 0, NULL, 0, NULL), 2);
  assert_int_equal(t->n_domains, 2);
  assert_int_equal(t->req[2].domain, 0);
  assert_int_equal(eldr_trace_domain_intern(t, "b"), 1);
  assert_int_equal(eldr_trace_domain_intern(t, "c"), 2);
  eldr_trace_free(t);
  eldr_trace_free(NULL);
}

/* ---- errors --------------------------------------------------------------- */

/* A valid line for shape L=2, E=4, K=2 with fields replaceable by key. */
#define L_ID "\"id\":\"r1\""
#define L_DOM "\"domain\":\"d\""
#define L_MODEL "\"model\":\"m\""
#define L_NE "\"num_experts\":4"
#define L_TK "\"top_k\":2"
#define L_LAY "\"layers\":[1,3]"
#define L_PRE "\"prefill\":[[[0,1],[2,3]]]"
#define L_DEC "\"decode\":[[[1,1],[2,2]],[[0,3],[3,0]]]"
#define GOOD "{" L_ID "," L_DOM "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}"

/* the parse of a line fails with err naming sub1 (and sub2) */
#define expect_err eldr_test_trace_parse_fails

static void test_good_line(void **state) {
  (void)state;
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  const char *text = GOOD "\n" GOOD "\n\n  \n" GOOD; /* blank lines, no final newline */
  int rc = eldr_trace_parse(text, strlen(text), &t, &d);
  if (rc) fail_msg("%s", d.msg);
  assert_int_equal(t->n, 3);
  assert_int_equal(t->req[0].n_prefill, 1);
  assert_int_equal(t->req[0].n_decode, 2);
  assert_int_equal(t->req[0].decode[5], 3);
  assert_int_equal(t->layer_ids[1], 3);
  eldr_trace_free(t);
  /* key order, whitespace, unknown fields, null optionals, empty arrays */
  const char *v2 = " { \"decode\" : [ ] , \"extra\": {\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9\"},"
                   " \"prefill\":[ [ [ 0 , 1 ] , [ 2,3 ] ] ] ," L_LAY "," L_TK "," L_NE ","
                   L_MODEL ", \"domain\": null, \"prompt\": \"h\\u00e9\\n\", \"arrival\": 1.5e0,"
                   L_ID "}\r\n";
  rc = eldr_trace_parse(v2, strlen(v2), &t, &d);
  if (rc) fail_msg("%s", d.msg);
  assert_int_equal(t->req[0].n_decode, 0);
  assert_int_equal(t->req[0].domain, -1);
  assert_string_equal(t->req[0].prompt, "h\xc3\xa9\n");
  assert_true(t->req[0].arrival == 1.5);
  eldr_trace_free(t);
}

static void test_errors_values(void **state) {
  (void)state;
  /* expert id >= num_experts on line 2 */
  expect_err(GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY
                  ",\"prefill\":[[[0,1],[2,4]]]," L_DEC "}\n",
             ELDR_ERANGE, "line 2: field 'prefill'", "token 0 layer 1 slot 1: expert id 4 >= num_experts 4");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE
             ",\"decode\":[[[1,1],[2,2]],[[0,3],[3,130]]]}",
             ELDR_ERANGE, "line 1: field 'decode'", "token 1 layer 1 slot 1: expert id 130");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":[[[0,-1],[2,3]]],"
             L_DEC "}",
             ELDR_ERANGE, "field 'prefill'", "negative expert id -1");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":[[[0,1.5],[2,3]]],"
             L_DEC "}",
             ELDR_EPARSE, "field 'prefill'", "not an integer");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":[[[0,1e0],[2,3]]],"
             L_DEC "}",
             ELDR_EPARSE, "field 'prefill'", "not an integer");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":[[[0,\"1\"],[2,3]]],"
             L_DEC "}",
             ELDR_EPARSE, "field 'prefill'", "slot 1: expected an integer");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":[[[0,01],[2,3]]],"
             L_DEC "}",
             ELDR_EPARSE, "field 'prefill'", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY
             ",\"prefill\":[[[0,99999999999999999999],[2,3]]]," L_DEC "}",
             ELDR_ERANGE, "field 'prefill'", ">= num_experts 4");
  /* ragged arrays */
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":[[[0,1]]]," L_DEC "}",
             ELDR_ESHAPE, "field 'prefill'", "token 0: 1 layers, expected 2");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY
             ",\"prefill\":[[[0,1],[2,3],[1,1]]]," L_DEC "}",
             ELDR_ESHAPE, "field 'prefill'", "more than 2 layers");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE
             ",\"decode\":[[[1,1],[2,2]],[[0],[3,0]]]}",
             ELDR_ESHAPE, "field 'decode'", "token 1 layer 0: 1 entries, expected top_k 2");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE
             ",\"decode\":[[[1,1],[2,2,2]]]}",
             ELDR_ESHAPE, "field 'decode'", "token 0 layer 1: more than top_k 2");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE ",\"decode\":[[]]}",
             ELDR_ESHAPE, "field 'decode'", "0 layers");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE ",\"decode\":[[[],[1,1]]]}",
             ELDR_ESHAPE, "field 'decode'", "0 entries");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE ",\"decode\":[1]}",
             ELDR_EPARSE, "field 'decode'", "token 0");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE ",\"decode\":[[1,2]]}",
             ELDR_EPARSE, "field 'decode'", "token 0 layer 0");
  /* gates */
  expect_err(GOOD "\n" GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC
                  ",\"prefill_gates\":[]}",
             ELDR_ESHAPE, "line 3: field 'prefill_gates'", "0 tokens, prefill has 1");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC
             ",\"prefill_gates\":[[[0.5,0.5],[0.5,\"x\"]]]}",
             ELDR_EPARSE, "field 'prefill_gates'", "token 0 layer 1 slot 1");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC
             ",\"prefill_gates\":[[[0.5,0.5],[0.5,1e999]]]}",
             ELDR_EPARSE, "field 'prefill_gates'", NULL);
}

static void test_errors_fields(void **state) {
  (void)state;
  /* missing fields */
  expect_err("{" L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}", ELDR_EPARSE,
             "line 1: field 'id': missing", NULL);
  expect_err("{" L_ID "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}", ELDR_EPARSE,
             "field 'model': missing", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_TK "," L_LAY "," L_PRE "," L_DEC "}", ELDR_EPARSE,
             "field 'num_experts': missing", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_LAY "," L_PRE "," L_DEC "}", ELDR_EPARSE,
             "field 'top_k': missing", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_PRE "," L_DEC "}", ELDR_EPARSE,
             "field 'layers': missing", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_DEC "}", ELDR_EPARSE,
             "field 'prefill': missing", NULL);
  expect_err(GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "}", ELDR_EPARSE,
             "line 2: field 'decode': missing", NULL);
  /* mistyped fields */
  expect_err("{\"id\":7," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}", ELDR_EPARSE,
             "field 'id'", "expected a string");
  expect_err("{" L_ID ",\"model\":[]," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'model'", NULL);
  expect_err("{" L_ID "," L_MODEL ",\"num_experts\":\"4\"," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'num_experts'", "expected an integer");
  expect_err("{" L_ID "," L_MODEL "," L_NE ",\"top_k\":2.0," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'top_k'", "expected an integer");
  expect_err("{" L_ID "," L_MODEL "," L_NE ",\"top_k\":5," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_ERANGE, "field 'top_k'", NULL);
  expect_err("{" L_ID "," L_MODEL ",\"num_experts\":0," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_ERANGE, "field 'num_experts'", NULL);
  expect_err("{" L_ID "," L_MODEL ",\"num_experts\":-4," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_ERANGE, "field 'num_experts'", "negative");
  expect_err("{" L_ID "," L_MODEL ",\"num_experts\":100000," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_ERANGE, "field 'num_experts'", "out of range");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK ",\"layers\":3," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'layers'", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK ",\"layers\":[]," L_PRE "," L_DEC "}",
             ELDR_ERANGE, "field 'layers'", "empty");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK ",\"layers\":[1,1]," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'layers'", "repeated");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK ",\"layers\":[1,\"3\"]," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'layers'", "entry 1");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY ",\"prefill\":{}," L_DEC "}",
             ELDR_EPARSE, "field 'prefill'", "expected an array");
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC
             ",\"arrival\":\"now\"}",
             ELDR_EPARSE, "field 'arrival'", NULL);
  expect_err("{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC
             ",\"arrival\":-2}",
             ELDR_ERANGE, "field 'arrival'", "negative");
  expect_err("{" L_ID ",\"domain\":5," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'domain'", NULL);
  expect_err("{" L_ID ",\"prompt\":true," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC
             "}",
             ELDR_EPARSE, "field 'prompt'", NULL);
  expect_err("{" L_ID ",\"id\":\"x\"," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'id'", "duplicated");
  expect_err("{\"id\":\"a\\u0000b\"," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'id'", NULL);
  expect_err("{\"id\":\"\xff\xfe\"," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_EPARSE, "field 'id'", NULL);
}

static void test_errors_disagree(void **state) {
  (void)state;
  expect_err(GOOD "\n{" L_ID ",\"model\":\"other\"," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC "}",
             ELDR_ESHAPE, "line 2: field 'model'", "disagrees");
  expect_err(GOOD "\n" GOOD "\n{" L_ID "," L_MODEL ",\"num_experts\":5," L_TK "," L_LAY "," L_PRE
                  "," L_DEC "}",
             ELDR_ESHAPE, "line 3: field 'num_experts'", "5 disagrees with the trace's 4");
  expect_err(GOOD "\n{" L_ID "," L_MODEL "," L_NE ",\"top_k\":1," L_LAY
                  ",\"prefill\":[],\"decode\":[]}",
             ELDR_ESHAPE, "line 2: field 'top_k'", NULL);
  expect_err(GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK ",\"layers\":[1,3,5]," L_PRE "," L_DEC "}",
             ELDR_ESHAPE, "line 2: field 'layers'", "3 layers");
  expect_err(GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK ",\"layers\":[1,2]," L_PRE "," L_DEC "}",
             ELDR_ESHAPE, "line 2: field 'layers'", "layer 1 is 2");
}

static void test_errors_json(void **state) {
  (void)state;
  expect_err("", ELDR_EEMPTY, "empty", NULL);
  expect_err("\n\n  \n", ELDR_EEMPTY, "empty", NULL);
  /* truncated last line */
  const char *good = GOOD "\n" GOOD "\n";
  char trunc[1024];
  snprintf(trunc, sizeof trunc, "%s%.*s", good, (int)strlen(GOOD) - 20, GOOD);
  expect_err(trunc, ELDR_EPARSE, "line 3", "truncated");
  snprintf(trunc, sizeof trunc, "%s%.*s", good, (int)strlen(GOOD) - 1, GOOD);
  expect_err(trunc, ELDR_EPARSE, "line 3", "truncated");
  snprintf(trunc, sizeof trunc, "%s{\"id\":\"abc", good);
  expect_err(trunc, ELDR_EPARSE, "line 3", "field 'id'");
  /* invalid JSON */
  expect_err("not json\n", ELDR_EPARSE, "line 1", "expected an object");
  expect_err("[1,2]\n", ELDR_EPARSE, "line 1", "expected an object");
  expect_err(GOOD "\n" GOOD " x\n", ELDR_EPARSE, "line 2", "trailing characters");
  expect_err(GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY "," L_PRE "," L_DEC ",}\n",
             ELDR_EPARSE, "line 2", "expected a string key");
  expect_err("{" L_ID " " L_MODEL "}", ELDR_EPARSE, "line 1", "expected ',' or '}'");
  expect_err("{\"id\" \"r1\"}", ELDR_EPARSE, "line 1", "expected ':'");
  expect_err("{" L_ID ",\"x\":[1,2,}", ELDR_EPARSE, "line 1", "field 'x'");
  expect_err("{" L_ID ",\"x\":tru}", ELDR_EPARSE, "line 1", "field 'x'");
  expect_err("{" L_ID ",\"x\":\"bad \\q escape\"}", ELDR_EPARSE, "line 1", "string");
  expect_err("{" L_ID ",\"x\":\"raw\ttab\"}", ELDR_EPARSE, "line 1", "string");
  expect_err("{" L_ID ",\"x\":-}", ELDR_EPARSE, "line 1", NULL);
  expect_err("{" L_ID ",\"x\":1.}", ELDR_EPARSE, "line 1", NULL);
  /* deep nesting is bounded */
  char deep[400];
  strcpy(deep, "{\"x\":");
  for (int i = 0; i < 100; i++) strcat(deep, "[");
  strcat(deep, "}");
  expect_err(deep, ELDR_EPARSE, "line 1", "too deep");
}

static void test_parse_line_atomic(void **state) {
  (void)state;
  eldr_shape s = {2, 4, 2};
  uint32_t lids[2] = {1, 3};
  eldr_trace *t = eldr_trace_new("m", &s, lids);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_trace_parse_line(t, GOOD, strlen(GOOD), 1, &d), 0);
  const char *bad = "{\"id\":\"r2\",\"domain\":\"new\"," L_MODEL "," L_NE "," L_TK "," L_LAY
                    ",\"prefill\":[[[0,1],[2,9]]]," L_DEC "}";
  assert_int_equal(eldr_trace_parse_line(t, bad, strlen(bad), 7, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "line 7: field 'prefill'");
  assert_int_equal(t->n, 1);
  assert_int_equal(t->n_domains, 1);
  /* a trace made with a shape: lines must match it */
  const char *other = "{" L_ID "," L_MODEL ",\"num_experts\":8," L_TK "," L_LAY "," L_PRE "," L_DEC "}";
  assert_int_equal(eldr_trace_parse_line(t, other, strlen(other), 8, &d), ELDR_ESHAPE);
  eldr_trace_free(t);
  eldr_trace *t2 = eldr_trace_new("m", &s, NULL); /* layers 0,1 != 1,3 */
  assert_int_equal(eldr_trace_parse_line(t2, GOOD, strlen(GOOD), 1, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "field 'layers'");
  assert_int_equal(t2->n, 0);
  eldr_trace_free(t2);
}

static void test_load_errors(void **state) {
  (void)state;
  eldr_trace *t;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_trace_load("/nonexistent/x.jsonl", &t, &d), ELDR_EIO);
  ASSERT_MSG(d, "/nonexistent/x.jsonl");
  assert_null(t);
  char *p = tmp_path("err");
  eldr_test_write(p, GOOD "\n" GOOD "\n{" L_ID "," L_MODEL "," L_NE "," L_TK "," L_LAY
                     ",\"prefill\":[[[0,1],[2,7]]]," L_DEC "}\n");
  assert_int_equal(eldr_trace_load(p, &t, &d), ELDR_ERANGE);
  char want[300];
  snprintf(want, sizeof want, "%s:3: field 'prefill': token 0 layer 1 slot 1: expert id 7 >= num_experts 4", p);
  assert_string_equal(d.msg, want);
  eldr_test_write(p, "");
  assert_int_equal(eldr_trace_load(p, &t, &d), ELDR_EEMPTY);
  ASSERT_MSG(d, "empty");
  eldr_test_write(p, GOOD "\n" GOOD "\n" GOOD);
  assert_int_equal(eldr_trace_load(p, &t, &d), 0);
  assert_int_equal(t->n, 3);
  eldr_trace_free(t);
  unlink(p);
  /* save to an unwritable place */
  eldr_shape s = {1, 2, 1};
  eldr_trace *e = eldr_trace_new("m", &s, NULL);
  assert_int_equal(eldr_trace_save("/nonexistent/dir/x.jsonl", e, &d), ELDR_EIO);
  eldr_trace_free(e);
}

/* ---- the compact fast path ----------------------------------------------- */

/* The reader has a fast path for id arrays in the writer's compact form
 * ("[[[1,2],[3,4]]]", no whitespace); any other spelling takes the general
 * path. Both must give identical traces and identical errors. */

#define C_HEAD "\"id\":\"c\",\"model\":\"m\",\"num_experts\":300,\"top_k\":3,\"layers\":[4,5,6]"

/* v with a space after every '[' and ',' and before every ']' (malloc'd). */
static char *spaced(const char *v) {
  char *o = malloc(strlen(v) * 3 + 1), *q = o;
  assert_non_null(o);
  for (; *v; v++) {
    if (*v == ']') *q++ = ' ';
    *q++ = *v;
    if (*v == '[' || *v == ',') *q++ = ' ';
  }
  *q = '\0';
  return o;
}

static char *line_with(const char *prefill, const char *decode) {
  char *o = malloc(strlen(prefill) + strlen(decode) + 256);
  assert_non_null(o);
  sprintf(o, "{" C_HEAD ",\"prefill\":%s,\"decode\":%s}\n", prefill, decode);
  return o;
}

static void test_compact_vs_spaced(void **state) {
  (void)state;
  const char *pre[] = {
      "[[[0,10,299],[128,7,65],[1,2,3]],[[9,99,100],[0,0,0],[299,298,297]]]",
      "[]",
      "[[[1,2,3],[4,5,6],[7,8,9]]]",
  };
  const char *dec[] = {
      "[[[100,200,255],[9,99,199],[0,1,2]]]",
      "[[[1,2,3],[4,5,6],[7,8,9]],[[10,20,30],[40,50,60],[70,80,90]]]",
      "[]",
  };
  /* compact; everything spaced; only decode spaced; fields in another order */
  size_t cap = 4096;
  char *txt[4];
  for (int v = 0; v < 4; v++) {
    txt[v] = calloc(1, cap);
    assert_non_null(txt[v]);
  }
  for (int i = 0; i < 3; i++) {
    char *sp = spaced(pre[i]), *sd = spaced(dec[i]);
    char *l0 = line_with(pre[i], dec[i]), *l1 = line_with(sp, sd), *l2 = line_with(pre[i], sd);
    char l3[2048];
    snprintf(l3, sizeof l3, "{\"decode\":%s,\"prefill\":%s," C_HEAD "}\n", dec[i], pre[i]);
    strcat(txt[0], l0);
    strcat(txt[1], l1);
    strcat(txt[2], l2);
    strcat(txt[3], l3);
    free(sp), free(sd), free(l0), free(l1), free(l2);
  }
  eldr_trace *t[4];
  eldr_diag d = {{0}};
  for (int v = 0; v < 4; v++) {
    if (eldr_trace_parse(txt[v], strlen(txt[v]), &t[v], &d)) fail_msg("variant %d: %s", v, d.msg);
  }
  assert_int_equal(t[0]->n, 3);
  assert_int_equal(t[0]->req[0].n_prefill, 2);
  assert_int_equal(t[0]->req[0].prefill[2], 299);
  assert_int_equal(t[0]->req[0].prefill[3], 128);
  assert_int_equal(t[0]->req[0].prefill[17], 297);
  assert_int_equal(t[0]->req[1].n_prefill, 0);
  assert_int_equal(t[0]->req[1].decode[17], 90);
  assert_int_equal(t[0]->req[2].n_decode, 0);
  for (int v = 1; v < 4; v++) assert_traces_equal(t[0], t[v]);
  /* and the writer's output reads back to the same */
  eldr_trace *back = roundtrip(t[0]);
  assert_traces_equal(t[0], back);
  eldr_trace_free(back);
  for (int v = 0; v < 4; v++) {
    eldr_trace_free(t[v]);
    free(txt[v]);
  }
}

static void test_compact_errors(void **state) {
  (void)state;
  static const struct {
    const char *pre;
    int err;
    const char *sub;
  } cases[] = {
      {"[[[1,2,3],[4,5,6],[7,8,9]],[[1,2,3],[4,5],[7,8,9]]]", ELDR_ESHAPE,
       "token 1 layer 1: 2 entries, expected top_k 3"},
      {"[[[1,2,3],[4,5,6],[7,8,300]]]", ELDR_ERANGE,
       "token 0 layer 2 slot 2: expert id 300 >= num_experts 300"},
      {"[[[1,2,3],[4,5,6],[7,8,9]],[[1,2,3],[4,5,6],[7,8,9],[1,1,1]]]", ELDR_ESHAPE,
       "token 1: more than 3 layers"},
      {"[[[1,2],[4,5],[7,8]]]", ELDR_ESHAPE, "token 0 layer 0: 2 entries, expected top_k 3"},
      {"[[[1,2,3,4],[4,5,6],[7,8,9]]]", ELDR_ESHAPE, "token 0 layer 0: more than top_k 3"},
      {"[[[1,2,3],[4,5,6]]]", ELDR_ESHAPE, "token 0: 2 layers, expected 3"},
      {"[[[1,2,3],[4,5,6],[7,8,9]],[[1,2,3],[4,5,6],[7,8,9]],[[1,2,3],[4,5,6]]]", ELDR_ESHAPE,
       "token 2: 2 layers, expected 3"},
      {"[[[1,2,3],[4,5,6],[7,8,09]]]", ELDR_EPARSE, "token 0 layer 2 slot 2: invalid number"},
      {"[[[1,2,3],[4,5,6],[7,8,70000]]]", ELDR_ERANGE, "expert id 70000 >= num_experts 300"},
      {"[[[1,2,3],[4,5,6],[7,8,9.0]]]", ELDR_EPARSE, "slot 2: expert id is not an integer"},
      {"[[[1,2,3],[4,5,6],[7,8,9e0]]]", ELDR_EPARSE, "slot 2: expert id is not an integer"},
      {"[[[1,2,3],[4,5,6],[7,8,-9]]]", ELDR_ERANGE, "slot 2: negative expert id -9"},
      {"[[[1,2,3],[4,5,6],[7,8,9]],]", ELDR_EPARSE, "token 1: expected an array of 3 layers"},
      {"[[[1,2,3],[4,5,6],[7,8,9],]]", ELDR_ESHAPE, "token 0: more than 3 layers"},
      {"[[[1,2,3],[4,5,6],[7,8,9]],[[1,2,3],[4,5,6],]]", ELDR_EPARSE,
       "token 1 layer 2: expected an array of 3 expert ids"},
      {"[[[1,2,3],[4,5,6],[7,8,]]]", ELDR_EPARSE, "slot 2: expected an integer expert id"},
      {"[[[1,2,3],[4,5,6],[7,8,9]]", ELDR_EPARSE, "invalid JSON: expected ',' or ']'"},
      {"[[[1,2,3],[4,5,6],[7,8,9]]]]", ELDR_EPARSE, "invalid JSON: expected ',' or '}'"},
      {"[[[1,2,3],[4,5,6],[7,8,\"9\"]]]", ELDR_EPARSE, "slot 2: expected an integer expert id"},
  };
  const char *good = "[[[1,2,3],[4,5,6],[7,8,9]]]";
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *sp = spaced(cases[i].pre);
    for (int form = 0; form < 4; form++) {
      /* 0/1: compact/spaced prefill on line 2; 2/3: the same as decode on line 1 */
      const char *v = form & 1 ? sp : cases[i].pre;
      char *l1 = line_with(good, good);
      char *bad = form < 2 ? line_with(v, good) : line_with(good, v);
      char *text = malloc(strlen(l1) + strlen(bad) + 1);
      assert_non_null(text);
      strcpy(text, form < 2 ? l1 : "");
      strcat(text, bad);
      eldr_trace *t = (eldr_trace *)0x1;
      eldr_diag d = {{0}};
      int rc = eldr_trace_parse(text, strlen(text), &t, &d);
      if (rc != cases[i].err)
        fail_msg("case %zu form %d: rc %d (%s), want %d", i, form, rc, d.msg, cases[i].err);
      assert_null(t);
      const char *where = form < 2 ? "line 2: field 'prefill'" : "line 1: field 'decode'";
      if (!strstr(cases[i].sub, "expected ',' or '}'")) ASSERT_MSG(d, where);
      ASSERT_MSG(d, cases[i].sub);
      /* the spaced form (general path) gives the very same message */
      if (form & 1) {
        eldr_diag d0 = {{0}};
        char *bad0 = form < 2 ? line_with(cases[i].pre, good) : line_with(good, cases[i].pre);
        char *text0 = malloc(strlen(l1) + strlen(bad0) + 1);
        assert_non_null(text0);
        strcpy(text0, form < 2 ? l1 : "");
        strcat(text0, bad0);
        eldr_trace *t0 = NULL;
        assert_int_equal(eldr_trace_parse(text0, strlen(text0), &t0, &d0), rc);
        assert_string_equal(d0.msg, d.msg);
        free(text0);
        free(bad0);
      }
      free(text);
      free(bad);
      free(l1);
    }
    free(sp);
  }
}

static void expect_err_n(const char *text, size_t len, int err, const char *sub) {
  eldr_trace *t = (eldr_trace *)0x1;
  eldr_diag d = {{0}};
  int rc = eldr_trace_parse(text, len, &t, &d);
  if (rc != err) fail_msg("rc %d (%s), want %d", rc, d.msg, err);
  assert_null(t);
  ASSERT_MSG(d, sub);
}

/* ---- large inputs: parsed in two halves ---------------------------------- */

/* Inputs of 64 MiB and more are parsed on two threads; the trace, its domain
 * table and the first bad line's message must be those of a sequential,
 * line-by-line parse. */
static void test_large_split(void **state) {
  (void)state;
  const size_t want = ((size_t)64 << 20) + ((size_t)2 << 20);
  size_t cap = want + (1 << 16), n = 0;
  char *text = malloc(cap);
  assert_non_null(text);
  n += (size_t)sprintf(text, "\n \n"); /* blank lines before the first request */
  size_t nlines = 2, bad1 = 0, bad2 = 0, half_line = 0;
  uint32_t x = 12345;
  for (size_t i = 0; n < want; i++) {
    const int second = n > want / 2;
    if (second && !half_line) half_line = nlines + 1;
    char dom[32] = "";
    if (i % 7 == 3) { /* no domain */
    } else if (second && i % 3 == 0) {
      snprintf(dom, sizeof dom, "\"domain\":\"late%zu\",", i % 5);
    } else {
      snprintf(dom, sizeof dom, "\"domain\":\"d%zu\",", i % 4);
    }
    n += (size_t)sprintf(text + n,
                         "{\"id\":\"r%zu\",%s\"model\":\"m\",\"num_experts\":64,\"top_k\":2,"
                         "\"layers\":[0,1,2,3],\"prefill\":[",
                         i, dom);
    for (int tk = 0; tk < 100; tk++) {
      text[n++] = tk ? ',' : '[';
      if (tk) text[n++] = '[';
      for (int l = 0; l < 4; l++) {
        x = x * 1103515245u + 12345u;
        n += (size_t)sprintf(text + n, "%s[%u,%u]", l ? "," : "", (x >> 8) % 64, (x >> 20) % 64);
      }
      text[n++] = ']';
    }
    n += (size_t)sprintf(text + n, "],\"decode\":[[[1,2],[3,4],[5,6],[7,%zu]]]}\n", i % 64);
    nlines++;
    if (i % 1000 == 999) {
      n += (size_t)sprintf(text + n, "\n"); /* a blank line now and then */
      nlines++;
    }
  }
  assert_true(half_line > 3);
  /* sequential reference: line by line */
  eldr_shape sh = {4, 64, 2};
  eldr_trace *ref = eldr_trace_new("m", &sh, NULL);
  assert_non_null(ref);
  eldr_diag d = {{0}};
  size_t ln = 0;
  for (const char *p = text, *e = text + n; p < e;) {
    const char *nl = memchr(p, '\n', (size_t)(e - p));
    ln++;
    if (nl - p > 1 || (nl - p == 1 && *p != ' ')) {
      if (eldr_trace_parse_line(ref, p, (size_t)(nl - p), ln, &d)) fail_msg("%s", d.msg);
      if (ln == half_line + 5) bad2 = (size_t)(strstr(p, "\"decode\":[[[1,") - text) + 12;
      if (ln == 100) bad1 = (size_t)(strstr(p, "\"decode\":[[[1,") - text) + 12;
    }
    p = nl + 1;
  }
  assert_true(bad1 && bad2);
  eldr_trace *t = NULL;
  if (eldr_trace_parse(text, n, &t, &d)) fail_msg("%s", d.msg);
  assert_traces_equal(ref, t);
  assert_true(t->n_domains > 4);
  eldr_trace_free(t);
  /* an error in the second half names its line */
  assert_int_equal(text[bad2], '1');
  text[bad2] = 'x';
  char where[64];
  snprintf(where, sizeof where, "line %zu: field 'decode'", half_line + 5);
  expect_err_n(text, n, ELDR_EPARSE, where);
  /* with another in the first half too, the first one is reported */
  text[bad1] = 'x';
  expect_err_n(text, n, ELDR_EPARSE, "line 100: field 'decode'");
  text[bad2] = '1';
  expect_err_n(text, n, ELDR_EPARSE, "line 100: field 'decode'");
  text[bad1] = '1';
  /* the last line truncated */
  expect_err_n(text, n - 3, ELDR_EPARSE, "truncated");
  snprintf(where, sizeof where, "line %zu:", nlines);
  expect_err_n(text, n - 3, ELDR_EPARSE, where);
  eldr_trace_free(ref);
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_llama4),
      cmocka_unit_test(test_roundtrip_extensions),
      cmocka_unit_test(test_write_request_and_parse),
      cmocka_unit_test(test_append_and_new),
      cmocka_unit_test(test_good_line),
      cmocka_unit_test(test_errors_values),
      cmocka_unit_test(test_errors_fields),
      cmocka_unit_test(test_errors_disagree),
      cmocka_unit_test(test_errors_json),
      cmocka_unit_test(test_parse_line_atomic),
      cmocka_unit_test(test_load_errors),
      cmocka_unit_test(test_compact_vs_spaced),
      cmocka_unit_test(test_compact_errors),
      cmocka_unit_test(test_large_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
