/* test_bufpool.c — the event loop's pool of large reply buffers
 * (src/serve/bufpool.h) and its memory policy:
 *   - size classes: at least what was asked, at most a quarter more;
 *   - a buffer given back is handed out again (no new allocation), the
 *     smallest that fits first;
 *   - idle bytes stay within the pool's bound; larger buffers are freed;
 *   - what stays idle through a decay interval is freed (a real event loop
 *     runs the timer), what the loop keeps using stays;
 *   - behind the real router, megabyte prefill replies are received into
 *     reused buffers (eldr_reply_buffers_allocated_total stays at the
 *     concurrency while eldr_reply_buffers_taken_total counts every reply),
 *     and the idle ones go back to the system once the traffic stops;
 *   - an idle keep-alive connection holds no request head and no input
 *     buffer (the loop's spares). */
#include <event2/event.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "serve/bufpool.h"
#include "serve/serve_types.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

static void test_classes(void **st) {
  (void)st;
  assert_int_equal(eldr__bufpool_class(1), ELDR__BUFPOOL_MIN);
  assert_int_equal(eldr__bufpool_class(ELDR__BUFPOOL_MIN), ELDR__BUFPOOL_MIN);
  for (size_t n = ELDR__BUFPOOL_MIN + 1; n < ((size_t)64 << 20); n = n * 9 / 8 + 7) {
    size_t c = eldr__bufpool_class(n);
    if (c < n || c > n + n / 4) fail_msg("class(%zu) = %zu: outside [n, 1.25 n]", n, c);
    assert_int_equal(eldr__bufpool_class(c), c); /* a class is its own class */
  }
}

static uint64_t ld(_Atomic uint64_t *x) { return atomic_load(x); }

static void test_reuse_and_bound(void **st) {
  (void)st;
  eldr__bufpool bp;
  assert_int_equal(eldr__bufpool_init(&bp, NULL, (size_t)4 << 20), 0);
  size_t c1, c2, c3;
  char *a = eldr__bufpool_take(&bp, (size_t)2 << 20, &c1);
  assert_non_null(a);
  assert_true(c1 >= (size_t)2 << 20);
  memset(a, 1, c1);
  eldr__bufpool_give(&bp, a, c1);
  assert_int_equal(atomic_load(&bp.st.idle_bytes), c1);
  char *b = eldr__bufpool_take(&bp, (size_t)1900 << 10, &c2); /* fits the idle one: reused */
  assert_ptr_equal(b, a);
  assert_int_equal(c2, c1);
  assert_int_equal(ld(&bp.st.allocs), 1);
  char *c = eldr__bufpool_take(&bp, (size_t)2 << 20, &c3); /* one is taken: a new one */
  assert_non_null(c);
  assert_int_equal(ld(&bp.st.allocs), 2);
  char *d0;
  size_t cd;
  d0 = eldr__bufpool_take(&bp, (size_t)200 << 10, &cd);
  assert_true(cd < c1);
  /* three back into a 4 MiB bound: the oldest given back goes */
  eldr__bufpool_give(&bp, b, c2);
  eldr__bufpool_give(&bp, c, c3);
  assert_int_equal(ld(&bp.st.frees), 0);
  eldr__bufpool_give(&bp, d0, cd);
  assert_true(atomic_load(&bp.st.idle_bytes) <= (size_t)4 << 20);
  assert_int_equal(ld(&bp.st.frees), 1);
  assert_int_equal(atomic_load(&bp.st.idle_n), 2);
  /* the smallest that fits: a small request takes the small buffer, a large one the large */
  size_t ce, cf;
  char *e = eldr__bufpool_take(&bp, (size_t)100 << 10, &ce);
  assert_ptr_equal(e, d0);
  char *f = eldr__bufpool_take(&bp, (size_t)100 << 10, &cf);
  assert_ptr_equal(f, c);
  eldr__bufpool_give(&bp, e, ce);
  eldr__bufpool_give(&bp, f, cf);
  /* above the bound or the largest kept size: freed at once */
  size_t cg;
  char *g = eldr__bufpool_take(&bp, ELDR__BUFPOOL_KEEP_MAX + 1, &cg);
  assert_non_null(g);
  uint64_t f0 = ld(&bp.st.frees);
  eldr__bufpool_give(&bp, g, cg);
  assert_int_equal(ld(&bp.st.frees), f0 + 1);
  /* below the pooled size: freed, not counted as a pool buffer */
  eldr__bufpool_give(&bp, malloc(100), 100);
  eldr__bufpool_free(&bp);
}

typedef struct decay_rig {
  eldr__bufpool *bp;
  char *busy;
  size_t busy_cap;
  int ticks;
  struct event *ev;
} decay_rig;

/* Every 100 ms the loop takes and gives back one buffer (the one it keeps
 * using); the other stays idle. */
static void use_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  decay_rig *d = arg;
  d->busy = eldr__bufpool_take(d->bp, (size_t)1 << 20, &d->busy_cap);
  eldr__bufpool_give(d->bp, d->busy, d->busy_cap);
  d->ticks++;
}

static void test_decay(void **st) {
  (void)st;
  struct event_base *base = event_base_new();
  assert_non_null(base);
  eldr__bufpool bp;
  assert_int_equal(eldr__bufpool_init(&bp, base, ELDR__BUFPOOL_IDLE_MAX), 0);
  size_t c1, c2;
  char *a = eldr__bufpool_take(&bp, (size_t)1 << 20, &c1);
  char *b = eldr__bufpool_take(&bp, (size_t)1 << 20, &c2);
  eldr__bufpool_give(&bp, a, c1);
  eldr__bufpool_give(&bp, b, c2);
  assert_int_equal(atomic_load(&bp.st.idle_n), 2);
  decay_rig d = {&bp, NULL, 0, 0, NULL};
  d.ev = event_new(base, -1, EV_PERSIST, use_cb, &d);
  struct timeval every = {0, 100000};
  event_add(d.ev, &every);
  /* two and a half intervals: the idle surplus went, the one in use stayed */
  struct timeval run = {(time_t)(2.5 * ELDR__BUFPOOL_DECAY_S), (suseconds_t)(((2.5 * ELDR__BUFPOOL_DECAY_S) -
                                                                             (double)(time_t)(2.5 * ELDR__BUFPOOL_DECAY_S)) * 1e6)};
  event_base_loopexit(base, &run);
  event_base_dispatch(base);
  assert_true(d.ticks >= 10);
  assert_int_equal(atomic_load(&bp.st.idle_n), 1);
  assert_int_equal(ld(&bp.st.frees), 1);
  assert_int_equal(ld(&bp.st.allocs), 2);
  /* the loop stops using it: it goes too, and the timer stops */
  event_del(d.ev);
  event_base_dispatch(base); /* runs until nothing is pending: the decay timer disarms itself */
  assert_int_equal(atomic_load(&bp.st.idle_n), 0);
  assert_int_equal(atomic_load(&bp.st.idle_bytes), 0);
  event_free(d.ev);
  eldr__bufpool_free(&bp);
  event_base_free(base);
}

/* Behind the router: prefill replies of ~1.3 MB (routed_experts of 4096
 * tokens on a 16 x 8 shape, no artifact: the reply is read, not counted). */
static void test_router_reuses(void **st) {
  (void)st;
  eldr_shape sh = {16, 64, 8};
  char *re = sf_routed(&sh, 8192, 0);
  assert_true(strlen(re) > ((size_t)1 << 20));
  fx_behaviour pb = fx_defaults();
  pb.routed_experts = re;
  pb.prompt_tokens = 8192;
  sf_rig g;
  sf_start(&g, 1, &pb, 1, NULL);
  g.c.threads = 1;
  g.c.policy = ELDR_POLICY_JSQ;
  sf_run(&g);
  const int N = 12;
  for (int i = 0; i < N; i++) {
    tc_resp r;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"big replies\",\"max_tokens\":4}", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    tc_free(&r);
  }
  double taken = rt_metric(g.r.port, "eldr_reply_buffers_taken_total");
  double alloc = rt_metric(g.r.port, "eldr_reply_buffers_allocated_total");
  fprintf(stderr, "%d sequential megabyte replies: %.0f reply buffers taken, %.0f allocated\n", N, taken, alloc);
  assert_true(taken >= N);
  assert_true(alloc >= 1 && alloc <= 2); /* one request at a time: one buffer, reused */
  /* no traffic: the idle buffers go back within two decay intervals */
  assert_int_equal(rt_wait_metric_le(g.r.port, "eldr_reply_buffers_idle_bytes", 0, 4 * ELDR__BUFPOOL_DECAY_S + 2), 0);
  assert_true(rt_metric(g.r.port, "eldr_reply_buffers_freed_total") >= 1);
  sf_free(&g);
  free(re);
}

/* An idle keep-alive connection holds no request head, no input buffer
 * and no Origin: after a plain request, a streamed one and one with a
 * chunked body (each answered in full), the router's one connection has
 * given them back to its loop's spares (inspected once the loop stopped). */
static void test_idle_connection_holds_no_buffers(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  g.c.threads = 1;
  g.c.policy = ELDR_POLICY_JSQ;
  g.c.cors_origin = strdup("*");
  sf_run(&g);
  int fd = tc_connect(g.r.port);
  assert_true(fd >= 0);
  const char *bodies[] = {"{\"prompt\":\"idle a\",\"max_tokens\":2}",
                          "{\"prompt\":\"idle b\",\"max_tokens\":2,\"stream\":true}",
                          "{\"prompt\":\"idle c\",\"max_tokens\":2}"};
  static const char *const ends[] = {"cmpl-decode", "0\r\n\r\n", "cmpl-decode"};
  char req[1024], buf[16384];
  for (int i = 0; i < 3; i++) {
    size_t bl = strlen(bodies[i]);
    int n = i == 2 ? snprintf(req, sizeof req, /* a chunked body */
                              "POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "%zx\r\n%s\r\n0\r\n\r\n", bl, bodies[i])
                   : snprintf(req, sizeof req,
                              "POST /v1/completions HTTP/1.1\r\nHost: r\r\n%sContent-Length: %zu\r\n\r\n%s",
                              i == 0 ? "Origin: https://a.example\r\n" : "", bl, bodies[i]);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    tc_read_until(fd, buf, sizeof buf, ends[i]);
    if (!strstr(buf, "200 OK") || !strstr(buf, ends[i])) fail_msg("request %d: %.300s", i, buf);
    if (i == 0 && !strstr(buf, "Access-Control-Allow-Origin: *")) fail_msg("no CORS header: %.300s", buf);
  }
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}", 3, 10), 0);
  rt_join(&g.r); /* the loop stopped: its connections stay until the router is freed */
  const eldr_server *s = g.r.srv;
  size_t n = 0;
  for (const hconn *c = s->conns; c; c = c->next, n++) {
    assert_null(c->head);
    assert_null(c->in.p);
    assert_int_equal(c->in.cap, 0);
    assert_null(c->origin);
  }
  assert_true(n >= 1);
  assert_true(s->heads.n >= 1 && s->inbufs.n >= 1); /* back with the loop, for the next request */
  close(fd);
  sf_free(&g);
}

int main(void) {
  const struct CMUnitTest t[] = {
      cmocka_unit_test(test_idle_connection_holds_no_buffers),
      cmocka_unit_test(test_classes),
      cmocka_unit_test(test_reuse_and_bound),
      cmocka_unit_test(test_decay),
      cmocka_unit_test(test_router_reuses),
  };
  return cmocka_run_group_tests(t, NULL, NULL);
}
