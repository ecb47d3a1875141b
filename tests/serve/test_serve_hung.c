/* test_serve_hung.c — a hung decoder: a real `eldr worker` process stopped
 * with SIGSTOP behind the real (in-process) router, with a short hang
 * window. Its legs (streaming and not) end with 504 once the window passed
 * without progress and its probe went unanswered, it is ejected, no
 * request hangs, and it is re-admitted after SIGCONT. test_hang.c runs the
 * same on the defaults, every process separate. */
#include <jansson.h>
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
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "support/proc.h"
#include "worker/wtest.h"

static pid_t child = -1;

static int kill_child(void **st) {
  (void)st;
  if (child > 0) {
    kill(child, SIGCONT);
    wt_kill(child);
  }
  child = -1;
  return 0;
}

typedef struct post_job {
  int port;
  int stream;
  int status;
  double secs;
} post_job;

static void *post_main(void *arg) {
  post_job *j = arg;
  tc_resp r;
  double t0 = fx_now();
  const char *body = j->stream ? "{\"prompt\":\"a b c\",\"max_tokens\":4,\"stream\":true}"
                               : "{\"prompt\":\"a b c\",\"max_tokens\":4}";
  j->status = tc_post(j->port, "/v1/completions", body, NULL, &r) == 0 ? r.status : -1;
  j->secs = fx_now() - t0;
  if (j->status >= 0) {
    /* a stream that started is ended by an error event: count it as 504 */
    if (j->status == 200 && j->stream && strstr(r.body, "\"code\":504")) j->status = 504;
    tc_free(&r);
  }
  return NULL;
}

static void test_sigstopped_decoder(void **st) {
  (void)st;
  char *argv[] = {(char *)eldr_test_binary(), "worker", "--role", "decode", "--port", "0", "--time-scale", "0.01", NULL};
  char line[256];
  child = wt_spawn(argv, line, sizeof line, 20);
  assert_true(child > 0);
  int hport = wt_port_of(line);
  assert_true(hport > 0);
  eldr_worker_config wc;
  eldr_worker_config_default(&wc);
  wc.time_scale = 0.01;
  sf_rig g; /* one prefill and one decode engine; the stopped child is the other decoder */
  sf_start_engines(&g, 1, &wc, 1, &wc);
  eldr_serve_config *c = &g.c;
  c->policy = ELDR_POLICY_RR;
  c->health_interval_s = 0.2;
  c->health_timeout_s = 0.3; /* one health check's (and hang probe's) bound */
  c->hang_window_s = 1;
  c->retries = 1;
  char hurl[64];
  snprintf(hurl, sizeof hurl, "http://127.0.0.1:%d", hport);
  assert_int_equal(eldr_serve_config_add_worker(c, 1, hurl, NULL), 0);
  sf_run(&g);
  /* both decoders serve */
  for (int i = 0; i < 4; i++) {
    post_job j = {g.r.port, i & 1, 0, 0};
    post_main(&j);
    assert_int_equal(j.status, 200);
  }
  char series[256];
  snprintf(series, sizeof series, "eldr_worker_ejections_total{role=\"decode\",worker=\"%s\"}", hurl);
  assert_int_equal(rt_metric(g.r.port, series), 0);
  /* stopped: the kernel still accepts its connections, nothing answers */
  assert_int_equal(kill(child, SIGSTOP), 0);
  double t0 = fx_now();
  enum { N = 12 };
  post_job jobs[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (post_job){g.r.port, i % 3 != 0, 0, 0};
    pthread_create(&th[i], NULL, post_main, &jobs[i]);
  }
  int n504 = 0, n200 = 0;
  double worst = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    if (jobs[i].status == 504) n504++;
    else if (jobs[i].status == 200) n200++;
    else fail_msg("request %d: status %d after %.2fs\n%s", i, jobs[i].status, jobs[i].secs, rt_log_text(&g.r));
    if (jobs[i].secs > worst) worst = jobs[i].secs;
  }
  /* no request hangs: every one answered within the hang window and probe plus slack */
  if (worst > 4) fail_msg("a request took %.2fs\n%s", worst, rt_log_text(&g.r));
  assert_true(n504 >= 1);
  assert_int_equal(n504 + n200, N);
  assert_int_equal(rt_metric(g.r.port, series), 1);
  snprintf(series, sizeof series, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", hurl);
  assert_int_equal(rt_metric(g.r.port, series), 0);
  double ejected_after = fx_now() - t0;
  print_message("SIGSTOPped decoder: %d of %d requests 504, %d served elsewhere, slowest %.2fs, ejected within %.2fs\n",
                n504, N, n200, worst, ejected_after);
  /* later requests go to the other decoder */
  for (int i = 0; i < 4; i++) {
    post_job j = {g.r.port, 1, 0, 0};
    post_main(&j);
    assert_int_equal(j.status, 200);
  }
  /* continued: health checks re-admit it */
  assert_int_equal(kill(child, SIGCONT), 0);
  assert_int_equal(rt_wait_metric(g.r.port, series, 1, 10), 0);
  sf_free(&g);
  kill_child(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_sigstopped_decoder, kill_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
