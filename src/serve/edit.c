/* edit.c — the legs' bodies cut from the bytes they come from, not
 * rebuilt from a tree: the prefill and decode requests from the client's
 * body, the decode reply's usage edited in place (include/eldr/jscan.h).
 *
 * A body jansson accepted that has no NUL byte is one the scanner accepts
 * too (fuzz_jscan checks that on every input), so the member walk of
 * jscan.h may run on it without a second validation; a body with a NUL
 * byte (jansson drops one after a number or literal) takes the tree path.
 * Output member order: the kept members as the client sent them, then the
 * router's own; a repeated key stays repeated (the engine keeps the last,
 * as jansson did). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"
#include "eldr/reply_compact.h"
#include "eldr/reply_splice.h"
#include "serve_internal.h"

int eldr__buf_reserve(eldr__buf *b, size_t need) {
  if (need + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need + 1) cap *= 2;
  char *q = realloc(b->p, cap);
  if (!q) return ELDR_ENOMEM;
  b->p = q;
  b->cap = cap;
  return 0;
}

void eldr__buf_free(eldr__buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* The top-level object of an accepted document without NUL bytes. */
static int root_object(const char *doc, size_t n, eldr_js_span *root) {
  size_t a = 0, b = n;
  while (a < n && (doc[a] == ' ' || doc[a] == '\t' || doc[a] == '\n' || doc[a] == '\r')) a++;
  while (b > a && (doc[b - 1] == ' ' || doc[b - 1] == '\t' || doc[b - 1] == '\n' || doc[b - 1] == '\r')) b--;
  if (b - a < 2 || doc[a] != '{') return -1;
  *root = (eldr_js_span){a, b - a, ELDR_JS_OBJECT};
  return 0;
}

static int key_in(const char *doc, eldr_js_span key, const char *const *names) {
  for (; *names; names++)
    if (eldr_js_key_is(doc, key, *names)) return 1;
  return 0;
}

/* A member the router adds: the bytes a[0..an) then b[0..bn) (a NULL: none). */
typedef struct piece {
  const char *a;
  size_t an;
  const char *b;
  size_t bn;
} piece;

/* Appends into a buffer reserved for them (they never overflow it). */
typedef struct obuf {
  char *p;
  size_t n;
  int first; /* no member written yet */
} obuf;

static void put(obuf *o, const char *s, size_t n) {
  memcpy(o->p + o->n, s, n);
  o->n += n;
}

static void put_member(obuf *o, const char *s, size_t n, const char *s2, size_t n2) {
  if (!o->first) put(o, ",", 1);
  o->first = 0;
  put(o, s, n);
  if (n2) put(o, s2, n2);
}

/* Append "{" + the members of obj not named in drop + the extra members +
 * "}" to out (NUL-terminated): 0 or ELDR_ENOMEM. */
static int cut_object(eldr__buf *out, const char *doc, eldr_js_span obj, const char *const *drop,
                      const piece *extra, size_t nextra) {
  size_t cap = obj.len + 2;
  for (size_t k = 0; k < nextra; k++) cap += extra[k].an + extra[k].bn + 1;
  if (eldr__buf_reserve(out, out->n + cap)) return ELDR_ENOMEM;
  obuf o = {out->p + out->n, 0, 1};
  put(&o, "{", 1);
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, doc, obj);
  while (eldr_js_next(&it, &m)) {
    if (key_in(doc, m.key, drop)) continue;
    put_member(&o, doc + m.off, m.len, NULL, 0);
  }
  for (size_t k = 0; k < nextra; k++)
    if (extra[k].a) put_member(&o, extra[k].a, extra[k].an, extra[k].b, extra[k].bn);
  put(&o, "}", 1);
  out->n += o.n;
  out->p[out->n] = 0;
  return 0;
}

/* A malloc'd body from the tree path, moved into out. */
static int take(eldr__buf *out, char *s, size_t len) {
  if (!s) return ELDR_ENOMEM;
  free(out->p);
  out->p = s;
  out->n = len;
  out->cap = len + 1;
  return 0;
}

static const char *const PREFILL_DROP[] = {"stream",     "max_tokens",            "max_completion_tokens",
                                           "stream_options", "min_tokens", "min_completion_tokens",
                                           "kv_transfer_params", NULL};

int eldr__prefill_body_buf(const eldr__req *r, eldr__buf *out) {
  eldr_js_span root;
  out->n = 0;
  if (!r->raw || !r->raw_ok || root_object(r->raw, r->raw_len, &root)) {
    size_t len = 0;
    char *s = eldr__prefill_body_tree(r, &len);
    return take(out, s, len);
  }
  /* is max_completion_tokens there (it is set to 1 only then)? */
  int has_mct = eldr_js_get(r->raw, root, "max_completion_tokens").type != ELDR_JS_NONE;
  static const char STREAM[] = "\"stream\":false", MAXT[] = "\"max_tokens\":1",
                    MAXC[] = "\"max_completion_tokens\":1",
                    KV[] = "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                           "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,"
                           "\"remote_port\":null}";
  const piece extra[4] = {{STREAM, sizeof STREAM - 1, NULL, 0},
                          {MAXT, sizeof MAXT - 1, NULL, 0},
                          {has_mct ? MAXC : NULL, sizeof MAXC - 1, NULL, 0},
                          {KV, sizeof KV - 1, NULL, 0}};
  return cut_object(out, r->raw, root, PREFILL_DROP, extra, 4);
}

char *eldr__prefill_body(const eldr__req *r, size_t *len) {
  eldr__buf b = {0};
  if (eldr__prefill_body_buf(r, &b)) return NULL;
  *len = b.n;
  return b.p;
}

static const char *const DECODE_DROP[] = {"kv_transfer_params", "prompt_logprobs", NULL};

int eldr__decode_body_buf(const eldr__req *r, const char *kv, size_t kv_len, eldr__buf *out) {
  eldr_js_span root;
  out->n = 0;
  if (!r->raw || !r->raw_ok || root_object(r->raw, r->raw_len, &root)) {
    json_t *kvp = kv_len ? json_loadb(kv, kv_len, 0, NULL) : NULL;
    if (kv_len && !kvp) return ELDR_ENOMEM;
    size_t len = 0;
    char *s = eldr__decode_body_tree(r, kvp, &len);
    json_decref(kvp);
    return take(out, s, len);
  }
  static const char KEY[] = "\"kv_transfer_params\":";
  const piece extra[1] = {{kv_len ? KEY : NULL, sizeof KEY - 1, kv, kv_len}};
  return cut_object(out, r->raw, root, DECODE_DROP, extra, 1);
}

char *eldr__decode_body_raw(const eldr__req *r, const char *kv, size_t kv_len, size_t *len) {
  eldr__buf b = {0};
  if (eldr__decode_body_buf(r, kv, kv_len, &b)) return NULL;
  *len = b.n;
  return b.p;
}

char *eldr__decode_body(const eldr__req *r, json_t *kvp, size_t *len) {
  if (!kvp) return eldr__decode_body_raw(r, NULL, 0, len);
  char *kv = json_dumps(kvp, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!kv) return NULL;
  char *s = eldr__decode_body_raw(r, kv, strlen(kv), len);
  free(kv);
  return s;
}

/* ---- the prefill reply's small objects, as text ---------------------------- */

int eldr__prefill_reply_bytes(const char *doc, size_t n, eldr__prefill_reply *pr) {
  free(pr->bytes);
  pr->bytes = NULL;
  pr->kv_len = pr->det_len = 0;
  const char *kv = NULL, *det = NULL;
  char *kvd = NULL, *detd = NULL;
  eldr_js_span root;
  if (!memchr(doc, 0, n) && root_object(doc, n, &root) == 0) {
    eldr_js_span k = eldr_js_get(doc, root, "kv_transfer_params");
    eldr_js_span u = eldr_js_get(doc, root, "usage");
    eldr_js_span t = u.type == ELDR_JS_OBJECT ? eldr_js_get(doc, u, "prompt_tokens_details") : u;
    if (k.type == ELDR_JS_OBJECT) kv = doc + k.off, pr->kv_len = k.len;
    if (t.type == ELDR_JS_OBJECT) det = doc + t.off, pr->det_len = t.len;
    if (k.type == ELDR_JS_OBJECT && eldr_js_get(doc, k, ELDR_COMPACT_KEY).type != ELDR_JS_NONE) {
      static const char *const drop[] = {ELDR_COMPACT_KEY, NULL}; /* never sent on */
      eldr__buf kb = {0};
      if (cut_object(&kb, doc, k, drop, NULL, 0)) return ELDR_ENOMEM;
      kv = kvd = kb.p;
      pr->kv_len = kb.n;
    }
  } else if (json_is_object(pr->root)) { /* the tree's values, serialised */
    json_t *k = json_object_get(pr->root, "kv_transfer_params");
    if (json_object_get(k, ELDR_COMPACT_KEY)) json_object_del(k, ELDR_COMPACT_KEY); /* never sent on */
    json_t *t = json_object_get(json_object_get(pr->root, "usage"), "prompt_tokens_details");
    if (json_is_object(k) && !(kv = kvd = json_dumps(k, JSON_COMPACT | JSON_PRESERVE_ORDER))) return ELDR_ENOMEM;
    if (json_is_object(t) && !(det = detd = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
      free(kvd);
      return ELDR_ENOMEM;
    }
    pr->kv_len = kv ? strlen(kv) : 0;
    pr->det_len = det ? strlen(det) : 0;
  }
  int rc = 0;
  if (pr->kv_len + pr->det_len) {
    if (!(pr->bytes = malloc(pr->kv_len + pr->det_len))) {
      pr->kv_len = pr->det_len = 0;
      rc = ELDR_ENOMEM;
    } else {
      if (pr->kv_len) memcpy(pr->bytes, kv, pr->kv_len);
      if (pr->det_len) memcpy(pr->bytes + pr->kv_len, det, pr->det_len);
    }
  }
  free(kvd);
  free(detd);
  return rc;
}

/* ---- the decode reply's usage, edited in place ----------------------------- */

/* usage as fix_usage (rewrite.c) sets it: prompt_tokens and its details
 * from the prefill, total_tokens their sum when completion_tokens is an
 * integer, written into out. 0, ELDR_ENOTFOUND (nothing to change),
 * ELDR_EPARSE (the scanner refused the reply) or ELDR_ENOMEM. */
static int usage_edit(const char *body, size_t len, const eldr__prefill_reply *pr, eldr__buf *out) {
  static const eldr_js_path paths[] = {{{"usage", NULL}}, {{"usage", "completion_tokens", NULL}}};
  eldr_js_span f[2], root;
  if (eldr_js_scan(body, len, paths, 2, f, &root, NULL)) return ELDR_EPARSE;
  if (root.type != ELDR_JS_OBJECT || f[0].type != ELDR_JS_OBJECT) return ELDR_ENOTFOUND;
  int64_t ct = 0;
  int have_ct = eldr_js_int(body, f[1], &ct) == 0;
  static const char *const drop_ct[] = {"prompt_tokens", "prompt_tokens_details", "total_tokens", NULL};
  static const char *const drop_noct[] = {"prompt_tokens", "prompt_tokens_details", NULL};
  const char *const *drop = have_ct ? drop_ct : drop_noct;
  char pt[48], tt[48];
  static const char nul[] = "\"prompt_tokens_details\":null", DKEY[] = "\"prompt_tokens_details\":";
  char *w = ELDR__PUT_LIT(pt, "\"prompt_tokens\":");
  w = eldr__put_i64(w, pr->prompt_tokens);
  size_t ptl = (size_t)(w - pt);
  w = ELDR__PUT_LIT(tt, "\"total_tokens\":");
  w = eldr__put_i64(w, (int64_t)((uint64_t)pr->prompt_tokens + (uint64_t)ct));
  size_t ttl = (size_t)(w - tt);
  /* did the decoder send prompt_tokens_details (then it becomes null)? */
  int had_det = eldr_js_get(body, f[0], "prompt_tokens_details").type != ELDR_JS_NONE;
  piece extra[3] = {{pt, ptl, NULL, 0}, {NULL, 0, NULL, 0}, {have_ct ? tt : NULL, ttl, NULL, 0}};
  if (pr->det_len) extra[1] = (piece){DKEY, sizeof DKEY - 1, pr->bytes + pr->kv_len, pr->det_len};
  else if (had_det) extra[1] = (piece){nul, sizeof nul - 1, NULL, 0};
  size_t head = f[0].off, tail = len - (f[0].off + f[0].len);
  out->n = 0;
  if (eldr__buf_reserve(out, len)) return ELDR_ENOMEM;
  memcpy(out->p, body, head);
  out->n = head;
  if (cut_object(out, body, f[0], drop, extra, 3) || eldr__buf_reserve(out, out->n + tail)) return ELDR_ENOMEM;
  memcpy(out->p + out->n, body + f[0].off + f[0].len, tail);
  out->n += tail;
  out->p[out->n] = 0;
  return 0;
}

/* routed_experts and prompt_logprobs by editing bytes (format/reply_splice.c),
 * then the usage edit: every byte the router does not mean to change is the
 * decoder's. 0, ELDR_ENOTFOUND (nothing changed), ELDR_EPARSE (the scanner
 * refused a document: the tree path decides) or ELDR_ENOMEM. */
static int bytes_fix(const char *body, size_t len, eldr__prefill_reply *pr, const eldr__fix_opts *o, int re,
                     eldr__buf *out, int *spliced, eldr_diag *d) {
  eldr_splice_opts so = {re, o->prompt_logprobs};
  eldr_splice_result res;
  eldr_diag sd = {{0}};
  int rc = eldr_reply_splice(body, len, pr->raw, pr->raw_len, &so, &res, &sd);
  if (rc != 0 && rc != ELDR_ENOTFOUND) return rc;
  if (spliced) *spliced = res.spliced;
  if (res.spliced < 0 && d) *d = sd;
  const char *b = rc == 0 ? res.out : body;
  size_t bl = rc == 0 ? res.len : len;
  int urc = ELDR_ENOTFOUND;
  if (o->usage && pr->prompt_tokens >= 0) urc = usage_edit(b, bl, pr, out);
  if (urc == 0 || urc == ELDR_ENOMEM || urc == ELDR_EPARSE) {
    free(res.out);
    if (urc == ELDR_EPARSE) out->n = 0;
    return urc;
  }
  if (rc == ELDR_ENOTFOUND) return eldr_diag_fail(d, ELDR_ENOTFOUND, "nothing to change in the decode reply");
  take(out, res.out, res.len);
  return 0;
}

int eldr__decode_reply_fix_buf(const char *decode_body, size_t len, eldr__prefill_reply *pr,
                               const eldr__fix_opts *o, eldr__buf *out, int *spliced, eldr_diag *d) {
  out->n = 0;
  if (spliced) *spliced = 0;
  const int re = o->splice && eldr__memmem(decode_body, len, "routed_experts", 14);
  if ((re || o->prompt_logprobs) && pr->raw) { /* the prefill's bytes: edit, never re-serialise */
    int rc = bytes_fix(decode_body, len, pr, o, re, out, spliced, d);
    if (rc != ELDR_EPARSE) {
      if (rc == ELDR_ENOMEM) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
      return rc;
    }
    out->n = 0; /* refused by the scanner: jansson decides (and reports) */
    if (spliced) *spliced = 0;
  }
  int tree = !o->usage || o->prompt_logprobs || pr->prompt_tokens < 0 || re;
  if (!tree) {
    int rc = usage_edit(decode_body, len, pr, out);
    if (rc == 0) return 0;
    out->n = 0;
    if (rc == ELDR_ENOTFOUND) return eldr_diag_fail(d, ELDR_ENOTFOUND, "nothing to change in the decode reply");
    if (rc == ELDR_ENOMEM) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    /* refused by the scanner: jansson decides (and reports) */
  }
  json_t *proot = eldr__prefill_reply_root(pr);
  if (!proot) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  char *s = NULL;
  size_t sl = 0;
  int rc = eldr__decode_reply_fix(decode_body, len, proot, o, &s, &sl, spliced, d);
  if (rc == 0) take(out, s, sl);
  return rc;
}

int eldr__decode_reply_fix_pr(const char *decode_body, size_t len, eldr__prefill_reply *pr,
                              const eldr__fix_opts *o, char **out, size_t *out_len, int *spliced, eldr_diag *d) {
  eldr__buf b = {0};
  int rc = eldr__decode_reply_fix_buf(decode_body, len, pr, o, &b, spliced, d);
  if (rc) {
    free(b.p);
    *out = NULL;
    return rc;
  }
  *out = b.p;
  *out_len = b.n;
  return 0;
}

/* ---- a prefill reply read by the scanner alone ------------------------------ */

json_t *eldr__prefill_reply_root(eldr__prefill_reply *pr) {
  if (!pr->root && pr->raw) { /* the parser that sets a routed_experts blob aside */
    eldr__prefill_reply t;
    if (eldr__prefill_reply_parse(pr->raw, pr->raw_len, &t, NULL) == 0) {
      pr->root = t.root;
      t.root = NULL;
      eldr__prefill_reply_free(&t);
    }
  }
  return pr->root;
}

void eldr__prefill_reply_clear(eldr__prefill_reply *p) {
  char *raw = p->raw;
  size_t cap = p->raw_cap;
  p->raw = NULL; /* bytes: borrowed from raw, not freed */
  if (raw && (uintptr_t)p->bytes - (uintptr_t)raw < cap) p->bytes = NULL;
  eldr__prefill_reply_free(p);
  p->raw = raw;
  p->raw_cap = cap;
}

int eldr__prefill_reply_read(const char *body, size_t len, int need_tree, eldr__prefill_reply *out,
                             eldr_diag *d) {
  memset(out, 0, sizeof *out);
  return eldr__prefill_reply_reread(body, len, need_tree, out, d);
}

/* The scanner's read of body into out: buf (*buf, *cap: a buffer the
 * caller owns, holding body when adopt) becomes out's copy; without adopt
 * body is copied into out's own buffer. */
static int reply_read(const char *body, size_t len, int need_tree, char **buf, size_t *cap,
                      eldr__prefill_reply *out, eldr_diag *d) {
  eldr__prefill_reply_clear(out);
  static const eldr_js_path paths[] = {{{"kv_transfer_params", NULL}},
                                       {{"usage", "prompt_tokens", NULL}},
                                       {{"usage", "prompt_tokens_details", NULL}},
                                       {{"usage", "prompt_tokens_details", "cached_tokens", NULL}},
                                       {{"choices", "#0", "routed_experts", NULL}},
                                       {{"kv_transfer_params", ELDR_COMPACT_KEY, NULL}}};
  eldr_js_span f[6], root;
  /* a NUL byte: the scanner refuses it (test_jscan), jansson may not: it then decides */
  const int scanned = !memchr(body, 0, len) && eldr_js_scan(body, len, paths, 6, f, &root, NULL) == 0 &&
                      root.type == ELDR_JS_OBJECT;
  if (need_tree || !scanned) {
    eldr__prefill_reply_free(out); /* the tree path: its own allocations (and error message) */
    int rc = eldr__prefill_reply_parse(body, len, out, d);
    if (rc == 0 && scanned) { /* the bytes too: the decode reply's edits insert the prefill's bytes */
      if (buf) { /* the caller's buffer becomes ours: nothing copied */
        out->raw = *buf;
        out->raw_cap = *cap;
        *buf = NULL;
        *cap = 0;
      } else if ((out->raw = malloc(len + 1))) {
        memcpy(out->raw, body, len);
        out->raw_cap = len + 1;
      }
      if (out->raw) {
        out->raw[len] = 0;
        out->raw_len = len;
        if (f[5].type == ELDR_JS_OBJECT && f[0].type == ELDR_JS_OBJECT) out->compact = f[5];
      }
    }
    return rc;
  }
  out->prompt_tokens = -1;
  int64_t x;
  if (eldr_js_int(body, f[1], &x) == 0 && x >= 0) out->prompt_tokens = x;
  if (f[2].type == ELDR_JS_OBJECT && eldr_js_int(body, f[3], &x) == 0 && x >= 0) out->cached_tokens = x;
  out->kv_len = f[0].type == ELDR_JS_OBJECT ? f[0].len : 0;
  out->det_len = f[2].type == ELDR_JS_OBJECT ? f[2].len : 0;
  size_t need = len + out->kv_len + out->det_len + 1;
  char **pb = buf ? buf : &out->raw;
  size_t *pc = buf ? cap : &out->raw_cap;
  if (need > *pc) {
    char *q = realloc(*pb, need);
    if (!q) {
      eldr__prefill_reply_free(out);
      return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    }
    *pb = q;
    *pc = need;
    if (buf) body = q;
  }
  if (buf) { /* the caller's buffer becomes the copy; out's old one goes back */
    char *t = out->raw;
    size_t tc = out->raw_cap;
    out->raw = *buf;
    out->raw_cap = *cap;
    *buf = t;
    *cap = tc;
  } else {
    memcpy(out->raw, body, len);
  }
  out->raw[len] = 0;
  out->raw_len = len;
  if (f[4].type == ELDR_JS_STRING) { /* its text as sent (escapes kept): presence and size */
    out->routed_experts = out->raw + f[4].off + 1;
    out->routed_experts_len = f[4].len - 2;
  }
  /* bytes: borrowed from the same allocation, after the copy; the
   * kv_transfer_params without eldr's compact counts (never sent on) */
  if (f[5].type == ELDR_JS_OBJECT && f[0].type == ELDR_JS_OBJECT) out->compact = f[5];
  if (out->kv_len + out->det_len) {
    out->bytes = out->raw + len + 1;
    if (out->compact.type == ELDR_JS_OBJECT) {
      static const char *const drop[] = {ELDR_COMPACT_KEY, NULL};
      eldr__buf kb = {0};
      if (cut_object(&kb, out->raw, f[0], drop, NULL, 0)) {
        eldr__prefill_reply_free(out);
        return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
      }
      out->kv_len = kb.n; /* shorter than the span reserved for it */
      memcpy(out->bytes, kb.p, out->kv_len);
      eldr__buf_free(&kb);
    } else {
      memcpy(out->bytes, out->raw + f[0].off, out->kv_len);
    }
    memcpy(out->bytes + out->kv_len, out->raw + f[2].off, out->det_len);
  }
  return 0;
}

int eldr__prefill_reply_reread(const char *body, size_t len, int need_tree, eldr__prefill_reply *out,
                               eldr_diag *d) {
  return reply_read(body, len, need_tree, NULL, NULL, out, d);
}

int eldr__prefill_reply_adopt(char **buf, size_t *cap, size_t *len, int need_tree, eldr__prefill_reply *out,
                              eldr_diag *d) {
  const size_t n = *len;
  if (!*buf || *cap <= n) return reply_read(*buf ? *buf : "", n, need_tree, NULL, NULL, out, d);
  int rc = reply_read(*buf, n, need_tree, buf, cap, out, d);
  if (rc == 0 && out->raw) *len = 0; /* the scanner read it: exchanged, the caller's buffer holds nothing */
  return rc;
}
