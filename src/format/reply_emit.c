/* reply_emit.c — routed_experts written into a reply being built, in every
 * layout vLLM has shipped (eldr/reply_experts.h, "emitting"): the emulated
 * worker's side of the readers in reply_experts.c. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"
#include "reply_layers_int.h"

/* ------------------------------------------------------------------------ */
/* emitting                                                                  */

static json_t *lists_json(const uint16_t *sel, size_t rows, const eldr_shape *s) {
  json_t *a = json_array();
  for (size_t t = 0; a && t < rows; t++) {
    json_t *row = json_array();
    for (size_t l = 0; row && l < s->num_layers; l++) {
      json_t *ks = json_array();
      for (size_t k = 0; ks && k < s->top_k; k++)
        if (json_array_append_new(ks, json_integer(sel[(t * s->num_layers + l) * s->top_k + k])))
          ks = (json_decref(ks), NULL);
      if (!ks || json_array_append_new(row, ks)) row = (json_decref(row), NULL);
    }
    if (!row || json_array_append_new(a, row)) a = (json_decref(a), NULL);
  }
  return a;
}

static json_t *compact_json(const uint16_t *sel, size_t rows, const eldr_shape *s) {
  size_t n = rows * s->num_layers * s->top_k;
  uint8_t *raw = malloc(n * 2 + 1);
  char *txt = malloc(eldr_b64_encoded_len(n * 2) + 1);
  json_t *o = NULL;
  if (raw && txt) {
    for (size_t i = 0; i < n; i++) { /* int16 little-endian */
      raw[2 * i] = (uint8_t)sel[i];
      raw[2 * i + 1] = (uint8_t)(sel[i] >> 8);
    }
    eldr_b64_encode(raw, n * 2, txt);
    o = json_pack("{s:s,s:s,s:[I,i,i],s:s}", "encoding", "base64", "dtype", "int16", "shape",
                  (json_int_t)rows, (int)s->num_layers, (int)s->top_k, "data", txt);
  }
  free(raw);
  free(txt);
  return o;
}

int eldr_reply_experts_emit(void *body, void *choice, eldr_re_layout layout,
                            const uint16_t *prompt, size_t prompt_rows, const uint16_t *gen,
                            size_t gen_rows, const eldr_shape *shape) {
  json_t *b = body, *c = choice;
  if (!c || !shape || eldr_shape_validate(shape, NULL) || (prompt_rows && !prompt) ||
      (gen_rows && !gen) || shape->num_experts > 32768)
    return ELDR_EINVAL;
  const size_t LK = (size_t)shape->num_layers * shape->top_k;
  if (layout == ELDR_RE_LAYOUT_NPY) {
    size_t n = prompt_rows + gen_rows;
    uint16_t *all = malloc((n ? n : 1) * LK * sizeof *all);
    if (!all) return ELDR_ENOMEM;
    if (prompt_rows) memcpy(all, prompt, prompt_rows * LK * sizeof *all);
    if (gen_rows) memcpy(all + prompt_rows * LK, gen, gen_rows * LK * sizeof *all);
    char *b64 = NULL;
    size_t blen = 0;
    int rc = eldr_routed_experts_encode(all, n, shape, ELDR_SEL_U16, &b64, &blen);
    free(all);
    if (rc) return rc;
    rc = json_object_set_new(c, "routed_experts", json_stringn(b64, blen)) ? ELDR_ENOMEM : 0;
    free(b64);
    return rc;
  }
  if (layout == ELDR_RE_LAYOUT_LISTS) { /* the whole sequence, one list */
    json_t *a = lists_json(prompt, prompt_rows, shape), *g = lists_json(gen, gen_rows, shape);
    if (!a || !g || json_array_extend(a, g)) {
      json_decref(a);
      json_decref(g);
      return ELDR_ENOMEM;
    }
    json_decref(g);
    return json_object_set_new(c, "routed_experts", a) ? ELDR_ENOMEM : 0;
  }
  if (layout != ELDR_RE_LAYOUT_V021_LISTS && layout != ELDR_RE_LAYOUT_V021_BASE64)
    return ELDR_EINVAL;
  json_t *(*make)(const uint16_t *, size_t, const eldr_shape *) =
      layout == ELDR_RE_LAYOUT_V021_LISTS ? lists_json : compact_json;
  if (b) {
    json_t *p = make(prompt, prompt_rows, shape);
    if (!p || json_object_set_new(b, "prompt_routed_experts", p)) return ELDR_ENOMEM;
  }
  json_t *g = make(gen, gen_rows, shape);
  if (!g || json_object_set_new(c, "routed_experts", g)) return ELDR_ENOMEM;
  return 0;
}

int eldr_reply_experts_emit_layers(void *body, void *choice, eldr_re_layout layout, const uint16_t *prompt,
                                   size_t prompt_rows, const uint16_t *gen, size_t gen_rows,
                                   const eldr_shape *shape, const uint32_t *layer_ids,
                                   uint32_t hidden_layers) {
  if (!shape || hidden_layers == shape->num_layers)
    return eldr_reply_experts_emit(body, choice, layout, prompt, prompt_rows, gen, gen_rows, shape);
  if (!layer_ids || hidden_layers > ELDR_MAX_LAYERS ||
      !eldr__re_layers_mappable(hidden_layers, shape->num_layers, layer_ids) || (prompt_rows && !prompt) ||
      (gen_rows && !gen))
    return ELDR_EINVAL;
  const size_t row = (size_t)hidden_layers * shape->top_k;
  uint16_t *p = malloc((prompt_rows ? prompt_rows : 1) * row * sizeof *p);
  uint16_t *g = malloc((gen_rows ? gen_rows : 1) * row * sizeof *g);
  int rc = ELDR_ENOMEM;
  if (p && g) {
    if (prompt_rows) eldr__re_spread_layers(prompt, prompt_rows, shape->num_layers, shape->top_k, layer_ids, hidden_layers, p);
    if (gen_rows) eldr__re_spread_layers(gen, gen_rows, shape->num_layers, shape->top_k, layer_ids, hidden_layers, g);
    const eldr_shape all = {hidden_layers, shape->num_experts, shape->top_k};
    rc = eldr_reply_experts_emit(body, choice, layout, prompt_rows ? p : NULL, prompt_rows, gen_rows ? g : NULL,
                                 gen_rows, &all);
  }
  free(p);
  free(g);
  return rc;
}
