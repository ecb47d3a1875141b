/* test_watch.c — the drift reference, the sliding window's statistics, the
 * two divergences on hand-computed cases, capacity shares under K != D,
 * the live rho ring, and the artifact's fit.drift_ref round trip (old
 * artifacts without it still load). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/error.h"
#include "eldr/watch.h"

static void test_divergences(void **st) {
  (void)st;
  double u4[4] = {1, 1, 1, 1}, h2[4] = {2, 2, 0, 0};
  /* JS(uniform 4, uniform on 2): M = (3/8, 3/8, 1/8, 1/8) */
  double want = 0.5 * (0.5 * log2(0.25 / 0.375) + 0.5 * log2(0.25 / 0.125)) + 0.5 * log2(0.5 / 0.375);
  assert_true(fabs(eldr_js_divergence(u4, h2, 4) - want) < 1e-12);
  assert_true(fabs(eldr_js_divergence(u4, u4, 4)) < 1e-15);
  double a[2] = {1, 0}, b[2] = {0, 1};
  assert_true(fabs(eldr_js_divergence(a, b, 2) - 1) < 1e-12); /* disjoint: 1 bit */
  double z[2] = {0, 0};
  assert_true(isnan(eldr_js_divergence(a, z, 2)));
  /* KS: CDFs (0.25, 0.5, 0.75, 1) vs (0.5, 1, 1, 1): gap 0.5 */
  assert_true(fabs(eldr_ks_binned(u4, h2, 4) - 0.5) < 1e-12);
  assert_true(fabs(eldr_ks_binned(a, b, 2) - 1) < 1e-12);
}

static void test_capacity_share(void **st) {
  (void)st;
  double s[8];
  eldr_watch_capacity_share(4, 4, s);
  for (int c = 0; c < 4; c++) assert_true(fabs(s[c] - 0.25) < 1e-12);
  eldr_watch_capacity_share(2, 5, s); /* decoders 0,2,4 -> centroid 0; 1,3 -> 1 */
  assert_true(fabs(s[0] - 0.6) < 1e-12 && fabs(s[1] - 0.4) < 1e-12);
  eldr_watch_capacity_share(5, 2, s); /* decoder 0: centroids 0,2,4; decoder 1: 1,3 */
  assert_true(fabs(s[0] - 1.0 / 6) < 1e-12 && fabs(s[2] - 1.0 / 6) < 1e-12 && fabs(s[4] - 1.0 / 6) < 1e-12);
  assert_true(fabs(s[1] - 0.25) < 1e-12 && fabs(s[3] - 0.25) < 1e-12);
  for (size_t k = 1; k < 8; k++)
    for (size_t n = 1; n < 8; n++) {
      eldr_watch_capacity_share(k, n, s);
      double sum = 0;
      for (size_t c = 0; c < k; c++) sum += s[c];
      assert_true(fabs(sum - 1) < 1e-12);
    }
}

/* 2 centroids e0, e1 in 2-d; signatures at angles. */
static void unit(float *v, double ang) {
  v[0] = (float)cos(ang);
  v[1] = (float)sin(ang);
}

static void test_reference(void **st) {
  (void)st;
  float cent[4] = {1, 0, 0, 1}, sigs[5 * 2];
  unit(sigs + 0, 0.1);       /* nearest 0, sim cos(0.1) = 0.995 -> bin 19 */
  unit(sigs + 2, 0.2);       /* nearest 0, 0.980 -> bin 19 */
  unit(sigs + 4, 1.4);       /* nearest 1, sin(1.4) = 0.985 -> bin 19 */
  sigs[6] = sigs[7] = 0;     /* zero row: skipped */
  unit(sigs + 8, M_PI / 4);  /* tie: lower index, 0.707 -> bin 14 */
  eldr_drift_ref *r = NULL;
  assert_int_equal(eldr_drift_ref_compute(cent, 2, 2, sigs, 5, &r), 0);
  assert_int_equal(r->n, 4);
  assert_true(fabs(r->nearest_share[0] - 0.75) < 1e-12 && fabs(r->nearest_share[1] - 0.25) < 1e-12);
  assert_true(fabs(r->sim_hist[19] - 0.75) < 1e-12 && fabs(r->sim_hist[14] - 0.25) < 1e-12);
  assert_int_equal(eldr_drift_ref_validate(r, NULL), 0);
  eldr_drift_ref_free(r);
  float zeros[4] = {0};
  assert_int_equal(eldr_drift_ref_compute(cent, 2, 2, zeros, 2, &r), ELDR_EEMPTY);
}

/* The window: stats over the kept decisions; drift stays unknown below the
 * minimum sample and without a reference; a shifted mix raises it past the
 * threshold while the fit-time mix keeps it low. */
static void test_window(void **st) {
  (void)st;
  eldr_drift_ref *ref = eldr_drift_ref_new(2);
  ref->n = 1000;
  ref->nearest_share[0] = ref->nearest_share[1] = 0.5;
  ref->sim_hist[18] = 1.0; /* every fit request at ~0.92 */
  eldr_watch *w = eldr_watch_new(400, 2);
  double share[2], nearest[2];
  eldr_watch_stats s = {.share = share, .nearest = nearest};
  eldr_watch_stats_get(w, 0, 60, ref, &s);
  assert_int_equal(s.n, 0);
  assert_true(isnan(s.drift) && isnan(s.mean_best_sim));
  float a[2] = {0.92f, 0.30f}, b[2] = {0.31f, 0.93f};
  for (int i = 0; i < 50; i++) {
    eldr_watch_add(w, i * 0.1, a, 0);
    eldr_watch_add(w, i * 0.1, b, 1);
  }
  eldr_watch_stats_get(w, 5, 60, ref, &s);
  assert_int_equal(s.n, 100);
  assert_true(fabs(share[0] - 0.5) < 1e-12 && fabs(nearest[1] - 0.5) < 1e-12);
  assert_true(fabs(s.mean_chosen_sim - (0.92 + 0.93) / 2) < 1e-6);
  assert_true(s.drift < 0.01 && !s.stale); /* the fit-time mix */
  eldr_watch_stats_get(w, 5, 60, NULL, &s);  /* no reference: unknown */
  assert_true(isnan(s.drift) && isnan(s.js));
  /* the mix shifts: centroid 0 only, and less similar */
  float c[2] = {0.75f, 0.2f};
  for (int i = 0; i < 300; i++) eldr_watch_add(w, 100 + i * 0.1, c, 0);
  eldr_watch_stats_get(w, 130, 60, ref, &s); /* the last 60 s: the shifted ones only */
  assert_int_equal(s.n, 300);
  assert_true(fabs(share[0] - 1) < 1e-12);
  assert_true(s.stale && s.drift > ELDR_DRIFT_THRESHOLD);
  /* every similarity in another bin: KS 1, less its 5% critical value */
  assert_true(fabs(s.ks - (1 - 1.358 * sqrt((300.0 + 1000) / (300.0 * 1000)))) < 1e-12);
  /* below the minimum sample: parts shown, score unknown */
  eldr_watch_stats_get(w, 130, 5, ref, &s);
  assert_int_equal(s.n, 50);
  assert_true(!isnan(s.js) && isnan(s.drift) && !s.stale);
  /* a full window keeps the newest cap */
  eldr_watch_stats_get(w, 130, 0, ref, &s);
  assert_int_equal(s.n, 400);
  eldr_watch_reset(w);
  eldr_watch_stats_get(w, 130, 0, ref, &s);
  assert_int_equal(s.n, 0);
  eldr_watch_free(w);
  eldr_drift_ref_free(ref);
}

static void test_rho_ring(void **st) {
  (void)st;
  eldr_rho_ring *r = eldr_rho_ring_new(8, 2, 2);
  double rho;
  assert_int_equal(eldr_rho_ring_rho(r, &rho), ELDR_EEMPTY);
  /* decode patterns that follow the signatures: rho 1 */
  for (int i = 0; i < 8; i++) {
    float s[2];
    unit(s, i * 0.2);
    uint32_t dc[2] = {(uint32_t)(1000 * cos(i * 0.2) + 0.5), (uint32_t)(1000 * sin(i * 0.2) + 0.5)};
    assert_int_equal(eldr_rho_ring_add(r, s, dc), 0);
  }
  uint32_t zero[2] = {0, 0};
  float s0[2] = {1, 0};
  assert_int_equal(eldr_rho_ring_add(r, s0, zero), 0); /* ignored */
  assert_int_equal(eldr_rho_ring_count(r), 8);
  assert_int_equal(eldr_rho_ring_rho(r, &rho), 0);
  if (!(rho > 0.95)) fail_msg("rho %g", rho);
  /* a copy gives the same rho; copy_into follows the ring's later pairs */
  eldr_rho_ring *c = eldr_rho_ring_copy(r);
  assert_non_null(c);
  double rc;
  assert_int_equal(eldr_rho_ring_count(c), 8);
  assert_int_equal(eldr_rho_ring_rho(c, &rc), 0);
  assert_true(rc == rho);
  float anti[2] = {0, 1};
  uint32_t across[2] = {1000, 0};
  for (int i = 0; i < 4; i++) assert_int_equal(eldr_rho_ring_add(r, anti, across), 0); /* against the pattern */
  double after;
  assert_int_equal(eldr_rho_ring_rho(r, &after), 0);
  assert_true(after != rho);
  assert_int_equal(eldr_rho_ring_copy_into(c, r), 0);
  assert_int_equal(eldr_rho_ring_rho(c, &rc), 0);
  assert_true(rc == after);
  eldr_rho_ring *other = eldr_rho_ring_new(8, 3, 2);
  assert_int_equal(eldr_rho_ring_copy_into(other, r), ELDR_EINVAL);
  assert_null(eldr_rho_ring_copy(NULL));
  eldr_rho_ring_free(other);
  eldr_rho_ring_free(c);
  eldr_rho_ring_free(r);
}

/* fit.drift_ref survives dump/parse; an artifact without it loads (NULL);
 * a malformed one is refused naming the field. */
static void test_artifact_field(void **st) {
  (void)st;
  eldr_shape sh = {.num_layers = 1, .num_experts = 4, .top_k = 2};
  eldr_artifact *a = eldr_artifact_new("m", &sh, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  a->centroids[0] = a->centroids[5] = 1;
  a->tau = 0.1;
  char *old = eldr_artifact_dump(a); /* no drift_ref */
  a->drift_ref = eldr_drift_ref_new(2);
  a->drift_ref->n = 10;
  a->drift_ref->nearest_share[0] = 0.3;
  a->drift_ref->nearest_share[1] = 0.7;
  a->drift_ref->sim_hist[17] = 1;
  char *text = eldr_artifact_dump(a);
  assert_non_null(text);
  eldr_artifact *b = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_parse(text, strlen(text), &b, &d), 0);
  assert_non_null(b->drift_ref);
  assert_int_equal(b->drift_ref->n, 10);
  assert_true(b->drift_ref->nearest_share[1] == 0.7 && b->drift_ref->sim_hist[17] == 1);
  assert_true(b->text_hash != 0);
  eldr_artifact_free(b);
  assert_int_equal(eldr_artifact_parse(old, strlen(old), &b, &d), 0);
  assert_null(b->drift_ref);
  eldr_artifact_free(b);
  char *bad = strdup(text), *p = strstr(bad, "0.69999");
  if (!p) p = strstr(bad, "0.7");
  assert_non_null(p);
  p[0] = '5'; /* shares sum to 5.3 */
  assert_int_not_equal(eldr_artifact_parse(bad, strlen(bad), &b, &d), 0);
  assert_non_null(strstr(d.msg, "fit.drift_ref.nearest_share"));
  free(bad);
  free(text);
  free(old);
  eldr_artifact_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_divergences), cmocka_unit_test(test_capacity_share),
      cmocka_unit_test(test_reference),   cmocka_unit_test(test_window),
      cmocka_unit_test(test_rho_ring),    cmocka_unit_test(test_artifact_field),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
