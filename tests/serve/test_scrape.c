/* test_scrape.c — load learnt from the engines' /metrics: the parser reads
 * vLLM's gauges (every engine's series summed; other metrics, comments and
 * histograms ignored), and a router with --scrape-interval routes on the
 * scraped load: a decoder whose engine reports a queue (the other
 * replica's requests) gets no new legs while an idle one exists; without
 * scraping the two look the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_types.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

/* As vLLM's v1 PrometheusStatLogger writes them (vllm/v1/metrics/loggers.py):
 * per-engine series labelled engine and model_name. */
static const char *const BUSY =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 6.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n"
    "vllm:num_requests_waiting_by_reason{engine=\"0\",reason=\"capacity\"} 99.0\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.42\n"
    "vllm:time_to_first_token_seconds_bucket{le=\"0.1\",model_name=\"m\"} 7.0\n";
static const char *const IDLE =
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0.0\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n";

static void test_parse_vllm_gauges(void **st) {
  (void)st;
  eldr_server s;
  memset(&s, 0, sizeof s);
  worker w;
  memset(&w, 0, sizeof w);
  w.s = &s;
  eldr__scrape_parse(&w, BUSY, strlen(BUSY));
  assert_true(w.scrape_valid);
  assert_int_equal(w.scraped, 11); /* 6 + 2 running, 3 + 0 waiting; _by_reason not counted */
  assert_true(w.scraped_kv > 0.41 && w.scraped_kv < 0.43);
  /* own legs since the scrape add to it; never below own in-flight */
  w.inflight_at_scrape = 2;
  w.inflight = 3;
  assert_int_equal(eldr__worker_load(&w), 12);
  w.inflight = 0;
  assert_int_equal(eldr__worker_load(&w), 9);
  w.scraped = 0;
  w.inflight = 2;
  w.inflight_at_scrape = 4;
  assert_int_equal(eldr__worker_load(&w), 2);
  /* no vLLM gauges: not valid, load is own in-flight only */
  const char *other = "# nothing\nprocess_cpu_seconds_total 3\nvllm:num_requests_runningX 5\n";
  eldr__scrape_parse(&w, other, strlen(other));
  assert_false(w.scrape_valid);
  assert_int_equal(eldr__worker_load(&w), 2);
  assert_int_equal(s.m.scrapes[0], 1);
  assert_int_equal(s.m.scrapes[1], 1);
}

static int decoder_of_next(int port, fx_worker *a, fx_worker *b) {
  size_t na = fx_count(a, "/v1/completions");
  tc_resp r;
  assert_int_equal(tc_post(port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  return fx_count(a, "/v1/completions") > na ? 0 : (assert_true(fx_count(b, "/v1/completions") > 0), 1);
}

static void run_router(double scrape, int expect_busy_legs) {
  fx_behaviour busy = fx_defaults(), idle = fx_defaults();
  busy.metrics_text = BUSY;
  idle.metrics_text = IDLE;
  sf_rig g;
  sf_start(&g, 1, &idle, 2, &idle);
  fx_worker *a = g.d[0], *b = g.d[1]; /* a first: jsq's tie-break */
  fx_set(a, &busy);
  g.c.policy = ELDR_POLICY_JSQ;
  g.c.scrape_interval_s = scrape;
  sf_run(&g);
  char series[160];
  snprintf(series, sizeof series, "eldr_worker_load{role=\"decode\",worker=\"%s\"}", fx_url(a));
  if (scrape > 0) assert_int_equal(rt_wait_metric(g.r.port, series, 11, 10), 0);
  int on_a = 0;
  for (int i = 0; i < 6; i++) on_a += decoder_of_next(g.r.port, a, b) == 0;
  assert_int_equal(on_a, expect_busy_legs);
  if (scrape > 0) assert_true(rt_metric(g.r.port, "eldr_worker_scrapes_total{result=\"ok\"}") >= 3);
  sf_free(&g);
}

static void test_scraped_load_steers_decisions(void **st) {
  (void)st;
  run_router(0, 6);    /* own legs only: both idle, jsq's tie-break picks a every time */
  run_router(0.05, 0); /* a's engine reports 11 in its queue: every leg goes to b */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_vllm_gauges),
      cmocka_unit_test(test_scraped_load_steers_decisions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
