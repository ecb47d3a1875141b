/* routed_experts.c — base64 + .npy codec for vLLM's routed_experts (see
 * eldr/routed_experts.h).
 *
 * Hot path (eldr_routed_experts_count): the base64 text is decoded in
 * fixed-size chunks into a stack buffer (a long payload continues in
 * 192 KiB heap chunks, so the counting kernels get hundreds of tokens a
 * call while the chunk is in L2), 4 chars -> 3 bytes per step through
 * one lookup table whose invalid entries carry bit 8; the table values of a
 * whole chunk are OR-ed into an accumulator that is tested once per chunk,
 * so the inner loop has no per-character branch. Decoded payload goes to
 * eldr_counts_accumulate() in runs of whole tokens (a token that straddles
 * two chunks is handled per layer row). Payload length versus shape is
 * checked from the base64 length before any payload byte is decoded.
 */
#include "eldr/routed_experts.h"

#include <stdbool.h>
#include <stdio.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ELDR_B64_AVX2 1
#endif
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* base64                                                                    */

#define X 0x100
static const uint32_t B64D[256] = {
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X, 62,  X,  X,  X, 63,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61,  X,  X,  X,  X,  X,  X,
     X,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,  X,  X,  X,  X,  X,
     X, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
};
#undef X
static const char B64E[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t eldr_b64_decoded_max(size_t len) { return len / 4 * 3 + (len % 4 ? 3 : 0); }

size_t eldr_b64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

/* Decode nq full quads (no '='); returns non-zero if any char is invalid. */
static uint32_t dec_quads(const unsigned char *in, size_t nq, uint8_t *out) {
  uint32_t bad = 0;
  size_t i = 0;
  for (; i + 4 <= nq; i += 4, in += 16, out += 12) {
    uint32_t a0 = B64D[in[0]], a1 = B64D[in[1]], a2 = B64D[in[2]], a3 = B64D[in[3]];
    uint32_t b0 = B64D[in[4]], b1 = B64D[in[5]], b2 = B64D[in[6]], b3 = B64D[in[7]];
    uint32_t c0 = B64D[in[8]], c1 = B64D[in[9]], c2 = B64D[in[10]], c3 = B64D[in[11]];
    uint32_t d0 = B64D[in[12]], d1 = B64D[in[13]], d2 = B64D[in[14]], d3 = B64D[in[15]];
    bad |= a0 | a1 | a2 | a3 | b0 | b1 | b2 | b3 | c0 | c1 | c2 | c3 | d0 | d1 | d2 | d3;
    uint32_t x = a0 << 18 | a1 << 12 | a2 << 6 | a3;
    uint32_t y = b0 << 18 | b1 << 12 | b2 << 6 | b3;
    uint32_t z = c0 << 18 | c1 << 12 | c2 << 6 | c3;
    uint32_t w = d0 << 18 | d1 << 12 | d2 << 6 | d3;
    out[0] = (uint8_t)(x >> 16); out[1] = (uint8_t)(x >> 8); out[2] = (uint8_t)x;
    out[3] = (uint8_t)(y >> 16); out[4] = (uint8_t)(y >> 8); out[5] = (uint8_t)y;
    out[6] = (uint8_t)(z >> 16); out[7] = (uint8_t)(z >> 8); out[8] = (uint8_t)z;
    out[9] = (uint8_t)(w >> 16); out[10] = (uint8_t)(w >> 8); out[11] = (uint8_t)w;
  }
  for (; i < nq; i++, in += 4, out += 3) {
    uint32_t a0 = B64D[in[0]], a1 = B64D[in[1]], a2 = B64D[in[2]], a3 = B64D[in[3]];
    bad |= a0 | a1 | a2 | a3;
    uint32_t x = a0 << 18 | a1 << 12 | a2 << 6 | a3;
    out[0] = (uint8_t)(x >> 16); out[1] = (uint8_t)(x >> 8); out[2] = (uint8_t)x;
  }
  return bad & 0x100;
}

#ifdef ELDR_B64_AVX2
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
__attribute__((target("avx2"))) static size_t dec_quads_avx2(const unsigned char *in, size_t nq,
                                                             uint8_t *out, uint32_t *bad) {
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

/* AVX-512 VBMI: 64 chars -> 48 bytes per step (the scheme of Muła and
 * Lemire, "Base64 encoding and decoding at almost the speed of a memory
 * copy", 2019). One two-table byte permutation (vpermi2b, indexed by the
 * low 7 bits) translates all 64 chars, its table holding 0x80 for every
 * invalid char below 0x80, so a char is invalid exactly when the char or
 * its translation has bit 7 set (one vpternlog accumulates both); maddubs
 * and madd pack as the AVX2 loop, one vpermb makes the 48 bytes
 * contiguous. Same contract as dec_quads_avx2 (a multiple of 16 quads);
 * never writes past the 3 * (quads done) output bytes. */
#define B64_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))
B64_512 static size_t dec_quads_avx512(const unsigned char *in, size_t nq, uint8_t *out,
                                       uint32_t *bad) {
  /* lut: B64D below 0x80, 0x80 for invalid; pk: output byte j is byte
   * 2 - j mod 3 of 24-bit group j / 3 */
  static const unsigned char lut[128] = {
      0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
      0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
      0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x3e, 0x80, 0x80, 0x80, 0x3f,
      0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3a, 0x3b, 0x3c, 0x3d, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
      0x80, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
      0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x80, 0x80, 0x80, 0x80, 0x80,
      0x80, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,
      0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x80, 0x80, 0x80, 0x80, 0x80,
  };
  static const unsigned char pk[64] = {
      0x02, 0x01, 0x00, 0x06, 0x05, 0x04, 0x0a, 0x09, 0x08, 0x0e, 0x0d, 0x0c, 0x12, 0x11, 0x10, 0x16,
      0x15, 0x14, 0x1a, 0x19, 0x18, 0x1e, 0x1d, 0x1c, 0x22, 0x21, 0x20, 0x26, 0x25, 0x24, 0x2a, 0x29,
      0x28, 0x2e, 0x2d, 0x2c, 0x32, 0x31, 0x30, 0x36, 0x35, 0x34, 0x3a, 0x39, 0x38, 0x3e, 0x3d, 0x3c,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  };
  const __m512i lut0 = _mm512_loadu_si512(lut), lut1 = _mm512_loadu_si512(lut + 64);
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

/* The CPU has AVX2 and ELDR_NO_SIMD / eldr__simd_set did not turn it off. */
static int have_avx2(void) { return eldr__simd_on(); }
#endif

static int simd_off; /* testing hook: eldr__b64_set_simd(0) */

int eldr__b64_set_simd(int enable) {
  int was = !__atomic_load_n(&simd_off, __ATOMIC_RELAXED);
  __atomic_store_n(&simd_off, !enable, __ATOMIC_RELAXED);
#ifdef ELDR_B64_AVX2
  return was && have_avx2();
#else
  (void)was;
  return 0;
#endif
}

/* Decode nq full quads with the fastest available loop. */
static uint32_t dec_quads_any(const unsigned char *in, size_t nq, uint8_t *out) {
#ifdef ELDR_B64_AVX2
  if (nq >= 8 && !__atomic_load_n(&simd_off, __ATOMIC_RELAXED) && have_avx2()) {
    uint32_t bad = 0;
    size_t done = nq >= 16 && eldr__simd_avx512() ? dec_quads_avx512(in, nq, out, &bad)
                                                  : dec_quads_avx2(in, nq, out, &bad);
    if (bad) return 0x100;
    return dec_quads(in + 4 * done, nq - done, out + 3 * done);
  }
#endif
  return dec_quads(in, nq, out);
}

static int bad_char(const unsigned char *in, size_t len, size_t base, eldr_diag *d) {
  for (size_t i = 0; i < len; i++)
    if (B64D[in[i]] & 0x100) {
      if (in[i] >= 0x21 && in[i] < 0x7f)
        return eldr_diag_fail(d, ELDR_EPARSE, "base64: invalid character '%c' at offset %zu",
                              in[i], base + i);
      return eldr_diag_fail(d, ELDR_EPARSE, "base64: invalid byte 0x%02x at offset %zu", in[i],
                            base + i);
    }
  return eldr_diag_fail(d, ELDR_EPARSE, "base64: invalid input");
}

/* A streaming decoder over a whole base64 text. */
typedef struct b64s {
  const unsigned char *in;
  size_t len;     /* chars */
  size_t nq_full; /* quads without padding */
  size_t q;       /* next quad */
  int pad;        /* '=' count in the last quad (0..2) */
  bool tail_done;
  size_t total;   /* decoded length of the whole text */
} b64s;

static int b64s_init(b64s *s, const char *in, size_t len, eldr_diag *d) {
  memset(s, 0, sizeof *s);
  if (len % 4)
    return eldr_diag_fail(d, ELDR_EPARSE, "base64: length %zu is not a multiple of 4", len);
  s->in = (const unsigned char *)in;
  s->len = len;
  if (len) {
    if (in[len - 1] == '=') s->pad = in[len - 2] == '=' ? 2 : 1;
  }
  s->nq_full = len / 4 - (s->pad ? 1 : 0);
  s->tail_done = s->pad == 0;
  s->total = len / 4 * 3 - (size_t)s->pad;
  return ELDR_OK;
}

/* Decode up to maxq quads into out (capacity >= maxq * 3), the final padded
 * quad included when it fits; *got bytes (0 at the end of the text). */
static int b64s_read(b64s *s, uint8_t *out, size_t maxq, size_t *got, eldr_diag *d) {
  size_t n = s->q < s->nq_full ? s->nq_full - s->q : 0;
  if (n > maxq) n = maxq;
  *got = 0;
  if (n) {
    if (dec_quads_any(s->in + 4 * s->q, n, out))
      return bad_char(s->in + 4 * s->q, 4 * n, 4 * s->q, d);
    s->q += n;
    *got = 3 * n;
    out += 3 * n;
  }
  if (!s->tail_done && n < maxq && s->q == s->nq_full) {
    const unsigned char *t = s->in + 4 * s->q;
    size_t keep = 4 - (size_t)s->pad; /* 2 or 3 significant chars */
    uint32_t v[3] = {0, 0, 0}, bad = 0;
    for (size_t i = 0; i < keep; i++) bad |= v[i] = B64D[t[i]];
    if (bad & 0x100) return bad_char(t, keep, 4 * s->q, d);
    if (s->pad == 2) {
      if (v[1] & 0xf)
        return eldr_diag_fail(d, ELDR_EPARSE, "base64: bad padding at offset %zu (non-zero bits)",
                              4 * s->q + 1);
      out[0] = (uint8_t)(v[0] << 2 | v[1] >> 4);
      *got += 1;
    } else {
      if (v[2] & 0x3)
        return eldr_diag_fail(d, ELDR_EPARSE, "base64: bad padding at offset %zu (non-zero bits)",
                              4 * s->q + 2);
      out[0] = (uint8_t)(v[0] << 2 | v[1] >> 4);
      out[1] = (uint8_t)((v[1] & 0xf) << 4 | v[2] >> 2);
      *got += 2;
    }
    s->q++;
    s->tail_done = true;
  }
  return ELDR_OK;
}

int eldr_b64_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *out_len,
                    eldr_diag *d) {
  if ((!in && len) || !out_len) return eldr_diag_fail(d, ELDR_EINVAL, "base64: argument missing");
  *out_len = 0;
  b64s s;
  int rc = b64s_init(&s, in, len, d);
  if (rc) return rc;
  if (s.total > cap)
    return eldr_diag_fail(d, ELDR_ERANGE, "base64: %zu decoded bytes exceed the buffer (%zu)",
                          s.total, cap);
  if (s.total && !out) return eldr_diag_fail(d, ELDR_EINVAL, "base64: output missing");
  if (s.total == 0) return ELDR_OK; /* nothing to write (out may be NULL) */
  size_t n = 0;
  for (;;) {
    size_t got;
    if ((rc = b64s_read(&s, out + n, (size_t)-1 / 4, &got, d))) return rc;
    if (!got) break;
    n += got;
  }
  *out_len = n;
  return ELDR_OK;
}

/* Two output characters per 12 input bits. */
typedef struct b64pairs {
  char c[4096][2];
} b64pairs;

static void build_pairs(b64pairs *t) {
  for (int i = 0; i < 4096; i++) {
    t->c[i][0] = B64E[i >> 6];
    t->c[i][1] = B64E[i & 63];
  }
}

static const b64pairs *pairs(void) {
  static b64pairs table;
  static int ready; /* 0 no, 1 being built, 2 ready */
  if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) == 2) return &table;
  int expected = 0;
  if (__atomic_compare_exchange_n(&ready, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    build_pairs(&table);
    __atomic_store_n(&ready, 2, __ATOMIC_RELEASE);
    return &table;
  }
  return NULL; /* another thread is building it: use the plain loop */
}

void eldr_b64_encode(const uint8_t *in, size_t n, char *out) {
  size_t i = 0;
  const b64pairs *t = n >= 3072 ? pairs() : NULL;
  if (t) {
    for (; i + 3 <= n; i += 3, out += 4) {
      uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
      memcpy(out, t->c[x >> 12], 2);
      memcpy(out + 2, t->c[x & 4095], 2);
    }
  }
  for (; i + 3 <= n; i += 3, out += 4) {
    uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
    out[0] = B64E[x >> 18];
    out[1] = B64E[(x >> 12) & 63];
    out[2] = B64E[(x >> 6) & 63];
    out[3] = B64E[x & 63];
  }
  if (n - i == 1) {
    uint32_t x = (uint32_t)in[i] << 16;
    out[0] = B64E[x >> 18];
    out[1] = B64E[(x >> 12) & 63];
    out[2] = '=';
    out[3] = '=';
    out += 4;
  } else if (n - i == 2) {
    uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
    out[0] = B64E[x >> 18];
    out[1] = B64E[(x >> 12) & 63];
    out[2] = B64E[(x >> 6) & 63];
    out[3] = '=';
    out += 4;
  }
  *out = '\0';
}

/* ------------------------------------------------------------------------ */
/* npy header                                                                */

static bool hws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

typedef struct hcur {
  const uint8_t *p, *e;
} hcur;

static void hskip(hcur *c) {
  while (c->p < c->e && hws(*c->p)) c->p++;
}

/* A Python string literal '...' or "..." of printable ASCII, no escapes. */
static int hstring(hcur *c, char *out, size_t cap, const char *what, eldr_diag *d) {
  if (c->p >= c->e || (*c->p != '\'' && *c->p != '"'))
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected a quoted %s", what);
  uint8_t q = *c->p++;
  size_t n = 0;
  while (c->p < c->e && *c->p != q) {
    uint8_t ch = *c->p;
    if (ch < 0x20 || ch >= 0x7f || ch == '\\')
      return eldr_diag_fail(d, ELDR_EPARSE, "npy header: bad character in %s", what);
    if (n + 1 >= cap) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: %s too long", what);
    out[n++] = (char)ch;
    c->p++;
  }
  if (c->p >= c->e) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unterminated %s", what);
  c->p++;
  out[n] = '\0';
  return ELDR_OK;
}

static int hdtype(const char *s, eldr_sel_dtype *t, eldr_diag *d) {
  if (!strcmp(s, "|u1") || !strcmp(s, "<u1") || !strcmp(s, "u1") || !strcmp(s, "=u1") ||
      !strcmp(s, ">u1")) {
    *t = ELDR_SEL_U8;
    return ELDR_OK;
  }
  if (!strcmp(s, "<u2")) {
    *t = ELDR_SEL_U16LE;
    return ELDR_OK;
  }
  if (!strcmp(s, "<i4")) {
    *t = ELDR_SEL_I32LE;
    return ELDR_OK;
  }
  if (!strcmp(s, "<i2")) {
    *t = ELDR_SEL_I16LE;
    return ELDR_OK;
  }
  if (!strcmp(s, "<i8")) {
    *t = ELDR_SEL_I64LE;
    return ELDR_OK;
  }
  return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                        "npy header: dtype '%s' unsupported (need uint8 '|u1', little-endian "
                        "uint16 '<u2', int16 '<i2', int32 '<i4' or int64 '<i8')",
                        s);
}

int eldr_npy_parse_header(const uint8_t *buf, size_t len, eldr_npy_info *info, eldr_diag *d) {
  if ((!buf && len) || !info) return eldr_diag_fail(d, ELDR_EINVAL, "npy: argument missing");
  memset(info, 0, sizeof *info);
  if (len < 6 || memcmp(buf, "\x93NUMPY", 6))
    return eldr_diag_fail(d, ELDR_EPARSE, "npy: bad magic (not a .npy array)");
  if (len < 8) return eldr_diag_fail(d, ELDR_EPARSE, "npy: truncated before the version");
  const unsigned major = buf[6], minor = buf[7];
  if (major < 1 || major > 3 || minor != 0)
    return eldr_diag_fail(d, ELDR_EVERSION, "npy: format version %u.%u unsupported (1.0-3.0)",
                          major, minor);
  const size_t pre = major == 1 ? 10 : 12;
  if (len < pre) return eldr_diag_fail(d, ELDR_EPARSE, "npy: truncated header length");
  size_t hlen = major == 1 ? (size_t)buf[8] | (size_t)buf[9] << 8
                           : (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 |
                                 (size_t)buf[11] << 24;
  if (hlen > len - pre)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "npy: header length %zu overflows the input (%zu bytes after the prefix)",
                          hlen, len - pre);
  hcur c = {buf + pre, buf + pre + hlen};
  bool have_descr = false, have_fortran = false, have_shape = false;
  hskip(&c);
  if (c.p >= c.e || *c.p != '{')
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected '{'");
  c.p++;
  int rc;
  for (;;) {
    hskip(&c);
    if (c.p >= c.e) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unterminated dict");
    if (*c.p == '}') {
      c.p++;
      break;
    }
    char key[32];
    if ((rc = hstring(&c, key, sizeof key, "key", d))) return rc;
    hskip(&c);
    if (c.p >= c.e || *c.p != ':')
      return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected ':' after '%s'", key);
    c.p++;
    hskip(&c);
    if (!strcmp(key, "descr")) {
      if (have_descr) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: duplicate 'descr'");
      char ds[24];
      if ((rc = hstring(&c, ds, sizeof ds, "descr", d))) return rc;
      if ((rc = hdtype(ds, &info->dtype, d))) return rc;
      have_descr = true;
    } else if (!strcmp(key, "fortran_order")) {
      if (have_fortran)
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: duplicate 'fortran_order'");
      if (c.e - c.p >= 5 && !memcmp(c.p, "False", 5)) {
        c.p += 5;
      } else if (c.e - c.p >= 4 && !memcmp(c.p, "True", 4)) {
        return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                              "npy header: fortran_order True unsupported (need C order)");
      } else {
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: fortran_order must be True or False");
      }
      have_fortran = true;
    } else if (!strcmp(key, "shape")) {
      if (have_shape) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: duplicate 'shape'");
      if (c.p >= c.e || *c.p != '(')
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: shape must be a tuple");
      c.p++;
      uint32_t nd = 0;
      for (;;) {
        hskip(&c);
        if (c.p >= c.e) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unterminated shape");
        if (*c.p == ')') {
          c.p++;
          break;
        }
        if (!(*c.p >= '0' && *c.p <= '9'))
          return eldr_diag_fail(d, ELDR_EPARSE, "npy header: shape entries must be integers");
        size_t v = 0;
        while (c.p < c.e && *c.p >= '0' && *c.p <= '9') {
          if (v > ((size_t)1 << 48))
            return eldr_diag_fail(d, ELDR_ERANGE, "npy header: shape dimension too large");
          v = v * 10 + (size_t)(*c.p++ - '0');
        }
        if (nd >= 3)
          return eldr_diag_fail(d, ELDR_ESHAPE, "npy header: more than 3 dimensions");
        info->shape[nd++] = v;
        hskip(&c);
        if (c.p < c.e && *c.p == ',') {
          c.p++;
          continue;
        }
        if (c.p < c.e && *c.p == ')') {
          c.p++;
          break;
        }
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected ',' or ')' in shape");
      }
      info->ndim = nd;
      have_shape = true;
    } else {
      return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unknown key '%s'", key);
    }
    hskip(&c);
    if (c.p < c.e && *c.p == ',') {
      c.p++;
      continue;
    }
    if (c.p < c.e && *c.p == '}') {
      c.p++;
      break;
    }
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected ',' or '}' after '%s'", key);
  }
  hskip(&c);
  if (c.p != c.e)
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unexpected characters after the dict");
  if (!have_descr) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: missing 'descr'");
  if (!have_fortran) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: missing 'fortran_order'");
  if (!have_shape) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: missing 'shape'");
  info->data_offset = pre + hlen;
  return ELDR_OK;
}

/* ------------------------------------------------------------------------ */
/* routed_experts                                                            */

#define CHUNK_Q 4096               /* quads per chunk: 16 KiB of text, 12 KiB decoded */
#define BIG_Q 65536                /* quads per heap chunk: 256 KiB of text, 192 KiB decoded */
#define MAX_UNIT (ELDR_MAX_TOPK * 8) /* bytes of one (token, layer) row */

/* Checks shared by count and decode: ndim, dims against the model (0 =
 * accept any), payload length against the decoded length. */
static int check_array(const eldr_npy_info *h, size_t total, uint32_t L, uint32_t K,
                       size_t *payload, eldr_diag *d) {
  if (h->ndim != 3)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "routed_experts: %u-dimensional array, expected 3 (tokens, layers, top_k)",
                          h->ndim);
  if ((L && h->shape[1] != L) || (K && h->shape[2] != K))
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "routed_experts: shape (%zu, %zu, %zu) does not match the model "
                          "(layers %u, top_k %u)",
                          h->shape[0], h->shape[1], h->shape[2], L, K);
  if (h->shape[1] < 1 || h->shape[1] > ELDR_MAX_LAYERS || h->shape[2] < 1 ||
      h->shape[2] > ELDR_MAX_TOPK)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "routed_experts: shape (%zu, %zu, %zu): layers must be in [1, %d] and "
                          "top_k in [1, %d]",
                          h->shape[0], h->shape[1], h->shape[2], ELDR_MAX_LAYERS, ELDR_MAX_TOPK);
  size_t n;
  if (__builtin_mul_overflow(h->shape[0], h->shape[1], &n) ||
      __builtin_mul_overflow(n, h->shape[2], &n) ||
      __builtin_mul_overflow(n, eldr_sel_dtype_size(h->dtype), &n))
    return eldr_diag_fail(d, ELDR_ESHAPE, "routed_experts: shape (%zu, %zu, %zu) too large",
                          h->shape[0], h->shape[1], h->shape[2]);
  size_t have = total - h->data_offset;
  if (have < n)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "routed_experts: payload short: %zu bytes, shape (%zu, %zu, %zu) needs %zu",
                          have, h->shape[0], h->shape[1], h->shape[2], n);
  if (have > n)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "routed_experts: payload long: %zu bytes, shape (%zu, %zu, %zu) needs %zu",
                          have, h->shape[0], h->shape[1], h->shape[2], n);
  *payload = n;
  return ELDR_OK;
}

static int64_t read_elem(const uint8_t *p, eldr_sel_dtype t) { return eldr_sel_load(p, t, 0); }

static int range_error(const uint8_t *raw, size_t bad, size_t elem0, const eldr_shape *s,
                       eldr_sel_dtype t, eldr_diag *d) {
  int64_t v = read_elem(raw + bad * eldr_sel_dtype_size(t), t);
  size_t g = elem0 + bad;
  size_t K = s->top_k, L = s->num_layers;
  return eldr_diag_fail(d, ELDR_ERANGE,
                        "routed_experts: token %zu layer %zu slot %zu: expert id %lld %s", g / K / L,
                        g / K % L, g % K, (long long)v,
                        v < 0 ? "is negative" : "out of range");
}

typedef struct counter {
  const eldr_shape *s;
  eldr_sel_dtype dt;
  size_t unit;   /* bytes of one layer row: K * itemsize */
  size_t lpos;   /* layer of the next row within its token */
  size_t rows;   /* layer rows consumed so far */
  uint32_t *counts;
  const uint8_t *mask; /* L layer flags, or NULL for all layers */
} counter;

/* Count nrows whole layer rows at p. */
static int count_rows(counter *c, const uint8_t *p, size_t nrows, eldr_diag *d) {
  const size_t L = c->s->num_layers, K = c->s->top_k;
  size_t bad;
  while (nrows) {
    size_t take;
    int rc;
    if (c->lpos == 0 && nrows >= L) {
      size_t nt = nrows / L;
      take = nt * L;
      rc = eldr_counts_accumulate_masked(c->s, p, c->dt, nt, c->mask, c->counts, &bad);
    } else {
      take = L - c->lpos;
      if (take > nrows) take = nrows;
      eldr_shape sub = {(uint32_t)take, c->s->num_experts, c->s->top_k};
      rc = eldr_counts_accumulate_masked(&sub, p, c->dt, 1, c->mask ? c->mask + c->lpos : NULL,
                                         c->counts + c->lpos * c->s->num_experts, &bad);
    }
    if (rc == ELDR_ERANGE) {
      eldr_shape full = *c->s;
      return range_error(p, bad, c->rows * K, &full, c->dt, d);
    }
    if (rc) return eldr_diag_fail(d, rc, "routed_experts: counting failed");
    p += take * c->unit;
    nrows -= take;
    c->rows += take;
    c->lpos = (c->lpos + take) % L;
  }
  return ELDR_OK;
}

int eldr_routed_experts_count(const char *b64, size_t len, const eldr_shape *shape,
                              uint32_t *counts, size_t *ntokens, eldr_diag *d) {
  return eldr_routed_experts_count_masked(b64, len, shape, NULL, counts, ntokens, d);
}

int eldr_routed_experts_count_masked(const char *b64, size_t len, const eldr_shape *shape,
                                     const uint8_t *mask, uint32_t *counts, size_t *ntokens,
                                     eldr_diag *d) {
  if ((!b64 && len) || !counts) return eldr_diag_fail(d, ELDR_EINVAL, "routed_experts: argument missing");
  if (ntokens) *ntokens = 0;
  int rc = eldr_shape_validate(shape, d);
  if (rc) return rc;
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "routed_experts: empty");
  b64s s;
  if ((rc = b64s_init(&s, b64, len, d))) return rc;
  uint8_t buf[MAX_UNIT + CHUNK_Q * 3];
  size_t got;
  if ((rc = b64s_read(&s, buf, CHUNK_Q, &got, d))) return rc;
  eldr_npy_info h;
  if ((rc = eldr_npy_parse_header(buf, got, &h, d))) {
    if (got == CHUNK_Q * 3 && s.total > got)
      eldr_diag_prefix(d, "routed_experts (header limited to %d bytes)", CHUNK_Q * 3);
    return rc;
  }
  size_t payload;
  if ((rc = check_array(&h, s.total, shape->num_layers, shape->top_k, &payload, d))) return rc;
  counter c = {shape, h.dtype, (size_t)shape->top_k * eldr_sel_dtype_size(h.dtype), 0, 0, counts,
               mask};
  /* payload bytes in buf: [data_offset, got). A long payload continues in
   * a heap buffer of BIG_Q quads (hundreds of tokens a chunk, still in L2:
   * the bit-sliced counting kernel takes blocks of 256 tokens and more);
   * without one, in the stack buffer. */
  uint8_t *big = s.total - got > 4 * (size_t)CHUNK_Q * 3 ? malloc(MAX_UNIT + BIG_Q * 3) : NULL;
  uint8_t *b = buf;
  const size_t q = big ? BIG_Q : CHUNK_Q;
  size_t start = h.data_offset, avail = got - h.data_offset;
  for (;;) {
    size_t nrows = avail / c.unit;
    if (nrows && (rc = count_rows(&c, b + start, nrows, d))) break;
    size_t carry = avail - nrows * c.unit;
    uint8_t *to = big ? big : b; /* the first time from the stack buffer into big */
    memmove(to, b + start + nrows * c.unit, carry);
    b = to;
    if ((rc = b64s_read(&s, b + carry, q, &got, d))) break;
    if (!got) {
      if (carry) rc = eldr_diag_fail(d, ELDR_EPARSE, "routed_experts: payload ends inside a row");
      break;
    }
    start = 0;
    avail = carry + got;
  }
  free(big);
  if (rc) return rc;
  if (ntokens) *ntokens = h.shape[0];
  return ELDR_OK;
}

int eldr_routed_experts_decode(const char *b64, size_t len, const eldr_shape *shape,
                               uint16_t **sel, size_t *ntokens, eldr_shape *out_shape,
                               eldr_diag *d) {
  if ((!b64 && len) || !sel) return eldr_diag_fail(d, ELDR_EINVAL, "routed_experts: argument missing");
  *sel = NULL;
  if (ntokens) *ntokens = 0;
  const uint32_t L = shape ? shape->num_layers : 0, K = shape ? shape->top_k : 0;
  const uint32_t E = shape ? shape->num_experts : 0;
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "routed_experts: empty");
  b64s s;
  int rc = b64s_init(&s, b64, len, d);
  if (rc) return rc;
  uint8_t *raw = malloc(s.total ? s.total : 1);
  if (!raw) return eldr_diag_fail(d, ELDR_ENOMEM, "routed_experts: out of memory");
  uint16_t *out = NULL;
  size_t n = 0, got;
  do {
    if ((rc = b64s_read(&s, raw + n, (size_t)-1 / 4, &got, d))) goto fail;
    n += got;
  } while (got);
  eldr_npy_info h;
  if ((rc = eldr_npy_parse_header(raw, n, &h, d))) goto fail;
  size_t payload;
  if ((rc = check_array(&h, n, L, K, &payload, d))) goto fail;
  const size_t isz = eldr_sel_dtype_size(h.dtype);
  const size_t cnt = payload / isz;
  out = malloc((cnt ? cnt : 1) * sizeof *out);
  if (!out) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "routed_experts: out of memory");
    goto fail;
  }
  const eldr_shape arr = {(uint32_t)h.shape[1], E, (uint32_t)h.shape[2]};
  const uint8_t *p = raw + h.data_offset;
  /* one loop per dtype; the limit is E, or what uint16 holds when E is 0 */
  const uint32_t lim = E ? E : 65536u;
  uint32_t maxv = 0;
  size_t bad = cnt;
  switch (h.dtype) {
  case ELDR_SEL_U8:
    for (size_t i = 0; i < cnt; i++) {
      uint32_t v = p[i];
      maxv = v > maxv ? v : maxv;
      out[i] = (uint16_t)v;
    }
    if (maxv >= lim)
      for (bad = 0; bad < cnt && p[bad] < lim; bad++) {
      }
    break;
  case ELDR_SEL_U16LE:
    for (size_t i = 0; i < cnt; i++) {
      uint32_t v = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
      maxv = v > maxv ? v : maxv;
      out[i] = (uint16_t)v;
    }
    if (maxv >= lim)
      for (bad = 0; bad < cnt && out[bad] < lim; bad++) {
      }
    break;
  case ELDR_SEL_I16LE:
  case ELDR_SEL_I64LE:
    /* rare wire dtypes: one generic loop; negative ids fail the limit */
    for (size_t i = 0; i < cnt; i++) {
      int64_t v = read_elem(p + i * isz, h.dtype);
      uint32_t u = v < 0 || v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
      maxv = u > maxv ? u : maxv;
      out[i] = (uint16_t)u;
      if (u >= lim && bad == cnt) bad = i;
    }
    break;
  default: /* I32LE */
    for (size_t i = 0; i < cnt; i++) {
      /* negative ids become huge unsigned values and fail the limit */
      uint32_t v = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                   (uint32_t)p[4 * i + 3] << 24;
      maxv = v > maxv ? v : maxv;
      out[i] = (uint16_t)v;
    }
    if (maxv >= lim)
      for (bad = 0; bad < cnt; bad++) {
        uint32_t v = (uint32_t)p[4 * bad] | (uint32_t)p[4 * bad + 1] << 8 |
                     (uint32_t)p[4 * bad + 2] << 16 | (uint32_t)p[4 * bad + 3] << 24;
        if (v >= lim) break;
      }
    break;
  }
  if (bad < cnt) {
    rc = range_error(p, bad, 0, &arr, h.dtype, d);
    goto fail;
  }
  int64_t maxid = cnt ? (int64_t)maxv : -1;
  free(raw);
  *sel = out;
  if (ntokens) *ntokens = h.shape[0];
  if (out_shape) {
    out_shape->num_layers = (uint32_t)h.shape[1];
    out_shape->top_k = (uint32_t)h.shape[2];
    out_shape->num_experts = E ? E : (uint32_t)(maxid + 1);
  }
  return ELDR_OK;
fail:
  free(out);
  free(raw);
  return rc;
}

/* The .npy format 1.0 header for (T, L, K) of descr, padded so that the
 * payload starts at a multiple of 64. Returns its length. */
static size_t npy_header(uint8_t *h, size_t cap, const char *descr, size_t T, uint32_t L,
                         uint32_t K) {
  char dict[160];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%zu, %u, %u), }",
                   descr, T, L, K);
  if (n < 0 || (size_t)n >= sizeof dict) return 0;
  size_t hlen = (size_t)n + 1; /* + '\n' */
  size_t total = (10 + hlen + 63) / 64 * 64;
  if (total > cap) return 0;
  hlen = total - 10;
  memcpy(h, "\x93NUMPY\x01\x00", 8);
  h[8] = (uint8_t)(hlen & 0xff);
  h[9] = (uint8_t)(hlen >> 8);
  memcpy(h + 10, dict, (size_t)n);
  memset(h + 10 + n, ' ', hlen - (size_t)n - 1);
  h[total - 1] = '\n';
  return total;
}

int eldr_routed_experts_encode(const uint16_t *sel, size_t ntokens, const eldr_shape *shape,
                               eldr_sel_dtype dtype, char **out, size_t *out_len) {
  if (!out || !shape || (ntokens && !sel)) return ELDR_EINVAL;
  *out = NULL;
  if (out_len) *out_len = 0;
  if (eldr_shape_validate(shape, NULL)) return ELDR_EINVAL;
  const uint32_t E = shape->num_experts;
  if (dtype == ELDR_SEL_U16) dtype = E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8;
  const char *descr = dtype == ELDR_SEL_U8 ? "|u1" : dtype == ELDR_SEL_U16LE ? "<u2" : "<i4";
  if (dtype != ELDR_SEL_U8 && dtype != ELDR_SEL_U16LE && dtype != ELDR_SEL_I32LE)
    return ELDR_EINVAL;
  const size_t isz = eldr_sel_dtype_size(dtype);
  size_t cnt, bytes, npy_len;
  if (__builtin_mul_overflow(ntokens, (size_t)shape->num_layers * shape->top_k, &cnt) ||
      __builtin_mul_overflow(cnt, isz, &bytes))
    return ELDR_ERANGE;
  const uint32_t lim = dtype == ELDR_SEL_U8 ? 256u : 65536u;
  for (size_t i = 0; i < cnt; i++)
    if (sel[i] >= E || sel[i] >= lim) return ELDR_ERANGE;
  uint8_t hdr[256];
  size_t hl = npy_header(hdr, sizeof hdr, descr, ntokens, shape->num_layers, shape->top_k);
  if (!hl) return ELDR_ERANGE;
  if (__builtin_add_overflow(hl, bytes, &npy_len) || npy_len > (SIZE_MAX - 4) / 4 * 3)
    return ELDR_ERANGE;
  uint8_t *npy = malloc(npy_len);
  if (!npy) return ELDR_ENOMEM;
  memcpy(npy, hdr, hl);
  uint8_t *p = npy + hl;
  if (dtype == ELDR_SEL_U8) {
    for (size_t i = 0; i < cnt; i++) p[i] = (uint8_t)sel[i];
  } else if (dtype == ELDR_SEL_U16LE) {
    for (size_t i = 0; i < cnt; i++) {
      p[2 * i] = (uint8_t)sel[i];
      p[2 * i + 1] = (uint8_t)(sel[i] >> 8);
    }
  } else {
    for (size_t i = 0; i < cnt; i++) {
      p[4 * i] = (uint8_t)sel[i];
      p[4 * i + 1] = (uint8_t)(sel[i] >> 8);
      p[4 * i + 2] = 0;
      p[4 * i + 3] = 0;
    }
  }
  size_t elen = eldr_b64_encoded_len(npy_len);
  char *txt = malloc(elen + 1);
  if (!txt) {
    free(npy);
    return ELDR_ENOMEM;
  }
  eldr_b64_encode(npy, npy_len, txt);
  free(npy);
  *out = txt;
  if (out_len) *out_len = elen;
  return ELDR_OK;
}

int eldr__routed_experts_view(const char *b64, size_t len, const eldr_shape *shape, uint8_t **buf,
                              size_t *cap, eldr__re_view *v, eldr_diag *d) {
  if ((!b64 && len) || !buf || !cap || !v)
    return eldr_diag_fail(d, ELDR_EINVAL, "routed_experts: argument missing");
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "routed_experts: empty");
  size_t need = eldr_b64_decoded_max(len);
  if (need < 64) need = 64;
  if (need > *cap) {
    uint8_t *p = realloc(*buf, need);
    if (!p) return eldr_diag_fail(d, ELDR_ENOMEM, "routed_experts: out of memory");
    *buf = p;
    *cap = need;
  }
  size_t n = 0, payload;
  eldr_npy_info h;
  int rc = eldr_b64_decode(b64, len, *buf, *cap, &n, d);
  if (!rc) rc = eldr_npy_parse_header(*buf, n, &h, d);
  if (!rc) rc = check_array(&h, n, shape ? shape->num_layers : 0, shape ? shape->top_k : 0, &payload, d);
  if (rc) return rc;
  v->data = *buf + h.data_offset;
  v->dtype = h.dtype;
  v->rows = h.shape[0];
  v->layers = h.shape[1];
  v->top_k = h.shape[2];
  return ELDR_OK;
}
