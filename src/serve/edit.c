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
#include "serve_internal.h"

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

/* An output buffer of known bound: the appends never overflow it. */
typedef struct obuf {
  char *p;
  size_t n;
  int first; /* no member written yet */
} obuf;

static void put(obuf *o, const char *s, size_t n) {
  memcpy(o->p + o->n, s, n);
  o->n += n;
}

static void put_member(obuf *o, const char *s, size_t n) {
  if (!o->first) put(o, ",", 1);
  o->first = 0;
  put(o, s, n);
}

/* "{" + the members of obj not named in drop + extra members + "}". */
static char *cut_object(const char *doc, eldr_js_span obj, const char *const *drop, const char *const *extra,
                        const size_t *extra_len, size_t nextra, size_t *len) {
  size_t cap = obj.len + 2;
  for (size_t k = 0; k < nextra; k++) cap += extra_len[k] + 1;
  obuf o = {malloc(cap + 1), 0, 1};
  if (!o.p) return NULL;
  put(&o, "{", 1);
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, doc, obj);
  while (eldr_js_next(&it, &m)) {
    if (key_in(doc, m.key, drop)) continue;
    put_member(&o, doc + m.off, m.len);
  }
  for (size_t k = 0; k < nextra; k++)
    if (extra[k]) put_member(&o, extra[k], extra_len[k]);
  put(&o, "}", 1);
  o.p[o.n] = 0;
  *len = o.n;
  return o.p;
}

/* The last member named key of obj (type NONE: none). */
static eldr_js_span last_member(const char *doc, eldr_js_span obj, const char *key) {
  eldr_js_span v = {0, 0, ELDR_JS_NONE};
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, doc, obj);
  while (eldr_js_next(&it, &m))
    if (eldr_js_key_is(doc, m.key, key)) v = m.value;
  return v;
}

static const char *const PREFILL_DROP[] = {"stream",     "max_tokens",            "max_completion_tokens",
                                           "stream_options", "min_tokens", "min_completion_tokens",
                                           "kv_transfer_params", NULL};

char *eldr__prefill_body(const eldr__req *r, size_t *len) {
  eldr_js_span root;
  if (!r->raw || !r->raw_ok || root_object(r->raw, r->raw_len, &root)) return eldr__prefill_body_tree(r, len);
  /* pass 1: is max_completion_tokens there (it is set to 1 only then)? */
  int has_mct = last_member(r->raw, root, "max_completion_tokens").type != ELDR_JS_NONE;
  static const char STREAM[] = "\"stream\":false", MAXT[] = "\"max_tokens\":1",
                    MAXC[] = "\"max_completion_tokens\":1",
                    KV[] = "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                           "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,"
                           "\"remote_port\":null}";
  const char *extra[4] = {STREAM, MAXT, has_mct ? MAXC : NULL, KV};
  size_t extra_len[4] = {sizeof STREAM - 1, sizeof MAXT - 1, sizeof MAXC - 1, sizeof KV - 1};
  return cut_object(r->raw, root, PREFILL_DROP, extra, extra_len, 4, len);
}

static const char *const DECODE_DROP[] = {"kv_transfer_params", "prompt_logprobs", NULL};

char *eldr__decode_body_raw(const eldr__req *r, const char *kv, size_t kv_len, size_t *len) {
  eldr_js_span root;
  if (!r->raw || !r->raw_ok || root_object(r->raw, r->raw_len, &root)) {
    json_t *kvp = kv_len ? json_loadb(kv, kv_len, 0, NULL) : NULL;
    if (kv_len && !kvp) return NULL;
    char *s = eldr__decode_body_tree(r, kvp, len);
    json_decref(kvp);
    return s;
  }
  static const char KEY[] = "\"kv_transfer_params\":";
  char *member = NULL;
  if (kv_len) {
    if (!(member = malloc(sizeof KEY - 1 + kv_len))) return NULL;
    memcpy(member, KEY, sizeof KEY - 1);
    memcpy(member + sizeof KEY - 1, kv, kv_len);
  }
  const char *extra[1] = {member};
  size_t extra_len[1] = {sizeof KEY - 1 + kv_len};
  char *s = cut_object(r->raw, root, DECODE_DROP, extra, extra_len, 1, len);
  free(member);
  return s;
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
    eldr_js_span k = last_member(doc, root, "kv_transfer_params");
    eldr_js_span u = last_member(doc, root, "usage");
    eldr_js_span t = u.type == ELDR_JS_OBJECT ? last_member(doc, u, "prompt_tokens_details") : u;
    if (k.type == ELDR_JS_OBJECT) kv = doc + k.off, pr->kv_len = k.len;
    if (t.type == ELDR_JS_OBJECT) det = doc + t.off, pr->det_len = t.len;
  } else if (json_is_object(pr->root)) { /* the tree's values, serialised */
    json_t *k = json_object_get(pr->root, "kv_transfer_params");
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
 * integer. 0 and *out, ELDR_ENOTFOUND (nothing to change), ELDR_EPARSE
 * (the scanner refused the reply) or ELDR_ENOMEM. */
static int usage_edit(const char *body, size_t len, const eldr__prefill_reply *pr, char **out, size_t *out_len) {
  static const eldr_js_path paths[] = {{{"usage", NULL}}, {{"usage", "completion_tokens", NULL}}};
  eldr_js_span f[2], root;
  if (eldr_js_scan(body, len, paths, 2, f, &root, NULL)) return ELDR_EPARSE;
  if (root.type != ELDR_JS_OBJECT || f[0].type != ELDR_JS_OBJECT) return ELDR_ENOTFOUND;
  int64_t ct = 0;
  int have_ct = eldr_js_int(body, f[1], &ct) == 0;
  static const char *const drop_ct[] = {"prompt_tokens", "prompt_tokens_details", "total_tokens", NULL};
  static const char *const drop_noct[] = {"prompt_tokens", "prompt_tokens_details", NULL};
  const char *const *drop = have_ct ? drop_ct : drop_noct;
  char pt[48], tt[48], nul[] = "\"prompt_tokens_details\":null";
  int ptl = snprintf(pt, sizeof pt, "\"prompt_tokens\":%lld", (long long)pr->prompt_tokens);
  int ttl = snprintf(tt, sizeof tt, "\"total_tokens\":%lld",
                     (long long)(int64_t)((uint64_t)pr->prompt_tokens + (uint64_t)ct));
  static const char DKEY[] = "\"prompt_tokens_details\":";
  char *det = NULL;
  if (pr->det_len) {
    if (!(det = malloc(sizeof DKEY - 1 + pr->det_len))) return ELDR_ENOMEM;
    memcpy(det, DKEY, sizeof DKEY - 1);
    memcpy(det + sizeof DKEY - 1, pr->bytes + pr->kv_len, pr->det_len);
  }
  /* did the decoder send prompt_tokens_details (then it becomes null)? */
  int had_det = last_member(body, f[0], "prompt_tokens_details").type != ELDR_JS_NONE;
  const char *extra[3] = {pt, det ? det : had_det ? nul : NULL, have_ct ? tt : NULL};
  size_t extra_len[3] = {(size_t)ptl, det ? sizeof DKEY - 1 + pr->det_len : sizeof nul - 1, (size_t)ttl};
  size_t ul = 0;
  char *u = cut_object(body, f[0], drop, extra, extra_len, 3, &ul);
  free(det);
  if (!u) return ELDR_ENOMEM;
  size_t head = f[0].off, tail = len - (f[0].off + f[0].len);
  char *o = malloc(head + ul + tail + 1);
  if (!o) {
    free(u);
    return ELDR_ENOMEM;
  }
  memcpy(o, body, head);
  memcpy(o + head, u, ul);
  memcpy(o + head + ul, body + f[0].off + f[0].len, tail);
  o[head + ul + tail] = 0;
  free(u);
  *out = o;
  *out_len = head + ul + tail;
  return 0;
}

int eldr__decode_reply_fix_pr(const char *decode_body, size_t len, eldr__prefill_reply *pr,
                              const eldr__fix_opts *o, char **out, size_t *out_len, int *spliced, eldr_diag *d) {
  *out = NULL;
  if (spliced) *spliced = 0;
  int tree = !o->usage || o->prompt_logprobs || pr->prompt_tokens < 0 ||
             (o->splice && eldr__memmem(decode_body, len, "routed_experts", 14));
  if (!tree) {
    int rc = usage_edit(decode_body, len, pr, out, out_len);
    if (rc == 0) return 0;
    if (rc == ELDR_ENOTFOUND) return eldr_diag_fail(d, ELDR_ENOTFOUND, "nothing to change in the decode reply");
    if (rc == ELDR_ENOMEM) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    /* refused by the scanner: jansson decides (and reports) */
  }
  json_t *proot = eldr__prefill_reply_root(pr);
  if (!proot) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  return eldr__decode_reply_fix(decode_body, len, proot, o, out, out_len, spliced, d);
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

int eldr__prefill_reply_read(const char *body, size_t len, int need_tree, eldr__prefill_reply *out,
                             eldr_diag *d) {
  /* a NUL byte: the scanner refuses it, jansson may not (it then decides) */
  if (need_tree) return eldr__prefill_reply_parse(body, len, out, d);
  static const eldr_js_path paths[] = {{{"kv_transfer_params", NULL}},
                                       {{"usage", "prompt_tokens", NULL}},
                                       {{"usage", "prompt_tokens_details", NULL}},
                                       {{"usage", "prompt_tokens_details", "cached_tokens", NULL}},
                                       {{"choices", "#0", "routed_experts", NULL}}};
  eldr_js_span f[5], root;
  if (eldr_js_scan(body, len, paths, 5, f, &root, NULL) || root.type != ELDR_JS_OBJECT)
    return eldr__prefill_reply_parse(body, len, out, d); /* its error message */
  memset(out, 0, sizeof *out);
  out->prompt_tokens = -1;
  int64_t x;
  if (eldr_js_int(body, f[1], &x) == 0 && x >= 0) out->prompt_tokens = x;
  if (f[2].type == ELDR_JS_OBJECT && eldr_js_int(body, f[3], &x) == 0 && x >= 0) out->cached_tokens = x;
  out->kv_len = f[0].type == ELDR_JS_OBJECT ? f[0].len : 0;
  out->det_len = f[2].type == ELDR_JS_OBJECT ? f[2].len : 0;
  out->raw = malloc(len + out->kv_len + out->det_len + 1);
  if (!out->raw) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  memcpy(out->raw, body, len);
  out->raw[len] = 0;
  out->raw_len = len;
  if (f[4].type == ELDR_JS_STRING) { /* its text as sent (escapes kept): presence and size */
    out->routed_experts = out->raw + f[4].off + 1;
    out->routed_experts_len = f[4].len - 2;
  }
  /* bytes: borrowed from the same allocation, after the copy */
  out->bytes = NULL;
  if (out->kv_len + out->det_len) {
    out->bytes = out->raw + len + 1;
    memcpy(out->bytes, body + f[0].off, out->kv_len);
    memcpy(out->bytes + out->kv_len, body + f[2].off, out->det_len);
  }
  return 0;
}
