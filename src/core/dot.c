/* dot.c — the one dot product of float vectors (see eldr/dot.h). */
#include "eldr/dot.h"

#include <string.h>

/* Similarities. Every similarity is computed with the same arithmetic
 * whichever kernel computes it: eight float lanes (two 4-lane halves, lo and
 * hi) over i = 0, 8, 16.., lane j summing a[i+j]*b[i+j]; then lo + hi, the
 * four lanes reduced in a fixed order, then the tail (dim % 8) in order. So
 * a similarity does not depend on how centroids were grouped, and lane-wise
 * vector ops (exact IEEE operations, never contracted into FMA) give the
 * same bits on every target. eldr_dot_lanes8_x4 reads the signature once for four
 * centroids; 4-lane vectors stay in SSE registers on baseline x86-64. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* GCC: off already in ISO C mode (-std=c17) */
#endif
typedef float v4f __attribute__((vector_size(16)));

/* Unaligned load. */
#define LOAD4(dst, p) memcpy(&(dst), (p), sizeof(v4f))

static inline float reduce(const v4f *lo, const v4f *hi, float tail) {
  v4f s = *lo + *hi;
  return ((s[0] + s[2]) + (s[1] + s[3])) + tail;
}

static inline float tail_dot(const float *a, const float *b, size_t from, size_t dim) {
  float t = 0.0f;
  for (size_t i = from; i < dim; i++) t += a[i] * b[i];
  return t;
}

float eldr_dot_lanes8(const float *sig, const float *c, size_t dim) {
  v4f lo = {0}, hi = {0};
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    v4f x0, x1, y0, y1;
    LOAD4(x0, sig + i);
    LOAD4(x1, sig + i + 4);
    LOAD4(y0, c + i);
    LOAD4(y1, c + i + 4);
    lo += x0 * y0;
    hi += x1 * y1;
  }
  return reduce(&lo, &hi, tail_dot(sig, c, i, dim));
}

void eldr_dot_lanes8_x4(const float *sig, const float *c, size_t dim, float *out) {
  const float *c0 = c, *c1 = c + dim, *c2 = c + 2 * dim, *c3 = c + 3 * dim;
  v4f l0 = {0}, h0 = {0}, l1 = {0}, h1 = {0}, l2 = {0}, h2 = {0}, l3 = {0}, h3 = {0};
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    v4f x0, x1, y0, y1;
    LOAD4(x0, sig + i);
    LOAD4(x1, sig + i + 4);
    LOAD4(y0, c0 + i);
    LOAD4(y1, c0 + i + 4);
    l0 += x0 * y0;
    h0 += x1 * y1;
    LOAD4(y0, c1 + i);
    LOAD4(y1, c1 + i + 4);
    l1 += x0 * y0;
    h1 += x1 * y1;
    LOAD4(y0, c2 + i);
    LOAD4(y1, c2 + i + 4);
    l2 += x0 * y0;
    h2 += x1 * y1;
    LOAD4(y0, c3 + i);
    LOAD4(y1, c3 + i + 4);
    l3 += x0 * y0;
    h3 += x1 * y1;
  }
  out[0] = reduce(&l0, &h0, tail_dot(sig, c0, i, dim));
  out[1] = reduce(&l1, &h1, tail_dot(sig, c1, i, dim));
  out[2] = reduce(&l2, &h2, tail_dot(sig, c2, i, dim));
  out[3] = reduce(&l3, &h3, tail_dot(sig, c3, i, dim));
}
