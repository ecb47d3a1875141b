/* test_serve_layouts.c — every routed_experts layout vLLM ships, through the
 * real router over loopback: prefill replies from tests/fixtures/vllm
 * (written from vLLM's source, served verbatim by the fixture worker) and
 * from the emulated worker (`eldr worker --routed-experts-layout`, in
 * process); every decision must be locality, not the load fallback, and
 * every rejected reply is counted by reason. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/reply_experts.h"
#include "eldr/serve.h"
#include "eldr/tracegen.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "support/proc.h"

#define LOCALITY "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"
#define LOAD "eldr_requests_total{policy=\"eldr\",decision=\"load\",outcome=\"ok\"}"

/* The rig's router: policy eldr on artifact art. */
static void eldr_cfg(sf_rig *g, const char *art) {
  g->c.header_timeout_s = 5;
  g->c.policy = ELDR_POLICY_ELDR;
  g->c.artifact = strdup(art);
}

static char *fixture(const char *name) { return eldr_test_vllm_fixture(name); }

static int is_chat(const char *reply) {
  json_t *j = json_loads(reply, 0, NULL);
  assert_non_null(j);
  int chat = !strcmp(json_string_value(json_object_get(j, "object")), "chat.completion");
  json_decref(j);
  return chat;
}

/* A small chat or completions request, answered 200. */
static void post_api(int port, int chat) {
  sf_post_ok(port, chat ? "/v1/chat/completions" : "/v1/completions",
             chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"a b c d\"}],\"max_tokens\":4}"
                  : "{\"prompt\":\"a b c d e\",\"max_tokens\":4}",
             NULL, NULL);
}

/* Each fixture reply as the prefill's: a locality decision, nothing rejected. */
static void test_fixture_layouts(void **st) {
  (void)st;
  static const char *const files[] = {
      "npy_u1_completions_prefill.json", "npy_u2_chat_decode.json",          "npy_i2_completions_decode.json",
      "npy_i8_completions_decode.json",  "npy_i4_chat_decode.json",          "npy_u1_completions_n2.json",
      "v021_lists_chat.json",            "v021_lists_completions_n2.json",   "pr38939_lists_completions.json",
      "v021_base64_int16_completions.json", "v021_base64_int16_chat_prefill.json"};
  const eldr_shape sh = {2, 8, 2}; /* the fixtures' model (README there) */
  char *art = fx_artifact(&sh, "layouts");
  sf_rig g;
  sf_start(&g, 1, NULL, 2, NULL);
  fx_worker *p = g.p[0];
  eldr_cfg(&g, art);
  sf_run(&g);
  size_t n = sizeof files / sizeof files[0];
  for (size_t i = 0; i < n; i++) {
    char *reply = fixture(files[i]);
    fx_behaviour b = fx_defaults();
    b.raw_reply = reply;
    fx_set(p, &b);
    post_api(g.r.port, is_chat(reply));
    if (rt_metric(g.r.port, LOCALITY) != (double)(i + 1)) fail_msg("%s: not a locality decision\n%s", files[i], rt_log_text(&g.r));
    fx_behaviour none = fx_defaults();
    fx_set(p, &none);
    free(reply);
  }
  assert_true(rt_metric(g.r.port, LOAD) <= 0);
  for (int k = 1; k < ELDR_RE__N; k++) {
    char series[160];
    snprintf(series, sizeof series, "eldr_routed_experts_rejected_total{reason=\"%s\"}",
             eldr_re_reason_name((eldr_re_reason)k));
    assert_int_equal(rt_metric(g.r.port, series), 0);
  }
  /* nonsense is rejected, counted by reason, and the request still served */
  struct {
    const char *file, *reason;
    int id;
  } bad[] = {{"v021_lists_chat.json", "negative_id", -1},
             {"v021_lists_chat.json", "id_out_of_range", 8},
             {"pr38939_lists_completions.json", "id_out_of_range", 99}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *reply = fixture(bad[i].file);
    json_t *j = json_loads(reply, 0, NULL);
    json_t *rows = json_object_get(j, "prompt_routed_experts");
    if (!rows) rows = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "routed_experts");
    json_t *row = json_array_get(json_array_get(rows, 0), 0);
    assert_int_equal(json_array_set_new(row, 0, json_integer(bad[i].id)), 0);
    char *s = json_dumps(j, JSON_COMPACT);
    fx_behaviour b = fx_defaults();
    b.raw_reply = s;
    fx_set(p, &b);
    char series[160];
    snprintf(series, sizeof series, "eldr_routed_experts_rejected_total{reason=\"%s\"}", bad[i].reason);
    double before = rt_metric(g.r.port, series);
    post_api(g.r.port, is_chat(reply));
    assert_int_equal(rt_metric(g.r.port, series), before + 1);
    fx_behaviour none = fx_defaults();
    fx_set(p, &none);
    free(s);
    json_decref(j);
    free(reply);
  }
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"malformed\"}"), 3);
  assert_int_equal(rt_metric(g.r.port, LOCALITY), (double)n);
  sf_stop(&g);
  /* an artifact of another shape: shape_mismatch, counted as such */
  const eldr_shape other = {3, 8, 2};
  char *art3 = fx_artifact(&other, "layouts3");
  sf_config(&g);
  eldr_cfg(&g, art3);
  sf_run(&g);
  char *reply = fixture("v021_base64_int16_completions.json");
  fx_behaviour b = fx_defaults();
  b.raw_reply = reply;
  fx_set(p, &b);
  post_api(g.r.port, 0);
  assert_int_equal(rt_metric(g.r.port, "eldr_routed_experts_rejected_total{reason=\"shape_mismatch\"}"), 1);
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"shape_mismatch\"}"), 1);
  sf_free(&g);
  free(reply);
  unlink(art);
  unlink(art3);
  free(art);
  free(art3);
}

/* The emulated worker in each --routed-experts-layout as the prefill. */
static void test_emulated_layouts(void **st) {
  (void)st;
  const eldr_re_layout lays[] = {ELDR_RE_LAYOUT_NPY, ELDR_RE_LAYOUT_V021_LISTS, ELDR_RE_LAYOUT_V021_BASE64,
                                 ELDR_RE_LAYOUT_LISTS};
  eldr_worker_config wc;
  eldr_worker_config_default(&wc);
  eldr_shape sh;
  assert_int_equal(eldr_tracegen_model_shape(wc.model, &sh, NULL, 0, NULL), 0);
  char *art = fx_artifact(&sh, "emulayouts");
  eldr_worker_config dc;
  eldr_worker_config_default(&dc);
  dc.time_scale = 0.01;
  for (size_t li = 0; li < 4; li++) {
    eldr_worker_config pc = dc;
    pc.routed_experts_layout = lays[li];
    sf_rig g;
    sf_start_engines(&g, 1, &pc, 2, &dc);
    eldr_cfg(&g, art);
    sf_run(&g);
    for (int chat = 0; chat < 2; chat++) post_api(g.r.port, chat);
    if (rt_metric(g.r.port, LOCALITY) != 2)
      fail_msg("%s: %g locality decisions of 2\n%s", eldr_re_layout_name(lays[li]), rt_metric(g.r.port, LOCALITY),
               rt_log_text(&g.r));
    sf_free(&g);
  }
  unlink(art);
  free(art);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fixture_layouts),
      cmocka_unit_test(test_emulated_layouts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
