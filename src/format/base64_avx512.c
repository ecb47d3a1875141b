/* base64_avx512.c — the base64 decoder's AVX-512 VBMI loop (see
 * format/base64_int.h): base64.c runs it where eldr_cpu_has(ELDR_CPU_AVX512)
 * and holds its portable twin. Built only on x86-64 with GCC or clang. */
#include "base64_int.h"

#ifdef ELDR_B64_X86
#include <immintrin.h>

/* AVX-512 VBMI: 64 chars -> 48 bytes per step (the scheme of Muła and
 * Lemire, "Base64 encoding and decoding at almost the speed of a memory
 * copy", 2019). One two-table byte permutation (vpermi2b, indexed by the
 * low 7 bits) translates all 64 chars, its table (eldr__b64_lut7) holding
 * 0x80 for every invalid char below 0x80, so a char is invalid exactly when the char or
 * its translation has bit 7 set (one vpternlog accumulates both); maddubs
 * and madd pack as the AVX2 loop, one vpermb makes the 48 bytes
 * contiguous. Same contract as eldr__b64_quads_avx2 (a multiple of 16 quads);
 * never writes past the 3 * (quads done) output bytes. */
#define B64_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))
B64_512 size_t eldr__b64_quads_avx512(const unsigned char *in, size_t nq, uint8_t *out, uint32_t *bad) {
  /* pk: output byte j is byte 2 - j mod 3 of 24-bit group j / 3 */
  static const unsigned char pk[64] = {
      0x02, 0x01, 0x00, 0x06, 0x05, 0x04, 0x0a, 0x09, 0x08, 0x0e, 0x0d, 0x0c, 0x12, 0x11, 0x10, 0x16,
      0x15, 0x14, 0x1a, 0x19, 0x18, 0x1e, 0x1d, 0x1c, 0x22, 0x21, 0x20, 0x26, 0x25, 0x24, 0x2a, 0x29,
      0x28, 0x2e, 0x2d, 0x2c, 0x32, 0x31, 0x30, 0x36, 0x35, 0x34, 0x3a, 0x39, 0x38, 0x3e, 0x3d, 0x3c,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  };
  const __m512i lut0 = _mm512_loadu_si512(eldr__b64_lut7), lut1 = _mm512_loadu_si512(eldr__b64_lut7 + 64);
  const __m512i pack = _mm512_loadu_si512(pk);
  const __m512i w_ab = _mm512_set1_epi32(0x01400140), w_abcd = _mm512_set1_epi32(0x00011000);
  __m512i err = _mm512_setzero_si512();
#define B64_DECODE(v)                                                                   \
  {                                                                                     \
    const __m512i t = _mm512_permutex2var_epi8(lut0, v, lut1);                          \
    err = _mm512_ternarylogic_epi64(err, v, t, 0xFE);                                   \
    const __m512i abcd = _mm512_madd_epi16(_mm512_maddubs_epi16(t, w_ab), w_abcd);      \
    /* a masked store: faster than 32 + 16 bytes on Zen 5 */                           \
    _mm512_mask_storeu_epi8(out, 0x0000FFFFFFFFFFFFULL, _mm512_permutexvar_epi8(pack, abcd)); \
  }
  size_t i = 0;
  const size_t mis = (uintptr_t)in & 63;
  if (!mis) {
    for (; i + 16 <= nq; i += 16, in += 64, out += 48) {
      const __m512i v = _mm512_load_si512(in);
      B64_DECODE(v)
    }
  } else if (nq >= 16) {
    /* Text not on a cache line: aligned loads (a load across two lines
     * costs about a third of the loop's time), each step's 64 chars put
     * together from two of them by one vpermt2b. Masked loads keep every
     * read inside the text: the first line's bytes before it, the last
     * line's after it. */
    const unsigned char *line = in - mis, *end = in + 4 * nq;
    __m512i idx;
    {
      unsigned char b[64];
      for (int j = 0; j < 64; j++) b[j] = (unsigned char)(j + mis);
      idx = _mm512_loadu_si512(b);
    }
    __m512i a = _mm512_maskz_loadu_epi8(~0ULL << mis, line);
    for (; i + 16 <= nq; i += 16, line += 64, out += 48) {
      const size_t avail = (size_t)(end - (line + 64)); /* >= 1: this step needs a byte of it */
      const __m512i b = avail >= 64 ? _mm512_load_si512(line + 64)
                                    : _mm512_maskz_loadu_epi8((1ULL << avail) - 1, line + 64);
      const __m512i v = _mm512_permutex2var_epi8(a, idx, b);
      B64_DECODE(v)
      a = b;
    }
  }
#undef B64_DECODE
  *bad = _mm512_movepi8_mask(err) != 0;
  return i;
}

#else
typedef int base64_avx512_unused; /* not an empty translation unit */
#endif
