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
} eldr_union;

int eldr_union_init(eldr_union *u, const eldr_shape *s);
void eldr_union_free(eldr_union *u);

/* Words of one token's bitset (L * W) for a shape. */
static inline size_t eldr_union_token_words(const eldr_shape *s) {
  return (size_t)s->num_layers * (((size_t)s->num_experts + 63) / 64);
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
        uint64_t b = 1ULL << (sel[k] & 63);
        uint32_t q = (uint32_t)(sel[k] >> 6);
        w[0] |= b & (0 - (uint64_t)(q == 0));
        w[1] |= b & (0 - (uint64_t)(q == 1));
        w[2] |= b & (0 - (uint64_t)(q == 2));
        w[3] |= b & (0 - (uint64_t)(q == 3));
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

/* Add a whole batch at once: the union of n tokens' selection rows (each
 * L * K ids); for short rows layer by layer in registers (no store until a
 * layer's words are complete). The same bits as n calls of
 * eldr_union_add_token. */
static inline void eldr_union_add_tokens(eldr_union *u, const uint16_t *const *rows, size_t n) {
  const size_t L = u->L, K = u->K, W = u->W;
  /* layer by layer across the rows pays when a row is a few cache lines
   * (top-1: 48 bytes); long rows (top-8: 768 bytes) go member by member */
  if (W > 2 || L * K > 128) {
    for (size_t j = 0; j < n; j++) eldr_union_set_bits(u->bits, L, K, W, rows[j]);
    return;
  }
  for (size_t l = 0; l < L; l++) {
    uint64_t w0 = 0, w1 = 0;
    for (size_t j = 0; j < n; j++) {
      const uint16_t *sl = rows[j] + l * K;
      for (size_t k = 0; k < K; k++) {
        uint64_t b = 1ULL << (sl[k] & 63), hi = 0 - (uint64_t)(sl[k] >> 6);
        w0 |= b & ~hi;
        w1 |= b & hi;
      }
    }
    u->bits[l * W] |= w0;
    if (W == 2) u->bits[l * W + 1] |= w1;
  }
}

/* Add a whole batch of precomputed token bitsets (each L * W words): eight
 * words (one cache line) at a time across the rows, in registers. The same
 * bits as n calls of eldr_union_add_bits. */
static inline void eldr_union_add_bits_rows(eldr_union *u, const uint64_t *const *rows, size_t n) {
  const size_t nw = u->L * u->W;
  size_t i = 0;
  for (; i + 8 <= nw; i += 8) {
    uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t j = 0; j < n; j++) {
      const uint64_t *r = rows[j] + i;
      for (int x = 0; x < 8; x++) a[x] |= r[x];
    }
    for (int x = 0; x < 8; x++) u->bits[i + x] |= a[x];
  }
  for (; i < nw; i++) {
    uint64_t a = 0;
    for (size_t j = 0; j < n; j++) a |= rows[j][i];
    u->bits[i] |= a;
  }
}

/* Distinct experts per layer into per_layer[L] (may be NULL); returns their
 * sum over the layers. (Out of line: a popcnt clone where the CPU has it.) */
uint64_t eldr_union_count(const eldr_union *u, uint32_t *per_layer);

#endif
