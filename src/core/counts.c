#include "eldr/counts.h"

#include <string.h>

int eldr_shape_validate(const eldr_shape *s, eldr_diag *d) {
  if (!s) return eldr_diag_fail(d, ELDR_EINVAL, "model shape missing");
  if (s->num_layers < 1 || s->num_layers > ELDR_MAX_LAYERS)
    return eldr_diag_fail(d, ELDR_ERANGE, "num_layers %u out of range [1, %d]", s->num_layers,
                          ELDR_MAX_LAYERS);
  if (s->num_experts < 1 || s->num_experts > ELDR_MAX_EXPERTS)
    return eldr_diag_fail(d, ELDR_ERANGE, "num_experts %u out of range [1, %d]", s->num_experts,
                          ELDR_MAX_EXPERTS);
  if (s->top_k < 1 || s->top_k > ELDR_MAX_TOPK || s->top_k > s->num_experts)
    return eldr_diag_fail(d, ELDR_ERANGE, "top_k %u out of range [1, min(num_experts=%u, %d)]",
                          s->top_k, s->num_experts, ELDR_MAX_TOPK);
  return ELDR_OK;
}

size_t eldr_sel_dtype_size(eldr_sel_dtype t) {
  switch (t) {
  case ELDR_SEL_U8: return 1;
  case ELDR_SEL_U16LE: return 2;
  case ELDR_SEL_U16: return 2;
  case ELDR_SEL_I32LE: return 4;
  case ELDR_SEL_I16LE: return 2;
  case ELDR_SEL_I64LE: return 8;
  }
  return 0;
}

/* One loop per dtype so the inner loop has no dispatch. Each (token, layer)
 * row of K ids is range-checked a row at a time: GET reads id k of the row
 * as an unsigned integer of the element's width (a negative id of a signed
 * dtype reads as >= 2^15 > ELDR_MAX_EXPERTS), the row's maximum is compared
 * with E once, and a clean row is counted without per-id branches. A row
 * holding a bad id is recounted by the checked per-id loop, so the counts
 * before the first bad id and the reported flat index are exactly those of
 * a per-id check. (Partial histograms do not help here: consecutive ids of
 * one row go to one layer's row but are distinct experts, and the next
 * increment of the same cell is L * K ids later, so there is no
 * store-to-load chain to break.) */
#define ELDR_COUNT_LOOP(UT, GET, DT)                                            \
  do {                                                                          \
    size_t idx = 0;                                                             \
    for (size_t t = 0; t < ntokens; t++) {                                      \
      for (size_t l = 0; l < L; l++, idx += K) {                                \
        if (mask && !mask[l]) continue;                                         \
        uint32_t *row = counts + l * E;                                         \
        const unsigned char *q = p + idx * sizeof(UT);                          \
        UT mx = 0;                                                              \
        for (size_t k = 0; k < K; k++) {                                        \
          UT v = GET(q, k);                                                     \
          mx = v > mx ? v : mx;                                                 \
        }                                                                       \
        if ((uint64_t)mx < E) {                                                 \
          for (size_t k = 0; k < K; k++) row[GET(q, k)]++;                      \
          continue;                                                             \
        }                                                                       \
        for (size_t k = 0; k < K; k++) {                                        \
          int64_t e = eldr_sel_load(p, DT, idx + k);                            \
          if ((uint64_t)e >= E) { /* also catches negative ids */               \
            if (bad_index) *bad_index = idx + k;                                \
            return ELDR_ERANGE;                                                 \
          }                                                                     \
          row[e]++;                                                             \
        }                                                                       \
      }                                                                         \
    }                                                                           \
  } while (0)

/* Unsigned little-endian (or host-order, G16H) element k of a row. */
#define G8(q, k) ((q)[k])
#define G16(q, k) ((uint16_t)((unsigned)(q)[2 * (k)] | (unsigned)(q)[2 * (k) + 1] << 8))
static inline uint16_t g16h(const unsigned char *q, size_t k) {
  uint16_t v;
  memcpy(&v, q + 2 * k, 2);
  return v;
}
#define G16H(q, k) g16h(q, k)
#define G32(q, k)                                                                               \
  ((uint32_t)(q)[4 * (k)] | (uint32_t)(q)[4 * (k) + 1] << 8 | (uint32_t)(q)[4 * (k) + 2] << 16 | \
   (uint32_t)(q)[4 * (k) + 3] << 24)
static inline uint64_t g64(const unsigned char *q, size_t k) {
  uint64_t u = 0;
  for (int b = 7; b >= 0; b--) u = u << 8 | q[8 * k + (size_t)b];
  return u;
}
#define G64(q, k) g64(q, k)

int eldr_counts_accumulate(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                           size_t ntokens, uint32_t *counts, size_t *bad_index) {
  return eldr_counts_accumulate_masked(s, raw, dtype, ntokens, NULL, counts, bad_index);
}

int eldr_counts_accumulate_masked(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                                  size_t ntokens, const uint8_t *mask, uint32_t *counts,
                                  size_t *bad_index) {
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k;
  const unsigned char *p = raw;
  switch (dtype) {
  case ELDR_SEL_U8: ELDR_COUNT_LOOP(uint8_t, G8, ELDR_SEL_U8); break;
  case ELDR_SEL_U16LE: ELDR_COUNT_LOOP(uint16_t, G16, ELDR_SEL_U16LE); break;
  case ELDR_SEL_U16: ELDR_COUNT_LOOP(uint16_t, G16H, ELDR_SEL_U16); break;
  case ELDR_SEL_I32LE: ELDR_COUNT_LOOP(uint32_t, G32, ELDR_SEL_I32LE); break;
  case ELDR_SEL_I16LE: ELDR_COUNT_LOOP(uint16_t, G16, ELDR_SEL_I16LE); break;
  case ELDR_SEL_I64LE: ELDR_COUNT_LOOP(uint64_t, G64, ELDR_SEL_I64LE); break;
  default: return ELDR_EINVAL;
  }
  return ELDR_OK;
}
