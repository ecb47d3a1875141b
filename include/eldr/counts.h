/* eldr/counts.h — model shape and per-(layer, expert) selection counts.
 *
 * A "selection array" holds, for each token t, MoE layer l and slot k, the
 * expert chosen: sel[(t * L + l) * K + k]. This is vLLM's routed_experts
 * layout (tokens, layers, top_k) and the trace format's prefill/decode arrays.
 * A "counts" matrix is uint32_t counts[l * E + e]: how many times expert e
 * was selected at MoE layer index l. Traces and vLLM responses go through
 * eldr_counts_accumulate(), the single counting routine.
 *
 * Pure computation: no allocation, no I/O. Thread-safe: no state but the
 * bit-sliced kernel's switch; which vector level runs is eldr/cpu.h's.
 */
#ifndef ELDR_COUNTS_H
#define ELDR_COUNTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "eldr/error.h"

/* Maximums accepted anywhere (guards against absurd headers). */
#define ELDR_MAX_LAYERS 512
#define ELDR_MAX_EXPERTS 4096
#define ELDR_MAX_TOPK 64

/* The MoE model shape the routing works in. */
typedef struct eldr_shape {
  uint32_t num_layers;  /* MoE layers (L) */
  uint32_t num_experts; /* routed experts per layer (E) */
  uint32_t top_k;       /* experts selected per token and layer (K) */
} eldr_shape;

/* 0 if 1 <= L <= ELDR_MAX_LAYERS, 1 <= E <= ELDR_MAX_EXPERTS,
 * 1 <= K <= min(E, ELDR_MAX_TOPK); else ELDR_ERANGE with a message. */
int eldr_shape_validate(const eldr_shape *s, eldr_diag *d);

/* L * E: the number of entries of a counts matrix. */
static inline size_t eldr_shape_cells(const eldr_shape *s) {
  return (size_t)s->num_layers * s->num_experts;
}

/* Element type of a raw selection array. U16 is host order (traces in
 * memory); U8/U16LE/I16LE/I32LE/I64LE are the little-endian wire dtypes. */
typedef enum eldr_sel_dtype {
  ELDR_SEL_U8 = 0,
  ELDR_SEL_U16LE,
  ELDR_SEL_I32LE,
  ELDR_SEL_U16, /* host-order uint16_t, as stored in eldr_request */
  ELDR_SEL_I16LE, /* '<i2': vLLM's compact int16 routed_experts */
  ELDR_SEL_I64LE, /* '<i8': numpy's default integer */
} eldr_sel_dtype;

/* Bytes per element of a dtype. */
size_t eldr_sel_dtype_size(eldr_sel_dtype t);

/* Element i of a raw selection array of that dtype (any alignment), as a
 * signed value (negative ids of signed dtypes stay negative). Inline: with a
 * constant dtype the switch folds away. */
static inline int64_t eldr_sel_load(const void *raw, eldr_sel_dtype t, size_t i) {
  const unsigned char *p = (const unsigned char *)raw;
  switch (t) {
  case ELDR_SEL_U8: return p[i];
  case ELDR_SEL_U16LE: return (int64_t)p[2 * i] | (int64_t)p[2 * i + 1] << 8;
  case ELDR_SEL_U16: {
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    return v;
  }
  case ELDR_SEL_I16LE: return (int16_t)(uint16_t)((unsigned)p[2 * i] | (unsigned)p[2 * i + 1] << 8);
  case ELDR_SEL_I32LE:
    return (int32_t)((uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                     (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24);
  case ELDR_SEL_I64LE: {
    uint64_t u = 0;
    for (int b = 7; b >= 0; b--) u = u << 8 | p[8 * i + (size_t)b];
    return (int64_t)u;
  }
  }
  return -1;
}

/* Add the selections of ntokens tokens (raw points at ntokens * L * K
 * elements of the given dtype, any alignment) into counts (L * E, caller's
 * buffer, NOT zeroed here). Returns 0, or ELDR_ERANGE if any expert id is
 * negative or >= E; then *bad_index (if non-NULL) receives the flat element
 * index of the first bad id and counts may hold a partial sum. */
int eldr_counts_accumulate(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                           size_t ntokens, uint32_t *counts, size_t *bad_index);

/* As eldr_counts_accumulate, but only layers l with mask[l] != 0 are counted
 * (and range-checked); the rows of other layers are not counted. mask
 * (L flags) may be NULL for all layers. Used on the router's hot path, where
 * the signature needs only the artifact's layer mask. Blocks of tokens are
 * range-checked a vector at a time (AVX2 where eldr_cpu_has says), then counted
 * by kernels unrolled for the common top_k; results (return code, bad index,
 * partial sums) are exactly those of the per-id loop of core/counts_ref.h. */
int eldr_counts_accumulate_masked(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                                  size_t ntokens, const uint8_t *mask, uint32_t *counts,
                                  size_t *bad_index);

/* The bit planes a counting pass keeps of each 16-token block (the
 * signature cache's block, ELDR_BLOCK_TOKENS), so that storing the block's
 * row later converts them instead of counting its ids again
 * (eldr_sigshard_store_planes). Kept by the bit-sliced kernels only (1-byte
 * ids, top_k 8, at most 128 experts, at least four masked layers, a level
 * with such a kernel); per block, one group of four masked layers after
 * another, ELDR_PLANES_GROUP_BYTES each (the counts 0..16 of the group's
 * 4 x 128 (layer, expert) cells as five bit planes, in the layout of the
 * level that wrote them: `format`). The mask's last nl % 4 layers are not
 * in them. The caller owns buf (cap bytes); blocks that do not fit are not
 * kept. Filled by eldr_counts_accumulate_planes; read, never written, by
 * the store. */
#define ELDR_PLANES_GROUP_BYTES 320
typedef struct eldr_count_planes {
  uint8_t *buf;        /* caller's: cap bytes */
  size_t cap;
  /* out */
  const void *origin;  /* the raw pointer of block 0's first token */
  size_t nblocks;      /* blocks 0..nblocks-1 from origin kept (0: none) */
  size_t ngroups;      /* groups a block: masked layers / 4 */
  size_t block_bytes;  /* ngroups * ELDR_PLANES_GROUP_BYTES */
  size_t row_bytes;    /* one token's bytes in raw (L * 8) */
  int format;          /* the eldr_cpu_level whose kernel wrote them */
} eldr_count_planes;

/* As eldr_counts_accumulate_masked; with planes (may be NULL) also the
 * blocks' bit planes the bit-sliced kernel computed (planes->nblocks = 0
 * when it did not run, or not from the first token). Same results and
 * errors. */
int eldr_counts_accumulate_planes(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype, size_t ntokens,
                                  const uint8_t *mask, uint32_t *counts, size_t *bad_index,
                                  eldr_count_planes *planes);

/* Range check only: 0 when every id of the mask's layers (NULL: all) is in
 * [0, E); else ELDR_ERANGE with the flat index of the first bad one in
 * *bad_index (may be NULL). ELDR_EINVAL for an unknown dtype. */
int eldr_counts_check_masked(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                             size_t ntokens, const uint8_t *mask, size_t *bad_index);

/* Allow (1) or forbid (0) the bit-sliced kernel of
 * eldr_counts_accumulate_masked (1-byte ids, top_k 8, at most 128 experts;
 * it runs where eldr_cpu_has(ELDR_CPU_AVX2)), leaving the per-id kernels:
 * for tests and benchmarks that compare the two on one CPU (`eldr bench
 * route`). Returns the previous state. Process-wide; not while another
 * thread counts. Allowed by default. */
int eldr_counts_bits_set(int enable);

#endif
