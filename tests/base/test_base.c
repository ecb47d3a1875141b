/* test_base.c — the base layer (clock, growth, bounded file read, quantile,
 * parallel-for, UUIDs) and core's batch-union kernel against a direct count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eldr/batch_union.h"
#include "eldr/clock.h"
#include "eldr/grow.h"
#include "eldr/parallel.h"
#include "eldr/quantile.h"
#include "eldr/readfile.h"
#include "eldr/rng.h"
#include "eldr/uuid.h"

static void test_clock(void **state) {
  (void)state;
  double a = eldr_clock_now();
  usleep(2000);
  double b = eldr_clock_now();
  assert_true(a > 0);
  assert_true(b - a >= 0.0015 && b - a < 5.0);
}

static void test_grow(void **state) {
  (void)state;
  int *p = NULL;
  size_t cap = 0;
  for (int i = 0; i < 1000; i++) {
    assert_int_equal(eldr_grow_array(p, cap, (size_t)i + 1), 0);
    assert_true(cap >= (size_t)i + 1);
    p[i] = i;
  }
  for (int i = 0; i < 1000; i++) assert_int_equal(p[i], i);
  size_t before = cap;
  assert_int_equal(eldr_grow_array(p, cap, 10), 0); /* never shrinks */
  assert_int_equal(cap, before);
  /* an impossible size fails and leaves the array as it was */
  int *keep = p;
  assert_int_equal(eldr_grow(&p, &cap, SIZE_MAX / 2, sizeof *p, 16), ELDR_ENOMEM);
  assert_ptr_equal(p, keep);
  assert_int_equal(cap, before);
  assert_int_equal(p[999], 999);
  free(p);
}

static void test_quantile(void **state) {
  (void)state;
  double v[] = {4, 1, 3, 2};
  assert_true(fabs(eldr_quantile(v, 4, 0.5) - 2.5) < 1e-12);
  assert_true(v[0] == 1 && v[3] == 4); /* sorted in place */
  assert_true(fabs(eldr_quantile_sorted(v, 4, 0.9) - 3.7) < 1e-12);
  assert_true(eldr_quantile_sorted(v, 4, 0) == 1);
  assert_true(eldr_quantile_sorted(v, 4, 1) == 4);
  assert_true(eldr_quantile_sorted(v, 4, -1) == 1); /* clamped */
  assert_true(eldr_quantile_sorted(v, 4, 2) == 4);
  assert_true(eldr_quantile_sorted(v, 1, 0.3) == 1);
  assert_true(isnan(eldr_quantile(v, 0, 0.5)));
}

static void test_read_file(void **state) {
  (void)state;
  char path[] = "/tmp/eldr_test_base_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char text[] = "hello, base layer\n";
  assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
  close(fd);
  char *buf = NULL;
  size_t len = 0;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_read_file(path, 1024, "test file", &buf, &len, &d), 0);
  assert_int_equal(len, sizeof text - 1);
  assert_string_equal(buf, text); /* NUL-terminated */
  free(buf);
  /* the bound: one byte short is ELDR_ERANGE, naming the file */
  assert_int_equal(eldr_read_file(path, sizeof text - 2, "test file", &buf, &len, &d), ELDR_ERANGE);
  assert_null(buf);
  assert_non_null(strstr(d.msg, path));
  assert_non_null(strstr(d.msg, "test file"));
  unlink(path);
  assert_int_equal(eldr_read_file(path, 1024, NULL, &buf, &len, &d), ELDR_EIO);
  assert_null(buf);
  assert_non_null(strstr(d.msg, "cannot open"));
  /* a pipe through eldr_read_fd */
  int p[2];
  assert_int_equal(pipe(p), 0);
  assert_int_equal(write(p[1], "abc", 3), 3);
  close(p[1]);
  assert_int_equal(eldr_read_fd(p[0], "pipe", 100, NULL, &buf, &len, &d), 0);
  close(p[0]);
  assert_int_equal(len, 3);
  assert_string_equal(buf, "abc");
  free(buf);
}

typedef struct par_ctx {
  atomic_int *hits;
  atomic_int calls;
} par_ctx;

static void par_body(void *arg, size_t i) {
  par_ctx *c = arg;
  atomic_fetch_add(&c->hits[i], 1);
  atomic_fetch_add(&c->calls, 1);
}

static void test_parallel_for(void **state) {
  (void)state;
  enum { N = 1000 };
  atomic_int hits[N];
  for (unsigned threads = 0; threads <= 8; threads += 4) {
    for (size_t i = 0; i < N; i++) atomic_init(&hits[i], 0);
    par_ctx c = {.hits = hits};
    atomic_init(&c.calls, 0);
    eldr_parallel_for(N, threads, par_body, &c);
    assert_int_equal(atomic_load(&c.calls), N);
    for (size_t i = 0; i < N; i++) assert_int_equal(atomic_load(&hits[i]), 1);
  }
  par_ctx c = {.hits = hits};
  atomic_init(&c.calls, 0);
  eldr_parallel_for(0, 4, par_body, &c); /* no tasks: no calls */
  assert_int_equal(atomic_load(&c.calls), 0);
}

/* The union kernel against a direct per-layer count of distinct ids, with
 * experts spanning several 64-bit words and duplicates across tokens. */
static void test_batch_union(void **state) {
  (void)state;
  const eldr_shape s = {3, 200, 4};
  eldr_union u;
  assert_int_equal(eldr_union_init(&u, &s), 0);
  eldr_rng r;
  eldr_rng_seed(&r, 7);
  enum { B = 9 };
  uint16_t sel[B][3 * 4];
  uint64_t tb[B][3 * 4]; /* per-token bitsets: L * W = 3 * 4 words */
  assert_int_equal(eldr_union_token_words(&s), 12);
  for (int rep = 0; rep < 20; rep++) {
    eldr_union_clear(&u);
    memset(tb, 0, sizeof tb);
    for (int b = 0; b < B; b++) {
      for (int j = 0; j < 12; j++) sel[b][j] = (uint16_t)eldr_rng_below(&r, rep < 10 ? 200 : 9);
      eldr_union_set_bits(tb[b], 3, 4, 4, sel[b]);
      if (b % 2) eldr_union_add_token(&u, sel[b]);
      else eldr_union_add_bits(&u, tb[b]);
    }
    uint32_t per[3];
    uint64_t sum = eldr_union_count(&u, per);
    uint64_t want_sum = 0;
    for (int l = 0; l < 3; l++) {
      uint8_t seen[200] = {0};
      uint32_t want = 0;
      for (int b = 0; b < B; b++)
        for (int k = 0; k < 4; k++)
          if (!seen[sel[b][l * 4 + k]]++) want++;
      assert_int_equal(per[l], want);
      want_sum += want;
    }
    assert_int_equal(sum, want_sum);
  }
  eldr_union_free(&u);
  eldr_shape bad = {0, 8, 1};
  assert_int_equal(eldr_union_init(&u, &bad), ELDR_EINVAL);
  eldr_union_free(&u);
}

/* Version-4 UUIDs: the text form (8-4-4-4-12 lowercase hex), the version
 * nibble 4, the RFC 4122 variant (8, 9, a or b), and 2000 in a row (more
 * than one block of the thread's random pool) all different. */
static int cmp_uuid(const void *a, const void *b) { return strcmp(a, b); }

static void test_uuid4(void **state) {
  (void)state;
  enum { N = 2000 };
  char(*u)[ELDR_UUID_LEN + 1] = calloc(N, sizeof *u);
  assert_non_null(u);
  for (int i = 0; i < N; i++) {
    memset(u[i], 'x', sizeof u[i]);
    assert_int_equal(eldr_uuid4(u[i]), 0);
    assert_int_equal(strlen(u[i]), ELDR_UUID_LEN);
    for (int k = 0; k < ELDR_UUID_LEN; k++) {
      if (k == 8 || k == 13 || k == 18 || k == 23) assert_int_equal(u[i][k], '-');
      else assert_non_null(strchr("0123456789abcdef", u[i][k]));
    }
    assert_int_equal(u[i][14], '4');
    assert_non_null(strchr("89ab", u[i][19]));
  }
  qsort(u, N, sizeof *u, cmp_uuid);
  for (int i = 1; i < N; i++) assert_true(strcmp(u[i - 1], u[i]) != 0);
  free(u);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uuid4),
      cmocka_unit_test(test_clock),        cmocka_unit_test(test_grow),
      cmocka_unit_test(test_quantile),     cmocka_unit_test(test_read_file),
      cmocka_unit_test(test_parallel_for), cmocka_unit_test(test_batch_union),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
