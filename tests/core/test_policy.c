/* test_policy.c — routing decisions on crafted loads and signatures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/error.h"
#include "eldr/policy.h"
#include "eldr/rng.h"

static void normalize(float *v, size_t dim) {
  double s = 0;
  for (size_t i = 0; i < dim; i++) s += (double)v[i] * v[i];
  s = sqrt(s);
  for (size_t i = 0; i < dim; i++) v[i] = (float)(v[i] / s);
}

static int jsq_ref(const uint32_t *loads, const uint8_t *healthy, size_t n) {
  int best = -1;
  for (size_t i = 0; i < n; i++) {
    if (healthy && !healthy[i]) continue;
    if (best < 0 || loads[i] < loads[best]) best = (int)i;
  }
  return best;
}

static int decode(eldr_policy *p, const uint32_t *loads, const uint8_t *healthy, size_t n,
                  const float *sig, int domain, eldr_decision *dec) {
  eldr_route_req req = {.sig = sig, .domain = domain};
  int rc = eldr_policy_decode(p, loads, healthy, n, &req, dec);
  if (rc >= 0) assert_int_equal(rc, dec->decoder);
  return rc;
}

static void test_names(void **state) {
  (void)state;
  for (int k = 0; k < ELDR_POLICY__COUNT; k++) {
    eldr_policy_kind got;
    assert_int_equal(eldr_policy_parse(eldr_policy_name((eldr_policy_kind)k), &got), 0);
    assert_int_equal(got, k);
  }
  eldr_policy_kind got;
  assert_int_equal(eldr_policy_parse("round-robin", &got), 0);
  assert_int_equal(got, ELDR_POLICY_RR);
  assert_int_equal(eldr_policy_parse("power-of-two", &got), 0);
  assert_int_equal(got, ELDR_POLICY_P2C);
  assert_int_equal(eldr_policy_parse("least-loaded", &got), ELDR_EINVAL);
  assert_int_equal(eldr_policy_parse("", &got), ELDR_EINVAL);
  assert_string_equal(eldr_policy_name(ELDR_POLICY_ELDR), "eldr");
  assert_string_equal(eldr_policy_name(ELDR_POLICY__COUNT), "unknown");
}

static void test_init_errors(void **state) {
  (void)state;
  eldr_policy p;
  float c[4] = {1, 0, 0, 0};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, -0.1, 1, c, 1, 4, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, NAN, 1, c, 1, 4, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.1, 1, c, 1, 0, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_DOMAIN, 0.1, 1, NULL, 0, 0, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY__COUNT, 0.1, 1, NULL, 0, 0, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_init(NULL, ELDR_POLICY_JSQ, 0.1, 1, NULL, 0, 0, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.1, 1, c, 1, 4, 0), 0);
  uint32_t loads[2] = {0, 0};
  eldr_decision dec;
  assert_int_equal(decode(&p, loads, NULL, 0, c, -1, &dec), ELDR_EINVAL);
  assert_int_equal(eldr_policy_decode(&p, NULL, NULL, 2, NULL, &dec), ELDR_EINVAL);
}

/* 4 orthogonal centroids in dim 4, 8 decoders (decoder k uses centroid k%4). */
static const float basis4[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};

static void test_eldr_tau0_nearest(void **state) {
  (void)state;
  eldr_policy p;
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.0, 7, basis4, 4, 4, 0), 0);
  float sig[4] = {0.2f, 0.1f, 0.9f, 0.3f};
  normalize(sig, 4);
  /* 4 decoders: decoder 2 is the nearest and by far the most loaded. */
  uint32_t loads[4] = {0, 0, 1000, 0};
  eldr_decision dec;
  assert_int_equal(decode(&p, loads, NULL, 4, sig, -1, &dec), 2);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
  assert_int_equal(dec.band_size, 1);
  assert_true(fabsf(dec.best_sim - sig[2]) < 1e-6f);
  /* 8 decoders: 2 and 6 share centroid 2: an exact tie stays in the band at
   * tau = 0 and the less loaded of the two wins. */
  uint32_t loads8[8] = {0, 0, 50, 0, 0, 0, 40, 0};
  assert_int_equal(decode(&p, loads8, NULL, 8, sig, -1, &dec), 6);
  assert_int_equal(dec.band_size, 2);
  loads8[6] = 60;
  assert_int_equal(decode(&p, loads8, NULL, 8, sig, -1, &dec), 2);
  /* equal loads: same sim, lower index */
  loads8[6] = 50;
  assert_int_equal(decode(&p, loads8, NULL, 8, sig, -1, &dec), 2);
  /* nearest decoders unhealthy: the next nearest (centroid 3) */
  uint8_t h8[8] = {1, 1, 0, 1, 1, 1, 0, 1};
  assert_int_equal(decode(&p, loads8, h8, 8, sig, -1, &dec), 3);
  loads8[3] = 9;
  assert_int_equal(decode(&p, loads8, h8, 8, sig, -1, &dec), 7);
}

static void random_unit_nonneg(eldr_rng *r, float *v, size_t dim, int sparse) {
  for (size_t i = 0; i < dim; i++) {
    double u = eldr_rng_uniform(r);
    v[i] = (float)(sparse && u < 0.6 ? 0.0 : u);
  }
  v[eldr_rng_below(r, dim)] += 0.5f;
  normalize(v, dim);
}

static void test_eldr_tau1_is_jsq(void **state) {
  (void)state;
  enum { D = 40, K = 6, N = 12 };
  float cent[K * D], sig[D];
  uint32_t loads[N];
  uint8_t healthy[N];
  eldr_rng r;
  eldr_rng_seed(&r, 42);
  for (int trial = 0; trial < 500; trial++) {
    for (int k = 0; k < K; k++) random_unit_nonneg(&r, cent + k * D, D, 1);
    random_unit_nonneg(&r, sig, D, 1);
    size_t n = 1 + eldr_rng_below(&r, N);
    int any = 0;
    /* odd trials: distinct loads (the exact JSQ decoder); even trials: many
     * ties (a least-loaded decoder; ties then go by similarity) */
    for (size_t i = 0; i < n; i++) {
      loads[i] = trial % 2 ? (uint32_t)(i * 7 % 13 + 13 * eldr_rng_below(&r, 5))
                           : (uint32_t)eldr_rng_below(&r, 4);
      healthy[i] = eldr_rng_uniform(&r) < 0.8;
      any |= healthy[i];
    }
    if (!any) healthy[0] = 1;
    eldr_policy p;
    assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 1.0, 1, cent, K, D, 0), 0);
    eldr_decision dec;
    int got = decode(&p, loads, healthy, n, sig, -1, &dec);
    int want = jsq_ref(loads, healthy, n);
    assert_true(healthy[got]);
    assert_int_equal(loads[got], loads[want]);
    if (trial % 2) assert_int_equal(got, want);
    assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
    int up = 0;
    for (size_t i = 0; i < n; i++) up += healthy[i];
    assert_int_equal(dec.band_size, up);
  }
}

static void test_eldr_band(void **state) {
  (void)state;
  /* sig = e0 so that sim_k is the first coordinate of centroid k. */
  enum { D = 2 };
  const float s[5] = {0.95f, 0.9f, 0.8f, 0.6f, 0.3f};
  float cent[5 * D];
  for (int k = 0; k < 5; k++) {
    cent[k * D] = s[k];
    cent[k * D + 1] = sqrtf(1.0f - s[k] * s[k]);
  }
  float sig[D] = {1, 0};
  uint32_t loads[5] = {9, 7, 5, 1, 0};
  eldr_policy p;
  eldr_decision dec;
  struct {
    double tau;
    int band, pick;
  } cases[] = {{0.0, 1, 0}, {0.04, 1, 0}, {0.06, 2, 1}, {0.2, 3, 2},
               {0.4, 4, 3}, {0.64, 4, 3}, {0.66, 5, 4}, {2.0, 5, 4}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, cases[c].tau, 1, cent, 5, D, 0), 0);
    assert_int_equal(decode(&p, loads, NULL, 5, sig, -1, &dec), cases[c].pick);
    assert_int_equal(dec.band_size, cases[c].band);
    assert_true(fabsf(dec.best_sim - 0.95f) < 1e-6f);
  }
  /* equal loads in the band: the higher similarity wins, not the lower index */
  uint32_t eq[5] = {3, 1, 1, 0, 0};
  float cent2[5 * D];
  const float s2[5] = {0.5f, 0.7f, 0.9f, 0.2f, 0.1f};
  for (int k = 0; k < 5; k++) {
    cent2[k * D] = s2[k];
    cent2[k * D + 1] = sqrtf(1.0f - s2[k] * s2[k]);
  }
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.25, 1, cent2, 5, D, 0), 0);
  assert_int_equal(decode(&p, eq, NULL, 5, sig, -1, &dec), 2);
  assert_int_equal(dec.band_size, 2);
  eq[1] = 0;
  assert_int_equal(decode(&p, eq, NULL, 5, sig, -1, &dec), 1);
}

/* Intermediate tau against a straightforward reference (double sims). */
static void test_eldr_band_reference(void **state) {
  (void)state;
  enum { D = 64, K = 16, N = 32 };
  float cent[K * D], sig[D];
  uint32_t loads[N];
  uint8_t healthy[N];
  eldr_rng r;
  eldr_rng_seed(&r, 9);
  int nontrivial = 0;
  for (int trial = 0; trial < 400; trial++) {
    for (int k = 0; k < K; k++) random_unit_nonneg(&r, cent + k * D, D, 1);
    random_unit_nonneg(&r, sig, D, 1);
    size_t n = 1 + eldr_rng_below(&r, N);
    size_t nc = 1 + eldr_rng_below(&r, K);
    double tau = eldr_rng_uniform(&r) * 0.3;
    for (size_t i = 0; i < n; i++) {
      loads[i] = (uint32_t)eldr_rng_below(&r, 4);
      healthy[i] = eldr_rng_uniform(&r) < 0.85;
    }
    healthy[eldr_rng_below(&r, n)] = 1;
    double sims[N], best = -1;
    for (size_t i = 0; i < n; i++) { /* K != D: docs/serve.md */
      double d = -1;
      for (size_t c = i % nc; c < nc; c += n) {
        double x = 0;
        for (int j = 0; j < D; j++) x += (double)sig[j] * cent[c * D + j];
        if (x > d) d = x;
        if (n >= nc) break;
      }
      sims[i] = d;
      if (healthy[i] && d > best) best = d;
    }
    int want = -1, band = 0;
    for (size_t i = 0; i < n; i++) {
      if (!healthy[i] || sims[i] < best - tau - 1e-6) continue;
      band++;
      if (want < 0 || loads[i] < loads[want] ||
          (loads[i] == loads[want] && sims[i] > sims[want] + 1e-9))
        want = (int)i;
    }
    eldr_policy p;
    assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, tau, 1, cent, nc, D, 0), 0);
    eldr_decision dec;
    int got = decode(&p, loads, healthy, n, sig, -1, &dec);
    assert_int_equal(got, want);
    assert_int_equal(dec.band_size, band);
    if (band > 1 && got != jsq_ref(loads, healthy, n)) nontrivial++;
    /* same state, same choice */
    assert_int_equal(decode(&p, loads, healthy, n, sig, -1, &dec), got);
  }
  assert_true(nontrivial > 20); /* the band mattered in many trials */
}

/* K centroids in front of D != K decoders: D > K, decoders share a
 * centroid round robin (the band holds all of them, the least loaded
 * wins); D < K, a decoder serves every centroid c with c % D == its index
 * and scores the best of them, so no centroid is orphaned. The
 * similarities out (req.sims) and the matched centroid come back. */
static void test_eldr_k_ne_d(void **state) {
  (void)state;
  enum { DIM = 4 };
  float cent[4 * DIM] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  float sig[DIM] = {0.1f, 0.2f, 0.1f, 0.97f}; /* closest to centroid 3 */
  normalize(sig, DIM);
  eldr_policy p;
  eldr_decision dec;
  float sims[4];
  /* D = 6 > K = 2 (centroids 0, 1): decoders 0, 2, 4 share centroid 0 */
  float c2[2 * DIM] = {1, 0, 0, 0, 0, 1, 0, 0};
  float s0[DIM] = {0.9f, 0.1f, 0, 0};
  normalize(s0, DIM);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0, 1, c2, 2, DIM, 0), 0);
  uint32_t l6[6] = {5, 0, 3, 0, 1, 0};
  eldr_route_req req = {.sig = s0, .domain = -1, .sims = sims};
  assert_int_equal(eldr_policy_decode(&p, l6, NULL, 6, &req, &dec), 4); /* least loaded of 0, 2, 4 */
  assert_int_equal(dec.band_size, 3);
  assert_int_equal(dec.centroid, 0);
  assert_true(sims[0] > 0.99f && sims[1] < 0.2f);
  /* D = 2 < K = 4: decoder 0 serves centroids 0, 2; decoder 1 serves 1, 3 */
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0, 1, cent, 4, DIM, 0), 0);
  uint32_t l2[2] = {9, 9};
  req.sig = sig;
  assert_int_equal(eldr_policy_decode(&p, l2, NULL, 2, &req, &dec), 1); /* centroid 3 is decoder 1's */
  assert_int_equal(dec.centroid, 3);
  assert_true(fabsf(dec.best_sim - sims[3]) < 1e-6f);
  /* a signature nearest centroid 2 goes to decoder 0 */
  float s2[DIM] = {0.05f, 0.1f, 0.99f, 0.1f};
  normalize(s2, DIM);
  req.sig = s2;
  assert_int_equal(eldr_policy_decode(&p, l2, NULL, 2, &req, &dec), 0);
  assert_int_equal(dec.centroid, 2);
  /* D = 3 < K = 4: decoder 0 serves 0 and 3, so centroid 3 is not lost */
  uint32_t l3[3] = {0, 0, 0};
  req.sig = sig;
  assert_int_equal(eldr_policy_decode(&p, l3, NULL, 3, &req, &dec), 0);
  assert_int_equal(dec.centroid, 3);
  /* decoder 0 down: the next best of the others */
  uint8_t h3[3] = {0, 1, 1};
  int got = eldr_policy_decode(&p, l3, h3, 3, &req, &dec);
  assert_true(got == 1 || got == 2);
  assert_int_equal(dec.centroid, got); /* decoders 1, 2 serve centroids 1, 2 only */
}

/* Many decoders (beyond the policy's on-stack similarity cache of 256), an
 * odd dimension (kernel tail), and a centroid duplicated at indices 3 and
 * 299: both copies must get bit-identical similarities whichever kernel
 * computes them, so the tie goes to the lower index. */
static void test_eldr_many_decoders(void **state) {
  (void)state;
  enum { D = 37, NC = 300 };
  static float cent[NC * D];
  static uint32_t loads[NC];
  float sig[D];
  eldr_rng r;
  eldr_rng_seed(&r, 77);
  for (int k = 0; k < NC; k++) random_unit_nonneg(&r, cent + k * D, D, 0);
  random_unit_nonneg(&r, sig, D, 0);
  memcpy(cent + 3 * D, sig, sizeof sig);
  memcpy(cent + 299 * D, sig, sizeof sig);
  eldr_policy p;
  eldr_decision dec;
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.0, 1, cent, NC, D, 0), 0);
  for (int i = 0; i < NC; i++) loads[i] = 5;
  assert_int_equal(decode(&p, loads, NULL, NC, sig, -1, &dec), 3);
  assert_int_equal(dec.band_size, 2);
  loads[299] = 4;
  assert_int_equal(decode(&p, loads, NULL, NC, sig, -1, &dec), 299);
  /* the reference over all 300 for a few taus */
  random_unit_nonneg(&r, sig, D, 0);
  for (int i = 0; i < NC; i++) loads[i] = (uint32_t)eldr_rng_below(&r, 50);
  for (double tau = 0.0; tau < 0.5; tau += 0.05) {
    double best = -1, sims[NC];
    for (int k = 0; k < NC; k++) {
      double d = 0;
      for (int j = 0; j < D; j++) d += (double)sig[j] * cent[k * D + j];
      sims[k] = d;
      if (d > best) best = d;
    }
    int want = -1;
    for (int k = 0; k < NC; k++) {
      if (sims[k] < best - tau - 1e-6) continue;
      if (want < 0 || loads[k] < loads[want] || (loads[k] == loads[want] && sims[k] > sims[want]))
        want = k;
    }
    assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, tau, 1, cent, NC, D, 0), 0);
    assert_int_equal(decode(&p, loads, NULL, NC, sig, -1, &dec), want);
  }
}

static void test_eldr_fallbacks(void **state) {
  (void)state;
  eldr_policy p;
  eldr_decision dec;
  uint32_t loads[4] = {5, 3, 3, 8};
  float sig[4] = {0, 0, 0, 1};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.0, 1, basis4, 4, 4, 0), 0);
  assert_int_equal(decode(&p, loads, NULL, 4, sig, -1, &dec), 3);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
  assert_int_equal(decode(&p, loads, NULL, 4, NULL, -1, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_SIGNATURE);
  assert_int_equal(eldr_policy_decode(&p, loads, NULL, 4, NULL, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_SIGNATURE);
  float nan_sig[4] = {NAN, NAN, NAN, NAN};
  assert_int_equal(decode(&p, loads, NULL, 4, nan_sig, -1, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_SIGNATURE);
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_ELDR, 0.0, 1, NULL, 0, 0, 0), 0);
  assert_int_equal(decode(&p, loads, NULL, 4, sig, -1, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_ARTIFACT);
  assert_int_equal(decode(&p, loads, NULL, 4, NULL, -1, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_ARTIFACT);
  /* out may be NULL */
  assert_int_equal(eldr_policy_decode(&p, loads, NULL, 4, NULL, NULL), 1);
}

static void test_unhealthy_all_policies(void **state) {
  (void)state;
  enum { N = 6 };
  uint32_t loads[N] = {0, 9, 0, 9, 0, 9};
  uint8_t healthy[N] = {0, 1, 0, 1, 0, 1};
  uint8_t none[N] = {0};
  float sig[4] = {1, 0, 0, 0};
  for (int k = 0; k < ELDR_POLICY__COUNT; k++) {
    eldr_policy p;
    assert_int_equal(eldr_policy_init(&p, (eldr_policy_kind)k, 0.0, 3, basis4, 4, 4, 2), 0);
    eldr_decision dec;
    for (int rep = 0; rep < 200; rep++) {
      int c = decode(&p, loads, healthy, N, sig, rep % 3 - 1, &dec);
      assert_true(c == 1 || c == 3 || c == 5);
    }
    assert_int_equal(decode(&p, loads, none, N, sig, 0, &dec), ELDR_EUNAVAIL);
  }
}

static void test_rr_cycles(void **state) {
  (void)state;
  eldr_policy p;
  eldr_decision dec;
  uint32_t loads[4] = {9, 0, 0, 0};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_RR, 0, 0, NULL, 0, 0, 0), 0);
  for (int i = 0; i < 9; i++) assert_int_equal(decode(&p, loads, NULL, 4, NULL, -1, &dec), i % 4);
  /* now at 1; with 1 and 2 down: 3, 0, 3, 0 ... */
  uint8_t h[4] = {1, 0, 0, 1};
  assert_int_equal(decode(&p, loads, h, 4, NULL, -1, &dec), 3);
  assert_int_equal(decode(&p, loads, h, 4, NULL, -1, &dec), 0);
  assert_int_equal(decode(&p, loads, h, 4, NULL, -1, &dec), 3);
  /* fewer decoders than before: wraps */
  assert_int_equal(decode(&p, loads, NULL, 3, NULL, -1, &dec), 0);
  assert_int_equal(decode(&p, loads, NULL, 3, NULL, -1, &dec), 1);
}

static void test_jsq(void **state) {
  (void)state;
  eldr_policy p;
  eldr_decision dec;
  uint32_t loads[5] = {4, 2, 7, 2, 3};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_JSQ, 0, 0, NULL, 0, 0, 0), 0);
  assert_int_equal(decode(&p, loads, NULL, 5, NULL, -1, &dec), 1);
  assert_int_equal(decode(&p, loads, NULL, 5, NULL, -1, &dec), 1);
  uint8_t h[5] = {1, 0, 1, 1, 1};
  assert_int_equal(decode(&p, loads, h, 5, NULL, -1, &dec), 3);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
}

static void test_random(void **state) {
  (void)state;
  eldr_policy a, b;
  eldr_decision dec;
  uint32_t loads[5] = {0};
  uint8_t h[5] = {1, 0, 1, 1, 1};
  int hist[5] = {0};
  assert_int_equal(eldr_policy_init(&a, ELDR_POLICY_RANDOM, 0, 11, NULL, 0, 0, 0), 0);
  assert_int_equal(eldr_policy_init(&b, ELDR_POLICY_RANDOM, 0, 11, NULL, 0, 0, 0), 0);
  for (int i = 0; i < 4000; i++) {
    int c = decode(&a, loads, h, 5, NULL, -1, &dec);
    assert_int_equal(decode(&b, loads, h, 5, NULL, -1, &dec), c);
    hist[c]++;
  }
  assert_int_equal(hist[1], 0);
  for (int i = 0; i < 5; i++)
    if (i != 1) assert_true(hist[i] > 850 && hist[i] < 1150);
}

static void test_p2c(void **state) {
  (void)state;
  eldr_policy p, q;
  eldr_decision dec;
  /* two decoders: both are always drawn, so the less loaded always wins */
  uint32_t two[2] = {5, 2};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_P2C, 0, 5, NULL, 0, 0, 0), 0);
  for (int i = 0; i < 100; i++) assert_int_equal(decode(&p, two, NULL, 2, NULL, -1, &dec), 1);
  /* three decoders, distinct loads: pairs {0,1},{0,2},{1,2} are equally
   * likely; the most loaded (2) never wins, 0 wins 2/3, 1 wins 1/3. */
  uint32_t three[3] = {1, 5, 10};
  int hist[3] = {0};
  for (int i = 0; i < 3000; i++) hist[decode(&p, three, NULL, 3, NULL, -1, &dec)]++;
  assert_int_equal(hist[2], 0);
  assert_true(hist[0] > 1850 && hist[0] < 2150);
  /* one healthy decoder */
  uint8_t h1[3] = {0, 0, 1};
  assert_int_equal(decode(&p, three, h1, 3, NULL, -1, &dec), 2);
  /* with 1 down, the pair is always {0,2}: 0 always wins */
  uint8_t h2[3] = {1, 0, 1};
  for (int i = 0; i < 50; i++) assert_int_equal(decode(&p, three, h2, 3, NULL, -1, &dec), 0);
  /* seed determinism; equal loads spread over all decoders */
  uint32_t flat[8] = {0};
  int seen[8] = {0}, differs = 0;
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_P2C, 0, 99, NULL, 0, 0, 0), 0);
  assert_int_equal(eldr_policy_init(&q, ELDR_POLICY_P2C, 0, 99, NULL, 0, 0, 0), 0);
  eldr_policy o;
  assert_int_equal(eldr_policy_init(&o, ELDR_POLICY_P2C, 0, 100, NULL, 0, 0, 0), 0);
  for (int i = 0; i < 400; i++) {
    int c = decode(&p, flat, NULL, 8, NULL, -1, &dec);
    assert_int_equal(decode(&q, flat, NULL, 8, NULL, -1, &dec), c);
    differs |= decode(&o, flat, NULL, 8, NULL, -1, &dec) != c;
    seen[c] = 1;
  }
  assert_true(differs);
  for (int i = 0; i < 8; i++) assert_true(seen[i]);
}

static void test_domain(void **state) {
  (void)state;
  eldr_policy p;
  eldr_decision dec;
  /* 8 decoders, 3 labels: groups [0,2) [2,5) [5,8) */
  uint32_t loads[8] = {4, 3, 6, 2, 1, 0, 9, 9};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_DOMAIN, 0, 0, NULL, 0, 0, 3), 0);
  assert_int_equal(decode(&p, loads, NULL, 8, NULL, 0, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
  assert_int_equal(decode(&p, loads, NULL, 8, NULL, 1, &dec), 4);
  assert_int_equal(decode(&p, loads, NULL, 8, NULL, 2, &dec), 5);
  /* group members down: JSQ among the healthy rest of the group */
  uint8_t h[8] = {1, 1, 1, 1, 0, 1, 1, 1};
  assert_int_equal(decode(&p, loads, h, 8, NULL, 1, &dec), 3);
  /* empty healthy group: JSQ over all, fallback reported */
  uint8_t h0[8] = {0, 0, 1, 1, 1, 1, 1, 1};
  assert_int_equal(decode(&p, loads, h0, 8, NULL, 0, &dec), 5);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_DOMAIN);
  /* no label, or a label outside [0, 3) */
  assert_int_equal(decode(&p, loads, NULL, 8, NULL, -1, &dec), 5);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_DOMAIN);
  assert_int_equal(decode(&p, loads, NULL, 8, NULL, 3, &dec), 5);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_DOMAIN);
  /* groups are contiguous and as even as possible: 10 decoders, 4 labels */
  uint32_t zero[10] = {0};
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_DOMAIN, 0, 0, NULL, 0, 0, 4), 0);
  const int first[4] = {0, 2, 5, 7};
  for (int d = 0; d < 4; d++) assert_int_equal(decode(&p, zero, NULL, 10, NULL, d, &dec), first[d]);
  /* more labels than decoders: label d -> decoder d % n */
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_DOMAIN, 0, 0, NULL, 0, 0, 6), 0);
  uint32_t l4[4] = {0, 5, 5, 5};
  assert_int_equal(decode(&p, l4, NULL, 4, NULL, 5, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
  assert_int_equal(decode(&p, l4, NULL, 4, NULL, 2, &dec), 2);
}

static void test_prefill_stability(void **state) {
  (void)state;
  enum { N = 16, KEYS = 4000 };
  uint32_t loads[N + 1] = {0};
  uint8_t h[N + 1];
  memset(h, 1, sizeof h);
  static int home[KEYS];
  int hist[N] = {0};
  uint64_t st = 1234;
  for (int i = 0; i < KEYS; i++) {
    uint64_t key = eldr_splitmix64(&st);
    home[i] = eldr_policy_prefill(key, NULL, loads, h, N, 0);
    assert_true(home[i] >= 0 && home[i] < N);
    assert_int_equal(eldr_policy_prefill(key, NULL, loads, NULL, N, 0), home[i]);
    hist[home[i]]++;
  }
  for (int i = 0; i < N; i++) assert_true(hist[i] > KEYS / N / 2 && hist[i] < KEYS / N * 2);
  /* remove worker 5: only its keys move */
  h[5] = 0;
  st = 1234;
  int moved = 0;
  for (int i = 0; i < KEYS; i++) {
    uint64_t key = eldr_splitmix64(&st);
    int c = eldr_policy_prefill(key, NULL, loads, h, N, 0);
    assert_int_not_equal(c, 5);
    if (home[i] != 5) assert_int_equal(c, home[i]);
    else moved++;
  }
  assert_int_equal(moved, hist[5]);
  /* add worker 16: keys move only onto it */
  h[5] = 1;
  st = 1234;
  int gained = 0;
  for (int i = 0; i < KEYS; i++) {
    uint64_t key = eldr_splitmix64(&st);
    int c = eldr_policy_prefill(key, NULL, loads, h, N + 1, 0);
    if (c != home[i]) {
      assert_int_equal(c, N);
      gained++;
    }
  }
  assert_true(gained > KEYS / (N + 1) / 2);
  uint8_t none[N] = {0};
  assert_int_equal(eldr_policy_prefill(1, NULL, loads, none, N, 0), ELDR_EUNAVAIL);
  assert_int_equal(eldr_policy_prefill(1, NULL, loads, NULL, 0, 0), ELDR_EINVAL);
  assert_int_equal(eldr_policy_prefill(1, NULL, NULL, NULL, 4, 0), ELDR_EINVAL);
}

/* Keyed by the workers' identities (their URLs, as the router keys them):
 * the list reordered (a reload that lists them in another order, a DNS
 * answer that sorts a new address first) keeps every prompt's home worker;
 * a worker added in front wins only prompts that move onto it. Keyed by
 * index, the same reorder moves most prompts: the defect this keying
 * removes. */
static void test_prefill_keyed_by_identity(void **state) {
  (void)state;
  enum { N = 8, KEYS = 2000 };
  char urls[N + 1][48];
  uint64_t ids[N + 1];
  for (int i = 0; i <= N; i++) {
    snprintf(urls[i], sizeof urls[i], "http://10.0.0.%d:8100", i + 1);
    ids[i] = eldr_policy_worker_key(urls[i]);
  }
  assert_int_equal(eldr_policy_worker_key(urls[0]), eldr_policy_worker_key("http://10.0.0.1:8100"));
  uint32_t loads[N + 1] = {0};
  /* the list in order 0..N-1, then reversed (worker j at position N-1-j) */
  uint64_t rev[N];
  for (int j = 0; j < N; j++) rev[N - 1 - j] = ids[j];
  /* then worker N added at the front: position 0, the others shifted by one */
  uint64_t grown[N + 1];
  grown[0] = ids[N];
  for (int j = 0; j < N; j++) grown[j + 1] = ids[j];
  uint64_t st = 99;
  int by_index_moved = 0, onto_new = 0;
  for (int i = 0; i < KEYS; i++) {
    const uint64_t key = eldr_splitmix64(&st);
    const int home = eldr_policy_prefill(key, ids, loads, NULL, N, 0);
    assert_true(home >= 0 && home < N);
    const int r = eldr_policy_prefill(key, rev, loads, NULL, N, 0);
    assert_int_equal(r, N - 1 - home); /* the same worker, at its new position */
    const int g = eldr_policy_prefill(key, grown, loads, NULL, N + 1, 0);
    if (g == 0) onto_new++;
    else assert_int_equal(g, home + 1);
    /* by index, the reversed list sends the prompt to another worker unless
     * the index happens to name it */
    by_index_moved += eldr_policy_prefill(key, NULL, loads, NULL, N, 0) !=
                      N - 1 - eldr_policy_prefill(key, NULL, loads, NULL, N, 0);
  }
  assert_true(onto_new > KEYS / (N + 1) / 2 && onto_new < KEYS / (N + 1) * 2);
  assert_true(by_index_moved > KEYS / 2);
}

static void test_prefill_guard(void **state) {
  (void)state;
  enum { N = 4 };
  uint32_t loads[N] = {0};
  const uint64_t key = 0xdeadbeefcafeULL;
  int home = eldr_policy_prefill(key, NULL, loads, NULL, N, 2);
  assert_true(home >= 0);
  int other1 = (home + 1) % N, other2 = (home + 2) % N, other3 = (home + 3) % N;
  for (int i = 0; i < N; i++) loads[i] = 10;
  loads[other1] = 5;
  loads[other2] = 5;
  loads[other3] = 7;
  loads[home] = 7; /* = min + guard: stays home */
  assert_int_equal(eldr_policy_prefill(key, NULL, loads, NULL, N, 2), home);
  loads[home] = 8; /* > min + guard: least loaded, lower index on ties */
  int want = other1 < other2 ? other1 : other2;
  assert_int_equal(eldr_policy_prefill(key, NULL, loads, NULL, N, 2), want);
  /* the least loaded is down: the next least loaded healthy */
  uint8_t h[N] = {1, 1, 1, 1};
  h[other1] = 0;
  h[other2] = 0;
  assert_int_equal(eldr_policy_prefill(key, NULL, loads, h, N, 2), home); /* 8 <= 7 + 2 */
  assert_int_equal(eldr_policy_prefill(key, NULL, loads, h, N, 0), other3);
  /* huge guard never overflows */
  loads[home] = UINT32_MAX;
  assert_int_equal(eldr_policy_prefill(key, NULL, loads, NULL, N, UINT32_MAX), home);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_prefill_keyed_by_identity),
      cmocka_unit_test(test_init_errors),
      cmocka_unit_test(test_eldr_tau0_nearest),
      cmocka_unit_test(test_eldr_tau1_is_jsq),
      cmocka_unit_test(test_eldr_band),
      cmocka_unit_test(test_eldr_band_reference),
      cmocka_unit_test(test_eldr_many_decoders),
      cmocka_unit_test(test_eldr_fallbacks),
      cmocka_unit_test(test_unhealthy_all_policies),
      cmocka_unit_test(test_rr_cycles),
      cmocka_unit_test(test_jsq),
      cmocka_unit_test(test_eldr_k_ne_d),
      cmocka_unit_test(test_random),
      cmocka_unit_test(test_p2c),
      cmocka_unit_test(test_domain),
      cmocka_unit_test(test_prefill_stability),
      cmocka_unit_test(test_prefill_guard),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
