/* Tests for eldr/quality.h: average ranks and Spearman on hand-worked cases
 * with ties, pair sampling, rho on crafted data, greedy layer selection, and
 * the consistency of the greedy fast path with eldr_quality_rho on
 * signatures built by eldr_signature_build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quality_int.h"
#include "eldr/quality.h"
#include "eldr/rng.h"
#include "eldr/signature.h"
#include "eldr/trace.h"

static void assert_close(double got, double want, double tol) {
  if (!(fabs(got - want) <= tol)) fail_msg("got %.12g, want %.12g (tol %g)", got, want, tol);
}

/* ---- ranks and Spearman ------------------------------------------------- */

static void test_rank_average(void **state) {
  (void)state;
  /* {10,20,20,30}: the two 20s share positions 2 and 3 -> 2.5. */
  const double x[4] = {10, 20, 20, 30};
  double r[4];
  assert_int_equal(eldr_rank_average(x, 4, r), 0);
  assert_close(r[0], 1, 0);
  assert_close(r[1], 2.5, 0);
  assert_close(r[2], 2.5, 0);
  assert_close(r[3], 4, 0);
  /* {3,1,3,3,2}: sorted 1 (pos 1), 2 (pos 2), 3,3,3 (pos 3..5 -> 4). */
  const double y[5] = {3, 1, 3, 3, 2};
  double ry[5];
  assert_int_equal(eldr_rank_average(y, 5, ry), 0);
  const double want[5] = {4, 1, 4, 4, 2};
  for (int i = 0; i < 5; i++) assert_close(ry[i], want[i], 0);
  /* All equal: everybody gets (n+1)/2. */
  const double c[3] = {7, 7, 7};
  double rc[3];
  assert_int_equal(eldr_rank_average(c, 3, rc), 0);
  for (int i = 0; i < 3; i++) assert_close(rc[i], 2, 0);
  const double bad[2] = {1, NAN};
  assert_int_equal(eldr_rank_average(bad, 2, rc), ELDR_EINVAL);
  assert_int_equal(eldr_rank_average(NULL, 2, rc), ELDR_EINVAL);
  assert_int_equal(eldr_rank_average(x, 0, rc), 0);
}

static void test_spearman_hand_worked(void **state) {
  (void)state;
  double rho = 99;
  /* x = {1,2,2,3} -> rx = {1, 2.5, 2.5, 4}; y = {1,3,2,4} -> ry = {1,3,2,4}.
   * mean rank 2.5: dx = {-1.5, 0, 0, 1.5}, dy = {-1.5, .5, -.5, 1.5}
   * sxy = 2.25 + 2.25 = 4.5, sxx = 4.5, syy = 2.25+.25+.25+2.25 = 5
   * rho = 4.5 / sqrt(22.5) = 3 / sqrt(10) = 0.948683298 */
  const double x1[4] = {1, 2, 2, 3}, y1[4] = {1, 3, 2, 4};
  assert_int_equal(eldr_spearman(x1, y1, 4, &rho), 0);
  assert_close(rho, 3 / sqrt(10.0), 1e-12);
  /* x = {1,1,2,2} -> {1.5,1.5,3.5,3.5}; y = {1,2,2,1} -> {1.5,3.5,3.5,1.5}
   * dx = {-1,-1,1,1}, dy = {-1,1,1,-1}: sxy = 1-1+1-1 = 0 -> rho = 0 */
  const double x2[4] = {1, 1, 2, 2}, y2[4] = {1, 2, 2, 1};
  assert_int_equal(eldr_spearman(x2, y2, 4, &rho), 0);
  assert_close(rho, 0, 1e-12);
  /* Ties on both sides: x = {5,1,5,2,3} -> rx = {4.5,1,4.5,2,3};
   * y = {2,1,3,2,2} -> ry = {3,1,5,3,3}; mean 3:
   * dx = {1.5,-2,1.5,-1,0}, dy = {0,-2,2,0,0}
   * sxy = 4 + 3 = 7, sxx = 2.25+4+2.25+1 = 9.5, syy = 8
   * rho = 7 / sqrt(76) = 0.802955069 */
  const double x3[5] = {5, 1, 5, 2, 3}, y3[5] = {2, 1, 3, 2, 2};
  assert_int_equal(eldr_spearman(x3, y3, 5, &rho), 0);
  assert_close(rho, 7 / sqrt(76.0), 1e-12);
  /* Monotone but non-linear: rho = 1; reversed: -1. */
  const double x4[4] = {1, 2, 3, 4}, y4[4] = {1, 8, 27, 64}, y5[4] = {9, 4, 1, 0};
  assert_int_equal(eldr_spearman(x4, y4, 4, &rho), 0);
  assert_close(rho, 1, 1e-12);
  assert_int_equal(eldr_spearman(x4, y5, 4, &rho), 0);
  assert_close(rho, -1, 1e-12);
  /* Undefined cases. */
  const double c[4] = {2, 2, 2, 2};
  rho = 99;
  assert_int_equal(eldr_spearman(x4, c, 4, &rho), ELDR_EEMPTY);
  assert_int_equal(eldr_spearman(c, x4, 4, &rho), ELDR_EEMPTY);
  assert_close(rho, 99, 0);
  assert_int_equal(eldr_spearman(x4, y4, 1, &rho), ELDR_EINVAL);
  assert_int_equal(eldr_spearman(x4, NULL, 4, &rho), ELDR_EINVAL);
}

/* ---- pairs -------------------------------------------------------------- */

static void check_pairs(size_t n, size_t max_pairs, uint64_t seed, size_t want_count) {
  eldr_pairs_opts po = {max_pairs, seed};
  uint32_t *pi = NULL, *pj = NULL;
  size_t np = 0;
  assert_int_equal(eldr__quality_pairs(n, &po, &pi, &pj, &np), 0);
  assert_int_equal(np, want_count);
  for (size_t p = 0; p < np; p++) {
    assert_true(pi[p] < pj[p]);
    assert_true(pj[p] < n);
    if (p > 0) /* strictly increasing in (i, j): sorted and distinct */
      assert_true(pi[p - 1] < pi[p] || (pi[p - 1] == pi[p] && pj[p - 1] < pj[p]));
  }
  free(pi);
}

static void test_pairs(void **state) {
  (void)state;
  check_pairs(5, 0, 1, 10);    /* all pairs */
  check_pairs(5, 10, 1, 10);   /* exactly all */
  check_pairs(5, 1000, 1, 10); /* more than all */
  check_pairs(100, 500, 7, 500);   /* sampled directly (500 <= 4950/2) */
  check_pairs(40, 700, 7, 700);    /* sampled by complement (700 > 780/2) */
  check_pairs(40, 779, 7, 779);
  check_pairs(2, 1, 3, 1);

  /* All pairs in (i, j) order. */
  uint32_t *pi, *pj;
  size_t np;
  assert_int_equal(eldr__quality_pairs(4, NULL, &pi, &pj, &np), 0);
  const uint32_t wi[6] = {0, 0, 0, 1, 1, 2}, wj[6] = {1, 2, 3, 2, 3, 3};
  assert_int_equal(np, 6);
  for (int p = 0; p < 6; p++) {
    assert_int_equal(pi[p], wi[p]);
    assert_int_equal(pj[p], wj[p]);
  }
  free(pi);

  /* Same seed, same pairs; another seed, other pairs. */
  eldr_pairs_opts a = {300, 11}, b = {300, 11}, c = {300, 12};
  uint32_t *ai, *aj, *bi, *bj, *ci, *cj;
  size_t na, nb, nc;
  assert_int_equal(eldr__quality_pairs(200, &a, &ai, &aj, &na), 0);
  assert_int_equal(eldr__quality_pairs(200, &b, &bi, &bj, &nb), 0);
  assert_int_equal(eldr__quality_pairs(200, &c, &ci, &cj, &nc), 0);
  assert_memory_equal(ai, bi, 2 * na * sizeof *ai);
  assert_true(memcmp(ai, ci, 2 * na * sizeof *ai) != 0);
  free(ai);
  free(bi);
  free(ci);

  /* Uniform over pairs: n = 10 (45 pairs), 10 drawn, 4500 seeds -> each
   * pair expected 1000 times (sd about 30); complement path: 40 of 45,
   * expected 4000 times each (sd about 21). */
  const size_t draws[2] = {10, 40};
  for (int t = 0; t < 2; t++) {
    unsigned freq[10][10] = {{0}};
    for (uint64_t s = 0; s < 4500; s++) {
      eldr_pairs_opts po = {draws[t], s};
      assert_int_equal(eldr__quality_pairs(10, &po, &pi, &pj, &np), 0);
      assert_int_equal(np, draws[t]);
      for (size_t p = 0; p < np; p++) freq[pi[p]][pj[p]]++;
      free(pi);
    }
    const double expect = 4500.0 * (double)draws[t] / 45.0;
    for (int i = 0; i < 10; i++)
      for (int j = i + 1; j < 10; j++)
        if (fabs(freq[i][j] - expect) > 6 * sqrt(expect))
          fail_msg("pair (%d,%d) drawn %u times, expected about %.0f", i, j, freq[i][j], expect);
  }

  assert_int_equal(eldr__quality_pairs(1, NULL, &pi, &pj, &np), ELDR_EINVAL);
}

/* ---- rho on dense rows ------------------------------------------------- */

static void test_rho_hand_worked(void **state) {
  (void)state;
  /* Three requests, pairs (0,1), (0,2), (1,2).
   * sigs s0 = (1,0), s1 = (0,1), s2 = (1,1)/sqrt2:
   *   distances 1, 1-0.70711 = 0.29289, 0.29289 -> ranks {3, 1.5, 1.5}
   * dec d0 = (1,0), d1 = (0.6,0.8), d2 = (0.8,0.6):
   *   distances 0.4, 0.2, 1-0.96 = 0.04 -> ranks {3, 2, 1}
   * mean 2: dx = {1,-.5,-.5}, dy = {1,0,-1}: sxy = 1.5, sxx = 1.5, syy = 2
   * rho = 1.5 / sqrt(3) = 0.866025404 */
  const float r2 = (float)M_SQRT1_2;
  const float sigs[6] = {1, 0, 0, 1, r2, r2};
  const float dec[6] = {1, 0, 0.6f, 0.8f, 0.8f, 0.6f};
  double rho = 0;
  assert_int_equal(eldr_quality_rho(sigs, 2, dec, 2, 3, NULL, &rho), 0);
  assert_close(rho, 1.5 / sqrt(3.0), 1e-9);
  /* The same through eldr_spearman on the distances. */
  const double x[3] = {1, 1 - M_SQRT1_2, 1 - M_SQRT1_2}, y[3] = {0.4, 0.2, 0.04};
  double rho2 = 0;
  assert_int_equal(eldr_spearman(x, y, 3, &rho2), 0);
  assert_close(rho2, rho, 1e-9);
  /* A zero signature row is at distance 1 from everything:
   * s0 = (1,0), s1 = (0.6,0.8), s2 = 0: distances 0.4, 1, 1 -> {1, 2.5, 2.5}
   * dx = {-1,.5,.5}, dy = {1,0,-1}: sxy = -1.5 -> rho = -0.866025404 */
  const float sigz[6] = {1, 0, 0.6f, 0.8f, 0, 0};
  assert_int_equal(eldr_quality_rho(sigz, 2, dec, 2, 3, NULL, &rho), 0);
  assert_close(rho, -1.5 / sqrt(3.0), 1e-9);
  /* Orthogonal decode rows: every decode distance is 1 -> undefined. */
  const float dec_orth[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  const float sig3[9] = {1, 0, 0, 0.6f, 0.8f, 0, 0, 0, 1};
  assert_int_equal(eldr_quality_rho(sig3, 3, dec_orth, 3, 3, NULL, &rho), ELDR_EEMPTY);
  /* Constant signature distances -> undefined too. */
  assert_int_equal(eldr_quality_rho(dec_orth, 3, sig3, 3, 3, NULL, &rho), ELDR_EEMPTY);
  /* Bad input. */
  const float nan_row[6] = {1, 0, NAN, 0, 0, 1};
  assert_int_equal(eldr_quality_rho(nan_row, 2, dec, 2, 3, NULL, &rho), ELDR_ERANGE);
  assert_int_equal(eldr_quality_rho(sigs, 2, nan_row, 2, 3, NULL, &rho), ELDR_ERANGE);
  assert_int_equal(eldr_quality_rho(sigs, 2, dec, 2, 1, NULL, &rho), ELDR_EINVAL);
  assert_int_equal(eldr_quality_rho(sigs, 0, dec, 2, 3, NULL, &rho), ELDR_EINVAL);
  assert_int_equal(eldr_quality_rho(NULL, 2, dec, 2, 3, NULL, &rho), ELDR_EINVAL);
}

static void random_unit_rows(eldr_rng *r, float *m, size_t n, size_t dim) {
  for (size_t i = 0; i < n; i++) {
    for (size_t k = 0; k < dim; k++) m[i * dim + k] = (float)fabs(eldr_rng_normal(r));
    eldr_l2_normalize(m + i * dim, dim);
  }
}

static void test_rho_perfect_and_independent(void **state) {
  (void)state;
  enum { N = 200, D = 16 };
  float *a = malloc(N * D * sizeof *a), *b = malloc(N * D * sizeof *b);
  assert_non_null(a);
  assert_non_null(b);
  eldr_rng r;
  eldr_rng_seed(&r, 5);
  random_unit_rows(&r, a, N, D);
  random_unit_rows(&r, b, N, D);
  double rho = 0;
  /* Signatures that are the decode patterns predict them perfectly. */
  assert_int_equal(eldr_quality_rho(a, D, a, D, N, NULL, &rho), 0);
  assert_close(rho, 1.0, 1e-12);
  /* ... also on sampled pairs. */
  eldr_pairs_opts po = {3000, 9};
  assert_int_equal(eldr_quality_rho(a, D, a, D, N, &po, &rho), 0);
  assert_close(rho, 1.0, 1e-12);
  /* Independent signatures: rho near 0. */
  assert_int_equal(eldr_quality_rho(a, D, b, D, N, NULL, &rho), 0);
  assert_true(fabs(rho) < 0.1);
  /* Signatures that carry half of the decode pattern (first half of the
   * dimensions) plus noise: clearly positive, below 1. */
  float *c = malloc(N * D * sizeof *c);
  assert_non_null(c);
  for (size_t i = 0; i < N; i++) {
    for (size_t k = 0; k < D; k++) c[i * D + k] = k < D / 2 ? a[i * D + k] : b[i * D + k];
    eldr_l2_normalize(c + i * D, D);
  }
  double rho_half = 0;
  assert_int_equal(eldr_quality_rho(c, D, a, D, N, NULL, &rho_half), 0);
  assert_true(rho_half > 0.3 && rho_half < 0.95);
  /* Sampling: deterministic for a seed, close to the all-pairs value. */
  double s1 = 0, s2 = 0;
  po = (eldr_pairs_opts){5000, 1};
  assert_int_equal(eldr_quality_rho(c, D, a, D, N, &po, &s1), 0);
  assert_int_equal(eldr_quality_rho(c, D, a, D, N, &po, &s2), 0);
  assert_true(s1 == s2);
  assert_close(s1, rho_half, 0.05);
  free(c);
  free(b);
  free(a);
}

static void test_decode_patterns(void **state) {
  (void)state;
  const eldr_shape s = {1, 3, 1};
  const uint32_t c[6] = {3, 4, 0, 0, 0, 0};
  float out[6];
  eldr_quality_decode_patterns(&s, c, 2, out);
  assert_close(out[0], 0.6, 1e-7);
  assert_close(out[1], 0.8, 1e-7);
  assert_close(out[2], 0, 0);
  for (int i = 3; i < 6; i++) assert_close(out[i], 0, 0);
}

/* ---- greedy ------------------------------------------------------------- */

/* Crafted requests: n requests in 3 domains; decode counts are domain
 * experts {2d, 2d+1} in every layer plus noise. Prefill: layer `signal`
 * (if >= 0) uses the domain experts, other layers uniform random experts;
 * `weak` (if >= 0) mixes domain and random experts. A few requests have an
 * empty prefill, a few are exact duplicates of their predecessor. */
typedef struct crafted {
  eldr_shape s;
  size_t n;
  uint32_t *pre, *dec_counts;
  float *gates, *dec;
} crafted;

static void crafted_make(crafted *c, size_t n, uint32_t L, uint32_t E, int signal, int weak,
                         uint64_t seed) {
  c->s = (eldr_shape){L, E, 1};
  c->n = n;
  const size_t cells = (size_t)L * E;
  c->pre = calloc(n * cells, sizeof *c->pre);
  c->dec_counts = calloc(n * cells, sizeof *c->dec_counts);
  c->gates = calloc(n * cells, sizeof *c->gates);
  c->dec = malloc(n * cells * sizeof *c->dec);
  assert_non_null(c->pre);
  assert_non_null(c->dec_counts);
  assert_non_null(c->gates);
  assert_non_null(c->dec);
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) {
    uint32_t *p = c->pre + i * cells, *d = c->dec_counts + i * cells;
    float *g = c->gates + i * cells;
    if (i % 13 == 5) { /* duplicate of the previous request */
      memcpy(p, p - cells, cells * sizeof *p);
      memcpy(d, d - cells, cells * sizeof *d);
      memcpy(g, g - cells, cells * sizeof *g);
      continue;
    }
    const uint32_t dom = (uint32_t)(i % 3);
    for (uint32_t l = 0; l < L; l++) {
      for (int t = 0; t < 12; t++) {
        uint32_t e = (uint32_t)eldr_rng_below(&r, 4) == 0 ? (uint32_t)eldr_rng_below(&r, E)
                                                          : 2 * dom + (uint32_t)eldr_rng_below(&r, 2);
        d[l * E + e % E]++;
      }
      if (i % 17 == 3) continue; /* empty prefill */
      for (int t = 0; t < 6; t++) {
        uint32_t e = (uint32_t)eldr_rng_below(&r, E);
        if ((int)l == signal) e = 2 * dom + (uint32_t)eldr_rng_below(&r, 2);
        if ((int)l == weak && eldr_rng_below(&r, 2) == 0) e = 2 * dom + (uint32_t)eldr_rng_below(&r, 2);
        p[l * E + e % E]++;
        g[l * E + e % E] += (float)(0.2 + 0.8 * eldr_rng_uniform(&r));
      }
    }
  }
  eldr_quality_decode_patterns(&c->s, c->dec_counts, n, c->dec);
}

static void crafted_free(crafted *c) {
  free(c->pre);
  free(c->dec_counts);
  free(c->gates);
  free(c->dec);
}

static void test_greedy_picks_signal_layer(void **state) {
  (void)state;
  crafted c;
  crafted_make(&c, 90, 5, 8, 3, -1, 77);
  eldr_mask_step steps[5];
  uint8_t best[5];
  double best_rho = 0, all_rho = 0;
  assert_int_equal(eldr_quality_greedy_mask(&c.s, ELDR_REPR_COUNT, NULL, c.pre, NULL, c.dec,
                                            eldr_shape_cells(&c.s), c.n, NULL, steps, best,
                                            &best_rho, &all_rho),
                   0);
  assert_int_equal(steps[0].layer, 3);
  assert_true(best[3]);
  assert_true(steps[0].rho > 0.5);
  /* Noise layers dilute the signal: all layers is worse than the best. */
  assert_true(all_rho < best_rho - 0.1);
  assert_close(all_rho, steps[4].rho, 0);
  /* Every layer appears once. */
  int seen[5] = {0};
  for (int k = 0; k < 5; k++) seen[steps[k].layer]++;
  for (int k = 0; k < 5; k++) assert_int_equal(seen[k], 1);
  /* best_rho is the max over prefixes and best holds that prefix. */
  size_t kbest = 0;
  for (size_t k = 1; k < 5; k++)
    if (steps[k].rho > steps[kbest].rho) kbest = k;
  assert_close(best_rho, steps[kbest].rho, 0);
  for (size_t k = 0; k < 5; k++) assert_int_equal(best[steps[k].layer], k <= kbest);

  /* With a second, weaker informative layer, it comes second. */
  crafted c2;
  crafted_make(&c2, 90, 5, 8, 1, 4, 78);
  assert_int_equal(eldr_quality_greedy_mask(&c2.s, ELDR_REPR_BINARY, NULL, c2.pre, NULL, c2.dec,
                                            eldr_shape_cells(&c2.s), c2.n, NULL, steps, best,
                                            &best_rho, NULL),
                   0);
  assert_int_equal(steps[0].layer, 1);
  assert_int_equal(steps[1].layer, 4);
  crafted_free(&c2);
  crafted_free(&c);
}

/* The greedy rho of every prefix must equal eldr_quality_rho on signatures
 * built with eldr_signature_build for that prefix's mask. */
static void check_consistency(const crafted *c, eldr_repr repr, const float *idf,
                              const eldr_pairs_opts *po, double tol, double *max_diff) {
  const uint32_t L = c->s.num_layers;
  const size_t cells = eldr_shape_cells(&c->s);
  eldr_mask_step *steps = malloc(L * sizeof *steps);
  uint8_t *best = malloc(L), *mask = calloc(L, 1);
  float *sigs = malloc(c->n * cells * sizeof *sigs);
  assert_non_null(steps);
  assert_non_null(best);
  assert_non_null(mask);
  assert_non_null(sigs);
  const float *gates = (repr == ELDR_REPR_GATE || repr == ELDR_REPR_LOGIT) ? c->gates : NULL;
  double best_rho = 0, all_rho = 0;
  assert_int_equal(eldr_quality_greedy_mask(&c->s, repr, idf, c->pre, gates, c->dec, cells, c->n,
                                            po, steps, best, &best_rho, &all_rho),
                   0);
  for (uint32_t k = 0; k < L; k++) {
    mask[steps[k].layer] = 1;
    eldr_sigspec sp = {.shape = c->s, .repr = repr, .idf = idf, .mask = mask};
    const size_t dim = eldr_signature_dim(&sp);
    assert_int_equal(dim, (k + 1) * c->s.num_experts);
    for (size_t i = 0; i < c->n; i++) {
      int rc = eldr_signature_build(&sp, c->pre + i * cells, gates ? gates + i * cells : NULL,
                                    sigs + i * dim);
      assert_true(rc == 0 || rc == ELDR_EEMPTY);
    }
    double rho = 0;
    int rc = eldr_quality_rho(sigs, dim, c->dec, cells, c->n, po, &rho);
    if (rc == ELDR_EEMPTY) {
      assert_true(isnan(steps[k].rho));
      continue;
    }
    assert_int_equal(rc, 0);
    const double diff = fabs(rho - steps[k].rho);
    if (diff > *max_diff) *max_diff = diff;
    if (!(diff <= tol))
      fail_msg("%s idf=%d step %u (layer %d): greedy rho %.12f, slow rho %.12f",
               eldr_repr_name(repr), idf != NULL, k, steps[k].layer, steps[k].rho, rho);
    if (k == L - 1) assert_close(all_rho, rho, tol);
  }
  /* best_rho on the best mask through the slow path. */
  eldr_sigspec sp = {.shape = c->s, .repr = repr, .idf = idf, .mask = best};
  const size_t dim = eldr_signature_dim(&sp);
  for (size_t i = 0; i < c->n; i++)
    (void)eldr_signature_build(&sp, c->pre + i * cells, gates ? gates + i * cells : NULL,
                               sigs + i * dim);
  double rho = 0;
  assert_int_equal(eldr_quality_rho(sigs, dim, c->dec, cells, c->n, po, &rho), 0);
  assert_close(best_rho, rho, tol);
  free(sigs);
  free(mask);
  free(best);
  free(steps);
}

/* The fast path sums per-layer dots of unnormalised values in double; the
 * slow path works on float signatures normalised per mask. Distances that
 * sit on a 2^-16 grid boundary can land in neighbouring cells in the two
 * paths, which moves rho by ~1e-7..1e-5 on ~2k pairs (measured over 40
 * seeds: at most 9e-6); a real discrepancy (a wrong pair, layer or zero-row
 * rule) moves it by far more than 1e-4. */
static void test_greedy_consistent_with_slow_path(void **state) {
  (void)state;
  /* E = 16 with 6 prefill tokens per layer: > 1/4 of the cells nonzero,
   * the dense path; E = 64: the sparse path. */
  const uint64_t seeds[4] = {123, 27, 5, 8};
  const uint32_t experts[4] = {16, 16, 16, 64};
  double max_diff = 0;
  for (int sd = 0; sd < 4; sd++) {
    crafted c;
    crafted_make(&c, 70, 6, experts[sd], 2, 4, seeds[sd]);
    const size_t cells = eldr_shape_cells(&c.s);
    float *idf = malloc(cells * sizeof *idf);
    assert_non_null(idf);
    eldr_idf_compute(&c.s, c.pre, c.n, idf);
    const eldr_pairs_opts all = {0, 0}, direct = {900, 3}, compl = {2000, 4};
    const eldr_pairs_opts *pos[3] = {&all, &direct, &compl}; /* T = 2415 */
    for (int p = 0; p < 3; p++)
      for (int repr = ELDR_REPR_COUNT; repr <= ELDR_REPR_LOGIT; repr++) {
        check_consistency(&c, (eldr_repr)repr, NULL, pos[p], 1e-4, &max_diff);
        check_consistency(&c, (eldr_repr)repr, idf, pos[p], 1e-4, &max_diff);
      }
    free(idf);
    crafted_free(&c);
  }
  print_message("max |greedy rho - slow rho| over 4 data sets x 4 repr x IDF on/off x 3 pair "
                "modes x every mask size = %.3g\n",
                max_diff);
}

static void test_greedy_errors(void **state) {
  (void)state;
  crafted c;
  crafted_make(&c, 10, 2, 4, 0, -1, 1);
  eldr_mask_step steps[2];
  uint8_t best[2];
  double br;
  const size_t cells = eldr_shape_cells(&c.s);
  assert_int_equal(eldr_quality_greedy_mask(&c.s, ELDR_REPR_GATE, NULL, c.pre, NULL, c.dec, cells,
                                            c.n, NULL, steps, best, &br, NULL),
                   ELDR_EUNSUPPORTED);
  assert_int_equal(eldr_quality_greedy_mask(&c.s, ELDR_REPR_COUNT, NULL, c.pre, NULL, c.dec, cells,
                                            1, NULL, steps, best, &br, NULL),
                   ELDR_EINVAL);
  eldr_shape bad = {0, 4, 1};
  assert_int_equal(eldr_quality_greedy_mask(&bad, ELDR_REPR_COUNT, NULL, c.pre, NULL, c.dec,
                                            cells, c.n, NULL, steps, best, &br, NULL),
                   ELDR_EINVAL);
  /* All-zero prefill: no mask has a defined rho. */
  uint32_t *zero = calloc(c.n * cells, sizeof *zero);
  assert_non_null(zero);
  assert_int_equal(eldr_quality_greedy_mask(&c.s, ELDR_REPR_COUNT, NULL, zero, NULL, c.dec, cells,
                                            c.n, NULL, steps, best, &br, NULL),
                   ELDR_EEMPTY);
  assert_true(isnan(steps[0].rho) && isnan(steps[1].rho));
  /* NaN IDF weight. */
  float idf[8] = {1, 1, 1, 1, 1, NAN, 1, 1};
  assert_int_equal(eldr_quality_greedy_mask(&c.s, ELDR_REPR_BINARY, idf, c.pre, NULL, c.dec,
                                            cells, c.n, NULL, steps, best, &br, NULL),
                   ELDR_ERANGE);
  free(zero);
  crafted_free(&c);
}

/* The real Llama-4 MMLU trace (259 requests, 24 MoE layers, 128 experts,
 * top-1), when ../shared is there: greedy for count and binary, with and
 * without IDF, over 10,000 of the 33,411 pairs (keeps the test quick under
 * ASan); its rho for the best mask and for all layers must match the slow
 * path on built signatures. */
static void test_real_trace(void **state) {
  (void)state;
  char path[1024];
  snprintf(path, sizeof path, "%s/traces/llama4-mmlu-dev.jsonl", ELDR_SHARED_DIR);
  FILE *f = fopen(path, "rb");
  if (!f) {
    skip();
    return;
  }
  fclose(f);
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  const int lrc = eldr_trace_load(path, &t, &d);
  if (lrc != 0) fail_msg("%s", eldr_diag_msg(&d, lrc));
  const eldr_shape *s = &t->shape;
  const size_t n = t->n, L = s->num_layers, cells = eldr_shape_cells(s);
  assert_int_equal(n, 259);
  assert_int_equal(L, 24);
  uint32_t *pre = malloc(n * cells * sizeof *pre), *dc = malloc(n * cells * sizeof *dc);
  float *dec = malloc(n * cells * sizeof *dec), *idf = malloc(cells * sizeof *idf);
  float *sigs = malloc(n * cells * sizeof *sigs);
  eldr_mask_step *steps = malloc(L * sizeof *steps);
  uint8_t *best = malloc(L);
  assert_true(pre && dc && dec && idf && sigs && steps && best);
  for (size_t i = 0; i < n; i++) {
    eldr_trace_request_counts(t, &t->req[i], 0, pre + i * cells);
    eldr_trace_request_counts(t, &t->req[i], 1, dc + i * cells);
  }
  eldr_quality_decode_patterns(s, dc, n, dec);
  eldr_idf_compute(s, pre, n, idf);
  const eldr_pairs_opts po = {10000, 42};
  for (int repr = ELDR_REPR_COUNT; repr <= ELDR_REPR_BINARY; repr++) {
    for (int use_idf = 0; use_idf <= 1; use_idf++) {
      const float *w = use_idf ? idf : NULL;
      double best_rho = 0, all_rho = 0;
      assert_int_equal(eldr_quality_greedy_mask(s, (eldr_repr)repr, w, pre, NULL, dec, cells, n,
                                                &po, steps, best, &best_rho, &all_rho),
                       0);
      size_t nb = 0;
      for (size_t l = 0; l < L; l++) nb += best[l];
      /* Slow path: all layers, then the best mask. */
      double slow_all = 0, slow_best = 0;
      for (int which = 0; which < 2; which++) {
        eldr_sigspec sp = {.shape = *s, .repr = (eldr_repr)repr, .idf = w,
                           .mask = which ? best : NULL};
        const size_t dim = eldr_signature_dim(&sp);
        for (size_t i = 0; i < n; i++) {
          const int rc = eldr_signature_build(&sp, pre + i * cells, NULL, sigs + i * dim);
          assert_true(rc == 0 || rc == ELDR_EEMPTY);
        }
        assert_int_equal(eldr_quality_rho(sigs, dim, dec, cells, n, &po,
                                          which ? &slow_best : &slow_all),
                         0);
      }
      print_message("llama4-mmlu-dev %s%s: rho all layers %.4f, greedy best %zu layers %.4f "
                    "(|greedy - slow path| %.1e, %.1e)\n",
                    eldr_repr_name((eldr_repr)repr), use_idf ? "-idf" : "", all_rho, nb, best_rho,
                    fabs(all_rho - slow_all), fabs(best_rho - slow_best));
      assert_close(all_rho, slow_all, 1e-4);
      assert_close(best_rho, slow_best, 1e-4);
      assert_true(all_rho > 0.1);
      assert_true(best_rho >= all_rho);
    }
  }
  free(best);
  free(steps);
  free(sigs);
  free(idf);
  free(dec);
  free(dc);
  free(pre);
  eldr_trace_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank_average),
      cmocka_unit_test(test_spearman_hand_worked),
      cmocka_unit_test(test_pairs),
      cmocka_unit_test(test_rho_hand_worked),
      cmocka_unit_test(test_rho_perfect_and_independent),
      cmocka_unit_test(test_decode_patterns),
      cmocka_unit_test(test_greedy_picks_signal_layer),
      cmocka_unit_test(test_greedy_consistent_with_slow_path),
      cmocka_unit_test(test_greedy_errors),
      cmocka_unit_test(test_real_trace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
