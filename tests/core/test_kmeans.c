/* test_kmeans.c — spherical K-means, balanced and vanilla. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"
#include "eldr/kmeans.h"
#include "eldr/rng.h"

/* Random sparse non-negative unit rows (signature-like); `zero_every` > 0
 * makes every such row zero. density in (0, 1]. */
static float *random_rows(eldr_rng *r, size_t n, size_t dim, double density, size_t zero_every) {
  float *x = calloc(n * dim, sizeof *x);
  assert_non_null(x);
  for (size_t i = 0; i < n; i++) {
    if (zero_every && i % zero_every == zero_every - 1) continue;
    double nn = 0;
    for (size_t j = 0; j < dim; j++)
      if (eldr_rng_uniform(r) < density) {
        x[i * dim + j] = (float)(0.1 + eldr_rng_uniform(r));
        nn += (double)x[i * dim + j] * x[i * dim + j];
      }
    if (nn == 0) {
      x[i * dim + eldr_rng_below(r, dim)] = 1.0f;
      nn = 1;
    }
    for (size_t j = 0; j < dim; j++) x[i * dim + j] = (float)(x[i * dim + j] / sqrt(nn));
  }
  return x;
}

/* Clusters on disjoint supports: cluster g uses dims [g*w, (g+1)*w). Row i
 * belongs to truth[i]. */
static float *separated(eldr_rng *r, const size_t *counts, size_t groups, size_t w, size_t *n_out,
                        int **truth_out) {
  size_t n = 0;
  for (size_t g = 0; g < groups; g++) n += counts[g];
  size_t dim = groups * w;
  float *x = calloc(n * dim, sizeof *x);
  int *truth = malloc(n * sizeof *truth);
  assert_non_null(x);
  assert_non_null(truth);
  /* interleave the groups so that order carries no information */
  size_t left[16];
  memcpy(left, counts, groups * sizeof *left);
  for (size_t i = 0; i < n; i++) {
    size_t g;
    do g = eldr_rng_below(r, groups);
    while (left[g] == 0);
    left[g]--;
    truth[i] = (int)g;
    double nn = 0;
    for (size_t j = 0; j < w; j++) {
      float v = (float)(0.2 + eldr_rng_uniform(r));
      x[i * dim + g * w + j] = v;
      nn += (double)v * v;
    }
    for (size_t j = 0; j < w; j++) x[i * dim + g * w + j] = (float)(x[i * dim + g * w + j] / sqrt(nn));
  }
  *n_out = n;
  *truth_out = truth;
  return x;
}

static double cosine(const float *a, const float *b, size_t dim) {
  double s = 0, na = 0, nb = 0;
  for (size_t j = 0; j < dim; j++) {
    s += (double)a[j] * b[j];
    na += (double)a[j] * a[j];
    nb += (double)b[j] * b[j];
  }
  return (na > 0 && nb > 0) ? s / sqrt(na * nb) : 0.0;
}

/* Validates the output and returns the recomputed objective. */
static double check_output(const float *x, size_t n, size_t dim, size_t k, int balanced,
                           const float *cent, const int *lab, const size_t *sizes,
                           const eldr_kmeans_result *res) {
  size_t cnt[64] = {0};
  assert_true(k <= 64);
  for (size_t i = 0; i < n; i++) {
    assert_true(lab[i] >= 0 && (size_t)lab[i] < k);
    cnt[lab[i]]++;
  }
  size_t cap = (n + k - 1) / k;
  for (size_t c = 0; c < k; c++) {
    assert_int_equal(cnt[c], sizes[c]);
    if (balanced) assert_true(cnt[c] <= cap);
    double nn = 0;
    for (size_t j = 0; j < dim; j++) {
      assert_true(isfinite(cent[c * dim + j]));
      nn += (double)cent[c * dim + j] * cent[c * dim + j];
    }
    assert_true(fabs(sqrt(nn) - 1.0) < 1e-5);
  }
  double obj = 0;
  for (size_t i = 0; i < n; i++) obj += 1.0 - cosine(x + i * dim, cent + (size_t)lab[i] * dim, dim);
  assert_true(fabs(obj - res->objective) < 1e-4 * (1.0 + obj));
  return obj;
}

static void test_capacity_never_exceeded(void **state) {
  (void)state;
  eldr_rng r;
  eldr_rng_seed(&r, 2024);
  int runs = 0;
  for (int it = 0; it < 120; it++) {
    size_t n = 2 + eldr_rng_below(&r, 150);
    size_t k = 1 + eldr_rng_below(&r, n < 12 ? n : 12);
    size_t dim = 2 + eldr_rng_below(&r, 40);
    double density = it % 4 == 0 ? 0.9 : 0.2; /* dense and CSR paths */
    float *x = random_rows(&r, n, dim, density, it % 5 == 0 ? 7 : 0);
    float *cent = malloc(k * dim * sizeof *cent);
    int *lab = malloc(n * sizeof *lab);
    size_t *sizes = malloc(k * sizeof *sizes);
    assert_non_null(cent);
    assert_non_null(lab);
    assert_non_null(sizes);
    eldr_kmeans_opts o = {.k = k, .balanced = 1, .restarts = 1 + (int)(it % 3), .max_iter = 30,
                          .seed = (uint64_t)it * 77};
    eldr_kmeans_result res;
    assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &res), 0);
    check_output(x, n, dim, k, 1, cent, lab, sizes, &res);
    assert_true(res.iterations >= 1 && res.iterations <= 30);
    assert_true(res.restart >= 0 && res.restart < o.restarts);
    /* vanilla on the same data: valid, no empty cluster */
    o.balanced = 0;
    assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &res), 0);
    check_output(x, n, dim, k, 0, cent, lab, sizes, &res);
    for (size_t c = 0; c < k; c++) assert_true(sizes[c] >= 1);
    free(sizes);
    free(lab);
    free(cent);
    free(x);
    runs++;
  }
  assert_int_equal(runs, 120);
}

static void test_deterministic(void **state) {
  (void)state;
  eldr_rng r;
  eldr_rng_seed(&r, 1);
  const size_t n = 300, dim = 64, k = 6;
  for (int dense = 0; dense < 2; dense++) {
    float *x = random_rows(&r, n, dim, dense ? 0.8 : 0.1, 0);
    float c1[6 * 64], c2[6 * 64];
    int l1[300], l2[300];
    size_t s1[6], s2[6];
    eldr_kmeans_result r1, r2;
    for (int bal = 0; bal < 2; bal++) {
      eldr_kmeans_opts o = {.k = k, .balanced = bal, .restarts = 2, .max_iter = 50, .seed = 99};
      assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, c1, l1, s1, &r1), 0);
      assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, c2, l2, s2, &r2), 0);
      assert_memory_equal(c1, c2, sizeof c1);
      assert_memory_equal(l1, l2, sizeof l1);
      assert_memory_equal(s1, s2, sizeof s1);
      assert_true(r1.objective == r2.objective);
      assert_int_equal(r1.iterations, r2.iterations);
      /* other seeds: on unstructured data at least one of them differs */
      int differs = 0;
      for (uint64_t s = 100; s < 106 && !differs; s++) {
        o.seed = s;
        assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, c2, l2, s2, &r2), 0);
        if (memcmp(c1, c2, sizeof c1) != 0 || memcmp(l1, l2, sizeof l1) != 0) differs = 1;
      }
      assert_true(differs);
    }
    free(x);
  }
}

/* Same partition as truth up to a relabelling. */
static void assert_same_partition(const int *lab, const int *truth, size_t n, size_t k) {
  int map[16];
  for (size_t g = 0; g < 16; g++) map[g] = -1;
  unsigned char taken[16] = {0};
  for (size_t i = 0; i < n; i++) {
    int g = truth[i];
    if (map[g] < 0) {
      assert_false(taken[lab[i]]);
      map[g] = lab[i];
      taken[lab[i]] = 1;
    }
    assert_int_equal(map[g], lab[i]);
  }
  (void)k;
}

static void test_separated_recovered(void **state) {
  (void)state;
  eldr_rng r;
  eldr_rng_seed(&r, 31337);
  for (int trial = 0; trial < 8; trial++) {
    size_t groups = 2 + (size_t)trial % 6;
    size_t counts[16];
    for (size_t g = 0; g < groups; g++) counts[g] = 40;
    size_t n;
    int *truth;
    float *x = separated(&r, counts, groups, 5, &n, &truth);
    size_t dim = groups * 5;
    float *cent = malloc(groups * dim * sizeof *cent);
    int *lab = malloc(n * sizeof *lab);
    size_t sizes[16];
    assert_non_null(cent);
    assert_non_null(lab);
    for (int bal = 0; bal < 2; bal++) {
      eldr_kmeans_opts o = {.k = groups, .balanced = bal, .restarts = 3, .max_iter = 100,
                            .seed = (uint64_t)trial};
      eldr_kmeans_result res;
      assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &res), 0);
      check_output(x, n, dim, groups, bal, cent, lab, sizes, &res);
      assert_same_partition(lab, truth, n, groups);
      /* each centroid lives on its group's support only */
      for (size_t i = 0; i < n; i++) {
        const float *c = cent + (size_t)lab[i] * dim;
        for (size_t j = 0; j < dim; j++)
          if (j / 5 != (size_t)truth[i]) assert_true(c[j] == 0.0f);
      }
    }
    free(lab);
    free(cent);
    free(x);
    free(truth);
  }
}

static void test_imbalanced(void **state) {
  (void)state;
  eldr_rng r;
  eldr_rng_seed(&r, 8);
  const size_t counts[3] = {140, 30, 30};
  size_t n;
  int *truth;
  float *x = separated(&r, counts, 3, 6, &n, &truth);
  size_t dim = 18, k = 3, cap = (n + k - 1) / k;
  float cent[3 * 18];
  int *lab = malloc(n * sizeof *lab);
  assert_non_null(lab);
  size_t sizes[3];
  eldr_kmeans_result rv, rb;
  eldr_kmeans_opts o = {.k = k, .balanced = 0, .restarts = 2, .max_iter = 100, .seed = 5};
  assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &rv), 0);
  check_output(x, n, dim, k, 0, cent, lab, sizes, &rv);
  size_t mx = 0;
  for (size_t c = 0; c < k; c++) mx = sizes[c] > mx ? sizes[c] : mx;
  assert_true(mx > cap); /* vanilla follows the data: one oversize cluster */
  assert_same_partition(lab, truth, n, k);
  o.balanced = 1;
  assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &rb), 0);
  check_output(x, n, dim, k, 1, cent, lab, sizes, &rb);
  for (size_t c = 0; c < k; c++) assert_true(sizes[c] <= cap);
  /* Balancing costs something here: vanilla found the natural partition
   * (zero loss within reach of the cos geometry), balanced must split the
   * big group. */
  assert_true(rb.objective > rv.objective);
  /* For its own centroids, the balanced objective is at least the
   * unconstrained nearest-centroid cost. */
  double lower = 0;
  for (size_t i = 0; i < n; i++) {
    double best = -2;
    for (size_t c = 0; c < k; c++) best = fmax(best, cosine(x + i * dim, cent + c * dim, dim));
    lower += 1.0 - best;
  }
  assert_true(rb.objective >= lower - 1e-6);
  free(lab);
  free(x);
  free(truth);
}

static void test_restarts_monotone(void **state) {
  (void)state;
  /* Restart 0 is the same run whatever the restart count, so more restarts
   * can only lower (or keep) the objective. */
  eldr_rng r;
  eldr_rng_seed(&r, 4);
  const size_t n = 200, dim = 30, k = 7;
  float *x = random_rows(&r, n, dim, 0.3, 0);
  float cent[7 * 30];
  int lab[200];
  size_t sizes[7];
  for (int bal = 0; bal < 2; bal++) {
    eldr_kmeans_result r1, r5;
    eldr_kmeans_opts o = {.k = k, .balanced = bal, .restarts = 1, .max_iter = 100, .seed = 11};
    assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &r1), 0);
    o.restarts = 5;
    assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &r5), 0);
    assert_true(r5.objective <= r1.objective);
    /* res is optional, sizes too */
    assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, NULL, NULL), 0);
  }
  free(x);
}

/* Restart r runs from the r-th splitmix64 output of the seed, i.e. exactly
 * restart 0 of seed + r * golden gamma. However the restarts are spread over
 * threads, the result must be the best single restart, ties to the lowest r. */
static void test_restarts_equal_best_single_run(void **state) {
  (void)state;
  eldr_rng r;
  eldr_rng_seed(&r, 9);
  const size_t n = 240, dim = 24, k = 6;
  float *x = random_rows(&r, n, dim, 0.25, 0);
  float cent[6 * 24], one[6 * 24], best_cent[6 * 24];
  int lab[240], one_lab[240], best_lab[240];
  for (int bal = 0; bal < 2; bal++) {
    for (int restarts = 1; restarts <= 5; restarts++) {
      const uint64_t seed = 1234 + (uint64_t)restarts;
      double best = INFINITY;
      int best_r = -1;
      for (int rr = 0; rr < restarts; rr++) {
        eldr_kmeans_opts o1 = {.k = k, .balanced = bal, .restarts = 1, .max_iter = 100,
                               .seed = seed + (uint64_t)rr * 0x9e3779b97f4a7c15ULL};
        eldr_kmeans_result r1;
        assert_int_equal(eldr_kmeans_fit(x, n, dim, &o1, one, one_lab, NULL, &r1), 0);
        if (r1.objective < best) {
          best = r1.objective;
          best_r = rr;
          memcpy(best_cent, one, sizeof one);
          memcpy(best_lab, one_lab, sizeof one_lab);
        }
      }
      eldr_kmeans_opts o = {.k = k, .balanced = bal, .restarts = restarts, .max_iter = 100, .seed = seed};
      eldr_kmeans_result rn;
      assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, NULL, &rn), 0);
      assert_true(rn.objective == best);
      assert_int_equal(rn.restart, best_r);
      assert_memory_equal(cent, best_cent, sizeof cent);
      assert_memory_equal(lab, best_lab, sizeof lab);
    }
  }
  free(x);
}

static void test_objective_monotone_in_iterations(void **state) {
  (void)state;
  /* A run with max_iter m + 1 extends the run with max_iter m by one
   * assignment step (exact: optimal for the current centroids) and one
   * centroid update (optimal for the labels), so its objective is not
   * higher (up to float scoring error). */
  eldr_rng r;
  eldr_rng_seed(&r, 21);
  const size_t n = 400, dim = 48, k = 9;
  float *x = random_rows(&r, n, dim, 0.25, 13);
  float cent[9 * 48];
  int lab[400];
  size_t sizes[9];
  for (int bal = 0; bal < 2; bal++) {
    double prev = INFINITY;
    int converged_at = 0;
    for (int m = 1; m <= 25; m++) {
      eldr_kmeans_opts o = {.k = k, .balanced = bal, .restarts = 1, .max_iter = m, .seed = 8};
      eldr_kmeans_result res;
      assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &res), 0);
      assert_true(res.objective <= prev + 1e-4);
      assert_true(res.iterations <= m);
      if (res.iterations < m && !converged_at) converged_at = m;
      prev = res.objective;
    }
    assert_true(converged_at > 2); /* it did iterate, and it converged */
  }
  free(x);
}

static void test_zero_rows_and_degenerate(void **state) {
  (void)state;
  /* All-zero input: every cost is 1, centroids still unit. */
  float z[10 * 4] = {0};
  float cent[5 * 4];
  int lab[10];
  size_t sizes[5];
  eldr_kmeans_result res;
  for (int bal = 0; bal < 2; bal++) {
    eldr_kmeans_opts o = {.k = 5, .balanced = bal, .restarts = 2, .max_iter = 10, .seed = 1};
    assert_int_equal(eldr_kmeans_fit(z, 10, 4, &o, cent, lab, sizes, &res), 0);
    check_output(z, 10, 4, 5, bal, cent, lab, sizes, &res);
    assert_true(fabs(res.objective - 10.0) < 1e-9);
  }
  /* k == n: every point its own cluster (balanced: cap 1). */
  eldr_rng r;
  eldr_rng_seed(&r, 2);
  float *x = random_rows(&r, 9, 6, 0.5, 0);
  float c9[9 * 6];
  int l9[9];
  size_t s9[9];
  eldr_kmeans_opts o = {.k = 9, .balanced = 1, .restarts = 1, .max_iter = 10, .seed = 3};
  assert_int_equal(eldr_kmeans_fit(x, 9, 6, &o, c9, l9, s9, &res), 0);
  check_output(x, 9, 6, 9, 1, c9, l9, s9, &res);
  for (int c = 0; c < 9; c++) assert_int_equal(s9[c], 1);
  /* k == 1: one cluster, centroid = normalised mean. */
  o.k = 1;
  assert_int_equal(eldr_kmeans_fit(x, 9, 6, &o, c9, l9, s9, &res), 0);
  double mean[6] = {0}, nn = 0;
  for (int i = 0; i < 9; i++)
    for (int j = 0; j < 6; j++) mean[j] += x[i * 6 + j];
  for (int j = 0; j < 6; j++) nn += mean[j] * mean[j];
  for (int j = 0; j < 6; j++) assert_true(fabs(c9[j] - mean[j] / sqrt(nn)) < 1e-6);
  /* Duplicated points with more clusters than distinct points. */
  float d[8 * 2];
  for (int i = 0; i < 8; i++) {
    d[i * 2] = i < 4 ? 1.0f : 0.0f;
    d[i * 2 + 1] = i < 4 ? 0.0f : 1.0f;
  }
  float c4[4 * 2];
  int l4[8];
  size_t s4[4];
  for (int bal = 0; bal < 2; bal++) {
    eldr_kmeans_opts o4 = {.k = 4, .balanced = bal, .restarts = 2, .max_iter = 20, .seed = 9};
    assert_int_equal(eldr_kmeans_fit(d, 8, 2, &o4, c4, l4, s4, &res), 0);
    check_output(d, 8, 2, 4, bal, c4, l4, s4, &res);
    assert_true(res.objective < 1e-6);
  }
  free(x);
}

static void test_direction_and_empty_balanced(void **state) {
  (void)state;
  /* Rows are used by direction: scaling each row by a positive factor
   * keeps the (well-separated) partition. */
  eldr_rng r;
  eldr_rng_seed(&r, 17);
  const size_t counts[4] = {30, 30, 30, 30};
  size_t n;
  int *truth;
  float *x = separated(&r, counts, 4, 5, &n, &truth);
  size_t dim = 20;
  float *y = malloc(n * dim * sizeof *y);
  float cent[4 * 20];
  int *l1 = malloc(n * sizeof *l1), *l2 = malloc(n * sizeof *l2);
  size_t sizes[4];
  assert_non_null(y);
  assert_non_null(l1);
  assert_non_null(l2);
  for (size_t i = 0; i < n; i++) {
    float f = (float)(0.1 + 5.0 * eldr_rng_uniform(&r));
    for (size_t j = 0; j < dim; j++) y[i * dim + j] = x[i * dim + j] * f;
  }
  eldr_kmeans_opts o = {.k = 4, .balanced = 1, .restarts = 2, .max_iter = 50, .seed = 3};
  eldr_kmeans_result res;
  assert_int_equal(eldr_kmeans_fit(x, n, dim, &o, cent, l1, sizes, &res), 0);
  assert_int_equal(eldr_kmeans_fit(y, n, dim, &o, cent, l2, sizes, &res), 0);
  assert_same_partition(l1, truth, n, 4);
  assert_same_partition(l2, truth, n, 4);
  for (size_t c = 0; c < 4; c++) {
    double nn = 0;
    for (size_t j = 0; j < dim; j++) nn += (double)cent[c * dim + j] * cent[c * dim + j];
    assert_true(fabs(sqrt(nn) - 1.0) < 1e-5);
  }
  free(l2);
  free(l1);
  free(y);
  free(x);
  free(truth);

  /* n = 9, k = 4, cap = 3: three groups of three identical points. After
   * three seeds every distance is 0, so the fourth centroid duplicates one
   * of them, and the exact assignment may fill three clusters and leave
   * the fourth empty; it must be refilled without breaking the capacity. */
  for (uint64_t seed = 0; seed < 20; seed++) {
    float z[9 * 3] = {0};
    for (size_t i = 0; i < 9; i++) z[i * 3 + (i + seed) % 3] = 1.0f;
    float cz[4 * 3];
    int lz[9];
    size_t sz[4];
    eldr_kmeans_opts oz = {.k = 4, .balanced = 1, .restarts = 1, .max_iter = 20, .seed = seed};
    assert_int_equal(eldr_kmeans_fit(z, 9, 3, &oz, cz, lz, sz, &res), 0);
    check_output(z, 9, 3, 4, 1, cz, lz, sz, &res);
    for (size_t c = 0; c < 4; c++) assert_true(sz[c] >= 1 && sz[c] <= 3);
    assert_true(fabs(res.objective) < 1e-6);
  }
}

static void test_errors(void **state) {
  (void)state;
  float x[4 * 2] = {1, 0, 0, 1, 1, 0, 0, 1};
  float cent[8];
  int lab[4];
  eldr_kmeans_opts o = {.k = 2, .balanced = 1, .restarts = 1, .max_iter = 10, .seed = 0};
  o.k = 0;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  o.k = 5;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  o.k = 2;
  o.restarts = 0;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  o.restarts = -3;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  o.restarts = 1;
  o.max_iter = 0;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  o.max_iter = 10;
  assert_int_equal(eldr_kmeans_fit(NULL, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, NULL, cent, lab, NULL, NULL), ELDR_EINVAL);
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, NULL, lab, NULL, NULL), ELDR_EINVAL);
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, NULL, NULL, NULL), ELDR_EINVAL);
  assert_int_equal(eldr_kmeans_fit(x, 4, 0, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  assert_int_equal(eldr_kmeans_fit(x, 0, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  x[3] = NAN;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  x[3] = INFINITY;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), ELDR_EINVAL);
  x[3] = 1;
  assert_int_equal(eldr_kmeans_fit(x, 4, 2, &o, cent, lab, NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capacity_never_exceeded),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_separated_recovered),
      cmocka_unit_test(test_imbalanced),
      cmocka_unit_test(test_restarts_monotone),
      cmocka_unit_test(test_restarts_equal_best_single_run),
      cmocka_unit_test(test_objective_monotone_in_iterations),
      cmocka_unit_test(test_zero_rows_and_degenerate),
      cmocka_unit_test(test_direction_and_empty_balanced),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
