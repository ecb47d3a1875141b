/* tracegen_normal.c — the trace generator's Gaussian noise (see
 * tracegen_int.h): a 128-layer ziggurat (Marsaglia & Tsang 2000) on 32-bit
 * halves of the rng output, two candidates per 64-bit draw.
 *
 * A 32-bit half u gives the layer i = u & 127, the sign (bit 7) and a 24-bit
 * magnitude j = u >> 8. When j < k[i] (about 98.8% of candidates) the normal
 * is j * w[i]: integer compare, one multiply. Otherwise the wedge test (or,
 * in layer 0, the tail beyond r = 3.4426...) draws 64-bit uniforms and uses
 * exp/log; a rejected candidate is followed by the next 32-bit half.
 *
 * Determinism across platforms: the tables and the slow path use this
 * file's own exp and log (range reduction and polynomials in + - * / only,
 * plus the exact ldexp/frexp; the file is compiled with -ffp-contract=off),
 * never the C library's, so a seed gives the same numbers wherever IEEE
 * double arithmetic holds. */
#include <math.h>
#include <string.h>

#include "tracegen_int.h"

#define ZIG_R 3.442619855899
#define ZIG_V 9.91256303526217e-3
#define ZIG_M 16777216.0 /* 2^24: the magnitude's range */
#define LN2_HI 6.93147180369123816490e-01
#define LN2_LO 1.90821492927058770002e-10

/* e^x for x <= 0 (0 below -745): x = n ln2 + r, |r| <= ln2 / 2, Taylor
 * polynomial of degree 12 in Horner form (truncation error below 3e-15). */
static double det_exp(double x) {
  if (x < -745.0) return 0.0;
  double t = x * 1.4426950408889634 - 0.5;
  int n = (int)t;
  if ((double)n > t) n--; /* floor(x / ln2 - 0.5) + 1 = round to nearest */
  n++;
  const double r = (x - n * LN2_HI) - n * LN2_LO;
  double p = 1.0 / 479001600.0; /* 1 / 12! */
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return ldexp(p, n);
}

/* log(x) for 0 < x: x = m 2^e with sqrt(1/2) <= m < sqrt(2),
 * log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, series to s^25. */
static double det_log(double x) {
  int e;
  double m = frexp(x, &e);
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e--;
  }
  double s = (m - 1.0) / (m + 1.0), s2 = s * s, p = 0.0;
  for (int k = 25; k >= 1; k -= 2) p = 1.0 / k + s2 * p;
  return (2.0 * s * p + e * LN2_LO) + e * LN2_HI;
}

void tracegen_zig_init(tracegen_zig *z) {
  double dn = ZIG_R, tn = dn, vn = ZIG_V;
  double q = vn / det_exp(-0.5 * dn * dn);
  z->k[0] = (uint32_t)((dn / q) * ZIG_M);
  z->k[1] = 0;
  z->w[0] = q / ZIG_M;
  z->w[127] = dn / ZIG_M;
  z->f[0] = 1.0;
  z->f[127] = det_exp(-0.5 * dn * dn);
  for (int i = 126; i >= 1; i--) {
    dn = sqrt(-2.0 * det_log(vn / dn + det_exp(-0.5 * dn * dn)));
    z->k[i + 1] = (uint32_t)((dn / tn) * ZIG_M);
    tn = dn;
    z->f[i] = det_exp(-0.5 * dn * dn);
    z->w[i] = dn / ZIG_M;
  }
}

/* A uniform in (0, 1] from 64 bits (log of it is finite). */
static double unit_open0(uint64_t bits) {
  return (double)((bits >> 11) + 1) * (1.0 / 9007199254740992.0);
}

/* The slow path of candidate u (j >= k[i]): a normal, drawing what it needs
 * (uniforms, further candidates) from r. */
static double zig_slow(const tracegen_zig *z, eldr_rng *r, uint32_t u) {
  for (;;) {
    const uint32_t i = u & 127, j = u >> 8;
    const double sg = (u & 128) ? -1.0 : 1.0;
    if (j < z->k[i]) return sg * (double)j * z->w[i];
    if (i == 0) { /* the tail beyond r (Marsaglia 1964) */
      double x, y;
      do {
        x = -det_log(unit_open0(eldr_rng_next(r))) / ZIG_R;
        y = -det_log(unit_open0(eldr_rng_next(r)));
      } while (y + y < x * x);
      return sg * (ZIG_R + x);
    }
    const double x = (double)j * z->w[i];
    const double y = z->f[i] + eldr_rng_bits_to_unit(eldr_rng_next(r)) * (z->f[i - 1] - z->f[i]);
    if (y < det_exp(-0.5 * x * x)) return sg * x;
    u = (uint32_t)eldr_rng_next(r);
  }
}

/* The fast path's sign is bit 7 of u put into the sign bit of j * w[i]:
 * the same double as (-j) * w[i] (IEEE multiplication is sign-symmetric),
 * without a branch that a random sign would mispredict half the time. */
static inline double zig_one(const tracegen_zig *z, eldr_rng *r, uint32_t u) {
  const uint32_t i = u & 127, j = u >> 8;
  if (__builtin_expect(j < z->k[i], 1)) {
    double x = (double)j * z->w[i];
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    b ^= (uint64_t)(u & 128) << 56;
    memcpy(&x, &b, sizeof x);
    return x;
  }
  return zig_slow(z, r, u);
}

void tracegen_fill_normal(const tracegen_zig *z, eldr_rng *r, float *v, size_t n, float scale,
                          int add) {
  const double sc = scale;
  size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const uint64_t b = eldr_rng_next(r);
    const double a = zig_one(z, r, (uint32_t)b) * sc;
    const double c = zig_one(z, r, (uint32_t)(b >> 32)) * sc;
    if (add) {
      v[i] += (float)a;
      v[i + 1] += (float)c;
    } else {
      v[i] = (float)a;
      v[i + 1] = (float)c;
    }
  }
  if (i < n) {
    const double a = zig_one(z, r, (uint32_t)eldr_rng_next(r)) * sc;
    v[i] = add ? v[i] + (float)a : (float)a;
  }
}
