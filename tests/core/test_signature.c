/* Tests for eldr/signature.h: representations, IDF, layer mask, L2
 * normalisation, empty vectors, dims; the expected numbers are worked out by
 * hand in the comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/rng.h"
#include "eldr/signature.h"

#define TOL 1e-6

static void assert_close(double got, double want, double tol) {
  if (fabs(got - want) > tol) fail_msg("got %.9g, want %.9g (tol %g)", got, want, tol);
}

static void test_repr_names(void **state) {
  (void)state;
  const char *names[] = {"count", "binary", "gate", "logit"};
  for (int r = 0; r < 4; r++) {
    assert_string_equal(eldr_repr_name((eldr_repr)r), names[r]);
    eldr_repr got = ELDR_REPR_LOGIT;
    assert_int_equal(eldr_repr_parse(names[r], &got), 0);
    assert_int_equal(got, r);
  }
  eldr_repr got = ELDR_REPR_BINARY;
  assert_int_equal(eldr_repr_parse("Count", &got), ELDR_EINVAL);
  assert_int_equal(eldr_repr_parse("", &got), ELDR_EINVAL);
  assert_int_equal(eldr_repr_parse(NULL, &got), ELDR_EINVAL);
  assert_int_equal(got, ELDR_REPR_BINARY); /* unchanged on error */
  assert_string_equal(eldr_repr_name((eldr_repr)7), "unknown");
}

static void test_dims(void **state) {
  (void)state;
  const uint8_t m101[3] = {1, 0, 1}, m000[3] = {0, 0, 0}, m_nonzero[3] = {7, 255, 0};
  eldr_sigspec sp = {.shape = {3, 4, 1}, .repr = ELDR_REPR_COUNT};
  assert_int_equal(eldr_signature_dim(&sp), 12);
  sp.mask = m101;
  assert_int_equal(eldr_signature_dim(&sp), 8);
  sp.mask = m000;
  assert_int_equal(eldr_signature_dim(&sp), 0);
  sp.mask = m_nonzero; /* any nonzero flag selects */
  assert_int_equal(eldr_signature_dim(&sp), 8);
  sp = (eldr_sigspec){.shape = {48, 128, 1}};
  assert_int_equal(eldr_signature_dim(&sp), 6144);
  assert_int_equal(eldr_signature_dim(NULL), 0);
}

/* IDF by hand: L=1, E=3, n=3 requests
 *   r0 = {1,0,0}, r1 = {2,1,0}, r2 = {0,1,0}  ->  df = {2, 2, 0}
 *   idf = log(4/3), log(4/3), log(4/1) = 0.287682072, 0.287682072, 1.386294361 */
static void test_idf_by_hand(void **state) {
  (void)state;
  const eldr_shape s = {1, 3, 1};
  const uint32_t c[9] = {1, 0, 0, 2, 1, 0, 0, 1, 0};
  float idf[3];
  eldr_idf_compute(&s, c, 3, idf);
  assert_close(idf[0], 0.287682072, TOL);
  assert_close(idf[1], 0.287682072, TOL);
  assert_close(idf[2], 1.386294361, TOL);
  /* An expert every request uses gets weight log(1) = 0. Two layers, n = 2:
   *   layer 0 row {5, 0}, {1, 0} -> df {2, 0} -> idf {0, log 3 = 1.098612289}
   *   layer 1 row {0, 1}, {0, 0} -> df {0, 1} -> idf {log 3, log 1.5 = 0.405465108} */
  const eldr_shape s2 = {2, 2, 1};
  const uint32_t c2[8] = {5, 0, 0, 1, 1, 0, 0, 0};
  float idf2[4];
  eldr_idf_compute(&s2, c2, 2, idf2);
  assert_close(idf2[0], 0.0, TOL);
  assert_close(idf2[1], 1.098612289, TOL);
  assert_close(idf2[2], 1.098612289, TOL);
  assert_close(idf2[3], 0.405465108, TOL);
  /* n = 0: df = 0, idf = log(1/1) = 0. */
  eldr_idf_compute(&s2, c2, 0, idf2);
  for (int i = 0; i < 4; i++) assert_close(idf2[i], 0.0, 0.0);
}

/* Normalisation by hand, L=1, E=3:
 *   count  {3,4,0}                          -> {0.6, 0.8, 0}
 *   binary {3,4,0}                          -> {1/sqrt2, 1/sqrt2, 0}
 *   count  {2,0,1} * w {1.5, 9, 2} = {3,0,2} -> {3,0,2}/sqrt13 = {0.832050294, 0, 0.554700196}
 *   binary {2,0,1} * w                = {1.5,0,2} -> /2.5 = {0.6, 0, 0.8} */
static void test_normalisation_by_hand(void **state) {
  (void)state;
  float out[3];
  eldr_sigspec sp = {.shape = {1, 3, 1}, .repr = ELDR_REPR_COUNT};
  const uint32_t c1[3] = {3, 4, 0};
  assert_int_equal(eldr_signature_build(&sp, c1, NULL, out), 0);
  assert_close(out[0], 0.6, TOL);
  assert_close(out[1], 0.8, TOL);
  assert_close(out[2], 0.0, 0.0);
  sp.repr = ELDR_REPR_BINARY;
  assert_int_equal(eldr_signature_build(&sp, c1, NULL, out), 0);
  assert_close(out[0], M_SQRT1_2, TOL);
  assert_close(out[1], M_SQRT1_2, TOL);
  assert_close(out[2], 0.0, 0.0);

  const uint32_t c2[3] = {2, 0, 1};
  const float w[3] = {1.5f, 9.0f, 2.0f};
  sp.idf = w;
  sp.repr = ELDR_REPR_COUNT;
  assert_int_equal(eldr_signature_build(&sp, c2, NULL, out), 0);
  assert_close(out[0], 0.832050294, TOL);
  assert_close(out[1], 0.0, 0.0);
  assert_close(out[2], 0.554700196, TOL);
  sp.repr = ELDR_REPR_BINARY;
  assert_int_equal(eldr_signature_build(&sp, c2, NULL, out), 0);
  assert_close(out[0], 0.6, TOL);
  assert_close(out[1], 0.0, 0.0);
  assert_close(out[2], 0.8, TOL);
}

/* Mask: L=3, E=2, counts l0 = {1,0}, l1 = {0,5}, l2 = {2,2}.
 *   mask {1,0,1}: {1,0 | 2,2} / 3 = {1/3, 0, 2/3, 2/3}
 *   mask {0,1,0}: {0, 1}
 *   no mask:      {1,0 | 0,5 | 2,2} / sqrt(34) */
static void test_mask_concatenates_in_order(void **state) {
  (void)state;
  const uint32_t c[6] = {1, 0, 0, 5, 2, 2};
  const uint8_t m101[3] = {1, 0, 1}, m010[3] = {0, 1, 0};
  float out[6];
  eldr_sigspec sp = {.shape = {3, 2, 1}, .repr = ELDR_REPR_COUNT, .mask = m101};
  memset(out, 0x7f, sizeof out); /* the tail beyond dim must stay untouched */
  assert_int_equal(eldr_signature_build(&sp, c, NULL, out), 0);
  assert_close(out[0], 1.0 / 3, TOL);
  assert_close(out[1], 0.0, 0.0);
  assert_close(out[2], 2.0 / 3, TOL);
  assert_close(out[3], 2.0 / 3, TOL);
  float sentinel;
  memset(&sentinel, 0x7f, sizeof sentinel);
  assert_true(memcmp(&out[4], &sentinel, sizeof sentinel) == 0);
  sp.mask = m010;
  assert_int_equal(eldr_signature_build(&sp, c, NULL, out), 0);
  assert_close(out[0], 0.0, 0.0);
  assert_close(out[1], 1.0, TOL);
  sp.mask = NULL;
  assert_int_equal(eldr_signature_build(&sp, c, NULL, out), 0);
  const double r = sqrt(34.0);
  const double want[6] = {1 / r, 0, 0, 5 / r, 2 / r, 2 / r};
  for (int i = 0; i < 6; i++) assert_close(out[i], want[i], TOL);
  /* Binary with IDF and a mask: w l0 = {2, 7}, l1 = {1, 1}, l2 = {0.5, 3}.
   * mask {1,0,1}: {2, 0 | 0.5, 3}, norm sqrt(4 + 0.25 + 9) = sqrt(13.25). */
  const float w[6] = {2, 7, 1, 1, 0.5f, 3};
  sp = (eldr_sigspec){.shape = {3, 2, 1}, .repr = ELDR_REPR_BINARY, .idf = w, .mask = m101};
  assert_int_equal(eldr_signature_build(&sp, c, NULL, out), 0);
  const double r2 = sqrt(13.25);
  assert_close(out[0], 2 / r2, TOL);
  assert_close(out[1], 0.0, 0.0);
  assert_close(out[2], 0.5 / r2, TOL);
  assert_close(out[3], 3 / r2, TOL);
}

/* Count vs binary differ exactly where counts exceed 1; they agree on 0/1
 * counts. */
static void test_binary_vs_count(void **state) {
  (void)state;
  const uint32_t c01[4] = {1, 0, 1, 1}, c_multi[4] = {4, 0, 1, 1};
  float a[4], b[4];
  eldr_sigspec cs = {.shape = {2, 2, 1}, .repr = ELDR_REPR_COUNT};
  eldr_sigspec bs = {.shape = {2, 2, 1}, .repr = ELDR_REPR_BINARY};
  assert_int_equal(eldr_signature_build(&cs, c01, NULL, a), 0);
  assert_int_equal(eldr_signature_build(&bs, c01, NULL, b), 0);
  for (int i = 0; i < 4; i++) assert_close(a[i], b[i], 1e-7);
  /* {4,0,1,1}: count /sqrt(18) = {0.942809042, 0, 0.235702260, 0.235702260};
   * binary = {1,0,1,1}/sqrt3 = {0.577350269, 0, ...}. */
  assert_int_equal(eldr_signature_build(&cs, c_multi, NULL, a), 0);
  assert_int_equal(eldr_signature_build(&bs, c_multi, NULL, b), 0);
  assert_close(a[0], 0.942809042, TOL);
  assert_close(a[2], 0.235702260, TOL);
  assert_close(b[0], 0.577350269, TOL);
  assert_close(b[2], 0.577350269, TOL);
  assert_close(b[3], 0.577350269, TOL);
}

/* Gate: L=1, E=2, gate sums {3,4} -> {0.6, 0.8}, whatever the counts.
 * Logit: gate sums {e-1, e^2-1} -> log1p = {1, 2} -> {1,2}/sqrt5.
 * With IDF w = {2, 0.5}: logit {2, 1}/sqrt5. */
static void test_gate_and_logit(void **state) {
  (void)state;
  const uint32_t c[2] = {9, 1};
  const float g1[2] = {3.0f, 4.0f};
  const float g2[2] = {(float)(M_E - 1.0), (float)(M_E * M_E - 1.0)};
  float out[2];
  eldr_sigspec sp = {.shape = {1, 2, 1}, .repr = ELDR_REPR_GATE};
  assert_int_equal(eldr_signature_build(&sp, c, g1, out), 0);
  assert_close(out[0], 0.6, TOL);
  assert_close(out[1], 0.8, TOL);
  sp.repr = ELDR_REPR_LOGIT;
  assert_int_equal(eldr_signature_build(&sp, c, g2, out), 0);
  assert_close(out[0], 1 / sqrt(5.0), TOL);
  assert_close(out[1], 2 / sqrt(5.0), TOL);
  const float w[2] = {2.0f, 0.5f};
  sp.idf = w;
  assert_int_equal(eldr_signature_build(&sp, c, g2, out), 0);
  assert_close(out[0], 2 / sqrt(5.0), TOL);
  assert_close(out[1], 1 / sqrt(5.0), TOL);
  sp.repr = ELDR_REPR_GATE; /* {6, 2} / sqrt(40) */
  assert_int_equal(eldr_signature_build(&sp, c, g1, out), 0);
  assert_close(out[0], 6 / sqrt(40.0), TOL);
  assert_close(out[1], 2 / sqrt(40.0), TOL);
  /* No gate sums: unsupported, output zeroed. */
  out[0] = out[1] = 5.0f;
  assert_int_equal(eldr_signature_build(&sp, c, NULL, out), ELDR_EUNSUPPORTED);
  assert_true(out[0] == 0.0f && out[1] == 0.0f);
  sp.repr = ELDR_REPR_LOGIT;
  assert_int_equal(eldr_signature_build(&sp, c, NULL, out), ELDR_EUNSUPPORTED);
  /* Count ignores gate sums even when given. */
  sp = (eldr_sigspec){.shape = {1, 2, 1}, .repr = ELDR_REPR_COUNT};
  const uint32_t c34[2] = {3, 4};
  assert_int_equal(eldr_signature_build(&sp, c34, g2, out), 0);
  assert_close(out[0], 0.6, TOL);
  /* A NaN gate sum is an error, not a NaN signature. */
  const float gnan[2] = {NAN, 1.0f};
  sp.repr = ELDR_REPR_GATE;
  assert_int_equal(eldr_signature_build(&sp, c, gnan, out), ELDR_ERANGE);
  assert_true(out[0] == 0.0f && out[1] == 0.0f);
}

static void test_empty(void **state) {
  (void)state;
  const uint32_t zero[4] = {0, 0, 0, 0};
  const uint32_t only_l0[4] = {3, 1, 0, 0};
  const uint8_t m01[2] = {0, 1};
  float out[4] = {1, 1, 1, 1};
  eldr_sigspec sp = {.shape = {2, 2, 1}, .repr = ELDR_REPR_COUNT};
  assert_int_equal(eldr_signature_build(&sp, zero, NULL, out), ELDR_EEMPTY);
  for (int i = 0; i < 4; i++) assert_true(out[i] == 0.0f);
  sp.repr = ELDR_REPR_BINARY;
  assert_int_equal(eldr_signature_build(&sp, zero, NULL, out), ELDR_EEMPTY);
  /* Nonzero only in a masked-out layer. */
  sp.mask = m01;
  out[0] = out[1] = 9;
  assert_int_equal(eldr_signature_build(&sp, only_l0, NULL, out), ELDR_EEMPTY);
  assert_true(out[0] == 0.0f && out[1] == 0.0f);
  /* IDF weight 0 on every used expert (used by all calibration requests). */
  const float w[4] = {0, 0, 1, 1};
  sp = (eldr_sigspec){.shape = {2, 2, 1}, .repr = ELDR_REPR_COUNT, .idf = w};
  assert_int_equal(eldr_signature_build(&sp, only_l0, NULL, out), ELDR_EEMPTY);
  /* Zero gate sums. */
  const float g0[4] = {0, 0, 0, 0};
  sp = (eldr_sigspec){.shape = {2, 2, 1}, .repr = ELDR_REPR_LOGIT};
  assert_int_equal(eldr_signature_build(&sp, only_l0, g0, out), ELDR_EEMPTY);
  /* Bad arguments. */
  assert_int_equal(eldr_signature_build(NULL, zero, NULL, out), ELDR_EINVAL);
  assert_int_equal(eldr_signature_build(&sp, NULL, g0, out), ELDR_EINVAL);
  assert_int_equal(eldr_signature_build(&sp, zero, g0, NULL), ELDR_EINVAL);
  sp.repr = (eldr_repr)9;
  assert_int_equal(eldr_signature_build(&sp, only_l0, g0, out), ELDR_EINVAL);
}

static void test_vector_ops(void **state) {
  (void)state;
  const float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
  assert_close(eldr_dot(a, b, 3), 32.0, 0.0);
  const float x[2] = {1, 0}, y[2] = {1, 1}, z[2] = {0, 0};
  assert_close(eldr_cosine(x, y, 2), M_SQRT1_2, 1e-12);
  assert_close(eldr_cosine(x, z, 2), 0.0, 0.0);
  assert_close(eldr_cosine(z, z, 2), 0.0, 0.0);
  assert_close(eldr_cosine(y, y, 2), 1.0, 0.0); /* exactly 1 for identical vectors */
  float v[2] = {3, 4};
  assert_close(eldr_l2_normalize(v, 2), 5.0, 1e-12);
  assert_close(v[0], 0.6, TOL);
  assert_close(v[1], 0.8, TOL);
  float w[2] = {0, 0};
  assert_close(eldr_l2_normalize(w, 2), 0.0, 0.0);
  assert_true(w[0] == 0.0f && w[1] == 0.0f);
  /* Lengths around the 8-lane blocking against a plain double loop. */
  float p[37], q[37];
  for (int i = 0; i < 37; i++) {
    p[i] = (float)(i % 5) - 1.5f;
    q[i] = (float)((i * 7) % 11) * 0.25f;
  }
  for (size_t n = 0; n <= 37; n++) {
    double want = 0, pp = 0, qq = 0;
    for (size_t i = 0; i < n; i++) {
      want += (double)p[i] * q[i];
      pp += (double)p[i] * p[i];
      qq += (double)q[i] * q[i];
    }
    assert_close(eldr_dot(p, q, n), want, 1e-4);
    if (pp > 0 && qq > 0) assert_close(eldr_cosine(p, q, n), want / sqrt(pp * qq), 1e-6);
  }
}

/* A full-size build (L=48, E=128, random counts, IDF, a mask) against a
 * straightforward double-precision reference. */
static void test_large_against_reference(void **state) {
  (void)state;
  enum { L = 48, E = 128 };
  uint32_t *c = malloc(L * E * sizeof *c);
  float *idf = malloc(L * E * sizeof *idf);
  float *out = malloc(L * E * sizeof *out);
  double *ref = malloc(L * E * sizeof *ref);
  assert_non_null(c);
  assert_non_null(idf);
  assert_non_null(out);
  assert_non_null(ref);
  uint8_t mask[L];
  eldr_rng r;
  eldr_rng_seed(&r, 42);
  for (int i = 0; i < L * E; i++) {
    c[i] = eldr_rng_below(&r, 4) == 0 ? (uint32_t)eldr_rng_below(&r, 20) : 0;
    idf[i] = (float)eldr_rng_uniform(&r) * 3.0f;
  }
  for (int l = 0; l < L; l++) mask[l] = (uint8_t)(l % 3 != 1);
  for (int repr = ELDR_REPR_COUNT; repr <= ELDR_REPR_BINARY; repr++) {
    eldr_sigspec sp = {.shape = {L, E, 1}, .repr = (eldr_repr)repr, .idf = idf, .mask = mask};
    const size_t dim = eldr_signature_dim(&sp);
    assert_int_equal(dim, 32 * E);
    assert_int_equal(eldr_signature_build(&sp, c, NULL, out), 0);
    size_t k = 0;
    double ss = 0;
    for (int l = 0; l < L; l++) {
      if (!mask[l]) continue;
      for (int e = 0; e < E; e++, k++) {
        const double v = repr == ELDR_REPR_COUNT ? c[l * E + e] : (c[l * E + e] > 0);
        ref[k] = v * idf[l * E + e];
        ss += ref[k] * ref[k];
      }
    }
    assert_int_equal(k, dim);
    double norm = 0;
    for (size_t i = 0; i < dim; i++) {
      assert_close(out[i], ref[i] / sqrt(ss), 1e-6);
      norm += (double)out[i] * out[i];
    }
    assert_close(norm, 1.0, 1e-5);
  }
  free(ref);
  free(out);
  free(idf);
  free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_repr_names),
      cmocka_unit_test(test_dims),
      cmocka_unit_test(test_idf_by_hand),
      cmocka_unit_test(test_normalisation_by_hand),
      cmocka_unit_test(test_mask_concatenates_in_order),
      cmocka_unit_test(test_binary_vs_count),
      cmocka_unit_test(test_gate_and_logit),
      cmocka_unit_test(test_empty),
      cmocka_unit_test(test_vector_ops),
      cmocka_unit_test(test_large_against_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
