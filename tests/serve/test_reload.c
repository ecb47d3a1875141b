/* test_reload.c — eldr serve reloads all or nothing, over real loopback
 * sockets against fixture workers (tests/support): a failed reload changes
 * nothing, a larger pool_size is honoured (and does not overflow the pool),
 * a changed health_interval takes effect, command-line flags survive
 * SIGHUP, workers dropped by a reload finish their legs and are freed, and
 * a reload that lists the prefill workers in another order keeps every
 * prompt on its prefill worker.
 * Waits are on conditions with deadlines. */
#include <jansson.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

#define SERIES(...) (snprintf(series, sizeof series, __VA_ARGS__), series)

/* A router on a config file: one prefill worker, nd decoders (behaviour b,
 * NULL = default), policy and extra config keys ("" or ",\"key\":value"). */
static void rig_start(sf_rig *g, const char *tag, int nd, const fx_behaviour *b, const char *policy,
                      const char *extra) {
  sf_start(g, 1, NULL, nd, b);
  sf_config_file(g, tag, policy, extra);
  g->c.header_timeout_s = 2;
}

static void reload_and_wait(rt_router *r, const char *result, double n) {
  char series[128];
  eldr_server_reload(r->srv);
  assert_int_equal(rt_wait_metric(r->port, SERIES("eldr_reloads_total{result=\"%s\"}", result), n, 10), 0);
}

/* ---- a failed reload changes nothing ----------------------------------------- */

static void test_failed_reload_changes_nothing(void **st) {
  (void)st;
  sf_rig g;
  rig_start(&g, "fail", 2, NULL, "jsq", "");
  sf_run(&g);
  int port = g.r.port;
  /* jsq over idle decoders: always the first */
  for (int i = 0; i < 3; i++) assert_int_equal(sf_post_served_by(port), fx_port(g.d[0]));
  /* a new policy and a worker list with a bad port (a host that does not
   * resolve is not an error: it is looked up on the loop and retried, see
   * test_dns.c) */
  char doc[1024], series[256];
  snprintf(doc, sizeof doc, "{\"policy\":\"rr\",\"decode\":[\"%s\",\"%s\",\"http://eldr-test.invalid:99999\"]}",
           fx_url(g.d[0]), fx_url(g.d[1]));
  sf_rewrite(&g, doc);
  reload_and_wait(&g.r, "error", 1);
  assert_int_equal(rt_metric(port, "eldr_reloads_total{result=\"ok\"}"), 0);
  /* still jsq (round robin would alternate), still two decoders */
  for (int i = 0; i < 4; i++) assert_int_equal(sf_post_served_by(port), fx_port(g.d[0]));
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}"), 7);
  assert_int_equal((long)rt_metric(port, "eldr_worker_healthy{role=\"decode\",worker=\"http://eldr-test.invalid:99999\"}"), -1);
  assert_int_equal(rt_metric(port, SERIES("eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", fx_url(g.d[1]))), 1);
  sf_stop(&g);
  /* the log says what was wrong */
  assert_non_null(strstr(rt_log_text(&g.r), "reload failed"));
  assert_non_null(strstr(rt_log_text(&g.r), "eldr-test.invalid"));
  assert_null(strstr(rt_log_text(&g.r), "reloaded:"));
  sf_free(&g);
}

/* ---- a reordered prefill list keeps each prompt's worker ---------------------- */

/* The rendezvous hash keys on each worker's URL, not its position: the same
 * three prefill workers listed in reverse order after a reload serve the
 * same prompts as before. (Keyed by position, most prompts moved.) */
static void test_reload_reorder_keeps_prefill_home(void **st) {
  (void)st;
  enum { N = 24 };
  sf_rig g;
  sf_start(&g, 3, NULL, 1, NULL);
  sf_config_file(&g, "reorder", "jsq", ",\"prefill_guard\":1000");
  sf_run(&g);
  int before[N], after[N];
  sf_prefill_homes(g.r.port, g.p, 3, N, before);
  int used[3] = {0};
  for (int i = 0; i < N; i++) used[before[i]] = 1;
  assert_true(used[0] + used[1] + used[2] >= 2);
  char doc[1024];
  snprintf(doc, sizeof doc, "{\"prefill\":[\"%s\",\"%s\",\"%s\"],\"decode\":[\"%s\"],\"policy\":\"jsq\","
           "\"health_interval\":0,\"prefill_guard\":1000}",
           g.purl[2], g.purl[0], g.purl[1], g.durl[0]);
  sf_rewrite(&g, doc);
  reload_and_wait(&g.r, "ok", 1);
  sf_prefill_homes(g.r.port, g.p, 3, N, after);
  for (int i = 0; i < N; i++)
    if (after[i] != before[i]) fail_msg("prompt %d: prefill worker %d after the reload, %d before", i, after[i], before[i]);
  sf_free(&g);
}

/* ---- pool_size raised on reload ------------------------------------------------ */

static void test_reload_raises_pool_size(void **st) {
  (void)st;
  /* streaming decodes held open after their first chunk: four legs in
   * flight on one decoder, whose connections all come back to its idle
   * pool at once when the streams end */
  fx_behaviour hold = fx_defaults();
  hold.stall_after_chunks = 1;
  sf_rig g;
  rig_start(&g, "pool", 1, &hold, "jsq", ",\"pool_size\":1");
  sf_run(&g);
  int port = g.r.port;
  sf_rewrite(&g, "{\"pool_size\":8}");
  reload_and_wait(&g.r, "ok", 1);
  enum { N = 4 };
  int fd[N];
  const char *req = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 28\r\n\r\n{\"prompt\":\"a\",\"stream\":true}";
  for (int i = 0; i < N; i++) fd[i] = tc_send_raw(port, req);
  char buf[N][8192];
  for (int i = 0; i < N; i++) { /* every stream has started */
    tc_read_until(fd[i], buf[i], sizeof buf[i], "data:");
    if (strncmp(buf[i], "HTTP/1.1 200", 12) || !strstr(buf[i], "data:")) fail_msg("response %d: [%s]", i, buf[i]);
  }
  fx_stop(g.d[0]); /* the held streams end (the worker goes away): all four
                    * legs give their connections back to the idle pool */
  for (int i = 0; i < N; i++) {
    tc_read_until(fd[i], buf[i], sizeof buf[i], "0\r\n\r\n");
    assert_non_null(strstr(buf[i], "0\r\n\r\n"));
    close(fd[i]);
  }
  const char *ok = "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}";
  const char *ab = "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"stream_aborted\"}";
  double dl = fx_now() + 10;
  while (rt_metric(port, ok) + rt_metric(port, ab) < N && fx_now() < dl) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(rt_metric(port, ok) + rt_metric(port, ab), N);
  /* and back down: the extra idle connections are closed, requests go on */
  fx_worker *d2 = fx_start(NULL);
  char doc[256];
  snprintf(doc, sizeof doc, "{\"pool_size\":1,\"decode\":[\"%s\"]}", fx_url(d2));
  sf_rewrite(&g, doc);
  reload_and_wait(&g.r, "ok", 2);
  assert_int_equal(sf_post_served_by(port), fx_port(d2));
  sf_free(&g);
  fx_free(d2);
}

/* ---- health_interval changed on reload ------------------------------------------- */

static void test_reload_health_interval(void **st) {
  (void)st;
  sf_rig g;
  rig_start(&g, "health", 2, NULL, "rr", ",\"eject_after\":1,\"connect_timeout\":1");
  sf_run(&g);
  int port = g.r.port;
  sf_rewrite(&g, "{\"health_interval\":0.05}"); /* 0 -> 0.05: health checks start */
  reload_and_wait(&g.r, "ok", 1);
  int port1 = fx_port(g.d[1]);
  char h1[256];
  snprintf(h1, sizeof h1, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", fx_url(g.d[1]));
  fx_stop(g.d[1]);
  assert_int_equal(rt_wait_metric_le(port, h1, 0, 10), 0); /* ejected */
  fx_worker *back = fx_start_port(NULL, port1);
  assert_non_null(back);
  assert_int_equal(rt_wait_metric(port, h1, 1, 10), 0); /* re-admitted by the checks */
  /* ejected again, then health checks turned off: nothing would re-admit
   * it, so the reload does */
  fx_stop(back);
  assert_int_equal(rt_wait_metric_le(port, h1, 0, 10), 0);
  fx_worker *again = fx_start_port(NULL, port1);
  assert_non_null(again);
  sf_rewrite(&g, "{\"health_interval\":0}");
  reload_and_wait(&g.r, "ok", 2);
  assert_int_equal(rt_metric(port, h1), 1);
  int seen1 = 0;
  for (int i = 0; i < 4; i++) seen1 |= sf_post_served_by(port) == port1;
  assert_true(seen1);
  sf_stop(&g);
  assert_non_null(strstr(rt_log_text(&g.r), "re-admitted"));
  sf_free(&g);
  fx_free(back);
  fx_free(again);
}

/* ---- command-line flags survive a reload ------------------------------------------- */

static void test_reload_keeps_overrides(void **st) {
  (void)st;
  sf_rig g;
  rig_start(&g, "ovr", 2, NULL, "rr", "");
  g.c.policy = ELDR_POLICY_JSQ; /* as `--policy jsq` would */
  g.c.overrides = strdup("{\"policy\":\"jsq\"}");
  sf_run(&g);
  reload_and_wait(&g.r, "ok", 1);
  for (int i = 0; i < 3; i++) assert_int_equal(sf_post_served_by(g.r.port), fx_port(g.d[0]));
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}"), 3);
  sf_free(&g);
}

/* The router process of the CLI test: killed by the teardown when an
 * assertion left it running. */
static sf_child cli;

static int kill_cli_child(void **st) {
  (void)st;
  sf_child_kill(&cli);
  return 0;
}

/* The CLI: `eldr serve --config F --policy jsq`, SIGHUP, still jsq. */
static void test_cli_flags_survive_sighup(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 2, NULL);
  sf_config_file(&g, "cli", "rr", "");
  const char *args[] = {"--config", g.cfgpath, "--policy", "jsq", "--port", "0", "--health-interval", "0", "--quiet",
                        NULL};
  sf_child_start(&cli, 0, args);
  int port = cli.port;
  assert_int_equal(sf_post_served_by(port), fx_port(g.d[0]));
  kill(cli.pid, SIGHUP);
  assert_int_equal(rt_wait_metric(port, "eldr_reloads_total{result=\"ok\"}", 1, 10), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(sf_post_served_by(port), fx_port(g.d[0]));
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}"), 4);
  sf_child_stop(&cli); /* SIGTERM: exit status 0 */
  sf_free(&g);
}

/* ---- workers removed by a reload are freed ------------------------------------------ */

static void test_removed_workers_drain_and_free(void **st) {
  (void)st;
  sf_rig g;
  rig_start(&g, "drain", 1, NULL, "jsq", ",\"threads\":1"); /* retired workers are per loop */
  fx_worker *d0 = g.d[0], *d1 = fx_start(NULL), *d2 = fx_start(NULL); /* d1, d2: later */
  char doc[1024];
  sf_run(&g);
  int port = g.r.port;
  assert_int_equal(rt_metric(port, "eldr_workers_draining"), 0);
  /* a leg in flight on d0 while d0 leaves the list */
  fx_behaviour hang = fx_defaults();
  hang.hang = 1;
  fx_set(d0, &hang);
  int fd = tc_send_raw(port, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 14\r\n\r\n{\"prompt\":\"b\"}");
  assert_int_equal(fx_wait(d0, "/v1/completions", 1, 10), 0);
  snprintf(doc, sizeof doc, "{\"decode\":[\"%s\"]}", fx_url(d1));
  sf_rewrite(&g, doc);
  reload_and_wait(&g.r, "ok", 1);
  assert_int_equal(rt_metric(port, "eldr_workers_draining"), 1);
  assert_int_equal(sf_post_served_by(port), fx_port(d1)); /* no new legs on d0 */
  /* d0 answers its held leg (503): the leg ends (not retried elsewhere: d0
   * had the request), d0 freed */
  fx_stop(d0);
  char buf[4096];
  tc_read_until(fd, buf, sizeof buf, "not retried");
  close(fd);
  assert_true(strncmp(buf, "HTTP/1.1 502", 12) == 0);
  assert_int_equal(rt_wait_metric_le(port, "eldr_workers_draining", 0, 10), 0);
  /* a worker removed with nothing in flight is freed at once */
  snprintf(doc, sizeof doc, "{\"decode\":[\"%s\"]}", fx_url(d2));
  sf_rewrite(&g, doc);
  reload_and_wait(&g.r, "ok", 2);
  assert_int_equal(rt_metric(port, "eldr_workers_draining"), 0);
  assert_int_equal(sf_post_served_by(port), fx_port(d2));
  sf_free(&g);
  fx_free(d1);
  fx_free(d2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_failed_reload_changes_nothing),
      cmocka_unit_test(test_reload_reorder_keeps_prefill_home),
      cmocka_unit_test(test_reload_raises_pool_size),
      cmocka_unit_test(test_reload_health_interval),
      cmocka_unit_test(test_reload_keeps_overrides),
      cmocka_unit_test_teardown(test_cli_flags_survive_sighup, kill_cli_child),
      cmocka_unit_test(test_removed_workers_drain_and_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
