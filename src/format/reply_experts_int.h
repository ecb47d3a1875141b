/* reply_experts_int.h — the routed_experts reader's context and its value
 * accessors, internal to src/format: reply_experts.c reads a reply (its
 * choices, the prompt/generated split, counting); reply_values.c reads one
 * routed_experts value in each layout (base64 .npy, the
 * encoding/dtype/shape/data object, nested lists); reply_check.c holds
 * what both share (buffers, shape checks, the layer plan, the id checks).
 * Calls go one way: reply_experts.c -> reply_values.c -> reply_check.c ->
 * reply_layers.c.
 *
 * One value is a jansson node or a span of a document the scanner
 * accepted (include/eldr/jscan.h); every reader goes through the jv_*
 * accessors below, so the tree and the span read the same way: same
 * answers, same reasons, same messages (fuzz_reply_experts compares them).
 *
 * Ownership: buffers come from eldr__re_own (the caller's scratch, else
 * the result's). Errors: each reader returns 0 or an ELDR_E* code with
 * c->why and a message in c->d. Threads: one rctx per read. */
#ifndef ELDR_FORMAT_REPLY_EXPERTS_INT_H
#define ELDR_FORMAT_REPLY_EXPERTS_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "eldr/jscan.h"
#include "eldr/reply_experts.h"

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

static inline int fail(rctx *c, eldr_re_reason why, int err, const char *what, const char *msg) {
  c->why = why;
  return eldr_diag_fail(c->d, err, "%s: %s", what, msg);
}

#define FAILF(c, reason, err, ...) ((c)->why = (reason), eldr_diag_fail((c)->d, (err), __VA_ARGS__))

/* One id: in [0, lim), else the reason and a message naming it. */
static inline int id_ok(rctx *c, const char *what, size_t t, size_t l, size_t k, int64_t e, uint64_t lim) {
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

/* ---- one value of the reply: a jansson node, or a span of a document the
 * scanner accepted. */

typedef struct jv {
  json_t *j;       /* tree reader */
  const char *doc; /* span reader: the document (then j is unused) */
  eldr_js_span s;
  const eldr_js_span *known; /* span reader: a string whose end is known (eldr_js_iter_known), or NULL */
} jv;

typedef enum jv_kind { JV_ABSENT = 0, JV_NULL, JV_STRING, JV_OBJECT, JV_ARRAY, JV_INTEGER, JV_OTHER } jv_kind;

static inline jv_kind jv_type(jv v) {
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
static inline void jv_getn(jv o, const char *const *keys, size_t n, jv *out) {
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

static inline jv jv_get(jv o, const char *key) {
  jv r;
  jv_getn(o, &key, 1, &r);
  return r;
}

static inline int64_t jv_int(jv v) {
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

static inline void jv_elems(jv a, jv_iter *it) {
  it->a = a;
  it->i = 0;
  if (a.doc) {
    eldr_js_iter_array(&it->it, a.doc, a.s);
    if (a.known) eldr_js_iter_known(&it->it, *a.known);
  }
}

static inline int jv_next(jv_iter *it, jv *v) {
  *v = (jv){NULL, it->a.doc, {0, 0, ELDR_JS_NONE}, it->a.known};
  if (it->a.doc) return eldr_js_next_elem(&it->it, &v->s);
  if (it->i >= json_array_size(it->a.j)) return 0;
  v->j = json_array_get(it->a.j, it->i++);
  return 1;
}

/* Elements of an array (0 for any other value). */
static inline size_t jv_len(jv a) {
  if (!a.doc) return json_array_size(a.j);
  if (a.s.type != ELDR_JS_ARRAY) return 0;
  jv_iter it;
  jv x;
  size_t n = 0;
  jv_elems(a, &it);
  while (jv_next(&it, &x)) n++;
  return n;
}

static inline int str_is(const char *p, size_t n, const char *lit) { return n == strlen(lit) && !memcmp(p, lit, n); }

/* ---- reply_check.c: buffers, shapes, the layer plan, id checks */

/* n bytes from the caller's scratch, else owned by the result; NULL: out of memory. */
void *eldr__re_own(rctx *c, size_t n);
/* layers / top_k against the bounds and the expectation (the layer plan
 * is fixed by the first array); rows * L * K * isz without overflow into
 * *bytes. */
int eldr__re_check_dims(rctx *c, const char *what, size_t rows, size_t L, size_t K, size_t isz, size_t *bytes);
/* Every id of the view in the mask's layers must be in [0, num_experts). */
int eldr__re_check_ids(rctx *c, const char *what, const eldr_re_view *v);
/* Rows [row0, row0 + n) of v, the mask's layers: every id in [0,
 * num_experts); with counts (L*E), also counted in the same pass. */
int eldr__re_check_rows(rctx *c, const char *what, const eldr_re_view *v, size_t row0, size_t n, uint32_t *counts);
/* The plan keeps the layers not flagged in dense (nd of them are). */
int eldr__re_plan_from_dense(rctx *c, const char *what, const uint8_t *dense, size_t nd);
/* A view of the arrays' layers cut, in place, to the plan's layers. */
int eldr__re_apply_plan(rctx *c, const char *what, eldr_re_view *v);

/* ---- reply_values.c: one value */

/* A string value's bytes (escapes decoded into an owned buffer). */
int eldr__re_jv_str(rctx *c, const char *what, jv v, const char **p, size_t *n);
/* One routed_experts value of any layout; *layout receives its kind. With
 * check 0 the ids of base64 values are left to the caller; converted
 * lists are always checked. */
int eldr__re_read_value(rctx *c, const char *what, jv v, eldr_re_view *out, eldr_re_layout *layout, int check);
/* Generated rows at the end of R rows of a whole-sequence array (the rest
 * are the prompt's): P prompt and G generated tokens (-1: unknown). */
size_t eldr__re_gen_rows(size_t R, int64_t P, int64_t G);
/* Rows of a value of R rows (gen of them generated) to leave out for
 * c->skip (0: none). */
size_t eldr__re_skip_rows(const rctx *c, size_t R, size_t gen, int64_t P);

#endif
