/* test_serve_streams.c — signatures from the traffic people send, through the
 * real router over loopback in front of emulated engines:
 *  - streamed decode replies whose last chunk carries the sequence's rows
 *    (eldr worker --routed-experts-stream final, as vLLM's
 *    /inference/v1/generate stream) are recorded with their generated
 *    counts, sampled by the live rho, and `eldr fit` on the recording
 *    measures a real rho and says rho chose;
 *  - streams without rows (vLLM's /v1/completions and chat streams) record
 *    prefill counts only: `eldr fit` refuses them with a message and a
 *    non-zero exit unless --prefill-only, and the artifact says so;
 *  - completions with echo and max_tokens 0 pass as vLLM accepts them;
 *  - /health's locality view is on after a run of locality decisions in
 *    every routed_experts layout. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/reply_experts.h"
#include "eldr/serve.h"
#include "eldr/tracegen.h"
#include "support/fixture.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

#define LOCALITY "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"

/* An artifact for the emulator's default model (qwen3-30b-a3b), 2 centroids
 * over the lower / upper half of the experts. */
static char *artifact(const char *tag) {
  eldr_worker_config wc;
  eldr_worker_config_default(&wc);
  eldr_shape s;
  assert_int_equal(eldr_tracegen_model_shape(wc.model, &s, NULL, 0, NULL), 0);
  char name[96];
  snprintf(name, sizeof name, "streams_%s", tag);
  return sf_artifact_save(sf_halves_artifact(wc.model, &s, NULL, 0, NULL), name);
}

/* n streamed completions through a router recording into dir, in front of
 * one prefill and two decode engines; the decoders stream the sequence's
 * rows on their last chunk when rows is set. Returns live-rho pairs seen. */
static double record_streams(const char *dir, int rows, int n) {
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.time_scale = 0.001;
  dc = pc;
  dc.routed_experts_decode = 1;
  dc.routed_experts_stream = rows;
  sf_rig g;
  sf_start_engines(&g, 1, &pc, 2, &dc);
  char *art = artifact(rows ? "rows" : "norows");
  assert_int_equal(eldr_test_rmtree(dir), 0);
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(art);
  g.c.record_dir = strdup(dir);
  g.c.threads = 1;
  sf_run(&g);
  for (int i = 0; i < n; i++) {
    char body[320];
    snprintf(body, sizeof body,
             "{\"prompt\":\"streamed request %d on topic %d, %d words long\",\"max_tokens\":%d,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}",
             i, i % 5, 10 + i, 4 + i % 7);
    tc_resp r;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "data: [DONE]"));
    tc_free(&r);
  }
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_record_written_total", n, 20), 0);
  double pairs = rt_metric(g.r.port, "eldr_live_rho_pairs");
  sf_free(&g);
  unlink(art);
  free(art);
  return pairs;
}

/* The record lines of dir: how many carry decode_counts. */
static int with_decode_counts(const char *dir, int *lines) {
  DIR *dd = opendir(dir);
  assert_non_null(dd);
  struct dirent *de;
  int with = 0;
  *lines = 0;
  while ((de = readdir(dd))) {
    if (!strstr(de->d_name, ".jsonl")) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    char *text = eldr_test_slurp(path, NULL);
    assert_non_null(text);
    for (char *s = text, *e; *s; s = e + 1) {
      e = strchr(s, '\n');
      assert_non_null(e);
      json_t *o = json_loadb(s, (size_t)(e - s), 0, NULL);
      assert_non_null(o);
      (*lines)++;
      json_t *dc = json_object_get(o, "decode_counts");
      if (dc && json_is_array(dc)) {
        with++;
        eldr_shape sh = {48, 128, 8};
        sf_check_counts(dc, &sh, json_integer_value(json_object_get(o, "decode_tokens")));
      }
      json_decref(o);
    }
    free(text);
  }
  closedir(dd);
  return with;
}

static int fit(const char *dir, const char *out, const char *extra, char *err, size_t cap) {
  const char *errp = "/tmp/eldr_test_streams_fit.err";
  int rc = extra ? eldr_test_eldr(NULL, errp, "fit", "--trace", dir, "--decoders", "2", "-o", out, "-q", extra, NULL)
                 : eldr_test_eldr(NULL, errp, "fit", "--trace", dir, "--decoders", "2", "-o", out, "-q", NULL);
  eldr_test_read_into(errp, err, cap);
  unlink(errp);
  return rc;
}

static eldr_artifact *load(const char *path) {
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  if (eldr_artifact_load(path, &a, &d)) fail_msg("%s: %s", path, d.msg);
  return a;
}

static void test_streamed_recording_fits(void **st) {
  (void)st;
  char dir[256], out[256], err[2048];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_streams_%d_rows", (int)getpid());
  snprintf(out, sizeof out, "/tmp/eldr_test_streams_%d_rows_fit.json", (int)getpid());
  const int n = 40;
  double pairs = record_streams(dir, 1, n);
  if (!(pairs > 0)) fail_msg("the live rho sampled no streamed pair (eldr_live_rho_pairs %g)", pairs);
  int lines;
  assert_int_equal(with_decode_counts(dir, &lines), n);
  assert_int_equal(lines, n);
  int rc = fit(dir, out, NULL, err, sizeof err);
  if (rc) fail_msg("eldr fit exited %d: %s", rc, err);
  eldr_artifact *a = load(out);
  if (!isfinite(a->fit_rho)) fail_msg("rho %g is not a measurement", a->fit_rho);
  assert_int_equal(a->fit_chosen_by, ELDR_FIT_BY_RHO);
  assert_int_equal(a->fit_decode_n, n);
  eldr_artifact_free(a);
  unlink(out);
  assert_int_equal(eldr_test_rmtree(dir), 0);
}

static void test_prefill_only_recording_refused(void **st) {
  (void)st;
  char dir[256], out[256], err[2048];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_streams_%d_norows", (int)getpid());
  snprintf(out, sizeof out, "/tmp/eldr_test_streams_%d_norows_fit.json", (int)getpid());
  const int n = 24;
  (void)record_streams(dir, 0, n);
  int lines;
  assert_int_equal(with_decode_counts(dir, &lines), 0);
  assert_int_equal(lines, n);
  unlink(out);
  int rc = fit(dir, out, NULL, err, sizeof err);
  if (rc == 0 || !strstr(err, "none of the 24 requests carries decode selections") || !strstr(err, "--prefill-only"))
    fail_msg("eldr fit on prefill-only records: exit %d, stderr '%s'", rc, err);
  assert_int_not_equal(access(out, F_OK), 0); /* nothing written */
  rc = fit(dir, out, "--prefill-only", err, sizeof err);
  if (rc) fail_msg("eldr fit --prefill-only exited %d: %s", rc, err);
  eldr_artifact *a = load(out);
  assert_true(isnan(a->fit_rho));
  assert_int_equal(a->fit_chosen_by, ELDR_FIT_BY_PREFILL_ONLY);
  assert_int_equal(a->fit_decode_n, 0);
  eldr_artifact_free(a);
  unlink(out);
  assert_int_equal(eldr_test_rmtree(dir), 0);
}

/* lm-eval's loglikelihood request: completions, echo, max_tokens 0. */
static void test_echo_max_tokens_zero(void **st) {
  (void)st;
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.time_scale = 0.001;
  dc = pc;
  sf_rig g;
  sf_start_engines(&g, 1, &pc, 1, &dc);
  sf_run(&g);
  const char *prompt = "score this continuation please";
  char body[256];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":0,\"echo\":true,\"logprobs\":1}", prompt);
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
  if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")),
                      prompt);
  json_decref(j);
  tc_free(&r);
  /* streamed: the prompt in one chunk, then [DONE] */
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":0,\"echo\":true,\"stream\":true}", prompt);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, prompt));
  assert_non_null(strstr(r.body, "data: [DONE]"));
  tc_free(&r);
  /* without echo, or on chat, max_tokens 0 is still refused before any leg */
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":0}", NULL, &r), 0);
  assert_int_equal(r.status, 400);
  tc_free(&r);
  assert_int_equal(tc_post(g.r.port, "/v1/chat/completions",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0,\"echo\":true}", NULL,
                           &r),
                   0);
  assert_int_equal(r.status, 400);
  tc_free(&r);
  sf_free(&g);
}

/* /health's locality view after a run of locality decisions, every layout. */
static void test_health_every_layout(void **st) {
  (void)st;
  const eldr_re_layout lays[] = {ELDR_RE_LAYOUT_NPY, ELDR_RE_LAYOUT_V021_LISTS, ELDR_RE_LAYOUT_V021_BASE64,
                                 ELDR_RE_LAYOUT_LISTS};
  char *art = artifact("health");
  for (size_t li = 0; li < 4; li++) {
    eldr_worker_config pc, dc;
    eldr_worker_config_default(&pc);
    pc.time_scale = 0.001;
    dc = pc;
    pc.routed_experts_layout = lays[li];
    sf_rig g;
    sf_start_engines(&g, 1, &pc, 2, &dc);
    g.c.policy = ELDR_POLICY_ELDR;
    g.c.artifact = strdup(art);
    g.c.threads = 1; /* the locality view is per loop */
    sf_run(&g);
    for (int i = 0; i < 25; i++) {
      char body[160];
      snprintf(body, sizeof body, "{\"prompt\":\"health check %d of the layouts\",\"max_tokens\":2}", i);
      tc_resp r;
      assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
      assert_int_equal(r.status, 200);
      tc_free(&r);
    }
    assert_int_equal(rt_metric(g.r.port, LOCALITY), 25);
    tc_resp h;
    assert_int_equal(tc_get(g.r.port, "/health", &h), 0);
    if (!strstr(h.body, "\"locality\":{\"on\":true"))
      fail_msg("%s: /health %s", eldr_re_layout_name(lays[li]), h.body);
    tc_free(&h);
    sf_free(&g);
  }
  unlink(art);
  free(art);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_streamed_recording_fits),
      cmocka_unit_test(test_prefill_only_recording_refused),
      cmocka_unit_test(test_echo_max_tokens_zero),
      cmocka_unit_test(test_health_every_layout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
