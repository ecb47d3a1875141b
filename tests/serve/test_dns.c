/* test_dns.c — worker discovery by DNS, against a DNS responder on
 * loopback (libevent's evdns server API, its own thread) whose answer the
 * test changes: --decode-dns NAME:PORT takes every address, an address
 * added to the answer gets legs, an address removed drains (its leg in
 * flight finishes, no new legs), a worker URL whose host does not resolve
 * is reported naming the host and retried until it resolves, and a DNS
 * change that moves the prefill workers' positions in the list keeps
 * every prompt on its prefill worker (the rendezvous hash keys on the
 * worker's address), and with --threads 4 one failed lookup is one
 * eldr_dns_errors_total and one group change one eldr_dns_updates_total
 * (each loop resolves for itself). The responder is the serve fixture's
 * (sf_dns). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/serve_fixture.h"

static char g_series[256];
static const char *healthy_as(const char *role, const char *ip, int port) {
  snprintf(g_series, sizeof g_series, "eldr_worker_healthy{role=\"%s\",worker=\"http://%s:%d\"}", role, ip, port);
  return g_series;
}
static const char *healthy(const char *ip, int port) { return healthy_as("decode", ip, port); }

/* ---- tests ------------------------------------------------------------------- */

static void test_decode_dns_adds_and_drains(void **st) {
  (void)st;
  sf_dns d;
  sf_dns_start(&d, "decode.eldr.test");
  fx_worker *p = fx_start(NULL), *a = fx_start(NULL);
  assert_non_null(a);
  int port = fx_port(a);
  fx_worker *b = fx_start_addr(NULL, "127.0.0.2", port); /* same port, second address */
  if (!b) skip();
  sf_dns_answer(&d, (const char *const[]){"127.0.0.1", NULL});
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
  for (int i = 0; i < 4; i++) sf_post_ok(r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, NULL);
  assert_int_equal(fx_count(a, "/v1/completions"), 4);
  assert_int_equal(fx_count(b, "/v1/completions"), 0);
  /* an address added: round robin reaches it */
  sf_dns_answer(&d, (const char *const[]){"127.0.0.1", "127.0.0.2", NULL});
  assert_int_equal(rt_wait_metric(r.port, healthy("127.0.0.2", port), 1, 10), 0);
  assert_true(rt_metric(r.port, "eldr_dns_updates_total") >= 2);
  for (int i = 0; i < 4; i++) sf_post_ok(r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, NULL);
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
  sf_dns_answer(&d, (const char *const[]){"127.0.0.1", NULL});
  assert_int_equal(rt_wait_metric(r.port, "eldr_workers_draining", 1, 10), 0);
  assert_true(rt_metric(r.port, healthy("127.0.0.2", port)) < 0); /* no longer listed */
  for (int i = 0; i < 3; i++) sf_post_ok(r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, NULL); /* no new legs on b */
  assert_int_equal(fx_count(b, "/v1/completions"), held_b);
  /* b finishes its held stream: the client gets the whole of it */
  fx_stop(b);
  tc_read_until(fd, buf, sizeof buf, "0\r\n\r\n");
  assert_non_null(strstr(buf, "HTTP/1.1 200"));
  assert_non_null(strstr(buf, "0\r\n\r\n"));
  close(fd);
  assert_int_equal(rt_wait_metric_le(r.port, "eldr_workers_draining", 0, 10), 0);
  /* the name vanishes (NXDOMAIN): the group is empty, requests get 503 */
  sf_dns_rename(&d, "gone.eldr.test");
  double t0 = fx_now();
  while (rt_metric(r.port, healthy("127.0.0.1", port)) >= 0 && fx_now() < t0 + 10) usleep(5000);
  assert_true(rt_metric(r.port, healthy("127.0.0.1", port)) < 0);
  rt_stop(&r);
  eldr_serve_config_free(&c);
  fx_free(a);
  fx_free(b);
  fx_free(p);
  sf_dns_stop(&d);
}

/* A worker URL whose host does not resolve: the router starts, logs an
 * error naming the host, keeps it out of decisions and retries; once the
 * name resolves the worker is used. */
static void test_unresolvable_worker_named_and_retried(void **st) {
  (void)st;
  sf_dns d;
  sf_dns_start(&d, "late.eldr.test");
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
  sf_dns_answer(&d, (const char *const[]){"127.0.0.1", NULL});
  char series[160];
  snprintf(series, sizeof series, "eldr_worker_healthy{role=\"decode\",worker=\"%s\"}", url);
  assert_int_equal(rt_wait_metric(r.port, series, 1, 10), 0);
  sf_post_ok(r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, NULL);
  assert_int_equal(fx_count(a, "/v1/completions"), 1);
  rt_stop(&r);
  assert_non_null(strstr(rt_log_text(&r), "cannot resolve 'late.eldr.test'"));
  eldr_serve_config_free(&c);
  fx_free(a);
  fx_free(p);
  sf_dns_stop(&d);
}


/* Prefill workers by DNS: 127.0.0.2 and .3, then .1 joins. The router's
 * list is the answer's addresses sorted, so .1 takes position 0 and the
 * others move one down: every prompt must stay on its worker unless the
 * new one wins it, and go back to it when .1 leaves. (Keyed by position,
 * most prompts changed worker on both changes.) */
static void test_prefill_home_kept_through_dns_change(void **st) {
  (void)st;
  enum { N = 24 };
  sf_dns d;
  sf_dns_start(&d, "prefill.eldr.test");
  fx_worker *dec = fx_start(NULL), *w[3];
  w[1] = fx_start_addr(NULL, "127.0.0.2", 0);
  if (!w[1]) skip();
  const int port = fx_port(w[1]);
  w[0] = fx_start_addr(NULL, "127.0.0.1", port);
  w[2] = fx_start_addr(NULL, "127.0.0.3", port);
  if (!w[0] || !w[2]) skip();
  sf_dns_answer(&d, (const char *const[]){"127.0.0.3", "127.0.0.2", NULL});
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  c.health_interval_s = 0;
  c.threads = 1;
  c.dns_interval_s = 0.05;
  c.prefill_guard = 1000; /* the home worker, whatever the loads */
  char spec[64], server[64];
  snprintf(spec, sizeof spec, "prefill.eldr.test:%d", port);
  snprintf(server, sizeof server, "127.0.0.1:%d", d.port);
  c.dns_server = strdup(server);
  eldr_diag dg = {{0}};
  assert_int_equal(eldr_serve_config_add_dns(&c, 0, spec, &dg), 0);
  assert_int_equal(eldr_serve_config_add_worker(&c, 1, fx_url(dec), &dg), 0);
  rt_router r;
  assert_int_equal(rt_start(&r, &c), 0);
  assert_int_equal(rt_wait_metric(r.port, healthy_as("prefill", "127.0.0.2", port), 1, 10), 0);
  assert_int_equal(rt_wait_metric(r.port, healthy_as("prefill", "127.0.0.3", port), 1, 10), 0);
  int before[N], after[N], back[N];
  sf_prefill_homes(r.port, w, 3, N, before);
  int on2 = 0;
  for (int i = 0; i < N; i++) {
    assert_true(before[i] == 1 || before[i] == 2);
    on2 += before[i] == 1;
  }
  assert_true(on2 > 0 && on2 < N); /* both workers have prompts */
  sf_dns_answer(&d, (const char *const[]){"127.0.0.3", "127.0.0.1", "127.0.0.2", NULL});
  assert_int_equal(rt_wait_metric(r.port, healthy_as("prefill", "127.0.0.1", port), 1, 10), 0);
  sf_prefill_homes(r.port, w, 3, N, after);
  int moved = 0;
  for (int i = 0; i < N; i++) {
    if (after[i] == 0) moved++;
    else if (after[i] != before[i])
      fail_msg("prompt %d moved from 127.0.0.%d to 127.0.0.%d when 127.0.0.1 joined", i, before[i] + 1, after[i] + 1);
  }
  assert_true(moved < N);
  sf_dns_answer(&d, (const char *const[]){"127.0.0.2", "127.0.0.3", NULL});
  assert_int_equal(rt_wait_metric_le(r.port, "eldr_workers_draining", 0, 10), 0);
  double t0 = fx_now();
  while (rt_metric(r.port, healthy_as("prefill", "127.0.0.1", port)) >= 0 && fx_now() < t0 + 10) usleep(5000);
  assert_true(rt_metric(r.port, healthy_as("prefill", "127.0.0.1", port)) < 0);
  sf_prefill_homes(r.port, w, 3, N, back);
  for (int i = 0; i < N; i++)
    if (back[i] != before[i])
      fail_msg("prompt %d: 127.0.0.%d after 127.0.0.1 left, 127.0.0.%d before it came", i, back[i] + 1, before[i] + 1);
  rt_stop(&r);
  eldr_serve_config_free(&c);
  for (int k = 0; k < 3; k++) fx_free(w[k]);
  fx_free(dec);
  sf_dns_stop(&d);
}

static int dns_queries(sf_dns *d) {
  pthread_mutex_lock(&d->mu);
  int n = d->queries;
  pthread_mutex_unlock(&d->mu);
  return n;
}

/* --threads 4: every loop looks up the unresolvable worker's name and the
 * group's once (no retry within the test: dns_interval 60 s), and the
 * process counts one error and one update, not one per loop. Once the
 * responder has answered every loop's queries, each loop handles its
 * answer within milliseconds; the counters are read for 0.5 s after that
 * and must stay at 1 (they reached 4 before the fix). */
static void test_dns_counted_once_per_process(void **st) {
  (void)st;
  enum { THREADS = 4 };
  sf_dns d;
  sf_dns_start(&d, "group.eldr.test");
  sf_dns_answer(&d, (const char *const[]){"127.0.0.1", NULL});
  fx_worker *p = fx_start(NULL), *a = fx_start(NULL);
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  c.health_interval_s = 0;
  c.dns_interval_s = 60;
  c.threads = THREADS;
  char url[96], spec[64], server[64];
  snprintf(url, sizeof url, "http://nowhere.eldr.test:%d", fx_port(a));
  snprintf(spec, sizeof spec, "group.eldr.test:%d", fx_port(a));
  snprintf(server, sizeof server, "127.0.0.1:%d", d.port);
  c.dns_server = strdup(server);
  eldr_diag dg = {{0}};
  assert_int_equal(eldr_serve_config_add_worker(&c, 0, fx_url(p), &dg), 0);
  assert_int_equal(eldr_serve_config_add_worker(&c, 1, url, &dg), 0);
  assert_int_equal(eldr_serve_config_add_dns(&c, 1, spec, &dg), 0);
  rt_router r;
  assert_int_equal(rt_start(&r, &c), 0);
  /* per loop: A and AAAA of the worker's name, A and AAAA of the group's */
  double t0 = fx_now();
  while (dns_queries(&d) < 4 * THREADS && fx_now() < t0 + 10) usleep(2000);
  assert_true(dns_queries(&d) >= 4 * THREADS);
  assert_int_equal(rt_wait_metric(r.port, "eldr_dns_errors_total", 1, 10), 0);
  assert_int_equal(rt_wait_metric(r.port, "eldr_dns_updates_total", 1, 10), 0);
  t0 = fx_now();
  while (fx_now() < t0 + 0.5) {
    assert_int_equal((int)rt_metric(r.port, "eldr_dns_errors_total"), 1);
    assert_int_equal((int)rt_metric(r.port, "eldr_dns_updates_total"), 1);
    usleep(20000);
  }
  assert_int_equal(dns_queries(&d), 4 * THREADS); /* no retry in the window */
  rt_stop(&r);
  const char *log = rt_log_text(&r);
  const char *hit = strstr(log, "cannot resolve 'nowhere.eldr.test'");
  assert_non_null(hit);
  assert_null(strstr(hit + 1, "cannot resolve 'nowhere.eldr.test'")); /* logged once */
  eldr_serve_config_free(&c);
  fx_free(a);
  fx_free(p);
  sf_dns_stop(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_dns_adds_and_drains),
      cmocka_unit_test(test_unresolvable_worker_named_and_retried),
      cmocka_unit_test(test_prefill_home_kept_through_dns_change),
      cmocka_unit_test(test_dns_counted_once_per_process),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
