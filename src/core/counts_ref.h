/* core/counts_ref.h — the per-id reference counter, for tests and fuzz
 * targets only: one id at a time, range check and increment per id, exactly
 * what eldr_counts_accumulate_masked must reproduce (same return code, same
 * bad index, same counts, partial sums on error included). Not used by the
 * library. Pure computation, no allocation, any thread. */
#ifndef ELDR_CORE_COUNTS_REF_H
#define ELDR_CORE_COUNTS_REF_H

#include "eldr/counts.h"

static inline int eldr__counts_ref(const eldr_shape *s, const void *raw, eldr_sel_dtype dt,
                                   size_t ntokens, const uint8_t *mask, uint32_t *counts,
                                   size_t *bad_index) {
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k;
  size_t idx = 0;
  for (size_t t = 0; t < ntokens; t++)
    for (size_t l = 0; l < L; l++)
      for (size_t k = 0; k < K; k++, idx++) {
        if (mask && !mask[l]) continue;
        int64_t e = eldr_sel_load(raw, dt, idx);
        if (e < 0 || (uint64_t)e >= E) {
          if (bad_index) *bad_index = idx;
          return ELDR_ERANGE;
        }
        counts[l * E + (size_t)e]++;
      }
  return ELDR_OK;
}

#endif
