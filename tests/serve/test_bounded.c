/* test_bounded.c — the router's bounded resources and readiness, with real
 * sockets and, where memory or file descriptors are measured, the router as
 * a child process (`eldr serve`, its RSS and CPU read from /proc):
 *   - a connection limit: 503 JSON when full, served again once below;
 *   - fd exhaustion (a lowered RLIMIT_NOFILE): the router keeps a reserve of
 *     fds for the legs of the connections it accepted (new clients wait in
 *     the backlog), does not spin, logs a bounded number of bytes, and
 *     serves once fds free;
 *   - a streaming client that never reads keeps the router's RSS bounded;
 *   - 20 concurrent 16 MiB bodies: the memory goes back afterwards;
 *   - /health is 503 until a prefill and a decode worker answered;
 *   - a reload that changes the policy does not relabel past counts. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

/* A TCP connection to the router that sends nothing (yet). */
static int idle_conn(int port) {
  int fd = tc_connect(port);
  assert_true(fd >= 0);
  return fd;
}

/* The router as a child process (sf_child); killed by the teardown when a
 * test fails before it stopped it. */
static sf_child ch;

static int kill_child(void **st) {
  (void)st;
  sf_child_kill(&ch);
  return 0;
}

/* A field of /proc/PID/status in KiB (VmRSS, VmHWM). */
static long proc_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  long v = -1;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, fl) && line[fl] == ':') v = atol(line + fl + 1);
  fclose(f);
  assert_true(v >= 0);
  return v;
}

/* CPU seconds (user + system) the process used so far. */
static double proc_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* fields after the command name */
  assert_non_null(p);
  unsigned long ut = 0, stt = 0;
  assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt), 2);
  return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static long file_size(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  return n;
}

/* ---- connection limit ---------------------------------------------------------- */

static void test_connection_limit(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  g.c.threads = 1; /* the limit is split among the loops; the test counts one loop's */
  g.c.max_connections = 2;
  sf_run(&g);
  int a = idle_conn(g.r.port);
  /* A and the scrape itself */
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_connections_open", 2, 10), 0);
  assert_int_equal(rt_metric(g.r.port, "eldr_connections_max"), 2);
  int b = idle_conn(g.r.port); /* accepted before the next one (the backlog is FIFO) */
  tc_resp resp;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 503);
  assert_non_null(strstr(resp.body, "\"error\""));
  assert_non_null(strstr(resp.body, "limit of 2 connections"));
  assert_true(resp.closed);
  tc_free(&resp);
  assert_int_equal(fx_count(g.p[0], "/v1/completions"), 0);
  close(a);
  close(b);
  /* below the limit again once the router saw them close */
  int served = 0;
  for (double t = fx_now() + 10; !served && fx_now() < t;) {
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
    served = resp.status == 200;
    tc_free(&resp);
  }
  assert_true(served);
  assert_true(rt_metric(g.r.port, "eldr_connections_refused_total") >= 1);
  sf_free(&g);
}

/* ---- fd exhaustion -------------------------------------------------------------- */

#define NOFILE 64
#define HOLD 120 /* connections held open: more than the router has fds */

/* The router's log, whole (at most 64 KiB; the caller frees it). */
static char *read_log(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *log = calloc(1, 65536);
  assert_non_null(log);
  size_t ln = fread(log, 1, 65535, f);
  fclose(f);
  log[ln] = 0;
  return log;
}

/* The router as a child with RLIMIT_NOFILE NOFILE and `threads` loops. */
static void start_nofile_router(sf_rig *g, const char *threads) {
  sf_start(g, 1, NULL, 1, NULL);
  const char *args[] = {"--port", "0", "--prefill", g->purl[0], "--decode", g->durl[0], "--health-interval", "0",
                        "--max-connections", "100000", "--threads", threads, NULL};
  /* under ThreadSanitizer this router gets tests/tsan-nofile.supp: with
   * its fds exhausted TSan cannot symbolize, so tests/tsan.supp's rule by
   * function name cannot match (that file says why) */
  const char *tsan = getenv("TSAN_OPTIONS");
  char *saved = tsan ? strdup(tsan) : NULL;
  const char *at = tsan ? strstr(tsan, "tsan.supp") : NULL;
  if (at) {
    char opts[4096];
    snprintf(opts, sizeof opts, "%.*stsan-nofile.supp%s", (int)(at - tsan), tsan, at + strlen("tsan.supp"));
    setenv("TSAN_OPTIONS", opts, 1);
  }
  sf_child_start(&ch, NOFILE, args);
  if (saved) setenv("TSAN_OPTIONS", saved, 1);
  free(saved);
}

static const char WAITING_REQ[] =
    "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 14\r\nConnection: close\r\n\r\n{\"prompt\":\"a\"}";

/* A request sent now on a new connection waits in the backlog: no answer
 * for 2 s, and meanwhile the router neither spins (CPU) nor floods its log
 * (since log0 bytes). The connection. */
static int send_waiting(long log0, int held) {
  int waiting = idle_conn(ch.port);
  assert_int_equal(send(waiting, WAITING_REQ, strlen(WAITING_REQ), MSG_NOSIGNAL), (ssize_t)strlen(WAITING_REQ));
  double cpu0 = proc_cpu_s(ch.pid);
  double t0 = fx_now();
  struct pollfd pw = {waiting, POLLIN, 0};
  assert_int_equal(poll(&pw, 1, 2000), 0); /* no answer while fds are exhausted */
  double cpu = proc_cpu_s(ch.pid) - cpu0, wall = fx_now() - t0;
  long logged = file_size(ch.logpath) - log0;
  fprintf(stderr, "fd exhaustion (RLIMIT_NOFILE %d, %d connections held): router CPU %.2f s over %.2f s, "
                  "log %ld bytes\n", NOFILE, held, cpu, wall, logged);
  assert_true(cpu < 0.5 * wall); /* spinning on accept() would be ~1 s/s */
  assert_true(logged < 2048);    /* one line per 10 s at most */
  return waiting;
}

/* The waiting connection's whole answer (10 s at most), then closed. */
static void read_answer(int waiting, char *buf, size_t cap) {
  size_t got = 0;
  for (double t = fx_now() + 10; fx_now() < t && got < cap - 1;) {
    struct pollfd q = {waiting, POLLIN, 0};
    if (poll(&q, 1, 200) <= 0) continue;
    ssize_t k = recv(waiting, buf + got, cap - 1 - got, 0);
    if (k <= 0) break;
    got += (size_t)k;
  }
  buf[got] = 0;
  close(waiting);
}

/* Clients hold more idle connections than the router has fds, over two
 * event loops: the router stops accepting (its fd reserve pauses the
 * listeners; accept() failing EMFILE would back them off), a request that
 * waits meanwhile is answered once the clients close theirs. */
static void test_fd_exhaustion(void **st) {
  (void)st;
  sf_rig g;
  start_nofile_router(&g, "2");
  tc_resp resp;
  assert_int_equal(tc_post(ch.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  long log0 = file_size(ch.logpath);
  /* exhaust its fds: the rest wait in the listen backlog */
  int held[HOLD];
  for (int i = 0; i < HOLD; i++) held[i] = idle_conn(ch.port);
  int waiting = send_waiting(log0, HOLD);
  /* fds free up: the waiting request is answered, new ones are served */
  for (int i = 0; i < HOLD; i++) close(held[i]);
  char buf[4096];
  read_answer(waiting, buf, sizeof buf);
  assert_non_null(strstr(buf, "HTTP/1.1 200"));
  assert_int_equal(tc_post(ch.port, "/v1/completions", "{\"prompt\":\"b\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  /* stopped by the reserve (each loop pauses its own listener), or by
   * accept() failing where a loop got there first */
  double paused = rt_metric(ch.port, "eldr_accept_paused_total"), errors = rt_metric(ch.port, "eldr_accept_errors_total");
  fprintf(stderr, "fd exhaustion, 2 loops: eldr_accept_paused_total %g, eldr_accept_errors_total %g\n", paused, errors);
  assert_true(paused >= 1 || errors >= 1);
  assert_true(rt_wait_metric_le(ch.port, "eldr_accept_paused_loops", 0, 10) == 0); /* resumed */
  char *log = read_log(ch.logpath);
  /* the reserve for 2 loops: 4 each + 4 (accept.c, docs/serve.md) */
  if (paused >= 1) assert_non_null(strstr(log, ": at most 12 of the 64 file descriptors (RLIMIT_NOFILE) free"));
  if (errors >= 1) assert_non_null(strstr(log, "accept failed: Too many open files"));
  free(log);
  sf_child_stop(&ch);
  sf_free(&g);
}

/* The reserve itself, on one loop, deterministically: clients hold
 * answered connections until the router pauses its listener (the log
 * says so before the answer of the connection that brought it there), a
 * request waits in the backlog, and ONE held connection closes. The router
 * then has the descriptor that closed for the waiting connection and its
 * reserve for the request's legs: 200. Without the reserve it ran into
 * EMFILE instead, and the one descriptor freed went to the connection,
 * none was left for its prefill leg: 502 "no socket for the worker". */
static void test_fd_reserve(void **st) {
  (void)st;
  sf_rig g;
  start_nofile_router(&g, "1");
  tc_resp resp;
  assert_int_equal(tc_get(ch.port, "/metrics", &resp), 0); /* no leg yet: no pooled upstream connection */
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  long log0 = file_size(ch.logpath);
  int held[NOFILE];
  int n = 0, paused = 0;
  const char *hreq = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
  while (!paused) {
    assert_true(n < NOFILE); /* the router stops accepting before its fds run out */
    int fd = held[n++] = idle_conn(ch.port);
    assert_int_equal(send(fd, hreq, strlen(hreq), MSG_NOSIGNAL), (ssize_t)strlen(hreq));
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 10000), 1); /* accepted and answered */
    char buf[512];
    assert_true(recv(fd, buf, sizeof buf, 0) > 0);
    char *log = read_log(ch.logpath);
    /* the reserve for 1 loop: 4 + 4 (accept.c, docs/serve.md) */
    paused = strstr(log + log0, "accept paused on loop 0: at most 8 of the 64 file descriptors") != NULL;
    free(log);
  }
  int waiting = send_waiting(log0, n);
  close(held[0]);
  char buf[4096];
  read_answer(waiting, buf, sizeof buf);
  fprintf(stderr, "fd reserve: paused after %d connections; the waiting request after one closed: %.40s\n", n, buf);
  assert_non_null(strstr(buf, "HTTP/1.1 200"));
  for (int i = 1; i < n; i++) close(held[i]);
  assert_int_equal(tc_post(ch.port, "/v1/completions", "{\"prompt\":\"b\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  /* paused twice: the waiting connection took the closed one's descriptor,
   * a hole below the reserve, and the probe after it (tight: within 10 s of
   * the first pause) found the next free one in the reserve */
  assert_true(rt_metric(ch.port, "eldr_accept_paused_total") >= 2);
  assert_int_equal(rt_metric(ch.port, "eldr_accept_errors_total"), 0); /* never ran into EMFILE */
  sf_child_stop(&ch);
  sf_free(&g);
}

/* ---- a streaming client that never reads --------------------------------------- */

#define STREAM_BYTES (1024u << 20) /* what the decoder would send: 1 GiB */
#define RSS_BOUND_KB (16 * 1024)   /* the router's growth allowed over the test */
/* what the kernel's socket buffers on the way may hold (decoder -> router ->
 * client, autotuned up to a few MiB each) plus the router's stream_buffer */
#define SENT_BOUND (32u << 20)

static void test_slow_reader_bounded(void **st) {
  (void)st;
  fx_behaviour db = fx_defaults();
  db.stream_bytes = STREAM_BYTES;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, &db);
  fx_worker *d = g.d[0];
  const char *args[] = {"--port", "0", "--prefill", g.purl[0], "--decode", g.durl[0], "--health-interval", "0",
                        "--stream-buffer", "262144", NULL};
  sf_child_start(&ch, 0, args);
  tc_resp resp;
  assert_int_equal(tc_get(ch.port, "/metrics", &resp), 0); /* warm */
  tc_free(&resp);
  long rss0 = proc_kb(ch.pid, "VmRSS");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)ch.port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  const char *body = "{\"prompt\":\"a\",\"stream\":true}";
  char req[256];
  int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n%s", strlen(body),
                   body);
  assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
  /* the stream starts and the router pauses it */
  assert_int_equal(fx_wait(d, "/v1/completions", 1, 10), 0);
  size_t s0 = 0;
  for (double t = fx_now() + 10; fx_now() < t && (s0 = fx_stream_sent(d)) < (1u << 20);) usleep(10000);
  assert_true(s0 >= (1u << 20));
  /* watch 2 s: unpaused, the relay moves > 50 MB/s here even through this
   * test's slow fixture (measured with --stream-buffer 1073741824) */
  long peak = 0;
  for (int i = 0; i < 40; i++) {
    usleep(50000);
    long rss = proc_kb(ch.pid, "VmRSS");
    if (rss > peak) peak = rss;
  }
  size_t sent = fx_stream_sent(d);
  fprintf(stderr, "slow reader: decoder sent %.1f MiB of %u MiB; router RSS %ld KiB before, peak %ld KiB "
                  "(+%ld KiB, bound %d KiB)\n", sent / 1048576.0, STREAM_BYTES >> 20, rss0, peak, peak - rss0,
          RSS_BOUND_KB);
  assert_true(sent < SENT_BOUND);
  assert_true(peak - rss0 < RSS_BOUND_KB);
  close(fd); /* client gone: the decode leg is cancelled */
  sf_child_stop(&ch);
  sf_free(&g);
}

/* ---- memory returns after large bodies --------------------------------------- */

/* 20 concurrent bodies of ELDR_TEST_BIG_KIB KiB (default 512: the test
 * fixture's evhttp server takes seconds per MiB of body; the case
 * is 16384). Sizes outside [BIG_KIB_MIN, BIG_KIB_MAX] are refused with a
 * message: below, the bodies' peak does not stand clear of the 16 MiB the
 * RSS checks allow; above, the router's peak (a few copies of each body in
 * flight) is more than a test should ask of a shared machine. The client
 * and the router's leg timeouts grow with the size (a deadline, not a
 * wait). Under ASan the quarantine holds freed memory: the flow is
 * checked, not the RSS. */
#define NBIG 20
#define BIG_KIB_MIN 512
#define BIG_KIB_MAX 16384

typedef struct big_arg {
  int port;
  const char *body;
  double timeout_s;
  int status;
} big_arg;

static void *big_post(void *arg) {
  big_arg *b = arg;
  tc_resp resp;
  b->status = tc_post_within(b->port, "/v1/completions", b->body, NULL, b->timeout_s, &resp) ? -1 : resp.status;
  if (b->status >= 0) tc_free(&resp);
  return NULL;
}

static void test_memory_returns(void **st) {
  (void)st;
  const char *env = getenv("ELDR_TEST_BIG_KIB");
  size_t kib = 512;
  if (env && *env) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(env, &end, 10);
    if (errno || *end || *env == '-' || v < BIG_KIB_MIN || v > BIG_KIB_MAX)
      fail_msg("ELDR_TEST_BIG_KIB='%s': give a whole number of KiB in [%d, %d] (below, %d bodies do not stand "
               "clear of the 16 MiB RSS bound; above, the router's peak is too large for a test)",
               env, BIG_KIB_MIN, BIG_KIB_MAX, NBIG);
    kib = v;
  }
  const size_t BIG_BYTES = kib << 10;
  /* the fixture takes seconds per MiB, one body after another: 1 s per MiB of all of them */
  double timeout_s = 20 + (double)(NBIG * kib) / 1024;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  char maxb[32], tmo[32];
  snprintf(maxb, sizeof maxb, "%zu", BIG_BYTES + 1024);
  snprintf(tmo, sizeof tmo, "%.0f", timeout_s);
  const char *args[] = {"--port", "0", "--prefill", g.purl[0], "--decode", g.durl[0], "--health-interval", "0",
                        "--max-body", maxb, "--sigcache-rows", "0", "--header-timeout", tmo,
                        "--prefill-timeout", tmo, NULL};
  sf_child_start(&ch, 0, args);
  tc_resp resp;
  assert_int_equal(tc_post(ch.port, "/v1/completions", "{\"prompt\":\"warm\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  long rss0 = proc_kb(ch.pid, "VmRSS");
  char *body = malloc(BIG_BYTES + 1);
  memset(body, 'a', BIG_BYTES);
  memcpy(body, "{\"prompt\":\"", 11);
  memcpy(body + BIG_BYTES - 2, "\"}", 2);
  body[BIG_BYTES] = 0;
  pthread_t th[NBIG];
  big_arg ba[NBIG];
  for (int i = 0; i < NBIG; i++) {
    ba[i] = (big_arg){ch.port, body, timeout_s, 0};
    assert_int_equal(pthread_create(&th[i], NULL, big_post, &ba[i]), 0);
  }
  for (int i = 0; i < NBIG; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(ba[i].status, 200);
  }
  free(body);
  long peak = proc_kb(ch.pid, "VmHWM");
  /* the heap is trimmed shortly after the last large request ended */
  long rss = 0;
  for (double t = fx_now() + 5; fx_now() < t; usleep(20000))
    if ((rss = proc_kb(ch.pid, "VmRSS")) - rss0 < 16 * 1024) break;
  fprintf(stderr, "%d concurrent %zu KiB bodies: router RSS %ld KiB before, peak %ld KiB, after %ld KiB\n", NBIG,
          kib, rss0, peak, rss);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) /* their allocators keep freed memory */
  assert_true(peak - rss0 > 16 * 1024); /* the bodies were there */
  assert_true(rss - rss0 < 16 * 1024);  /* and went */
#endif
  assert_int_equal(tc_get(ch.port, "/metrics", &resp), 0);
  char *m = strstr(resp.body, "\neldr_heap_trims_total ");
  assert_non_null(m);
  assert_true(atol(m + 23) >= 1);
  tc_free(&resp);
  sf_child_stop(&ch);
  sf_free(&g);
}

/* ---- readiness and policy labels ----------------------------------------------- */

static void test_health_needs_probe(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL); /* health_interval 0, no probes: the first successful legs count */
  sf_run(&g);
  tc_resp resp;
  assert_int_equal(tc_get(g.r.port, "/health", &resp), 0);
  assert_int_equal(resp.status, 503);
  assert_non_null(strstr(resp.body, "\"prefill_probed\":0"));
  tc_free(&resp);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  assert_int_equal(tc_get(g.r.port, "/health", &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_non_null(strstr(resp.body, "\"decode_probed\":1"));
  tc_free(&resp);
  sf_stop(&g);
  /* with probes: ready once they answered, not before; a decoder whose
   * probe fails keeps it 503 */
  fx_worker *p = g.p[0], *d = g.d[0];
  fx_behaviour sick = fx_defaults();
  sick.health_status = 503;
  fx_set(d, &sick);
  sf_config(&g);
  g.c.health_interval_s = 0.05;
  sf_run(&g);
  assert_int_equal(fx_wait(d, "/health", 2, 10), 0);
  assert_int_equal(tc_get(g.r.port, "/health", &resp), 0);
  assert_int_equal(resp.status, 503);
  assert_non_null(strstr(resp.body, "\"decode_probed\":0"));
  tc_free(&resp);
  fx_behaviour well = fx_defaults();
  fx_set(d, &well);
  int ready = 0;
  for (double t = fx_now() + 10; !ready && fx_now() < t; usleep(20000)) {
    assert_int_equal(tc_get(g.r.port, "/health", &resp), 0);
    ready = resp.status == 200;
    tc_free(&resp);
  }
  assert_true(ready);
  assert_int_equal(fx_count(p, "/v1/completions"), 1); /* no request needed */
  sf_free(&g);
}

static void test_reload_keeps_policy_labels(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  sf_config_file(&g, "bounded", "jsq", "");
  sf_run(&g);
  int port = g.r.port;
  tc_resp resp;
  assert_int_equal(tc_post(port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  const char *jsq = "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}";
  const char *rr = "eldr_requests_total{policy=\"rr\",decision=\"load\",outcome=\"ok\"}";
  assert_int_equal(rt_metric(port, jsq), 1);
  assert_int_equal((long)rt_metric(port, rr), -1); /* never used: no series */
  sf_write_config(&g, "rr", "");
  eldr_server_reload(g.r.srv);
  assert_int_equal(rt_wait_metric(port, "eldr_reloads_total{result=\"ok\"}", 1, 10), 0);
  assert_int_equal(rt_metric(port, jsq), 1); /* still jsq's */
  assert_int_equal(rt_metric(port, rr), 0);
  assert_int_equal(tc_post(port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  assert_int_equal(rt_metric(port, rr), 1);
  assert_int_equal(rt_metric(port, jsq), 1);
  sf_free(&g);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_connection_limit),
      cmocka_unit_test(test_health_needs_probe),
      cmocka_unit_test(test_reload_keeps_policy_labels),
      cmocka_unit_test_teardown(test_fd_exhaustion, kill_child),
      cmocka_unit_test_teardown(test_fd_reserve, kill_child),
      cmocka_unit_test_teardown(test_slow_reader_bounded, kill_child),
      cmocka_unit_test_teardown(test_memory_returns, kill_child),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
