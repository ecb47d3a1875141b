/* test_dns.c — worker discovery by DNS, against a DNS responder on
 * loopback (libevent's evdns server API, its own thread) whose answer the
 * test changes: --decode-dns NAME:PORT takes every address, an address
 * added to the answer gets legs, an address removed drains (its leg in
 * flight finishes, no new legs), and a worker URL whose host does not
 * resolve is reported naming the host and retried until it resolves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <event2/dns.h>
#include <event2/dns_struct.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/fixture.h"

/* ---- the DNS responder ------------------------------------------------------- */

typedef struct dnsd {
  struct event_base *base;
  struct evdns_server_port *sp;
  evutil_socket_t fd;
  int port;
  pthread_t th;
  pthread_mutex_t mu;
  const char *name;  /* the one name it knows; others: NXDOMAIN */
  uint32_t addr[4];  /* its A records (network order) */
  int n;
  int queries;
  struct event *keep;
} dnsd;

static void dnsd_cb(struct evdns_server_request *req, void *arg) {
  dnsd *d = arg;
  int known = 0;
  pthread_mutex_lock(&d->mu);
  d->queries++;
  for (int i = 0; i < req->nquestions; i++) {
    struct evdns_server_question *q = req->questions[i];
    if (strcasecmp(q->name, d->name)) continue;
    known = 1;
    for (int k = 0; q->type == EVDNS_TYPE_A && k < d->n; k++)
      evdns_server_request_add_a_reply(req, q->name, 1, &d->addr[k], 0);
  }
  pthread_mutex_unlock(&d->mu);
  evdns_server_request_respond(req, known ? 0 : DNS_ERR_NOTEXIST);
}

static void *dnsd_thread(void *arg) {
  event_base_dispatch(((dnsd *)arg)->base);
  return NULL;
}

static void dnsd_start(dnsd *d, const char *name) {
  memset(d, 0, sizeof *d);
  evthread_use_pthreads();
  pthread_mutex_init(&d->mu, NULL);
  d->name = name;
  d->base = event_base_new();
  d->fd = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(d->fd, (struct sockaddr *)&sa, sizeof sa), 0);
  socklen_t sl = sizeof sa;
  getsockname(d->fd, (struct sockaddr *)&sa, &sl);
  d->port = ntohs(sa.sin_port);
  evutil_make_socket_nonblocking(d->fd);
  d->sp = evdns_add_server_port_with_base(d->base, d->fd, 0, dnsd_cb, d);
  assert_non_null(d->sp);
  /* keeps the loop alive while there is nothing to answer */
  d->keep = event_new(d->base, -1, EV_PERSIST, NULL, NULL);
  struct timeval tv = {3600, 0};
  event_add(d->keep, &tv);
  assert_int_equal(pthread_create(&d->th, NULL, dnsd_thread, d), 0);
}

static void dnsd_answer(dnsd *d, const char *a0, const char *a1) {
  pthread_mutex_lock(&d->mu);
  d->n = 0;
  const char *as[] = {a0, a1};
  for (int i = 0; i < 2; i++)
    if (as[i]) inet_pton(AF_INET, as[i], &d->addr[d->n++]);
  pthread_mutex_unlock(&d->mu);
}

static void dnsd_rename(dnsd *d, const char *name) {
  pthread_mutex_lock(&d->mu);
  d->name = name;
  pthread_mutex_unlock(&d->mu);
}

static void dnsd_stop(dnsd *d) {
  event_base_loopexit(d->base, NULL);
  pthread_join(d->th, NULL);
  evdns_close_server_port(d->sp);
  evutil_closesocket(d->fd);
  event_free(d->keep);
  event_base_free(d->base);
  pthread_mutex_destroy(&d->mu);
}

/* ---- helpers ----------------------------------------------------------------- */

static void post_ok(int port) {
  tc_resp r;
  assert_int_equal(tc_post(port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &r), 0);
  if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
  tc_free(&r);
}

static char g_series[256];
static const char *healthy(const char *ip, int port) {
  snprintf(g_series, sizeof g_series, "eldr_worker_healthy{role=\"decode\",worker=\"http://%s:%d\"}", ip, port);
  return g_series;
}

/* ---- tests ------------------------------------------------------------------- */

static void test_decode_dns_adds_and_drains(void **st) {
  (void)st;
  dnsd d;
  dnsd_start(&d, "decode.eldr.test");
  fx_worker *p = fx_start(NULL), *a = fx_start(NULL);
  assert_non_null(a);
  int port = fx_port(a);
  fx_worker *b = fx_start_addr(NULL, "127.0.0.2", port); /* same port, second address */
  if (!b) skip();
  dnsd_answer(&d, "127.0.0.1", NULL);
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  c.health_interval_s = 0;
  c.threads = 1; /* each loop resolves the group itself; round robin is per loop */
  c.policy = ELDR_POLICY_RR;
  c.dns_interval_s = 0.05;
  char spec[64], server[64];
  snprintf(spec, sizeof spec, "decode.eldr.test:%d", port);
  snprintf(server, sizeof server, "127.0.0.1:%d", d.port);
  c.dns_server = strdup(server);
  eldr_diag dg = {{0}};
  assert_int_equal(eldr_serve_config_add_worker(&c, 0, fx_url(p), &dg), 0);
  assert_int_equal(eldr_serve_config_add_dns(&c, 1, spec, &dg), 0);
  rt_router r;
  assert_int_equal(rt_start(&r, &c), 0);
  /* the first answer: one decoder */
  assert_int_equal(rt_wait_metric(r.port, healthy("127.0.0.1", port), 1, 10), 0);
  for (int i = 0; i < 4; i++) post_ok(r.port);
  assert_int_equal(fx_count(a, "/v1/completions"), 4);
  assert_int_equal(fx_count(b, "/v1/completions"), 0);
  /* an address added: round robin reaches it */
  dnsd_answer(&d, "127.0.0.1", "127.0.0.2");
  assert_int_equal(rt_wait_metric(r.port, healthy("127.0.0.2", port), 1, 10), 0);
  assert_true(rt_metric(r.port, "eldr_dns_updates_total") >= 2);
  for (int i = 0; i < 4; i++) post_ok(r.port);
  assert_int_equal(fx_count(a, "/v1/completions") + fx_count(b, "/v1/completions"), 8);
  assert_int_equal(fx_count(b, "/v1/completions"), 2);
  /* a stream held open on b, then b leaves the answer: it drains */
  fx_behaviour hold = fx_defaults();
  hold.stall_after_chunks = 1;
  fx_set(b, &hold);
  const char *stream = "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 28\r\n\r\n{\"prompt\":\"a\",\"stream\":true}";
  char buf[8192];
  int fd = -1;
  for (int k = 0; k < 3 && fd < 0; k++) { /* round robin: within two streams one is on b */
    size_t na = fx_count(a, "/v1/completions"), nb = fx_count(b, "/v1/completions");
    int s_fd = tc_send_raw(r.port, stream);
    double dl = fx_now() + 10;
    while (fx_count(a, "/v1/completions") + fx_count(b, "/v1/completions") == na + nb && fx_now() < dl)
      usleep(2000);
    if (fx_count(b, "/v1/completions") > nb) {
      fd = s_fd;
    } else { /* on a, which answers in full */
      tc_read_until(s_fd, buf, sizeof buf, "0\r\n\r\n");
      close(s_fd);
    }
  }
  assert_true(fd >= 0);
  size_t held_b = fx_count(b, "/v1/completions");
  dnsd_answer(&d, "127.0.0.1", NULL);
  assert_int_equal(rt_wait_metric(r.port, "eldr_workers_draining", 1, 10), 0);
  assert_true(rt_metric(r.port, healthy("127.0.0.2", port)) < 0); /* no longer listed */
  for (int i = 0; i < 3; i++) post_ok(r.port); /* no new legs on b */
  assert_int_equal(fx_count(b, "/v1/completions"), held_b);
  /* b finishes its held stream: the client gets the whole of it */
  fx_stop(b);
  tc_read_until(fd, buf, sizeof buf, "0\r\n\r\n");
  assert_non_null(strstr(buf, "HTTP/1.1 200"));
  assert_non_null(strstr(buf, "0\r\n\r\n"));
  close(fd);
  assert_int_equal(rt_wait_metric_le(r.port, "eldr_workers_draining", 0, 10), 0);
  /* the name vanishes (NXDOMAIN): the group is empty, requests get 503 */
  dnsd_rename(&d, "gone.eldr.test");
  double t0 = fx_now();
  while (rt_metric(r.port, healthy("127.0.0.1", port)) >= 0 && fx_now() < t0 + 10) usleep(5000);
  assert_true(rt_metric(r.port, healthy("127.0.0.1", port)) < 0);
  rt_stop(&r);
  eldr_serve_config_free(&c);
  fx_free(a);
  fx_free(b);
  fx_free(p);
  dnsd_stop(&d);
}

/* A worker URL whose host does not resolve: the router starts, logs an
 * error naming the host, keeps it out of decisions and retries; once the
 * name resolves the worker is used. */
static void test_unresolvable_worker_named_and_retried(void **st) {
  (void)st;
  dnsd d;
  dnsd_start(&d, "late.eldr.test");
  fx_worker *p = fx_start(NULL), *a = fx_start(NULL);
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  c.health_interval_s = 0;
  c.dns_interval_s = 0.05;
  c.threads = 1; /* each loop resolves on its own: the health series read may be another loop's */
  char url[96], server[64];
  snprintf(url, sizeof url, "http://late.eldr.test:%d", fx_port(a));
  snprintf(server, sizeof server, "127.0.0.1:%d", d.port);
  c.dns_server = strdup(server);
  eldr_diag dg = {{0}};
  assert_int_equal(eldr_serve_config_add_worker(&c, 0, fx_url(p), &dg), 0);
  assert_int_equal(eldr_serve_config_add_worker(&c, 1, url, &dg), 0);
  rt_router r;
  assert_int_equal(rt_start(&r, &c), 0);
  assert_int_equal(rt_wait_metric(r.port, "eldr_dns_errors_total", 2, 10), 0); /* retried */
  tc_resp resp;
  assert_int_equal(tc_post(r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 503);
  tc_free(&resp);
  dnsd_answer(&d, "127.0.0.1", NULL);
  char series[160];
  snprintf(series, sizeof series, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", url);
  assert_int_equal(rt_wait_metric(r.port, series, 1, 10), 0);
  post_ok(r.port);
  assert_int_equal(fx_count(a, "/v1/completions"), 1);
  rt_stop(&r);
  assert_non_null(strstr(rt_log_text(&r), "cannot resolve 'late.eldr.test'"));
  eldr_serve_config_free(&c);
  fx_free(a);
  fx_free(p);
  dnsd_stop(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_dns_adds_and_drains),
      cmocka_unit_test(test_unresolvable_worker_named_and_retried),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
