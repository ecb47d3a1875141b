/* counts_avx512.c — the counting code's AVX-512 twins (see core/counts_int.h):
 * the bit-sliced group kernel of counts_avx2.c and the int8 row add. Same
 * job, same output, fewer instructions:
 *
 * - A group's four rows of one token become one 512-bit vector whose 128-bit
 *   lane r is row r's set (qword 2r: ids 0..63, qword 2r+1: ids 64..127), so
 *   plane bit p is (row p / 128, expert p % 128) and a flush stores the
 *   counts in order. Per id slot k, one byte permutation (vpermb, zeroing)
 *   puts id k of each row in the low byte of its two qwords (the high qword
 *   reads the row's ids minus 64, which wrap to >= 192 below 64), and one
 *   variable shift of 1 sets its bit; an id >= 64 (low qword) or outside
 *   [64, 128) (high qword) shifts the bit out, as in the AVX2 kernel. The
 *   eight one-hots are ORed three at a time (vpternlog).
 * - The carry-save tree's adders are two vpternlog each (xor3, majority)
 *   instead of five operations.
 * - The sixteens plane goes to 512 byte counters through mask registers:
 *   vpermb spreads each plane byte over eight, vptestmb picks its bits.
 *
 * Built only on x86-64 with GCC or clang; runs only where
 * eldr_cpu_has(ELDR_CPU_AVX512) (eldr/cpu.h: AVX-512 F, BW, VL and VBMI, and
 * no ELDR_NO_AVX512 / ELDR_NO_SIMD). */
#include "core/counts_int.h"

#ifdef ELDR_COUNTS_X86
#include <immintrin.h>
#include <string.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))
#define GROUP ELDR_BITS_GROUP

/* l: a ^ b ^ c; h: majority(a, b, c) */
T512 static inline void csa(__m512i *h, __m512i *l, __m512i a, __m512i b, __m512i c) {
  *h = _mm512_ternarylogic_epi64(a, b, c, 0xE8);
  *l = _mm512_ternarylogic_epi64(a, b, c, 0x96);
}

/* The four rows at p + off[0..3] in bytes 0..31, the same minus 64 in 32..63. */
T512 static inline __m512i rows(const unsigned char *p, const uint32_t *off, int contig) {
  /* bytes 32..63 minus 64: one subtraction of the broadcast rows */
  const __m512i m64 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi8(64), 1);
  __m512i v;
  if (contig) {
    v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(p + off[0])));
  } else {
    uint64_t r[4];
    for (int i = 0; i < 4; i++) memcpy(&r[i], p + off[i], 8);
    v = _mm512_broadcast_i64x4(
        _mm256_setr_epi64x((long long)r[0], (long long)r[1], (long long)r[2], (long long)r[3]));
  }
  return _mm512_sub_epi8(v, m64);
}

typedef struct planes {
  __m512i ones, twos, fours, eights;
} planes;

/* One token's group of four rows as four 128-bit sets. */
T512 static inline __m512i row_sets(const unsigned char *p, const uint32_t *off, int contig,
                                    const __m512i *sel) {
  const __mmask64 low = 0x0101010101010101ULL;
  const __m512i one = _mm512_set1_epi64(1), v = rows(p, off, contig);
#define HOT(k) _mm512_sllv_epi64(one, _mm512_maskz_permutexvar_epi8(low, sel[k], v))
  __m512i a = _mm512_ternarylogic_epi64(HOT(0), HOT(1), HOT(2), 0xFE);
  a = _mm512_ternarylogic_epi64(a, HOT(3), HOT(4), 0xFE);
  a = _mm512_ternarylogic_epi64(a, HOT(5), HOT(6), 0xFE);
  return _mm512_or_si512(a, HOT(7));
#undef HOT
}

/* SEL[k]: id k of row r into byte 0 of qword 2r (from bytes 0..31) and of
 * qword 2r + 1 (from bytes 32..63, the ids minus 64); 0 elsewhere (masked) */
static const unsigned char SEL[8][64] = {
#define Q(r, k) 8 * r + k, 0, 0, 0, 0, 0, 0, 0, 32 + 8 * r + k, 0, 0, 0, 0, 0, 0, 0
#define K8(k) {Q(0, k), Q(1, k), Q(2, k), Q(3, k)}
    K8(0), K8(1), K8(2), K8(3), K8(4), K8(5), K8(6), K8(7)
#undef K8
#undef Q
};

/* byte i of SPREAD[c]: plane byte 8c + i / 8 (for plane_bits) */
static const unsigned char SPREAD[8][64] = {
#define S8(b) b, b, b, b, b, b, b, b
#define ROW(c) {S8(8 * c), S8(8 * c + 1), S8(8 * c + 2), S8(8 * c + 3), S8(8 * c + 4), S8(8 * c + 5), S8(8 * c + 6), S8(8 * c + 7)}
    ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6), ROW(7)
#undef ROW
#undef S8
};

/* Bit i of the mask: position 64c + i of plane is set (i < 64). */
T512 static inline __mmask64 plane_bits(__m512i plane, int c) {
  const __m512i bit = _mm512_set1_epi64((long long)0x8040201008040201ULL);
  return _mm512_test_epi8_mask(_mm512_permutexvar_epi8(_mm512_loadu_si512(SPREAD[c]), plane), bit);
}

/* The sets of 16 tokens' rows of one group (p: the first token, tb bytes
 * apart) through a Harley-Seal carry-save tree into the carried planes of
 * s; returns the sixteens plane. Each set is built where the tree takes it. */
T512 static inline __attribute__((always_inline)) __m512i tree16(planes *sp, const unsigned char *p, size_t tb,
                                                                 const uint32_t *off, int contig,
                                                                 const __m512i *sel) {
  planes s = *sp;
  __m512i tA, tB, fA, fB, eA, eB, sixteens;
#define R(i) row_sets(p + (i) * tb, off, contig, sel)
  csa(&tA, &s.ones, s.ones, R(0), R(1));
  csa(&tB, &s.ones, s.ones, R(2), R(3));
  csa(&fA, &s.twos, s.twos, tA, tB);
  csa(&tA, &s.ones, s.ones, R(4), R(5));
  csa(&tB, &s.ones, s.ones, R(6), R(7));
  csa(&fB, &s.twos, s.twos, tA, tB);
  csa(&eA, &s.fours, s.fours, fA, fB);
  csa(&tA, &s.ones, s.ones, R(8), R(9));
  csa(&tB, &s.ones, s.ones, R(10), R(11));
  csa(&fA, &s.twos, s.twos, tA, tB);
  csa(&tA, &s.ones, s.ones, R(12), R(13));
  csa(&tB, &s.ones, s.ones, R(14), R(15));
  csa(&fB, &s.twos, s.twos, tA, tB);
  csa(&eB, &s.fours, s.fours, fA, fB);
  csa(&sixteens, &s.eights, s.eights, eA, eB);
#undef R
  *sp = s;
  return sixteens;
}

/* Positions 64c .. 64c + 63 as bytes: ones + 2 twos + 4 fours + 8 eights. */
T512 static inline __m512i plane_bytes(const planes *s, int c) {
  __m512i b = _mm512_maskz_mov_epi8(plane_bits(s->ones, c), _mm512_set1_epi8(1));
  b = _mm512_mask_add_epi8(b, plane_bits(s->twos, c), b, _mm512_set1_epi8(2));
  b = _mm512_mask_add_epi8(b, plane_bits(s->fours, c), b, _mm512_set1_epi8(4));
  return _mm512_mask_add_epi8(b, plane_bits(s->eights, c), b, _mm512_set1_epi8(8));
}

/* A block's planes b (its own count, 0..16; b16: its sixteens) added into
 * the carried planes s; returns the carry of weight 16 (see counts_avx2.c). */
T512 static inline __m512i add_block(planes *s, const planes *b, __m512i b16) {
  __m512i c1, c2, c4, c8;
  c1 = _mm512_and_si512(s->ones, b->ones);
  s->ones = _mm512_xor_si512(s->ones, b->ones);
  csa(&c2, &s->twos, s->twos, b->twos, c1);
  csa(&c4, &s->fours, s->fours, b->fours, c2);
  csa(&c8, &s->eights, s->eights, b->eights, c4);
  return _mm512_or_si512(c8, b16);
}

T512 size_t eldr__bits_group512(const unsigned char *p, size_t tb, size_t ntok, const uint32_t *off,
                                uint16_t *out, unsigned char *kept, size_t pstride) {
  const int contig = off[1] == off[0] + 8 && off[2] == off[0] + 16 && off[3] == off[0] + 24;
  __m512i sel[8];
  for (int k = 0; k < 8; k++) sel[k] = _mm512_loadu_si512(SEL[k]);
  const __m512i z = _mm512_setzero_si512();
  planes s = {z, z, z, z};
  __m512i cnt[8];
  for (int c = 0; c < 8; c++) cnt[c] = z;
  for (size_t t = 0; t < ntok; t += GROUP, p += GROUP * tb) {
    __m512i sixteens;
    if (kept) { /* the block from empty planes, kept, then added */
      planes b = {z, z, z, z};
      const __m512i b16 = tree16(&b, p, tb, off, contig, sel);
      _mm512_storeu_si512(kept, b.ones);
      _mm512_storeu_si512(kept + 64, b.twos);
      _mm512_storeu_si512(kept + 128, b.fours);
      _mm512_storeu_si512(kept + 192, b.eights);
      _mm512_storeu_si512(kept + 256, b16);
      kept += pstride;
      sixteens = add_block(&s, &b, b16);
    } else {
      sixteens = tree16(&s, p, tb, off, contig, sel);
    }
    for (int c = 0; c < 8; c++) /* a set bit adds one */
      cnt[c] = _mm512_mask_sub_epi8(cnt[c], plane_bits(sixteens, c), cnt[c], _mm512_set1_epi8(-1));
  }
  /* 16 x sixteens + 8 x eights + 4 x fours + 2 x twos + ones, per position */
  __m512i sum = _mm512_setzero_si512();
  const __m512i ones16 = _mm512_set1_epi16(1);
  for (int c = 0; c < 8; c++) {
    __m512i b = plane_bytes(&s, c);
    const __m512i lo = _mm512_add_epi16(
        _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(cnt[c])), 4),
        _mm512_cvtepu8_epi16(_mm512_castsi512_si256(b)));
    const __m512i hi = _mm512_add_epi16(
        _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(cnt[c], 1)), 4),
        _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(b, 1)));
    _mm512_storeu_si512(out + 64 * c, lo);
    _mm512_storeu_si512(out + 64 * c + 32, hi);
    sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_madd_epi16(lo, ones16),
                                                 _mm512_madd_epi16(hi, ones16)));
  }
  return (size_t)_mm512_reduce_add_epi32(sum);
}

/* One 16-token block of one group into bytes (see core/counts_int.h). */
T512 size_t eldr__bits_block16_512(const unsigned char *p, size_t tb, const uint32_t *off, uint8_t *out) {
  const int contig = off[1] == off[0] + 8 && off[2] == off[0] + 16 && off[3] == off[0] + 24;
  __m512i sel[8];
  for (int k = 0; k < 8; k++) sel[k] = _mm512_loadu_si512(SEL[k]);
  const __m512i z = _mm512_setzero_si512();
  planes s = {z, z, z, z};
  const __m512i sixteens = tree16(&s, p, tb, off, contig, sel);
  __m512i sum = z;
  for (int c = 0; c < 8; c++) {
    __m512i b = plane_bytes(&s, c);
    b = _mm512_mask_add_epi8(b, plane_bits(sixteens, c), b, _mm512_set1_epi8(16));
    _mm512_storeu_si512(out + 64 * c, b);
    sum = _mm512_add_epi64(sum, _mm512_sad_epu8(b, z));
  }
  return (size_t)_mm512_reduce_add_epi64(sum);
}

/* One group-block's planes in this kernel's layout (core/counts_int.h)
 * into 4 x 128 byte counts; returns their largest. */
T512 uint8_t eldr__planes_bytes512(const unsigned char *gp, uint8_t *out) {
  const planes s = {_mm512_loadu_si512(gp), _mm512_loadu_si512(gp + 64), _mm512_loadu_si512(gp + 128),
                    _mm512_loadu_si512(gp + 192)};
  const __m512i sixteens = _mm512_loadu_si512(gp + 256);
  const int any16 = _mm512_test_epi64_mask(sixteens, sixteens) != 0; /* mostly empty: then not expanded */
  __m512i mx = _mm512_setzero_si512();
  for (int c = 0; c < 8; c++) {
    __m512i b = plane_bytes(&s, c);
    if (any16) b = _mm512_mask_add_epi8(b, plane_bits(sixteens, c), b, _mm512_set1_epi8(16));
    _mm512_storeu_si512(out + 64 * c, b);
    mx = _mm512_max_epu8(mx, b);
  }
  __m256i y = _mm256_max_epu8(_mm512_castsi512_si256(mx), _mm512_extracti64x4_epi64(mx, 1));
  __m128i x = _mm_max_epu8(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  x = _mm_max_epu8(x, _mm_srli_si128(x, 8));
  x = _mm_max_epu8(x, _mm_srli_si128(x, 4));
  x = _mm_max_epu8(x, _mm_srli_si128(x, 2));
  x = _mm_max_epu8(x, _mm_srli_si128(x, 1));
  return (uint8_t)_mm_cvtsi128_si32(x);
}

/* dst[0, i) += src[0, i) sign-extended, 16 at a time; returns i. */
T512 size_t eldr__add_i8_512(uint32_t *restrict dst, const int8_t *restrict src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_add_epi32(_mm512_loadu_si512(dst + i), x));
  }
  return i;
}

#else
typedef int counts_avx512_unused; /* not an empty translation unit */
#endif
