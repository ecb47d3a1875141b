/* test_busring.c — the fleet bus's parts that need no network: a loop's
 * ring (one producer thread, one consumer: every record comes out whole,
 * in order, across thousands of wrap-arounds; a record that does not fit
 * is refused, nothing half-written) and the wire codec (a delta and a
 * snapshot written and read back; bad input refused naming the field). */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve/bus_int.h"

#define N 200000

static uint32_t nnz_of(uint32_t i) { return (i * 2654435761u >> 20) % 700; }

static void *producer(void *arg) {
  eldr__ring *r = arg;
  static uint32_t idx[700], w[700];
  for (uint32_t i = 0; i < N; i++) {
    uint32_t n = nnz_of(i);
    for (uint32_t k = 0; k < n; k++) idx[k] = k * 3 + i % 3, w[k] = i ^ k;
    while (eldr__ring_push(r, i, (uint64_t)i * 7, i % 2 ? -1 : 1, i * 5, idx, w, n)) sched_yield(); /* full: the consumer drains */
  }
  return NULL;
}

static void test_ring_threads(void **st) {
  (void)st;
  eldr__ring r;
  assert_int_equal(eldr__ring_init(&r, 64 << 10), 0); /* small: it wraps thousands of times */
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, producer, &r), 0);
  for (uint32_t i = 0; i < N;) {
    eldr__ring_rec rec;
    if (!eldr__ring_peek(&r, &rec)) {
      sched_yield();
      continue;
    }
    if (rec.dec != i || rec.t_ns != (uint64_t)i * 7 || rec.sign != (i % 2 ? -1 : 1) || rec.ctx != i * 5 ||
        rec.nnz != nnz_of(i))
      fail_msg("record %u: dec %llu nnz %u", i, (unsigned long long)rec.dec, rec.nnz);
    for (uint32_t k = 0; k < rec.nnz; k++)
      if (rec.idx[k] != k * 3 + i % 3 || rec.w[k] != (i ^ k)) fail_msg("record %u: pair %u", i, k);
    eldr__ring_pop(&r, &rec);
    i++;
  }
  pthread_join(th, NULL);
  assert_true(eldr__ring_empty(&r));
  /* a record over half the ring is refused, nothing written */
  static uint32_t big[8192];
  assert_int_equal(eldr__ring_push(&r, 1, 1, 1, 1, big, big, 8192), -1);
  assert_true(eldr__ring_empty(&r));
  eldr__ring_free(&r);
}

static void test_codec(void **st) {
  (void)st;
  eldr__bus_head h = {.kind = ELDR__BUS_DELTA, .incarnation = 42, .seq = 7, .sent_ns = 99, .L = 4, .E = 8, .nparts = 1};
  strcpy(h.replica, "router-a");
  eldr__bus_out o = {0};
  eldr__bus_out_head(&o, &h);
  uint32_t idx[3] = {0, 5, 31}, w[3] = {1u << 26, 3, 70000000};
  eldr__bus_out_rec32(&o, 0xfeed, 1, 120, idx, w, 3, 1);
  eldr__bus_out_rec32(&o, 0xfeed, -1, -120, idx, w, 3, -1);
  eldr__bus_out_end(&o);
  eldr__bus_head g;
  size_t off;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__bus_head_read(o.p, o.n, &g, &off, &d), 0);
  assert_string_equal(g.replica, "router-a");
  assert_int_equal(g.seq, 7);
  assert_int_equal(g.nrec, 2);
  for (int sign = 1; sign >= -1; sign -= 2) {
    eldr__bus_rec r;
    assert_int_equal(eldr__bus_rec_read(o.p, o.n, &off, &g, &r, &d), 0);
    assert_int_equal(r.dec, 0xfeed);
    assert_int_equal(r.n, sign);
    assert_int_equal(r.ctx, 120 * sign);
    size_t pos = 0;
    int64_t prev = -1;
    for (int k = 0; k < 3; k++) {
      uint32_t ix;
      int64_t v;
      eldr__bus_pair_next(&r, &pos, &prev, &ix, &v);
      assert_int_equal(ix, idx[k]);
      assert_true(v == sign * (int64_t)w[k]);
    }
  }
  assert_int_equal(off, o.n);
  /* cut anywhere: the head or a record refuses it */
  for (size_t cut = 0; cut < o.n; cut++) {
    size_t of2;
    eldr__bus_head g2;
    if (eldr__bus_head_read(o.p, cut, &g2, &of2, &d)) continue;
    eldr__bus_rec r;
    int bad = 0;
    for (uint32_t i = 0; i < g2.nrec && !bad; i++) bad = eldr__bus_rec_read(o.p, cut, &of2, &g2, &r, &d) != 0;
    assert_true(bad);
  }
  /* an index past the shape */
  eldr__bus_out_head(&o, &h);
  uint32_t far[1] = {32}, one[1] = {1};
  eldr__bus_out_rec32(&o, 1, 1, 1, far, one, 1, 1);
  eldr__bus_out_end(&o);
  assert_int_equal(eldr__bus_head_read(o.p, o.n, &g, &off, &d), 0);
  eldr__bus_rec r;
  assert_int_equal(eldr__bus_rec_read(o.p, o.n, &off, &g, &r, &d), ELDR_EPARSE);
  assert_non_null(strstr(d.msg, "index"));
  eldr__bus_out_free(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_threads),
      cmocka_unit_test(test_codec),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
