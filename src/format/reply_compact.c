/* reply_compact.c — the compact signature form: per-(MoE layer, expert)
 * prompt counts in kv_transfer_params (see eldr/reply_compact.h). */
#include "eldr/reply_compact.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/routed_experts.h"

#define SAT 65535u

static int failr(eldr_re_reason *why, eldr_re_reason r, eldr_diag *d, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int failr(eldr_re_reason *why, eldr_re_reason r, eldr_diag *d, int err, const char *fmt, ...) {
  if (why) *why = r;
  if (d) {
    va_list ap;
    va_start(ap, fmt);
    char m[sizeof d->msg];
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return eldr_diag_fail(d, err, ELDR_COMPACT_KEY ": %s", m);
  }
  return err;
}

static int str_is(const char *doc, eldr_js_span v, const char *lit) {
  const size_t n = strlen(lit);
  return v.type == ELDR_JS_STRING && v.len == n + 2 && !memcmp(doc + v.off + 1, lit, n);
}

/* An integer member in [lo, hi]: 0 and *x, or -1. */
static int int_in(const char *doc, eldr_js_span v, int64_t lo, int64_t hi, int64_t *x) {
  return v.type == ELDR_JS_INTEGER && eldr_js_int(doc, v, x) == 0 && *x >= lo && *x <= hi ? 0 : -1;
}

/* Row r of the uint16 payload, checked against T and K unless saturated:
 * 0, or the bad_counts reason. */
static int row_ok(const uint8_t *p, uint32_t E, size_t T, uint32_t K, uint32_t layer, eldr_re_reason *why,
                  eldr_diag *d) {
  uint64_t sum = 0;
  int sat = 0;
  for (uint32_t e = 0; e < E; e++) {
    const uint32_t c = (uint32_t)p[2 * e] | (uint32_t)p[2 * e + 1] << 8;
    sat |= c == SAT;
    if (c > T && c != SAT)
      return failr(why, ELDR_RE_BAD_COUNTS, d, ELDR_ERANGE, "layer %u expert %u counted %u times in %zu tokens",
                   layer, e, c, T);
    sum += c;
  }
  if (!sat && sum != (uint64_t)T * K)
    return failr(why, ELDR_RE_BAD_COUNTS, d, ELDR_ERANGE,
                 "layer %u sums to %llu, not %zu tokens x top-%u", layer, (unsigned long long)sum, T, K);
  return 0;
}

int eldr_compact_read(const char *doc, eldr_js_span v, const eldr_compact_opts *o, uint32_t *counts,
                      uint32_t *ids, eldr_compact_info *info, eldr_re_reason *why, eldr_diag *d) {
  if (why) *why = ELDR_RE_OK;
  memset(info, 0, sizeof *info);
  if (v.type != ELDR_JS_OBJECT)
    return failr(why, ELDR_RE_BAD_TYPE, d, ELDR_EPARSE, "must be an object");
  static const char *const keys[8] = {"encoding", "dtype", "shape", "layers", "top_k", "tokens", "first_token", "data"};
  eldr_js_span f[8];
  for (int i = 0; i < 8; i++) f[i] = (eldr_js_span){0, 0, ELDR_JS_NONE};
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, doc, v);
  while (eldr_js_next(&it, &m))
    for (int i = 0; i < 8; i++)
      if (eldr_js_key_is(doc, m.key, keys[i])) f[i] = m.value;
  if (!str_is(doc, f[0], "base64"))
    return failr(why, ELDR_RE_UNKNOWN_ENCODING, d, ELDR_EUNSUPPORTED, "'encoding' must be \"base64\"");
  if (!str_is(doc, f[1], "uint16"))
    return failr(why, ELDR_RE_UNKNOWN_DTYPE, d, ELDR_EUNSUPPORTED, "'dtype' must be \"uint16\"");
  int64_t R = 0, E = 0, K = 0, T = 0, F = 0;
  eldr_js_iter si;
  eldr_js_span x, x2, x3;
  int shape_ok = f[2].type == ELDR_JS_ARRAY;
  if (shape_ok) {
    eldr_js_iter_array(&si, doc, f[2]);
    shape_ok = eldr_js_next_elem(&si, &x) && eldr_js_next_elem(&si, &x2) && !eldr_js_next_elem(&si, &x3) &&
               int_in(doc, x, 1, ELDR_MAX_LAYERS, &R) == 0 && int_in(doc, x2, 1, ELDR_MAX_EXPERTS, &E) == 0;
  }
  if (!shape_ok)
    return failr(why, ELDR_RE_BAD_SHAPE, d, ELDR_ESHAPE, "'shape' must be [layers, experts] within [1, %d] x [1, %d]",
                 ELDR_MAX_LAYERS, ELDR_MAX_EXPERTS);
  if (int_in(doc, f[4], 1, E < ELDR_MAX_TOPK ? E : ELDR_MAX_TOPK, &K))
    return failr(why, ELDR_RE_BAD_SHAPE, d, ELDR_ESHAPE, "'top_k' must be an integer in [1, %lld]",
                 (long long)(E < ELDR_MAX_TOPK ? E : ELDR_MAX_TOPK));
  if (int_in(doc, f[5], 0, INT64_MAX / ELDR_MAX_TOPK, &T))
    return failr(why, ELDR_RE_BAD_TYPE, d, ELDR_EPARSE, "'tokens' must be an integer >= 0");
  if (f[6].type != ELDR_JS_NONE && f[6].type != ELDR_JS_NULL && int_in(doc, f[6], 0, INT64_MAX, &F))
    return failr(why, ELDR_RE_BAD_TYPE, d, ELDR_EPARSE, "'first_token' must be an integer >= 0");
  /* the rows' model layers */
  uint32_t rl[ELDR_MAX_LAYERS];
  size_t nl = 0;
  if (f[3].type != ELDR_JS_ARRAY)
    return failr(why, ELDR_RE_BAD_SHAPE, d, ELDR_ESHAPE, "'layers' must list the rows' model layers");
  eldr_js_iter_array(&si, doc, f[3]);
  while (eldr_js_next_elem(&si, &x)) {
    int64_t id;
    if (nl >= (size_t)R || int_in(doc, x, nl ? rl[nl - 1] + 1 : 0, 65535, &id))
      return failr(why, ELDR_RE_BAD_SHAPE, d, ELDR_ESHAPE,
                   "'layers' must be %lld strictly increasing layer ids", (long long)R);
    rl[nl++] = (uint32_t)id;
  }
  if (nl != (size_t)R)
    return failr(why, ELDR_RE_BAD_SHAPE, d, ELDR_ESHAPE, "'layers' has %zu ids for %lld rows", nl, (long long)R);
  if ((o->num_experts && (uint32_t)E != o->num_experts) || (o->top_k && (uint32_t)K != o->top_k))
    return failr(why, ELDR_RE_SHAPE_MISMATCH, d, ELDR_ESHAPE,
                 "%lld experts x top-%lld disagree with the artifact (%u experts, top-%u)", (long long)E, (long long)K,
                 o->num_experts, o->top_k);
  /* the payload */
  if (f[7].type != ELDR_JS_STRING) return failr(why, ELDR_RE_BAD_TYPE, d, ELDR_EPARSE, "'data' must be a string");
  const size_t need = (size_t)R * (size_t)E * 2, tl = f[7].len - 2;
  uint8_t *buf = malloc(eldr_b64_decoded_max(tl) + 1);
  if (!buf) return failr(why, ELDR_RE_NO_MEMORY, d, ELDR_ENOMEM, "out of memory");
  size_t n = 0;
  eldr_diag bd = {{0}};
  if (eldr_b64_decode(doc + f[7].off + 1, tl, buf, eldr_b64_decoded_max(tl) + 1, &n, &bd)) {
    free(buf);
    return failr(why, ELDR_RE_BAD_BASE64, d, ELDR_EPARSE, "'data': %s", bd.msg);
  }
  if (n != need) {
    free(buf);
    return failr(why, ELDR_RE_LENGTH_MISMATCH, d, ELDR_EPARSE, "'data' is %zu bytes, shape [%lld, %lld] needs %zu", n,
                 (long long)R, (long long)E, need);
  }
  info->tokens = (size_t)T;
  info->first_token = (size_t)F;
  info->rows = (uint32_t)R;
  info->experts = (uint32_t)E;
  info->top_k = (uint32_t)K;
  int rc = 0;
  if (o->num_layers) { /* the artifact's layers, by id; only the masked rows read */
    for (uint32_t l = 0; l < o->num_layers && !rc; l++) {
      const uint32_t id = o->layer_ids ? o->layer_ids[l] : l;
      size_t lo = 0, hi = nl; /* rl is strictly increasing */
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (rl[mid] < id) lo = mid + 1;
        else hi = mid;
      }
      const size_t r = lo;
      if (r == nl || rl[r] != id) {
        rc = failr(why, ELDR_RE_SHAPE_MISMATCH, d, ELDR_ESHAPE, "no row for the artifact's layer %u", id);
        break;
      }
      if (o->layer_mask && !o->layer_mask[l]) continue;
      const uint8_t *p = buf + r * (size_t)E * 2;
      if ((rc = row_ok(p, (uint32_t)E, (size_t)T, (uint32_t)K, id, why, d))) break;
      for (int64_t e = 0; counts && e < E; e++)
        counts[l * (size_t)E + (size_t)e] += (uint32_t)p[2 * e] | (uint32_t)p[2 * e + 1] << 8;
      info->layers++;
    }
  } else { /* every row a MoE layer can have made: a dense layer's zero ids count expert 0 T x K times */
    for (size_t r = 0; r < nl && !rc; r++) {
      const uint8_t *p = buf + r * (size_t)E * 2;
      const uint32_t c0 = (uint32_t)p[0] | (uint32_t)p[1] << 8;
      if (K >= 2 && c0 > T && c0 != SAT) continue;
      if ((rc = row_ok(p, (uint32_t)E, (size_t)T, (uint32_t)K, rl[r], why, d))) break;
      for (int64_t e = 0; counts && e < E; e++)
        counts[info->layers * (size_t)E + (size_t)e] = (uint32_t)p[2 * e] | (uint32_t)p[2 * e + 1] << 8;
      if (ids) ids[info->layers] = rl[r];
      info->layers++;
    }
    if (!rc && !info->layers) rc = failr(why, ELDR_RE_BAD_COUNTS, d, ELDR_ERANGE, "no row a MoE layer can have made");
  }
  free(buf);
  return rc;
}

int eldr_compact_emit(void *kv, const uint16_t *sel, size_t rows, const eldr_shape *s, const uint32_t *layer_ids,
                      size_t first_token) {
  json_t *o = kv;
  if (!o || !s || eldr_shape_validate(s, NULL) || (rows && !sel)) return ELDR_EINVAL;
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k, cells = L * E;
  uint32_t *c = calloc(cells, sizeof *c);
  uint8_t *raw = malloc(cells * 2);
  char *txt = malloc(eldr_b64_encoded_len(cells * 2) + 1);
  json_t *ly = json_array();
  int rc = ELDR_ENOMEM;
  if (c && raw && txt && ly) {
    rc = 0;
    for (size_t t = 0; t < rows && !rc; t++)
      for (size_t l = 0; l < L; l++)
        for (size_t k = 0; k < K; k++) {
          const uint16_t e = sel[(t * L + l) * K + k];
          if (e >= E) rc = ELDR_EINVAL;
          else c[l * E + e]++;
        }
    for (size_t i = 0; i < cells; i++) {
      const uint32_t v = c[i] > SAT ? SAT : c[i];
      raw[2 * i] = (uint8_t)v;
      raw[2 * i + 1] = (uint8_t)(v >> 8);
    }
    for (size_t l = 0; !rc && l < L; l++)
      if (json_array_append_new(ly, json_integer(layer_ids ? layer_ids[l] : (json_int_t)l))) rc = ELDR_ENOMEM;
    if (!rc) {
      eldr_b64_encode(raw, cells * 2, txt);
      json_t *v = json_pack("{s:s,s:s,s:[I,I],s:O,s:I,s:I,s:I,s:s}", "encoding", "base64", "dtype", "uint16", "shape",
                            (json_int_t)L, (json_int_t)E, "layers", ly, "top_k", (json_int_t)K, "tokens",
                            (json_int_t)rows, "first_token", (json_int_t)first_token, "data", txt);
      rc = !v || json_object_set_new(o, ELDR_COMPACT_KEY, v) ? ELDR_ENOMEM : 0;
    }
  }
  json_decref(ly);
  free(c);
  free(raw);
  free(txt);
  return rc;
}
