/* reply_rows.c — a reply's rows for the router's watch and recorder (see
 * eldr/reply.h): a decode reply's generated rows counted, a reply tree's
 * prompt rows over the model's MoE layers. Both read through
 * eldr/reply_experts.h, so every layout is read the one way. */
#define _GNU_SOURCE
#include "eldr/reply.h"

#include <jansson.h>
#include <string.h>

#include "eldr/trace_model.h" /* eldr_counts_rows_check */

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
  eldr_re_opts o = {api, shape->num_layers, shape->top_k, shape->num_experts, NULL, NULL, NULL, layer_ids, 0};
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
