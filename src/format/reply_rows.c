/* reply_rows.c — a reply's rows for the router's watch and recorder (see
 * eldr/reply.h): a decode reply's generated rows counted, a reply tree's
 * prompt rows over the model's MoE layers (eldr_reply_experts_moe_rows:
 * the artifact's layers, else the named model's preset, else the rows
 * less the dense layers' fill). Both read through
 * eldr/reply_experts.h, so every layout is read the one way. */
#define _GNU_SOURCE
#include "eldr/reply.h"

#include <jansson.h>
#include <string.h>

#include "eldr/trace_model.h" /* eldr_counts_rows_check */
#include "eldr/tracegen.h"     /* eldr_tracegen_served_layers */

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

int64_t eldr_reply_decode_counts(const char *body, size_t len, eldr_re_api api, const eldr_shape *shape,
                                 const uint32_t *layer_ids, int64_t prompt_tokens, uint32_t *counts,
                                 int64_t *completion_tokens) {
  const int nul = memchr(body, 0, len) != NULL;
  if (completion_tokens && !nul) {
    static const eldr_js_path ct[] = {{{"usage", "completion_tokens", NULL}}};
    eldr_js_span f;
    int64_t x;
    if (eldr_js_scan(body, len, ct, 1, &f, NULL, NULL) == 0 && eldr_js_int(body, f, &x) == 0 && x >= 0)
      *completion_tokens = x;
  }
  if (!memmem(body, len, "routed_experts", 14)) return -1;
  eldr_re_opts o = {api, shape->num_layers, shape->top_k, shape->num_experts, NULL, NULL, NULL, layer_ids, 0, NULL};
  eldr_reply_experts rex;
  int rc = nul ? eldr_reply_experts_read(body, len, &o, &rex, NULL, NULL)
               : eldr_reply_experts_scan(body, len, &o, &rex, NULL, NULL);
  if (rc) return -1;
  int64_t rows = -1;
  if (nul && completion_tokens) { /* the tree reader's usage, for a body the scanner refuses */
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *ct = json_object_get(json_object_get(root, "usage"), "completion_tokens");
    if (json_is_integer(ct) && json_integer_value(ct) >= 0) *completion_tokens = json_integer_value(ct);
    json_decref(root);
  }
  if (rex.nchoices) {
    eldr_re_view g = rex.choices[0].generated;
    const eldr_re_view *pv = &rex.choices[0].prompt;
    const int64_t pt = prompt_tokens;
    if (!g.rows && pv->data && pt > 0 && (size_t)pt >= pv->first_token && (size_t)pt - pv->first_token < pv->rows) {
      /* a reply without usage: its rows past the prefill's prompt */
      const size_t skip = (size_t)pt - pv->first_token;
      g = *pv;
      g.data = (const uint8_t *)pv->data + skip * pv->layers * pv->top_k * eldr_sel_dtype_size(pv->dtype);
      g.rows = pv->rows - skip;
    }
    if (g.data && g.rows && g.rows <= UINT32_MAX) {
      memset(counts, 0, eldr_shape_cells(shape) * sizeof *counts);
      if (eldr_counts_accumulate(shape, g.data, g.dtype, g.rows, counts, NULL) == 0 &&
          eldr_counts_rows_check(shape, counts, (uint32_t)g.rows, NULL) == 0)
        rows = (int64_t)g.rows;
    }
  }
  eldr_reply_experts_free(&rex);
  return rows;
}

int eldr_reply_prompt_rows(const void *root, eldr_re_api api, uint32_t num_experts, const eldr_shape *art,
                           const uint32_t *art_ids, eldr_reply_experts *rex, eldr_re_view *v, eldr_shape *shape,
                           uint32_t *ids) {
  if (!root || !num_experts || eldr_reply_experts_moe_rows(root, api, num_experts, art, art_ids, rex, ids) != 0)
    return -1;
  const eldr_re_view *p = rex->nchoices ? &rex->choices[0].prompt : NULL;
  if (!p || !p->data || !p->rows || p->rows > UINT32_MAX || p->top_k > num_experts) {
    eldr_reply_experts_free(rex);
    return -1;
  }
  *v = *p;
  *shape = (eldr_shape){(uint32_t)p->layers, num_experts, (uint32_t)p->top_k};
  return 0;
}
