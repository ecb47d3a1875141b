/* reply_experts.c — routed_experts of a whole vLLM reply, every layout (see
 * eldr/reply_experts.h). The JSON is a jansson tree or the byte scanner's spans
 * (one reader over both, the jv_* accessors); base64 and .npy
 * through the codec of routed_experts.c (npy header parser) and base64.c.
 * Each value becomes a view over a buffer the result owns: decoded npy
 * payloads and compact base64 data stay in their wire dtype, nested lists
 * are converted to host-order uint16 after their ids are checked. */
#include "eldr/reply_experts.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"
#include "eldr/routed_experts.h"
#include "reply_layers_int.h"

static const char *const layout_names[] = {"none", "npy", "v021-lists", "v021-base64", "lists", "compact"};

const char *eldr_re_layout_name(eldr_re_layout l) {
  return (unsigned)l < sizeof layout_names / sizeof *layout_names ? layout_names[l] : "unknown";
}

int eldr_re_layout_parse(const char *s, eldr_re_layout *out) {
  for (int i = 1; i < (int)(sizeof layout_names / sizeof *layout_names); i++)
    if (s && !strcmp(s, layout_names[i])) {
      *out = (eldr_re_layout)i;
      return 0;
    }
  return -1;
}

static const char *const reason_names[ELDR_RE__N] = {
    "ok",           "not_json",        "wrong_object",       "no_choices",  "bad_type",
    "bad_base64",   "bad_npy",         "unknown_dtype",      "unknown_encoding",
    "bad_shape",    "shape_mismatch",  "length_mismatch",    "rows_exceed_tokens",
    "negative_id",  "id_out_of_range", "too_large",          "out_of_memory", "bad_counts"};

const char *eldr_re_reason_name(eldr_re_reason r) {
  return (unsigned)r < ELDR_RE__N ? reason_names[r] : "unknown";
}

/* ------------------------------------------------------------------------ */
/* reading                                                                   */

/* The layer plan, fixed by the first array read (every array of a reply
 * must have the same layers): keep its rows at keep[0..nkeep), or (nkeep 0)
 * all of them as they are. */
enum { PLAN_NONE = 0, PLAN_FIXED, PLAN_DETECT };

typedef struct rctx {
  eldr_re_opts o;
  eldr_reply_experts *out;
  eldr_re_reason why;
  eldr_diag *d;
  int plan;
  size_t La; /* the arrays' layers, once planned */
  size_t nkeep;
  uint32_t keep[ELDR_MAX_LAYERS];
  /* c->skip for the value being read (the first choice's
   * whole-sequence array): its prompt and generated tokens, and whether
   * read_npy already left the skipped rows out */
  size_t skip;     /* eldr_reply_experts_scanned_skip's skip_tokens (0: none) */
  int sk_on, sk_done;
  int64_t sk_P, sk_G;
} rctx;

static int fail(rctx *c, eldr_re_reason why, int err, const char *what, const char *msg) {
  c->why = why;
  return eldr_diag_fail(c->d, err, "%s: %s", what, msg);
}

#define FAILF(c, reason, err, ...) ((c)->why = (reason), eldr_diag_fail((c)->d, (err), __VA_ARGS__))

static void *own(rctx *c, size_t n) {
  eldr_re_scratch *sc = c->o.scratch;
  if (sc && sc->used < ELDR_RE_SCRATCH_SLOTS) { /* reused: nothing allocated once grown */
    if (!n) n = 1;
    if (sc->slot[sc->used].cap < n) { /* the old contents are not needed: no realloc copy */
      free(sc->slot[sc->used].p);
      sc->slot[sc->used].p = malloc(n);
      sc->slot[sc->used].cap = sc->slot[sc->used].p ? n : 0;
      if (!sc->slot[sc->used].p) return NULL;
    }
    return sc->slot[sc->used++].p;
  }
  void **nb = realloc(c->out->bufs, (c->out->nbufs + 1) * sizeof *nb);
  if (!nb) return NULL;
  c->out->bufs = nb;
  void *p = malloc(n ? n : 1);
  if (p) c->out->bufs[c->out->nbufs++] = p;
  return p;
}

/* layers / top_k against the bounds and the expectation; rows * L * K *
 * itemsize without overflow into *bytes. */
static int check_dims(rctx *c, const char *what, size_t rows, size_t L, size_t K, size_t isz,
                      size_t *bytes) {
  if (rows == 0 && L == 0 && K == 0) { /* an empty list: nothing to check */
    *bytes = 0;
    return 0;
  }
  if (L < 1 || L > ELDR_MAX_LAYERS || K < 1 || K > ELDR_MAX_TOPK)
    return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu): layers must be in [1, %d] and top_k in [1, %d]", what,
                 rows, L, K, ELDR_MAX_LAYERS, ELDR_MAX_TOPK);
  if (c->plan != PLAN_NONE && L != c->La)
    return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu): %zu layers, but the reply's other routed_experts have %zu", what,
                 rows, L, K, L, c->La);
  if ((c->o.num_layers && !eldr__re_layers_mappable(L, c->o.num_layers, c->o.layer_ids)) ||
      (c->o.top_k && K != c->o.top_k)) {
    if (c->o.num_layers && c->o.layer_ids && L > c->o.num_layers)
      return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                   "%s: shape (%zu, %zu, %zu) disagrees with the artifact (%u MoE layers at model layers "
                   "%u..%u, top-%u)", what, rows, L, K, c->o.num_layers, c->o.layer_ids[0],
                   c->o.layer_ids[c->o.num_layers - 1], c->o.top_k);
    return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu) disagrees with the artifact (%u layers, top-%u)", what,
                 rows, L, K, c->o.num_layers, c->o.top_k);
  }
  if (c->plan == PLAN_NONE) {
    c->La = L;
    c->out->array_layers = L;
    c->plan = PLAN_FIXED;
    c->nkeep = 0;
    if (c->o.num_layers && L != c->o.num_layers) { /* the all-layers form: the MoE layers' rows */
      c->nkeep = c->o.num_layers;
      memcpy(c->keep, c->o.layer_ids, c->nkeep * sizeof *c->keep);
    } else if (!c->o.num_layers && c->o.drop_dense) {
      c->plan = PLAN_DETECT; /* on the first array with rows */
    }
  }
  size_t n;
  if (__builtin_mul_overflow(rows, L * K, &n) || __builtin_mul_overflow(n, isz, &n))
    return FAILF(c, ELDR_RE_TOO_LARGE, ELDR_ERANGE, "%s: shape (%zu, %zu, %zu) too large", what,
                 rows, L, K);
  *bytes = n;
  return 0;
}

/* One id: in [0, lim), else the reason and a message naming it. */
static int id_ok(rctx *c, const char *what, size_t t, size_t l, size_t k, int64_t e, uint64_t lim) {
  if (e < 0)
    return FAILF(c, ELDR_RE_NEGATIVE_ID, ELDR_ERANGE,
                 "%s: row %zu layer %zu slot %zu: expert id %lld is negative", what, t, l, k,
                 (long long)e);
  if ((uint64_t)e >= lim)
    return FAILF(c, ELDR_RE_ID_OUT_OF_RANGE, ELDR_ERANGE,
                 "%s: row %zu layer %zu slot %zu: expert id %lld >= %llu experts", what, t, l, k,
                 (long long)e, (unsigned long long)lim);
  return 0;
}

/* The reason and message for the bad id at flat index bad of rows
 * [row0, row0 + ...) of v. */
static int bad_id(rctx *c, const char *what, const eldr_re_view *v, size_t row0, size_t bad) {
  const size_t L = v->layers, K = v->top_k;
  const uint64_t lim = c->o.num_experts ? c->o.num_experts : ELDR_MAX_EXPERTS;
  const uint8_t *p = (const uint8_t *)v->data + row0 * L * K * eldr_sel_dtype_size(v->dtype);
  return id_ok(c, what, row0 + bad / K / L, bad / K % L, bad % K, eldr_sel_load(p, v->dtype, bad), lim);
}

/* Rows [row0, row0 + n) of v, the mask's layers: every id in [0, lim)
 * (checked a vector at a time, eldr_counts_check_masked); with counts, also
 * counted in the same pass (eldr_counts_accumulate_masked). */
static int check_rows(rctx *c, const char *what, const eldr_re_view *v, size_t row0, size_t n,
                      uint32_t *counts) {
  const size_t L = v->layers, K = v->top_k;
  const uint32_t lim = c->o.num_experts ? c->o.num_experts : ELDR_MAX_EXPERTS;
  const uint8_t *mask = c->o.layer_mask && c->o.num_layers == L ? c->o.layer_mask : NULL;
  const eldr_shape s = {(uint32_t)L, lim, (uint32_t)K};
  const uint8_t *p = (const uint8_t *)v->data + row0 * L * K * eldr_sel_dtype_size(v->dtype);
  size_t bad = 0;
  if (!n || !v->data) return 0;
  int rc = counts ? eldr_counts_accumulate_masked(&s, p, v->dtype, n, mask, counts, &bad)
                  : eldr_counts_check_masked(&s, p, v->dtype, n, mask, &bad);
  return rc ? bad_id(c, what, v, row0, bad) : 0;
}

/* Every id of the view in the mask's layers must be in [0, lim). */
static int check_ids(rctx *c, const char *what, const eldr_re_view *v) {
  return check_rows(c, what, v, 0, v->rows, NULL);
}

/* The dense layers of the first array with rows, when asked to drop them:
 * the plan keeps the others. */
static int plan_from_dense(rctx *c, const char *what, const uint8_t *dense, size_t nd) {
  if (nd == c->La)
    return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                 "%s: every one of the %zu layers holds only a dense layer's fill (ids <= 0)", what, c->La);
  c->plan = PLAN_FIXED;
  c->nkeep = 0;
  if (nd)
    for (size_t l = 0; l < c->La; l++)
      if (!dense[l]) c->keep[c->nkeep++] = (uint32_t)l;
  return 0;
}

static int detect_plan(rctx *c, const char *what, const void *data, eldr_sel_dtype t, size_t rows, size_t K) {
  if (c->plan != PLAN_DETECT || !rows) return 0;
  uint8_t dense[ELDR_MAX_LAYERS];
  return plan_from_dense(c, what, dense, eldr__re_dense_layers(data, t, rows, c->La, K, dense));
}

/* A view of the arrays' La layers cut, in place, to the plan's layers. */
static int apply_plan(rctx *c, const char *what, eldr_re_view *v) {
  int rc = detect_plan(c, what, v->data, v->dtype, v->rows, v->top_k);
  if (rc || !c->nkeep || !v->layers) return rc;
  eldr__re_keep_layers((void *)v->data, eldr_sel_dtype_size(v->dtype), v->rows, v->layers, v->top_k, c->keep,
                       c->nkeep);
  v->layers = c->nkeep;
  return 0;
}

/* ---- one value of the reply: a jansson node, or a span of a document the
 * scanner accepted (include/eldr/jscan.h). Every reader below goes through
 * these, so the tree and the span read the same way: same answers, same
 * reasons, same messages (fuzz_reply_experts compares them). */

typedef struct jv {
  json_t *j;       /* tree reader */
  const char *doc; /* span reader: the document (then j is unused) */
  eldr_js_span s;
  const eldr_js_span *known; /* span reader: a string whose end is known (eldr_js_iter_known), or NULL */
} jv;

typedef enum jv_kind { JV_ABSENT = 0, JV_NULL, JV_STRING, JV_OBJECT, JV_ARRAY, JV_INTEGER, JV_OTHER } jv_kind;

static jv_kind jv_type(jv v) {
  if (v.doc) switch (v.s.type) {
    case ELDR_JS_NONE: return JV_ABSENT;
    case ELDR_JS_NULL: return JV_NULL;
    case ELDR_JS_STRING: return JV_STRING;
    case ELDR_JS_OBJECT: return JV_OBJECT;
    case ELDR_JS_ARRAY: return JV_ARRAY;
    case ELDR_JS_INTEGER: return JV_INTEGER;
    default: return JV_OTHER;
    }
  if (!v.j) return JV_ABSENT;
  return json_is_null(v.j) ? JV_NULL : json_is_string(v.j) ? JV_STRING : json_is_object(v.j) ? JV_OBJECT
         : json_is_array(v.j) ? JV_ARRAY : json_is_integer(v.j) ? JV_INTEGER : JV_OTHER;
}

/* Members keys[0..n) of an object (each the last of its name, as jansson
 * keeps it; absent when missing or o is no object) into out: one walk of a
 * span, so a large value among the members (a base64 blob) is skipped once. */
static void jv_getn(jv o, const char *const *keys, size_t n, jv *out) {
  for (size_t i = 0; i < n; i++) {
    out[i] = (jv){NULL, o.doc, {0, 0, ELDR_JS_NONE}, o.known};
    if (!o.doc) out[i].j = json_is_object(o.j) ? json_object_get(o.j, keys[i]) : NULL;
  }
  if (!o.doc || o.s.type != ELDR_JS_OBJECT) return;
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, o.doc, o.s);
  if (o.known) eldr_js_iter_known(&it, *o.known);
  while (eldr_js_next(&it, &m))
    for (size_t i = 0; i < n; i++)
      if (eldr_js_key_is(o.doc, m.key, keys[i])) out[i].s = m.value;
}

static jv jv_get(jv o, const char *key) {
  jv r;
  jv_getn(o, &key, 1, &r);
  return r;
}

static int64_t jv_int(jv v) {
  int64_t x = 0;
  if (v.doc) eldr_js_int(v.doc, v.s, &x);
  else x = (int64_t)json_integer_value(v.j);
  return x;
}

/* Elements of an array, in order. */
typedef struct jv_iter {
  jv a;
  size_t i;
  eldr_js_iter it;
} jv_iter;

static void jv_elems(jv a, jv_iter *it) {
  it->a = a;
  it->i = 0;
  if (a.doc) {
    eldr_js_iter_array(&it->it, a.doc, a.s);
    if (a.known) eldr_js_iter_known(&it->it, *a.known);
  }
}

static int jv_next(jv_iter *it, jv *v) {
  *v = (jv){NULL, it->a.doc, {0, 0, ELDR_JS_NONE}, it->a.known};
  if (it->a.doc) return eldr_js_next_elem(&it->it, &v->s);
  if (it->i >= json_array_size(it->a.j)) return 0;
  v->j = json_array_get(it->a.j, it->i++);
  return 1;
}

/* Elements of an array (0 for any other value). */
static size_t jv_len(jv a) {
  if (!a.doc) return json_array_size(a.j);
  if (a.s.type != ELDR_JS_ARRAY) return 0;
  jv_iter it;
  jv x;
  size_t n = 0;
  jv_elems(a, &it);
  while (jv_next(&it, &x)) n++;
  return n;
}

/* A string's bytes (not NUL-terminated): the document's own when it has no
 * escape, else decoded into a buffer the result owns. 0, or the reason. */
static int jv_str(rctx *c, const char *what, jv v, const char **p, size_t *n) {
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
  char *b = own(c, rl);
  if (!b || eldr_js_string(v.doc, v.s, b, rl, n)) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, what, "out of memory");
  *p = b;
  return 0;
}

static int str_is(const char *p, size_t n, const char *lit) { return n == strlen(lit) && !memcmp(p, lit, n); }

/* base64 text into an owned buffer. */
static int b64_own(rctx *c, const char *what, const char *s, size_t n, uint8_t **buf,
                   size_t *len) {
  size_t cap = eldr_b64_decoded_max(n);
  uint8_t *b = own(c, cap);
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
  int rc = jv_str(c, what, v, &txt, &tl);
  return rc ? rc : b64_own(c, what, txt, tl, buf, len);
}

static size_t gen_rows(size_t R, int64_t P, int64_t G);

/* Rows of a value of R rows (prompt rows first, then gen generated ones)
 * to leave out for c->skip: those of prompt tokens before it, at
 * most all prompt rows but the last (a prompt view is never emptied). 0
 * without the prompt's token count, or when the rows do not fit it (the
 * reader reports that). */
static size_t skip_rows(const rctx *c, size_t R, size_t gen, int64_t P) {
  const size_t skip = c->skip;
  if (!skip || P < 0 || gen > R || R - gen > (size_t)P || R - gen < 2) return 0;
  const size_t pr = R - gen, first = (size_t)P - pr;
  if (skip <= first) return 0;
  return skip - first < pr - 1 ? skip - first : pr - 1;
}

/* The view without its first k rows (its first_token moves with them). */
static void view_skip(eldr_re_view *v, size_t k) {
  if (!k) return;
  v->data = (const uint8_t *)v->data + k * v->layers * v->top_k * eldr_sel_dtype_size(v->dtype);
  v->rows -= k;
  v->first_token += k;
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
  const size_t k = c->sk_G < 0 ? 0 : skip_rows(c, R, gen_rows(R, c->sk_P, c->sk_G), c->sk_P);
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
  if ((rc = check_dims(c, what, R - k, L, K, isz, &kept_bytes))) return rc;
  *out = (eldr_re_view){b + (x - 3 * q), h.dtype, R - k, L, K, 0};
  c->sk_done = 1;
  if ((rc = apply_plan(c, what, out))) return rc;
  return check ? check_ids(c, what, out) : 0;
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
  if ((rc = check_dims(c, what, h.shape[0], h.shape[1], h.shape[2], eldr_sel_dtype_size(h.dtype),
                       &bytes)))
    return rc;
  if (n - h.data_offset != bytes)
    return FAILF(c, ELDR_RE_LENGTH_MISMATCH, ELDR_EPARSE,
                 "%s: payload is %zu bytes, shape (%zu, %zu, %zu) needs %zu", what,
                 n - h.data_offset, h.shape[0], h.shape[1], h.shape[2], bytes);
  *out = (eldr_re_view){b + h.data_offset, h.dtype, h.shape[0], h.shape[1], h.shape[2], 0};
  if ((rc = apply_plan(c, what, out))) return rc;
  return check ? check_ids(c, what, out) : 0;
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
  if ((rc = jv_str(c, what, enc, &es, &en))) return rc;
  if (!str_is(es, en, "base64"))
    return FAILF(c, ELDR_RE_UNKNOWN_ENCODING, ELDR_EUNSUPPORTED,
                 "%s: encoding '%.*s' unsupported (need \"base64\")", what, (int)(en < 40 ? en : 40), es);
  eldr_sel_dtype t;
  const int dstr = jv_type(dt) == JV_STRING;
  if (dstr && (rc = jv_str(c, what, dt, &ds, &dn))) return rc;
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
  if ((rc = check_dims(c, what, dims[0], dims[1], dims[2], eldr_sel_dtype_size(t), &bytes))) return rc;
  uint8_t *b;
  size_t n;
  if ((rc = b64_value(c, what, data, &b, &n))) return rc;
  if (n != bytes)
    return FAILF(c, ELDR_RE_LENGTH_MISMATCH, ELDR_EPARSE,
                 "%s: data is %zu bytes, shape [%zu, %zu, %zu] of %.*s needs %zu", what, n, dims[0],
                 dims[1], dims[2], (int)dn, ds, bytes);
  *out = (eldr_re_view){b, t, dims[0], dims[1], dims[2], 0};
  if ((rc = apply_plan(c, what, out))) return rc;
  return check ? check_ids(c, what, out) : 0;
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
  return plan_from_dense(c, what, dense, nd);
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
  int rc = check_dims(c, what, rows, L, K, 2, &bytes);
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
  uint16_t *sel = own(c, bytes);
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
static int read_value(rctx *c, const char *what, jv v, eldr_re_view *out, eldr_re_layout *layout, int check) {
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

static int64_t int_field(jv o, const char *k) {
  jv x = jv_get(o, k);
  return jv_type(x) == JV_INTEGER && jv_int(x) >= 0 ? jv_int(x) : -1;
}

/* Generated tokens of a choice: its token_ids' length, or the usage's
 * completion_tokens when there is one choice; -1 when unknown. */
static int64_t gen_tokens(jv usage, jv token_ids, size_t nchoices) {
  if (jv_type(token_ids) == JV_ARRAY) return (int64_t)jv_len(token_ids);
  return nchoices == 1 ? int_field(usage, "completion_tokens") : -1;
}

/* npy layout: cut the one array into prompt rows and generated rows. The
 * rows end at the last forwarded token (P + G - 1). */
/* Generated rows at the end of R rows (the rest are the prompt's). */
static size_t gen_rows(size_t R, int64_t P, int64_t G) {
  size_t gen = 0;
  if (P >= 0 && G >= 0) {
    gen = G > 0 ? (size_t)(G - 1) : 0;
    if (gen > R) gen = R;
  } else if (P >= 0 && R > (size_t)P) {
    gen = R - (size_t)P; /* token count unknown: the prompt rows come first */
  }
  return gen;
}

static int split_npy(rctx *c, const eldr_re_view *all, int64_t P, int64_t G, eldr_re_choice *ch) {
  size_t R = all->rows, gen = gen_rows(R, P, G);
  if (P >= 0 && G >= 0) {
    if (R - gen > (size_t)P)
      return FAILF(c, ELDR_RE_ROWS_EXCEED_TOKENS, ELDR_ESHAPE,
                   "choices[%lld].routed_experts: %zu rows, but %lld prompt + %lld generated tokens "
                   "have at most %lld",
                   (long long)ch->index, R, (long long)P, (long long)G, (long long)(P + G - 1));
  }
  const size_t rowb = all->layers * all->top_k * eldr_sel_dtype_size(all->dtype);
  ch->prompt = *all;
  ch->prompt.rows = R - gen;
  ch->prompt.first_token = P >= 0 ? (size_t)P - ch->prompt.rows : 0;
  if (ch->prompt.rows == 0) ch->prompt.data = NULL;
  ch->generated = *all;
  ch->generated.rows = gen;
  ch->generated.data = gen ? (const uint8_t *)all->data + (R - gen) * rowb : NULL;
  return 0;
}

static const char *api_object(eldr_re_api a) {
  return a == ELDR_RE_CHAT ? "chat.completion" : "text_completion";
}

static int read_body(rctx *c, jv root) {
  eldr_reply_experts *out = c->out;
  static const char *const rkeys[4] = {"object", "choices", "usage", "prompt_routed_experts"};
  jv rf[4];
  jv_getn(root, rkeys, 4, rf);
  const jv obj = rf[0], choices = rf[1], usage = rf[2], pre = rf[3];
  if (jv_type(obj) == JV_STRING) {
    const char *os;
    size_t on;
    int rc = jv_str(c, "reply", obj, &os, &on);
    if (rc) return rc;
    const size_t an = strlen(api_object(c->o.api)); /* the endpoint's object, or its stream chunk's */
    if (!str_is(os, on, api_object(c->o.api)) &&
        !(on == an + 6 && !memcmp(os, api_object(c->o.api), an) && !memcmp(os + an, ".chunk", 6)))
      return FAILF(c, ELDR_RE_WRONG_OBJECT, ELDR_EPARSE, "reply object '%.*s' is not %s", (int)(on < 40 ? on : 40),
                   os, api_object(c->o.api));
  }
  if (jv_type(choices) != JV_ARRAY)
    return fail(c, ELDR_RE_NO_CHOICES, ELDR_EPARSE, "reply", "'choices' missing or not a list");
  const size_t nc = jv_len(choices);
  out->prompt_tokens = int_field(usage, "prompt_tokens");
  out->choices = calloc(nc ? nc : 1, sizeof *out->choices);
  if (!out->choices) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, "reply", "out of memory");
  out->nchoices = nc;
  const int64_t P = out->prompt_tokens;
  eldr_re_layout lay = ELDR_RE_LAYOUT_NONE, vl = ELDR_RE_LAYOUT_NONE;
  /* the split layouts: the prompt's rows, shared by every choice */
  eldr_re_view prompt;
  const bool has_prompt_key = jv_type(pre) != JV_ABSENT;
  /* counting: the first choice's prompt rows are counted where they are
   * range-checked, so no separate pass reads them */
  uint32_t *counts = c->o.counts && c->o.num_layers && c->o.top_k && c->o.num_experts ? c->o.counts : NULL;
  int rc = read_value(c, "prompt_routed_experts", pre, &prompt, &vl, !counts);
  if (rc) return rc;
  /* c->skip: the prompt's rows the caller holds are not counted, and left
   * out of the first choice's view (the other choices share them: checked) */
  const size_t k0 = counts && prompt.data && nc ? skip_rows(c, prompt.rows, 0, P) : 0;
  if (counts && prompt.data) {
    if ((rc = check_rows(c, "prompt_routed_experts", &prompt, 0, k0, NULL)) ||
        (rc = check_rows(c, "prompt_routed_experts", &prompt, k0, prompt.rows - k0, counts)))
      return rc;
    out->counted = nc > 0;
  }
  if (prompt.data || jv_type(pre) == JV_ARRAY) {
    if (vl == ELDR_RE_LAYOUT_NPY)
      return fail(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, "prompt_routed_experts",
                  "must be a list or an encoding/dtype/shape/data object");
    if (P >= 0 && prompt.rows > (size_t)P)
      return FAILF(c, ELDR_RE_ROWS_EXCEED_TOKENS, ELDR_ESHAPE,
                   "prompt_routed_experts: %zu rows for %lld prompt tokens", prompt.rows,
                   (long long)P);
    prompt.first_token = P >= 0 ? (size_t)P - prompt.rows : 0;
    if (!prompt.rows) prompt.data = NULL;
    lay = vl;
  }
  jv_iter ci;
  jv ch;
  jv_elems(choices, &ci);
  for (size_t i = 0; i < nc && jv_next(&ci, &ch); i++) {
    eldr_re_choice *oc = &out->choices[i];
    oc->index = (int64_t)i;
    if (jv_type(ch) != JV_OBJECT)
      return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, "choices[%zu] is not an object", i);
    static const char *const ckeys[3] = {"index", "routed_experts", "token_ids"};
    jv cf[3];
    jv_getn(ch, ckeys, 3, cf);
    if (jv_type(cf[0]) == JV_INTEGER) oc->index = jv_int(cf[0]);
    char what[48];
    snprintf(what, sizeof what, "choices[%zu].routed_experts", i);
    eldr_re_view v;
    vl = ELDR_RE_LAYOUT_NONE;
    /* the first choice of a whole-sequence layout: counted below */
    const int count0 = counts && i == 0 && !has_prompt_key;
    const int64_t G = gen_tokens(usage, cf[2], nc);
    c->sk_on = count0 && c->skip;
    c->sk_done = 0;
    c->sk_P = P;
    c->sk_G = G;
    rc = read_value(c, what, cf[1], &v, &vl, !count0);
    c->sk_on = 0;
    if (rc) return rc;
    /* c->skip: the prompt's rows the caller holds are left out (read_npy
     * did already; any other layout here) */
    if (count0 && v.data && !c->sk_done && G >= 0) { /* (an unknown G splits by the row count: kept) */
      view_skip(&v, skip_rows(c, v.rows, gen_rows(v.rows, P, G), P));
      v.first_token = 0; /* a whole-sequence array: the split below places its rows */
    }
    if (count0 && v.data) { /* its prompt rows counted, the generated ones checked */
      size_t pr = v.rows - gen_rows(v.rows, P, G);
      if ((rc = check_rows(c, what, &v, 0, pr, counts)) ||
          (rc = check_rows(c, what, &v, pr, v.rows - pr, NULL)))
        return rc;
      out->counted = 1;
    }
    if (vl != ELDR_RE_LAYOUT_NONE && lay != ELDR_RE_LAYOUT_NONE && vl != lay)
      return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE,
                   "%s is %s but the reply's other routed_experts are %s", what,
                   eldr_re_layout_name(vl), eldr_re_layout_name(lay));
    /* without a prompt_routed_experts key (npy, or the lists of vLLM PR
     * #38939) the choice's array covers the whole sequence */
    if (vl == ELDR_RE_LAYOUT_V021_LISTS && !has_prompt_key) vl = ELDR_RE_LAYOUT_LISTS;
    if (vl != ELDR_RE_LAYOUT_NONE && (vl == ELDR_RE_LAYOUT_NPY || !has_prompt_key)) {
      if ((rc = split_npy(c, &v, P, gen_tokens(usage, cf[2], nc), oc))) return rc;
    } else {
      oc->prompt = prompt;
      if (i == 0) view_skip(&oc->prompt, k0);
      oc->generated = v;
      if (!v.rows) oc->generated.data = NULL;
    }
    if (lay == ELDR_RE_LAYOUT_NONE) lay = vl;
    if (oc->prompt.data && oc->generated.data &&
        (oc->prompt.layers != oc->generated.layers || oc->prompt.top_k != oc->generated.top_k))
      return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                   "%s: %zu layers x top-%zu, but prompt_routed_experts are %zu x top-%zu", what,
                   oc->generated.layers, oc->generated.top_k, oc->prompt.layers,
                   oc->prompt.top_k);
  }
  out->layout = lay;
  /* counted: the first choice has prompt rows, and they went through counts */
  out->counted = out->counted && nc && out->choices[0].prompt.data != NULL;
  return 0;
}

/* The read of an object value (tree or span) into out. */
static int read_root_skip(jv root, const eldr_re_opts *opts, size_t skip, eldr_reply_experts *out,
                          eldr_re_reason *why, eldr_diag *d) {
  if (why) *why = ELDR_RE_OK;
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "reply_experts: argument missing");
  memset(out, 0, sizeof *out);
  out->prompt_tokens = -1;
  rctx c = {.out = out, .why = ELDR_RE_OK, .d = d, .skip = skip};
  if (opts) c.o = *opts;
  if (c.o.scratch) c.o.scratch->used = 0;
  int rc = jv_type(root) == JV_OBJECT ? read_body(&c, root)
                                      : fail(&c, ELDR_RE_NOT_JSON, ELDR_EPARSE, "reply", "not a JSON object");
  if (!rc && c.nkeep) { /* the model layers the views hold */
    uint32_t *ids = own(&c, c.nkeep * sizeof *ids);
    if (ids) {
      memcpy(ids, c.keep, c.nkeep * sizeof *ids);
      out->layer_ids = ids;
    } else {
      rc = fail(&c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, "reply", "out of memory");
    }
  }
  if (rc) {
    eldr_reply_experts_free(out);
    out->prompt_tokens = -1;
  }
  if (c.o.scratch) c.o.scratch->used = 0; /* the next read starts at slot 0 again */
  if (why) *why = c.why;
  return rc;
}

static int read_root(jv root, const eldr_re_opts *opts, eldr_reply_experts *out, eldr_re_reason *why,
                     eldr_diag *d) {
  return read_root_skip(root, opts, 0, out, why, d);
}

static int not_json(eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d, const char *msg, int col) {
  if (out) {
    memset(out, 0, sizeof *out);
    out->prompt_tokens = -1;
  }
  if (why) *why = ELDR_RE_NOT_JSON;
  return col >= 0 ? eldr_diag_fail(d, ELDR_EPARSE, "reply is not JSON: %s (column %d)", msg, col)
                  : eldr_diag_fail(d, ELDR_EPARSE, "reply is not JSON: %s", msg);
}

int eldr_reply_experts_read(const char *body, size_t len, const eldr_re_opts *opts,
                            eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d) {
  json_error_t je;
  memset(&je, 0, sizeof je);
  json_t *root = body || !len ? json_loadb(body ? body : "", len, 0, &je) : NULL;
  if (!root) return not_json(out, why, d, je.text[0] ? je.text : "body missing", je.column);
  int rc = eldr_reply_experts_from_json(root, opts, out, why, d);
  json_decref(root);
  return rc;
}

int eldr_reply_experts_from_json(const void *root, const eldr_re_opts *opts,
                                 eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d) {
  return read_root((jv){(json_t *)root, NULL, {0, 0, ELDR_JS_NONE}, NULL}, opts, out, why, d);
}

int eldr_reply_experts_scan(const char *body, size_t len, const eldr_re_opts *opts, eldr_reply_experts *out,
                            eldr_re_reason *why, eldr_diag *d) {
  eldr_js_span root;
  eldr_diag sd;
  sd.msg[0] = '\0';
  if (!body || eldr_js_scan(body, len, NULL, 0, NULL, &root, &sd))
    return not_json(out, why, d, body ? sd.msg : "body missing", -1);
  return read_root((jv){NULL, body, root, NULL}, opts, out, why, d);
}

int eldr_reply_experts_scanned(const char *doc, size_t len, const eldr_re_opts *opts, eldr_js_span known,
                               eldr_reply_experts *out,
                               eldr_re_reason *why, eldr_diag *d) {
  return eldr_reply_experts_scanned_skip(doc, len, opts, known, 0, out, why, d);
}

int eldr_reply_experts_scanned_skip(const char *doc, size_t len, const eldr_re_opts *opts, eldr_js_span known,
                                    size_t skip_tokens, eldr_reply_experts *out, eldr_re_reason *why,
                                    eldr_diag *d) {
  size_t a = 0, b = len; /* the top-level value: the document less its surrounding whitespace */
  while (a < b && (doc[a] == ' ' || doc[a] == '\t' || doc[a] == '\n' || doc[a] == '\r')) a++;
  while (b > a && (doc[b - 1] == ' ' || doc[b - 1] == '\t' || doc[b - 1] == '\n' || doc[b - 1] == '\r')) b--;
  const eldr_js_type t = a < b && doc[a] == '{' ? ELDR_JS_OBJECT : ELDR_JS_NULL; /* only an object is read */
  const int k = known.type == ELDR_JS_STRING && known.len >= 2 && known.off >= a && known.off + known.len <= b;
  return read_root_skip((jv){NULL, doc, {a, b - a, t}, k ? &known : NULL}, opts,
                        opts && opts->counts ? skip_tokens : 0, out, why, d);
}

void eldr_re_scratch_trim(eldr_re_scratch *s, size_t keep) {
  if (!s) return;
  for (size_t i = 0; i < ELDR_RE_SCRATCH_SLOTS; i++)
    if (s->slot[i].cap > keep || !keep) {
      free(s->slot[i].p);
      s->slot[i].p = NULL;
      s->slot[i].cap = 0;
    }
}

void eldr_re_scratch_free(eldr_re_scratch *s) {
  eldr_re_scratch_trim(s, 0);
  if (s) s->used = 0;
}

void eldr_reply_experts_free(eldr_reply_experts *r) {
  if (!r) return;
  for (size_t i = 0; i < r->nbufs; i++) free(r->bufs[i]);
  free(r->bufs);
  free(r->choices);
  memset(r, 0, sizeof *r);
}
