/* footprint_avx2.c — the footprint's per-layer dot products eight float
 * lanes at a time (see core/footprint_int.h): footprint.c runs it where
 * eldr_cpu_has(ELDR_CPU_AVX2) (it needs only AVX) and holds the portable
 * twin, which gives the same bits. Built only on x86-64 with GCC or clang;
 * never contracted into FMA. */
#include "core/footprint_int.h"

#ifdef ELDR_FP_X86
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
typedef float v8f __attribute__((vector_size(32)));

__attribute__((target("avx"))) void eldr__fp_dots_avx(const float *q, const float *p, size_t L, size_t E,
                                                      const uint8_t *mask, float *out) {
  for (size_t l = 0; l < L; l++) {
    if (!mask[l]) continue;
    const float *ql = q + l * E, *pl = p + l * E;
    v8f acc = {0};
    size_t e = 0;
    for (; e + 8 <= E; e += 8) {
      v8f a, b;
      memcpy(&a, ql + e, sizeof a);
      memcpy(&b, pl + e, sizeof b);
      acc += a * b;
    }
    float tail = 0.0f;
    for (; e < E; e++) tail += ql[e] * pl[e];
    out[l] = (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) + tail;
  }
}

#else
typedef int footprint_avx2_unused; /* not an empty translation unit */
#endif
