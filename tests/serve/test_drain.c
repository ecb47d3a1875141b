/* test_drain.c — graceful shutdown of `eldr serve` (issue 26, item 3), every
 * piece a real process over real sockets (`eldr worker` engines, `eldr
 * serve` routers):
 *
 *   drain: streams in flight when SIGTERM arrives finish in full; /health
 *     answers 503 "draining" at once (asked on a connection opened before);
 *     a new connection is refused at once; an idle keep-alive connection
 *     is closed; the router exits 0 once the streams ended.
 *   second signal: a second SIGTERM exits at once (0), cutting the streams.
 *   shutdown timeout: streams longer than --shutdown-timeout are cut at it;
 *     the router exits 0 then.
 *   rolling restart: two replicas under closed-loop load (tests/support/
 *     lbclient.c: clients spread over the replicas as a load balancer
 *     does, retrying only a refused connection on the other replica, a new
 *     connection reset before any response byte (once), and with
 *     keep-alive a reused idle connection that closed before any response
 *     byte), each replica in turn SIGTERMed, replaced by a new
 *     process on its port once its listener closed, the old one left to
 *     drain and exit 0: zero failed requests, with and without keep-alive.
 *
 * Waiting is on conditions with deadlines, never on sleeps that must be
 * long enough. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "support/engines.h"
#include "support/fixture.h"
#include "support/lbclient.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

static sf_child routers[3];

static int teardown(void **st) {
  (void)st;
  for (int i = 0; i < 3; i++) sf_child_kill(&routers[i]);
  eng_stop_all();
  return 0;
}

static void nap(double s) { /* a poll interval, never a wait that must be long enough */
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Wait for the child's exit within timeout_s: its exit status, or -1. */
static int wait_exit(sf_child *ch, double timeout_s, double *at) {
  for (double deadline = fx_now() + timeout_s; fx_now() < deadline; nap(0.01)) {
    int st;
    if (waitpid(ch->pid, &st, WNOHANG) == ch->pid) {
      if (at) *at = fx_now();
      ch->pid = 0;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  return -1;
}

/* Until a connect to port is refused (the listener closed): seconds, or -1. */
static double refused_within(int port, double timeout_s) {
  double t0 = fx_now();
  for (double deadline = t0 + timeout_s; fx_now() < deadline; nap(0.005)) {
    int fd = tc_connect(port);
    if (fd < 0) return fx_now() - t0;
    close(fd);
  }
  return -1;
}

typedef struct job {
  int port, max_tokens;
  eng_stream r;
} job;

static void *stream_main(void *arg) {
  job *j = arg;
  eng_stream_post(j->port, "drain me gently", j->max_tokens, 60, &j->r);
  return NULL;
}

/* One prefill and one decode engine; a router child with extra flags. */
static void rig(sf_child *ch, const char *scale, const char *const *flags) {
  pid_t pp, dp;
  char purl[48], durl[48];
  eng_url(eng_start("prefill", scale, "256", &pp), purl, sizeof purl);
  eng_url(eng_start("decode", scale, "256", &dp), durl, sizeof durl);
  const char *args[24] = {"--port", "0", "--prefill", purl, "--decode", durl, "--threads", "2"};
  int n = 8;
  for (int i = 0; flags && flags[i]; i++) args[n++] = flags[i];
  args[n] = NULL;
  sf_child_start(ch, 0, args);
}

/* n streams of max_tokens started, in flight at the decoder. */
static void start_streams(sf_child *ch, job *j, pthread_t *th, int n, int max_tokens) {
  for (int i = 0; i < n; i++) {
    j[i] = (job){ch->port, max_tokens, {0}};
    pthread_create(&th[i], NULL, stream_main, &j[i]);
  }
  char s[128] = "eldr_worker_inflight{role=\"decode\"";
  /* every stream's decode leg is on the decoder (one decoder: its line) */
  for (double deadline = fx_now() + 20;; nap(0.02)) {
    tc_resp r;
    if (tc_get(ch->port, "/metrics", &r) == 0) {
      const char *p = strstr(r.body, s);
      double v = p ? atof(strchr(p, '}') + 1) : -1;
      tc_free(&r);
      if (v >= n) break;
    }
    if (fx_now() > deadline) fail_msg("the %d streams did not all reach the decoder", n);
  }
}

static void test_drain(void **st) {
  (void)st;
  sf_child *ch = &routers[0];
  const char *flags[] = {"--shutdown-timeout", "30", NULL};
  rig(ch, "1", flags);
  /* an idle keep-alive connection, and one with a request head half sent */
  int idle = tc_connect(ch->port), half = tc_connect(ch->port);
  assert_true(idle >= 0 && half >= 0);
  const char *get = "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
  assert_int_equal(send(idle, get, strlen(get), 0), (ssize_t)strlen(get));
  char buf[65536];
  tc_read_until(idle, buf, sizeof buf, "eldr_requests_total");
  const char *part = "GET /health HTTP/1.1\r\nHost: t\r\n";
  assert_int_equal(send(half, part, strlen(part), 0), (ssize_t)strlen(part));
  enum { N = 3 };
  job j[N];
  pthread_t th[N];
  start_streams(ch, j, th, N, 600); /* about 3 s each at time scale 1 */
  double t0 = fx_now();
  assert_int_equal(kill(ch->pid, SIGTERM), 0);
  double refused = refused_within(ch->port, 5);
  /* the half-sent request ends: /health says draining, and closes */
  assert_int_equal(send(half, "\r\n", 2, 0), 2);
  char hb[4096] = "";
  tc_read_until(half, hb, sizeof hb, "}");
  /* the idle keep-alive connection was closed */
  struct pollfd p = {idle, POLLIN, 0};
  int closed = poll(&p, 1, 5000) == 1 && recv(idle, buf, sizeof buf, 0) == 0;
  close(idle);
  close(half);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  double t_exit = 0, last = 0;
  int rc = wait_exit(ch, 30, &t_exit);
  for (int i = 0; i < N; i++) {
    if (j[i].r.status != 200 || j[i].r.tokens != 600 || !j[i].r.done)
      fail_msg("stream %d: %d, %d of 600 tokens, done %d", i, j[i].r.status, j[i].r.tokens, j[i].r.done);
    if (j[i].r.t_end > last) last = j[i].r.t_end;
  }
  print_message("SIGTERM with %d streams of 600 tokens in flight: new connections refused %.3f s after it, "
                "/health on an open connection: %.40s..., idle keep-alive connection %s; the streams finished "
                "in full %.2f s after it, the router exited %d %.2f s after the last one\n",
                N, refused, strstr(hb, "{") ? strstr(hb, "{") : hb, closed ? "closed" : "NOT closed", last - t0, rc,
                t_exit - last);
  assert_true(refused >= 0); /* within the 5 s it was given; the figure printed is what it took */
  assert_non_null(strstr(hb, "HTTP/1.1 503"));
  assert_non_null(strstr(hb, "\"status\":\"draining\""));
  assert_non_null(strstr(hb, "Connection: close"));
  assert_true(closed);
  assert_int_equal(rc, 0);
  assert_true(t_exit - last < 10); /* when its last stream ended, not at the 30 s timeout */
  unlink(ch->logpath);
  teardown(NULL);
}

static void test_second_signal(void **st) {
  (void)st;
  sf_child *ch = &routers[0];
  const char *flags[] = {"--shutdown-timeout", "60", NULL};
  rig(ch, "1", flags);
  job j[2];
  pthread_t th[2];
  start_streams(ch, j, th, 2, 20000); /* far longer than the test */
  assert_int_equal(kill(ch->pid, SIGTERM), 0);
  assert_true(refused_within(ch->port, 5) >= 0); /* the first took effect */
  double t1 = fx_now(), t_exit = 0;
  assert_int_equal(kill(ch->pid, SIGTERM), 0);
  char log[8192];
  eldr_test_read_into(ch->logpath, log, sizeof log);
  int rc = wait_exit(ch, 10, &t_exit);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  eldr_test_read_into(ch->logpath, log, sizeof log);
  print_message("second SIGTERM during the drain: exit %d %.3f s after it; the 2 streams were cut (%d, %d tokens)\n", rc,
                t_exit - t1, j[0].r.tokens, j[1].r.tokens);
  assert_int_equal(rc, 0);
  assert_true(t_exit - t1 < 10); /* at once, not at the 60 s timeout */
  assert_true(!j[0].r.done && !j[1].r.done);
  assert_non_null(strstr(log, "second stop signal"));
  unlink(ch->logpath);
  teardown(NULL);
}

static void test_shutdown_timeout(void **st) {
  (void)st;
  sf_child *ch = &routers[0];
  const char *flags[] = {"--shutdown-timeout", "1", NULL};
  rig(ch, "1", flags);
  job j[2];
  pthread_t th[2];
  start_streams(ch, j, th, 2, 20000);
  double t0 = fx_now(), t_exit = 0;
  assert_int_equal(kill(ch->pid, SIGTERM), 0);
  int rc = wait_exit(ch, 10, &t_exit);
  char log[8192];
  eldr_test_read_into(ch->logpath, log, sizeof log);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  print_message("--shutdown-timeout 1 with 2 endless streams: exit %d %.2f s after SIGTERM, the streams cut\n", rc,
                t_exit - t0);
  assert_int_equal(rc, 0);
  assert_true(t_exit - t0 >= 1 && t_exit - t0 < 15); /* at the timeout, not when the streams end */
  assert_true(!j[0].r.done && !j[1].r.done);
  assert_non_null(strstr(log, "shutdown timeout (1 s)"));
  unlink(ch->logpath);
  teardown(NULL);
}

/* Two replicas behind the load balancer client; each restarted in turn. */
static void rolling_restart(int keep_alive) {
  pid_t pp, d0, d1;
  char purl[48], durl0[48], durl1[48];
  eng_url(eng_start("prefill", "0.5", "256", &pp), purl, sizeof purl);
  eng_url(eng_start("decode", "0.5", "256", &d0), durl0, sizeof durl0);
  eng_url(eng_start("decode", "0.5", "256", &d1), durl1, sizeof durl1);
  char portbuf[2][16];
  for (int r = 0; r < 2; r++) {
    const char *args[] = {"--port", "0", "--prefill", purl, "--decode", durl0, "--decode", durl1,
                          "--threads", "2", "--shutdown-timeout", "30", NULL};
    sf_child_start(&routers[r], 0, args);
    snprintf(portbuf[r], sizeof portbuf[r], "%d", routers[r].port);
  }
  /* 16 clients, requests of 200 tokens (about half a second at time scale
   * 0.5), every other one streamed: a replica has several in flight when
   * its SIGTERM comes */
  lb_cfg cfg = {{routers[0].port, routers[1].port}, 2, 16, keep_alive, 200, 2, 30};
  lb_run run;
  lb_start(&run, &cfg);
  double t0 = fx_now();
  size_t before[2];
  int inflight[2];
  for (int r = 0; r < 2; r++) {
    /* load on both before each restart */
    size_t base = lb_done(&run);
    for (double deadline = fx_now() + 20; lb_done(&run) < base + 40; nap(0.01))
      if (fx_now() > deadline) fail_msg("the load made no progress");
    before[r] = lb_done(&run);
    sf_child old = routers[r];
    assert_int_equal(kill(old.pid, SIGTERM), 0);
    if (refused_within(old.port, 5) < 0) fail_msg("replica %d kept its listener after SIGTERM", r);
    /* the new process takes the port while the old one drains */
    const char *args[] = {"--port", portbuf[r], "--prefill", purl, "--decode", durl0, "--decode", durl1,
                          "--threads", "2", "--shutdown-timeout", "30", NULL};
    sf_child_start(&routers[2], 0, args);
    int rc = wait_exit(&old, 30, NULL);
    char log[8192];
    eldr_test_read_into(old.logpath, log, sizeof log);
    const char *dl = strstr(log, "s: the ");
    inflight[r] = dl ? atoi(dl + 7) : -1; /* "drained in X s: the N connections busy at the signal finished" */
    unlink(old.logpath);
    if (rc != 0) fail_msg("the old replica %d exited %d after its drain", r, rc);
    routers[r] = routers[2];
    memset(&routers[2], 0, sizeof routers[2]);
  }
  /* and load on both new ones */
  size_t base = lb_done(&run);
  for (double deadline = fx_now() + 20; lb_done(&run) < base + 40; nap(0.01))
    if (fx_now() > deadline) fail_msg("the load made no progress after the restarts");
  lb_stats st;
  lb_stop(&run, &st);
  print_message("rolling restart of 2 replicas under load (16 closed-loop clients, %s, 200-token requests, every "
                "other one streamed): %zu requests in %.1f s, %zu failed; requests in flight at each SIGTERM "
                "(drained, finished) %d and %d; %zu connections refused and sent to the other replica, %zu reused connections "
                "closed before a response byte and sent again, %zu new connections reset before a response byte and "
                "sent to the other replica; answered %zu / %zu by replica 0 / 1\n",
                keep_alive ? "keep-alive" : "a connection per request", st.requests, fx_now() - t0, st.failed,
                inflight[0], inflight[1], st.refused_retries, st.stale_retries, st.fresh_retries, st.per_replica[0], st.per_replica[1]);
  if (st.failed) fail_msg("%zu failed requests; the first: %s", st.failed, st.first_error);
  assert_true(st.ok > before[1]);
  for (int r = 0; r < 2; r++) sf_child_stop(&routers[r]);
  teardown(NULL);
}

static void test_rolling_restart(void **st) {
  (void)st;
  rolling_restart(0);
}

static void test_rolling_restart_keepalive(void **st) {
  (void)st;
  rolling_restart(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_drain, teardown),
      cmocka_unit_test_teardown(test_second_signal, teardown),
      cmocka_unit_test_teardown(test_shutdown_timeout, teardown),
      cmocka_unit_test_teardown(test_rolling_restart, teardown),
      cmocka_unit_test_teardown(test_rolling_restart_keepalive, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
