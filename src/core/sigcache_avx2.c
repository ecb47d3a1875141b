/* sigcache_avx2.c — the signature cache's byte kernels 32 bytes at a time
 * (see core/sigcache_int.h): sigcache.c runs them where
 * eldr_cpu_has(ELDR_CPU_AVX2) and holds the portable twins. Built only on
 * x86-64 with GCC or clang. */
#include "core/sigcache_int.h"

#ifdef ELDR_SIGCACHE_X86
#include <immintrin.h>

__attribute__((target("avx2"))) size_t eldr__addb_avx2(uint8_t *restrict a, const int8_t *restrict r, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a + i));
    __m256i y = _mm256_loadu_si256((const __m256i *)(const void *)(r + i));
    _mm256_storeu_si256((__m256i *)(void *)(a + i), _mm256_add_epi8(x, y));
  }
  return i;
}

__attribute__((target("avx2"))) size_t eldr__widen_avx2(uint32_t *restrict d, const uint8_t *restrict a, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(a + i)));
    const __m256i y = _mm256_loadu_si256((const __m256i *)(const void *)(d + i));
    _mm256_storeu_si256((__m256i *)(void *)(d + i), _mm256_add_epi32(y, x));
  }
  return i;
}

/* The largest byte of z. */
__attribute__((target("avx2"))) static inline uint8_t hmax16(__m128i z) {
  z = _mm_max_epu8(z, _mm_srli_si128(z, 8));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 4));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 2));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 1));
  return (uint8_t)_mm_cvtsi128_si32(z);
}

__attribute__((target("avx2"))) size_t eldr__maxb_avx2(const uint8_t *r, size_t n, uint8_t *m) {
  size_t i = 0;
  __m256i y = _mm256_setzero_si256();
  for (; i + 32 <= n; i += 32) y = _mm256_max_epu8(y, _mm256_loadu_si256((const __m256i *)(const void *)(r + i)));
  *m = hmax16(_mm_max_epu8(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1)));
  return i;
}

#else
typedef int sigcache_avx2_unused; /* not an empty translation unit */
#endif
