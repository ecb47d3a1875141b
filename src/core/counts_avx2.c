/* counts_avx2.c — the counting code's AVX2 twins (see core/counts_int.h):
 * the range check's maximum a vector at a time, the bit-sliced group kernel
 * and the row adds. counts.c decides when they run (eldr_cpu_has(
 * ELDR_CPU_AVX2)) and holds their portable twins; counts_avx512.c holds the
 * AVX-512 ones.
 *
 * The bit-sliced kernel (the contract: core/counts_int.h): a (token, layer)
 * row of 8 distinct ids < 128 is a 128-bit set. A group's four rows of a
 * token become two vectors of four 64-bit sets (ids 0..63, ids 64..127),
 * built with variable shifts (an id >= 64, or >= 128, shifts the bit out:
 * it sets nothing). Per group, the sets of 16 tokens go through a
 * Harley-Seal carry-save tree into bit planes (ones, twos, fours, eights
 * carried; sixteens expanded into byte counters), so one vector operation
 * counts 256 (layer, expert) positions at once instead of one increment per
 * id.
 *
 * Built only on x86-64 with GCC or clang (target attributes: the rest of
 * the build stays portable). */
#include "core/counts_int.h"

#ifdef ELDR_COUNTS_X86
#include <immintrin.h>
#include <string.h>

#define GROUP ELDR_BITS_GROUP

__attribute__((target("avx2"))) size_t eldr__max_avx2(const unsigned char *p, size_t bytes, size_t w,
                                                      uint32_t *out) {
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  size_t i = 0;
#define MAXV(OP)                                                                   \
  for (; i + 64 <= bytes; i += 64) {                                               \
    a = OP(a, _mm256_loadu_si256((const __m256i *)(const void *)(p + i)));         \
    b = OP(b, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32)));    \
  }                                                                                \
  a = OP(a, b)
  if (w == 1) {
    MAXV(_mm256_max_epu8);
  } else if (w == 2) {
    MAXV(_mm256_max_epu16);
  } else {
    MAXV(_mm256_max_epu32);
  }
#undef MAXV
  uint32_t lanes[8], m = 0;
  if (w == 1) {
    a = _mm256_max_epu8(a, _mm256_srli_epi32(a, 8));
    a = _mm256_max_epu8(a, _mm256_srli_epi32(a, 16));
    a = _mm256_and_si256(a, _mm256_set1_epi32(0xff));
  } else if (w == 2) {
    a = _mm256_max_epu16(a, _mm256_srli_epi32(a, 16));
    a = _mm256_and_si256(a, _mm256_set1_epi32(0xffff));
  }
  _mm256_storeu_si256((__m256i *)(void *)lanes, a);
  for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
  *out = m;
  return i;
}

#define AVX2_FN __attribute__((target("avx2"))) static inline

AVX2_FN void csa(__m256i *h, __m256i *l, __m256i a, __m256i b, __m256i c) {
  const __m256i u = _mm256_xor_si256(a, b);
  *h = _mm256_or_si256(_mm256_and_si256(a, b), _mm256_and_si256(u, c));
  *l = _mm256_xor_si256(u, c);
}

/* The rows of one group at token p: four 8-byte rows at byte offsets off[0..3]
 * (one 32-byte load when they are consecutive layers). */
AVX2_FN __m256i bits_load(const unsigned char *p, const uint32_t *off, int contig) {
  if (contig) return _mm256_loadu_si256((const __m256i *)(const void *)(p + off[0]));
  uint64_t r[4];
  for (int i = 0; i < 4; i++) memcpy(&r[i], p + off[i], 8);
  return _mm256_setr_epi64x((long long)r[0], (long long)r[1], (long long)r[2], (long long)r[3]);
}

/* The sets of 16 tokens' rows of one group: m[i] ids 0..63, m[16 + i] ids 64..127. */
AVX2_FN void bits_build16(const unsigned char *p, size_t tb, const uint32_t *off, int contig, __m256i *m) {
  const __m256i one = _mm256_set1_epi64x(1), off64 = _mm256_set1_epi64x(64);
#define SEL(k) _mm256_setr_epi8(k, -1, -1, -1, -1, -1, -1, -1, 8 + k, -1, -1, -1, -1, -1, -1, -1, \
                                k, -1, -1, -1, -1, -1, -1, -1, 8 + k, -1, -1, -1, -1, -1, -1, -1)
  const __m256i s0 = SEL(0), s1 = SEL(1), s2 = SEL(2), s3 = SEL(3), s4 = SEL(4), s5 = SEL(5),
                s6 = SEL(6), s7 = SEL(7);
#undef SEL
  for (int i = 0; i < GROUP; i++, p += tb) {
    const __m256i v = bits_load(p, off, contig);
    __m256i lo = _mm256_setzero_si256(), hi = lo;
    /* x: one id per 64-bit lane; x - 64 wraps to >= 2^63 below 64: shifted out */
#define ID(s)                                                        \
  {                                                                  \
    const __m256i x = _mm256_shuffle_epi8(v, s);                     \
    lo = _mm256_or_si256(lo, _mm256_sllv_epi64(one, x));             \
    hi = _mm256_or_si256(hi, _mm256_sllv_epi64(one, _mm256_sub_epi64(x, off64))); \
  }
    ID(s0) ID(s1) ID(s2) ID(s3) ID(s4) ID(s5) ID(s6) ID(s7)
#undef ID
    m[i] = lo;
    m[GROUP + i] = hi;
  }
}

typedef struct bits_planes {
  __m256i ones, twos, fours, eights;
} bits_planes;

/* 16 sets into the carried planes; returns the sixteens plane. */
AVX2_FN __m256i bits_tree16(bits_planes *s, const __m256i *in) {
  __m256i tA, tB, fA, fB, eA, eB, sixteens;
  csa(&tA, &s->ones, s->ones, in[0], in[1]);
  csa(&tB, &s->ones, s->ones, in[2], in[3]);
  csa(&fA, &s->twos, s->twos, tA, tB);
  csa(&tA, &s->ones, s->ones, in[4], in[5]);
  csa(&tB, &s->ones, s->ones, in[6], in[7]);
  csa(&fB, &s->twos, s->twos, tA, tB);
  csa(&eA, &s->fours, s->fours, fA, fB);
  csa(&tA, &s->ones, s->ones, in[8], in[9]);
  csa(&tB, &s->ones, s->ones, in[10], in[11]);
  csa(&fA, &s->twos, s->twos, tA, tB);
  csa(&tA, &s->ones, s->ones, in[12], in[13]);
  csa(&tB, &s->ones, s->ones, in[14], in[15]);
  csa(&fB, &s->twos, s->twos, tA, tB);
  csa(&eB, &s->fours, s->fours, fA, fB);
  csa(&sixteens, &s->eights, s->eights, eA, eB);
  return sixteens;
}

/* 0xFF in byte i where bit i of plane is set (i = 32c .. 32c + 31). */
AVX2_FN __m256i bits_bytes(__m256i plane, int c) {
  const __m256i ctrl = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                        2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  __m256i x = _mm256_permutevar8x32_epi32(plane, _mm256_set1_epi32(c));
  x = _mm256_shuffle_epi8(x, ctrl);
  return _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
}

/* Add a plane's 256 bits to 256 byte counters (byte i of cnt: bit i). */
AVX2_FN void bits_expand(__m256i plane, __m256i *cnt) {
  for (int c = 0; c < 8; c++) cnt[c] = _mm256_sub_epi8(cnt[c], bits_bytes(plane, c));
}

/* The counts of one half: 16 x sixteens + 8 x eights + 4 x fours + 2 x
 * twos + ones, position 32c + i into out[(c / 2) * 128 + 32 * (c % 2) + i];
 * adds them to *sum (32-bit lanes). */
AVX2_FN void bits_flush(const bits_planes *s, const __m256i *cnt, uint16_t *out, __m256i *sum) {
  const __m256i w1 = _mm256_set1_epi8(1), w2 = _mm256_set1_epi8(2), w4 = _mm256_set1_epi8(4),
                w8 = _mm256_set1_epi8(8), ones16 = _mm256_set1_epi16(1);
  for (int c = 0; c < 8; c++) {
    __m256i b = _mm256_and_si256(bits_bytes(s->ones, c), w1);
    b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(s->twos, c), w2));
    b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(s->fours, c), w4));
    b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(s->eights, c), w8));
    const __m128i bl = _mm256_castsi256_si128(b), bh = _mm256_extracti128_si256(b, 1);
    const __m128i cl = _mm256_castsi256_si128(cnt[c]), ch = _mm256_extracti128_si256(cnt[c], 1);
    __m256i lo = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(cl), 4), _mm256_cvtepu8_epi16(bl));
    __m256i hi = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(ch), 4), _mm256_cvtepu8_epi16(bh));
    uint16_t *o = out + (c / 2) * 128 + 32 * (c % 2);
    _mm256_storeu_si256((__m256i *)(void *)o, lo);
    _mm256_storeu_si256((__m256i *)(void *)(o + 16), hi);
    *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(_mm256_madd_epi16(lo, ones16), _mm256_madd_epi16(hi, ones16)));
  }
}

/* A block's planes b (its own count, 0..16; b16: its sixteens) added into
 * the carried planes s; returns the carry of weight 16 (s holds at most 15
 * and b at most 16, and 16 only with its lower planes empty: one carry). */
AVX2_FN __m256i bits_add_block(bits_planes *s, const bits_planes *b, __m256i b16) {
  __m256i c1, c2, c4, c8;
  c1 = _mm256_and_si256(s->ones, b->ones);
  s->ones = _mm256_xor_si256(s->ones, b->ones);
  csa(&c2, &s->twos, s->twos, b->twos, c1);
  csa(&c4, &s->fours, s->fours, b->fours, c2);
  csa(&c8, &s->eights, s->eights, b->eights, c4);
  return _mm256_or_si256(c8, b16);
}

/* One half's 16-token block counted from empty planes, kept at q (five
 * planes of 32 bytes) and added into s; returns the carry of weight 16. */
AVX2_FN __m256i bits_tree16_keep(bits_planes *s, const __m256i *in, unsigned char *q) {
  const __m256i z = _mm256_setzero_si256();
  bits_planes b = {z, z, z, z};
  const __m256i b16 = bits_tree16(&b, in);
  _mm256_storeu_si256((__m256i *)(void *)q, b.ones);
  _mm256_storeu_si256((__m256i *)(void *)(q + 32), b.twos);
  _mm256_storeu_si256((__m256i *)(void *)(q + 64), b.fours);
  _mm256_storeu_si256((__m256i *)(void *)(q + 96), b.eights);
  _mm256_storeu_si256((__m256i *)(void *)(q + 128), b16);
  return bits_add_block(s, &b, b16);
}

/* Count ntok (a multiple of 16) tokens of one group (rows at byte offsets
 * off[0..3] of each token) into out[r * 128 + e]; returns the number of
 * bits counted. planes (may be NULL): each 16-token block's planes kept
 * there, pstride bytes apart (core/counts_int.h). */
__attribute__((target("avx2"))) size_t eldr__bits_group_avx2(const unsigned char *p, size_t tb, size_t ntok,
                                                             const uint32_t *off, uint16_t *out,
                                                             unsigned char *planes, size_t pstride) {
  const int contig = off[1] == off[0] + 8 && off[2] == off[0] + 16 && off[3] == off[0] + 24;
  bits_planes lo = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  bits_planes hi = lo;
  __m256i cnt[16], m[2 * GROUP];
  for (int c = 0; c < 16; c++) cnt[c] = _mm256_setzero_si256();
  if (planes) {
    for (size_t t = 0; t < ntok; t += GROUP, p += GROUP * tb, planes += pstride) {
      bits_build16(p, tb, off, contig, m);
      bits_expand(bits_tree16_keep(&lo, m, planes), cnt);
      bits_expand(bits_tree16_keep(&hi, m + GROUP, planes + 160), cnt + 8);
    }
  } else {
    for (size_t t = 0; t < ntok; t += GROUP, p += GROUP * tb) {
      bits_build16(p, tb, off, contig, m);
      bits_expand(bits_tree16(&lo, m), cnt);
      bits_expand(bits_tree16(&hi, m + GROUP), cnt + 8);
    }
  }
  __m256i sum = _mm256_setzero_si256();
  bits_flush(&lo, cnt, out, &sum);
  bits_flush(&hi, cnt + 8, out + 64, &sum);
  uint32_t lanes[8];
  _mm256_storeu_si256((__m256i *)(void *)lanes, sum);
  size_t total = 0;
  for (int i = 0; i < 8; i++) total += lanes[i];
  return total;
}

/* One group-block's planes in this kernel's layout (core/counts_int.h)
 * into 4 x 128 byte counts; returns their largest. */
__attribute__((target("avx2"))) uint8_t eldr__planes_bytes_avx2(const unsigned char *gp, uint8_t *out) {
  const __m256i w1 = _mm256_set1_epi8(1), w2 = _mm256_set1_epi8(2), w4 = _mm256_set1_epi8(4),
                w8 = _mm256_set1_epi8(8), w16 = _mm256_set1_epi8(16);
  __m256i mx = _mm256_setzero_si256();
  for (int h = 0; h < 2; h++) {
    const unsigned char *q = gp + 160 * h;
    __m256i pl[5];
    for (int k = 0; k < 5; k++) pl[k] = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32 * k));
    /* a count of 16 (every token of the block picked the expert) is rare:
     * the sixteens plane is mostly empty, and then not expanded */
    const int sixteens = !_mm256_testz_si256(pl[4], pl[4]);
    for (int c = 0; c < 8; c++) {
      __m256i b = _mm256_and_si256(bits_bytes(pl[0], c), w1);
      b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(pl[1], c), w2));
      b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(pl[2], c), w4));
      b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(pl[3], c), w8));
      if (sixteens) b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(pl[4], c), w16));
      _mm256_storeu_si256((__m256i *)(void *)(out + (c / 2) * 128 + 64 * h + 32 * (c % 2)), b);
      mx = _mm256_max_epu8(mx, b);
    }
  }
  __m128i z = _mm_max_epu8(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 8));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 4));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 2));
  z = _mm_max_epu8(z, _mm_srli_si128(z, 1));
  return (uint8_t)_mm_cvtsi128_si32(z);
}

/* row[0, E) += b[0, E) (E <= 128). */
__attribute__((target("avx2"))) void eldr__add_row_avx2(uint32_t *restrict row, const uint16_t *restrict b, size_t E) {
  size_t e = 0;
  for (; e + 8 <= E; e += 8) {
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + e)));
    const __m256i r = _mm256_loadu_si256((const __m256i *)(const void *)(row + e));
    _mm256_storeu_si256((__m256i *)(void *)(row + e), _mm256_add_epi32(r, x));
  }
  for (; e < E; e++) row[e] += b[e];
}

__attribute__((target("avx2"))) size_t eldr__add_i8_avx2(uint32_t *restrict dst, const int8_t *restrict src,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(src + i)));
    const __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(dst + i));
    _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm256_add_epi32(d, x));
  }
  return i;
}

#else
typedef int counts_avx2_unused; /* not an empty translation unit */
#endif
