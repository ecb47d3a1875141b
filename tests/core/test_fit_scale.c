/* test_fit_scale.c — the fit at scale: mini-batch balanced K-means closed by
 * the exact balanced assignment (capacity ceil(n/k) holds exactly, in memory
 * and streamed), the sampled rho's jackknife interval against the exact
 * rho, and continuity with a previous artifact (--previous). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/fit.h"
#include "eldr/kmeans_mb.h"
#include "eldr/quality.h"
#include "eldr/rng.h"

enum { TL = 4, TE = 32, TK = 2, TLE = TL * TE };

/* A counts source: request i belongs to domain i % domains (the order is
 * sorted-by-nothing, interleaved); prefill and decode draw experts mostly
 * from the domain's block of 8. Request i depends only on (seed, i). */
typedef struct csrc {
  size_t n, domains;
  uint64_t seed;
  uint32_t pre[TLE], dec[TLE];
  int passes;
} csrc;

static void draw(eldr_rng *r, size_t dom, size_t tokens, uint32_t *out) {
  memset(out, 0, TLE * sizeof *out);
  for (size_t t = 0; t < tokens; t++)
    for (size_t l = 0; l < TL; l++)
      for (size_t k = 0; k < TK; k++) {
        uint64_t e = eldr_rng_uniform(r) < 0.8 ? (dom * 8 + eldr_rng_below(r, 8)) % TE
                                               : eldr_rng_below(r, TE);
        out[l * TE + e]++;
      }
}

static int csrc_each(void *ctx, eldr_fit_visit visit, void *ud, eldr_diag *d) {
  (void)d;
  csrc *c = ctx;
  c->passes++;
  for (size_t i = 0; i < c->n; i++) {
    eldr_rng r;
    eldr_rng_seed(&r, c->seed * 1000003u + i);
    const size_t dom = i % c->domains;
    draw(&r, dom, 3 + eldr_rng_below(&r, 6), c->pre);
    draw(&r, dom, 12, c->dec);
    eldr_fit_item it = {.n_prefill = 5, .prefill = c->pre, .decode = c->dec};
    int rc = visit(ud, &it);
    if (rc) return rc;
  }
  return 0;
}

static uint32_t g_layer_ids[TL] = {0, 1, 2, 3};

static eldr_fit_source make_src(csrc *c, size_t n, size_t domains, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->n = n;
  c->domains = domains;
  c->seed = seed;
  return (eldr_fit_source){.model = "m", .shape = {TL, TE, TK}, .layer_ids = g_layer_ids,
                           .each = csrc_each, .ctx = c};
}

static void scale_opts(eldr_fit_opts *o, size_t k) {
  eldr_fit_opts_default(o);
  o->k = k;
  o->rho_sample = 150;
  o->exact_limit = 100;
  o->batch = 128;
  o->restarts = 2;
}

/* sizes sum to n and none passes ceil(n/k) */
static void check_capacity(const eldr_artifact *a, size_t n) {
  const size_t cap = (n + a->k - 1) / a->k;
  size_t sum = 0;
  for (size_t c = 0; c < a->k; c++) {
    assert_true(a->cluster_sizes[c] <= cap);
    sum += a->cluster_sizes[c];
  }
  assert_int_equal(sum, n);
}

static void test_minibatch_in_memory_exact_capacity(void **st) {
  (void)st;
  csrc c;
  eldr_fit_source src = make_src(&c, 1001, 4, 7); /* 1001 = 7 * 143: with k = 7 every cluster is full */
  eldr_fit_opts o;
  scale_opts(&o, 7);
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_fit_stream(&src, &o, &a, &rep, &d), 0);
  assert_string_equal(rep.mode, "mini-batch");
  assert_int_equal(rep.n, 1001);
  assert_int_equal(rep.sample, 150);
  assert_int_equal(rep.capacity, 143);
  check_capacity(a, 1001);
  for (size_t k = 0; k < 7; k++) assert_int_equal(a->cluster_sizes[k], 143);
  assert_int_equal(rep.passes, 2); /* pass 1 + the signature matrix */
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
}

static void test_minibatch_streamed_exact_capacity(void **st) {
  (void)st;
  csrc c;
  eldr_fit_source src = make_src(&c, 1000, 4, 8);
  eldr_fit_opts o;
  scale_opts(&o, 6); /* cap = 167, 6 * 167 = 1002: not all full */
  o.sig_budget = 1;  /* nothing fits: every pass re-reads the source */
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  assert_int_equal(eldr_fit_stream(&src, &o, &a, &rep, NULL), 0);
  assert_string_equal(rep.mode, "mini-batch (streamed)");
  check_capacity(a, 1000);
  /* pass 1, 2 epochs, final scores, final means */
  assert_int_equal(rep.passes, 5);
  assert_int_equal(c.passes, 5);
  for (size_t k = 0; k < a->k; k++) {
    double nn = 0;
    for (size_t j = 0; j < a->dim; j++) nn += (double)a->centroids[k * a->dim + j] * a->centroids[k * a->dim + j];
    assert_true(fabs(nn - 1.0) < 1e-4);
  }
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  /* the vanilla ablation cannot stream */
  o.balanced = 0;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_fit_stream(&src, &o, &a, &rep, &d), ELDR_EUNSUPPORTED);
  assert_non_null(strstr(d.msg, "in memory"));
}

/* The mini-batch fit finds the 4 domains: with k = 4, each cluster is
 * (almost) one domain. */
static void test_minibatch_recovers_domains(void **st) {
  (void)st;
  csrc c;
  eldr_fit_source src = make_src(&c, 1200, 4, 9);
  eldr_fit_opts o;
  scale_opts(&o, 4);
  o.layers = ELDR_FIT_LAYERS_ALL;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  assert_int_equal(eldr_fit_stream(&src, &o, &a, &rep, NULL), 0);
  /* nearest centroid of each domain's requests */
  size_t hits[4][4] = {{0}};
  eldr_sigspec spec;
  eldr_artifact_sigspec(a, &spec);
  float sig[TLE];
  for (size_t i = 0; i < 400; i++) {
    eldr_rng r;
    eldr_rng_seed(&r, 9 * 1000003u + i);
    draw(&r, i % 4, 3 + eldr_rng_below(&r, 6), c.pre);
    eldr_signature_build(&spec, c.pre, NULL, sig);
    size_t b = 0;
    double bs = -2;
    for (size_t k = 0; k < 4; k++) {
      double v = eldr_dot(sig, a->centroids + k * a->dim, a->dim);
      if (v > bs) bs = v, b = k;
    }
    hits[i % 4][b]++;
  }
  for (size_t dm = 0; dm < 4; dm++) {
    size_t mx = 0;
    for (size_t k = 0; k < 4; k++) mx = hits[dm][k] > mx ? hits[dm][k] : mx;
    assert_true(mx >= 90); /* of 100 */
  }
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
}

/* eldr_kmeans_assign_scores: capacity exact, objective = sum of 1 - score */
static void test_assign_scores(void **st) {
  (void)st;
  const size_t n = 503, k = 5, cap = (n + k - 1) / k;
  float *s = malloc(n * k * sizeof *s);
  int *lab = malloc(n * sizeof *lab);
  size_t sizes[5];
  eldr_rng r;
  eldr_rng_seed(&r, 3);
  for (size_t i = 0; i < n * k; i++) s[i] = (float)(eldr_rng_uniform(&r) * (i % k == 0 ? 1.0 : 0.5));
  double obj = 0;
  assert_int_equal(eldr_kmeans_assign_scores(s, n, k, cap, lab, sizes, &obj), 0);
  double chk = 0;
  size_t sum = 0;
  for (size_t c = 0; c < k; c++) {
    assert_true(sizes[c] <= cap);
    sum += sizes[c];
  }
  assert_int_equal(sum, n);
  for (size_t i = 0; i < n; i++) chk += 1.0 - (double)s[i * k + (size_t)lab[i]];
  assert_true(fabs(chk - obj) < 1e-6 * n);
  /* centroid 0 is everyone's favourite: it is exactly full */
  assert_int_equal(sizes[0], cap);
  s[7] = NAN;
  assert_int_equal(eldr_kmeans_assign_scores(s, n, k, cap, lab, sizes, &obj), ELDR_EINVAL);
  free(lab);
  free(s);
}

/* The sampled rho's 95% jackknife interval holds the exact rho (all pairs) */
static void test_rho_ci_covers_exact(void **st) {
  (void)st;
  const size_t n = 400;
  csrc c;
  make_src(&c, n, 4, 11);
  float *sig = malloc(n * TLE * sizeof *sig), *dec = malloc(n * TLE * sizeof *dec);
  eldr_sigspec spec = {.shape = {TL, TE, TK}, .repr = ELDR_REPR_COUNT};
  for (size_t i = 0; i < n; i++) {
    eldr_rng r;
    eldr_rng_seed(&r, 11 * 1000003u + i);
    draw(&r, i % 4, 3 + eldr_rng_below(&r, 6), c.pre);
    draw(&r, i % 4, 12, c.dec);
    eldr_signature_build(&spec, c.pre, NULL, sig + i * TLE);
    for (size_t x = 0; x < TLE; x++) dec[i * TLE + x] = (float)c.dec[x];
    eldr_l2_normalize(dec + i * TLE, TLE);
  }
  eldr_pairs_opts all = {.max_pairs = 0};
  double exact = 0;
  assert_int_equal(eldr_quality_rho(sig, TLE, dec, TLE, n, &all, &exact), 0);
  for (uint64_t seed = 1; seed <= 3; seed++) {
    eldr_pairs_opts po = {.max_pairs = 4000, .seed = seed};
    eldr_rho_ci ci;
    assert_int_equal(eldr_quality_rho_ci(sig, TLE, dec, TLE, n, &po, 20, &ci), 0);
    assert_int_equal(ci.pairs, 4000);
    assert_true(ci.se > 0.0 && ci.se < 0.1);
    assert_true(ci.lo <= exact && exact <= ci.hi);
    assert_true(fabs(ci.lo - (ci.rho - 1.96 * ci.se)) < 1e-12);
    /* the interval's rho is eldr_quality_rho on the same pairs */
    double r = 0;
    assert_int_equal(eldr_quality_rho(sig, TLE, dec, TLE, n, &po, &r), 0);
    assert_true(fabs(r - ci.rho) < 1e-12);
  }
  /* all pairs: the jackknife still measures the request-sampling spread */
  eldr_rho_ci ci;
  assert_int_equal(eldr_quality_rho_ci(sig, TLE, dec, TLE, n, &all, 20, &ci), 0);
  assert_true(fabs(ci.rho - exact) < 1e-12);
  assert_true(ci.se > 0.0);
  assert_int_equal(eldr_quality_rho_ci(sig, TLE, dec, TLE, 30, &all, 20, &ci), ELDR_EINVAL);
  free(dec);
  free(sig);
}

/* exact: every request in the exact K-means (no warm start: the order comes
 * from the Hungarian alignment alone); else the mini-batch path, which also
 * starts from the previous partition */
static int g_exact;
static eldr_artifact *fit_with(eldr_fit_source *src, uint64_t seed, const eldr_artifact *prev,
                               eldr_fit_report *rep) {
  eldr_fit_opts o;
  scale_opts(&o, 4);
  if (g_exact) o.rho_sample = o.exact_limit = 1000;
  o.seed = seed;
  o.previous = prev;
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_fit_stream(src, &o, &a, rep, &d), 0);
  return a;
}

static void previous_alignment(int exact) {
  g_exact = exact;
  csrc c;
  eldr_fit_source src = make_src(&c, 700, 4, 12);
  eldr_fit_report rep;
  eldr_artifact *a = fit_with(&src, 1, NULL, &rep);
  assert_false(rep.have_previous);
  eldr_fit_report_free(&rep);

  /* the same fit against itself: nothing moves, the order is kept */
  eldr_artifact *b = fit_with(&src, 1, a, &rep);
  assert_true(rep.have_previous);
  assert_true(rep.moved == 0.0);
  for (size_t i = 0; i < 4; i++) assert_int_equal(rep.perm[i], (int)i);
  assert_memory_equal(a->centroids, b->centroids, a->k * a->dim * sizeof(float));
  eldr_fit_report_free(&rep);
  eldr_artifact_free(b);

  /* a permuted previous artifact: the refit is re-aligned onto its order */
  eldr_artifact *p = fit_with(&src, 1, NULL, &rep);
  eldr_fit_report_free(&rep);
  const int order[4] = {2, 0, 3, 1};
  for (size_t i = 0; i < 4; i++) {
    memcpy(p->centroids + i * p->dim, a->centroids + (size_t)order[i] * a->dim, a->dim * sizeof(float));
    p->cluster_sizes[i] = a->cluster_sizes[order[i]];
  }
  b = fit_with(&src, 1, p, &rep);
  assert_true(rep.moved == 0.0);
  if (exact) { /* the Hungarian step alone re-aligns: without it most traffic would move */
    assert_true(rep.moved_unaligned > 0.5);
    for (size_t i = 0; i < 4; i++) assert_int_equal(rep.perm[i], order[i]);
    assert_memory_equal(p->centroids, b->centroids, p->k * p->dim * sizeof(float));
  } else { /* the warm start already follows the permuted partition */
    assert_true(rep.moved_unaligned == 0.0);
    for (size_t i = 0; i < 4; i++) {
      double cs = eldr_dot(p->centroids + i * p->dim, b->centroids + i * b->dim, p->dim);
      assert_true(cs > 0.99);
    }
  }
  eldr_fit_report_free(&rep);
  eldr_artifact_free(b);

  /* another seed finds the same domains: after alignment little moves */
  b = fit_with(&src, 99, a, &rep);
  assert_true(rep.moved < 0.1);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(b);

  /* a previous artifact of another k is refused with a message */
  eldr_fit_opts o;
  scale_opts(&o, 3);
  o.previous = a;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_fit_stream(&src, &o, &b, &rep, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "same number"));
  eldr_artifact_free(p);
  eldr_artifact_free(a);
}

static void test_previous_alignment_exact(void **st) {
  (void)st;
  previous_alignment(1);
}

static void test_previous_alignment_minibatch(void **st) {
  (void)st;
  previous_alignment(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_minibatch_in_memory_exact_capacity),
      cmocka_unit_test(test_minibatch_streamed_exact_capacity),
      cmocka_unit_test(test_minibatch_recovers_domains),
      cmocka_unit_test(test_assign_scores),
      cmocka_unit_test(test_rho_ci_covers_exact),
      cmocka_unit_test(test_previous_alignment_exact),
      cmocka_unit_test(test_previous_alignment_minibatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
