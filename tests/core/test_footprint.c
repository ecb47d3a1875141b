/* test_footprint.c — the footprint state (exact add/remove, no drift after a
 * million requests, product-form unions), its decisions on crafted
 * footprints, the FOOTPRINT policy's fallbacks and bookkeeping calls, the
 * artifact's latency section, and the simulator's footprint rows. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/footprint.h"
#include "eldr/fp_prior.h"
#include "eldr/latency.h"
#include "eldr/policy.h"
#include "eldr/rng.h"
#include "eldr/sim.h"
#include "eldr/trace.h"

/* A small valid model: L layers x E experts top-K with qwen3-30b-a3b's
 * per-expert costs on MI300X. */
static void small_model(eldr_latency_model *m, uint32_t L, uint32_t E, uint32_t K) {
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", m, NULL), 0);
  m->shape = (eldr_shape){L, E, K};
}

static eldr_footprint *make(const eldr_latency_model *m, size_t D, const uint8_t *mask) {
  eldr_footprint_opts o = {.n_decoders = D, .max_batch = 64, .layer_mask = mask};
  eldr_footprint *f = NULL;
  assert_int_equal(eldr_footprint_new(m, &o, &f, NULL), 0);
  assert_non_null(f);
  return f;
}

static void test_new_errors(void **st) {
  (void)st;
  eldr_latency_model m;
  small_model(&m, 2, 8, 2);
  eldr_footprint *f = NULL;
  eldr_footprint_opts o = {.n_decoders = 0};
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), ELDR_EINVAL);
  assert_null(f);
  o.n_decoders = 4097;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), ELDR_EINVAL);
  o.n_decoders = 2;
  assert_int_equal(eldr_footprint_new(NULL, &o, &f, NULL), ELDR_EINVAL);
  m.hbm_bw = 0;
  eldr_diag d = {{0}};
  assert_true(eldr_footprint_new(&m, &o, &f, &d) < 0);
  assert_non_null(strstr(d.msg, "hbm_bw"));
  eldr_footprint_free(NULL);
}

/* One request: U_l = sum_e p; two: sum_e 1 - (1-p1)(1-p2) (product form). */
static void test_union_product_form(void **st) {
  (void)st;
  eldr_latency_model m;
  small_model(&m, 2, 8, 2);
  eldr_footprint *f = make(&m, 2, NULL);
  uint32_t c1[16] = {0}, c2[16] = {0};
  /* 4 tokens; layer 0: expert 0 always, expert 1 twice, expert 2 twice...
   * K = 2 per token: counts sum to 8 per layer */
  c1[0] = 4, c1[1] = 2, c1[2] = 2;      /* p = 1 (clamped), .5, .5 */
  c1[8 + 3] = 4, c1[8 + 4] = 4;         /* layer 1 */
  c2[1] = 4, c2[5] = 4;                 /* p = 1, 1 */
  c2[8 + 3] = 2, c2[8 + 6] = 2, c2[8 + 7] = 4;
  eldr_fp_request r1 = {c1, 4, 100, NULL}, r2 = {c2, 4, 50, NULL};
  int err = 1;
  uint64_t t1 = eldr_footprint_route(f, 1, &r1, &err);
  assert_int_equal(err, 0);
  assert_true(t1 != ELDR_FP_NO_TICKET);
  const double P = ELDR_FP_PMAX;
  assert_true(fabs(eldr_footprint_union(f, 1, 0) - (P + 0.5 + 0.5)) < 1e-5);
  assert_true(fabs(eldr_footprint_union(f, 1, 1) - 2 * P) < 1e-5);
  assert_true(eldr_footprint_union(f, 0, 0) == 0.0);
  uint64_t t2 = eldr_footprint_route(f, 1, &r2, &err);
  double want0 = (1 - (1 - P)) + (1 - 0.5 * (1 - P)) + 0.5 + P;
  double want1 = (1 - (1 - P) * 0.5) + P + 0.5 + P;
  assert_true(fabs(eldr_footprint_union(f, 1, 0) - want0) < 1e-5);
  assert_true(fabs(eldr_footprint_union(f, 1, 1) - want1) < 1e-5);
  assert_int_equal(eldr_footprint_inflight(f, 1), 2);
  assert_int_equal(eldr_footprint_end(f, t1), 0);
  assert_int_equal(eldr_footprint_end(f, t1), ELDR_ENOTFOUND); /* twice */
  assert_true(fabs(eldr_footprint_union(f, 1, 0) - 2 * P) < 1e-5);
  assert_int_equal(eldr_footprint_end(f, t2), 0);
  for (size_t l = 0; l < 2; l++) {
    assert_true(eldr_footprint_union(f, 1, l) == 0.0);
    for (size_t e = 0; e < 8; e++) assert_true(eldr_footprint_raw(f, 1, l, e) == 0);
  }
  /* a stale ticket (slot reused) and bad arguments */
  uint64_t t3 = eldr_footprint_route(f, 0, &r1, &err);
  assert_true((t3 & 0xffffffffu) == (t2 & 0xffffffffu) || (t3 & 0xffffffffu) == (t1 & 0xffffffffu));
  assert_int_equal(eldr_footprint_end(f, t3 == t1 ? t2 : t1), ELDR_ENOTFOUND);
  assert_int_equal(eldr_footprint_end(f, ELDR_FP_NO_TICKET), ELDR_ENOTFOUND);
  assert_int_equal(eldr_footprint_end(f, 12345), ELDR_ENOTFOUND);
  assert_true(eldr_footprint_route(f, 2, &r1, &err) == ELDR_FP_NO_TICKET);
  assert_int_equal(err, ELDR_EINVAL);
  assert_int_equal(eldr_footprint_end(f, t3), 0);
  eldr_footprint_free(f);
}

static void random_counts(eldr_rng *r, uint32_t *c, size_t L, size_t E, size_t K, uint32_t ntok) {
  memset(c, 0, L * E * sizeof *c);
  for (uint32_t t = 0; t < ntok; t++)
    for (size_t l = 0; l < L; l++) {
      size_t e0 = (size_t)eldr_rng_below(r, E);
      for (size_t k = 0; k < K; k++) c[l * E + (e0 + k * 3) % E]++;
    }
}

/* A million routes and ends in random order: the live footprint equals,
 * bit for bit, a fresh footprint holding only the requests still in flight,
 * and ending them all leaves exactly zero. */
/* A decoder chosen on a prediction: when the true counts arrive, the
 * ticket's contribution is replaced and the decoder's sums are exactly
 * those of the true request routed there alone; the other decoders and
 * the in-flight count are untouched; the old ticket is gone. */
static void test_replace(void **st) {
  (void)st;
  const size_t L = 3, E = 16, K = 2, D = 2;
  eldr_latency_model m;
  small_model(&m, L, E, K);
  eldr_footprint *f = make(&m, D, NULL), *g = make(&m, D, NULL);
  eldr_rng r;
  eldr_rng_seed(&r, 11);
  uint32_t truth[3 * 16], pred[3 * 16], other[3 * 16];
  random_counts(&r, truth, L, E, K, 200);
  random_counts(&r, other, L, E, K, 50);
  /* the prediction: the first 64 tokens' share (a sub-sum of the truth) */
  for (size_t i = 0; i < L * E; i++) pred[i] = truth[i] / 3;
  eldr_fp_request rp = {pred, 64, 200, NULL}, rt = {truth, 200, 200, NULL}, ro = {other, 50, 50, NULL};
  int err;
  uint64_t t0 = eldr_footprint_route(f, 0, &ro, &err), tp = eldr_footprint_route(f, 1, &rp, &err);
  assert_true(t0 != ELDR_FP_NO_TICKET && tp != ELDR_FP_NO_TICKET);
  assert_true(eldr_footprint_route(g, 0, &ro, &err) != ELDR_FP_NO_TICKET);
  assert_true(eldr_footprint_route(g, 1, &rt, &err) != ELDR_FP_NO_TICKET);
  uint64_t tn = eldr_footprint_replace(f, tp, &rt, &err);
  assert_true(tn != ELDR_FP_NO_TICKET);
  for (size_t k = 0; k < D; k++) {
    assert_int_equal(eldr_footprint_inflight(f, k), 1);
    for (size_t l = 0; l < L; l++) {
      for (size_t e = 0; e < E; e++) assert_true(eldr_footprint_raw(f, k, l, e) == eldr_footprint_raw(g, k, l, e));
      assert_true(eldr_footprint_union(f, k, l) == eldr_footprint_union(g, k, l));
    }
  }
  assert_int_equal(eldr_footprint_end(f, tp), ELDR_ENOTFOUND); /* replaced */
  assert_true(eldr_footprint_replace(f, tp, &rt, &err) == ELDR_FP_NO_TICKET);
  assert_int_equal(err, ELDR_ENOTFOUND);
  assert_int_equal(eldr_footprint_end(f, tn), 0);
  for (size_t l = 0; l < L; l++)
    for (size_t e = 0; e < E; e++) assert_true(eldr_footprint_raw(f, 1, l, e) == 0);
  assert_int_equal(eldr_footprint_end(f, t0), 0);
  eldr_footprint_free(f);
  eldr_footprint_free(g);
}

static void test_no_drift(void **st) {
  (void)st;
#if defined(__SANITIZE_ADDRESS__)
  const size_t N = 100000; /* the sanitizer build checks memory; the release build the million */
#else
  const size_t N = 1000000;
#endif
  const size_t L = 3, E = 16, K = 2, D = 3, LIVE = 40, NPROF = 64;
  eldr_latency_model m;
  small_model(&m, L, E, K);
  eldr_footprint *f = make(&m, D, NULL);
  eldr_rng r;
  eldr_rng_seed(&r, 7);
  uint32_t *prof = malloc(NPROF * L * E * sizeof *prof);
  uint32_t ntok[NPROF];
  for (size_t i = 0; i < NPROF; i++) {
    ntok[i] = 1 + (uint32_t)eldr_rng_below(&r, 300);
    random_counts(&r, prof + i * L * E, L, E, K, ntok[i]);
  }
  uint64_t tk[LIVE];
  size_t which[LIVE], dec[LIVE];
  for (size_t i = 0; i < LIVE; i++) tk[i] = ELDR_FP_NO_TICKET;
  for (size_t i = 0; i < N; i++) {
    size_t s = (size_t)eldr_rng_below(&r, LIVE);
    if (tk[s] != ELDR_FP_NO_TICKET) assert_int_equal(eldr_footprint_end(f, tk[s]), 0);
    which[s] = (size_t)eldr_rng_below(&r, NPROF);
    dec[s] = (size_t)eldr_rng_below(&r, D);
    eldr_fp_request q = {prof + which[s] * L * E, ntok[which[s]], 10, NULL};
    tk[s] = eldr_footprint_route(f, dec[s], &q, NULL);
    assert_true(tk[s] != ELDR_FP_NO_TICKET);
  }
  eldr_footprint *g = make(&m, D, NULL);
  for (size_t s = 0; s < LIVE; s++) {
    eldr_fp_request q = {prof + which[s] * L * E, ntok[which[s]], 10, NULL};
    assert_true(eldr_footprint_route(g, dec[s], &q, NULL) != ELDR_FP_NO_TICKET);
  }
  for (size_t k = 0; k < D; k++) {
    assert_int_equal(eldr_footprint_inflight(f, k), eldr_footprint_inflight(g, k));
    for (size_t l = 0; l < L; l++) {
      assert_true(eldr_footprint_union(f, k, l) == eldr_footprint_union(g, k, l));
      for (size_t e = 0; e < E; e++)
        assert_true(eldr_footprint_raw(f, k, l, e) == eldr_footprint_raw(g, k, l, e));
    }
  }
  for (size_t s = 0; s < LIVE; s++) assert_int_equal(eldr_footprint_end(f, tk[s]), 0);
  for (size_t k = 0; k < D; k++) {
    assert_int_equal(eldr_footprint_inflight(f, k), 0);
    for (size_t l = 0; l < L; l++) {
      assert_true(eldr_footprint_union(f, k, l) == 0.0);
      for (size_t e = 0; e < E; e++) assert_true(eldr_footprint_raw(f, k, l, e) == 0);
    }
  }
  eldr_footprint_free(g);
  eldr_footprint_free(f);
  free(prof);
}

/* counts of ntok tokens that each select experts [base, base + K) at every layer */
static void block_counts(uint32_t *c, size_t L, size_t E, size_t K, size_t base, uint32_t ntok) {
  memset(c, 0, L * E * sizeof *c);
  for (size_t l = 0; l < L; l++)
    for (size_t k = 0; k < K; k++) c[l * E + (base + k) % E] = ntok;
}

/* Equal loads: the decoder already decoding the same experts is cheaper.
 * An idle decoder beats one with a few requests of other experts (light
 * load: the batch and union terms dominate). With an overloaded similar
 * decoder, a less loaded dissimilar one wins. */
static void test_decisions(void **st) {
  (void)st;
  const size_t L = 48, E = 128, K = 8;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  eldr_footprint *f = make(&m, 3, NULL);
  uint32_t *a = malloc(L * E * sizeof *a), *b = malloc(L * E * sizeof *b);
  block_counts(a, L, E, K, 0, 50);
  block_counts(b, L, E, K, 64, 50);
  eldr_fp_request ra = {a, 50, 200, NULL}, rb = {b, 50, 200, NULL};
  uint64_t t[8];
  for (int i = 0; i < 4; i++) t[i] = eldr_footprint_route(f, 0, &ra, NULL);
  for (int i = 4; i < 8; i++) t[i] = eldr_footprint_route(f, 1, &rb, NULL);
  uint32_t loads[3] = {4, 4, 4};
  uint8_t healthy[3] = {1, 1, 0};
  int uni = -1;
  double pred = 0;
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, &uni, &pred), 0);
  assert_int_equal(uni, 0);
  assert_true(pred > 0);
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &rb, NULL, NULL), 1);
  healthy[2] = 1;
  loads[2] = 0; /* idle decoder 2 */
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, NULL, NULL), 2);
  /* no counts: the uniform profile */
  eldr_fp_request none = {NULL, 0, 0, NULL};
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &none, &uni, NULL), 2);
  assert_int_equal(uni, 1);
  uint8_t down[3] = {0, 0, 0};
  assert_int_equal(eldr_footprint_decide(f, loads, down, 3, &ra, NULL, NULL), ELDR_EUNAVAIL);
  assert_int_equal(eldr_footprint_decide(f, loads, NULL, 2, &ra, NULL, NULL), ELDR_EINVAL);
  /* a layer mask that only sees layer 0 still prefers the similar decoder */
  uint8_t mask[48] = {1};
  eldr_footprint *g = make(&m, 2, mask);
  eldr_footprint_route(g, 0, &ra, NULL);
  eldr_footprint_route(g, 1, &rb, NULL);
  uint32_t l2[2] = {1, 1};
  assert_int_equal(eldr_footprint_decide(g, l2, NULL, 2, &rb, NULL, NULL), 1);
  assert_true(eldr_footprint_union(g, 0, 1) == 0.0); /* unmasked layers are not tracked */
  eldr_footprint_free(g);
  for (int i = 0; i < 8; i++) assert_int_equal(eldr_footprint_end(f, t[i]), 0);
  eldr_footprint_free(f);
  free(a);
  free(b);
}

/* The own-time weight (eldr_footprint_opts.own_weight): the explained
 * cost is n (T1 - T0) + w T1 max(1, (n + 1) / B); with the request's own
 * time weighted more, a decoder piling up copies of it (3,200-token
 * contexts) loses to a less loaded dissimilar one at fewer copies (12
 * against 13 here); out-of-range weights refused. */
static size_t switch_at(const eldr_latency_model *m, double w, const uint32_t *a, const uint32_t *b, uint32_t ctx) {
  for (size_t n = 1; n <= 60; n++) {
    eldr_footprint_opts o = {.n_decoders = 2, .max_batch = 64, .own_weight = w};
    eldr_footprint *f = NULL;
    assert_int_equal(eldr_footprint_new(m, &o, &f, NULL), 0);
    eldr_fp_request ra = {a, 50, ctx, NULL}, rb = {b, 50, 200, NULL};
    for (size_t i = 0; i < n; i++) (void)eldr_footprint_route(f, 0, &ra, NULL);
    (void)eldr_footprint_route(f, 1, &rb, NULL);
    uint32_t loads[2] = {(uint32_t)n, 1};
    const int k = eldr_footprint_decide(f, loads, NULL, 2, &ra, NULL, NULL);
    eldr_fp_explain x;
    eldr_footprint_explain(f, &x);
    assert_int_equal(x.decoder, k);
    const double nk = loads[k], q = (nk + 1) / 64.0;
    const double want = nk * (x.t1 - x.t0) + (w > 0 ? w : 1) * x.t1 * (q > 1 ? q : 1);
    assert_true(fabs(x.cost - want) <= 1e-9 * want);
    eldr_footprint_free(f);
    if (k == 1) return n;
  }
  return 61;
}

static void test_own_weight(void **st) {
  (void)st;
  const size_t L = 48, E = 128, K = 8;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  uint32_t *a = malloc(L * E * sizeof *a), *b = malloc(L * E * sizeof *b);
  block_counts(a, L, E, K, 0, 50);
  block_counts(b, L, E, K, 64, 50);
  const size_t n1 = switch_at(&m, 0, a, b, 3200), n4 = switch_at(&m, 4, a, b, 3200);
  print_message("copies on the similar decoder before a request goes to the other: %zu (weight 1), %zu (weight 4)\n",
                n1, n4);
  assert_true(n1 <= 60); /* the switch happens at all */
  assert_true(n4 < n1);
  assert_int_equal(switch_at(&m, 1, a, b, 3200), n1); /* 0 is the default, 1 */
  eldr_footprint *f = NULL;
  const double bad[] = {-1, 100.5, NAN};
  for (int i = 0; i < 3; i++) {
    eldr_footprint_opts o = {.n_decoders = 2, .own_weight = bad[i]};
    eldr_diag d = {{0}};
    assert_int_equal(eldr_footprint_new(&m, &o, &f, &d), ELDR_EINVAL);
    assert_non_null(strstr(d.msg, "own-time weight"));
    assert_null(f);
  }
  free(a);
  free(b);
}

/* A full decoder (B in flight: a new request waits for a member to end) is
 * not chosen while a healthy one has a free slot, however alike its
 * experts; with every healthy decoder full the cost decides again. */
static void test_full_decoder(void **st) {
  (void)st;
  const size_t L = 48, E = 128, K = 8;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  eldr_footprint_opts o = {.n_decoders = 3, .max_batch = 4};
  eldr_footprint *f = NULL;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), 0);
  uint32_t *a = malloc(L * E * sizeof *a), *b = malloc(L * E * sizeof *b);
  block_counts(a, L, E, K, 0, 50);
  block_counts(b, L, E, K, 64, 50);
  eldr_fp_request ra = {a, 50, 200, NULL}, rb = {b, 50, 200, NULL};
  for (int i = 0; i < 3; i++) (void)eldr_footprint_route(f, 0, &ra, NULL);
  for (int i = 0; i < 3; i++) (void)eldr_footprint_route(f, 1, &rb, NULL);
  uint8_t healthy[3] = {1, 1, 0};
  uint32_t loads[3] = {3, 3, 0};
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, NULL, NULL), 0); /* locality */
  (void)eldr_footprint_route(f, 0, &ra, NULL);
  loads[0] = 4; /* decoder 0 full: the dissimilar one with a free slot */
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, NULL, NULL), 1);
  loads[1] = 4; /* both full (decoder 2, with room, is down): the cost again */
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, NULL, NULL), 0);
  loads[1] = 9; /* loads above B (queued requests) count as full too */
  loads[0] = 5;
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, NULL, NULL), 0);
  healthy[2] = 1; /* decoder 2 back, empty: the only one with room */
  assert_int_equal(eldr_footprint_decide(f, loads, healthy, 3, &ra, NULL, NULL), 2);
  eldr_footprint_free(f);
  free(a);
  free(b);
}

/* The home term (eldr_footprint_opts.home_weight): with equal loads and
 * nothing in flight the costs tie and the lower index wins; with the term
 * the decoder whose centroid the request's signature is nearest wins, its
 * explained cost unchanged (s_max - s_k = 0 there) and the other's raised
 * by w T1 (s_max - s_k); a NaN signature adds nothing;
 * bad weights and a weight without centroids refused. */
static void test_home(void **st) {
  (void)st;
  const size_t L = 4, E = 16, K = 2, dim = 8;
  eldr_latency_model m;
  small_model(&m, L, E, K);
  float cent[2 * 8] = {0}, sig[8] = {0};
  cent[0] = 1;       /* decoder 0's centroid: axis 0 */
  cent[8 + 1] = 1;   /* decoder 1's: axis 1 */
  sig[0] = 0.6f;     /* nearer decoder 1's */
  sig[1] = 0.8f;
  uint32_t c[64];
  block_counts(c, L, E, K, 0, 10);
  eldr_fp_request fr = {c, 10, 5, sig};
  uint32_t loads[2] = {0, 0};
  eldr_footprint_opts o = {.n_decoders = 2, .max_batch = 64};
  eldr_footprint *f = NULL;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), 0);
  assert_int_equal(eldr_footprint_decide(f, loads, NULL, 2, &fr, NULL, NULL), 0); /* a tie */
  eldr_fp_explain x0;
  eldr_footprint_explain(f, &x0);
  eldr_footprint_free(f);
  o.home_weight = 0.5;
  o.home_centroids = cent;
  o.dim = dim;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), 0);
  assert_int_equal(eldr_footprint_decide(f, loads, NULL, 2, &fr, NULL, NULL), 1);
  eldr_fp_explain x1;
  eldr_footprint_explain(f, &x1);
  assert_true(fabs(x1.cost - x0.cost) <= 1e-12 * x0.cost); /* the home decoder pays nothing */
  const uint8_t only0[2] = {1, 0}; /* the home decoder down: decoder 0 pays the term */
  assert_int_equal(eldr_footprint_decide(f, loads, only0, 2, &fr, NULL, NULL), 0);
  eldr_footprint_explain(f, &x1);
  const double want = x0.cost + 0.5 * x1.t1 * (0.8 - 0.6);
  assert_true(fabs(x1.cost - want) <= 1e-6 * want);
  float nan_sig[8] = {NAN};
  eldr_fp_request fn = {c, 10, 5, nan_sig};
  eldr_footprint_free(f);
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), 0);
  assert_int_equal(eldr_footprint_decide(f, loads, NULL, 2, &fn, NULL, NULL), 0); /* no term: the tie */
  eldr_footprint_free(f);
  const double bad[] = {-1, 100.5, NAN};
  for (int i = 0; i < 3; i++) {
    o.home_weight = bad[i];
    eldr_diag d = {{0}};
    assert_int_equal(eldr_footprint_new(&m, &o, &f, &d), ELDR_EINVAL);
    assert_non_null(strstr(d.msg, "home weight"));
  }
  o.home_weight = 1;
  o.home_centroids = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_footprint_new(&m, &o, &f, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "one centroid per decoder"));
  assert_null(f);
}

/* The policy: without a footprint it is JSQ and says so; with one it runs
 * the cost model; on_route / on_end are no-ops for other policies. */
static void test_policy(void **st) {
  (void)st;
  const size_t L = 4, E = 16, K = 2;
  eldr_latency_model m;
  small_model(&m, L, E, K);
  eldr_policy p;
  assert_int_equal(eldr_policy_init(&p, ELDR_POLICY_FOOTPRINT, 0, 1, NULL, 0, 0, 1), 0);
  eldr_policy_kind k;
  assert_int_equal(eldr_policy_parse("footprint", &k), 0);
  assert_int_equal(k, ELDR_POLICY_FOOTPRINT);
  uint32_t loads[3] = {3, 1, 2};
  uint32_t c[64];
  block_counts(c, L, E, K, 0, 10);
  eldr_fp_request fr = {c, 10, 5, NULL};
  eldr_decision dec;
  assert_int_equal(eldr_policy_decide(&p, loads, NULL, 3, NULL, &fr, &dec), 1);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_MODEL);
  assert_true(eldr_policy_on_route(&p, 1, &fr) == ELDR_FP_NO_TICKET);
  eldr_footprint *f = make(&m, 3, NULL);
  eldr_policy_attach_footprint(&p, f);
  int c0 = eldr_policy_decide(&p, loads, NULL, 3, NULL, &fr, &dec);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NONE);
  assert_true(dec.pred_tpot > 0);
  uint64_t t = eldr_policy_on_route(&p, c0, &fr);
  assert_true(t != ELDR_FP_NO_TICKET);
  assert_int_equal(eldr_footprint_inflight(f, (size_t)c0), 1);
  eldr_policy_on_end(&p, t);
  assert_int_equal(eldr_footprint_inflight(f, (size_t)c0), 0);
  eldr_policy_on_end(&p, t); /* ignored */
  /* eldr_policy_decode: no counts, the uniform profile */
  assert_true(eldr_policy_decode(&p, loads, NULL, 3, NULL, &dec) >= 0);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_SIGNATURE);
  /* a state for another number of decoders: JSQ, NO_MODEL */
  uint32_t l4[4] = {2, 2, 0, 2};
  assert_int_equal(eldr_policy_decide(&p, l4, NULL, 4, NULL, &fr, &dec), 2);
  assert_int_equal(dec.fallback, ELDR_FALLBACK_NO_MODEL);
  /* other policies: no tickets */
  eldr_policy j;
  assert_int_equal(eldr_policy_init(&j, ELDR_POLICY_JSQ, 0, 1, NULL, 0, 0, 1), 0);
  eldr_policy_attach_footprint(&j, f);
  assert_true(eldr_policy_on_route(&j, 0, &fr) == ELDR_FP_NO_TICKET);
  eldr_policy_on_end(&j, ELDR_FP_NO_TICKET);
  eldr_footprint_free(f);
}

/* step_f is the step model: integer unions give eldr_latency_step's bits. */
static void test_step_f(void **st) {
  (void)st;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  uint32_t u[48];
  double uf[48];
  for (int l = 0; l < 48; l++) u[l] = (uint32_t)(8 + l), uf[l] = 8 + l;
  assert_true(eldr_latency_step(&m, 16, u, 4000) == eldr_latency_step_f(&m, 16, uf, 4000));
}

/* The artifact's latency section: round trip bit-identical, optional,
 * complete when present, same shape as the model. */
static void test_artifact_latency(void **st) {
  (void)st;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h100", &m, NULL), 0);
  eldr_shape s = m.shape;
  eldr_artifact *a = eldr_artifact_new("olmoe", &s, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  assert_non_null(a);
  for (size_t c = 0; c < 2; c++) a->centroids[c * a->dim + c] = 1.0f;
  a->tau = 0.1;
  a->fit_rho = NAN;
  m.hbm_bw = 1.0 / 3.0 * 1e12; /* not representable in few digits */
  assert_int_equal(eldr_artifact_set_latency(a, &m, NULL), 0);
  char *txt = eldr_artifact_dump(a);
  assert_non_null(txt);
  eldr_artifact *b = NULL;
  assert_int_equal(eldr_artifact_parse(txt, strlen(txt), &b, NULL), 0);
  assert_non_null(b->latency);
  assert_memory_equal(b->latency, &m, sizeof m);
  eldr_artifact_free(b);
  /* a missing field */
  char *cut = strstr(txt, "\"step_overhead_s\"");
  assert_non_null(cut);
  char *bad = malloc(strlen(txt) + 1);
  size_t pre = (size_t)(cut - txt);
  memcpy(bad, txt, pre);
  const char *rest = strchr(cut, ',') + 1;
  strcpy(bad + pre, rest);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_parse(bad, strlen(bad), &b, &d), ELDR_EPARSE);
  assert_non_null(strstr(d.msg, "latency"));
  free(bad);
  free(txt);
  /* another shape */
  eldr_latency_model q;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "h100", &q, NULL), 0);
  assert_int_equal(eldr_artifact_set_latency(a, &q, &d), ELDR_ESHAPE);
  assert_memory_equal(a->latency, &m, sizeof m); /* unchanged */
  /* absent: no section */
  assert_int_equal(eldr_artifact_set_latency(a, NULL, NULL), 0);
  txt = eldr_artifact_dump(a);
  assert_null(strstr(txt, "latency"));
  assert_int_equal(eldr_artifact_parse(txt, strlen(txt), &b, NULL), 0);
  assert_null(b->latency);
  eldr_artifact_free(b);
  free(txt);
  eldr_artifact_free(a);
}

/* Simulator rows: footprint, its oracle and its control complete every
 * request; without coefficients every decision is a (JSQ) fallback. */
static void test_sim_rows(void **st) {
  (void)st;
  const uint32_t L = 4, E = 16, K = 2;
  eldr_shape s = {L, E, K};
  eldr_trace *t = eldr_trace_new("toy", &s, NULL);
  eldr_rng r;
  eldr_rng_seed(&r, 3);
  uint16_t pre[20 * 8], dec[30 * 8];
  for (int i = 0; i < 60; i++) {
    uint16_t b = (uint16_t)(i % 2 ? 0 : 8);
    for (int x = 0; x < 20 * 8; x++) pre[x] = (uint16_t)((b + x % 2 + 2 * eldr_rng_below(&r, 2)) % E);
    for (int x = 0; x < 30 * 8; x++) dec[x] = (uint16_t)((b + x % 2 + 2 * eldr_rng_below(&r, 2)) % E);
    for (int x = 0; x < 20 * 4; x++) /* distinct per (token, layer) */
      if (pre[2 * x] == pre[2 * x + 1]) pre[2 * x + 1] = (uint16_t)((pre[2 * x] + 1) % E);
    for (int x = 0; x < 30 * 4; x++)
      if (dec[2 * x] == dec[2 * x + 1]) dec[2 * x + 1] = (uint16_t)((dec[2 * x] + 1) % E);
    char id[16];
    snprintf(id, sizeof id, "r%d", i);
    assert_true(eldr_trace_append(t, id, NULL, NULL, -1, pre, 20, dec, 30, NULL) >= 0);
  }
  size_t idx[60];
  for (size_t i = 0; i < 60; i++) idx[i] = i;
  eldr_latency_model m;
  small_model(&m, L, E, K);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 60, .policy_model = &m};
  for (int variant = 0; variant < 4; variant++) {
    eldr_sim_config c;
    eldr_sim_config_default(&c);
    c.n_prefill = 2;
    c.n_decode = 4;
    c.rate = 2000;
    c.n_requests = 500;
    c.policy = ELDR_POLICY_FOOTPRINT;
    c.footprint_oracle = variant == 1;
    c.permute_signatures = variant == 2;
    eldr_sim_pool p2 = pool;
    if (variant == 3) p2.policy_model = NULL;
    eldr_sim_result res;
    eldr_diag d = {{0}};
    assert_int_equal(eldr_sim_run(&p2, &m, &c, &res, &d), 0);
    assert_int_equal(res.completed, 500);
    if (variant == 3) {
      assert_int_equal(res.fallbacks, 500);
      assert_true(isnan(res.pred_rel_err));
    } else {
      assert_int_equal(res.fallbacks, 0);
      assert_true(res.pred_rel_err >= 0 && isfinite(res.pred_rel_err));
    }
  }
  eldr_trace_free(t);
}

/* Priors: a request's profile is (c + alpha pi) / (n + alpha) with pi the
 * row of the centroid nearest its signature (the global row without one),
 * the prior itself without counts, and on layers outside the mask; a single
 * request's union per layer is the sum of its profile. */
static void test_priors(void **st) {
  (void)st;
  enum { L = 2, E = 8, K = 1, LE = L * E, NC = 2, DIM = 2 };
  eldr_latency_model m;
  small_model(&m, L, E, K);
  float prior[3 * 16];
  for (size_t row = 0; row < 3; row++) /* global uniform; cluster 0 on experts 0-3, 1 on 4-7 */
    for (size_t i = 0; i < LE; i++) {
      size_t e = i % E;
      prior[row * LE + i] = row == 0 ? 1.0f / E : (row == 1) == (e < 4) ? 0.25f : 0.0f;
    }
  const float cent[NC * DIM] = {1, 0, 0, 1}, sig1[DIM] = {0.1f, 0.9f};
  const uint8_t mask[2] = {1, 0};
  eldr_footprint_opts o = {.n_decoders = 2, .max_batch = 64, .layer_mask = mask, .prior = prior,
                           .n_priors = 3, .prior_tokens = 4, .centroids = cent, .dim = DIM};
  eldr_footprint *f = NULL;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), 0);
  uint32_t c[16] = {0};
  c[0] = 4; /* layer 0: 4 tokens all on expert 0 */
  eldr_fp_request r = {c, 4, 10, sig1};
  assert_true(eldr_footprint_route(f, 0, &r, NULL) != ELDR_FP_NO_TICKET);
  /* layer 0 (counts): p(0) = 4 / 8 = 0.5, p(4..7) = 4 * 0.25 / 8 = 0.125, others 0:
   * union 1; layer 1 (outside the mask): cluster 1's prior, union 1 */
  assert_true(fabs(eldr_footprint_union(f, 0, 0) - 1.0) < 1e-5);
  assert_true(fabs(eldr_footprint_union(f, 0, 1) - 1.0) < 1e-5);
  assert_true(eldr_footprint_raw(f, 0, 0, 1) == 0);         /* neither counts nor prior */
  assert_true(eldr_footprint_raw(f, 0, 0, 5) > 0);          /* cluster 1's prior */
  assert_true(eldr_footprint_raw(f, 0, 1, 0) == 0);         /* layer 1: the prior alone */
  assert_true(eldr_footprint_raw(f, 0, 1, 4) > 0);
  /* two of them: layer 1's union is sum_e 1 - (1 - 0.25)^2 over 4 experts */
  uint64_t t2 = eldr_footprint_route(f, 0, &r, NULL);
  assert_true(fabs(eldr_footprint_union(f, 0, 1) - 4 * (1 - 0.75 * 0.75)) < 1e-5);
  /* no signature: the global prior; no counts: the prior on every layer */
  eldr_fp_request g = {NULL, 0, 10, NULL};
  uint64_t t3 = eldr_footprint_route(f, 1, &g, NULL);
  for (size_t e = 0; e < E; e++) assert_true(eldr_footprint_raw(f, 1, 0, e) > 0);
  assert_true(fabs(eldr_footprint_union(f, 1, 0) - 1.0) < 1e-5);
  /* the end removes exactly what the route added */
  assert_int_equal(eldr_footprint_end(f, t2), 0);
  assert_int_equal(eldr_footprint_end(f, t3), 0);
  for (size_t e = 0; e < E; e++) assert_true(eldr_footprint_raw(f, 1, 0, e) == 0);
  eldr_footprint *h = NULL;
  assert_int_equal(eldr_footprint_new(&m, &o, &h, NULL), 0);
  assert_true(eldr_footprint_route(h, 0, &r, NULL) != ELDR_FP_NO_TICKET);
  for (size_t l = 0; l < L; l++)
    for (size_t e = 0; e < E; e++)
      assert_true(eldr_footprint_raw(f, 0, l, e) == eldr_footprint_raw(h, 0, l, e));
  /* the decision's explanation: the chosen decoder and its predicted union */
  uint32_t loads[2] = {1, 0};
  int k = eldr_footprint_decide(f, loads, NULL, 2, &r, NULL, NULL);
  eldr_fp_explain ex;
  eldr_footprint_explain(f, &ex);
  assert_int_equal(ex.decoder, k);
  assert_true(ex.union_mean > 0 && ex.t1 > 0 && ex.cost > 0);
  eldr_footprint_free(h);
  eldr_footprint_free(f);
  /* bad priors */
  eldr_diag d = {{0}};
  prior[3] = 1.5f;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, &d), ELDR_ERANGE);
  prior[3] = 1.0f / E;
  o.centroids = NULL;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "centroids"));
}

/* The exact bookkeeping with priors: routes and ends in random order leave
 * the same integers as a footprint of the live requests alone. */
static void test_no_drift_priors(void **st) {
  (void)st;
  enum { L = 3, E = 16, K = 2, D = 3, LIVE = 30, NPROF = 32, N = 20000, DIM = 4 };
  eldr_latency_model m;
  small_model(&m, L, E, K);
  eldr_rng r;
  eldr_rng_seed(&r, 17);
  float prior[4 * 3 * 16], cent[3 * DIM], sigs[NPROF * DIM];
  for (size_t row = 0; row < 4; row++)
    for (size_t l = 0; l < L; l++) {
      double sum = 0;
      for (size_t e = 0; e < E; e++) sum += prior[(row * L + l) * E + e] = (float)eldr_rng_uniform(&r);
      for (size_t e = 0; e < E; e++) prior[(row * L + l) * E + e] = (float)(prior[(row * L + l) * E + e] * K / sum);
    }
  for (size_t i = 0; i < 3 * DIM; i++) cent[i] = (float)eldr_rng_uniform(&r);
  for (size_t i = 0; i < NPROF * DIM; i++) sigs[i] = (float)eldr_rng_uniform(&r);
  const uint8_t mask[3] = {1, 0, 1};
  eldr_footprint_opts o = {.n_decoders = D, .max_batch = 64, .layer_mask = mask, .prior = prior,
                           .n_priors = 4, .prior_tokens = 7.5, .centroids = cent, .dim = DIM};
  eldr_footprint *f = NULL, *g = NULL;
  assert_int_equal(eldr_footprint_new(&m, &o, &f, NULL), 0);
  assert_int_equal(eldr_footprint_new(&m, &o, &g, NULL), 0);
  uint32_t *prof = malloc(NPROF * L * E * sizeof *prof);
  uint32_t ntok[NPROF];
  for (size_t i = 0; i < NPROF; i++) {
    ntok[i] = (uint32_t)eldr_rng_below(&r, 40); /* 0: no counts */
    random_counts(&r, prof + i * L * E, L, E, K, ntok[i]);
  }
  uint64_t tk[LIVE];
  size_t which[LIVE], dec[LIVE];
  for (size_t i = 0; i < LIVE; i++) tk[i] = ELDR_FP_NO_TICKET;
  uint32_t loads[3] = {0, 0, 0};
  for (size_t i = 0; i < N; i++) {
    size_t s = (size_t)eldr_rng_below(&r, LIVE);
    if (tk[s] != ELDR_FP_NO_TICKET) assert_int_equal(eldr_footprint_end(f, tk[s]), 0);
    which[s] = (size_t)eldr_rng_below(&r, NPROF);
    eldr_fp_request q = {prof + which[s] * L * E, ntok[which[s]], 10, sigs + which[s] * DIM};
    if (i % 2) (void)eldr_footprint_decide(f, loads, NULL, D, &q, NULL, NULL); /* a route after a decision */
    dec[s] = (size_t)eldr_rng_below(&r, D);
    tk[s] = eldr_footprint_route(f, dec[s], &q, NULL);
    assert_true(tk[s] != ELDR_FP_NO_TICKET);
  }
  for (size_t s = 0; s < LIVE; s++) {
    eldr_fp_request q = {prof + which[s] * L * E, ntok[which[s]], 10, sigs + which[s] * DIM};
    assert_true(eldr_footprint_route(g, dec[s], &q, NULL) != ELDR_FP_NO_TICKET);
  }
  for (size_t k = 0; k < D; k++)
    for (size_t l = 0; l < L; l++) {
      assert_true(eldr_footprint_union(f, k, l) == eldr_footprint_union(g, k, l));
      for (size_t e = 0; e < E; e++)
        assert_true(eldr_footprint_raw(f, k, l, e) == eldr_footprint_raw(g, k, l, e));
    }
  for (size_t s = 0; s < LIVE; s++) assert_int_equal(eldr_footprint_end(f, tk[s]), 0);
  for (size_t k = 0; k < D; k++)
    for (size_t l = 0; l < L; l++)
      for (size_t e = 0; e < E; e++) assert_true(eldr_footprint_raw(f, k, l, e) == 0);
  free(prof);
  eldr_footprint_free(g);
  eldr_footprint_free(f);
}

/* The prior fit: two clusters whose decode concentrates on their own half
 * of the experts, each request on its own favourite pair of them half of
 * the time, prompts of a few tokens. The cluster priors carry that
 * (beta finite), each layer's prior sums to K, the fitted profile's
 * leave-one-out likelihood beats both the prior and the prefill alone, and
 * the union-calibrated weight predicts batch unions better than the raw
 * prefill profile. Without decode counts there is no prior. */
static void test_prior_fit(void **st) {
  (void)st;
  enum { L = 2, E = 16, K = 2, LE = L * E, N = 80 };
  eldr_shape s = {L, E, K};
  uint32_t *pre = calloc(N * LE, sizeof *pre), *dec = calloc(N * LE, sizeof *dec);
  int lab[80];
  eldr_rng r;
  eldr_rng_seed(&r, 5);
  for (size_t i = 0; i < N; i++) {
    lab[i] = (int)(i % 2);
    size_t half = (size_t)lab[i] * (E / 2), fav = half + (size_t)eldr_rng_below(&r, E / 2 - 1);
    for (size_t t = 0; t < 4 + 60; t++)
      for (size_t l = 0; l < L; l++) { /* its favourite pair half of the time */
        size_t e0 = eldr_rng_below(&r, 2) ? fav : half + (size_t)eldr_rng_below(&r, E / 2 - 1);
        size_t e1 = e0 + 1; /* distinct */
        uint32_t *row = t < 4 ? pre + i * LE : dec + i * LE;
        row[l * E + e0]++;
        row[l * E + e1]++;
      }
  }
  float prior[3 * 32];
  eldr_fp_prior_report rep;
  assert_int_equal(eldr_fp_prior_fit(&s, pre, dec, lab, N, 2, prior, &rep), 0);
  assert_int_equal(rep.n, N);
  assert_true(isfinite(rep.beta));
  assert_true(rep.alpha > 0 && rep.alpha_ll > 0);
  assert_true(rep.ll_alpha > rep.ll_prior - 1e-12 && rep.ll_alpha > rep.ll_prefill);
  assert_true(rep.ll_alpha > rep.ll_global);
  assert_true(rep.union_err < rep.union_err_raw);
  for (size_t row = 0; row < 3; row++)
    for (size_t l = 0; l < L; l++) {
      double sum = 0, own = 0;
      for (size_t e = 0; e < E; e++) {
        sum += prior[(row * L + l) * E + e];
        if (row && (e < E / 2) == (row == 1)) own += prior[(row * L + l) * E + e];
      }
      assert_true(fabs(sum - K) < 1e-4);
      if (row) assert_true(own > 0.8 * K); /* a cluster's prior is on its half */
    }
  /* deterministic */
  float again[3 * 32];
  eldr_fp_prior_report rep2;
  assert_int_equal(eldr_fp_prior_fit(&s, pre, dec, lab, N, 2, again, &rep2), 0);
  assert_memory_equal(prior, again, sizeof prior);
  assert_true(rep.alpha == rep2.alpha);
  /* global only */
  assert_int_equal(eldr_fp_prior_fit(&s, pre, dec, NULL, N, 0, prior, &rep), 0);
  assert_true(isinf(rep.beta));
  /* no decode: no prior; a label out of range */
  memset(dec, 0, N * LE * sizeof *dec);
  assert_int_equal(eldr_fp_prior_fit(&s, pre, dec, lab, N, 2, prior, &rep), ELDR_EEMPTY);
  lab[3] = 2;
  dec[3 * LE] = 2;
  assert_int_equal(eldr_fp_prior_fit(&s, pre, dec, lab, N, 2, prior, &rep), ELDR_EINVAL);
  free(pre);
  free(dec);
}

/* The artifact's footprint section: round trip of the global and cluster
 * priors, bit for bit; bad rows are errors naming the field. */
static void test_artifact_priors(void **st) {
  (void)st;
  const uint32_t L = 2, E = 4, K = 1;
  eldr_shape s = {L, E, K};
  eldr_artifact *a = eldr_artifact_new("toy", &s, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  assert_non_null(a);
  for (size_t i = 0; i < a->k * a->dim; i++) a->centroids[i] = (i % a->dim) == (i / a->dim) ? 1.0f : 0.0f;
  a->fit_rho = NAN;
  float prior[3 * 8];
  for (size_t i = 0; i < 24; i++) prior[i] = (i % 4 == 0) ? 0.4f : 0.2f;
  prior[9] = 1.0f / 3.0f, prior[10] = 0.2f - (1.0f / 3.0f - 0.2f); /* not few-digit values */
  assert_int_equal(eldr_artifact_set_fp_prior(a, prior, 3, 12.345678901, NULL), 0);
  char *txt = eldr_artifact_dump(a);
  assert_non_null(txt);
  assert_non_null(strstr(txt, "\"cluster_priors\""));
  eldr_artifact *b = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_parse(txt, strlen(txt), &b, &d), 0);
  assert_int_equal(b->fp_n_priors, 3);
  assert_true(b->fp_prior_tokens == a->fp_prior_tokens);
  assert_memory_equal(b->fp_prior, prior, sizeof prior);
  eldr_artifact_free(b);
  free(txt);
  /* a layer that does not sum to K, a wrong row count */
  prior[0] = 0.9f;
  assert_int_equal(eldr_artifact_set_fp_prior(a, prior, 3, 1, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "footprint.prior"));
  prior[0] = 0.4f;
  assert_int_equal(eldr_artifact_set_fp_prior(a, prior, 2, 1, &d), ELDR_ESHAPE);
  assert_int_equal(a->fp_n_priors, 3); /* unchanged */
  assert_int_equal(eldr_artifact_set_fp_prior(a, NULL, 0, 0, NULL), 0);
  txt = eldr_artifact_dump(a);
  assert_null(strstr(txt, "footprint"));
  free(txt);
  eldr_artifact_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_priors),         cmocka_unit_test(test_no_drift_priors),
      cmocka_unit_test(test_prior_fit),      cmocka_unit_test(test_artifact_priors),
      cmocka_unit_test(test_new_errors),     cmocka_unit_test(test_union_product_form),
      cmocka_unit_test(test_no_drift),       cmocka_unit_test(test_decisions),
      cmocka_unit_test(test_policy),         cmocka_unit_test(test_step_f),
      cmocka_unit_test(test_artifact_latency), cmocka_unit_test(test_sim_rows),
      cmocka_unit_test(test_replace),        cmocka_unit_test(test_own_weight),
      cmocka_unit_test(test_full_decoder),  cmocka_unit_test(test_home),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
