/* sigcache_avx512.c — the signature cache's byte kernels 64 bytes at a time
 * (see core/sigcache_int.h): sigcache.c runs them where
 * eldr_cpu_has(ELDR_CPU_AVX512) and holds the portable twins. Built only
 * on x86-64 with GCC or clang. */
#include "core/sigcache_int.h"

#ifdef ELDR_SIGCACHE_X86
#include <immintrin.h>

__attribute__((target("avx512f,avx512bw"))) size_t eldr__addb_512(uint8_t *restrict a, const int8_t *restrict r,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    _mm512_storeu_si512(a + i, _mm512_add_epi8(_mm512_loadu_si512(a + i), _mm512_loadu_si512(r + i)));
  return i;
}

__attribute__((target("avx512f,avx512bw"))) size_t eldr__widen_512(uint32_t *restrict d, const uint8_t *restrict a,
                                                                    size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(a + i)));
    _mm512_storeu_si512(d + i, _mm512_add_epi32(_mm512_loadu_si512(d + i), x));
  }
  return i;
}

/* The largest byte of z. */
__attribute__((target("avx512f,avx512bw"))) static inline uint8_t hmax16(__m128i z) {
  z = _mm_max_epu8(z, _mm_srli_si128(z, 8));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 4));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 2));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 1));
  return (uint8_t)_mm_cvtsi128_si32(z);
}

__attribute__((target("avx512f,avx512bw"))) size_t eldr__maxb_512(const uint8_t *r, size_t n, uint8_t *m) {
  size_t i = 0;
  __m512i x = _mm512_setzero_si512();
  for (; i + 64 <= n; i += 64) x = _mm512_max_epu8(x, _mm512_loadu_si512(r + i));
  __m256i y = _mm256_max_epu8(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
  *m = hmax16(_mm_max_epu8(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1)));
  return i;
}

#else
typedef int sigcache_avx512_unused; /* not an empty translation unit */
#endif
