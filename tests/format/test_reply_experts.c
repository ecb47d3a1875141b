/* test_reply_experts.c — the routed_experts reader on reply fixtures written
 * from vLLM's source (tests/fixtures/vllm, README there), one per layout and
 * dtype, every id checked at its sequence position; each reject reason; the
 * emitter read back in every layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/counts_ref.h"
#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"

/* the fixtures' model and id rule (gen_fixtures.py) */
enum { FL = 2, FE = 8, FK = 2, FP = 5 };
static int fid(size_t t, size_t l, size_t k) { return (int)((3 * t + 5 * l + k) % FE); }

static char *slurp(const char *name, size_t *len) {
  char path[512];
  snprintf(path, sizeof path, "%s/tests/fixtures/vllm/%s", ELDR_SOURCE_DIR, name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = 0;
  fclose(f);
  *len = (size_t)n;
  return b;
}

static int64_t id_at(const eldr_re_view *v, size_t t, size_t l, size_t k) {
  return eldr_sel_load(v->data, v->dtype, (t * v->layers + l) * v->top_k + k);
}

/* every row of v holds the ids of sequence positions first.. */
static void expect_rows(const eldr_re_view *v, size_t rows, size_t first, eldr_sel_dtype dt) {
  assert_int_equal(v->rows, rows);
  if (!rows) {
    assert_null(v->data);
    return;
  }
  assert_non_null(v->data);
  assert_int_equal(v->dtype, dt);
  assert_int_equal(v->layers, FL);
  assert_int_equal(v->top_k, FK);
  for (size_t t = 0; t < rows; t++)
    for (size_t l = 0; l < FL; l++)
      for (size_t k = 0; k < FK; k++)
        if (id_at(v, t, l, k) != fid(first + t, l, k))
          fail_msg("row %zu (position %zu) layer %zu slot %zu: %lld, want %d", t, first + t, l, k,
                   (long long)id_at(v, t, l, k), fid(first + t, l, k));
}

typedef struct fx {
  const char *file;
  eldr_re_api api;
  eldr_re_layout layout;
  eldr_sel_dtype dtype;
  size_t nchoices;
  size_t gen_rows[2]; /* generated rows per choice */
} fx;

static const fx FIXTURES[] = {
    {"npy_u1_completions_prefill.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_NPY, ELDR_SEL_U8, 1, {0}},
    {"npy_u2_chat_decode.json", ELDR_RE_CHAT, ELDR_RE_LAYOUT_NPY, ELDR_SEL_U16LE, 1, {3}},
    {"npy_i2_completions_decode.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_NPY, ELDR_SEL_I16LE, 1, {3}},
    {"npy_i4_chat_decode.json", ELDR_RE_CHAT, ELDR_RE_LAYOUT_NPY, ELDR_SEL_I32LE, 1, {3}},
    {"npy_i8_completions_decode.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_NPY, ELDR_SEL_I64LE, 1, {3}},
    {"npy_u1_completions_n2.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_NPY, ELDR_SEL_U8, 2, {2, 1}},
    {"v021_lists_chat.json", ELDR_RE_CHAT, ELDR_RE_LAYOUT_V021_LISTS, ELDR_SEL_U16, 1, {3}},
    {"v021_lists_completions_n2.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_V021_LISTS, ELDR_SEL_U16, 2, {2, 0}},
    {"v021_base64_int16_completions.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_V021_BASE64, ELDR_SEL_I16LE, 1, {3}},
    {"v021_base64_int16_chat_prefill.json", ELDR_RE_CHAT, ELDR_RE_LAYOUT_V021_BASE64, ELDR_SEL_I16LE, 1, {0}},
    {"pr38939_lists_completions.json", ELDR_RE_COMPLETIONS, ELDR_RE_LAYOUT_LISTS, ELDR_SEL_U16, 1, {3}},
};

static void test_fixtures(void **state) {
  (void)state;
  eldr_re_scratch scr;
  memset(&scr, 0, sizeof scr);
  for (size_t f = 0; f < sizeof FIXTURES / sizeof *FIXTURES; f++) {
    const fx *x = &FIXTURES[f];
    size_t len;
    char *body = slurp(x->file, &len);
    eldr_re_opts o = {x->api, FL, FK, FE, NULL, NULL, NULL, NULL, 0, NULL};
    eldr_reply_experts r;
    eldr_re_reason why;
    eldr_diag d = {{0}};
    if (eldr_reply_experts_read(body, len, &o, &r, &why, &d))
      fail_msg("%s: %s (%s)", x->file, d.msg, eldr_re_reason_name(why));
    assert_int_equal(why, ELDR_RE_OK);
    assert_int_equal(r.layout, x->layout);
    assert_int_equal(r.prompt_tokens, FP);
    assert_int_equal(r.nchoices, x->nchoices);
    for (size_t i = 0; i < r.nchoices; i++) {
      assert_int_equal(r.choices[i].index, (int64_t)i);
      expect_rows(&r.choices[i].prompt, FP, 0, x->dtype);
      assert_int_equal(r.choices[i].prompt.first_token, 0);
      expect_rows(&r.choices[i].generated, x->gen_rows[i], FP, x->dtype);
    }
    /* with the caller's scratch and fused counting (twice: the buffers are
     * reused): the same views, and choice 0's prompt rows counted exactly */
    for (int rep = 0; rep < 2; rep++) {
      uint32_t counts[FL * FE], ref[FL * FE];
      memset(counts, 0, sizeof counts);
      memset(ref, 0, sizeof ref);
      eldr_re_opts fo = o;
      fo.scratch = &scr;
      fo.counts = counts;
      eldr_reply_experts fr;
      assert_int_equal(eldr_reply_experts_read(body, len, &fo, &fr, &why, &d), 0);
      assert_int_equal(fr.counted, 1);
      assert_int_equal(fr.nchoices, r.nchoices);
      assert_int_equal(fr.nbufs, 0); /* nothing allocated for the views */
      const eldr_re_view *pv = &fr.choices[0].prompt;
      assert_memory_equal(pv->data, r.choices[0].prompt.data,
                          pv->rows * FL * FK * eldr_sel_dtype_size(pv->dtype));
      const eldr_shape sh = {FL, FE, FK};
      assert_int_equal(eldr__counts_ref(&sh, pv->data, pv->dtype, pv->rows, NULL, ref, NULL), 0);
      assert_memory_equal(counts, ref, sizeof ref);
      eldr_reply_experts_free(&fr);
    }
    eldr_reply_experts_free(&r);
    /* the other endpoint's reader refuses it */
    o.api = x->api == ELDR_RE_CHAT ? ELDR_RE_COMPLETIONS : ELDR_RE_CHAT;
    assert_int_not_equal(eldr_reply_experts_read(body, len, &o, &r, &why, NULL), 0);
    assert_int_equal(why, ELDR_RE_WRONG_OBJECT);
    /* an artifact of another shape or with fewer experts */
    eldr_re_opts o2 = {x->api, FL + 1, FK, FE, NULL, NULL, NULL, NULL, 0, NULL};
    assert_int_not_equal(eldr_reply_experts_read(body, len, &o2, &r, &why, &d), 0);
    assert_int_equal(why, ELDR_RE_SHAPE_MISMATCH);
    eldr_re_opts o3 = {x->api, FL, FK, 4, NULL, NULL, NULL, NULL, 0, NULL};
    assert_int_not_equal(eldr_reply_experts_read(body, len, &o3, &r, &why, &d), 0);
    assert_int_equal(why, ELDR_RE_ID_OUT_OF_RANGE);
    /* ... unless the mask leaves out the layers with such ids: none here */
    eldr_re_opts o4 = {x->api, 0, 0, 0, NULL, NULL, NULL, NULL, 0, NULL};
    assert_int_equal(eldr_reply_experts_read(body, len, &o4, &r, &why, &d), 0);
    eldr_reply_experts_free(&r);
    free(body);
  }
  eldr_re_scratch_free(&scr);
}

/* The mask bounds the id check: ids of unmasked layers are never read. */
static void test_mask_bounds_checks(void **state) {
  (void)state;
  const char *body =
      "{\"object\":\"text_completion\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1},"
      "\"choices\":[{\"index\":0,\"routed_experts\":null,\"token_ids\":[1]}],"
      "\"prompt_routed_experts\":[[[0,1],[90,91]]]}";
  uint8_t mask[2] = {1, 0};
  eldr_re_opts o = {ELDR_RE_COMPLETIONS, 2, 2, 8, mask, NULL, NULL, NULL, 0, NULL};
  eldr_reply_experts r;
  eldr_re_reason why;
  /* lists are converted whole, so their ids are always checked */
  assert_int_not_equal(eldr_reply_experts_read(body, strlen(body), &o, &r, &why, NULL), 0);
  assert_int_equal(why, ELDR_RE_ID_OUT_OF_RANGE);
  /* a compact int16 array with a bad id in layer 1 only: accepted under the mask */
  const int16_t ids[4] = {0, 1, 90, 91};
  char b64[64];
  eldr_b64_encode((const uint8_t *)ids, sizeof ids, b64);
  char buf[512];
  snprintf(buf, sizeof buf,
           "{\"object\":\"text_completion\",\"usage\":{\"prompt_tokens\":1},\"choices\":[{}],"
           "\"prompt_routed_experts\":{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],"
           "\"data\":\"%s\"}}",
           b64);
  assert_int_equal(eldr_reply_experts_read(buf, strlen(buf), &o, &r, &why, NULL), 0);
  assert_int_equal(r.choices[0].prompt.rows, 1);
  eldr_reply_experts_free(&r);
  o.layer_mask = NULL;
  assert_int_not_equal(eldr_reply_experts_read(buf, strlen(buf), &o, &r, &why, NULL), 0);
  assert_int_equal(why, ELDR_RE_ID_OUT_OF_RANGE);
}

typedef struct rej {
  const char *body;
  eldr_re_reason why;
} rej;

#define HEAD "{\"object\":\"text_completion\",\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1},"
#define ONE(re) HEAD "\"choices\":[{\"index\":0,\"token_ids\":[7],\"routed_experts\":" re "}]}"
#define SPLIT(pre) HEAD "\"choices\":[{\"index\":0}],\"prompt_routed_experts\":" pre "}"

static const rej REJECTS[] = {
    {"", ELDR_RE_NOT_JSON},
    {"[1,2]", ELDR_RE_NOT_JSON},
    {"{\"choices\":", ELDR_RE_NOT_JSON},
    {"{\"object\":\"chat.completion\",\"choices\":[]}", ELDR_RE_WRONG_OBJECT},
    {"{\"object\":\"text_completion\"}", ELDR_RE_NO_CHOICES},
    {"{\"choices\":{}}", ELDR_RE_NO_CHOICES},
    {"{\"choices\":[3]}", ELDR_RE_BAD_TYPE},
    {ONE("7"), ELDR_RE_BAD_TYPE},
    {ONE("true"), ELDR_RE_BAD_TYPE},
    {ONE("\"k05VTVBZ!!==\""), ELDR_RE_BAD_BASE64},
    {ONE("\"abc\""), ELDR_RE_BAD_BASE64},
    {ONE("\"aGVsbG8gd29ybGQh\""), ELDR_RE_BAD_NPY},
    /* nested lists */
    {SPLIT("[[[0,1],[2,3]],[[0,1]]]"), ELDR_RE_BAD_SHAPE},
    {SPLIT("[[[0,1],[2]],[[0,1],[2,3]]]"), ELDR_RE_BAD_SHAPE},
    {SPLIT("[1,2]"), ELDR_RE_BAD_SHAPE},
    {SPLIT("[[[0,\"1\"],[2,3]]]"), ELDR_RE_BAD_TYPE},
    {SPLIT("[[[0,1.5],[2,3]]]"), ELDR_RE_BAD_TYPE},
    {SPLIT("[[[0,-1],[2,3]]]"), ELDR_RE_NEGATIVE_ID},
    {SPLIT("[[[0,9],[2,3]]]"), ELDR_RE_ID_OUT_OF_RANGE},
    {SPLIT("[[[0,1],[2,3]],[[0,1],[2,3]],[[0,1],[2,3]]]"), ELDR_RE_ROWS_EXCEED_TOKENS},
    {SPLIT("[[[0,1,2],[2,3,4]]]"), ELDR_RE_SHAPE_MISMATCH},
    {SPLIT("\"k05VTVBZ\""), ELDR_RE_BAD_NPY}, /* checked as npy first: a bad one */
    /* the compact object; "AAABAAIAAwA=" is int16 [0,1,2,3] */
    {SPLIT("{\"encoding\":\"base85\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_UNKNOWN_ENCODING},
    {SPLIT("{\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_UNKNOWN_ENCODING},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"float32\",\"shape\":[1,2,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_UNKNOWN_DTYPE},
    {SPLIT("{\"encoding\":\"base64\",\"shape\":[1,2,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_UNKNOWN_DTYPE},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_BAD_SHAPE},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,-2,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_BAD_SHAPE},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":5}"), ELDR_RE_BAD_TYPE},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AAABAAIA\"}"), ELDR_RE_LENGTH_MISMATCH},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int32\",\"shape\":[1,2,2],\"data\":\"AAABAAIAAwA=\"}"), ELDR_RE_LENGTH_MISMATCH},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AAD//wIAAwA=\"}"), ELDR_RE_NEGATIVE_ID},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AAAJAAIAAwA=\"}"), ELDR_RE_ID_OUT_OF_RANGE},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AAAB\"}"), ELDR_RE_LENGTH_MISMATCH},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,2,2],\"data\":\"AA@BAAIAAwA=\"}"), ELDR_RE_BAD_BASE64},
    {SPLIT("{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[1,999,2],\"data\":\"\"}"), ELDR_RE_BAD_SHAPE},
    /* a split prompt with an npy choice: mixed layouts */
    {HEAD "\"choices\":[{\"routed_experts\":\"AAAA\"}],\"prompt_routed_experts\":[[[0,1],[2,3]]]}", ELDR_RE_BAD_NPY},
    {HEAD "\"choices\":[{\"routed_experts\":{\"encoding\":\"base64\",\"dtype\":\"int16\",\"shape\":[0,2,2],\"data\":\"\"}}],"
          "\"prompt_routed_experts\":[[[0,1],[2,3]]]}", ELDR_RE_BAD_TYPE},
};

static void test_rejects(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof REJECTS / sizeof *REJECTS; i++) {
    eldr_re_opts o = {ELDR_RE_COMPLETIONS, 2, 2, 8, NULL, NULL, NULL, NULL, 0, NULL};
    eldr_reply_experts r;
    eldr_re_reason why = ELDR_RE_OK;
    eldr_diag d = {{0}};
    int rc = eldr_reply_experts_read(REJECTS[i].body, strlen(REJECTS[i].body), &o, &r, &why, &d);
    if (rc == 0) fail_msg("case %zu accepted: %s", i, REJECTS[i].body);
    if (why != REJECTS[i].why)
      fail_msg("case %zu: reason %s, want %s (%s): %s", i, eldr_re_reason_name(why),
               eldr_re_reason_name(REJECTS[i].why), d.msg, REJECTS[i].body);
    assert_true(d.msg[0] != '\0');
    assert_int_equal(r.nchoices, 0);
    assert_null(r.choices);
    eldr_reply_experts_free(&r);
  }
}

/* npy rows beyond prompt + generated - 1 are nonsense; a reply with no
 * routed_experts at all is layout NONE, not an error. */
static void test_npy_rows_and_absent(void **state) {
  (void)state;
  eldr_shape s = {2, 8, 2};
  uint16_t sel[4 * 4] = {0};
  char *b64 = NULL;
  assert_int_equal(eldr_routed_experts_encode(sel, 4, &s, ELDR_SEL_U16, &b64, NULL), 0);
  char buf[1024];
  /* P=2, G=1: at most 2 rows */
  snprintf(buf, sizeof buf, ONE("\"%s\""), b64);
  eldr_re_opts o = {ELDR_RE_COMPLETIONS, 2, 2, 8, NULL, NULL, NULL, NULL, 0, NULL};
  eldr_reply_experts r;
  eldr_re_reason why;
  assert_int_not_equal(eldr_reply_experts_read(buf, strlen(buf), &o, &r, &why, NULL), 0);
  assert_int_equal(why, ELDR_RE_ROWS_EXCEED_TOKENS);
  /* token count unknown (no token_ids, no usage): prompt rows first */
  snprintf(buf, sizeof buf,
           "{\"usage\":{\"prompt_tokens\":3},\"choices\":[{\"routed_experts\":\"%s\"},{\"index\":9}]}", b64);
  assert_int_equal(eldr_reply_experts_read(buf, strlen(buf), &o, &r, &why, NULL), 0);
  assert_int_equal(r.layout, ELDR_RE_LAYOUT_NPY);
  assert_int_equal(r.choices[0].prompt.rows, 3);
  assert_int_equal(r.choices[0].generated.rows, 1);
  assert_int_equal(r.choices[1].index, 9);
  assert_null(r.choices[1].prompt.data);
  eldr_reply_experts_free(&r);
  /* fewer rows than prompt tokens (prefix cache): first_token says where they start */
  snprintf(buf, sizeof buf,
           "{\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1},\"choices\":[{\"routed_experts\":\"%s\"}]}", b64);
  assert_int_equal(eldr_reply_experts_read(buf, strlen(buf), &o, &r, &why, NULL), 0);
  assert_int_equal(r.choices[0].prompt.rows, 4);
  assert_int_equal(r.choices[0].prompt.first_token, 5);
  eldr_reply_experts_free(&r);
  free(b64);
  const char *none = "{\"object\":\"text_completion\",\"choices\":[{\"text\":\"x\",\"routed_experts\":null}],"
                     "\"prompt_routed_experts\":null}";
  assert_int_equal(eldr_reply_experts_read(none, strlen(none), &o, &r, &why, NULL), 0);
  assert_int_equal(r.layout, ELDR_RE_LAYOUT_NONE);
  assert_int_equal(r.nchoices, 1);
  assert_null(r.choices[0].prompt.data);
  assert_null(r.choices[0].generated.data);
  eldr_reply_experts_free(&r);
}

/* What the emulated worker emits reads back, in every layout. */
static void test_emit_roundtrip(void **state) {
  (void)state;
  const eldr_shape s = {3, 300, 4};
  enum { PR = 6, GR = 2 };
  uint16_t p[PR * 12], g[GR * 12];
  for (size_t i = 0; i < PR * 12; i++) p[i] = (uint16_t)(i * 37 % 300);
  for (size_t i = 0; i < GR * 12; i++) g[i] = (uint16_t)(i * 11 % 300);
  const eldr_re_layout lays[] = {ELDR_RE_LAYOUT_NPY, ELDR_RE_LAYOUT_V021_LISTS, ELDR_RE_LAYOUT_V021_BASE64,
                                 ELDR_RE_LAYOUT_LISTS};
  for (size_t li = 0; li < 4; li++) {
    json_t *body = json_pack("{s:s,s:{s:i,s:i}}", "object", "chat.completion", "usage",
                             "prompt_tokens", PR + 1, "completion_tokens", GR + 1);
    json_t *choice = json_pack("{s:i}", "index", 0);
    assert_int_equal(eldr_reply_experts_emit(body, choice, lays[li], p, PR, g, GR, &s), 0);
    json_object_set_new(body, "choices", json_pack("[o]", choice));
    char *txt = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    eldr_re_opts o = {ELDR_RE_CHAT, 3, 4, 300, NULL, NULL, NULL, NULL, 0, NULL};
    eldr_reply_experts r;
    eldr_re_reason why;
    eldr_diag d = {{0}};
    if (eldr_reply_experts_read(txt, strlen(txt), &o, &r, &why, &d))
      fail_msg("%s: %s", eldr_re_layout_name(lays[li]), d.msg);
    assert_int_equal(r.layout, lays[li]);
    const eldr_re_view *pv = &r.choices[0].prompt, *gv = &r.choices[0].generated;
    assert_int_equal(pv->rows, PR);
    assert_int_equal(pv->first_token, 1);
    assert_int_equal(gv->rows, GR);
    for (size_t i = 0; i < PR * 12; i++) assert_int_equal(id_at(pv, i / 12, i / 4 % 3, i % 4), p[i]);
    for (size_t i = 0; i < GR * 12; i++) assert_int_equal(id_at(gv, i / 12, i / 4 % 3, i % 4), g[i]);
    eldr_reply_experts_free(&r);
    free(txt);
  }
  /* a reply parsed by the caller reads the same; the root may go right after */
  {
    size_t len;
    char *b = slurp("v021_base64_int16_completions.json", &len);
    json_t *root = json_loadb(b, len, 0, NULL);
    eldr_re_opts o = {ELDR_RE_COMPLETIONS, FL, FK, FE, NULL, NULL, NULL, NULL, 0, NULL};
    eldr_reply_experts r;
    assert_int_equal(eldr_reply_experts_from_json(root, &o, &r, NULL, NULL), 0);
    json_decref(root);
    free(b);
    expect_rows(&r.choices[0].prompt, FP, 0, ELDR_SEL_I16LE);
    expect_rows(&r.choices[0].generated, 3, FP, ELDR_SEL_I16LE);
    eldr_reply_experts_free(&r);
    json_t *arr = json_array();
    eldr_re_reason why;
    assert_int_not_equal(eldr_reply_experts_from_json(arr, &o, &r, &why, NULL), 0);
    assert_int_equal(why, ELDR_RE_NOT_JSON);
    json_decref(arr);
    assert_int_not_equal(eldr_reply_experts_read(NULL, 5, &o, &r, &why, NULL), 0);
    assert_int_equal(why, ELDR_RE_NOT_JSON);
  }
  eldr_re_layout l;
  assert_int_equal(eldr_re_layout_parse("v021-base64", &l), 0);
  assert_int_equal(l, ELDR_RE_LAYOUT_V021_BASE64);
  assert_int_equal(eldr_re_layout_parse("none", &l), -1);
  assert_int_equal(eldr_re_layout_parse("npy2", &l), -1);
  for (int i = 0; i < ELDR_RE__N; i++) assert_non_null(eldr_re_reason_name((eldr_re_reason)i));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixtures),
      cmocka_unit_test(test_mask_bounds_checks),
      cmocka_unit_test(test_rejects),
      cmocka_unit_test(test_npy_rows_and_absent),
      cmocka_unit_test(test_emit_roundtrip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
