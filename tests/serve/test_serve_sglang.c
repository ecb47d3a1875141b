/* test_serve_sglang.c — the router's SGLang prefill/decode flow (--pd
 * sglang; src/serve/sglpd.c, docs/sglang.md) end to end over loopback
 * sockets, in front of emulated SGLang workers (`eldr worker --engine
 * sglang`, in process): a completion and a streamed chat answered with the
 * KV handed over (the emulated prefill answers only after the decode took
 * the KV), the second sight of a prompt routed on the signature predicted
 * from the cache the first one's prefill filled, the client's own bootstrap
 * fields never reaching a worker; a prefill that fails aborting the decode
 * leg at once (the decode would otherwise wait for KV until its waiting
 * timeout); a decode that fails answering the client and ending the
 * prefill leg. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "eldr/artifact.h"
#include "eldr/latency.h"
#include "eldr/serve.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"
#include "support/proc.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "worker/wtest.h"

#include "sgl_rig.h"

static void test_completion_stream_and_prediction(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 2, &art);
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  /* a completion: the decode's reply relayed, the prefill's rows read */
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5}", LONG_PROMPT);
  tc_resp r;
  sf_post_ok(port, "/v1/completions", body, NULL, &r);
  json_t *j = json_loads(r.body, 0, NULL);
  assert_non_null(j);
  json_t *u = json_object_get(j, "usage");
  assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 5); /* the decode's, not the prefill's 1 */
  assert_true(json_integer_value(json_object_get(u, "prompt_tokens")) >= 2 * 16);
  assert_non_null(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));
  json_decref(j);
  tc_free(&r);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 1, 10), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"none\"}"), 1);
  /* the same prompt again: its blocks are in the cache now, so the decoder
   * is chosen on the prediction, and the decision says so */
  sf_post_ok(port, "/v1/completions", body, NULL, NULL);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"predicted\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"load\",outcome=\"ok\"}"), 1);
  /* a streamed chat, with bootstrap fields of the client's own that would
   * send the decode to a bootstrap server that does not exist: they never
   * reach a worker, the router's replace them */
  const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Say something about experts.\"}],"
                     "\"max_tokens\":4,\"stream\":true,\"bootstrap_host\":\"203.0.113.9\",\"bootstrap_port\":1,"
                     "\"bootstrap_room\":7}";
  sf_post_ok(port, "/v1/chat/completions", chat, NULL, &r);
  char err[256], engine[64];
  long ut = 0;
  if (wt_sse_check(r.body, err, sizeof err, engine, &ut) < 0) fail_msg("stream: %s [%s]", err, r.body);
  assert_non_null(strstr(r.body, "data: [DONE]"));
  assert_non_null(strstr(r.body, "chat.completion.chunk"));
  assert_null(strstr(r.body, "\"error\""));
  tc_free(&r);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 3, 10), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"failed\"}"), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"abandoned\"}"), 0);
  /* n > 1: a room per sample, every sample answered */
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":3,\"n\":3}", "three samples of one prompt please");
  sf_post_ok(port, "/v1/completions", body, NULL, &r);
  j = json_loads(r.body, 0, NULL);
  assert_int_equal(json_array_size(json_object_get(j, "choices")), 3);
  json_decref(j);
  tc_free(&r);
  /* a batch of 2 prompts x n 2: 4 items, a room each */
  sf_post_ok(port, "/v1/completions", "{\"prompt\":[\"first prompt of a batch\",\"second prompt of it\"],\"max_tokens\":2,\"n\":2}",
             NULL, &r);
  j = json_loads(r.body, 0, NULL);
  assert_int_equal(json_array_size(json_object_get(j, "choices")), 4);
  json_decref(j);
  tc_free(&r);
  for (int i = 0; i < 3; i++) assert_int_equal(worker_idle(engine_port(&g, i), 10), 0);
  sf_free(&g);
  unlink(art);
  free(art);
}

/* A prefill that fails (here: answers 500 at once) while the decode has
 * registered for the room with the real prefill engine's bootstrap server
 * and waits for KV (30 s waiting timeout): the router aborts the decode leg
 * and answers at once, naming the prefill. */
static void test_prefill_failure_aborts_decode(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 1, &art);
  fx_behaviour bad = fx_defaults();
  bad.status = 500;
  fx_worker *fp = fx_start(&bad);
  assert_non_null(fp);
  free(g.c.prefill[0]);
  g.c.prefill[0] = strdup(fx_url(fp));
  sf_run(&g);
  int port = g.r.port;
  char body[1024];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5}", LONG_PROMPT);
  double t0 = wt_now();
  tc_resp r;
  assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &r), 0);
  double took = wt_now() - t0;
  if (r.status != 502 || !strstr(r.body, "prefill")) fail_msg("want 502 naming the prefill: %d %s", r.status, r.body);
  assert_true(took < 10); /* not the decode's 30 s waiting timeout */
  tc_free(&r);
  assert_int_equal(fx_count(fp, "/v1/completions"), 1);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"failed\"}"), 1);
  /* the decode engine dropped the room: nothing of it runs or waits */
  assert_int_equal(worker_idle(engine_port(&g, 1), 10), 0);
  /* the same while streaming: the client's stream gets the error */
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5,\"stream\":true}", LONG_PROMPT);
  assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &r), 0);
  if (r.status != 502 || !strstr(r.body, "prefill")) fail_msg("stream: want 502 naming the prefill: %d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(worker_idle(engine_port(&g, 1), 10), 0);
  sf_free(&g);
  fx_stop(fp);
  fx_free(fp);
  unlink(art);
  free(art);
}

/* A prefill that never answers: its leg ends at --prefill-timeout with 504,
 * the decode leg (waiting for KV: 30 s) aborted with it. */
static void test_prefill_timeout_aborts_decode(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 1, &art);
  fx_behaviour hang = fx_defaults();
  hang.hang = 1;
  fx_worker *fp = fx_start(&hang);
  assert_non_null(fp);
  free(g.c.prefill[0]);
  g.c.prefill[0] = strdup(fx_url(fp));
  g.c.prefill_timeout_s = 1;
  sf_run(&g);
  char body[1024];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5}", LONG_PROMPT);
  double t0 = wt_now();
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
  double took = wt_now() - t0;
  if (r.status != 504 || !strstr(r.body, "prefill timed out")) fail_msg("want 504 prefill timed out: %d %s", r.status, r.body);
  assert_true(took >= 0.9 && took < 10);
  tc_free(&r);
  assert_int_equal(rt_metric(g.r.port, "eldr_sglang_prefill_total{result=\"timeout\"}"), 1);
  assert_int_equal(worker_idle(engine_port(&g, 1), 10), 0);
  sf_free(&g);
  fx_stop(fp);
  fx_free(fp);
  unlink(art);
  free(art);
}

/* A decode that fails (answers 500): the client gets the error, and the
 * prefill leg, whose engine holds the request until a decode registers for
 * its room, is ended with the request (the engine then drops it). */
static void test_decode_failure(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 1, &art);
  fx_behaviour bad = fx_defaults();
  bad.status = 500;
  fx_worker *fd = fx_start(&bad);
  assert_non_null(fd);
  free(g.c.decode[0]);
  g.c.decode[0] = strdup(fx_url(fd));
  g.c.retries = 0;
  sf_run(&g);
  int port = g.r.port;
  char body[1024];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5}", LONG_PROMPT);
  tc_resp r;
  assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &r), 0);
  if (r.status != 502 || !strstr(r.body, "decode")) fail_msg("want 502 naming the decode: %d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(fx_count(fd, "/v1/completions"), 1);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"abandoned\"}", 1, 10), 0);
  assert_int_equal(worker_idle(engine_port(&g, 0), 10), 0); /* the prefill engine let it go */
  sf_free(&g);
  fx_stop(fd);
  fx_free(fd);
  unlink(art);
  free(art);
}

/* The footprint policy: the decoder's contribution, predicted at arrival
 * (uniform for a prompt never seen), is replaced by the prefill's true
 * counts once its reply is read; every ticket ends with its request. */
static void test_footprint_prediction_replaced(void **st) {
  (void)st;
  sf_rig g;
  /* decoders in real time (20 tokens: tens of ms after the KV arrived), so
   * the prefill's reply, sent when the KV has moved, is read while the
   * decode leg still runs (a decode that ended first has no contribution
   * left to replace) */
  eldr_worker_config c = engine_cfg(), dc = engine_cfg();
  dc.time_scale = 1.0;
  sf_start_engines(&g, 1, &c, 2, &dc);
  char *art = artifact_of(1);
  g.c.threads = 1;
  g.c.policy = ELDR_POLICY_FOOTPRINT;
  g.c.artifact = strdup(art);
  g.c.pd = ELDR_PD_SGLANG;
  g.c.bootstrap_port = boot_port(&g);
  sf_run(&g);
  int port = g.r.port;
  char body[1024];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":20,\"stream\":true}", LONG_PROMPT);
  for (int i = 0; i < 2; i++) sf_post_ok(port, "/v1/completions", body, NULL, NULL);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}"), 2);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"predicted\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_footprint_replaced_total"), 2);
  assert_int_equal(rt_wait_metric_le(port, "eldr_footprint_inflight", 0, 10), 0);
  sf_free(&g);
  unlink(art);
  free(art);
}

/* A bootstrap port per prefill worker (the gateway's --prefill URL PORT;
 * config bootstrap_ports): two prefill engines on their own ports, the
 * global one wrong; every request reaches its prefill's bootstrap server. */
static void test_bootstrap_port_per_prefill(void **st) {
  (void)st;
  sf_rig g;
  eldr_worker_config c = engine_cfg();
  c.bootstrap_timeout = 3;
  c.waiting_timeout = 3;
  sf_start_engines(&g, 2, &c, 1, &c);
  g.c.threads = 1;
  g.c.pd = ELDR_PD_SGLANG;
  g.c.bootstrap_port = 1; /* nobody's */
  eldr_diag d = {{0}};
  char doc[512];
  snprintf(doc, sizeof doc, "{\"bootstrap_ports\":{\"%s\":%d,\"%s\":%d}}", g.purl[0],
           eldr_worker_bootstrap_port(((wt_worker *)g.engine[0])->w), g.purl[1],
           eldr_worker_bootstrap_port(((wt_worker *)g.engine[1])->w));
  if (eldr_serve_config_parse(&g.c, doc, strlen(doc), &d)) fail_msg("config: %s", d.msg);
  assert_int_equal(g.c.n_boot, 2);
  assert_int_equal(eldr_serve_config_validate(&g.c, &d), 0);
  sf_run(&g);
  for (int i = 0; i < 16; i++) {
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"request %d of sixteen, each its own prefix\",\"max_tokens\":2}", i);
    sf_post_ok(g.r.port, "/v1/completions", body, NULL, NULL);
  }
  for (int i = 0; i < 2; i++) {
    char series[160];
    snprintf(series, sizeof series, "eldr_worker_requests_total{role=\"prefill\",worker=\"%s\"}", g.purl[i]);
    assert_true(rt_metric(g.r.port, series) >= 1);
  }
  assert_int_equal(rt_metric(g.r.port, "eldr_sglang_prefill_total{result=\"failed\"}"), 0);
  sf_free(&g);
  /* the map names prefill workers only, and ports in range */
  eldr_serve_config cf;
  eldr_serve_config_default(&cf);
  assert_int_equal(eldr_serve_config_add_worker(&cf, 0, "http://p:1", &d), 0);
  assert_int_equal(eldr_serve_config_add_worker(&cf, 1, "http://q:1", &d), 0);
  const char *bad = "{\"bootstrap_ports\":{\"http://q:1\":9}}";
  assert_int_equal(eldr_serve_config_parse(&cf, bad, strlen(bad), &d), 0);
  assert_int_equal(eldr_serve_config_validate(&cf, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "not a prefill worker"));
  const char *range = "{\"bootstrap_ports\":{\"http://p:1\":70000}}";
  assert_int_equal(eldr_serve_config_parse(&cf, range, strlen(range), &d), ELDR_ERANGE);
  eldr_serve_config_free(&cf);
}

/* --record in the SGLang flow: the decoder is chosen at arrival, the
 * prompt's counts come later with the prefill's reply. Each recorded
 * request carries the prefill's true counts over every MoE layer (not the
 * prediction the decision saw: the second sight of a prompt is predicted
 * from the first one's blocks), and its decision. */
static void test_record_prefill_counts(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 2, &art);
  char dir[128];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_sglrec_%d", (int)getpid());
  assert_int_equal(eldr_test_rmtree(dir), 0);
  g.c.record_dir = strdup(dir);
  g.c.record_sample = 1;
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":4}", LONG_PROMPT);
  long prompt_tokens[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    tc_resp r;
    sf_post_ok(port, "/v1/completions", body, NULL, &r);
    json_t *j = json_loads(r.body, 0, NULL);
    prompt_tokens[i] = (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    tc_free(&r);
    assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", i + 1, 10), 0);
  }
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"predicted\"}"), 1);
  sf_free(&g); /* the recorder writes what is queued and closes */
  DIR *dd = opendir(dir);
  assert_non_null(dd);
  struct dirent *de;
  char path[512] = "";
  while ((de = readdir(dd)))
    if (strstr(de->d_name, ".jsonl")) snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
  closedir(dd);
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  if (eldr_trace_load(path, &t, &d)) fail_msg("record %s: %s", path, d.msg);
  assert_int_equal(t->n, 2);
  size_t L = t->shape.num_layers, E = t->shape.num_experts;
  for (size_t i = 0; i < 2; i++) {
    const eldr_request *q = &t->req[i];
    assert_true(prompt_tokens[i] > 0);
    assert_int_equal(q->n_prefill, (uint32_t)prompt_tokens[i]);
    assert_non_null(q->prefill_counts);
    for (size_t l = 0; l < L; l++) { /* every MoE layer: each token's top_k choices */
      uint64_t sum = 0;
      for (size_t e = 0; e < E; e++) sum += q->prefill_counts[l * E + e];
      if (sum != (uint64_t)prompt_tokens[i] * t->shape.top_k)
        fail_msg("request %zu layer %zu: %llu selections, want %ld x %u", i, l, (unsigned long long)sum,
                 prompt_tokens[i], t->shape.top_k);
    }
    assert_non_null(q->serve);
    if (!strstr(q->serve, i ? "\"locality\"" : "\"no_prediction\"")) fail_msg("request %zu: serve %s", i, q->serve);
  }
  /* the same prompt twice: the same true counts, whatever was predicted */
  assert_memory_equal(t->req[0].prefill_counts, t->req[1].prefill_counts, L * E * sizeof(uint32_t));
  eldr_trace_free(t);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  unlink(art);
  free(art);
}

/* Every request shape routed on the exact counts: the decision says so
 * (signature exact, decision locality), the poll's end is counted, and the
 * client's own bootstrap fields (pointing the decode at a bootstrap server
 * that does not exist, and at a room the prefill never gets) never reach a
 * worker: the counts come for the router's room and the KV moves. */
static void test_exact_decision(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  exact_rig_start(&g, 2, 1, 0.01, &art);
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  snprintf(body, sizeof body,
           "{\"prompt\":\"%s\",\"max_tokens\":5,\"bootstrap_host\":\"203.0.113.9\",\"bootstrap_port\":1,\"bootstrap_room\":7}",
           LONG_PROMPT);
  tc_resp r;
  sf_post_ok(port, "/v1/completions", body, NULL, &r);
  json_t *j = json_loads(r.body, 0, NULL);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 5);
  json_decref(j);
  tc_free(&r);
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"exact\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"exact\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"none\"}"), 0);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"), 1);
  assert_true(rt_metric(port, "eldr_sglang_exact_wait_seconds_count") == 1);
  /* a streamed chat, n > 1 and a batch: each decided on its first item's counts */
  const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Say something about experts.\"}],"
                     "\"max_tokens\":4,\"stream\":true,\"bootstrap_room\":[1,2]}";
  sf_post_ok(port, "/v1/chat/completions", chat, NULL, &r);
  char err[256], engine[64];
  long ut = 0;
  if (wt_sse_check(r.body, err, sizeof err, engine, &ut) < 0) fail_msg("stream: %s [%s]", err, r.body);
  assert_non_null(strstr(r.body, "data: [DONE]"));
  tc_free(&r);
  sf_post_ok(port, "/v1/completions", "{\"prompt\":\"three samples of one prompt please\",\"max_tokens\":3,\"n\":3}", NULL, &r);
  j = json_loads(r.body, 0, NULL);
  assert_int_equal(json_array_size(json_object_get(j, "choices")), 3);
  json_decref(j);
  tc_free(&r);
  sf_post_ok(port, "/v1/completions", "{\"prompt\":[\"first prompt of a batch\",\"second prompt of it\"],\"max_tokens\":2,\"n\":2}",
             NULL, &r);
  j = json_loads(r.body, 0, NULL);
  assert_int_equal(json_array_size(json_object_get(j, "choices")), 4);
  json_decref(j);
  tc_free(&r);
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"exact\"}"), 4);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"exact\"}"), 4);
  /* the prefill replies' rows complete the cache (the batch's are not read:
   * its rows are sized by usage.prompt_tokens, which counts every prompt's) */
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 3, 10), 0);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"not_read\"}", 1, 10), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"failed\"}"), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(worker_idle(engine_port(&g, i), 10), 0);
  rig_end(&g, art);
}

/* A prefill that does not publish counts (no --exact: its bootstrap server
 * answers 404) and one whose forward ends after --exact-timeout: the
 * decoder is chosen on the prediction or load, the request answered, and
 * the metrics and decision say why. */
static void test_exact_fallback(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  exact_rig_start(&g, 2, 0, 0.01, &art);
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":3}", LONG_PROMPT);
  sf_post_ok(port, "/v1/completions", body, NULL, NULL);
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"not_published\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"exact\"}"), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"none\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"load\",outcome=\"ok\"}"), 1);
  /* the prompt's blocks are cached now (the prefill's reply): the fallback
   * routes on the prediction */
  sf_post_ok(port, "/v1/completions", body, NULL, NULL);
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"not_published\"}"), 2);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"predicted\"}"), 1);
  rig_end(&g, art);
  /* a slow forward (the prefill engine in real time x 50) against a 50 ms
   * wait: the decode leg goes on the prediction / load, the KV still moves */
  exact_rig_start(&g, 1, 1, 50, &art);
  g.c.exact_timeout_s = 0.05;
  sf_run(&g);
  port = g.r.port;
  double t0 = wt_now();
  sf_post_ok(port, "/v1/completions", body, NULL, NULL);
  double took = wt_now() - t0;
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"timeout\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"none\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}"), 1);
  assert_true(took > 0.05);
  for (int i = 0; i < 2; i++) assert_int_equal(worker_idle(engine_port(&g, i), 10), 0);
  rig_end(&g, art);
  /* the config keys: pd "sglang-exact", exact_timeout in (0, 3600] */
  eldr_serve_config cf;
  eldr_serve_config_default(&cf);
  eldr_diag d = {{0}};
  const char *doc = "{\"pd\":\"sglang-exact\",\"exact_timeout\":0.25}";
  assert_int_equal(eldr_serve_config_parse(&cf, doc, strlen(doc), &d), 0);
  assert_int_equal(cf.pd, ELDR_PD_SGLANG_EXACT);
  assert_true(cf.exact_timeout_s == 0.25);
  doc = "{\"pd\":\"exact\"}";
  assert_int_equal(eldr_serve_config_parse(&cf, doc, strlen(doc), &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "sglang-exact"));
  doc = "{\"exact_timeout\":0}";
  assert_int_not_equal(eldr_serve_config_parse(&cf, doc, strlen(doc), &d), 0);
  assert_non_null(strstr(d.msg, "exact_timeout"));
  /* sglang-exact polls every prefill's bootstrap server: a prefill left
   * without a bootstrap port (bootstrap_port 0, none of its own) is refused
   * at start, naming it; one of its own suffices */
  doc = "{\"pd\":\"sglang-exact\",\"bootstrap_port\":0,\"prefill\":[\"http://p:1\",\"http://q:1\"],"
        "\"decode\":[\"http://d:1\"],\"bootstrap_ports\":{\"http://p:1\":8998}}";
  assert_int_equal(eldr_serve_config_parse(&cf, doc, strlen(doc), &d), 0);
  assert_int_equal(eldr_serve_config_validate(&cf, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "http://q:1 has no bootstrap port"));
  doc = "{\"bootstrap_ports\":{\"http://p:1\":8998,\"http://q:1\":8999}}";
  assert_int_equal(eldr_serve_config_parse(&cf, doc, strlen(doc), &d), 0);
  assert_int_equal(eldr_serve_config_validate(&cf, &d), 0);
  doc = "{\"pd\":\"sglang\",\"bootstrap_ports\":{}}"; /* --pd sglang sends null, as the gateway does */
  assert_int_equal(eldr_serve_config_parse(&cf, doc, strlen(doc), &d), 0);
  assert_int_equal(eldr_serve_config_validate(&cf, &d), 0);
  eldr_serve_config_free(&cf);
}

/* A prefill that fails (500 at once) while the router waits for its counts
 * on a real bootstrap server that will never have them (its room waits 30
 * s): the poll is ended, no decode leg is ever sent (the decode engine sees
 * no request), and the client gets the prefill's error at once; the same
 * for a prefill that answers 200 before any decode could have its KV. */
static void test_exact_prefill_failure(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  exact_rig_start(&g, 1, 1, 0.01, &art);
  fx_behaviour bad = fx_defaults();
  bad.status = 500;
  fx_worker *fp = fx_start(&bad);
  assert_non_null(fp);
  free(g.c.prefill[0]);
  g.c.prefill[0] = strdup(fx_url(fp));
  sf_run(&g);
  int port = g.r.port;
  char body[1024];
  for (int stream = 0; stream < 2; stream++) {
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5,\"stream\":%s}", LONG_PROMPT, stream ? "true" : "false");
    double t0 = wt_now();
    tc_resp r;
    assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &r), 0);
    double took = wt_now() - t0;
    if (r.status != 502 || !strstr(r.body, "prefill") || !strstr(r.body, "no decode leg was sent"))
      fail_msg("want 502 naming the prefill: %d %s", r.status, r.body);
    assert_true(took < 10);
    tc_free(&r);
  }
  assert_int_equal(fx_count(fp, "/v1/completions"), 2);
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"aborted\"}"), 2);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"failed\"}"), 2);
  char series[200];
  snprintf(series, sizeof series, "eldr_worker_requests_total{role=\"decode\",worker=\"%s\"}", g.durl[0]);
  assert_int_equal(rt_metric(port, series), 0);
  assert_int_equal(worker_idle(engine_port(&g, 1), 10), 0);
  rig_end(&g, art);
  fx_stop(fp);
  fx_free(fp);
  /* a prefill that answers 200 at once (no disaggregated engine does: its KV
   * waits for a decode): the poll ended, no decode leg sent, 502 */
  exact_rig_start(&g, 1, 1, 0.01, &art);
  fx_behaviour ok = fx_defaults();
  fp = fx_start(&ok);
  assert_non_null(fp);
  free(g.c.prefill[0]);
  g.c.prefill[0] = strdup(fx_url(fp));
  sf_run(&g);
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":5}", LONG_PROMPT);
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
  if (r.status != 502 || !strstr(r.body, "no decode leg was sent")) fail_msg("want 502, no decode leg: %d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(rt_metric(g.r.port, "eldr_sglang_exact_total{result=\"aborted\"}"), 1);
  snprintf(series, sizeof series, "eldr_worker_requests_total{role=\"decode\",worker=\"%s\"}", g.durl[0]);
  assert_int_equal(rt_metric(g.r.port, series), 0);
  rig_end(&g, art);
  fx_stop(fp);
  fx_free(fp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_completion_stream_and_prediction),
      cmocka_unit_test(test_prefill_failure_aborts_decode),
      cmocka_unit_test(test_prefill_timeout_aborts_decode),
      cmocka_unit_test(test_decode_failure),
      cmocka_unit_test(test_footprint_prediction_replaced),
      cmocka_unit_test(test_bootstrap_port_per_prefill),
      cmocka_unit_test(test_record_prefill_counts),
      cmocka_unit_test(test_exact_decision),
      cmocka_unit_test(test_exact_fallback),
      cmocka_unit_test(test_exact_prefill_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
