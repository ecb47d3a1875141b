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

/* One loop per dtype so the inner loop has no dispatch. ids are checked
 * against E before use; on the first bad id the flat index is reported. */
#define ELDR_COUNT_LOOP(LOAD)                                                   \
  do {                                                                          \
    size_t idx = 0;                                                             \
    for (size_t t = 0; t < ntokens; t++) {                                      \
      for (size_t l = 0; l < L; l++) {                                          \
        if (mask && !mask[l]) {                                                 \
          idx += K;                                                             \
          continue;                                                             \
        }                                                                       \
        uint32_t *row = counts + l * E;                                         \
        for (size_t k = 0; k < K; k++, idx++) {                                 \
          int64_t e = (LOAD);                                                   \
          if ((uint64_t)e >= E) { /* also catches negative ids */               \
            if (bad_index) *bad_index = idx;                                    \
            return ELDR_ERANGE;                                                 \
          }                                                                     \
          row[e]++;                                                             \
        }                                                                       \
      }                                                                         \
    }                                                                           \
  } while (0)

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
  case ELDR_SEL_U8: ELDR_COUNT_LOOP(eldr_sel_load(p, ELDR_SEL_U8, idx)); break;
  case ELDR_SEL_U16LE: ELDR_COUNT_LOOP(eldr_sel_load(p, ELDR_SEL_U16LE, idx)); break;
  case ELDR_SEL_U16: ELDR_COUNT_LOOP(eldr_sel_load(p, ELDR_SEL_U16, idx)); break;
  case ELDR_SEL_I32LE: ELDR_COUNT_LOOP(eldr_sel_load(p, ELDR_SEL_I32LE, idx)); break;
  case ELDR_SEL_I16LE: ELDR_COUNT_LOOP(eldr_sel_load(p, ELDR_SEL_I16LE, idx)); break;
  case ELDR_SEL_I64LE: ELDR_COUNT_LOOP(eldr_sel_load(p, ELDR_SEL_I64LE, idx)); break;
  default: return ELDR_EINVAL;
  }
  return ELDR_OK;
}
