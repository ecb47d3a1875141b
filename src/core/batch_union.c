/* batch_union.c — the batch-union bitmap's lifetime, its count, and the
 * whole-batch kernels over compact token rows (the per-member kernel is
 * inline in eldr/batch_union.h: it runs once per batch member per step).
 *
 * This file holds the portable kernels and the dispatch; the vector twins
 * are batch_union_avx2.c and batch_union_avx512.c (AVX-512 where the CPU
 * also has VPOPCNTDQ) and batch_union_neon.c (aarch64), chosen by
 * eldr/cpu.h. All give identical bits. */
#include "eldr/batch_union.h"

#include <stdlib.h>

#include "eldr/cpu.h"
#include "eldr/error.h"

#include "core/batch_union_int.h"

#ifdef ELDR_UNION_X86
/* Whether the AVX-512 kernels run: the AVX-512 level is in use (eldr/cpu.h)
 * and the CPU also has VPOPCNTDQ. */
static int avx512_on(void) { return eldr_cpu_feature(ELDR_CPU_VPOPCNTDQ); }
#endif

int eldr_union_init(eldr_union *u, const eldr_shape *s) {
  memset(u, 0, sizeof *u);
  if (!s || eldr_shape_validate(s, NULL)) return ELDR_EINVAL;
  u->L = s->num_layers;
  u->K = s->top_k;
  u->W = ((size_t)s->num_experts + 63) / 64;
  u->bits = calloc(u->L * u->W, sizeof *u->bits);
  if (u->W <= 4 && u->K % 4) { /* eldr_union_rows_ids8's per-position words */
    u->scratch = calloc(u->W * eldr__union_groups(u) * 4, sizeof *u->scratch);
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

/* The per-layer counts of u->bits: the twins take unions of up to 4 words
 * a layer (256 experts), eldr_union_count (popcnt clone) wider ones. */
static uint64_t count_any(const eldr_union *u, uint32_t *per_layer) {
#ifdef ELDR_UNION_X86
  if (u->W <= 4 && avx512_on()) return eldr__union_count_avx512(u, per_layer);
  if (u->W <= 4 && eldr_cpu_has(ELDR_CPU_AVX2)) return eldr__union_count_avx2(u, per_layer);
#endif
#ifdef ELDR_UNION_NEON
  if (u->W <= 4 && eldr_cpu_has(ELDR_CPU_NEON)) return eldr__union_count_neon(u, per_layer);
#endif
  return eldr_union_count(u, per_layer);
}

uint64_t eldr_union_rows_bits(eldr_union *u, const uint64_t *const *rows, size_t n,
                              uint32_t *per_layer) {
#ifdef ELDR_UNION_X86
  if (avx512_on()) eldr__union_rows_bits_avx512(u, rows, n);
  else if (eldr_cpu_has(ELDR_CPU_AVX2)) eldr__union_rows_bits_avx2(u, rows, n);
  else
#endif
#ifdef ELDR_UNION_NEON
  if (eldr_cpu_has(ELDR_CPU_NEON)) eldr__union_rows_bits_neon(u, rows, n);
  else
#endif
    rows_bits_portable(u, rows, n);
  return count_any(u, per_layer);
}

/* u->bits = the union of n ids8 rows. */
static void ids8_union(eldr_union *u, const uint8_t *const *rows, size_t n) {
#ifdef ELDR_UNION_X86
  if (avx512_on()) {
    eldr__union_ids8_avx512(u, rows, n, u->bits);
    return;
  }
  if (eldr_cpu_has(ELDR_CPU_AVX2) && (u->K % 4 == 0 || u->scratch)) {
    eldr__union_rows_ids8_avx2(u, rows, n);
    return;
  }
#endif
#ifdef ELDR_UNION_NEON
  if (eldr_cpu_has(ELDR_CPU_NEON)) {
    eldr__union_rows_ids8_neon(u, rows, n);
    return;
  }
#endif
  rows_ids8_portable(u, rows, n);
}

uint64_t eldr_union_rows_ids8(eldr_union *u, const uint8_t *const *rows, size_t n,
                              uint32_t *per_layer) {
  ids8_union(u, rows, n);
  return count_any(u, per_layer);
}

void eldr_union_ids8_bits(eldr_union *u, const uint8_t *const *rows, size_t n, uint64_t *out) {
  const size_t lw = u->L * u->W;
  for (size_t j = 0; j < n; j++, out += lw) {
#ifdef ELDR_UNION_X86
    if (avx512_on()) { /* straight into out */
      eldr__union_ids8_avx512(u, rows + j, 1, out);
      continue;
    }
#endif
    ids8_union(u, rows + j, 1);
    memcpy(out, u->bits, lw * sizeof *out);
  }
}
