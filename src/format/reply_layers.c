/* reply_layers.c — the layer axis of routed_experts arrays (see
 * reply_layers_int.h): mappable shapes, dense-layer detection, cutting an
 * all-layers array down to its MoE layers in place, spreading MoE rows over
 * every hidden layer. */
#include "reply_layers_int.h"

#include <string.h>

int eldr__re_layers_mappable(size_t La, uint32_t L, const uint32_t *ids) {
  if (La == L) return 1;
  if (!ids || !L || La < L) return 0;
  for (uint32_t l = 1; l < L; l++)
    if (ids[l] <= ids[l - 1]) return 0;
  /* ids 0..L-1 say every layer is MoE: more rows are another model's (or
   * ids nobody knew, e.g. a record of MoE-only rows), not dense layers */
  return ids[L - 1] < La && ids[L - 1] != L - 1;
}

int eldr_re_layers_fit(size_t array_layers, uint32_t L, const uint32_t *layer_ids) {
  return eldr__re_layers_mappable(array_layers, L, layer_ids);
}

size_t eldr__re_dense_layers(const void *data, eldr_sel_dtype t, size_t rows, size_t La, size_t K,
                             uint8_t *dense) {
  size_t n = 0;
  for (size_t l = 0; l < La; l++) {
    int all_le0 = rows > 0, neg = 0;
    for (size_t r = 0; r < rows && all_le0; r++)
      for (size_t k = 0; k < K; k++) {
        const int64_t e = eldr_sel_load(data, t, (r * La + l) * K + k);
        if (e > 0) {
          all_le0 = 0;
          break;
        }
        neg |= e < 0;
      }
    dense[l] = (uint8_t)(all_le0 && (neg || K >= 2));
    n += dense[l];
  }
  return n;
}

void eldr__re_keep_layers(void *data, size_t isz, size_t rows, size_t La, size_t K, const uint32_t *keep,
                          size_t n) {
  unsigned char *p = data;
  const size_t w = K * isz; /* one layer of one row */
  /* destination i of row t never lies after its source, and two chunks
   * either coincide or do not overlap: a forward walk copies each chunk
   * before anything overwrites it */
  for (size_t t = 0; t < rows; t++) {
    unsigned char *dst = p + t * n * w;
    const unsigned char *src = p + t * La * w;
    switch (w) { /* the common widths as fixed-size copies */
    case 1:
      for (size_t i = 0; i < n; i++) dst[i] = src[keep[i]];
      break;
    case 4:
      for (size_t i = 0; i < n; i++) memmove(dst + 4 * i, src + 4 * (size_t)keep[i], 4);
      break;
    case 8:
      for (size_t i = 0; i < n; i++) memmove(dst + 8 * i, src + 8 * (size_t)keep[i], 8);
      break;
    case 16:
      for (size_t i = 0; i < n; i++) memmove(dst + 16 * i, src + 16 * (size_t)keep[i], 16);
      break;
    default:
      for (size_t i = 0; i < n; i++) memmove(dst + w * i, src + w * keep[i], w);
    }
  }
}

void eldr__re_spread_layers(const uint16_t *in, size_t rows, size_t L, size_t K, const uint32_t *ids, size_t La,
                            uint16_t *out) {
  memset(out, 0, rows * La * K * sizeof *out);
  for (size_t t = 0; t < rows; t++)
    for (size_t l = 0; l < L; l++)
      memcpy(out + (t * La + ids[l]) * K, in + (t * L + l) * K, K * sizeof *out);
}
