/* batch_union.c — the batch-union bitmap's lifetime, its count, and the
 * whole-batch kernels over compact token rows (the per-member kernel is
 * inline in eldr/batch_union.h: it runs once per batch member per step).
 *
 * eldr_union_rows_bits ORs the rows 16 words (four AVX2 registers) at a time
 * across the members, so each union word is stored once; eldr_union_rows_ids8
 * turns four ids at a time into one-hot 64-bit words with a variable shift
 * (vpsllvq: a count of 64 or more, or a "negative" one, gives 0, so word w of
 * an id is 1 << (id - 64 w) with no compare): for K a multiple of 4 layer by
 * layer with the W words of a layer in registers across the members; for
 * other K member by member, four consecutive row positions (several layers)
 * per register into per-position words in u->scratch, folded into layers
 * once per batch. The AVX-512 twins (where the CPU has F, BW, VL and
 * VPOPCNTDQ): bitsets 32 words (four zmm) at a time, two rows per vpternlogq
 * OR; ids8 eight row positions per zmm (any K) in registers across the rows,
 * folded into their layers once per batch; per-layer counts by vpopcntq. */
#include "eldr/batch_union.h"

#include <stdlib.h>

#include "eldr/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define UNION_AVX2 1
#endif

/* Groups of four row positions of an ids8 row (L * K bytes). */
static size_t union_groups(const eldr_union *u) { return (u->L * u->K + 3) / 4; }

int eldr_union_init(eldr_union *u, const eldr_shape *s) {
  memset(u, 0, sizeof *u);
  if (!s || eldr_shape_validate(s, NULL)) return ELDR_EINVAL;
  u->L = s->num_layers;
  u->K = s->top_k;
  u->W = ((size_t)s->num_experts + 63) / 64;
  u->bits = calloc(u->L * u->W, sizeof *u->bits);
  if (u->W <= 4 && u->K % 4) { /* eldr_union_rows_ids8's per-position words */
    u->scratch = calloc(u->W * union_groups(u) * 4, sizeof *u->scratch);
    if (!u->scratch) {
      free(u->bits);
      u->bits = NULL;
    }
  }
  return u->bits ? ELDR_OK : ELDR_ENOMEM;
}

void eldr_union_free(eldr_union *u) {
  if (!u) return;
  free(u->bits);
  free(u->scratch);
  u->bits = NULL;
  u->scratch = NULL;
}

/* x86-64's baseline has no popcnt instruction: without a clone the builtin
 * is a libgcc call per word. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define UNION_CLONES __attribute__((target_clones("popcnt", "default")))
#endif
#ifndef UNION_CLONES
#define UNION_CLONES
#endif

UNION_CLONES uint64_t eldr_union_count(const eldr_union *u, uint32_t *per_layer) {
  uint64_t sum = 0;
  for (size_t l = 0; l < u->L; l++) {
    uint32_t cnt = 0;
    const uint64_t *bl = u->bits + l * u->W;
    for (size_t w = 0; w < u->W; w++) cnt += (uint32_t)__builtin_popcountll(bl[w]);
    if (per_layer) per_layer[l] = cnt;
    sum += cnt;
  }
  return sum;
}

/* ---- whole batches of compact rows -------------------------------------- */

static void rows_bits_portable(eldr_union *u, const uint64_t *const *rows, size_t n) {
  const size_t nw = u->L * u->W;
  size_t i = 0;
  for (; i + 8 <= nw; i += 8) {
    uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t j = 0; j < n; j++)
      for (int x = 0; x < 8; x++) a[x] |= rows[j][i + x];
    memcpy(u->bits + i, a, sizeof a);
  }
  for (; i < nw; i++) {
    uint64_t a = 0;
    for (size_t j = 0; j < n; j++) a |= rows[j][i];
    u->bits[i] = a;
  }
}

static void rows_ids8_portable(eldr_union *u, const uint8_t *const *rows, size_t n) {
  const size_t L = u->L, K = u->K, W = u->W;
  for (size_t l = 0; l < L; l++) {
    uint64_t w[4] = {0, 0, 0, 0};
    for (size_t j = 0; j < n; j++) {
      const uint8_t *p = rows[j] + l * K;
      for (size_t k = 0; k < K; k++) eldr_union_bit4(w, p[k]);
    }
    memcpy(u->bits + l * W, w, W * sizeof *w);
  }
}

#ifdef UNION_AVX2
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

AVX2_FN static uint64_t count_avx2(const eldr_union *u, uint32_t *per_layer) {
  switch (u->W) {
  case 1: return count_w(u, per_layer, 1);
  case 2: return count_w(u, per_layer, 2);
  case 3: return count_w(u, per_layer, 3);
  case 4: return count_w(u, per_layer, 4);
  default: return eldr_union_count(u, per_layer);
  }
}

AVX2_FN static void rows_bits_avx2(eldr_union *u, const uint64_t *const *rows, size_t n) {
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
  const size_t L = u->L, K = u->K, P = L * K, G = union_groups(u);
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

AVX2_FN static void rows_ids8_avx2(eldr_union *u, const uint8_t *const *rows, size_t n) {
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

/* ---- AVX-512: eight 64-bit lanes, ternary-logic ORs, vpopcntq ----------- */

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vpopcntdq,avx2,popcnt")))

/* Whether the AVX-512 kernels run: the AVX-512 paths do (eldr__simd_avx512:
 * the one switch, ELDR_NO_AVX512) and the CPU also has VPOPCNTDQ. */
static int avx512_on(void) {
  static int cpu = -1; /* benign race: same value */
  int c = __atomic_load_n(&cpu, __ATOMIC_RELAXED);
  if (c < 0) {
    __builtin_cpu_init();
    c = __builtin_cpu_supports("avx512vpopcntdq");
    __atomic_store_n(&cpu, c, __ATOMIC_RELAXED);
  }
  return c && eldr__simd_avx512();
}

#define OR3 0xfe /* vpternlogq: a | b | c */

/* Per-layer counts with vpopcntq, eight layers at a time (W <= 2). */
AVX512_FN static uint64_t count_avx512(const eldr_union *u, uint32_t *per_layer) {
  const size_t L = u->L, W = u->W;
  if (W > 2) return count_avx2(u, per_layer);
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

AVX512_FN static void rows_bits_avx512(eldr_union *u, const uint64_t *const *rows, size_t n) {
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

AVX512_FN static void ids8_avx512(const eldr_union *u, const uint8_t *const *rows, size_t n,
                                  uint64_t *out) {
  switch (u->W) {
  case 1: ids8_avx512_w(u, rows, n, out, 1); break;
  case 2: ids8_avx512_w(u, rows, n, out, 2); break;
  case 3: ids8_avx512_w(u, rows, n, out, 3); break;
  default: ids8_avx512_w(u, rows, n, out, 4); break;
  }
}
#endif

uint64_t eldr_union_rows_bits(eldr_union *u, const uint64_t *const *rows, size_t n,
                              uint32_t *per_layer) {
#ifdef UNION_AVX2
  if (avx512_on()) {
    rows_bits_avx512(u, rows, n);
    return count_avx512(u, per_layer);
  }
  if (eldr__simd_on()) {
    rows_bits_avx2(u, rows, n);
    return count_avx2(u, per_layer);
  }
#endif
  rows_bits_portable(u, rows, n);
  return eldr_union_count(u, per_layer);
}

/* u->bits = the union of n ids8 rows. */
static void ids8_union(eldr_union *u, const uint8_t *const *rows, size_t n) {
#ifdef UNION_AVX2
  if (avx512_on()) {
    ids8_avx512(u, rows, n, u->bits);
    return;
  }
  if (eldr__simd_on() && (u->K % 4 == 0 || u->scratch)) {
    rows_ids8_avx2(u, rows, n);
    return;
  }
#endif
  rows_ids8_portable(u, rows, n);
}

static uint64_t count_any(const eldr_union *u, uint32_t *per_layer) {
#ifdef UNION_AVX2
  if (avx512_on()) return count_avx512(u, per_layer);
  if (eldr__simd_on()) return count_avx2(u, per_layer);
#endif
  return eldr_union_count(u, per_layer);
}

uint64_t eldr_union_rows_ids8(eldr_union *u, const uint8_t *const *rows, size_t n,
                              uint32_t *per_layer) {
  ids8_union(u, rows, n);
  return count_any(u, per_layer);
}

void eldr_union_ids8_bits(eldr_union *u, const uint8_t *const *rows, size_t n, uint64_t *out) {
  const size_t lw = u->L * u->W;
  for (size_t j = 0; j < n; j++, out += lw) {
#ifdef UNION_AVX2
    if (avx512_on()) { /* straight into out */
      ids8_avx512(u, rows + j, 1, out);
      continue;
    }
#endif
    ids8_union(u, rows + j, 1);
    memcpy(out, u->bits, lw * sizeof *out);
  }
}

int eldr__union_avx512_set(int enable) { return eldr__simd_avx512_set(enable); }
