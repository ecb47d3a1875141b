/* test_reply.c — the one reader of workers' replies (eldr/reply.h): a
 * prefill reply's fields by the tree and the scanner, its buffer adopted;
 * a decode reply's generated rows counted; a recorded reply's prompt rows
 * over the model's MoE layers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "eldr/reply.h"
#include "eldr/routed_experts.h"

static void test_prefill_reply(void **st) {
  (void)st;
  const char *b = "{\"choices\":[{\"index\":0,\"routed_experts\":\"QUJD\"}],\"usage\":{\"prompt_tokens\":40,"
                  "\"prompt_tokens_details\":{\"cached_tokens\":32}},\"kv_transfer_params\":{\"a\":1}}";
  eldr_reply_prefill p;
  assert_int_equal(eldr_reply_prefill_parse(b, strlen(b), &p, NULL), 0);
  assert_non_null(p.kv_transfer_params);
  assert_int_equal(p.routed_experts_len, 4);
  assert_memory_equal(p.routed_experts, "QUJD", 4);
  assert_int_equal(p.prompt_tokens, 40);
  assert_int_equal(p.cached_tokens, 32);
  eldr_reply_prefill_free(&p);
  const char *b2 = "{\"choices\":[{\"routed_experts\":null}],\"usage\":{\"prompt_tokens\":\"x\"},\"kv_transfer_params\":3}";
  assert_int_equal(eldr_reply_prefill_parse(b2, strlen(b2), &p, NULL), 0);
  assert_null(p.kv_transfer_params);
  assert_null(p.routed_experts);
  assert_int_equal(p.prompt_tokens, -1);
  assert_int_equal(p.cached_tokens, 0);
  eldr_reply_prefill_free(&p);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_reply_prefill_parse("nope", 4, &p, &d), ELDR_EPARSE);
  assert_int_equal(eldr_reply_prefill_parse("[]", 2, &p, &d), ELDR_EPARSE);
}

/* The reply's own buffer adopted: no copy, the buffers exchanged, the same
 * fields as a read; the tree path (need_tree) leaves the buffer alone. */
static void test_prefill_reply_adopt(void **st) {
  (void)st;
  const char *b = "{\"choices\":[{\"index\":0,\"routed_experts\":\"QUJD\"}],\"usage\":{\"prompt_tokens\":40,"
                  "\"prompt_tokens_details\":{\"cached_tokens\":32}},\"kv_transfer_params\":{\"a\":1}}";
  const size_t n = strlen(b);
  eldr_reply_prefill p;
  memset(&p, 0, sizeof p);
  char *prev = NULL;
  for (int round = 0; round < 3; round++) {
    size_t cap = n + 1; /* too small for the kv bytes after the copy: grown */
    char *buf = malloc(cap);
    assert_non_null(buf);
    memcpy(buf, b, n + 1);
    size_t len = n;
    assert_int_equal(eldr_reply_prefill_adopt(&buf, &cap, &len, 0, &p, NULL), 0);
    assert_int_equal(len, 0); /* exchanged: the caller's buffer holds nothing */
    assert_null(p.root);
    assert_true(p.raw != buf);
    assert_ptr_equal(buf, prev); /* the previous round's buffer came back */
    assert_memory_equal(p.raw, b, n);
    assert_int_equal(p.raw_len, n);
    assert_int_equal(p.prompt_tokens, 40);
    assert_int_equal(p.cached_tokens, 32);
    assert_int_equal(p.routed_experts_len, 4);
    assert_memory_equal(p.routed_experts, "QUJD", 4);
    assert_int_equal(p.kv_len, 7);
    assert_memory_equal(p.bytes, "{\"a\":1}", 7);
    free(buf);
    prev = p.raw;
    if (round == 1) { /* a big enough buffer is adopted as it is */
      char *big = malloc(4 * n);
      size_t bc = 4 * n;
      memcpy(big, b, n + 1);
      char *was = big;
      size_t bl = n;
      assert_int_equal(eldr_reply_prefill_adopt(&big, &bc, &bl, 0, &p, NULL), 0);
      assert_int_equal(bl, 0);
      assert_ptr_equal(p.raw, was);
      assert_ptr_equal(big, prev);
      free(big);
      prev = p.raw;
    }
  }
  /* need_tree: parsed, and the caller's buffer adopted as the bytes (the
   * decode reply's edits insert the prefill's bytes, never re-serialised) */
  char *buf = malloc(n + 1);
  size_t cap = n + 1;
  memcpy(buf, b, n + 1);
  char *was = buf;
  size_t len = n;
  assert_int_equal(eldr_reply_prefill_adopt(&buf, &cap, &len, 1, &p, NULL), 0);
  assert_null(buf);
  assert_int_equal(len, 0);
  assert_ptr_equal(p.raw, was);
  assert_int_equal(p.raw_len, n);
  assert_non_null(p.root);
  assert_int_equal(p.prompt_tokens, 40);
  eldr_reply_prefill_free(&p);
}

/* A decode reply's text: npy rows sel[0, n) (P prompt, the rest generated);
 * usage with prompt_tokens P and completion_tokens G when usage. */
static char *decode_text(const uint16_t *sel, size_t n, const eldr_shape *sh, int usage, size_t P, size_t G) {
  char *b64 = NULL;
  size_t blen = 0;
  assert_int_equal(eldr_routed_experts_encode(sel, n, sh, ELDR_SEL_U8, &b64, &blen), 0);
  json_t *r = usage ? json_pack("{s:s,s:[{s:i,s:s}],s:{s:I,s:I}}", "object", "text_completion", "choices", "index",
                                0, "routed_experts", b64, "usage", "prompt_tokens", (json_int_t)P,
                                "completion_tokens", (json_int_t)G)
                    : json_pack("{s:s,s:[{s:i,s:s}]}", "object", "text_completion", "choices", "index", 0,
                                "routed_experts", b64);
  free(b64);
  assert_non_null(r);
  char *t = json_dumps(r, JSON_COMPACT);
  json_decref(r);
  assert_non_null(t);
  return t;
}

/* The one decode-reply reader of the watch and the recorder: the generated
 * rows (the usage's split; without usage, the rows past the prefill's
 * prompt_tokens) counted; -1 for no routed_experts, an unknown split, or
 * counts no trace holds; completion_tokens read either way. */
static void test_decode_reply_counts(void **st) {
  (void)st;
  const eldr_shape sh = {3, 16, 2};
  enum { P = 20, G = 6, R = P + G - 1 };
  uint16_t sel[R * 3 * 2];
  for (size_t i = 0; i < R * 6; i += 2) {
    sel[i] = (uint16_t)((i * 7) % 16);
    sel[i + 1] = (uint16_t)((sel[i] + 1 + i % 5) % 16);
  }
  uint32_t expect[3 * 16], got[3 * 16];
  memset(expect, 0, sizeof expect);
  assert_int_equal(eldr_counts_accumulate(&sh, sel + P * 6, ELDR_SEL_U16, G - 1, expect, NULL), 0);
  char *t = decode_text(sel, R, &sh, 1, P, G);
  int64_t ct = -7;
  assert_int_equal(eldr_reply_decode_counts(t, strlen(t), ELDR_RE_COMPLETIONS, &sh, NULL, -1, got, &ct), G - 1);
  assert_memory_equal(got, expect, sizeof expect);
  assert_int_equal(ct, G);
  /* a chat reader refuses a text_completion reply */
  assert_int_equal(eldr_reply_decode_counts(t, strlen(t), ELDR_RE_CHAT, &sh, NULL, P, got, NULL), -1);
  free(t);
  /* no usage: the prefill's prompt_tokens split the rows; unknown: -1 */
  t = decode_text(sel, R, &sh, 0, 0, 0);
  memset(got, 0xff, sizeof got);
  ct = -7;
  assert_int_equal(eldr_reply_decode_counts(t, strlen(t), ELDR_RE_COMPLETIONS, &sh, NULL, P, got, &ct), G - 1);
  assert_memory_equal(got, expect, sizeof expect);
  assert_int_equal(ct, -7);
  assert_int_equal(eldr_reply_decode_counts(t, strlen(t), ELDR_RE_COMPLETIONS, &sh, NULL, -1, got, NULL), -1);
  free(t);
  /* one expert twice in layer 0 of every generated row: counts above the
   * rows, which no trace holds (eldr_counts_rows_check) */
  uint16_t rep[R * 3 * 2];
  memcpy(rep, sel, sizeof rep);
  for (size_t t0 = P; t0 < R; t0++) rep[t0 * 6] = rep[t0 * 6 + 1] = 3;
  t = decode_text(rep, R, &sh, 1, P, G);
  assert_int_equal(eldr_reply_decode_counts(t, strlen(t), ELDR_RE_COMPLETIONS, &sh, NULL, P, got, NULL), -1);
  free(t);
  /* no routed_experts: -1, the usage still read */
  static const char none[] = "{\"object\":\"text_completion\",\"choices\":[{\"index\":0}],\"usage\":{\"completion_tokens\":9}}";
  ct = -7;
  assert_int_equal(eldr_reply_decode_counts(none, sizeof none - 1, ELDR_RE_COMPLETIONS, &sh, NULL, P, got, &ct), -1);
  assert_int_equal(ct, 9);
}


/* The recorder's prompt rows: the first choice's prompt view over the MoE
 * layers, its shape (layers, E, top_k) and layer ids; -1 (nothing owned)
 * for no tree, no experts, no prompt rows or a top_k above E. */
static void test_prompt_rows(void **st) {
  (void)st;
  const eldr_shape sh = {2, 8, 2};
  enum { P = 5 };
  uint16_t sel[P * 2 * 2];
  for (size_t i = 0; i < P * 4; i += 2) sel[i] = (uint16_t)(i % 8), sel[i + 1] = (uint16_t)((i + 3) % 8);
  char *b64 = NULL;
  assert_int_equal(eldr_routed_experts_encode(sel, P, &sh, ELDR_SEL_U8, &b64, NULL), 0);
  /* the whole sequence, one generated token: every row the prompt's */
  json_t *root = json_pack("{s:s,s:[{s:i,s:s}],s:{s:i,s:i}}", "object", "text_completion", "choices", "index", 0,
                           "routed_experts", b64, "usage", "prompt_tokens", P, "completion_tokens", 1);
  assert_non_null(root);
  eldr_reply_experts rex;
  eldr_re_view v;
  eldr_shape out;
  uint32_t ids[ELDR_MAX_LAYERS];
  const uint32_t art_ids[2] = {0, 1};
  for (int art = 0; art < 2; art++) {
    assert_int_equal(eldr_reply_prompt_rows(root, ELDR_RE_COMPLETIONS, 8, art ? &sh : NULL, art ? art_ids : NULL,
                                            &rex, &v, &out, ids),
                     0);
    assert_int_equal(v.rows, P);
    assert_int_equal(v.layers, 2);
    assert_int_equal(v.top_k, 2);
    assert_int_equal(out.num_layers, 2);
    assert_int_equal(out.num_experts, 8);
    assert_int_equal(out.top_k, 2);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    uint32_t got[16] = {0}, want[16] = {0};
    assert_int_equal(eldr_counts_accumulate(&out, v.data, v.dtype, v.rows, got, NULL), 0);
    assert_int_equal(eldr_counts_accumulate(&sh, sel, ELDR_SEL_U16, P, want, NULL), 0);
    assert_memory_equal(got, want, sizeof want);
    eldr_reply_experts_free(&rex);
  }
  /* top_k 2 above 1 expert; no experts; no tree; a chat reader */
  assert_int_equal(eldr_reply_prompt_rows(root, ELDR_RE_COMPLETIONS, 1, NULL, NULL, &rex, &v, &out, ids), -1);
  assert_null(rex.choices);
  assert_int_equal(eldr_reply_prompt_rows(root, ELDR_RE_COMPLETIONS, 0, NULL, NULL, &rex, &v, &out, ids), -1);
  assert_int_equal(eldr_reply_prompt_rows(NULL, ELDR_RE_COMPLETIONS, 8, NULL, NULL, &rex, &v, &out, ids), -1);
  assert_int_equal(eldr_reply_prompt_rows(root, ELDR_RE_CHAT, 8, NULL, NULL, &rex, &v, &out, ids), -1);
  json_decref(root);
  /* no routed_experts: no rows */
  root = json_pack("{s:s,s:[{s:i}]}", "object", "text_completion", "choices", "index", 0);
  assert_int_equal(eldr_reply_prompt_rows(root, ELDR_RE_COMPLETIONS, 8, NULL, NULL, &rex, &v, &out, ids), -1);
  json_decref(root);
  free(b64);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_reply),
      cmocka_unit_test(test_prefill_reply_adopt),
      cmocka_unit_test(test_decode_reply_counts),
      cmocka_unit_test(test_prompt_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
