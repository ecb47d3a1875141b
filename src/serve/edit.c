/* edit.c — the byte path of every body the router writes: cut from the
 * bytes it comes from, not rebuilt from a tree (include/eldr/jscan.h). The
 * prefill and decode requests from the client's body; the decode reply
 * with the prefill's routed_experts and prompt_logprobs put in
 * (eldr/reply_splice.h) and its usage edited in place. What the byte
 * editor does not take goes to the tree path (rewrite.c); the prefill
 * reply itself is read by format's eldr/reply.h.
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

/* Append "{" + the members of obj not named in drop + the extra members +
 * "}" to out (NUL-terminated): 0 or ELDR_ENOMEM. */
static int cut_object(eldr__buf *out, const char *doc, eldr_js_span obj, const char *const *drop,
                      const eldr_js_piece *extra, size_t nextra) {
  if (eldr__buf_reserve(out, out->n + eldr_js_cut_max(obj, extra, nextra))) return ELDR_ENOMEM;
  out->n += eldr_js_cut(doc, obj, drop, extra, nextra, out->p + out->n);
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
  if (!r->raw || !r->raw_ok || eldr_js_root_object(r->raw, r->raw_len, &root)) {
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
  const eldr_js_piece extra[4] = {{STREAM, sizeof STREAM - 1, NULL, 0},
                          {MAXT, sizeof MAXT - 1, NULL, 0},
                          {has_mct ? MAXC : NULL, sizeof MAXC - 1, NULL, 0},
                          {KV, sizeof KV - 1, NULL, 0}};
  return cut_object(out, r->raw, root, PREFILL_DROP, extra, 4);
}

static const char *const DECODE_DROP[] = {"kv_transfer_params", "prompt_logprobs", NULL};

int eldr__decode_body_buf(const eldr__req *r, const char *kv, size_t kv_len, eldr__buf *out) {
  eldr_js_span root;
  out->n = 0;
  if (!r->raw || !r->raw_ok || eldr_js_root_object(r->raw, r->raw_len, &root)) {
    json_t *kvp = kv_len ? json_loadb(kv, kv_len, 0, NULL) : NULL;
    if (kv_len && !kvp) return ELDR_ENOMEM;
    size_t len = 0;
    char *s = eldr__decode_body_tree(r, kvp, &len);
    json_decref(kvp);
    return take(out, s, len);
  }
  static const char KEY[] = "\"kv_transfer_params\":";
  const eldr_js_piece extra[1] = {{kv_len ? KEY : NULL, sizeof KEY - 1, kv, kv_len}};
  return cut_object(out, r->raw, root, DECODE_DROP, extra, 1);
}

/* ---- the decode reply's usage, edited in place ----------------------------- */

/* usage as fix_usage (rewrite.c) sets it: prompt_tokens and its details
 * from the prefill, total_tokens their sum when completion_tokens is an
 * integer, written into out. 0, ELDR_ENOTFOUND (nothing to change),
 * ELDR_EPARSE (the scanner refused the reply) or ELDR_ENOMEM. */
static int usage_edit(const char *body, size_t len, const eldr_reply_prefill *pr, eldr__buf *out) {
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
  eldr_js_piece extra[3] = {{pt, ptl, NULL, 0}, {NULL, 0, NULL, 0}, {have_ct ? tt : NULL, ttl, NULL, 0}};
  if (pr->det_len) extra[1] = (eldr_js_piece){DKEY, sizeof DKEY - 1, pr->bytes + pr->kv_len, pr->det_len};
  else if (had_det) extra[1] = (eldr_js_piece){nul, sizeof nul - 1, NULL, 0};
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
static int bytes_fix(const char *body, size_t len, eldr_reply_prefill *pr, const eldr__fix_opts *o, int re,
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

int eldr__decode_reply_fix_buf(const char *decode_body, size_t len, eldr_reply_prefill *pr,
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
  json_t *proot = eldr_reply_prefill_root(pr);
  if (!proot) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  char *s = NULL;
  size_t sl = 0;
  int rc = eldr__decode_reply_fix(decode_body, len, proot, o, &s, &sl, spliced, d);
  if (rc == 0) take(out, s, sl);
  return rc;
}
