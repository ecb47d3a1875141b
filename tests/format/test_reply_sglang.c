/* test_reply_sglang.c — SGLang's routed_experts form (eldr/reply_sglang.h)
 * in a reply: rows emitted over the model's hidden layers (dense layers 0,
 * as SGLang's capturer leaves them) read back from "sglext" of an
 * OpenAI-format reply and from meta_info of a /generate reply, the rows
 * taken from usage.prompt_tokens, a string with JSON escapes, the counts;
 * and every way a reply can be wrong, named (a hostile prompt_tokens with a
 * short payload refused before anything is allocated for it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/reply_sglang.h"

enum { L = 3, E = 16, K = 2, H = 7, ROWS = 5 };
static const uint32_t IDS[L] = {1, 3, 6}; /* MoE layers among 7 hidden ones */

static void rows_of(uint16_t *sel) {
  for (size_t i = 0; i < (size_t)ROWS * L * K; i++) sel[i] = (uint16_t)((i * 7 + 3) % E);
}

/* a reply with fmt's %s the base64 text */
static char *reply(const char *fmt, const char *b64) {
  size_t n = strlen(fmt) + strlen(b64) + 1;
  char *r = malloc(n);
  snprintf(r, n, fmt, b64);
  return r;
}

static void check_read(const char *doc, const uint16_t *sel) {
  eldr_sglang_opts o = {0, L, IDS, K, E, NULL};
  uint8_t *buf = NULL;
  size_t cap = 0, rows = 0;
  uint32_t hidden = 0, counts[L * E] = {0}, want[L * E] = {0};
  eldr_re_reason why;
  eldr_diag d = {{0}};
  int rc = eldr_sglang_reply_experts(doc, strlen(doc), &o, &buf, &cap, &hidden, &rows, counts, &why, &d);
  if (rc) fail_msg("%d %s", rc, d.msg);
  assert_int_equal(rows, ROWS);
  assert_int_equal(hidden, H);
  for (size_t i = 0; i < (size_t)ROWS * L * K; i++) {
    int32_t v = (int32_t)((uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 | (uint32_t)buf[4 * i + 2] << 16 |
                          (uint32_t)buf[4 * i + 3] << 24);
    assert_int_equal(v, sel[i]);
    want[(i / K) % L * E + sel[i]]++;
  }
  assert_memory_equal(counts, want, sizeof want);
  free(buf);
}

static void test_forms(void **st) {
  (void)st;
  uint16_t sel[ROWS * L * K];
  rows_of(sel);
  eldr_shape sh = {L, E, K};
  char *b64 = NULL;
  assert_int_equal(eldr_sglang_experts_emit(sel, ROWS, &sh, IDS, H, &b64, NULL), 0);
  char *a = reply("{\"id\":\"x\",\"choices\":[{\"index\":0,\"text\":\" a\",\"finish_reason\":\"length\"}],"
                  "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1},\"sglext\":{\"routed_experts\":\"%s\"}}",
                  b64);
  check_read(a, sel);
  char *g = reply("{\"text\":\" a\",\"meta_info\":{\"prompt_tokens\":5,\"routed_experts\":\"%s\"}}", b64);
  check_read(g, sel);
  /* an encoder that escapes characters ("\u0041" for 'A'), legal JSON */
  size_t bl = strlen(b64), k = 0;
  char *esc = malloc(6 * bl + 1);
  for (size_t i = 0; i < bl; i++) {
    if (b64[i] == 'A') k += (size_t)sprintf(esc + k, "\\u0041");
    else esc[k++] = b64[i];
  }
  esc[k] = 0;
  assert_true(k > bl); /* the rows chosen do give an 'A' */
  char *e = reply("{\"usage\":{\"prompt_tokens\":5},\"sglext\":{\"routed_experts\":\"%s\"}}", esc);
  check_read(e, sel);
  free(a);
  free(g);
  free(e);
  free(esc);
  free(b64);
}

static void test_errors(void **st) {
  (void)st;
  eldr_sglang_opts o = {0, L, IDS, K, E, NULL};
  struct {
    const char *doc;
    int rc;
    eldr_re_reason why;
  } cases[] = {
      {"{\"choices\":[]}", 1, ELDR_RE_OK},
      {"{\"sglext\":null}", 1, ELDR_RE_OK},
      {"{\"sglext\":{\"routed_experts\":null}}", 1, ELDR_RE_OK},
      {"[1]", ELDR_EPARSE, ELDR_RE_NOT_JSON},
      {"{\"sglext\":", ELDR_EPARSE, ELDR_RE_NOT_JSON},
      {"{\"sglext\":[1]}", ELDR_EINVAL, ELDR_RE_BAD_TYPE},
      {"{\"sglext\":{\"routed_experts\":[1,2]}}", ELDR_EINVAL, ELDR_RE_BAD_TYPE},
      {"{\"sglext\":{\"routed_experts\":\"AAAA\"}}", ELDR_EINVAL, ELDR_RE_BAD_TYPE}, /* no usage */
      {"{\"usage\":{\"prompt_tokens\":0},\"sglext\":{\"routed_experts\":\"AAAA\"}}", ELDR_EINVAL, ELDR_RE_BAD_TYPE},
      /* a hostile row count with a short payload: refused before any allocation */
      {"{\"usage\":{\"prompt_tokens\":9000000000000000000},\"sglext\":{\"routed_experts\":\"AAAAAAAA\"}}", ELDR_ERANGE,
       ELDR_RE_TOO_LARGE},
      {"{\"usage\":{\"prompt_tokens\":1000000000},\"sglext\":{\"routed_experts\":\"AAAAAAAA\"}}", ELDR_EPARSE,
       ELDR_RE_LENGTH_MISMATCH},
      {"{\"usage\":{\"prompt_tokens\":1},\"sglext\":{\"routed_experts\":\"AAAA*AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
       "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}}",
       ELDR_EPARSE, ELDR_RE_BAD_BASE64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t *buf = NULL;
    size_t cap = 0, rows;
    uint32_t hidden;
    eldr_re_reason why = ELDR_RE__N;
    eldr_diag d = {{0}};
    int rc = eldr_sglang_reply_experts(cases[i].doc, strlen(cases[i].doc), &o, &buf, &cap, &hidden, &rows, NULL, &why,
                                       &d);
    if (rc != cases[i].rc || why != cases[i].why || (rc < 0 && !d.msg[0]))
      fail_msg("case %zu: rc %d why %d '%s'", i, rc, (int)why, d.msg);
    if (!strstr(cases[i].doc, "000000000}")) assert_true(cap < 4096);
    else assert_int_equal(cap, 0); /* nothing allocated */
    free(buf);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_forms), cmocka_unit_test(test_errors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
