/* batch_union_avx512.c — the batch-union kernels' AVX-512 twins (see
 * core/batch_union_int.h): eight 64-bit lanes, ternary-logic ORs, vpopcntq.
 * Bitsets 32 words (four zmm) at a time, two rows per vpternlogq OR; ids8
 * eight row positions per zmm (any K) in registers across the rows, folded
 * into their layers once per batch; per-layer counts by vpopcntq. Built
 * only on x86-64 with GCC or clang. */
#include "core/batch_union_int.h"

#ifdef ELDR_UNION_X86
#include <immintrin.h>
#include <string.h>

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vpopcntdq,avx2,popcnt")))

#define OR3 0xfe /* vpternlogq: a | b | c */

/* Per-layer counts with vpopcntq, eight layers at a time (W <= 2). */
AVX512_FN uint64_t eldr__union_count_avx512(const eldr_union *u, uint32_t *per_layer) {
  const size_t L = u->L, W = u->W;
  if (W > 2) return eldr__union_count_avx2(u, per_layer);
  const __m512i ev = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0),
                od = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
  __m512i sum = _mm512_setzero_si512();
  for (size_t l = 0; l < L; l += 8) {
    const size_t m = L - l < 8 ? L - l : 8;
    const __mmask8 k = (__mmask8)((1u << m) - 1);
    __m512i c;
    if (W == 1) {
      c = _mm512_popcnt_epi64(_mm512_maskz_loadu_epi64(k, u->bits + l));
    } else { /* words 2l.. : layer pairs of words, evens and odds added */
      const size_t m0 = m < 4 ? m : 4, m1 = m - m0;
      const __mmask8 k0 = (__mmask8)((1u << (2 * m0)) - 1), k1 = (__mmask8)((1u << (2 * m1)) - 1);
      __m512i a = _mm512_popcnt_epi64(_mm512_maskz_loadu_epi64(k0, u->bits + 2 * l));
      __m512i b = _mm512_popcnt_epi64(_mm512_maskz_loadu_epi64(k1, u->bits + 2 * l + 8));
      c = _mm512_add_epi64(_mm512_permutex2var_epi64(a, ev, b), _mm512_permutex2var_epi64(a, od, b));
    }
    sum = _mm512_add_epi64(sum, c);
    if (per_layer) _mm256_mask_storeu_epi32(per_layer + l, k, _mm512_cvtepi64_epi32(c));
  }
  return (uint64_t)_mm512_reduce_add_epi64(sum);
}

/* OR of words i.. (8 x NV of them, the lanes of mask m in the last) over
 * the n rows into u->bits: two rows per vpternlogq. */
AVX512_FN static inline __attribute__((always_inline)) void
bits_block(eldr_union *u, const uint64_t *const *rows, size_t n, size_t i, const int NV, __mmask8 m) {
  __m512i a[4];
  for (int x = 0; x < NV; x++) a[x] = _mm512_setzero_si512();
#define LD(P, X) (X == NV - 1 ? _mm512_maskz_loadu_epi64(m, (P) + 8 * (X)) : _mm512_loadu_si512((P) + 8 * (X)))
  size_t j = 0;
  for (; j + 2 <= n; j += 2) {
    const uint64_t *p = rows[j] + i, *q = rows[j + 1] + i;
    for (int x = 0; x < NV; x++) a[x] = _mm512_ternarylogic_epi64(a[x], LD(p, x), LD(q, x), OR3);
  }
  if (j < n)
    for (int x = 0; x < NV; x++) a[x] = _mm512_or_si512(a[x], LD(rows[j] + i, x));
#undef LD
  for (int x = 0; x < NV; x++) {
    if (x == NV - 1) _mm512_mask_storeu_epi64(u->bits + i + 8 * x, m, a[x]);
    else _mm512_storeu_si512(u->bits + i + 8 * x, a[x]);
  }
}

AVX512_FN void eldr__union_rows_bits_avx512(eldr_union *u, const uint64_t *const *rows, size_t n) {
  const size_t nw = u->L * u->W;
  size_t i = 0;
  for (; i + 32 <= nw; i += 32) bits_block(u, rows, n, i, 4, 0xff);
  for (; i < nw; i += 8) {
    const size_t r = nw - i < 8 ? nw - i : 8;
    bits_block(u, rows, n, i, 1, (__mmask8)((1u << r) - 1));
  }
}

/* The one-hot words of row positions c..c+7 (the lanes of mask m; the
 * others read as id 0) ORed over the n rows: acc[w] lane i has bit e where
 * some row holds id 64 w + e at position c + i (vpsllvq of 1 by id - 64 w:
 * counts outside 0..63 give 0). W words per layer and FULL (m is all eight
 * lanes) constants per instance. */
AVX512_FN static inline __attribute__((always_inline)) void
onehot8(const uint8_t *const *rows, size_t n, size_t c, __mmask8 m, __m512i acc[4], const size_t W,
        const int FULL) {
  const __m512i one = _mm512_set1_epi64(1), s64 = _mm512_set1_epi64(64),
                s128 = _mm512_set1_epi64(128), s192 = _mm512_set1_epi64(192);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
#define IDS(P)                                                                          \
  _mm512_cvtepu8_epi64(FULL ? _mm_loadl_epi64((const __m128i *)(const void *)(P))      \
                            : _mm_maskz_loadu_epi8((__mmask16)m, (P)))
#define HOT(V, S) _mm512_sllv_epi64(one, _mm512_sub_epi64((V), S))
  size_t j = 0;
  for (; j + 2 <= n; j += 2) {
    const __m512i v = IDS(rows[j] + c), y = IDS(rows[j + 1] + c);
    a0 = _mm512_ternarylogic_epi64(a0, _mm512_sllv_epi64(one, v), _mm512_sllv_epi64(one, y), OR3);
    if (W > 1) a1 = _mm512_ternarylogic_epi64(a1, HOT(v, s64), HOT(y, s64), OR3);
    if (W > 2) a2 = _mm512_ternarylogic_epi64(a2, HOT(v, s128), HOT(y, s128), OR3);
    if (W > 3) a3 = _mm512_ternarylogic_epi64(a3, HOT(v, s192), HOT(y, s192), OR3);
  }
  if (j < n) {
    const __m512i v = IDS(rows[j] + c);
    a0 = _mm512_or_si512(a0, _mm512_sllv_epi64(one, v));
    if (W > 1) a1 = _mm512_or_si512(a1, HOT(v, s64));
    if (W > 2) a2 = _mm512_or_si512(a2, HOT(v, s128));
    if (W > 3) a3 = _mm512_or_si512(a3, HOT(v, s192));
  }
#undef HOT
#undef IDS
  acc[0] = a0;
  acc[1] = a1;
  acc[2] = a2;
  acc[3] = a3;
}

/* Fold the eight lanes of acc (m row positions from layer l's position k)
 * into their layers of out; advances l and k past them. */
AVX512_FN static inline __attribute__((always_inline)) void
fold8(size_t K, const __m512i acc[4], size_t m, size_t *l, size_t *k, uint64_t *out, const size_t W) {
  if (K % 8 == 0) { /* the eight positions are of one layer */
    uint64_t *o = out + *l * W;
    for (size_t w = 0; w < W; w++) o[w] |= (uint64_t)_mm512_reduce_or_epi64(acc[w]);
    if ((*k += 8) == K) {
      *k = 0;
      ++*l;
    }
    return;
  }
  uint64_t lane[4][8];
  for (size_t w = 0; w < W; w++) _mm512_storeu_si512(lane[w], acc[w]);
  for (size_t i = 0; i < m; i++) {
    for (size_t w = 0; w < W; w++) out[*l * W + w] |= lane[w][i];
    if (++*k == K) {
      *k = 0;
      ++*l;
    }
  }
}

/* out[L * W] = the union of n ids8 rows, eight row positions at a time in
 * registers across the rows, then folded into their layers (any K). */
AVX512_FN static inline __attribute__((always_inline)) void
ids8_avx512_w(const eldr_union *u, const uint8_t *const *rows, size_t n, uint64_t *out, const size_t W) {
  const size_t K = u->K, P = u->L * K;
  memset(out, 0, u->L * W * sizeof *out);
  __m512i acc[4];
  size_t c = 0, l = 0, k = 0; /* position c is layer l's k-th */
  for (; c + 8 <= P; c += 8) {
    onehot8(rows, n, c, 0xff, acc, W, 1);
    fold8(K, acc, 8, &l, &k, out, W);
  }
  if (c < P) {
    onehot8(rows, n, c, (__mmask8)((1u << (P - c)) - 1), acc, W, 0);
    fold8(K, acc, P - c, &l, &k, out, W);
  }
}

AVX512_FN void eldr__union_ids8_avx512(const eldr_union *u, const uint8_t *const *rows, size_t n,
                                       uint64_t *out) {
  switch (u->W) {
  case 1: ids8_avx512_w(u, rows, n, out, 1); break;
  case 2: ids8_avx512_w(u, rows, n, out, 2); break;
  case 3: ids8_avx512_w(u, rows, n, out, 3); break;
  default: ids8_avx512_w(u, rows, n, out, 4); break;
  }
}

#else
typedef int batch_union_avx512_unused; /* not an empty translation unit */
#endif
