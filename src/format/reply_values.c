/* reply_values.c — one routed_experts value of a reply in each layout vLLM
 * ships (see eldr/reply_experts.h): a base64 .npy string (whole, or only
 * the rows after a skipped prefix), an {"encoding","dtype","shape","data"}
 * object, nested lists; through the codec of routed_experts.c (npy header
 * parser) and base64.c. Each value becomes a view over a buffer the result
 * owns (or the caller's scratch): decoded npy payloads and compact base64
 * data stay in their wire dtype, nested lists are converted to host-order
 * uint16 after their ids are checked. The reply around them:
 * reply_experts.c (reply_experts_int.h). */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/routed_experts.h"
#include "reply_experts_int.h"
#include "reply_layers_int.h"

/* A string's bytes (not NUL-terminated): the document's own when it has no
 * escape, else decoded into a buffer the result owns. 0, or the reason. */
int eldr__re_jv_str(rctx *c, const char *what, jv v, const char **p, size_t *n) {
  if (!v.doc) {
    *p = json_string_value(v.j);
    *n = json_string_length(v.j);
    return 0;
  }
  const char *raw = v.doc + v.s.off + 1;
  const size_t rl = v.s.len - 2;
  if (!memchr(raw, '\\', rl)) {
    *p = raw;
    *n = rl;
    return 0;
  }
  char *b = eldr__re_own(c, rl);
  if (!b || eldr_js_string(v.doc, v.s, b, rl, n)) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, what, "out of memory");
  *p = b;
  return 0;
}

/* base64 text into an owned buffer. */
static int b64_own(rctx *c, const char *what, const char *s, size_t n, uint8_t **buf,
                   size_t *len) {
  size_t cap = eldr_b64_decoded_max(n);
  uint8_t *b = eldr__re_own(c, cap);
  if (!b) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, what, "out of memory");
  eldr_diag dd;
  dd.msg[0] = '\0';
  int rc = eldr_b64_decode(s, n, b, cap, len, &dd);
  if (rc) return fail(c, ELDR_RE_BAD_BASE64, rc, what, dd.msg);
  *buf = b;
  return 0;
}

/* A base64 string value into an owned buffer: a span's text is decoded as
 * it lies (base64 has no '\\': a text with an escape fails and is decoded
 * again after its escapes are), so a blob is not searched for escapes first;
 * a failure is decoded once more for its message (the error path only). */
static int b64_value(rctx *c, const char *what, jv v, uint8_t **buf, size_t *len) {
  if (v.doc) {
    const char *raw = v.doc + v.s.off + 1;
    const size_t rl = v.s.len - 2;
    const size_t used = c->o.scratch ? c->o.scratch->used : 0;
    const eldr_re_reason why = c->why;
    eldr_diag *d = c->d;
    c->d = NULL; /* no message from the attempt */
    const int rc = b64_own(c, what, raw, rl, buf, len);
    c->d = d;
    if (rc == 0) return 0;
    if (c->o.scratch) c->o.scratch->used = used; /* the failed attempt's slot back */
    c->why = why;
    if (!memchr(raw, '\\', rl)) return b64_own(c, what, raw, rl, buf, len); /* again, for the message */
  }
  const char *txt = NULL; /* set when jv_str succeeds (-O3 cannot see it) */
  size_t tl = 0;
  int rc = eldr__re_jv_str(c, what, v, &txt, &tl);
  return rc ? rc : b64_own(c, what, txt, tl, buf, len);
}

/* Rows of a value of R rows (prompt rows first, then gen generated ones)
 * to leave out for c->skip: those of prompt tokens before it, at
 * most all prompt rows but the last (a prompt view is never emptied). 0
 * without the prompt's token count, or when the rows do not fit it (the
 * reader reports that). */
size_t eldr__re_skip_rows(const rctx *c, size_t R, size_t gen, int64_t P) {
  const size_t skip = c->skip;
  if (!skip || P < 0 || gen > R || R - gen > (size_t)P || R - gen < 2) return 0;
  const size_t pr = R - gen, first = (size_t)P - pr;
  if (skip <= first) return 0;
  return skip - first < pr - 1 ? skip - first : pr - 1;
}

/* c->skip on a base64 .npy value: only the rows from the first one
 * kept are decoded (the base64 text of the others is not read: not
 * validated either). 0 (out filled, c->sk_done), or 1: not taken (no
 * skip, a text whose length does not match its header (an escape, a
 * damaged value), anything unusual): the whole value is read as without. */
static int read_npy_tail(rctx *c, const char *what, jv v, eldr_re_view *out, int check) {
  const char *txt;
  size_t tl;
  if (v.doc) { /* as it lies: an escape makes the length disagree below */
    txt = v.doc + v.s.off + 1;
    tl = v.s.len - 2;
  } else {
    txt = json_string_value(v.j);
    tl = json_string_length(v.j);
  }
  uint8_t hb[3 * 344]; /* the header: prefix and dict, at most 1 KiB here */
  size_t hn;
  eldr_diag dd;
  if (tl < 16 || eldr_b64_decode(txt, 16, hb, sizeof hb, &hn, &dd)) return 1;
  const size_t pre = hb[6] == 1 ? 10 : 12;
  const size_t hlen = hb[6] == 1 ? (size_t)hb[8] | (size_t)hb[9] << 8 : (size_t)hb[8] | (size_t)hb[9] << 8 | (size_t)hb[10] << 16;
  const size_t hq = (pre + hlen + 2) / 3; /* quads that hold the header */
  if (pre + hlen > 3 * 340 || 4 * hq > tl || eldr_b64_decode(txt, 4 * hq, hb, sizeof hb, &hn, &dd)) return 1;
  eldr_npy_info h;
  if (eldr_npy_parse_header(hb, hn, &h, &dd) || h.ndim != 3) return 1;
  const size_t isz = eldr_sel_dtype_size(h.dtype), R = h.shape[0], L = h.shape[1], K = h.shape[2];
  size_t bytes, total;
  if (!isz || L < 1 || L > ELDR_MAX_LAYERS || K < 1 || K > ELDR_MAX_TOPK ||
      (c->o.num_layers && !eldr__re_layers_mappable(L, c->o.num_layers, c->o.layer_ids)) ||
      (c->o.top_k && K != c->o.top_k) || (c->plan != PLAN_NONE && L != c->La) ||
      __builtin_mul_overflow(R, L * K * isz, &bytes) || __builtin_add_overflow(bytes, h.data_offset, &total) ||
      tl != 4 * ((total + 2) / 3))
    return 1;
  const size_t k = c->sk_G < 0 ? 0 : eldr__re_skip_rows(c, R, eldr__re_gen_rows(R, c->sk_P, c->sk_G), c->sk_P);
  if (!k) return 1;
  const size_t x = h.data_offset + k * L * K * isz, q = x / 3; /* the first quad of the rows kept */
  uint8_t *b;
  size_t n;
  const size_t used = c->o.scratch ? c->o.scratch->used : 0;
  const eldr_re_reason why = c->why;
  eldr_diag *d = c->d;
  c->d = NULL;
  int rc = b64_own(c, what, txt + 4 * q, tl - 4 * q, &b, &n);
  c->d = d;
  if (rc || n != total - 3 * q) { /* the whole value once more, for its message */
    if (c->o.scratch) c->o.scratch->used = used;
    c->why = why;
    return 1;
  }
  size_t kept_bytes; /* the rows kept: the shape checks and the layer plan, as read_npy's */
  if ((rc = eldr__re_check_dims(c, what, R - k, L, K, isz, &kept_bytes))) return rc;
  *out = (eldr_re_view){b + (x - 3 * q), h.dtype, R - k, L, K, 0};
  c->sk_done = 1;
  if ((rc = eldr__re_apply_plan(c, what, out))) return rc;
  return check ? eldr__re_check_ids(c, what, out) : 0;
}

/* A base64 .npy string (npy layout). */
static int read_npy(rctx *c, const char *what, jv v, eldr_re_view *out, int check) {
  if (c->sk_on) {
    int t = read_npy_tail(c, what, v, out, check);
    if (t <= 0) return t;
  }
  uint8_t *b = NULL; /* set when b64_value succeeds (-O3 cannot see it) */
  size_t n = 0;
  int rc = b64_value(c, what, v, &b, &n);
  if (rc) return rc;
  eldr_npy_info h;
  eldr_diag dd;
  dd.msg[0] = '\0';
  if ((rc = eldr_npy_parse_header(b, n, &h, &dd)))
    return fail(c, strstr(dd.msg, "dtype") ? ELDR_RE_UNKNOWN_DTYPE : ELDR_RE_BAD_NPY, rc, what,
                dd.msg);
  if (h.ndim != 3)
    return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                 "%s: %u-dimensional array, expected 3 (tokens, layers, top_k)", what, h.ndim);
  size_t bytes;
  if ((rc = eldr__re_check_dims(c, what, h.shape[0], h.shape[1], h.shape[2], eldr_sel_dtype_size(h.dtype),
                       &bytes)))
    return rc;
  if (n - h.data_offset != bytes)
    return FAILF(c, ELDR_RE_LENGTH_MISMATCH, ELDR_EPARSE,
                 "%s: payload is %zu bytes, shape (%zu, %zu, %zu) needs %zu", what,
                 n - h.data_offset, h.shape[0], h.shape[1], h.shape[2], bytes);
  *out = (eldr_re_view){b + h.data_offset, h.dtype, h.shape[0], h.shape[1], h.shape[2], 0};
  if ((rc = eldr__re_apply_plan(c, what, out))) return rc;
  return check ? eldr__re_check_ids(c, what, out) : 0;
}

static int dtype_by_name(const char *s, size_t n, eldr_sel_dtype *t) {
  static const struct {
    const char *name;
    eldr_sel_dtype t;
  } tab[] = {{"uint8", ELDR_SEL_U8},     {"uint16", ELDR_SEL_U16LE}, {"int16", ELDR_SEL_I16LE},
             {"int32", ELDR_SEL_I32LE},  {"int64", ELDR_SEL_I64LE}};
  for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
    if (str_is(s, n, tab[i].name)) {
      *t = tab[i].t;
      return 0;
    }
  return -1;
}

/* {"encoding":"base64","dtype":..,"shape":[n,L,K],"data":..} */
static int read_compact(rctx *c, const char *what, jv v, eldr_re_view *out, int check) {
  static const char *const keys[4] = {"encoding", "dtype", "shape", "data"};
  jv f[4];
  jv_getn(v, keys, 4, f);
  const jv enc = f[0], dt = f[1], sh = f[2], data = f[3];
  const char *es, *ds = NULL;
  size_t en, dn = 0;
  int rc;
  if (jv_type(enc) != JV_STRING)
    return fail(c, ELDR_RE_UNKNOWN_ENCODING, ELDR_EUNSUPPORTED, what,
                "'encoding' missing or not a string");
  if ((rc = eldr__re_jv_str(c, what, enc, &es, &en))) return rc;
  if (!str_is(es, en, "base64"))
    return FAILF(c, ELDR_RE_UNKNOWN_ENCODING, ELDR_EUNSUPPORTED,
                 "%s: encoding '%.*s' unsupported (need \"base64\")", what, (int)(en < 40 ? en : 40), es);
  eldr_sel_dtype t;
  const int dstr = jv_type(dt) == JV_STRING;
  if (dstr && (rc = eldr__re_jv_str(c, what, dt, &ds, &dn))) return rc;
  if (!dstr || dtype_by_name(ds, dn, &t))
    return FAILF(c, ELDR_RE_UNKNOWN_DTYPE, ELDR_EUNSUPPORTED,
                 "%s: dtype %s%.*s%s unsupported (need uint8, uint16, int16, int32 or int64)", what,
                 dstr ? "'" : "", dstr ? (int)(dn < 40 ? dn : 40) : 9, dstr ? ds : "(missing)", dstr ? "'" : "");
  size_t dims[3];
  if (jv_type(sh) != JV_ARRAY || jv_len(sh) != 3)
    return fail(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, what, "'shape' must be [rows, layers, top_k]");
  jv_iter si;
  jv x;
  jv_elems(sh, &si);
  for (size_t i = 0; i < 3 && jv_next(&si, &x); i++) {
    if (jv_type(x) != JV_INTEGER || jv_int(x) < 0 || jv_int(x) > (1LL << 40))
      return fail(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, what,
                  "'shape' entries must be non-negative integers");
    dims[i] = (size_t)jv_int(x);
  }
  if (jv_type(data) != JV_STRING) return fail(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, what, "'data' must be a string");
  size_t bytes;
  if ((rc = eldr__re_check_dims(c, what, dims[0], dims[1], dims[2], eldr_sel_dtype_size(t), &bytes))) return rc;
  uint8_t *b;
  size_t n;
  if ((rc = b64_value(c, what, data, &b, &n))) return rc;
  if (n != bytes)
    return FAILF(c, ELDR_RE_LENGTH_MISMATCH, ELDR_EPARSE,
                 "%s: data is %zu bytes, shape [%zu, %zu, %zu] of %.*s needs %zu", what, n, dims[0],
                 dims[1], dims[2], (int)dn, ds, bytes);
  *out = (eldr_re_view){b, t, dims[0], dims[1], dims[2], 0};
  if ((rc = eldr__re_apply_plan(c, what, out))) return rc;
  return check ? eldr__re_check_ids(c, what, out) : 0;
}

/* The first element of an array (absent when empty or not an array). */
static jv jv_first(jv a) {
  jv_iter it;
  jv x;
  jv_elems(a, &it);
  if (jv_type(a) != JV_ARRAY || !jv_next(&it, &x)) x = (jv){NULL, a.doc, {0, 0, ELDR_JS_NONE}, a.known};
  return x;
}

/* The dense layers of nested lists [rows][La][K] (the rule of
 * eldr__re_dense_layers), for a plan that drops them. A value that is not
 * an integer leaves its layer MoE (the conversion names it). */
static int detect_lists(rctx *c, const char *what, jv v, size_t rows, size_t K) {
  if (c->plan != PLAN_DETECT || !rows) return 0;
  uint8_t le0[ELDR_MAX_LAYERS], neg[ELDR_MAX_LAYERS], dense[ELDR_MAX_LAYERS];
  memset(le0, 1, c->La);
  memset(neg, 0, c->La);
  jv_iter ri, li, ki;
  jv r, ls, x;
  jv_elems(v, &ri);
  for (size_t t = 0; t < rows && jv_next(&ri, &r); t++) {
    jv_elems(r, &li);
    for (size_t l = 0; l < c->La && jv_next(&li, &ls); l++) {
      jv_elems(ls, &ki);
      for (size_t k = 0; le0[l] && k < K && jv_next(&ki, &x); k++) {
        if (jv_type(x) != JV_INTEGER || jv_int(x) > 0) le0[l] = 0;
        else neg[l] |= jv_int(x) < 0;
      }
    }
  }
  size_t nd = 0;
  for (size_t l = 0; l < c->La; l++) nd += dense[l] = (uint8_t)(le0[l] && (neg[l] || K >= 2));
  return eldr__re_plan_from_dense(c, what, dense, nd);
}

/* Nested lists [rows][L][K] of integers, converted to host-order uint16
 * (the plan's layers only: a dense layer's row is not read). */
static int read_lists(rctx *c, const char *what, jv v, eldr_re_view *out) {
  const size_t rows = jv_len(v);
  jv r0 = jv_first(v);
  jv l0 = jv_type(r0) == JV_ARRAY ? jv_first(r0) : r0;
  if (rows && (jv_type(r0) != JV_ARRAY || jv_type(l0) != JV_ARRAY))
    return fail(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, what, "must be a list of [layers][top_k] lists");
  const size_t L = rows ? jv_len(r0) : 0, K = rows ? jv_len(l0) : 0;
  size_t bytes;
  int rc = eldr__re_check_dims(c, what, rows, L, K, 2, &bytes);
  if (rc || (rc = detect_lists(c, what, v, rows, K))) return rc;
  /* the output layer of each array layer, -1 for a row not read */
  int32_t pos[ELDR_MAX_LAYERS];
  size_t Lo = L;
  for (size_t l = 0; l < L; l++) pos[l] = c->nkeep ? -1 : (int32_t)l;
  if (c->nkeep && L) {
    for (size_t i = 0; i < c->nkeep; i++) pos[c->keep[i]] = (int32_t)i;
    Lo = c->nkeep;
    bytes = rows * Lo * K * 2; /* less than the checked rows * L * K * 2 */
  }
  uint16_t *sel = eldr__re_own(c, bytes);
  if (!sel) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, what, "out of memory");
  const uint64_t lim = c->o.num_experts ? c->o.num_experts : ELDR_MAX_EXPERTS;
  jv_iter ri;
  jv r;
  jv_elems(v, &ri);
  for (size_t t = 0; t < rows && jv_next(&ri, &r); t++) {
    if (jv_type(r) != JV_ARRAY || jv_len(r) != L)
      return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, "%s: row %zu is not a list of %zu layers",
                   what, t, L);
    jv_iter li;
    jv ls;
    jv_elems(r, &li);
    for (size_t l = 0; l < L && jv_next(&li, &ls); l++) {
      if (pos[l] < 0) continue; /* a dense layer: whatever it holds */
      if (jv_type(ls) != JV_ARRAY || jv_len(ls) != K)
        return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                     "%s: row %zu layer %zu is not a list of %zu ids", what, t, l, K);
      jv_iter ki;
      jv x;
      jv_elems(ls, &ki);
      uint16_t *dst = sel + (t * Lo + (size_t)pos[l]) * K;
      for (size_t k = 0; k < K && jv_next(&ki, &x); k++) {
        if (jv_type(x) != JV_INTEGER)
          return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE,
                       "%s: row %zu layer %zu slot %zu is not an integer", what, t, l, k);
        const int64_t e = jv_int(x);
        if ((rc = id_ok(c, what, t, l, k, e, lim))) return rc;
        dst[k] = (uint16_t)e;
      }
    }
  }
  *out = (eldr_re_view){sel, ELDR_SEL_U16, rows, Lo, K, 0};
  return 0;
}

/* One routed_experts value of any layout; *layout receives its kind. With
 * check 0 the ids of base64 values are left to the caller (check_rows);
 * converted lists are always checked. */
int eldr__re_read_value(rctx *c, const char *what, jv v, eldr_re_view *out, eldr_re_layout *layout, int check) {
  memset(out, 0, sizeof *out);
  switch (jv_type(v)) {
  case JV_ABSENT:
  case JV_NULL: return 0;
  case JV_STRING: *layout = ELDR_RE_LAYOUT_NPY; return read_npy(c, what, v, out, check);
  case JV_OBJECT: *layout = ELDR_RE_LAYOUT_V021_BASE64; return read_compact(c, what, v, out, check);
  case JV_ARRAY: *layout = ELDR_RE_LAYOUT_V021_LISTS; return read_lists(c, what, v, out);
  default:
    return fail(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, what,
                "must be a string (base64 .npy), an object (encoding/dtype/shape/data) or a list");
  }
}

/* Generated rows at the end of R rows (the rest are the prompt's). */
size_t eldr__re_gen_rows(size_t R, int64_t P, int64_t G) {
  size_t gen = 0;
  if (P >= 0 && G >= 0) {
    gen = G > 0 ? (size_t)(G - 1) : 0;
    if (gen > R) gen = R;
  } else if (P >= 0 && R > (size_t)P) {
    gen = R - (size_t)P; /* token count unknown: the prompt rows come first */
  }
  return gen;
}
