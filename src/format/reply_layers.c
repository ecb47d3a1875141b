/* reply_layers.c — the layer axis of routed_experts arrays (see
 * reply_layers_int.h): mappable shapes, dense-layer detection, cutting an
 * all-layers array down to its MoE layers in place, spreading MoE rows over
 * every hidden layer. */
#include "reply_layers_int.h"

#include <jansson.h>
#include <string.h>

#include "eldr/reply_experts.h"
#include "eldr/tracegen.h"

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

/* The view layers' model ids after a read with num_layers L at lids (NULL:
 * 0..L-1), or with drop_dense. */
static void view_ids(const eldr_reply_experts *r, uint32_t L, const uint32_t *lids, uint32_t *ids) {
  const eldr_re_view *v = r->nchoices ? (r->choices[0].prompt.data ? &r->choices[0].prompt : &r->choices[0].generated)
                                      : NULL;
  const size_t n = v && v->data ? v->layers : L;
  for (size_t l = 0; l < n && l < ELDR_MAX_LAYERS; l++)
    ids[l] = r->layer_ids ? r->layer_ids[l] : lids && L == n ? lids[l] : (uint32_t)l;
}

int eldr_reply_experts_moe_rows(const void *root, eldr_re_api api, uint32_t num_experts, const eldr_shape *art,
                                const uint32_t *art_ids, eldr_reply_experts *out, uint32_t *ids) {
  eldr_re_opts o = {.api = api, .num_experts = num_experts};
  int rc = ELDR_ESHAPE;
  if (art) {
    o.num_layers = art->num_layers;
    o.layer_ids = art_ids;
    if ((rc = eldr_reply_experts_from_json(root, &o, out, NULL, NULL)) == 0) {
      view_ids(out, art->num_layers, art_ids, ids);
      return 0;
    }
  }
  /* the preset the reply's model names: its MoE layers when the arrays have its layers */
  eldr_shape ps;
  uint32_t pid[ELDR_MAX_LAYERS], hidden;
  json_t *m = json_object_get((const json_t *)root, "model");
  if (json_is_string(m) && eldr_tracegen_served_layers(json_string_value(m), &ps, pid, &hidden) == 0) {
    o = (eldr_re_opts){.api = api, .num_experts = num_experts, .num_layers = ps.num_layers, .top_k = ps.top_k,
                       .layer_ids = pid};
    if ((rc = eldr_reply_experts_from_json(root, &o, out, NULL, NULL)) == 0 &&
        (!out->array_layers || out->array_layers == hidden || out->array_layers == ps.num_layers)) {
      view_ids(out, ps.num_layers, pid, ids);
      return 0;
    }
    if (rc == 0) eldr_reply_experts_free(out);
  }
  o = (eldr_re_opts){.api = api, .num_experts = num_experts, .drop_dense = 1};
  if ((rc = eldr_reply_experts_from_json(root, &o, out, NULL, NULL)) == 0) view_ids(out, 0, NULL, ids);
  return rc;
}
