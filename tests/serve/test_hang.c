/* test_hang.c — the hang detector against real processes over real sockets
 * (issue 26, item 2): `eldr worker` engines and `eldr serve`, each its own
 * process.
 *
 *   queued stream: a decoder at its batch limit (--max-num-seqs 2) gets a
 *     third stream, which waits in the engine's queue while the two running
 *     streams progress. With the detector at its most eager (hang window
 *     1 s, probe 0.5 s) nothing is ejected and all three streams complete
 *     in full. With the setting, a first-byte (queue) timeout
 *     shorter than the wait, the queued stream alone ends with 504; the two
 *     running ones complete in full and the decoder is not ejected.
 *   stopped prefill worker: its prefill legs are retried on the other
 *     prefill worker once it is found hung; every request is answered 200.
 *   SIGSTOP on defaults: a decoder stopped while streaming is ejected
 *     within 10 s of the stop, and every request on it ends by then; the
 *     other decoder's streams complete; later requests go to it; SIGCONT
 *     re-admits the stopped one.
 *
 * Waiting is on conditions with deadlines (the router's /metrics polled
 * every 50 ms), never on a sleep that must be long enough. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "support/engines.h"
#include "support/fixture.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

static sf_child router;

static int teardown(void **st) {
  (void)st;
  eng_stop_all();
  sf_child_kill(&router);
  return 0;
}

/* An engine process; its port. */
static int spawn_worker(const char *role, const char *scale, const char *max_seqs, pid_t *pid) {
  return eng_start(role, scale, max_seqs, pid);
}

typedef struct job {
  int port, max_tokens;
  double timeout_s;
  eng_stream r;
} job;

static void *stream_main(void *arg) {
  job *j = arg;
  eng_stream_post(j->port, "the queue and the hang", j->max_tokens, j->timeout_s, &j->r);
  return NULL;
}

static double metric(int port, const char *fmt, int wport) {
  char s[200];
  snprintf(s, sizeof s, fmt, wport);
  return rt_metric(port, s);
}

/* One prefill and one decode engine (--max-num-seqs 2) behind a router
 * started with extra flags; three 800-token streams sent 0.3 s apart, so
 * the third waits in the engine's queue until a running one ends. */
static void queued_case(const char *health_interval, const char *const *flags, job jobs[3], int *dport) {
  pid_t pp, dp;
  int pport = spawn_worker("prefill", "0.5", "256", &pp);
  *dport = spawn_worker("decode", "0.5", "2", &dp);
  char purl[64], durl[64];
  eng_url(pport, purl, sizeof purl);
  snprintf(durl, sizeof durl, "http://127.0.0.1:%d", *dport);
  const char *args[24] = {"--port", "0", "--prefill", purl, "--decode", durl, "--policy", "jsq", "--threads", "1",
                          "--health-interval", health_interval};
  int n = 12;
  for (int i = 0; flags[i]; i++) args[n++] = flags[i];
  args[n] = NULL;
  sf_child_start(&router, 0, args);
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    jobs[i] = (job){router.port, 800, 60, {0}};
    pthread_create(&th[i], NULL, stream_main, &jobs[i]);
    if (i < 2) { /* the first two are running before the third arrives */
      char s[128];
      snprintf(s, sizeof s, "eldr_worker_inflight{role=\"decode\",worker=\"%s\"}", durl);
      if (rt_wait_metric(router.port, s, i + 1, 10)) fail_msg("stream %d never reached the decoder", i);
    }
  }
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
}

static void test_queued_stream_not_a_hang(void **st) {
  (void)st;
  /* the detector at its most eager: a second without progress is probed
   * (health checks rare, so the probes are the detector's own) */
  const char *flags[] = {"--hang-window", "1", "--health-timeout", "0.5", NULL};
  job j[3];
  int dport;
  queued_case("30", flags, j, &dport);
  for (int i = 0; i < 3; i++)
    if (j[i].r.status != 200 || j[i].r.tokens != 800)
      fail_msg("stream %d: status %d, %d of 800 tokens: %s", i, j[i].r.status, j[i].r.tokens, j[i].r.err);
  double ej = metric(router.port, "eldr_worker_ejections_total{role=\"decode\",worker=\"http://127.0.0.1:%d\"}", dport);
  double hangs = metric(router.port, "eldr_worker_hangs_total{role=\"decode\",worker=\"http://127.0.0.1:%d\"}", dport);
  double probes = rt_metric(router.port, "eldr_hang_probes_total{result=\"answered\"}");
  double qto = rt_metric(router.port, "eldr_queue_timeouts_total");
  double t_first = j[0].r.t_end < j[1].r.t_end ? j[0].r.t_end : j[1].r.t_end;
  print_message("queued stream, hang window 1 s: 3 of 3 streams complete (800 tokens each), the queued one "
                "finished %.2f s after the first running one; ejections %g, hang verdicts %g, probes answered %g, "
                "queue timeouts %g\n", j[2].r.t_end - t_first, ej, hangs, probes, qto);
  assert_int_equal(ej, 0);
  assert_int_equal(hangs, 0);
  assert_int_equal(qto, 0);
  assert_true(j[2].r.t_end > t_first); /* it did wait for a running one */
  /* a leg that sends nothing for longer than the window (a whole reply of
   * 800 tokens, about 2 s): probed, answered, not a hang */
  tc_resp r;
  assert_int_equal(tc_post_within(router.port, "/v1/completions", "{\"prompt\":\"whole\",\"max_tokens\":800}", NULL, 60, &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  double answered = rt_metric(router.port, "eldr_hang_probes_total{result=\"answered\"}");
  print_message("a whole (non-streaming) reply of 800 tokens, hang window 1 s: 200, probes answered %g (before: %g), "
                "hang verdicts %g\n", answered, probes,
                metric(router.port, "eldr_worker_hangs_total{role=\"decode\",worker=\"http://127.0.0.1:%d\"}", dport));
  assert_true(answered > probes);
  assert_int_equal(metric(router.port, "eldr_worker_hangs_total{role=\"decode\",worker=\"http://127.0.0.1:%d\"}", dport), 0);
  sf_child_stop(&router);
  teardown(NULL);
}

static void test_queue_timeout_ends_only_the_queued(void **st) {
  (void)st;
  /* the setting: a first-byte timeout shorter than the queue wait */
  const char *flags[] = {"--decode-first-byte-timeout", "0.8", NULL};
  job j[3];
  int dport;
  queued_case("2", flags, j, &dport);
  int ok = 0, ended = -1;
  for (int i = 0; i < 3; i++) {
    if (j[i].r.status == 200 && j[i].r.tokens == 800) ok++;
    else if (j[i].r.status == 504 && j[i].r.tokens == 0) ended = i;
    else fail_msg("stream %d: status %d, %d tokens: %s", i, j[i].r.status, j[i].r.tokens, j[i].r.err);
  }
  double ej = metric(router.port, "eldr_worker_ejections_total{role=\"decode\",worker=\"http://127.0.0.1:%d\"}", dport);
  double qto = rt_metric(router.port, "eldr_queue_timeouts_total");
  print_message("queued stream, decode-first-byte-timeout 0.8 s: %d streams complete (800 tokens each), stream %d "
                "ended alone with 504 (%s); ejections %g, queue timeouts %g\n",
                ok, ended, j[ended >= 0 ? ended : 0].r.err, ej, qto);
  assert_int_equal(ok, 2);
  assert_int_equal(ended, 2);
  assert_int_equal(ej, 0);
  assert_int_equal(qto, 1);
  sf_child_stop(&router);
  teardown(NULL);
}

static void test_sigstop_on_defaults(void **st) {
  (void)st;
  pid_t pp, da, db;
  int pport = spawn_worker("prefill", "1", "256", &pp);
  int aport = spawn_worker("decode", "1", "256", &da);
  int bport = spawn_worker("decode", "1", "256", &db);
  char purl[64], aurl[64], burl[64];
  eng_url(pport, purl, sizeof purl);
  eng_url(aport, aurl, sizeof aurl);
  eng_url(bport, burl, sizeof burl);
  /* every timing flag at its default */
  const char *args[] = {"--port", "0", "--prefill", purl, "--decode", aurl, "--decode", burl, "--policy", "jsq", NULL};
  sf_child_start(&router, 0, args);
  char ha[160], hb[160];
  snprintf(ha, sizeof ha, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", aurl);
  snprintf(hb, sizeof hb, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", burl);
  /* four long streams, two on each decoder (JSQ alternates) */
  enum { N = 4 };
  job j[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    j[i] = (job){router.port, 2000, 60, {0}};
    pthread_create(&th[i], NULL, stream_main, &j[i]);
    char s[160];
    snprintf(s, sizeof s, "eldr_worker_inflight{role=\"decode\",worker=\"%s\"}", i % 2 ? burl : aurl);
    if (rt_wait_metric(router.port, s, i / 2 + 1, 10)) fail_msg("stream %d did not start", i);
  }
  /* the streams are flowing; then decoder A stops */
  assert_int_equal(kill(da, SIGSTOP), 0);
  double t0 = fx_now();
  double t_eject = -1;
  for (double deadline = t0 + 20; fx_now() < deadline;) {
    if (rt_metric(router.port, ha) == 0) {
      t_eject = fx_now() - t0;
      break;
    }
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  double worst_a = 0;
  int on_a = 0, on_b = 0;
  for (int i = 0; i < N; i++) {
    if (j[i].r.engine == aport || (j[i].r.engine == 0 && j[i].r.status == 504)) {
      on_a++;
      if (j[i].r.status != 504) fail_msg("stream %d on the stopped decoder: status %d, %d tokens", i, j[i].r.status, j[i].r.tokens);
      if (j[i].r.t_end - t0 > worst_a) worst_a = j[i].r.t_end - t0;
    } else {
      on_b++;
      if (j[i].r.status != 200 || j[i].r.tokens != 2000)
        fail_msg("stream %d on the running decoder: status %d, %d of 2000 tokens: %s", i, j[i].r.status, j[i].r.tokens, j[i].r.err);
    }
  }
  double hangs = metric(router.port, "eldr_worker_hangs_total{role=\"decode\",worker=\"http://127.0.0.1:%d\"}", aport);
  print_message("SIGSTOP on defaults (hang window 5 s, probe 2 s, health checks every 2 s): decoder ejected %.2f s "
                "after the stop; its %d streams ended with 504 within %.2f s; the other decoder's %d streams complete; "
                "hang verdicts %g\n", t_eject, on_a, worst_a, on_b, hangs);
  if (t_eject < 0 || t_eject > 10) fail_msg("ejected after %.2f s (limit 10)", t_eject);
  if (worst_a > 10) fail_msg("a request on the stopped decoder lasted %.2f s after the stop", worst_a);
  assert_int_equal(on_a, 2);
  assert_int_equal(on_b, 2);
  assert_int_equal(hangs, 1);
  /* new requests go to B while A is out */
  for (int i = 0; i < 3; i++) {
    job k = {router.port, 4, 10, {0}};
    stream_main(&k);
    if (k.r.status != 200 || k.r.engine != bport) fail_msg("request after the ejection: %d on %d", k.r.status, k.r.engine);
  }
  /* continued: re-admitted by a health check */
  assert_int_equal(kill(da, SIGCONT), 0);
  assert_int_equal(rt_wait_metric(router.port, ha, 1, 10), 0);
  assert_int_equal(rt_metric(router.port, hb), 1);
  sf_child_stop(&router);
  teardown(NULL);
}

static void test_stopped_prefill_retried(void **st) {
  (void)st;
  pid_t pa, pb, d;
  int paport = spawn_worker("prefill", "1", "256", &pa);
  int pbport = spawn_worker("prefill", "1", "256", &pb);
  int dport = spawn_worker("decode", "1", "256", &d);
  char a[64], b[64], du[64];
  eng_url(paport, a, sizeof a);
  eng_url(pbport, b, sizeof b);
  eng_url(dport, du, sizeof du);
  const char *args[] = {"--port", "0", "--prefill", a, "--prefill", b, "--decode", du, "--hang-window", "1",
                        "--health-timeout", "0.5", "--health-interval", "30", NULL};
  sf_child_start(&router, 0, args);
  assert_int_equal(kill(pa, SIGSTOP), 0);
  /* prompts spread over both prefill workers by their prefix hash */
  enum { N = 8 };
  double t0 = fx_now(), worst = 0;
  for (int i = 0; i < N; i++) {
    char body[96];
    snprintf(body, sizeof body, "{\"prompt\":\"prompt number %d of the stopped prefill\",\"max_tokens\":4}", i);
    tc_resp r;
    double t = fx_now();
    assert_int_equal(tc_post_within(router.port, "/v1/completions", body, NULL, 20, &r), 0);
    if (r.status != 200) fail_msg("request %d: %d %s", i, r.status, r.body);
    tc_free(&r);
    if (fx_now() - t > worst) worst = fx_now() - t;
  }
  double hangs = metric(router.port, "eldr_worker_hangs_total{role=\"prefill\",worker=\"http://127.0.0.1:%d\"}", paport);
  double retried = rt_metric(router.port, "eldr_retries_total{leg=\"prefill\"}");
  print_message("stopped prefill worker, hang window 1 s: %d of %d requests 200 in %.2f s (slowest %.2f s); "
                "hang verdicts %g, prefill legs retried %g\n", N, N, fx_now() - t0, worst, hangs, retried);
  assert_int_equal(hangs, 1);
  assert_true(retried >= 1);
  sf_child_stop(&router);
  teardown(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_queued_stream_not_a_hang, teardown),
      cmocka_unit_test_teardown(test_queue_timeout_ends_only_the_queued, teardown),
      cmocka_unit_test_teardown(test_stopped_prefill_retried, teardown),
      cmocka_unit_test_teardown(test_sigstop_on_defaults, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
