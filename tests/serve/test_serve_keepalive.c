/* test_serve_keepalive.c — stale keep-alive connections behind the real
 * router: workers (fixture workers on real sockets) that close a kept-alive
 * connection when the next request arrives on it, as a keep-alive request
 * limit or timeout whose close crossed the router's request does, with a
 * FIN or a reset. Every client request gets 200: the leg is sent once more
 * on a fresh connection, counted in eldr_keepalive_resends_total{leg}. A
 * failure after a reply byte, or on a fresh connection, is not resent.
 *
 * Deterministic: the fixture closes a connection only once it has read the
 * next request on it, so which requests meet a stale connection is fixed by
 * the request count; the client's requests are sequential. No sleeps. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

#define SERIES(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

/* The rig's router (one prefill worker, nd decoders) with one event loop
 * (one pool per worker: which request meets a kept connection is fixed) and
 * JSQ (ties to the first decoder). */
static void start_n(sf_rig *g, const fx_behaviour *pb, int nd, const fx_behaviour *db) {
  sf_start(g, 1, pb, nd, db);
  g->c.threads = 1;
  g->c.policy = ELDR_POLICY_JSQ;
  sf_run(g);
}

static void start(sf_rig *g, const fx_behaviour *pb, const fx_behaviour *db) { start_n(g, pb, 1, db); }

static double resends(int port, const char *leg) {
  char s[96];
  return rt_metric(port, SERIES(s, "eldr_keepalive_resends_total{leg=\"%s\"}", leg));
}

static double retries(int port, const char *leg) {
  char s[96];
  return rt_metric(port, SERIES(s, "eldr_retries_total{leg=\"%s\"}", leg));
}

/* Request i (a stream when i is odd) must be answered 200, in full. */
static void post_whole(int port, int i) {
  char body[96];
  snprintf(body, sizeof body, "{\"prompt\":\"keep-alive %d\",\"max_tokens\":4%s}", i, i % 2 ? ",\"stream\":true" : "");
  tc_resp r;
  sf_post_ok(port, "/v1/completions", body, NULL, &r);
  if (i % 2 && !strstr(r.body, "data: [DONE]")) fail_msg("request %d: stream not ended: %s", i, r.body);
  if (!(i % 2) && !strstr(r.body, "cmpl-decode")) fail_msg("request %d: not the decode reply: %s", i, r.body);
  tc_free(&r);
}

/* Both workers close every connection after `limit` answered requests: the
 * prefill one with pfin ? a FIN : a reset, the decode one the other way. */
static void limit_run(int limit, int pfin) {
  enum { K = 11 };
  fx_behaviour pb = fx_defaults(), db = fx_defaults();
  pb.keepalive_requests = db.keepalive_requests = limit;
  pb.keepalive_reset = !pfin;
  db.keepalive_reset = pfin;
  sf_rig g;
  start(&g, &pb, &db);
  assert_int_equal(resends(g.r.port, "prefill"), 0);
  assert_int_equal(resends(g.r.port, "decode"), 0);
  for (int i = 0; i < K; i++) post_whole(g.r.port, i);
  /* a connection answers `limit` requests and reads the next, which is sent
   * again on a new connection: (K - 1) / limit stale sends per leg */
  const size_t stale = (K - 1) / (size_t)limit;
  assert_int_equal(resends(g.r.port, "prefill"), stale);
  assert_int_equal(resends(g.r.port, "decode"), stale);
  assert_int_equal(fx_count(g.p[0], "/v1/completions"), K + stale);
  assert_int_equal(fx_count(g.d[0], "/v1/completions"), K + stale);
  assert_int_equal(fx_connections(g.p[0]), stale + 1);
  assert_int_equal(fx_connections(g.d[0]), stale + 1);
  /* resent on the same worker's fresh connection: not a retry on another */
  assert_int_equal(retries(g.r.port, "prefill"), 0);
  assert_int_equal(retries(g.r.port, "decode"), 0);
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}"), K);
  sf_free(&g);
}

static void test_keepalive_limit_resent(void **st) {
  (void)st;
  limit_run(1, 1); /* every reuse meets a closed connection */
  limit_run(3, 0);
}

/* A reply byte arrived, then the reused connection failed: not resent (the
 * worker took the request); the decode leg is not retried either: 502. */
static void test_no_resend_after_reply_bytes(void **st) {
  (void)st;
  static const char *const partial[] = {
      "HTTP/1.1 20",                                                        /* part of the status line */
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 90\r\n\r\n{\"id\":", /* part of the body */
  };
  sf_rig g;
  start(&g, NULL, NULL);
  fx_worker *p = g.p[0], *d = g.d[0];
  post_whole(g.r.port, 0); /* both connections kept alive */
  for (size_t k = 0; k < sizeof partial / sizeof partial[0]; k++) {
    fx_behaviour cut = fx_defaults();
    cut.partial_reply = partial[k];
    fx_set(d, &cut);
    size_t sent = fx_count(d, "/v1/completions"), conns = fx_connections(d);
    tc_resp r;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"cut\",\"max_tokens\":4}", NULL, &r), 0);
    if (r.status != 502 || !strstr(r.body, "not retried")) fail_msg("partial reply %zu: %d %s", k, r.status, r.body);
    tc_free(&r);
    assert_int_equal(fx_count(d, "/v1/completions"), sent + 1); /* seen once */
    assert_int_equal(fx_connections(d), conns);                 /* no new connection */
    assert_int_equal(resends(g.r.port, "decode"), 0);
    fx_behaviour ok = fx_defaults();
    fx_set(d, &ok);
    post_whole(g.r.port, (int)(2 * k + 2)); /* a fresh connection serves again, kept */
  }
  /* the prefill leg likewise: not resent to the same worker (the only one:
   * its retry on another worker finds none) */
  fx_behaviour cut = fx_defaults();
  cut.partial_reply = partial[1];
  fx_set(p, &cut);
  size_t sent = fx_count(p, "/v1/completions");
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"cut\",\"max_tokens\":4}", NULL, &r), 0);
  if (r.status < 500) fail_msg("prefill cut mid-reply: %d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(fx_count(p, "/v1/completions"), sent + 1);
  assert_int_equal(resends(g.r.port, "prefill"), 0);
  sf_free(&g);
}

/* A fresh connection that fails before any reply byte: its failure is the
 * leg's (not resent); a reused one that fails is resent once, and only
 * once when the fresh one fails too. */
static void test_resend_once_never_fresh(void **st) {
  (void)st;
  sf_rig g;
  start(&g, NULL, NULL);
  fx_worker *d = g.d[0];
  post_whole(g.r.port, 0); /* the decode connection kept alive */
  fx_behaviour dead = fx_defaults();
  dead.close_without_reply = 1;
  fx_set(d, &dead);
  size_t sent = fx_count(d, "/v1/completions");
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":4}", NULL, &r), 0);
  if (r.status != 502) fail_msg("%d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(fx_count(d, "/v1/completions"), sent + 2); /* the stale send and one resend */
  assert_int_equal(resends(g.r.port, "decode"), 1);
  /* nothing kept now: a fresh connection, whose failure is final */
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"b\",\"max_tokens\":4}", NULL, &r), 0);
  if (r.status != 502) fail_msg("%d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(fx_count(d, "/v1/completions"), sent + 3);
  assert_int_equal(resends(g.r.port, "decode"), 1);
  sf_free(&g);
}

/* A decoder that read the request on a kept-alive connection and died (the
 * connection closed, no reply byte, new connections refused) looks like a
 * crossed keep-alive close: the resend to it is refused, and the request is
 * not moved to another decoder (the first may have pulled the KV blocks):
 * 502. A later request, refused at connect, goes to the other decoder. */
static void test_died_on_reused_connection(void **st) {
  (void)st;
  fx_behaviour die = fx_defaults();
  die.keepalive_requests = 1;
  die.keepalive_die = 1;
  sf_rig g;
  start_n(&g, NULL, 2, &die);
  fx_worker *d0 = g.d[0], *d1 = g.d[1];
  fx_behaviour ok = fx_defaults();
  fx_set(d1, &ok);
  assert_int_equal(sf_post_served_by(g.r.port), fx_port(d0)); /* kept alive */
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":4}", NULL, &r), 0);
  if (r.status != 502 || !strstr(r.body, "not retried")) fail_msg("%d %s", r.status, r.body);
  tc_free(&r);
  assert_int_equal(fx_count(d0, "/v1/completions"), 2);
  assert_int_equal(fx_count(d1, "/v1/completions"), 0);
  assert_int_equal(resends(g.r.port, "decode"), 1);
  assert_int_equal(retries(g.r.port, "decode"), 0);
  assert_int_equal(sf_post_served_by(g.r.port), fx_port(d1));
  assert_int_equal(retries(g.r.port, "decode"), 1);
  sf_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keepalive_limit_resent),
      cmocka_unit_test(test_no_resend_after_reply_bytes),
      cmocka_unit_test(test_resend_once_never_fresh),
      cmocka_unit_test(test_died_on_reused_connection),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
