/* trace.c — the JSONL expert-selection trace format (see eldr/trace.h):
 * the line parser. Loading whole files is trace_load.c, writing is
 * trace_write.c.
 *
 * Each line is scanned by a small strict JSON scanner: pass 1 walks the
 * top-level object, validates every value's syntax and records where the
 * known fields' values are; pass 2 interprets the fields in a fixed order
 * (shape first, so that expert ids can be range-checked while the id arrays
 * are read straight into uint16_t buffers). The prefill/decode arrays in the
 * writer's compact form are parsed once, in pass 1 (parse_sel_compact), and
 * the result is kept when it fits the line's shape; anything else is parsed
 * in pass 2 by the general parse_sel. Strings are decoded by jansson
 * (escapes, \u sequences, UTF-8 validation). jansson's json_loadb on whole
 * lines was measured at ~39 MB/s on 48-layer top-8 lines (one json_t
 * allocation per expert id); the direct array walk is an order of
 * magnitude faster, which matters for 10k-request generated traces.
 */
#include "eldr/trace.h"
#include "format/trace_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"

enum {
  F_ID,
  F_DOMAIN,
  F_MODEL,
  F_NUM_EXPERTS,
  F_TOP_K,
  F_LAYERS,
  F_PREFILL,
  F_DECODE,
  F_ARRIVAL,
  F_PROMPT,
  F_GATES,
  F_GENERATOR,
  F_FORM,
  F_PREFILL_TOKENS,
  F_DECODE_TOKENS,
  F_PREFILL_COUNTS,
  F_DECODE_COUNTS,
  F_SERVE,
  F_COUNT
};
static const char *const field_names[F_COUNT] = {
    "id",      "domain",         "model",         "num_experts",    "top_k",
    "layers",  "prefill",        "decode",        "arrival",        "prompt",
    "prefill_gates", "generator", "form",         "prefill_tokens", "decode_tokens",
    "prefill_counts", "decode_counts", "serve"};


/* Parse sel[t][l][k]: ids (uint16) or gates (float). Exactly L layers per
 * token and K entries per layer. Returns the token count in *ntok. */
static int parse_sel(const lctx *c, const char *field, span s, const eldr_shape *sh, bool gates,
                     gbuf *out, uint32_t *ntok) {
  const char *p = s.p, *e = s.e;
  const uint32_t L = sh->num_layers, K = sh->top_k, E = sh->num_experts;
  const size_t per_tok = (size_t)L * K;
  if (*p != '[') return lfail(c, ELDR_EPARSE, field, "expected an array of tokens");
  p = skip_ws(p + 1, e);
  size_t t = 0;
  if (p < e && *p == ']') {
    *ntok = 0;
    return ELDR_OK;
  }
  for (;;) {
    if (t >= UINT32_MAX) return lfail(c, ELDR_ERANGE, field, "too many tokens");
    if (p >= e || *p != '[')
      return lfail(c, ELDR_EPARSE, field, "token %zu: expected an array of %u layers", t, L);
    if (gbuf_reserve(out, per_tok)) return ELDR_ENOMEM;
    uint16_t *ids = gates ? NULL : (uint16_t *)out->p + out->n;
    float *gv = gates ? (float *)out->p + out->n : NULL;
    p = skip_ws(p + 1, e);
    uint32_t l = 0;
    if (p < e && *p == ']')
      return lfail(c, ELDR_ESHAPE, field, "token %zu: 0 layers, expected %u", t, L);
    for (;;) {
      if (l >= L)
        return lfail(c, ELDR_ESHAPE, field, "token %zu: more than %u layers (ragged array)", t, L);
      if (p >= e || *p != '[')
        return lfail(c, ELDR_EPARSE, field, "token %zu layer %u: expected an array of %u %s", t,
                     l, K, gates ? "gates" : "expert ids");
      p = skip_ws(p + 1, e);
      uint32_t k = 0;
      if (p < e && *p == ']')
        return lfail(c, ELDR_ESHAPE, field, "token %zu layer %u: 0 entries, expected top_k %u", t,
                     l, K);
      for (;;) {
        if (k >= K)
          return lfail(c, ELDR_ESHAPE, field,
                       "token %zu layer %u: more than top_k %u entries (ragged array)", t, l, K);
        if (p >= e) return lfail(c, ELDR_EPARSE, field, "truncated");
        if (gates) {
          double v;
          const char *q = p;
          int rc = parse_real(&q, e, &v, true);
          if (rc)
            return lfail(c, ELDR_EPARSE, field, "token %zu layer %u slot %u: expected a number",
                         t, l, k);
          gv[(size_t)l * K + k] = (float)v;
          p = q;
        } else {
          const char *q = p;
          uint32_t v = 0;
          if (*q >= '1' && *q <= '9') {
            while (q < e && *q >= '0' && *q <= '9' && v < 100000000u) v = v * 10 + (uint32_t)(*q++ - '0');
            while (q < e && *q >= '0' && *q <= '9') q++;
          } else if (*q == '0') {
            q++;
            if (q < e && *q >= '0' && *q <= '9')
              return lfail(c, ELDR_EPARSE, field, "token %zu layer %u slot %u: invalid number",
                           t, l, k);
          } else {
            const char *r = scan_number(p, e);
            if (r && *p == '-' && r - p >= 2 && !memchr(p, '.', (size_t)(r - p)) &&
                !memchr(p, 'e', (size_t)(r - p)) && !memchr(p, 'E', (size_t)(r - p)))
              return lfail(c, ELDR_ERANGE, field,
                           "token %zu layer %u slot %u: negative expert id %.*s", t, l, k,
                           (int)(r - p > 24 ? 24 : r - p), p);
            return lfail(c, ELDR_EPARSE, field,
                         "token %zu layer %u slot %u: expected an integer expert id", t, l, k);
          }
          if (q < e && (*q == '.' || *q == 'e' || *q == 'E'))
            return lfail(c, ELDR_EPARSE, field,
                         "token %zu layer %u slot %u: expert id is not an integer", t, l, k);
          if (v >= E)
            return lfail(c, ELDR_ERANGE, field,
                         "token %zu layer %u slot %u: expert id %.*s >= num_experts %u", t, l, k,
                         (int)(q - p > 24 ? 24 : q - p), p, E);
          ids[(size_t)l * K + k] = (uint16_t)v;
          p = q;
        }
        k++;
        p = skip_ws(p, e);
        if (p < e && *p == ',') {
          p = skip_ws(p + 1, e);
          continue;
        }
        if (p < e && *p == ']') break;
        return lfail(c, ELDR_EPARSE, field, "token %zu layer %u: expected ',' or ']'", t, l);
      }
      if (k != K)
        return lfail(c, ELDR_ESHAPE, field,
                     "token %zu layer %u: %u entries, expected top_k %u (ragged array)", t, l, k,
                     K);
      l++;
      p = skip_ws(p + 1, e);
      if (p < e && *p == ',') {
        p = skip_ws(p + 1, e);
        continue;
      }
      if (p < e && *p == ']') break;
      return lfail(c, ELDR_EPARSE, field, "token %zu: expected ',' or ']'", t);
    }
    if (l != L)
      return lfail(c, ELDR_ESHAPE, field, "token %zu: %u layers, expected %u (ragged array)", t, l,
                   L);
    out->n += per_tok;
    t++;
    p = skip_ws(p + 1, e);
    if (p < e && *p == ',') {
      p = skip_ws(p + 1, e);
      continue;
    }
    if (p < e && *p == ']') break;
    return lfail(c, ELDR_EPARSE, field, "expected ',' or ']' after token %zu", t - 1);
  }
  if (skip_ws(p + 1, e) != e) return lfail(c, ELDR_EPARSE, field, "trailing characters");
  *ntok = (uint32_t)t;
  return ELDR_OK;
}

/* Fast path for the id arrays (prefill, decode) in the exact compact form
 * the writer produces: "[[[1,2],[3,4]],[[5,6],[7,8]]]" (no whitespace,
 * plain non-negative integers without leading zeros, at most 65535). It runs
 * in pass 1, before the shape is known: the layer and top-k counts are taken
 * from the first token and every later token must repeat them exactly. The
 * result is used in pass 2 only when it matches the line's shape and every id
 * is below num_experts; in every other case -- including any input the fast
 * path does not accept, which it simply declines (NULL) -- the general
 * skip_num_array + parse_sel path runs exactly as before, so errors and
 * results are unchanged. When it succeeds, the value holds only digits,
 * commas and balanced brackets, so its end is the one skip_num_array finds. */
typedef struct fast_sel {
  bool ok;
  uint32_t L, K, ntok; /* L = K = 0 when ntok == 0 */
  uint32_t maxid;
} fast_sel;

/* One layer's ids after its '[': "1,22,333]". Returns the position after
 * the ']' or NULL. With checked false the caller guarantees 7 * kmax
 * readable bytes: at most kmax ids are read, each of at most 6 digits (the
 * 6th exceeds 0xffff) and its separator. */
static inline __attribute__((always_inline)) const char *
compact_ids(const char *p, const char *e, const bool checked, uint16_t *ids, uint32_t kmax,
            uint32_t *kout, uint32_t *maxid) {
  uint32_t k = 0, mx = *maxid;
  for (;;) {
    if (k >= kmax || (checked && p >= e)) return NULL;
    uint32_t v = (uint32_t)(unsigned char)*p - '0';
    if (v > 9) return NULL;
    p++;
    bool more = true;
    if (!checked) { /* unrolled for 1-3 digits */
      more = false;
      const uint32_t d1 = (uint32_t)(unsigned char)p[0] - '0';
      if (d1 <= 9) {
        if (!v) return NULL; /* leading zero */
        v = v * 10 + d1;
        const uint32_t d2 = (uint32_t)(unsigned char)p[1] - '0';
        if (d2 <= 9) {
          v = v * 10 + d2;
          p += 2;
          more = true;
        } else {
          p += 1;
        }
      }
    }
    if (v && more) {
      for (;;) {
        if (checked && p >= e) return NULL;
        uint32_t dg = (uint32_t)(unsigned char)*p - '0';
        if (dg > 9) break;
        v = v * 10 + dg;
        if (v > 0xffff) return NULL;
        p++;
      }
    }
    ids[k++] = (uint16_t)v;
    if (v > mx) mx = v;
    if (checked && p >= e) return NULL;
    const char ch = *p++;
    if (ch == ',') continue;
    if (ch == ']') break;
    return NULL; /* "0" followed by a digit, '.', 'e', whitespace... */
  }
  *kout = k;
  *maxid = mx;
  return p;
}

static const char *parse_sel_compact(const char *p, const char *e, gbuf *out, fast_sel *r) {
  r->ok = false;
  out->n = 0;
  if (e - p < 2 || p[0] != '[') return NULL;
  p++;
  if (*p == ']') {
    *r = (fast_sel){true, 0, 0, 0, 0};
    return p + 1;
  }
  uint32_t L = 0, K = 0, ntok = 0, maxid = 0;
  for (;;) { /* tokens */
    if (p >= e || *p != '[') return NULL;
    p++;
    uint32_t l = 0;
    for (;;) { /* layers */
      if (p >= e || *p != '[') return NULL;
      p++;
      const uint32_t kmax = K ? K : ELDR_MAX_TOPK;
      if (out->n + kmax > out->cap && gbuf_reserve(out, kmax)) return NULL;
      uint16_t *ids = (uint16_t *)out->p + out->n;
      uint32_t k = 0;
      /* at most 7 bytes are read per id (6 digits at most, then the separator) */
      p = (size_t)(e - p) >= 7 * (size_t)kmax ? compact_ids(p, e, false, ids, kmax, &k, &maxid)
                                               : compact_ids(p, e, true, ids, kmax, &k, &maxid);
      if (!p) return NULL;
      if (!K) K = k;
      else if (k != K) return NULL;
      out->n += k;
      l++;
      if (p >= e) return NULL;
      const char ch = *p++;
      if (ch == ',') {
        if ((L && l >= L) || l >= ELDR_MAX_LAYERS) return NULL;
        continue;
      }
      if (ch == ']') break;
      return NULL;
    }
    if (!L) L = l;
    else if (l != L) return NULL;
    if (++ntok >= UINT32_MAX) return NULL;
    if (p >= e) return NULL;
    const char ch = *p++;
    if (ch == ',') continue;
    if (ch == ']') break;
    return NULL;
  }
  *r = (fast_sel){true, L, K, ntok, maxid};
  return p;
}

/* parse_sel for an id field, reusing pass 1's compact parse when it applies. */
static int parse_ids(const lctx *c, const char *field, span s, const eldr_shape *sh,
                     const fast_sel *fs, gbuf *out, uint32_t *ntok) {
  if (fs->ok && (fs->ntok == 0 || (fs->L == sh->num_layers && fs->K == sh->top_k &&
                                   fs->maxid < sh->num_experts))) {
    *ntok = fs->ntok;
    return ELDR_OK;
  }
  out->n = 0;
  return parse_sel(c, field, s, sh, false, out, ntok);
}

/* Layer ids. check_dups: the line defines the trace's layers (later lines
 * are compared with them instead, which makes repeats impossible there). */
static int parse_layers(const lctx *c, span s, bool check_dups, uint32_t **out, uint32_t *n) {
  const char *f = "layers";
  const char *p = s.p, *e = s.e;
  if (*p != '[') return lfail(c, ELDR_EPARSE, f, "expected an array of layer ids");
  uint32_t *ids = malloc(sizeof(uint32_t) * ELDR_MAX_LAYERS);
  if (!ids) return ELDR_ENOMEM;
  uint32_t cnt = 0;
  p = skip_ws(p + 1, e);
  int rc = ELDR_OK;
  if (p < e && *p == ']') {
    rc = lfail(c, ELDR_ERANGE, f, "empty (need at least one MoE layer)");
    goto fail;
  }
  for (;;) {
    const char *q = scan_number(p, e);
    if (!q) {
      rc = lfail(c, ELDR_EPARSE, f, "entry %u: expected an integer", cnt);
      goto fail;
    }
    if (cnt >= ELDR_MAX_LAYERS) {
      rc = lfail(c, ELDR_ERANGE, f, "more than %d layers", ELDR_MAX_LAYERS);
      goto fail;
    }
    uint64_t v;
    rc = parse_uint(c, f, (span){p, q}, 1000000, &v);
    if (rc) goto fail;
    for (uint32_t i = 0; check_dups && i < cnt; i++)
      if (ids[i] == v) {
        rc = lfail(c, ELDR_EPARSE, f, "layer id %llu repeated", (unsigned long long)v);
        goto fail;
      }
    ids[cnt++] = (uint32_t)v;
    p = skip_ws(q, e);
    if (p < e && *p == ',') {
      p = skip_ws(p + 1, e);
      continue;
    }
    if (p < e && *p == ']') break;
    rc = lfail(c, ELDR_EPARSE, f, "expected ',' or ']'");
    goto fail;
  }
  *out = ids;
  *n = cnt;
  return ELDR_OK;
fail:
  free(ids);
  return rc;
}


/* One line's fields as found by pass 1: each known field's value span, and
 * the compact parse of the id arrays (into the caller's pre / dec). */
typedef struct line_fields {
  span f[F_COUNT];
  fast_sel fs_pre, fs_dec;
  bool counts; /* "form":"counts" */
} line_fields;

/* Pass 1: the top-level object, each known field's value located (the id
 * arrays parsed in their compact form on the way), the rest skipped. */
static int scan_fields(lctx *c, const char *line, size_t len, line_fields *lf, gbuf *pre_, gbuf *dec_) {
  const char *p = line, *e = line + len;
  span *f = lf->f;
  const char *why = NULL;
  p = skip_ws(p, e);
  if (p >= e) return lfail(c, ELDR_EPARSE, NULL, "empty line");
  if (*p != '{') return lfail(c, ELDR_EPARSE, NULL, "invalid JSON: expected an object '{'");
  p = skip_ws(p + 1, e);
  if (p < e && *p == '}') {
    p++;
  } else {
    for (;;) {
      if (p >= e) return lfail(c, ELDR_EPARSE, NULL, "truncated JSON: unexpected end of line");
      if (*p != '"') return lfail(c, ELDR_EPARSE, NULL, "invalid JSON: expected a string key");
      const char *ks = p;
      const char *ke = scan_string(p, e);
      if (!ke) return lfail(c, ELDR_EPARSE, NULL, "invalid JSON: bad key string");
      p = skip_ws(ke, e);
      if (p >= e) return lfail(c, ELDR_EPARSE, NULL, "truncated JSON: unexpected end of line");
      if (*p != ':') return lfail(c, ELDR_EPARSE, NULL, "invalid JSON: expected ':'");
      p = skip_ws(p + 1, e);
      const char *vs = p;
      size_t kn = (size_t)(ke - ks) - 2;
      int fi = -1;
      for (int i = 0; i < F_COUNT; i++)
        if (strlen(field_names[i]) == kn && !memcmp(ks + 1, field_names[i], kn)) fi = i;
      const char *ve = NULL;
      if (fi == F_PREFILL && !f[fi].p) ve = parse_sel_compact(p, e, pre_, &lf->fs_pre);
      else if (fi == F_DECODE && !f[fi].p) ve = parse_sel_compact(p, e, dec_, &lf->fs_dec);
      if (!ve && (fi == F_PREFILL || fi == F_DECODE || fi == F_GATES || fi == F_PREFILL_COUNTS ||
                  fi == F_DECODE_COUNTS))
        ve = skip_num_array(p, e);
      if (!ve) ve = scan_value(p, e, &why);
      if (!ve) {
        if (fi >= 0) return lfail(c, ELDR_EPARSE, field_names[fi], "invalid JSON: %s", why);
        return lfail(c, ELDR_EPARSE, NULL, "invalid JSON in field '%.*s': %s",
                     (int)(kn > 40 ? 40 : kn), ks + 1, why);
      }
      if (fi >= 0) {
        if (f[fi].p) return lfail(c, ELDR_EPARSE, field_names[fi], "duplicated");
        f[fi].p = vs;
        f[fi].e = ve;
      }
      p = skip_ws(ve, e);
      if (p >= e) return lfail(c, ELDR_EPARSE, NULL, "truncated JSON: unexpected end of line");
      if (*p == ',') {
        p = skip_ws(p + 1, e);
        continue;
      }
      if (*p == '}') {
        p++;
        break;
      }
      return lfail(c, ELDR_EPARSE, NULL, "invalid JSON: expected ',' or '}'");
    }
  }
  if (skip_ws(p, e) != e) return lfail(c, ELDR_EPARSE, NULL, "trailing characters after the object");
  return ELDR_OK;
}

/* Pass 2's first step: the form, and which fields it requires or forbids. */
static int check_form(lctx *c, line_fields *lf) {
  const span *f = lf->f;
  bool counts = false;
  if (f[F_FORM].p && !is_null(f[F_FORM])) {
    if (f[F_FORM].e - f[F_FORM].p != 8 || memcmp(f[F_FORM].p, "\"counts\"", 8))
      return lfail(c, ELDR_EPARSE, "form", "expected \"counts\" (absent: the per-token form), got %.*s",
                   (int)(f[F_FORM].e - f[F_FORM].p > 40 ? 40 : f[F_FORM].e - f[F_FORM].p),
                   f[F_FORM].p);
    counts = true;
  }
  static const int required[] = {F_ID, F_MODEL, F_NUM_EXPERTS, F_TOP_K, F_LAYERS};
  static const int token_only[] = {F_PREFILL, F_DECODE, F_GATES};
  static const int counts_only[] = {F_PREFILL_TOKENS, F_DECODE_TOKENS, F_PREFILL_COUNTS,
                                    F_DECODE_COUNTS};
  for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
    if (!f[required[i]].p) return lfail(c, ELDR_EPARSE, field_names[required[i]], "missing");
  for (size_t i = 0; i < 3; i++) {
    const int fi = counts ? token_only[i] : counts_only[i];
    if (f[fi].p && (counts || !is_null(f[fi])))
      return lfail(c, ELDR_EPARSE, field_names[fi],
                   counts ? "per-token rows are not allowed in a \"form\":\"counts\" line"
                          : "only allowed with \"form\":\"counts\"");
  }
  if (!counts && f[F_DECODE_COUNTS].p && !is_null(f[F_DECODE_COUNTS]))
    return lfail(c, ELDR_EPARSE, "decode_counts", "only allowed with \"form\":\"counts\"");
  for (size_t i = 0; i < (counts ? 3 : 2); i++) {
    const int fi = counts ? counts_only[i] : token_only[i];
    if (!f[fi].p) return lfail(c, ELDR_EPARSE, field_names[fi], "missing");
  }
  if (f[F_SERVE].p && !is_null(f[F_SERVE]) && *f[F_SERVE].p != '{')
    return lfail(c, ELDR_EPARSE, "serve", "expected an object");
  lf->counts = counts;
  return ELDR_OK;
}

/* What pass 2 decodes from a line, owned until line_commit hands it to the
 * trace (each pointer set to NULL as it goes); line_free frees the rest. */
typedef struct line_vals {
  bool defines; /* the line defines the trace's model, shape and layers */
  eldr_shape sh;
  char *model, *id, *domain, *prompt, *gen, *serve;
  uint32_t *pcounts, *dcounts;
  uint32_t *layers, nl;
  gbuf pre, dec, gat;
  uint32_t n_pre, n_dec, n_gat;
  bool has_gates;
  double arrival;
} line_vals;

static void line_free(line_vals *v) {
  free(v->model);
  free(v->gen);
  free(v->id);
  free(v->domain);
  free(v->prompt);
  free(v->layers);
  free(v->pre.p);
  free(v->dec.p);
  free(v->gat.p);
  free(v->serve);
  free(v->pcounts);
  free(v->dcounts);
}

/* model, num_experts, top_k, layers: the line's shape, checked against the
 * trace's unless the line defines it. */
static int parse_shape(const eldr_trace *t, lctx *c, const span *f, line_vals *v) {
  int rc;
  uint64_t ne, tk;
  if ((rc = decode_string(c, "model", f[F_MODEL], &v->model))) return rc;
  if ((rc = parse_uint(c, "num_experts", f[F_NUM_EXPERTS], ELDR_MAX_EXPERTS, &ne))) return rc;
  if (ne < 1) return lfail(c, ELDR_ERANGE, "num_experts", "must be >= 1");
  if ((rc = parse_uint(c, "top_k", f[F_TOP_K], ELDR_MAX_TOPK, &tk))) return rc;
  if (tk < 1 || tk > ne)
    return lfail(c, ELDR_ERANGE, "top_k", "%llu out of range [1, num_experts=%llu]", (unsigned long long)tk,
                 (unsigned long long)ne);
  v->defines = t->n == 0 && t->shape.num_layers == 0;
  if ((rc = parse_layers(c, f[F_LAYERS], v->defines, &v->layers, &v->nl))) return rc;
  const uint32_t nl = v->nl;
  v->sh = (eldr_shape){nl, (uint32_t)ne, (uint32_t)tk};
  if (v->defines) return ELDR_OK;
  if (t->model && t->model[0] && strcmp(t->model, v->model))
    return lfail(c, ELDR_ESHAPE, "model", "'%.60s' disagrees with the trace's model '%.60s'", v->model, t->model);
  if (v->sh.num_experts != t->shape.num_experts)
    return lfail(c, ELDR_ESHAPE, "num_experts", "%u disagrees with the trace's %u", v->sh.num_experts,
                 t->shape.num_experts);
  if (v->sh.top_k != t->shape.top_k)
    return lfail(c, ELDR_ESHAPE, "top_k", "%u disagrees with the trace's %u", v->sh.top_k, t->shape.top_k);
  if (nl != t->shape.num_layers)
    return lfail(c, ELDR_ESHAPE, "layers", "%u layers disagree with the trace's %u", nl, t->shape.num_layers);
  for (uint32_t l = 0; l < nl; l++)
    if (v->layers[l] != t->layer_ids[l])
      return lfail(c, ELDR_ESHAPE, "layers", "layer %u is %u, the trace's is %u", l, v->layers[l], t->layer_ids[l]);
  return ELDR_OK;
}

/* id, domain, prompt, generator, arrival, serve. */
static int parse_meta(const eldr_trace *t, lctx *c, const span *f, line_vals *v) {
  int rc;
  if ((rc = decode_string(c, "id", f[F_ID], &v->id))) return rc;
  if (f[F_DOMAIN].p && !is_null(f[F_DOMAIN]) && (rc = decode_string(c, "domain", f[F_DOMAIN], &v->domain)))
    return rc;
  if (f[F_PROMPT].p && !is_null(f[F_PROMPT]) && (rc = decode_string(c, "prompt", f[F_PROMPT], &v->prompt)))
    return rc;
  if (f[F_GENERATOR].p && !is_null(f[F_GENERATOR])) {
    if ((rc = decode_string(c, "generator", f[F_GENERATOR], &v->gen))) return rc;
    /* the first line names the trace's generator; a later one may omit it
     * but may not name another (a file mixing two generators' requests
     * would make the serve-trace provenance check meaningless) */
    if (!v->defines && (!t->generator || strcmp(t->generator, v->gen)))
      return lfail(c, ELDR_ESHAPE, "generator", "'%.80s' disagrees with the trace's %s%.80s%s", v->gen,
                   t->generator ? "'" : "", t->generator ? t->generator : "(none on line 1)",
                   t->generator ? "'" : "");
  }
  if (f[F_ARRIVAL].p && !is_null(f[F_ARRIVAL])) {
    const char *q = f[F_ARRIVAL].p;
    if (parse_real(&q, f[F_ARRIVAL].e, &v->arrival, false) || q != f[F_ARRIVAL].e)
      return lfail(c, ELDR_EPARSE, "arrival", "expected a finite number of seconds");
    if (v->arrival < 0) return lfail(c, ELDR_ERANGE, "arrival", "negative (%g)", v->arrival);
  }
  if (f[F_SERVE].p && !is_null(f[F_SERVE])) {
    const size_t n = (size_t)(f[F_SERVE].e - f[F_SERVE].p);
    if (!(v->serve = malloc(n + 1))) return ELDR_ENOMEM;
    memcpy(v->serve, f[F_SERVE].p, n);
    v->serve[n] = '\0';
  }
  return ELDR_OK;
}

/* A growable buffer's growth slack given back (a failed shrink keeps the
 * larger block, which is harmless). */
static void gbuf_shrink(gbuf *b) {
  if (b->p && b->n < b->cap) {
    void *q = realloc(b->p, (b->n ? b->n : 1) * b->esz);
    if (q) b->p = q;
  }
}

/* The rows: the counts form's fields, or the per-token ids and gates. */
static int parse_rows(lctx *c, const line_fields *lf, line_vals *v) {
  const span *f = lf->f;
  int rc;
  if (lf->counts) {
    const span cs[4] = {f[F_PREFILL_TOKENS], f[F_DECODE_TOKENS], f[F_PREFILL_COUNTS], f[F_DECODE_COUNTS]};
    if ((rc = eldr__trace_parse_counts_fields(c, cs, &v->sh, &v->n_pre, &v->n_dec, &v->pcounts, &v->dcounts)))
      return rc;
  } else {
    if ((rc = parse_ids(c, "prefill", f[F_PREFILL], &v->sh, &lf->fs_pre, &v->pre, &v->n_pre))) return rc;
    if ((rc = parse_ids(c, "decode", f[F_DECODE], &v->sh, &lf->fs_dec, &v->dec, &v->n_dec))) return rc;
  }
  v->has_gates = !lf->counts && f[F_GATES].p && !is_null(f[F_GATES]);
  if (v->has_gates) {
    if ((rc = parse_sel(c, "prefill_gates", f[F_GATES], &v->sh, true, &v->gat, &v->n_gat))) return rc;
    if (v->n_gat != v->n_pre)
      return lfail(c, ELDR_ESHAPE, "prefill_gates", "%u tokens, prefill has %u", v->n_gat, v->n_pre);
  }
  gbuf_shrink(&v->pre);
  gbuf_shrink(&v->dec);
  gbuf_shrink(&v->gat);
  return ELDR_OK;
}

/* The request appended to t (and the trace's header set when the line
 * defines it): every allocation first, then nothing can fail. */
static int line_commit(eldr_trace *t, line_vals *v) {
  int rc;
  if (v->has_gates && !v->gat.p && !(v->gat.p = malloc(sizeof(float)))) return ELDR_ENOMEM;
  if ((rc = eldr_trace_reserve(t, t->n + 1))) return rc;
  eldr_request r = {0};
  r.domain = -1;
  if (v->domain) {
    int di = eldr_trace_domain_intern(t, v->domain); /* adds nothing on failure */
    if (di < 0) return ELDR_ENOMEM;
    r.domain = di;
  }
  if (v->defines) {
    free(t->model);
    free(t->layer_ids);
    t->model = v->model;
    v->model = NULL;
    free(t->generator);
    t->generator = v->gen;
    v->gen = NULL;
    t->layer_ids = v->layers;
    v->layers = NULL;
    t->shape = v->sh;
  }
  r.id = v->id;
  v->id = NULL;
  r.prompt = v->prompt;
  v->prompt = NULL;
  r.arrival = v->arrival;
  r.n_prefill = v->n_pre;
  r.n_decode = v->n_dec;
  r.prefill = v->pre.p;
  v->pre.p = NULL;
  r.decode = v->dec.p;
  v->dec.p = NULL;
  if (v->has_gates) {
    r.prefill_gates = v->gat.p;
    v->gat.p = NULL;
  }
  r.prefill_counts = v->pcounts;
  v->pcounts = NULL;
  r.decode_counts = v->dcounts;
  v->dcounts = NULL;
  r.serve = v->serve;
  v->serve = NULL;
  t->req[t->n++] = r;
  return ELDR_OK;
}

/* One line into t: pass 1 finds the fields, pass 2 checks the form,
 * decodes the shape, the metadata and the rows, then commits. pre, dec:
 * empty buffers for the id arrays; on success they are handed to the trace
 * (p set to NULL), otherwise the caller frees them. */
static int parse_line_body(eldr_trace *t, const char *line, size_t len, lctx *c, gbuf *pre_,
                           gbuf *dec_) {
  line_fields lf;
  memset(&lf, 0, sizeof lf);
  c->base = line;
  int rc;
  if ((rc = scan_fields(c, line, len, &lf, pre_, dec_)) || (rc = check_form(c, &lf))) return rc;
  line_vals v = {.pre = *pre_, .dec = *dec_, .gat = {.esz = sizeof(float)}, .arrival = -1.0};
  *pre_ = (gbuf){.esz = sizeof(uint16_t)};
  *dec_ = (gbuf){.esz = sizeof(uint16_t)};
  if (!(rc = parse_shape(t, c, lf.f, &v)) && !(rc = parse_meta(t, c, lf.f, &v)) && !(rc = parse_rows(c, &lf, &v)))
    rc = line_commit(t, &v);
  line_free(&v);
  return rc;
}

static int parse_line_impl(eldr_trace *t, const char *line, size_t len, lctx *c) {
  gbuf pre = {.esz = sizeof(uint16_t)}, dec = {.esz = sizeof(uint16_t)};
  int rc = parse_line_body(t, line, len, c, &pre, &dec);
  free(pre.p);
  free(dec.p);
  return rc;
}

int eldr_trace_parse_line(eldr_trace *t, const char *line, size_t len, size_t lineno,
                          eldr_diag *d) {
  if (!t || (!line && len)) return eldr_diag_fail(d, ELDR_EINVAL, "trace or line missing");
  lctx c = {d, NULL, lineno, line};
  return parse_line_impl(t, line ? line : "", len, &c);
}

/* For trace_load.c: one line of the file src (NULL: "line N"); d may be NULL. */
int eldr__trace_parse_line_src(eldr_trace *t, const char *line, size_t len, size_t lineno,
                               const char *src, eldr_diag *d) {
  lctx c = {d, src, lineno, line};
  return parse_line_impl(t, line, len, &c);
}
