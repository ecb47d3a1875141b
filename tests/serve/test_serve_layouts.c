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
#include "support/proc.h"
#include "worker/wtest.h"

#define LOCALITY "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"
#define LOAD "eldr_requests_total{policy=\"eldr\",decision=\"load\",outcome=\"ok\"}"

static void eldr_cfg(eldr_serve_config *c, const char *art) {
  eldr_serve_config_default(c);
  c->health_interval_s = 0;
  c->header_timeout_s = 5;
  c->policy = ELDR_POLICY_ELDR;
  c->artifact = strdup(art);
}

static char *fixture(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/fixtures/vllm/%s", ELDR_SOURCE_DIR, name);
  size_t n;
  char *s = eldr_test_slurp(path, &n);
  if (!s) fail_msg("cannot read %s", path);
  return s;
}

static int is_chat(const char *reply) {
  json_t *j = json_loads(reply, 0, NULL);
  assert_non_null(j);
  int chat = !strcmp(json_string_value(json_object_get(j, "object")), "chat.completion");
  json_decref(j);
  return chat;
}

static void post_ok(int port, int chat) {
  tc_resp r;
  const char *body = chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"a b c d\"}],\"max_tokens\":4}"
                          : "{\"prompt\":\"a b c d e\",\"max_tokens\":4}";
  assert_int_equal(tc_post(port, chat ? "/v1/chat/completions" : "/v1/completions", body, NULL, &r), 0);
  if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
  tc_free(&r);
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
  fx_worker *p = fx_start(NULL), *d0 = fx_start(NULL), *d1 = fx_start(NULL);
  eldr_serve_config c;
  eldr_cfg(&c, art);
  assert_int_equal(eldr_serve_config_add_worker(&c, 0, fx_url(p), NULL), 0);
  assert_int_equal(eldr_serve_config_add_worker(&c, 1, fx_url(d0), NULL), 0);
  assert_int_equal(eldr_serve_config_add_worker(&c, 1, fx_url(d1), NULL), 0);
  rt_router r;
  assert_int_equal(rt_start(&r, &c), 0);
  size_t n = sizeof files / sizeof files[0];
  for (size_t i = 0; i < n; i++) {
    char *reply = fixture(files[i]);
    fx_behaviour b = fx_defaults();
    b.raw_reply = reply;
    fx_set(p, &b);
    post_ok(r.port, is_chat(reply));
    if (rt_metric(r.port, LOCALITY) != (double)(i + 1)) fail_msg("%s: not a locality decision\n%s", files[i], r.log);
    fx_behaviour none = fx_defaults();
    fx_set(p, &none);
    free(reply);
  }
  assert_true(rt_metric(r.port, LOAD) <= 0);
  for (int k = 1; k < ELDR_RE__N; k++) {
    char series[160];
    snprintf(series, sizeof series, "eldr_routed_experts_rejected_total{reason=\"%s\"}",
             eldr_re_reason_name((eldr_re_reason)k));
    assert_int_equal(rt_metric(r.port, series), 0);
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
    double before = rt_metric(r.port, series);
    post_ok(r.port, is_chat(reply));
    assert_int_equal(rt_metric(r.port, series), before + 1);
    fx_behaviour none = fx_defaults();
    fx_set(p, &none);
    free(s);
    json_decref(j);
    free(reply);
  }
  assert_int_equal(rt_metric(r.port, "eldr_fallback_total{reason=\"malformed\"}"), 3);
  assert_int_equal(rt_metric(r.port, LOCALITY), (double)n);
  rt_stop(&r);
  eldr_serve_config_free(&c);
  /* an artifact of another shape: shape_mismatch, counted as such */
  const eldr_shape other = {3, 8, 2};
  char *art3 = fx_artifact(&other, "layouts3");
  eldr_cfg(&c, art3);
  assert_int_equal(eldr_serve_config_add_worker(&c, 0, fx_url(p), NULL), 0);
  assert_int_equal(eldr_serve_config_add_worker(&c, 1, fx_url(d0), NULL), 0);
  assert_int_equal(rt_start(&r, &c), 0);
  char *reply = fixture("v021_base64_int16_completions.json");
  fx_behaviour b = fx_defaults();
  b.raw_reply = reply;
  fx_set(p, &b);
  post_ok(r.port, 0);
  assert_int_equal(rt_metric(r.port, "eldr_routed_experts_rejected_total{reason=\"shape_mismatch\"}"), 1);
  assert_int_equal(rt_metric(r.port, "eldr_fallback_total{reason=\"shape_mismatch\"}"), 1);
  rt_stop(&r);
  eldr_serve_config_free(&c);
  free(reply);
  fx_free(p);
  fx_free(d0);
  fx_free(d1);
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
  wt_worker dec[2];
  eldr_diag d = {{0}};
  for (int i = 0; i < 2; i++) {
    eldr_worker_config dc;
    eldr_worker_config_default(&dc);
    dc.role = ELDR_WORKER_DECODE;
    dc.time_scale = 0.01;
    dc.port = 0;
    if (wt_worker_start(&dec[i], &dc, &d) < 0) fail_msg("decode worker: %s", d.msg);
  }
  for (size_t li = 0; li < 4; li++) {
    eldr_worker_config pc;
    eldr_worker_config_default(&pc);
    pc.role = ELDR_WORKER_PREFILL;
    pc.time_scale = 0.01;
    pc.port = 0;
    pc.routed_experts_layout = lays[li];
    wt_worker pw;
    if (wt_worker_start(&pw, &pc, &d) < 0) fail_msg("prefill worker: %s", d.msg);
    eldr_serve_config c;
    eldr_cfg(&c, art);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", pw.port);
    assert_int_equal(eldr_serve_config_add_worker(&c, 0, url, NULL), 0);
    for (int i = 0; i < 2; i++) {
      snprintf(url, sizeof url, "http://127.0.0.1:%d", dec[i].port);
      assert_int_equal(eldr_serve_config_add_worker(&c, 1, url, NULL), 0);
    }
    rt_router r;
    assert_int_equal(rt_start(&r, &c), 0);
    for (int chat = 0; chat < 2; chat++) post_ok(r.port, chat);
    if (rt_metric(r.port, LOCALITY) != 2)
      fail_msg("%s: %g locality decisions of 2\n%s", eldr_re_layout_name(lays[li]), rt_metric(r.port, LOCALITY),
               r.log);
    rt_stop(&r);
    eldr_serve_config_free(&c);
    wt_worker_stop(&pw);
  }
  for (int i = 0; i < 2; i++) wt_worker_stop(&dec[i]);
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
