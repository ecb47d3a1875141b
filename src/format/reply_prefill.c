/* reply_prefill.c — a prefill reply read once (see eldr/reply.h): by the
 * byte scanner into spans of a copy of its bytes (no tree), or by jansson
 * with a large routed_experts string cut out of the document first and put
 * back into the tree as a plain string. Either way the text of its
 * kv_transfer_params (less eldr's compact counts) and of
 * usage.prompt_tokens_details is kept as it lay in the reply, for the decode
 * leg's body and the decode reply's usage. */
#include "eldr/reply.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_compact.h"

/* ---- the tree path ------------------------------------------------------------ */

/* End of the JSON string whose opening quote is at o (index of the closing
 * quote), or NULL. */
static const char *string_end(const char *o, const char *end) {
  const char *e = o + 1;
  for (;;) {
    const char *q = memchr(e, '"', (size_t)(end - e));
    if (!q) return NULL;
    size_t bs = 0;
    while (q - bs > o + 1 && q[-1 - (long)bs] == '\\') bs++;
    if (!(bs & 1)) return q;
    e = q + 1;
  }
}

/* Locate the value of the first "routed_experts" key whose value is a plain
 * string (no escapes) by walking the string tokens of the document (every
 * '"' outside a string opens one). On success vs and ve point at the value's
 * opening and closing quotes. Only a fast path: the caller verifies the
 * result with a real parse of the rest. */
static int find_routed_experts(const char *b, size_t len, const char **vs, const char **ve) {
  static const char key[] = "routed_experts";
  const char *p = b, *end = b + len;
  for (;;) {
    const char *o = memchr(p, '"', (size_t)(end - p));
    if (!o) return -1;
    const char *c = string_end(o, end);
    if (!c) return -1;
    p = c + 1;
    if ((size_t)(c - o - 1) != sizeof key - 1 || memcmp(o + 1, key, sizeof key - 1)) continue;
    const char *q = p;
    while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
    if (q >= end || *q != ':') continue;
    q++;
    while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')) q++;
    if (q >= end || *q != '"') continue;
    const char *e = string_end(q, end);
    if (!e) return -1;
    if (memchr(q + 1, '\\', (size_t)(e - q - 1))) return -1; /* escapes: not a plain blob */
    *vs = q;
    *ve = e;
    return 0;
  }
}

#define RE_MARKER "\"\\u0001eldr:routed_experts\""

static json_t *choice0_re(json_t *root) {
  json_t *ch = json_object_get(root, "choices");
  json_t *c0 = json_is_array(ch) ? json_array_get(ch, 0) : NULL;
  return json_is_object(c0) ? json_object_get(c0, "routed_experts") : NULL;
}

static void reply_fields(json_t *root, eldr_reply_prefill *out) {
  json_t *re = choice0_re(root);
  if (json_is_string(re)) {
    out->routed_experts = json_string_value(re);
    out->routed_experts_len = json_string_length(re);
  }
  json_t *kv = json_object_get(root, "kv_transfer_params");
  if (json_is_object(kv)) out->kv_transfer_params = kv;
  json_t *u = json_object_get(root, "usage");
  if (json_is_object(u)) {
    json_t *pt = json_object_get(u, "prompt_tokens");
    if (json_is_integer(pt) && json_integer_value(pt) >= 0) out->prompt_tokens = json_integer_value(pt);
    json_t *det = json_object_get(u, "prompt_tokens_details");
    json_t *ct = json_is_object(det) ? json_object_get(det, "cached_tokens") : NULL;
    if (json_is_integer(ct) && json_integer_value(ct) >= 0) out->cached_tokens = json_integer_value(ct);
  }
}

/* kv_transfer_params (obj, an object span of doc) without eldr's compact
 * counts, into a new buffer: *out, *n. 0 or ELDR_ENOMEM. */
static int kv_without_compact(const char *doc, eldr_js_span obj, char **out, size_t *n) {
  static const char *const drop[] = {ELDR_COMPACT_KEY, NULL}; /* never sent on */
  if (!(*out = malloc(eldr_js_cut_max(obj, NULL, 0)))) return ELDR_ENOMEM;
  *n = eldr_js_cut(doc, obj, drop, NULL, 0, *out);
  return 0;
}

/* The text of pr's kv_transfer_params and usage.prompt_tokens_details, read
 * from the document pr was parsed from (doc[0..n), jansson accepted it). */
static int objects_text(const char *doc, size_t n, eldr_reply_prefill *pr) {
  free(pr->bytes);
  pr->bytes = NULL;
  pr->kv_len = pr->det_len = 0;
  const char *kv = NULL, *det = NULL;
  char *kvd = NULL, *detd = NULL;
  eldr_js_span root;
  if (!memchr(doc, 0, n) && eldr_js_root_object(doc, n, &root) == 0) {
    eldr_js_span k = eldr_js_get(doc, root, "kv_transfer_params");
    eldr_js_span u = eldr_js_get(doc, root, "usage");
    eldr_js_span t = u.type == ELDR_JS_OBJECT ? eldr_js_get(doc, u, "prompt_tokens_details") : u;
    if (k.type == ELDR_JS_OBJECT) kv = doc + k.off, pr->kv_len = k.len;
    if (t.type == ELDR_JS_OBJECT) det = doc + t.off, pr->det_len = t.len;
    if (k.type == ELDR_JS_OBJECT && eldr_js_get(doc, k, ELDR_COMPACT_KEY).type != ELDR_JS_NONE) {
      if (kv_without_compact(doc, k, &kvd, &pr->kv_len)) return ELDR_ENOMEM;
      kv = kvd;
    }
  } else if (json_is_object((json_t *)pr->root)) { /* the tree's values, serialised */
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

int eldr_reply_prefill_parse(const char *body, size_t len, eldr_reply_prefill *out, eldr_diag *d) {
  memset(out, 0, sizeof *out);
  out->prompt_tokens = -1;
  json_error_t je;
  json_t *root = NULL;
  /* Fast path: the base64 blob (MBs at long prompts) is cut out before the
   * JSON parser sees the document and borrowed from body directly. */
  const char *vs, *ve;
  if (find_routed_experts(body, len, &vs, &ve) == 0) {
    size_t pre = (size_t)(vs - body), post = len - (size_t)(ve + 1 - body);
    size_t ml = sizeof RE_MARKER - 1;
    char *small = malloc(pre + ml + post + 1);
    if (!small) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    memcpy(small, body, pre);
    memcpy(small + pre, RE_MARKER, ml);
    memcpy(small + pre + ml, ve + 1, post);
    root = json_loadb(small, pre + ml + post, 0, &je);
    json_t *re = root ? choice0_re(root) : NULL;
    if (json_is_object(root) && json_is_string(re) && json_string_length(re) == 20 &&
        !memcmp(json_string_value(re), "\001eldr:routed_experts", 20)) {
      /* the blob back in its place: a plain copy (no escapes, checked), so
       * the tree is the whole reply, parsed once, for every reader */
      json_t *blob = json_stringn_nocheck(vs + 1, (size_t)(ve - vs - 1));
      json_t *c0 = json_array_get(json_object_get(root, "choices"), 0);
      out->root = root;
      if (!blob || json_object_set_new(c0, "routed_experts", blob) || objects_text(small, pre + ml + post, out)) {
        free(small);
        eldr_reply_prefill_free(out);
        return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
      }
      free(small);
      reply_fields(root, out);
      return 0;
    }
    free(small);
    json_decref(root); /* not what it seemed: parse it the ordinary way */
  }
  root = json_loadb(body, len, 0, &je);
  if (!root)
    return eldr_diag_fail(d, ELDR_EPARSE, "prefill reply is not JSON: %s (column %d)", je.text, je.column);
  if (!json_is_object(root)) {
    json_decref(root);
    return eldr_diag_fail(d, ELDR_EPARSE, "prefill reply is not a JSON object");
  }
  out->root = root;
  if (objects_text(body, len, out)) {
    eldr_reply_prefill_free(out);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  reply_fields(root, out);
  return 0;
}

void eldr_reply_prefill_free(eldr_reply_prefill *p) {
  if (!p) return;
  json_decref(p->root);
  /* read by the scanner: bytes lie in raw's allocation; parsed into a
   * tree (raw then a copy of the reply kept beside it): bytes are their own */
  if (!p->raw || (uintptr_t)p->bytes - (uintptr_t)p->raw >= p->raw_cap) free(p->bytes);
  free(p->raw);
  memset(p, 0, sizeof *p);
}

/* ---- the scanner's read --------------------------------------------------------- */

void *eldr_reply_prefill_root(eldr_reply_prefill *pr) {
  if (!pr->root && pr->raw) { /* the parser that sets a routed_experts blob aside */
    eldr_reply_prefill t;
    if (eldr_reply_prefill_parse(pr->raw, pr->raw_len, &t, NULL) == 0) {
      pr->root = t.root;
      t.root = NULL;
      eldr_reply_prefill_free(&t);
    }
  }
  return pr->root;
}

void eldr_reply_prefill_clear(eldr_reply_prefill *p) {
  char *raw = p->raw;
  size_t cap = p->raw_cap;
  p->raw = NULL; /* bytes: borrowed from raw, not freed */
  if (raw && (uintptr_t)p->bytes - (uintptr_t)raw < cap) p->bytes = NULL;
  eldr_reply_prefill_free(p);
  p->raw = raw;
  p->raw_cap = cap;
}

/* The scanner's read of body into out: buf (*buf, *cap: a buffer the
 * caller owns, holding body when adopt) becomes out's copy; without adopt
 * body is copied into out's own buffer. */
static int reply_read(const char *body, size_t len, int need_tree, char **buf, size_t *cap,
                      eldr_reply_prefill *out, eldr_diag *d) {
  eldr_reply_prefill_clear(out);
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
    eldr_reply_prefill_free(out); /* the tree path: its own allocations (and error message) */
    int rc = eldr_reply_prefill_parse(body, len, out, d);
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
      eldr_reply_prefill_free(out);
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
      char *kb;
      if (kv_without_compact(out->raw, f[0], &kb, &out->kv_len)) { /* shorter than the span reserved */
        eldr_reply_prefill_free(out);
        return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
      }
      memcpy(out->bytes, kb, out->kv_len);
      free(kb);
    } else {
      memcpy(out->bytes, out->raw + f[0].off, out->kv_len);
    }
    memcpy(out->bytes + out->kv_len, out->raw + f[2].off, out->det_len);
  }
  return 0;
}

int eldr_reply_prefill_read(const char *body, size_t len, int need_tree, eldr_reply_prefill *out, eldr_diag *d) {
  return reply_read(body, len, need_tree, NULL, NULL, out, d);
}

int eldr_reply_prefill_adopt(char **buf, size_t *cap, size_t *len, int need_tree, eldr_reply_prefill *out,
                             eldr_diag *d) {
  const size_t n = *len;
  if (!*buf || *cap <= n) return reply_read(*buf ? *buf : "", n, need_tree, NULL, NULL, out, d);
  int rc = reply_read(*buf, n, need_tree, buf, cap, out, d);
  if (rc == 0 && out->raw) *len = 0; /* the scanner read it: exchanged, the caller's buffer holds nothing */
  return rc;
}
