/* jscan_avx2.c — the scanner's AVX2 search for the bytes of a string that
 * need a look (see format/jscan_int.h): 64 bytes a step, so that long plain
 * runs (a base64 blob of megabytes) go at memory speed. jscan.c runs it
 * where eldr_cpu_has(ELDR_CPU_AVX2) and holds the portable (SSE2 or plain)
 * twin. Built only on x86-64 with GCC or clang. */
#include "jscan_int.h"

#ifdef ELDR_JS_X86
#include <immintrin.h>
#include <stdint.h>

__attribute__((target("avx2"))) size_t eldr__js_special_avx2(const char *p, size_t i, size_t n) {
  const __m256i q = _mm256_set1_epi8('"'), bs = _mm256_set1_epi8('\\'), sp = _mm256_set1_epi8(0x20);
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
    const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32));
    /* signed compare: bytes >= 0x80 are negative, so below 0x20 too */
    const __m256i ma = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(a, q), _mm256_cmpeq_epi8(a, bs)),
                                       _mm256_cmpgt_epi8(sp, a));
    const __m256i mb = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(b, q), _mm256_cmpeq_epi8(b, bs)),
                                       _mm256_cmpgt_epi8(sp, b));
    if (!_mm256_testz_si256(_mm256_or_si256(ma, mb), _mm256_or_si256(ma, mb))) {
      const uint64_t bits = (uint64_t)(uint32_t)_mm256_movemask_epi8(ma) |
                            (uint64_t)(uint32_t)_mm256_movemask_epi8(mb) << 32;
      return i + (size_t)__builtin_ctzll(bits);
    }
  }
  return i;
}

#else
typedef int jscan_avx2_unused; /* not an empty translation unit */
#endif
