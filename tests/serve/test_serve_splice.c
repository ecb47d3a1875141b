/* test_serve_splice.c — the decode reply as the engine sent it, through the
 * real router over loopback: with the routed_experts splice on (the
 * default) and prompt_logprobs asked, a vLLM-shaped decode reply
 * (tests/fixtures/vllm, pretty-printed, with logprobs such as -0.1 and
 * -1.2345678e-05) reaches the client with every byte outside the values the
 * router edits (choices[0].routed_experts, prompt_logprobs, usage)
 * unchanged, and the prefill's prompt rows spliced into the decoder's
 * blob in the decoder's dtype. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/jscan.h"
#include "eldr/reply_experts.h"
#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

static char *fixture(const char *name) { return eldr_test_vllm_fixture(name); }

/* s with the first occurrence of a replaced by b (malloc'd). */
static char *replace(const char *s, const char *a, const char *b) {
  const char *at = strstr(s, a);
  if (!at) fail_msg("'%s' not in the fixture", a);
  size_t n = strlen(s) - strlen(a) + strlen(b);
  char *o = malloc(n + 1);
  size_t h = (size_t)(at - s);
  memcpy(o, s, h);
  strcpy(o + h, b);
  strcat(o, at + strlen(a));
  return o;
}

/* The spans of usage, choices[0].routed_experts and choices[0].prompt_logprobs. */
static void spans(const char *doc, size_t n, eldr_js_span f[3]) {
  static const eldr_js_path p[3] = {{{"usage", NULL}}, {{"choices", "#0", "routed_experts", NULL}},
                                    {{"choices", "#0", "prompt_logprobs", NULL}}};
  if (eldr_js_scan(doc, n, p, 3, f, NULL, NULL)) fail_msg("not JSON: %.200s", doc);
}

static void test_bytes_kept(void **st) {
  (void)st;
  char *prefill = fixture("npy_u1_completions_prefill.json"); /* 5 prompt rows, |u1 */
  char *prefill2 = replace(prefill, "\"prompt_logprobs\": null", "\"prompt_logprobs\": [null, {\"7\": {\"logprob\": -2.5e-07, \"rank\": 1}}]");
  char *dec0 = fixture("npy_i2_completions_decode.json"); /* 8 rows, <i2 */
  char *dec = replace(dec0, "\"logprobs\": null",
                      "\"logprobs\": {\"text_offset\": [0, 4], \"token_logprobs\": [-0.1, -1.2345678e-05],"
                      "  \"tokens\": [\" tok\", \" tok\"], \"top_logprobs\": [{\" tok\": -0.1}, {\" tok\": 1E+2}]}");
  fx_behaviour pb = fx_defaults(), db = fx_defaults();
  pb.raw_reply = prefill2;
  db.raw_reply = dec;
  sf_rig g;
  sf_start(&g, 1, &pb, 1, &db);
  sf_run(&g);
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a b c d e\",\"max_tokens\":4,\"prompt_logprobs\":1}",
                           NULL, &r),
                   0);
  if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
  if (!strstr(r.body, "-0.1, -1.2345678e-05")) fail_msg("client got:\n%s\n%s", r.body, rt_log_text(&g.r));
  assert_non_null(strstr(r.body, "{\" tok\": 1E+2}"));
  assert_non_null(strstr(r.body, "-2.5e-07")); /* the prefill's prompt_logprobs, its bytes */
  /* every byte outside the three edited values is the decoder's */
  eldr_js_span a[3], b[3];
  spans(dec, strlen(dec), a);
  spans(r.body, r.body_len, b);
  for (int i = 0; i < 3; i++) assert_int_not_equal(a[i].type, ELDR_JS_NONE);
  /* the edited values in document order */
  int ord[3] = {0, 1, 2};
  for (int i = 0; i < 3; i++)
    for (int j = i + 1; j < 3; j++)
      if (a[ord[j]].off < a[ord[i]].off) {
        int t = ord[i];
        ord[i] = ord[j];
        ord[j] = t;
      }
  size_t ia = 0, ib = 0;
  for (int k = 0; k <= 3; k++) {
    size_t ea = k < 3 ? a[ord[k]].off : strlen(dec), eb = k < 3 ? b[ord[k]].off : r.body_len;
    if (ea - ia != eb - ib || memcmp(dec + ia, r.body + ib, ea - ia))
      fail_msg("bytes before edit %d differ:\n--- decoder\n%.*s\n--- client\n%.*s", k, (int)(ea - ia), dec + ia,
               (int)(eb - ib), r.body + ib);
    if (k < 3) {
      ia = a[ord[k]].off + a[ord[k]].len;
      ib = b[ord[k]].off + b[ord[k]].len;
    }
  }
  /* the rows: the prefill's 5 prompt rows, then the decoder's; its dtype kept */
  eldr_re_opts o = {ELDR_RE_COMPLETIONS, 2, 2, 8, NULL, NULL, NULL, NULL, 0, NULL};
  eldr_reply_experts rx, dx;
  assert_int_equal(eldr_reply_experts_scan(r.body, r.body_len, &o, &rx, NULL, NULL), 0);
  assert_int_equal(eldr_reply_experts_scan(dec, strlen(dec), &o, &dx, NULL, NULL), 0);
  assert_int_equal(rx.choices[0].prompt.dtype, ELDR_SEL_I16LE);
  assert_int_equal(rx.choices[0].prompt.rows + rx.choices[0].generated.rows, 8);
  for (size_t i = 0; i < 5 * 2 * 2; i++) { /* the fixture's id rule: (3t + 5l + k) mod 8 */
    size_t t = i / 4, l = i / 2 % 2, k = i % 2;
    assert_int_equal(eldr_sel_load(rx.choices[0].prompt.data, ELDR_SEL_I16LE, i), (int64_t)((3 * t + 5 * l + k) % 8));
  }
  assert_memory_equal(rx.choices[0].generated.data, dx.choices[0].generated.data, 3 * 2 * 2 * 2);
  eldr_reply_experts_free(&rx);
  eldr_reply_experts_free(&dx);
  assert_int_equal(rt_metric(g.r.port, "eldr_routed_experts_spliced_total"), 1);
  tc_free(&r);
  sf_free(&g);
  free(prefill);
  free(prefill2);
  free(dec0);
  free(dec);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bytes_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
