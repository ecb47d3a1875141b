/* reply_experts.c — routed_experts of a whole vLLM reply, every layout (see
 * eldr/reply_experts.h). The JSON goes through jansson; base64 and .npy
 * through the codec of routed_experts.c (AVX2 base64, npy header parser).
 * Each value becomes a view over a buffer the result owns: decoded npy
 * payloads and compact base64 data stay in their wire dtype, nested lists
 * are converted to host-order uint16 after their ids are checked. */
#include "eldr/reply_experts.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/routed_experts.h"

static const char *const layout_names[] = {"none", "npy", "v021-lists", "v021-base64", "lists"};

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
    "negative_id",  "id_out_of_range", "too_large",          "out_of_memory"};

const char *eldr_re_reason_name(eldr_re_reason r) {
  return (unsigned)r < ELDR_RE__N ? reason_names[r] : "unknown";
}

/* ------------------------------------------------------------------------ */
/* reading                                                                   */

typedef struct rctx {
  eldr_re_opts o;
  eldr_reply_experts *out;
  eldr_re_reason why;
  eldr_diag *d;
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
  if ((c->o.num_layers && L != c->o.num_layers) || (c->o.top_k && K != c->o.top_k))
    return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu) disagrees with the artifact (%u layers, top-%u)", what,
                 rows, L, K, c->o.num_layers, c->o.top_k);
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

/* A base64 .npy string (npy layout). */
static int read_npy(rctx *c, const char *what, json_t *v, eldr_re_view *out, int check) {
  uint8_t *b;
  size_t n;
  int rc = b64_own(c, what, json_string_value(v), json_string_length(v), &b, &n);
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
  return check ? check_ids(c, what, out) : 0;
}

static int dtype_by_name(const char *s, eldr_sel_dtype *t) {
  static const struct {
    const char *name;
    eldr_sel_dtype t;
  } tab[] = {{"uint8", ELDR_SEL_U8},     {"uint16", ELDR_SEL_U16LE}, {"int16", ELDR_SEL_I16LE},
             {"int32", ELDR_SEL_I32LE},  {"int64", ELDR_SEL_I64LE}};
  for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
    if (!strcmp(s, tab[i].name)) {
      *t = tab[i].t;
      return 0;
    }
  return -1;
}

/* {"encoding":"base64","dtype":..,"shape":[n,L,K],"data":..} */
static int read_compact(rctx *c, const char *what, json_t *v, eldr_re_view *out, int check) {
  json_t *enc = json_object_get(v, "encoding"), *dt = json_object_get(v, "dtype");
  json_t *sh = json_object_get(v, "shape"), *data = json_object_get(v, "data");
  if (!json_is_string(enc))
    return fail(c, ELDR_RE_UNKNOWN_ENCODING, ELDR_EUNSUPPORTED, what,
                "'encoding' missing or not a string");
  if (strcmp(json_string_value(enc), "base64"))
    return FAILF(c, ELDR_RE_UNKNOWN_ENCODING, ELDR_EUNSUPPORTED,
                 "%s: encoding '%.40s' unsupported (need \"base64\")", what, json_string_value(enc));
  eldr_sel_dtype t;
  if (!json_is_string(dt) || dtype_by_name(json_string_value(dt), &t))
    return FAILF(c, ELDR_RE_UNKNOWN_DTYPE, ELDR_EUNSUPPORTED,
                 "%s: dtype %s%.40s%s unsupported (need uint8, uint16, int16, int32 or int64)", what,
                 json_is_string(dt) ? "'" : "", json_is_string(dt) ? json_string_value(dt) : "(missing)",
                 json_is_string(dt) ? "'" : "");
  size_t dims[3];
  if (!json_is_array(sh) || json_array_size(sh) != 3)
    return fail(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, what, "'shape' must be [rows, layers, top_k]");
  for (size_t i = 0; i < 3; i++) {
    json_t *x = json_array_get(sh, i);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > (1LL << 40))
      return fail(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, what,
                  "'shape' entries must be non-negative integers");
    dims[i] = (size_t)json_integer_value(x);
  }
  if (!json_is_string(data)) return fail(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, what, "'data' must be a string");
  size_t bytes;
  int rc = check_dims(c, what, dims[0], dims[1], dims[2], eldr_sel_dtype_size(t), &bytes);
  if (rc) return rc;
  uint8_t *b;
  size_t n;
  if ((rc = b64_own(c, what, json_string_value(data), json_string_length(data), &b, &n))) return rc;
  if (n != bytes)
    return FAILF(c, ELDR_RE_LENGTH_MISMATCH, ELDR_EPARSE,
                 "%s: data is %zu bytes, shape [%zu, %zu, %zu] of %s needs %zu", what, n, dims[0],
                 dims[1], dims[2], json_string_value(dt), bytes);
  *out = (eldr_re_view){b, t, dims[0], dims[1], dims[2], 0};
  return check ? check_ids(c, what, out) : 0;
}

/* Nested lists [rows][L][K] of integers, converted to host-order uint16. */
static int read_lists(rctx *c, const char *what, json_t *v, eldr_re_view *out) {
  const size_t rows = json_array_size(v);
  json_t *r0 = rows ? json_array_get(v, 0) : NULL;
  json_t *l0 = json_is_array(r0) && json_array_size(r0) ? json_array_get(r0, 0) : NULL;
  if (rows && (!json_is_array(r0) || !json_is_array(l0)))
    return fail(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, what, "must be a list of [layers][top_k] lists");
  const size_t L = rows ? json_array_size(r0) : 0, K = rows ? json_array_size(l0) : 0;
  size_t bytes;
  int rc = check_dims(c, what, rows, L, K, 2, &bytes);
  if (rc) return rc;
  uint16_t *sel = own(c, bytes);
  if (!sel) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, what, "out of memory");
  const uint64_t lim = c->o.num_experts ? c->o.num_experts : ELDR_MAX_EXPERTS;
  size_t i = 0;
  for (size_t t = 0; t < rows; t++) {
    json_t *r = json_array_get(v, t);
    if (!json_is_array(r) || json_array_size(r) != L)
      return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE, "%s: row %zu is not a list of %zu layers",
                   what, t, L);
    for (size_t l = 0; l < L; l++) {
      json_t *ls = json_array_get(r, l);
      if (!json_is_array(ls) || json_array_size(ls) != K)
        return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                     "%s: row %zu layer %zu is not a list of %zu ids", what, t, l, K);
      for (size_t k = 0; k < K; k++, i++) {
        json_t *x = json_array_get(ls, k);
        if (!json_is_integer(x))
          return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE,
                       "%s: row %zu layer %zu slot %zu is not an integer", what, t, l, k);
        json_int_t e = json_integer_value(x);
        if ((rc = id_ok(c, what, t, l, k, (int64_t)e, lim))) return rc;
        sel[i] = (uint16_t)e;
      }
    }
  }
  *out = (eldr_re_view){sel, ELDR_SEL_U16, rows, L, K, 0};
  return 0;
}

/* One routed_experts value of any layout; *layout receives its kind. With
 * check 0 the ids of base64 values are left to the caller (check_rows);
 * converted lists are always checked. */
static int read_value(rctx *c, const char *what, json_t *v, eldr_re_view *out,
                      eldr_re_layout *layout, int check) {
  memset(out, 0, sizeof *out);
  if (!v || json_is_null(v)) return 0;
  if (json_is_string(v)) {
    *layout = ELDR_RE_LAYOUT_NPY;
    return read_npy(c, what, v, out, check);
  }
  if (json_is_object(v)) {
    *layout = ELDR_RE_LAYOUT_V021_BASE64;
    return read_compact(c, what, v, out, check);
  }
  if (json_is_array(v)) {
    *layout = ELDR_RE_LAYOUT_V021_LISTS;
    return read_lists(c, what, v, out);
  }
  return fail(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, what,
              "must be a string (base64 .npy), an object (encoding/dtype/shape/data) or a list");
}

static int64_t int_field(json_t *o, const char *k) {
  json_t *x = json_is_object(o) ? json_object_get(o, k) : NULL;
  return json_is_integer(x) && json_integer_value(x) >= 0 ? (int64_t)json_integer_value(x) : -1;
}

/* Generated tokens of choice i: its token_ids, or the usage's
 * completion_tokens when there is one choice; -1 when unknown. */
static int64_t gen_tokens(json_t *root, json_t *ch, size_t nchoices) {
  json_t *ids = json_object_get(ch, "token_ids");
  if (json_is_array(ids)) return (int64_t)json_array_size(ids);
  return nchoices == 1 ? int_field(json_object_get(root, "usage"), "completion_tokens") : -1;
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

static int read_body(rctx *c, json_t *root) {
  eldr_reply_experts *out = c->out;
  json_t *obj = json_object_get(root, "object");
  if (json_is_string(obj) && strcmp(json_string_value(obj), api_object(c->o.api)))
    return FAILF(c, ELDR_RE_WRONG_OBJECT, ELDR_EPARSE, "reply object '%.40s' is not %s",
                 json_string_value(obj), api_object(c->o.api));
  json_t *choices = json_object_get(root, "choices");
  if (!json_is_array(choices))
    return fail(c, ELDR_RE_NO_CHOICES, ELDR_EPARSE, "reply", "'choices' missing or not a list");
  const size_t nc = json_array_size(choices);
  out->prompt_tokens = int_field(json_object_get(root, "usage"), "prompt_tokens");
  out->choices = calloc(nc ? nc : 1, sizeof *out->choices);
  if (!out->choices) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, "reply", "out of memory");
  out->nchoices = nc;
  const int64_t P = out->prompt_tokens;
  eldr_re_layout lay = ELDR_RE_LAYOUT_NONE, vl = ELDR_RE_LAYOUT_NONE;
  /* the split layouts: the prompt's rows, shared by every choice */
  eldr_re_view prompt;
  const bool has_prompt_key = json_object_get(root, "prompt_routed_experts") != NULL;
  /* counting: the first choice's prompt rows are counted where they are
   * range-checked, so no separate pass reads them */
  uint32_t *counts = c->o.counts && c->o.num_layers && c->o.top_k && c->o.num_experts ? c->o.counts : NULL;
  int rc = read_value(c, "prompt_routed_experts", json_object_get(root, "prompt_routed_experts"),
                      &prompt, &vl, !counts);
  if (rc) return rc;
  if (counts && prompt.data) {
    if ((rc = check_rows(c, "prompt_routed_experts", &prompt, 0, prompt.rows, counts))) return rc;
    out->counted = nc > 0;
  }
  if (prompt.data || json_is_array(json_object_get(root, "prompt_routed_experts"))) {
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
  for (size_t i = 0; i < nc; i++) {
    json_t *ch = json_array_get(choices, i);
    eldr_re_choice *oc = &out->choices[i];
    oc->index = (int64_t)i;
    if (!json_is_object(ch))
      return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, "choices[%zu] is not an object", i);
    json_t *ix = json_object_get(ch, "index");
    if (json_is_integer(ix)) oc->index = (int64_t)json_integer_value(ix);
    char what[48];
    snprintf(what, sizeof what, "choices[%zu].routed_experts", i);
    eldr_re_view v;
    vl = ELDR_RE_LAYOUT_NONE;
    /* the first choice of a whole-sequence layout: counted below */
    const int count0 = counts && i == 0 && !has_prompt_key;
    if ((rc = read_value(c, what, json_object_get(ch, "routed_experts"), &v, &vl, !count0))) return rc;
    if (count0 && v.data) { /* its prompt rows counted, the generated ones checked */
      size_t pr = v.rows - gen_rows(v.rows, P, gen_tokens(root, ch, nc));
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
      if ((rc = split_npy(c, &v, P, gen_tokens(root, ch, nc), oc))) return rc;
    } else {
      oc->prompt = prompt;
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

int eldr_reply_experts_read(const char *body, size_t len, const eldr_re_opts *opts,
                            eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d) {
  json_error_t je;
  memset(&je, 0, sizeof je);
  json_t *root = body || !len ? json_loadb(body ? body : "", len, 0, &je) : NULL;
  if (!root) {
    if (out) {
      memset(out, 0, sizeof *out);
      out->prompt_tokens = -1;
    }
    if (why) *why = ELDR_RE_NOT_JSON;
    return eldr_diag_fail(d, ELDR_EPARSE, "reply is not JSON: %s (column %d)",
                          je.text[0] ? je.text : "body missing", je.column);
  }
  int rc = eldr_reply_experts_from_json(root, opts, out, why, d);
  json_decref(root);
  return rc;
}

int eldr_reply_experts_from_json(const void *root, const eldr_re_opts *opts,
                                 eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d) {
  if (why) *why = ELDR_RE_OK;
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "reply_experts: argument missing");
  memset(out, 0, sizeof *out);
  out->prompt_tokens = -1;
  rctx c = {.out = out, .why = ELDR_RE_OK, .d = d};
  if (opts) c.o = *opts;
  if (c.o.scratch) c.o.scratch->used = 0;
  int rc = json_is_object((const json_t *)root)
               ? read_body(&c, (json_t *)root)
               : fail(&c, ELDR_RE_NOT_JSON, ELDR_EPARSE, "reply", "not a JSON object");
  if (rc) {
    eldr_reply_experts_free(out);
    out->prompt_tokens = -1;
  }
  if (c.o.scratch) c.o.scratch->used = 0; /* the next read starts at slot 0 again */
  if (why) *why = c.why;
  return rc;
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
