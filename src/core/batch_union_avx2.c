/* batch_union_avx2.c — the batch-union kernels' AVX2 twins (see
 * core/batch_union_int.h): bitset rows ORed 16 words (four registers) at a
 * time; ids8 rows four ids at a time into one-hot 64-bit words by a
 * variable shift (vpsllvq: a count of 64 or more, or a "negative" one,
 * gives 0), for K a multiple of 4 layer by layer with the W words of a
 * layer in registers across the members, for other K member by member,
 * four consecutive row positions per register into per-position words in
 * u->scratch, folded into layers once per batch; per-layer counts with the
 * popcnt instruction. Built only on x86-64 with GCC or clang. */
#include "core/batch_union_int.h"

#ifdef ELDR_UNION_X86
#include <immintrin.h>
#include <string.h>

#define AVX2_FN __attribute__((target("avx2,popcnt")))

/* eldr_union_count with the popcnt instruction, W a constant per instance. */
AVX2_FN static inline __attribute__((always_inline)) uint64_t
count_w(const eldr_union *u, uint32_t *per_layer, const size_t W) {
  uint64_t sum = 0;
  const uint64_t *b = u->bits;
  for (size_t l = 0; l < u->L; l++, b += W) {
    uint32_t c = 0;
    for (size_t w = 0; w < W; w++) c += (uint32_t)__builtin_popcountll(b[w]);
    if (per_layer) per_layer[l] = c;
    sum += c;
  }
  return sum;
}

AVX2_FN uint64_t eldr__union_count_avx2(const eldr_union *u, uint32_t *per_layer) {
  switch (u->W) {
  case 1: return count_w(u, per_layer, 1);
  case 2: return count_w(u, per_layer, 2);
  case 3: return count_w(u, per_layer, 3);
  default: return count_w(u, per_layer, 4);
  }
}

AVX2_FN void eldr__union_rows_bits_avx2(eldr_union *u, const uint64_t *const *rows, size_t n) {
  const size_t nw = u->L * u->W;
  size_t i = 0;
  for (; i + 16 <= nw; i += 16) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t j = 0; j < n; j++) {
      const __m256i *r = (const __m256i *)(const void *)(rows[j] + i);
      a0 = _mm256_or_si256(a0, _mm256_loadu_si256(r));
      a1 = _mm256_or_si256(a1, _mm256_loadu_si256(r + 1));
      a2 = _mm256_or_si256(a2, _mm256_loadu_si256(r + 2));
      a3 = _mm256_or_si256(a3, _mm256_loadu_si256(r + 3));
    }
    __m256i *o = (__m256i *)(void *)(u->bits + i);
    _mm256_storeu_si256(o, a0);
    _mm256_storeu_si256(o + 1, a1);
    _mm256_storeu_si256(o + 2, a2);
    _mm256_storeu_si256(o + 3, a3);
  }
  for (; i + 4 <= nw; i += 4) {
    __m256i a = _mm256_setzero_si256();
    for (size_t j = 0; j < n; j++)
      a = _mm256_or_si256(a, _mm256_loadu_si256((const __m256i *)(const void *)(rows[j] + i)));
    _mm256_storeu_si256((__m256i *)(void *)(u->bits + i), a);
  }
  for (; i < nw; i++) {
    uint64_t a = 0;
    for (size_t j = 0; j < n; j++) a |= rows[j][i];
    u->bits[i] = a;
  }
}

/* Four ids (bytes) from p, zero-extended to 64-bit lanes. */
AVX2_FN static inline __m256i ids4(const uint8_t *p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(v));
}

AVX2_FN static inline uint64_t or_lanes(__m256i a) {
  __m128i h = _mm_or_si128(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  return (uint64_t)_mm_cvtsi128_si64(h) | (uint64_t)_mm_extract_epi64(h, 1);
}

/* K a multiple of 4, W words per layer (a constant in each instance). */
AVX2_FN static inline __attribute__((always_inline)) void
ids8_layers(eldr_union *u, const uint8_t *const *rows, size_t n, const size_t W) {
  const size_t L = u->L, K = u->K;
  const __m256i one = _mm256_set1_epi64x(1), s64 = _mm256_set1_epi64x(64),
                s128 = _mm256_set1_epi64x(128), s192 = _mm256_set1_epi64x(192);
  for (size_t l = 0; l < L; l++) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t j = 0; j < n; j++) {
      const uint8_t *p = rows[j] + l * K;
      for (size_t k = 0; k < K; k += 4) {
        __m256i v = ids4(p + k);
        a0 = _mm256_or_si256(a0, _mm256_sllv_epi64(one, v));
        if (W > 1) a1 = _mm256_or_si256(a1, _mm256_sllv_epi64(one, _mm256_sub_epi64(v, s64)));
        if (W > 2) a2 = _mm256_or_si256(a2, _mm256_sllv_epi64(one, _mm256_sub_epi64(v, s128)));
        if (W > 3) a3 = _mm256_or_si256(a3, _mm256_sllv_epi64(one, _mm256_sub_epi64(v, s192)));
      }
    }
    uint64_t *o = u->bits + l * W;
    o[0] = or_lanes(a0);
    if (W > 1) o[1] = or_lanes(a1);
    if (W > 2) o[2] = or_lanes(a2);
    if (W > 3) o[3] = or_lanes(a3);
  }
}

/* Any K: member by member, positions 4g..4g+3 of the rows in one register,
 * word w of position p at scratch[(w * G + p / 4) * 4 + p % 4] (the first
 * member stores, the others OR); then each position's words OR into its
 * layer's. W words per layer, a constant in each instance. */
AVX2_FN static inline __attribute__((always_inline)) void
ids8_positions(eldr_union *u, const uint8_t *const *rows, size_t n, const size_t W) {
  const size_t L = u->L, K = u->K, P = L * K, G = eldr__union_groups(u);
  const __m256i one = _mm256_set1_epi64x(1), s64 = _mm256_set1_epi64x(64),
                s128 = _mm256_set1_epi64x(128), s192 = _mm256_set1_epi64x(192);
  __m256i *acc = (__m256i *)(void *)u->scratch;
#define POS_WORDS(V)                                                             \
  __m256i b0 = _mm256_sllv_epi64(one, V), b1 = b0, b2 = b0, b3 = b0;             \
  if (W > 1) b1 = _mm256_sllv_epi64(one, _mm256_sub_epi64(V, s64));              \
  if (W > 2) b2 = _mm256_sllv_epi64(one, _mm256_sub_epi64(V, s128));             \
  if (W > 3) b3 = _mm256_sllv_epi64(one, _mm256_sub_epi64(V, s192))
  if (n) {
    const uint8_t *p = rows[0];
    for (size_t g = 0; g < G; g++) {
      __m256i v = ids4(p + 4 * g);
      POS_WORDS(v);
      _mm256_storeu_si256(acc + g, b0);
      if (W > 1) _mm256_storeu_si256(acc + G + g, b1);
      if (W > 2) _mm256_storeu_si256(acc + 2 * G + g, b2);
      if (W > 3) _mm256_storeu_si256(acc + 3 * G + g, b3);
    }
  }
  for (size_t j = 1; j < n; j++) {
    const uint8_t *p = rows[j];
    for (size_t g = 0; g < G; g++) {
      __m256i v = ids4(p + 4 * g);
      POS_WORDS(v);
#define ACC_OR(I, B) _mm256_storeu_si256(acc + (I), _mm256_or_si256(_mm256_loadu_si256(acc + (I)), B))
      ACC_OR(g, b0);
      if (W > 1) ACC_OR(G + g, b1);
      if (W > 2) ACC_OR(2 * G + g, b2);
      if (W > 3) ACC_OR(3 * G + g, b3);
#undef ACC_OR
    }
  }
#undef POS_WORDS
  memset(u->bits, 0, L * W * sizeof *u->bits);
  if (!n) return;
  for (size_t w = 0; w < W; w++) {
    const uint64_t *s = u->scratch + w * G * 4;
    if (K == 1) { /* a position is a layer */
      for (size_t l = 0; l < L; l++) u->bits[l * W + w] = s[l];
      continue;
    }
    for (size_t q = 0, l = 0, k = 0; q < P; q++) {
      u->bits[l * W + w] |= s[q];
      if (++k == K) {
        k = 0;
        l++;
      }
    }
  }
}

AVX2_FN void eldr__union_rows_ids8_avx2(eldr_union *u, const uint8_t *const *rows, size_t n) {
  if (u->K % 4) {
    switch (u->W) {
    case 1: ids8_positions(u, rows, n, 1); break;
    case 2: ids8_positions(u, rows, n, 2); break;
    case 3: ids8_positions(u, rows, n, 3); break;
    default: ids8_positions(u, rows, n, 4); break;
    }
    return;
  }
  switch (u->W) {
  case 1: ids8_layers(u, rows, n, 1); break;
  case 2: ids8_layers(u, rows, n, 2); break;
  case 3: ids8_layers(u, rows, n, 3); break;
  default: ids8_layers(u, rows, n, 4); break;
  }
}

#else
typedef int batch_union_avx2_unused; /* not an empty translation unit */
#endif
