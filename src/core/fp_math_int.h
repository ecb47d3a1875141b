/* fp_math_int.h — the two functions the footprint's bookkeeping evaluates
 * per (layer, expert) cell, four cells at a time in GCC/Clang vector
 * extensions (plain IEEE float lane operations, no fused multiply-add, so
 * the same bits on every target; SSE on baseline x86-64): -ln(1 - p) of a
 * profile rate and exp(x) of a footprint sum. Not installed; footprint.c
 * only.
 *
 *   fp_neglog1m4(p) = -ln(1 - p), p in [0, 0.999]: 1 - p = m 2^e with m in
 *     [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m - 1) / (m + 1),
 *     |s| < 0.172, by its odd series to s^9 (error < 3e-9 before rounding).
 *   fp_exp4(x) = e^x for x <= 0 (0 below -87): 2^(x log2 e) = 2^n 2^f with n
 *     the nearest integer, 2^f by a degree-7 polynomial (relative error
 *     < 1e-8 before rounding), 2^n in the exponent bits.
 */
#ifndef ELDR_FP_MATH_INT_H
#define ELDR_FP_MATH_INT_H

#include <stdint.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

typedef float fpm_v4f __attribute__((vector_size(16)));
typedef int32_t fpm_v4i __attribute__((vector_size(16)));

static inline fpm_v4f fpm_splat(float x) { return (fpm_v4f){x, x, x, x}; }

static inline fpm_v4f fp_neglog1m4(fpm_v4f p) {
  fpm_v4f y = fpm_splat(1.0f) - p; /* > 0 */
  fpm_v4i bits = (fpm_v4i)y;
  fpm_v4i e = ((bits >> 23) & 0xff) - 127;
  fpm_v4f m = (fpm_v4f)((bits & 0x007fffff) | 0x3f800000); /* [1, 2) */
  fpm_v4i big = m > fpm_splat(1.41421356f);                 /* -1 where m > sqrt 2 */
  m = (fpm_v4f)(((fpm_v4i)(m * fpm_splat(0.5f)) & big) | ((fpm_v4i)m & ~big));
  e = e - big; /* big is -1: e + 1 */
  fpm_v4f s = (m - fpm_splat(1.0f)) / (m + fpm_splat(1.0f)), s2 = s * s;
  fpm_v4f t = fpm_splat(1.0f / 9.0f);
  t = t * s2 + fpm_splat(1.0f / 7.0f);
  t = t * s2 + fpm_splat(1.0f / 5.0f);
  t = t * s2 + fpm_splat(1.0f / 3.0f);
  t = t * s2 + fpm_splat(1.0f);
  fpm_v4f lnm = fpm_splat(2.0f) * s * t;
  fpm_v4f ef = __builtin_convertvector(e, fpm_v4f);
  return -(ef * fpm_splat(0.69314718f) + lnm);
}

static inline fpm_v4f fp_exp4(fpm_v4f x) {
  fpm_v4f t = x * fpm_splat(1.44269504f);
  fpm_v4i low = t < fpm_splat(-126.0f);
  t = (fpm_v4f)(((fpm_v4i)fpm_splat(-126.0f) & low) | ((fpm_v4i)t & ~low));
  fpm_v4i n = __builtin_convertvector(t + fpm_splat(126.5f), fpm_v4i) - 126; /* nearest */
  fpm_v4f f = t - __builtin_convertvector(n, fpm_v4f);
  fpm_v4f p = fpm_splat(1.525273380e-05f);
  p = p * f + fpm_splat(1.540353039e-04f);
  p = p * f + fpm_splat(1.333355815e-03f);
  p = p * f + fpm_splat(9.618129108e-03f);
  p = p * f + fpm_splat(5.550410866e-02f);
  p = p * f + fpm_splat(2.402265070e-01f);
  p = p * f + fpm_splat(6.931471806e-01f);
  p = p * f + fpm_splat(1.0f);
  fpm_v4f two_n = (fpm_v4f)((n + 127) << 23);
  return (fpm_v4f)((fpm_v4i)(p * two_n) & ~low); /* 0 below the clamp */
}

#endif
