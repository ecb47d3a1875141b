/* reply_sglang.c — SGLang's routed_experts wire form (eldr/reply_sglang.h):
 * base64 of raw int32 rows over the model's hidden layers. */
#include "eldr/reply_sglang.h"

#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"
#include "eldr/routed_experts.h"

static void put_i32le(uint8_t *p, int32_t v) {
  uint32_t u = (uint32_t)v;
  p[0] = (uint8_t)u;
  p[1] = (uint8_t)(u >> 8);
  p[2] = (uint8_t)(u >> 16);
  p[3] = (uint8_t)(u >> 24);
}

static int32_t get_i32le(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

int eldr_sglang_experts_emit(const uint16_t *sel, size_t rows, const eldr_shape *shape,
                             const uint32_t *layer_ids, uint32_t hidden, char **out, size_t *out_len) {
  *out = NULL;
  if (!shape || (!sel && rows) || !shape->num_layers || !shape->top_k) return ELDR_EINVAL;
  const uint32_t L = shape->num_layers, K = shape->top_k;
  uint32_t last = layer_ids ? layer_ids[L - 1] : L - 1;
  if (hidden <= last || hidden > 4 * ELDR_MAX_LAYERS) return ELDR_EINVAL;
  size_t cells = (size_t)hidden * K;
  if (rows > SIZE_MAX / 4 / (cells ? cells : 1)) return ELDR_EINVAL;
  size_t nbytes = rows * cells * 4;
  uint8_t *raw = calloc(nbytes ? nbytes : 1, 1);
  char *b = raw ? malloc(eldr_b64_encoded_len(nbytes) + 1) : NULL;
  if (!raw || !b) {
    free(raw);
    free(b);
    return ELDR_ENOMEM;
  }
  for (size_t t = 0; t < rows; t++)
    for (uint32_t l = 0; l < L; l++) {
      uint32_t h = layer_ids ? layer_ids[l] : l;
      for (uint32_t k = 0; k < K; k++)
        put_i32le(raw + ((t * hidden + h) * K + k) * 4, sel[(t * L + l) * K + k]);
    }
  eldr_b64_encode(raw, nbytes, b);
  free(raw);
  *out = b;
  if (out_len) *out_len = eldr_b64_encoded_len(nbytes);
  return 0;
}

static int fail(eldr_re_reason *why, eldr_re_reason r, eldr_diag *d, int code, const char *msg, size_t a,
                size_t b) {
  *why = r;
  return eldr_diag_fail(d, code, "SGLang routed_experts: %s (%zu, %zu)", msg, a, b);
}

int eldr_sglang_experts_read(const char *b64, size_t len, const eldr_sglang_opts *o, uint8_t **buf,
                             size_t *cap, uint32_t *hidden, uint32_t *counts, eldr_re_reason *why,
                             eldr_diag *d) {
  eldr_re_reason dummy;
  if (!why) why = &dummy;
  *why = ELDR_RE_OK;
  if (!b64 || !o || !buf || !cap || !hidden || !o->num_layers || !o->top_k || !o->num_experts ||
      o->num_layers > ELDR_MAX_LAYERS || o->top_k > ELDR_MAX_TOPK)
    return fail(why, ELDR_RE_BAD_SHAPE, d, ELDR_EINVAL, "bad arguments", 0, 0);
  const uint32_t L = o->num_layers, K = o->top_k, E = o->num_experts;
  size_t maxraw = eldr_b64_decoded_max(len);
  /* decode in place of the caller's buffer: the raw array first, the MoE
   * rows written after it (their bytes: rows x L x K x 4, never more than
   * the raw array's when it is valid) */
  if (!o->rows) return fail(why, ELDR_RE_LENGTH_MISMATCH, d, ELDR_EPARSE, "no rows expected", 0, 0);
  if (o->rows > SIZE_MAX / 8 / ((size_t)L * K))
    return fail(why, ELDR_RE_TOO_LARGE, d, ELDR_ERANGE, "too many rows", o->rows, 0);
  /* the payload must hold rows x (last MoE layer + 1) x K int32: checked
   * before anything is allocated (a reply's usage names the rows) */
  uint32_t last_id = o->layer_ids ? o->layer_ids[L - 1] : L - 1;
  if (last_id >= 4 * ELDR_MAX_LAYERS || o->rows > maxraw / ((size_t)K * 4 * ((size_t)last_id + 1)))
    return fail(why, ELDR_RE_LENGTH_MISMATCH, d, ELDR_EPARSE, "payload too short for (rows, MoE layers)", len, o->rows);
  size_t outb = o->rows * L * K * 4;
  if (maxraw > SIZE_MAX - outb) return fail(why, ELDR_RE_TOO_LARGE, d, ELDR_ERANGE, "too large", len, 0);
  size_t need = maxraw + outb;
  if (need > *cap) {
    uint8_t *q = realloc(*buf, need);
    if (!q) return fail(why, ELDR_RE_NO_MEMORY, d, ELDR_ENOMEM, "out of memory", need, 0);
    *buf = q;
    *cap = need;
  }
  size_t n = 0;
  eldr_diag d2 = {{0}};
  if (eldr_b64_decode(b64, len, *buf, maxraw, &n, &d2) != 0) {
    *why = ELDR_RE_BAD_BASE64;
    return eldr_diag_fail(d, ELDR_EPARSE, "SGLang routed_experts: %s", d2.msg);
  }
  size_t per_layer = o->rows * K * 4;
  if (n % per_layer) return fail(why, ELDR_RE_LENGTH_MISMATCH, d, ELDR_EPARSE, "bytes not a whole number of (rows x top_k) int32 layers", n, o->rows);
  size_t H = n / per_layer;
  uint32_t last = o->layer_ids ? o->layer_ids[L - 1] : L - 1;
  if (H <= last || H > 4 * ELDR_MAX_LAYERS)
    return fail(why, ELDR_RE_LENGTH_MISMATCH, d, ELDR_EPARSE, "hidden layers (of rows) do not hold the MoE layers", H, o->rows);
  for (uint32_t l = 1; o->layer_ids && l < L; l++)
    if (o->layer_ids[l] <= o->layer_ids[l - 1])
      return fail(why, ELDR_RE_BAD_SHAPE, d, ELDR_EINVAL, "layer ids not increasing", l, 0);
  const uint8_t *raw = *buf;
  uint8_t *dst = *buf + maxraw;
  for (size_t t = 0; t < o->rows; t++)
    for (uint32_t l = 0; l < L; l++) {
      uint32_t h = o->layer_ids ? o->layer_ids[l] : l;
      int keep = !o->layer_mask || o->layer_mask[l];
      for (uint32_t k = 0; k < K; k++) {
        int32_t v = keep ? get_i32le(raw + ((t * H + h) * K + k) * 4) : 0;
        if (v < 0) return fail(why, ELDR_RE_NEGATIVE_ID, d, ELDR_ERANGE, "negative expert id at (token, layer)", t, l);
        if ((uint32_t)v >= E)
          return fail(why, ELDR_RE_ID_OUT_OF_RANGE, d, ELDR_ERANGE, "expert id >= num_experts at (token, layer)", t, l);
        put_i32le(dst + ((t * L + l) * K + k) * 4, v);
      }
    }
  /* the rows to the front of the buffer, where the caller reads them */
  memmove(*buf, dst, outb);
  *hidden = (uint32_t)H;
  if (counts) {
    eldr_shape sh = {L, E, K};
    int rc = o->layer_mask ? eldr_counts_accumulate_masked(&sh, *buf, ELDR_SEL_I32LE, o->rows, o->layer_mask, counts, NULL)
                           : eldr_counts_accumulate(&sh, *buf, ELDR_SEL_I32LE, o->rows, counts, NULL);
    if (rc) return fail(why, ELDR_RE_ID_OUT_OF_RANGE, d, rc, "counting failed", o->rows, 0);
  }
  return 0;
}

int eldr_sglang_reply_experts(const char *doc, size_t n, const eldr_sglang_opts *o, uint8_t **buf, size_t *cap,
                              uint32_t *hidden, size_t *rows, uint32_t *counts, eldr_re_reason *why, eldr_diag *d) {
  eldr_re_reason dummy;
  if (!why) why = &dummy;
  *why = ELDR_RE_OK;
  *rows = 0;
  if (!doc || !o) return fail(why, ELDR_RE_BAD_SHAPE, d, ELDR_EINVAL, "bad arguments", 0, 0);
  static const eldr_js_path paths[5] = {{{"sglext", NULL}},
                                        {{"sglext", "routed_experts", NULL}},
                                        {{"meta_info", "routed_experts", NULL}},
                                        {{"usage", "prompt_tokens", NULL}},
                                        {{"meta_info", "prompt_tokens", NULL}}};
  eldr_js_span f[5], root;
  eldr_diag d2 = {{0}};
  int src = eldr_js_scan(doc, n, paths, 5, f, &root, &d2);
  if (!src && root.type == ELDR_JS_ARRAY) {
    /* a batched /generate reply: a list of items; the first item's rows */
    eldr_js_iter it;
    eldr_js_span e0;
    eldr_js_iter_array(&it, doc, root);
    if (eldr_js_next_elem(&it, &e0) && e0.type == ELDR_JS_OBJECT)
      return eldr_sglang_reply_experts(doc + e0.off, e0.len, o, buf, cap, hidden, rows, counts, why, d);
    *why = ELDR_RE_NOT_JSON;
    return eldr_diag_fail(d, ELDR_EPARSE, "SGLang reply: a list whose first item is not a JSON object");
  }
  if (src || root.type != ELDR_JS_OBJECT) {
    *why = ELDR_RE_NOT_JSON;
    return eldr_diag_fail(d, ELDR_EPARSE, "SGLang reply: not a JSON object%s%s", d2.msg[0] ? ": " : "", d2.msg);
  }
  if (f[0].type != ELDR_JS_NONE && f[0].type != ELDR_JS_OBJECT && f[0].type != ELDR_JS_NULL) {
    *why = ELDR_RE_BAD_TYPE;
    return eldr_diag_fail(d, ELDR_EINVAL, "SGLang reply: 'sglext' is not an object");
  }
  eldr_js_span v = f[1].type != ELDR_JS_NONE ? f[1] : f[2];
  if (v.type == ELDR_JS_NONE || v.type == ELDR_JS_NULL) return 1;
  if (v.type != ELDR_JS_STRING) {
    *why = ELDR_RE_BAD_TYPE;
    return eldr_diag_fail(d, ELDR_EINVAL, "SGLang reply: routed_experts is not a base64 string");
  }
  eldr_sglang_opts oo = *o;
  if (!oo.rows) {
    eldr_js_span pt = f[3].type != ELDR_JS_NONE ? f[3] : f[4];
    int64_t x = 0;
    if (pt.type != ELDR_JS_INTEGER || eldr_js_int(doc, pt, &x) || x < 1) {
      *why = ELDR_RE_BAD_TYPE;
      return eldr_diag_fail(d, ELDR_EINVAL, "SGLang reply: routed_experts without a positive usage.prompt_tokens "
                                            "(the rows are the prompt's tokens)");
    }
    oo.rows = (size_t)x;
  }
  *rows = oo.rows;
  const char *s = doc + v.off + 1;
  size_t sl = v.len - 2;
  if (!memchr(s, '\\', sl)) return eldr_sglang_experts_read(s, sl, &oo, buf, cap, hidden, counts, why, d);
  char *tmp = malloc(sl ? sl : 1);
  size_t tl = 0;
  if (!tmp) return fail(why, ELDR_RE_NO_MEMORY, d, ELDR_ENOMEM, "out of memory", sl, 0);
  int rc = eldr_js_string(doc, v, tmp, sl, &tl) ? fail(why, ELDR_RE_BAD_TYPE, d, ELDR_EINVAL, "bad string", sl, 0)
                                                : eldr_sglang_experts_read(tmp, tl, &oo, buf, cap, hidden, counts, why, d);
  free(tmp);
  return rc;
}
