/* test_bus.c — the fleet bus over a real nats-server (started here on a
 * free loopback port; no mock): router replicas in front of the same
 * fixture workers share every decoder's requests in flight and footprint
 * weights.
 *   - convergence: what replica A routes, replica B sees (its /eldr/status
 *     per decoder) and decides by (footprint sends B's request to the
 *     decoder whose live experts A's streams hold, where B alone would
 *     pick the other), and the ends take it away again;
 *   - a late joiner converges from the others' snapshots;
 *   - a replica killed (SIGKILL, no goodbye) has its contributions expire
 *     after the peer timeout; one stopped (SIGTERM) at once;
 *   - the bus killed mid-run: every replica says so (/health, /eldr/status,
 *     /metrics), falls back to its own view and keeps serving; the bus
 *     restarted on the same port: the replicas reconnect and converge.
 * Replica A runs as `eldr serve` processes, B in this process (its threads
 * under the sanitizers). The figures printed (convergence and expiry
 * times, lag) are measurements; the bounds asserted are generous (10 s). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/latency.h"
#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

static const eldr_shape SH = {4, 8, 2};

/* ---- nats-server ------------------------------------------------------------------ */

typedef struct natsd {
  pid_t pid;
  int port;
} natsd;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l))
    fail_msg("no free port");
  close(fd);
  return ntohs(a.sin_port);
}

/* Ready when it answers a connection with its INFO line. */
static int natsd_ready(int port, double timeout_s) {
  for (double end = fx_now() + timeout_s; fx_now() < end;) {
    int fd = tc_connect(port);
    if (fd >= 0) {
      char buf[8] = "";
      struct timeval tv = {1, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ssize_t k = recv(fd, buf, 4, MSG_WAITALL);
      close(fd);
      if (k == 4 && !memcmp(buf, "INFO", 4)) return 1;
    }
    usleep(20000); /* a poll interval, not a bet: the deadline decides */
  }
  return 0;
}

/* nats-server on port (0: a free one) */
static void natsd_start(natsd *n, int port) {
  n->port = port ? port : free_port();
  char ps[16];
  snprintf(ps, sizeof ps, "%d", n->port);
  n->pid = fork();
  if (n->pid < 0) fail_msg("fork");
  if (n->pid == 0) {
    int dn = open("/dev/null", O_WRONLY);
    dup2(dn, 1);
    dup2(dn, 2);
    for (int fd = 3; fd < 4096; fd++) close(fd); /* the test's sockets stay the test's */
    execlp("nats-server", "nats-server", "-a", "127.0.0.1", "-p", ps, (char *)NULL);
    _exit(127);
  }
  if (!natsd_ready(n->port, 10)) {
    int st;
    kill(n->pid, SIGKILL);
    waitpid(n->pid, &st, 0);
    fail_msg("nats-server did not start on port %d (is it installed? scripts/deps.sh installs it)", n->port);
  }
}

static void natsd_kill(natsd *n) {
  if (n->pid <= 0) return;
  int st;
  kill(n->pid, SIGKILL);
  waitpid(n->pid, &st, 0);
  n->pid = 0;
}

/* ---- the cluster ---------------------------------------------------------------------- */

static char *make_artifact(void) {
  eldr_artifact *a = eldr_artifact_new("fixture", &SH, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  assert_non_null(a);
  for (size_t c = 0; c < 2; c++) {
    for (size_t l = 0; l < SH.num_layers; l++)
      for (size_t e = 0; e < SH.num_experts; e++) a->centroids[c * a->dim + l * SH.num_experts + e] = (e / 4 == c) ? 0.25f : 0.0f;
    a->cluster_sizes[c] = 1;
  }
  a->tau = 0.1;
  a->fit_n = 2;
  a->fit_balanced = 1;
  eldr_diag d = {{0}};
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h200", &m, &d), 0);
  m.shape = SH;
  assert_int_equal(eldr_artifact_set_latency(a, &m, &d), 0);
  char *path = malloc(256);
  snprintf(path, 256, "/tmp/eldr_test_bus_%d.json", (int)getpid());
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  eldr_artifact_free(a);
  return path;
}

typedef struct cluster {
  natsd nd;
  char url[64];
  char *art, *lo, *hi;
  fx_behaviour pb, hold;
  sf_rig b; /* replica B (in process) and the workers */
  int b_running;
} cluster;

static void cluster_up(cluster *c) {
  memset(c, 0, sizeof *c);
  natsd_start(&c->nd, 0);
  snprintf(c->url, sizeof c->url, "nats://127.0.0.1:%d", c->nd.port);
  c->art = make_artifact();
  c->lo = sf_routed(&SH, 5, 0);
  c->hi = sf_routed(&SH, 5, 6);
  c->pb = fx_defaults();
  c->pb.routed_experts = c->lo;
  c->hold = fx_defaults();
  c->hold.stall_after_chunks = 1;
  sf_start(&c->b, 1, &c->pb, 2, &c->hold);
}

static void b_start(cluster *c) {
  sf_config(&c->b);
  c->b.c.threads = 1; /* B's figures come from one loop's view */
  c->b.c.policy = ELDR_POLICY_FOOTPRINT;
  c->b.c.artifact = strdup(c->art);
  c->b.c.bus = strdup(c->url);
  c->b.c.bus_replica_id = strdup("B");
  c->b.c.bus_snapshot_s = 0.25;
  c->b.c.bus_peer_timeout_s = 1;
  sf_run(&c->b);
  c->b_running = 1;
}

/* Replica `id` as an `eldr serve` process over the same workers. */
static void child_start(cluster *c, sf_child *ch, const char *id, int threads) {
  char ts[8];
  snprintf(ts, sizeof ts, "%d", threads);
  const char *args[] = {"--port", "0", "--prefill", c->b.purl[0], "--decode", c->b.durl[0], "--decode",
                        c->b.durl[1], "--artifact", c->art, "--policy", "footprint", "--threads", ts,
                        "--health-interval", "0", "--bus", c->url, "--bus-replica-id", id,
                        "--bus-snapshot-interval", "0.25", "--bus-peer-timeout", "1", NULL};
  sf_child_start(ch, 0, args);
}

static void cluster_down(cluster *c) {
  if (c->b_running) sf_free(&c->b);
  natsd_kill(&c->nd);
  unlink(c->art);
  free(c->art);
  free(c->lo);
  free(c->hi);
}

static json_t *status(int port) {
  tc_resp r;
  assert_int_equal(tc_get(port, "/eldr/status", &r), 0);
  assert_int_equal(r.status, 200);
  json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
  if (!j) fail_msg("not JSON: %s", r.body);
  tc_free(&r);
  return j;
}

static long long busnum(json_t *st, const char *key) {
  return json_integer_value(json_object_get(json_object_get(st, "bus"), key));
}

/* Peer requests in flight on decoder k as port's replica sees them. */
static long long peers_on(json_t *st, size_t k) {
  json_t *d = json_array_get(json_object_get(json_object_get(st, "bus"), "decoders"), k);
  return json_integer_value(json_object_get(d, "peers_in_flight"));
}

/* Wait until port's replica sees want0 and want1 peer requests on the two
 * decoders and `peers` peers: seconds it took, or fail after 10 s. */
static double wait_view(int port, long long peers, long long want0, long long want1) {
  double t0 = fx_now();
  for (;;) {
    json_t *st = status(port);
    int ok = busnum(st, "peers") == peers && peers_on(st, 0) == want0 && peers_on(st, 1) == want1;
    long long p = busnum(st, "peers"), a = peers_on(st, 0), b = peers_on(st, 1);
    char *bj = json_dumps(json_object_get(st, "bus"), JSON_COMPACT);
    char stc[1024];
    snprintf(stc, sizeof stc, "%s", bj ? bj : "?");
    free(bj);
    json_decref(st);
    if (ok) return fx_now() - t0;
    if (fx_now() - t0 > 10)
      fail_msg("replica on %d: peers %lld, in flight %lld/%lld (want %lld, %lld/%lld), bus %s", port, p, a, b, peers,
               want0, want1, stc);
  }
}

static const char *STREAM =
    "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 28\r\n\r\n{\"prompt\":\"a\",\"stream\":true}";

/* A streaming request held open after its first chunk (its decode leg in flight). */
static int held_stream(int port) {
  int fd = tc_send_raw(port, STREAM);
  assert_true(fd >= 0);
  char buf[8192];
  tc_read_until(fd, buf, sizeof buf, "data:");
  if (strncmp(buf, "HTTP/1.1 200", 12) || !strstr(buf, "data:")) fail_msg("stream: [%s]", buf);
  return fd;
}

static void set_experts(cluster *c, const char *re) {
  c->pb.routed_experts = re;
  fx_set(c->b.p[0], &c->pb);
}

/* ---- the cases ------------------------------------------------------------------------ */

static void test_converge_and_decide(void **st) {
  (void)st;
  cluster c;
  cluster_up(&c);
  b_start(&c);
  sf_child a;
  child_start(&c, &a, "A", 1);
  wait_view(c.b.r.port, 1, 0, 0);
  /* A: a stream on experts 0,1 (decoder 0, the tie's lower index), one on 6,7 (decoder 1, empty) */
  set_experts(&c, c.lo);
  int x = held_stream(a.port);
  set_experts(&c, c.hi);
  int y = held_stream(a.port);
  assert_int_equal(fx_count(c.b.d[0], "/v1/completions"), 1);
  assert_int_equal(fx_count(c.b.d[1], "/v1/completions"), 1);
  double seen = wait_view(c.b.r.port, 1, 1, 1);
  /* B alone would send 6,7 to decoder 0 (both empty: lower index); with
   * A's footprints it takes decoder 1, whose live experts it shares */
  assert_int_equal(sf_post_served_by(c.b.r.port), fx_port(c.b.d[1]));
  set_experts(&c, c.lo);
  assert_int_equal(sf_post_served_by(c.b.r.port), fx_port(c.b.d[0]));
  close(x);
  close(y);
  double gone = wait_view(c.b.r.port, 1, 0, 0);
  json_t *s = status(c.b.r.port);
  json_t *lag = json_object_get(json_object_get(s, "bus"), "lag_seconds");
  printf("A's two streams seen by B within %.3f s of the second's first byte (B polled); their ends within %.3f s; "
         "B's lag p50 <= %g s, p99 <= %g s, max %.6f s over %lld messages\n",
         seen, gone, json_number_value(json_object_get(lag, "p50_le")), json_number_value(json_object_get(lag, "p99_le")),
         json_number_value(json_object_get(lag, "max")), (long long)json_integer_value(json_object_get(lag, "messages")));
  assert_int_equal(busnum(s, "gaps"), 0);
  json_decref(s);
  assert_int_equal(rt_metric(c.b.r.port, "eldr_bus_state{state=\"up\"}"), 1);
  assert_int_equal(rt_metric(c.b.r.port, "eldr_bus_fallback"), 0);
  sf_child_stop(&a);
  cluster_down(&c);
}

static void test_late_joiner_and_death(void **st) {
  (void)st;
  cluster c;
  cluster_up(&c);
  sf_child a, k;
  child_start(&c, &a, "A", 2); /* two loops: its ends and routes from both */
  set_experts(&c, c.lo);
  int x = held_stream(a.port);
  set_experts(&c, c.hi);
  int y = held_stream(a.port);
  /* B joins late: the others' snapshots bring it up to date */
  double t0 = fx_now();
  b_start(&c);
  wait_view(c.b.r.port, 1, 1, 1);
  double joined = fx_now() - t0;
  /* a third replica K holds one more on decoder 0, then dies without a word */
  child_start(&c, &k, "K", 1);
  wait_view(c.b.r.port, 2, 1, 1);
  set_experts(&c, c.lo);
  int z = held_stream(k.port);
  wait_view(c.b.r.port, 2, 2, 1);
  t0 = fx_now();
  int ws;
  kill(k.pid, SIGKILL);
  waitpid(k.pid, &ws, 0);
  k.pid = 0;
  double expired = wait_view(c.b.r.port, 1, 1, 1);
  close(z);
  /* A stopped (SIGTERM): its goodbye expires it at once; its streams end */
  close(x);
  close(y);
  wait_view(c.b.r.port, 1, 0, 0);
  t0 = fx_now();
  sf_child_stop(&a);
  double bye = wait_view(c.b.r.port, 0, 0, 0);
  printf("late joiner converged %.3f s after its start; a killed replica expired after %.3f s (peer timeout 1 s); "
         "a stopped one after %.3f s\n", joined, expired, bye);
  assert_true(expired >= 0.5); /* not before the timeout's silence */
  assert_true(rt_metric(c.b.r.port, "eldr_bus_peers_expired_total") >= 2);
  unlink(k.logpath);
  cluster_down(&c);
}

static void test_bus_killed_and_restarted(void **st) {
  (void)st;
  cluster c;
  cluster_up(&c);
  b_start(&c);
  sf_child a;
  child_start(&c, &a, "A", 1);
  wait_view(c.b.r.port, 1, 0, 0);
  set_experts(&c, c.lo);
  int x = held_stream(a.port);
  wait_view(c.b.r.port, 1, 1, 0);
  int port = c.nd.port;
  double t0 = fx_now();
  natsd_kill(&c.nd);
  /* B falls back to its own view: says so everywhere, keeps serving */
  double fell;
  for (;;) {
    tc_resp r;
    assert_int_equal(tc_get(c.b.r.port, "/health", &r), 0);
    json_t *h = json_loadb(r.body, r.body_len, 0, NULL);
    tc_free(&r);
    const char *bst = json_string_value(json_object_get(json_object_get(h, "bus"), "state"));
    int down = bst && !strcmp(bst, "down");
    if (down) assert_string_equal(json_string_value(json_object_get(json_object_get(h, "bus"), "fallback")),
                                  "own view plus scraping");
    json_decref(h);
    if (down) break;
    if (fx_now() - t0 > 10) fail_msg("B did not notice the bus was gone within 10 s");
  }
  fell = fx_now() - t0;
  json_t *s = status(c.b.r.port);
  assert_string_equal(json_string_value(json_object_get(json_object_get(s, "bus"), "state")), "down");
  assert_true(json_is_true(json_object_get(json_object_get(s, "bus"), "fallback")));
  assert_int_equal(peers_on(s, 0), 0); /* A's contributions left B's decisions */
  json_decref(s);
  assert_int_equal(rt_metric(c.b.r.port, "eldr_bus_fallback"), 1);
  assert_int_equal(rt_metric(c.b.r.port, "eldr_bus_state{state=\"down\"}"), 1);
  for (int i = 0; i < 4; i++) assert_true(sf_post_served_by(c.b.r.port) > 0);
  /* the bus back on the same port: both reconnect, B sees A's stream again */
  t0 = fx_now();
  natsd_start(&c.nd, port);
  double back = wait_view(c.b.r.port, 1, 1, 0);
  printf("bus killed: B reported it down (fallback) after %.3f s and served 4/4 requests meanwhile; bus restarted: "
         "B converged again (A's stream in view) %.3f s after its start\n", fell, back);
  assert_int_equal(rt_metric(c.b.r.port, "eldr_bus_fallback"), 0);
  close(x);
  wait_view(c.b.r.port, 1, 0, 0);
  sf_child_stop(&a);
  cluster_down(&c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_converge_and_decide),
      cmocka_unit_test(test_late_joiner_and_death),
      cmocka_unit_test(test_bus_killed_and_restarted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
