/* batch_union_neon.c — the batch-union kernels' NEON twins (see
 * core/batch_union_int.h): bitset rows ORed 8 words (four registers) at a
 * time; ids8 rows eight ids at a time, widened to 64-bit lanes, into
 * one-hot words by a variable shift (ushl: a count of 64 or more, or a
 * negative one, which shifts right, gives 0; the count is the lane's low
 * byte, signed, and every id - 64 w for w < 4 and id < 256 that is not the
 * id's own word lands on 0), layer by layer with the W words of a layer in
 * registers across the members; per-layer counts with cnt and a horizontal
 * add. Built only on aarch64 with GCC or clang. */
#include "core/batch_union_int.h"

#ifdef ELDR_UNION_NEON
#include <arm_neon.h>

uint64_t eldr__union_count_neon(const eldr_union *u, uint32_t *per_layer) {
  const size_t W = u->W;
  uint64_t sum = 0;
  const uint64_t *b = u->bits;
  for (size_t l = 0; l < u->L; l++, b += W) {
    uint8x16_t c = vdupq_n_u8(0); /* at most 64 per byte lane pair: no wrap */
    size_t w = 0;
    for (; w + 2 <= W; w += 2) c = vaddq_u8(c, vcntq_u8(vreinterpretq_u8_u64(vld1q_u64(b + w))));
    uint32_t n = vaddlvq_u8(c);
    if (w < W) n += vaddv_u8(vcnt_u8(vcreate_u8(b[w])));
    if (per_layer) per_layer[l] = n;
    sum += n;
  }
  return sum;
}

void eldr__union_rows_bits_neon(eldr_union *u, const uint64_t *const *rows, size_t n) {
  const size_t nw = u->L * u->W;
  size_t i = 0;
  for (; i + 8 <= nw; i += 8) {
    uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
    for (size_t j = 0; j < n; j++) {
      const uint64_t *r = rows[j] + i;
      a0 = vorrq_u64(a0, vld1q_u64(r));
      a1 = vorrq_u64(a1, vld1q_u64(r + 2));
      a2 = vorrq_u64(a2, vld1q_u64(r + 4));
      a3 = vorrq_u64(a3, vld1q_u64(r + 6));
    }
    uint64_t *o = u->bits + i;
    vst1q_u64(o, a0);
    vst1q_u64(o + 2, a1);
    vst1q_u64(o + 4, a2);
    vst1q_u64(o + 6, a3);
  }
  for (; i < nw; i++) {
    uint64_t a = 0;
    for (size_t j = 0; j < n; j++) a |= rows[j][i];
    u->bits[i] = a;
  }
}

/* The one-hot words of word w of eight ids widened to four pairs of 64-bit
 * lanes, ORed into acc. */
static inline uint64x2_t onehot8(uint64x2_t acc, const int64x2_t v[4], int64_t w) {
  const uint64x2_t one = vdupq_n_u64(1);
  const int64x2_t s = vdupq_n_s64(-64 * w);
  for (int q = 0; q < 4; q++) acc = vorrq_u64(acc, vshlq_u64(one, vaddq_s64(v[q], s)));
  return acc;
}

static inline uint64_t or_lanes(uint64x2_t a) { return vgetq_lane_u64(a, 0) | vgetq_lane_u64(a, 1); }

/* W words per layer (a constant in each instance); K any: eight ids at a
 * time, the rest of a row one by one (eldr_union_bit4). */
static inline __attribute__((always_inline)) void ids8_layers(eldr_union *u, const uint8_t *const *rows,
                                                               size_t n, const size_t W) {
  const size_t L = u->L, K = u->K;
  for (size_t l = 0; l < L; l++) {
    uint64x2_t a[4] = {vdupq_n_u64(0), vdupq_n_u64(0), vdupq_n_u64(0), vdupq_n_u64(0)};
    uint64_t t[4] = {0, 0, 0, 0};
    for (size_t j = 0; j < n; j++) {
      const uint8_t *p = rows[j] + l * K;
      size_t k = 0;
      for (; k + 8 <= K; k += 8) {
        const uint16x8_t h = vmovl_u8(vld1_u8(p + k));
        const uint32x4_t q0 = vmovl_u16(vget_low_u16(h)), q1 = vmovl_high_u16(h);
        const int64x2_t v[4] = {
            vreinterpretq_s64_u64(vmovl_u32(vget_low_u32(q0))), vreinterpretq_s64_u64(vmovl_high_u32(q0)),
            vreinterpretq_s64_u64(vmovl_u32(vget_low_u32(q1))), vreinterpretq_s64_u64(vmovl_high_u32(q1))};
        for (size_t w = 0; w < W; w++) a[w] = onehot8(a[w], v, (int64_t)w);
      }
      for (; k < K; k++) eldr_union_bit4(t, p[k]);
    }
    uint64_t *o = u->bits + l * W;
    for (size_t w = 0; w < W; w++) o[w] = or_lanes(a[w]) | t[w];
  }
}

void eldr__union_rows_ids8_neon(eldr_union *u, const uint8_t *const *rows, size_t n) {
  switch (u->W) {
  case 1: ids8_layers(u, rows, n, 1); break;
  case 2: ids8_layers(u, rows, n, 2); break;
  case 3: ids8_layers(u, rows, n, 3); break;
  default: ids8_layers(u, rows, n, 4); break;
  }
}

#else
typedef int batch_union_neon_unused; /* not an empty translation unit */
#endif
