/* base64_avx2.c — the base64 decoder's AVX2 loop (see format/base64_int.h):
 * base64.c runs it where eldr_cpu_has(ELDR_CPU_AVX2) and holds its
 * portable twin. Built only on x86-64 with GCC or clang. */
#include "base64_int.h"

#ifdef ELDR_B64_X86
#include <immintrin.h>

/* AVX2: 32 chars -> 24 bytes per step. Validation by two nibble lookups
 * whose AND is non-zero exactly for characters outside the alphabet:
 * lut_hi gives each high nibble a class bit, lut_lo[low nibble] the set of
 * classes that are invalid with it (class 0x10: bytes 0x00-0x1f and
 * >= 0x80, always invalid; 0x01: 0x2_, valid only '+' and '/'; 0x02: 0x3_,
 * digits; 0x04: 0x4_ and 0x6_, valid but '@' and '`'; 0x08: 0x5_ and 0x7_,
 * valid up to 'Z' / 'z'). Translation adds an offset chosen by the high
 * nibble ('/' moved to index 1). Packing: maddubs makes 12-bit pairs,
 * madd 24-bit groups, a byte shuffle and a lane permute make them
 * contiguous. Returns the number of quads done (a multiple of 8) and sets
 * *bad when an invalid character was seen. */
__attribute__((target("avx2"))) size_t eldr__b64_quads_avx2(const unsigned char *in, size_t nq, uint8_t *out,
                                                             uint32_t *bad) {
  const __m256i lut_lo = _mm256_setr_epi8(
      0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a,
      0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a);
  const __m256i lut_hi = _mm256_setr_epi8(
      0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
      0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10);
  const __m256i lut_roll = _mm256_setr_epi8(0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i slash = _mm256_set1_epi8('/');
  const __m256i w_ab = _mm256_set1_epi32(0x01400140);
  const __m256i w_abcd = _mm256_set1_epi32(0x00011000);
  const __m256i pack = _mm256_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
                                        2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
  __m256i err = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= nq; i += 8, in += 32, out += 24) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)in);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi32(v, 4), nib);
    __m256i lo = _mm256_and_si256(v, nib);
    err = _mm256_or_si256(err, _mm256_and_si256(_mm256_shuffle_epi8(lut_lo, lo),
                                                _mm256_shuffle_epi8(lut_hi, hi)));
    __m256i roll = _mm256_shuffle_epi8(lut_roll, _mm256_add_epi8(hi, _mm256_cmpeq_epi8(v, slash)));
    __m256i sx = _mm256_add_epi8(v, roll);
    __m256i ab = _mm256_maddubs_epi16(sx, w_ab);
    __m256i abcd = _mm256_madd_epi16(ab, w_abcd);
    __m256i o = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(abcd, pack), lanes);
    _mm_storeu_si128((__m128i *)(void *)out, _mm256_castsi256_si128(o));
    _mm_storel_epi64((__m128i *)(void *)(out + 16), _mm256_extracti128_si256(o, 1));
  }
  *bad = !_mm256_testz_si256(err, err);
  return i;
}

#else
typedef int base64_avx2_unused; /* not an empty translation unit */
#endif
