/* eldr/batch_union.h — the per-layer union of the experts a decode batch's
 * current tokens select: the quantity ELDR minimises, and what the latency
 * model charges a decode step for (eldr_latency_step's union_per_layer).
 * One kernel for the simulator, the emulated worker and the trace
 * statistics.
 *
 * A step: eldr_union_clear, then eldr_union_add_token (or add_bits with a
 * token's precomputed bitset) for every batch member, then eldr_union_count.
 * The set is one bitmap of W = ceil(E / 64) words per layer.
 *
 * Ownership: an eldr_union owns its bitmap (eldr_union_free releases it);
 * token selections and bitsets are borrowed.
 * Errors: eldr_union_init returns ELDR_EINVAL (invalid shape) or ELDR_ENOMEM.
 * Expert ids must be < num_experts (the trace validators guarantee it).
 * Threads: one eldr_union per thread.
 */
#ifndef ELDR_BATCH_UNION_H
#define ELDR_BATCH_UNION_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "eldr/counts.h"

typedef struct eldr_union {
  size_t L, K, W; /* layers, top-k, words per layer */
  uint64_t *bits; /* owned, L * W words */
  uint64_t *scratch; /* owned: eldr_union_rows_ids8's per-position words when
                        W <= 4 and K is not a multiple of 4, else NULL */
} eldr_union;

int eldr_union_init(eldr_union *u, const eldr_shape *s);
void eldr_union_free(eldr_union *u);

/* Words of one token's bitset (L * W) for a shape. */
static inline size_t eldr_union_token_words(const eldr_shape *s) {
  return (size_t)s->num_layers * (((size_t)s->num_experts + 63) / 64);
}

/* OR expert id (< 256) into the four words w[4] of one layer, without a
 * branch or a store per id. */
static inline void eldr_union_bit4(uint64_t w[4], uint32_t id) {
  uint64_t b = 1ULL << (id & 63);
  uint32_t q = id >> 6;
  w[0] |= b & (0 - (uint64_t)(q == 0));
  w[1] |= b & (0 - (uint64_t)(q == 1));
  w[2] |= b & (0 - (uint64_t)(q == 2));
  w[3] |= b & (0 - (uint64_t)(q == 3));
}

/* Set the bits of one token's selections sel[L * K] in bits[L * W]. Up to
 * 256 experts (W <= 4) a layer's K bits are gathered in registers and each
 * word is written once (no read-modify-write chain through memory per
 * selection); more experts: one bit at a time. */
static inline void eldr_union_set_bits(uint64_t *restrict bits, size_t L, size_t K, size_t W,
                                       const uint16_t *restrict sel) {
  if (W <= 2) {
    for (size_t l = 0; l < L; l++, sel += K) {
      uint64_t w0 = 0, w1 = 0;
      for (size_t k = 0; k < K; k++) {
        uint64_t b = 1ULL << (sel[k] & 63), hi = 0 - (uint64_t)(sel[k] >> 6);
        w0 |= b & ~hi;
        w1 |= b & hi;
      }
      bits[l * W] |= w0;
      if (W == 2) bits[l * W + 1] |= w1;
    }
  } else if (W <= 4) {
    for (size_t l = 0; l < L; l++, sel += K) {
      uint64_t w[4] = {0, 0, 0, 0};
      for (size_t k = 0; k < K; k++) {
        eldr_union_bit4(w, sel[k]);
      }
      for (size_t i = 0; i < W; i++) bits[l * W + i] |= w[i];
    }
  } else {
    for (size_t l = 0; l < L; l++) {
      uint64_t *bl = bits + l * W;
      const uint16_t *sl = sel + l * K;
      for (size_t k = 0; k < K; k++) bl[sl[k] >> 6] |= 1ULL << (sl[k] & 63);
    }
  }
}

static inline void eldr_union_clear(eldr_union *u) {
  memset(u->bits, 0, u->L * u->W * sizeof *u->bits);
}

/* Add one token: sel holds its L * K expert ids. */
static inline void eldr_union_add_token(eldr_union *u, const uint16_t *sel) {
  eldr_union_set_bits(u->bits, u->L, u->K, u->W, sel);
}

/* Add one token's precomputed bitset (L * W words, see eldr_union_set_bits). */
static inline void eldr_union_add_bits(eldr_union *u, const uint64_t *restrict tb) {
  uint64_t *restrict b = u->bits;
  const size_t n = u->L * u->W;
  for (size_t i = 0; i < n; i++) b[i] |= tb[i];
}

/* ---- whole batches from compact per-token rows (the simulator's step) ----
 *
 * Two row forms of one decode token's selections:
 *  - bits: L * W words (eldr_union_set_bits);
 *  - ids8: L * K bytes, layer-major, each an expert id < E <= 256 (the
 *    selections as uint8: 1/2 to 1/16 of the bits' bytes for top-1..8 of
 *    128-256 experts), stored with ELDR_UNION_IDS8_PAD readable bytes after
 *    the last row (the kernels load 4 bytes at a time).
 * Both kernels set u to the union of n rows (its previous content is
 * replaced, no eldr_union_clear needed), write the distinct experts per
 * layer into per_layer[L] (may be NULL) and return their sum: the same
 * numbers as clearing u, adding each row's selections and eldr_union_count.
 * AVX-512 (F, BW, VL, VPOPCNTDQ) or else AVX2 where eldr/cpu.h allows
 * (ELDR_NO_SIMD=1 forces the portable loops; all paths give identical
 * bits). n = 0: an empty union. */
#define ELDR_UNION_IDS8_PAD 4
uint64_t eldr_union_rows_bits(eldr_union *u, const uint64_t *const *rows, size_t n,
                              uint32_t *per_layer);
/* ids8 rows need E <= 256 (W <= 4); per_layer as above. */
uint64_t eldr_union_rows_ids8(eldr_union *u, const uint8_t *const *rows, size_t n,
                              uint32_t *per_layer);
/* Each of n ids8 rows' own bitset (the bits form of it, eldr_union_set_bits)
 * into out[j * L * W ...], written whole; u's bitmap is scratch (its
 * content afterwards is unspecified). The same kernels and dispatch. */
void eldr_union_ids8_bits(eldr_union *u, const uint8_t *const *rows, size_t n, uint64_t *out);

/* Distinct experts per layer into per_layer[L] (may be NULL); returns their
 * sum over the layers. (Out of line: a popcnt clone where the CPU has it.) */
uint64_t eldr_union_count(const eldr_union *u, uint32_t *per_layer);

#endif
