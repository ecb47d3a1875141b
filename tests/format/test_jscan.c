/* test_jscan.c — the JSON byte scanner: paths to spans, the last of a
 * repeated key, escaped keys, jansson's limits (depth, int64, real
 * overflow, \u0000), error messages naming the byte, the member walk and
 * the string / integer readers, an object written again (eldr_js_cut). */
#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <stdlib.h>

#include "eldr/cpu.h"
#include "support/levels.h"
#include "eldr/counts.h"
#include "eldr/jscan.h"

static int scan(const char *doc, const eldr_js_path *p, size_t np, eldr_js_span *f, eldr_diag *d) {
  return eldr_js_scan(doc, strlen(doc), p, np, f, NULL, d);
}

static void test_paths(void **state) {
  (void)state;
  const char *doc = " {\"usage\": {\"prompt_tokens\": 40, \"prompt_tokens_details\": {\"cached_tokens\": 16}},"
                    " \"choices\": [{\"text\": \"a\"}, {\"routed_experts\": \"QUJD\"}],"
                    " \"kv_transfer_params\": {\"remote_block_ids\": [1, 2]}} ";
  eldr_js_path p[] = {{{"usage", "prompt_tokens", NULL}},
                      {{"usage", "prompt_tokens_details", NULL}},
                      {{"choices", "#1", "routed_experts", NULL}},
                      {{"choices", "#0", "routed_experts", NULL}},
                      {{"kv_transfer_params", "remote_block_ids", "#1", NULL}},
                      {{"missing", NULL}}};
  eldr_js_span f[6], root;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_js_scan(doc, strlen(doc), p, 6, f, &root, &d), 0);
  assert_int_equal(root.type, ELDR_JS_OBJECT);
  assert_int_equal(root.off, 1);
  assert_int_equal(root.len, strlen(doc) - 2);
  int64_t x = 0;
  assert_int_equal(f[0].type, ELDR_JS_INTEGER);
  assert_int_equal(eldr_js_int(doc, f[0], &x), 0);
  assert_int_equal(x, 40);
  assert_int_equal(f[1].type, ELDR_JS_OBJECT);
  assert_memory_equal(doc + f[1].off, "{\"cached_tokens\": 16}", f[1].len);
  assert_int_equal(f[2].type, ELDR_JS_STRING);
  char buf[16];
  size_t n = 0;
  assert_int_equal(eldr_js_string(doc, f[2], buf, sizeof buf, &n), 0);
  assert_int_equal(n, 4);
  assert_memory_equal(buf, "QUJD", 4);
  assert_int_equal(eldr_js_string(doc, f[2], buf, 3, &n), ELDR_EINVAL); /* bounded */
  assert_int_equal(f[3].type, ELDR_JS_NONE);
  assert_int_equal(f[4].type, ELDR_JS_INTEGER);
  assert_int_equal(eldr_js_int(doc, f[4], &x), 0);
  assert_int_equal(x, 2);
  assert_int_equal(f[5].type, ELDR_JS_NONE);
  assert_int_equal(eldr_js_int(doc, f[2], &x), ELDR_EINVAL); /* a string is not an integer */
}

static void test_repeated_and_escaped_keys(void **state) {
  (void)state;
  /* the last value of a repeated key wins, and what the earlier one held is gone */
  const char *doc = "{\"a\":{\"b\":1},\"a\":{\"c\":2},\"\\u0073tream\":true}";
  eldr_js_path p[] = {{{"a", "b", NULL}}, {{"a", "c", NULL}}, {{"stream", NULL}}};
  eldr_js_span f[3];
  assert_int_equal(scan(doc, p, 3, f, NULL), 0);
  assert_int_equal(f[0].type, ELDR_JS_NONE);
  assert_int_equal(f[1].type, ELDR_JS_INTEGER);
  assert_int_equal(f[2].type, ELDR_JS_TRUE);
  /* the walk sees every member, in order */
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_span root;
  assert_int_equal(eldr_js_scan(doc, strlen(doc), NULL, 0, NULL, &root, NULL), 0);
  eldr_js_iter_init(&it, doc, root);
  const char *keys[] = {"a", "a", "stream"};
  for (int k = 0; k < 3; k++) {
    assert_true(eldr_js_next(&it, &m));
    assert_true(eldr_js_key_is(doc, m.key, keys[k]));
  }
  assert_false(eldr_js_next(&it, &m));
}

static void test_strings(void **state) {
  (void)state;
  const char *doc = "[\"\\u00e9\\ud83d\\ude00\\n\\/\\\"\"]";
  eldr_js_path p[] = {{{"#0", NULL}}};
  eldr_js_span f[1];
  assert_int_equal(scan(doc, p, 1, f, NULL), 0);
  char buf[32];
  size_t n = 0;
  assert_int_equal(eldr_js_string(doc, f[0], buf, sizeof buf, &n), 0);
  assert_int_equal(n, 2 + 4 + 3);
  assert_memory_equal(buf, "\xc3\xa9\xf0\x9f\x98\x80\n/\"", n);
}

static void rejects(const char *doc, size_t len, const char *why) {
  eldr_diag d = {{0}};
  assert_int_equal(eldr_js_scan(doc, len, NULL, 0, NULL, NULL, &d), ELDR_EPARSE);
  if (!strstr(d.msg, why)) fail_msg("'%s': got '%s', wanted '%s'", doc, d.msg, why);
}

static void accepts(const char *doc) {
  assert_int_equal(eldr_js_scan(doc, strlen(doc), NULL, 0, NULL, NULL, NULL), 0);
}

static void test_rejects_as_jansson(void **state) {
  (void)state;
  rejects("", 0, "empty document");
  rejects("{\"a\":1,}", 8, "byte 7: a string key expected");
  rejects("[1,]", 4, "byte 3");
  rejects("{\"a\":1} x", 9, "end of document expected");
  rejects("01", 2, "leading zero");
  rejects("1.", 2, "digit expected after '.'");
  rejects("9223372036854775808", 19, "int64");
  rejects("-9223372036854775809", 20, "int64");
  rejects("1e309", 5, "overflow");
  rejects("\"\\u0000\"", 8, "\\u0000");
  rejects("\"\\ud800\"", 8, "high surrogate");
  rejects("\"\\udc00\"", 8, "low surrogate");
  rejects("\"\xed\xa0\x80\"", 5, "UTF-8");
  rejects("\"\xc0\xaf\"", 4, "UTF-8");
  rejects("\"a\tb\"", 5, "control character");
  rejects("\"\\x\"", 4, "invalid escape");
  rejects("tru", 3, "invalid literal");
  rejects("[1\0]", 4, "byte 2"); /* jansson drops this NUL; RFC 8259 does not */
  accepts("9223372036854775807");
  accepts("-9223372036854775808");
  accepts("1e-400"); /* underflow is no error, as for strtod and jansson */
  accepts(" \"x\" ");
  /* depth: 2048 values deep at most, scalars counted */
  char *deep = malloc(2 * 2049 + 2);
  assert_non_null(deep);
  memset(deep, '[', 2048);
  memset(deep + 2048, ']', 2048);
  deep[4096] = 0;
  accepts(deep);
  memset(deep, '[', 2048);
  deep[2048] = '1';
  memset(deep + 2049, ']', 2048);
  rejects(deep, 4097, "nesting too deep");
  free(deep);
}

/* Array elements in order, whatever they hold: strings with brackets,
 * commas and escaped quotes, nested containers, numbers, literals; an empty
 * array has none; a value that is not an array walks nothing. */
static void test_elements(void **state) {
  (void)state;
  static const char doc[] = " [ \"a]\\\",[\" , [1,[2]] ,{\"k\":\"]\"},-3.5e2,true , null,7 ] ";
  eldr_js_span root;
  assert_int_equal(eldr_js_scan(doc, sizeof doc - 1, NULL, 0, NULL, &root, NULL), 0);
  assert_int_equal(root.type, ELDR_JS_ARRAY);
  static const char *const want[] = {"\"a]\\\",[\"", "[1,[2]]", "{\"k\":\"]\"}", "-3.5e2", "true", "null", "7"};
  static const eldr_js_type types[] = {ELDR_JS_STRING, ELDR_JS_ARRAY, ELDR_JS_OBJECT, ELDR_JS_REAL,
                                       ELDR_JS_TRUE,   ELDR_JS_NULL,  ELDR_JS_INTEGER};
  eldr_js_iter it;
  eldr_js_span v;
  size_t n = 0;
  eldr_js_iter_array(&it, doc, root);
  while (eldr_js_next_elem(&it, &v)) {
    assert_true(n < 7);
    assert_int_equal(v.len, strlen(want[n]));
    assert_memory_equal(doc + v.off, want[n], v.len);
    assert_int_equal(v.type, types[n]);
    n++;
  }
  assert_int_equal(n, 7);
  static const char empty[] = "[ ]";
  assert_int_equal(eldr_js_scan(empty, 3, NULL, 0, NULL, &root, NULL), 0);
  eldr_js_iter_array(&it, empty, root);
  assert_int_equal(eldr_js_next_elem(&it, &v), 0);
  static const char obj[] = "{\"a\":[1]}";
  assert_int_equal(eldr_js_scan(obj, sizeof obj - 1, NULL, 0, NULL, &root, NULL), 0);
  eldr_js_iter_array(&it, obj, root);
  assert_int_equal(eldr_js_next_elem(&it, &v), 0);
}

/* Long strings (the 64-byte AVX2 steps): a special byte at every offset
 * across several steps and the tail gives the same answer, offset and
 * message with SIMD on and off (ELDR_NO_SIMD's portable loop). */
static void test_long_strings_simd(void **state) {
  (void)state;
  static const char *const specials[] = {"\xc3\xa9", "\xff", "\n", "\\n", "\\u00e9", "\"", "\\q"};
  char doc[600];
  for (size_t sp = 0; sp < sizeof specials / sizeof *specials; sp++)
    for (size_t at = 0; at < 400; at += 3) {
      const size_t sl = strlen(specials[sp]);
      size_t n = 0;
      doc[n++] = '[';
      doc[n++] = '"';
      memset(doc + n, 'A', 420);
      memcpy(doc + n + at, specials[sp], sl);
      n += 420;
      doc[n++] = '"';
      doc[n++] = ']';
      /* portable, AVX2, AVX-512 (where the CPU has them), the document at
       * several offsets of a cache line and ending where its allocation ends */
      const size_t offs[4] = {0, 1, 17, 63};
      for (size_t o = 0; o < 4; o++) {
        char *buf = malloc(offs[o] + n);
        assert_non_null(buf);
        memcpy(buf + offs[o], doc, n);
        eldr_js_span r[3];
        eldr_diag d[3];
        int rc[3];
        const eldr_cpu_level lv[3] = {ELDR_CPU_PORTABLE, ELDR_CPU_AVX2, ELDR_CPU_AVX512};
        for (int simd = 0; simd < 3; simd++) {
          eldr_cpu_set(eldr_test_level(lv[simd]));
          d[simd].msg[0] = '\0';
          r[simd] = (eldr_js_span){0, 0, ELDR_JS_NONE};
          rc[simd] = eldr_js_scan(buf + offs[o], n, NULL, 0, NULL, &r[simd], &d[simd]);
        }
        eldr_cpu_set(eldr_cpu_allowed());
        free(buf);
        for (int k = 1; k < 3; k++) {
          assert_int_equal(rc[0], rc[k]);
          assert_string_equal(d[0].msg, d[k].msg);
          if (!rc[0]) { /* field by field: the struct's padding bytes are unspecified */
            assert_int_equal(r[0].off, r[k].off);
            assert_int_equal(r[0].len, r[k].len);
            assert_int_equal(r[0].type, r[k].type);
          }
        }
      }
    }
}

/* A NUL byte anywhere in a document makes the scanner refuse it (the
 * router's readers rely on it: a body with NUL goes to jansson, which
 * decides), in a string long enough for the vector loops as well. */
static void test_nul_anywhere_refused(void **state) {
  (void)state;
  char big[400];
  memset(big, 'A', sizeof big);
  char doc[1024];
  int n = snprintf(doc, sizeof doc,
                   "{\"a\": [1, -2.5e3, true, false, null, \"x\\\"y\"], \"b\": {\"c\": \"%.*s\"}, \"d\": 7}",
                   (int)sizeof big, big);
  assert_true(n > 0 && (size_t)n < sizeof doc);
  assert_int_equal(eldr_js_scan(doc, (size_t)n, NULL, 0, NULL, NULL, NULL), 0);
  for (int i = 0; i <= n; i++) { /* at i, and appended */
    char t[1024];
    memcpy(t, doc, (size_t)n);
    size_t len = (size_t)n;
    if (i < n) t[i] = 0;
    else t[len++] = 0;
    if (eldr_js_scan(t, len, NULL, 0, NULL, NULL, NULL) == 0) fail_msg("NUL at %d accepted", i);
  }
}

/* An object written again: the members not dropped as they lie (spacing,
 * repeats, escapes kept), then the extras; the root object found past
 * whitespace; the bound holds. */
static void test_cut(void **state) {
  (void)state;
  const char *doc = " \n{\"a\": 1, \"drop\":[1,2], \"b\" : \"x\\u0041\", \"drop\": null, \"a\":2}\t";
  eldr_js_span root;
  assert_int_equal(eldr_js_root_object(doc, strlen(doc), &root), 0);
  assert_int_equal(root.off, 2);
  assert_int_equal(root.len, strlen(doc) - 3);
  assert_int_equal(eldr_js_root_object(" [1] ", 5, &root), -1);
  assert_int_equal(eldr_js_root_object(" { ", 3, &root), -1);
  static const char *const drop[] = {"drop", NULL};
  const eldr_js_piece extra[3] = {{"\"k\":", 4, "true", 4}, {NULL, 0, NULL, 0}, {"\"n\":null", 8, NULL, 0}};
  char out[128];
  assert_true(eldr_js_cut_max(root, extra, 3) <= sizeof out);
  size_t n = eldr_js_cut(doc, root, drop, extra, 3, out);
  assert_true(n <= eldr_js_cut_max(root, extra, 3));
  const char want[] = "{\"a\": 1,\"b\" : \"x\\u0041\",\"a\":2,\"k\":true,\"n\":null}";
  assert_int_equal(n, sizeof want - 1);
  assert_memory_equal(out, want, n);
  /* every member dropped, no extras: an empty object */
  const char *one = "{\"drop\":1}";
  assert_int_equal(eldr_js_root_object(one, strlen(one), &root), 0);
  n = eldr_js_cut(one, root, drop, NULL, 0, out);
  assert_int_equal(n, 2);
  assert_memory_equal(out, "{}", 2);
  /* an empty object and extras only */
  assert_int_equal(eldr_js_root_object("{}", 2, &root), 0);
  n = eldr_js_cut("{}", root, NULL, extra, 1, out);
  assert_int_equal(n, 10);
  assert_memory_equal(out, "{\"k\":true}", 10);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paths),
      cmocka_unit_test(test_repeated_and_escaped_keys),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_rejects_as_jansson),
      cmocka_unit_test(test_elements),
      cmocka_unit_test(test_long_strings_simd),
      cmocka_unit_test(test_nul_anywhere_refused),
      cmocka_unit_test(test_cut),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
