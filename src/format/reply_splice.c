/* reply_splice.c — the prefill's prompt-side values put into a decode
 * reply by editing its bytes (see eldr/reply_splice.h). The documents are
 * read by the byte scanner; the edits (value spans and their replacements)
 * are collected, sorted and applied in one copy. */
#include "eldr/reply_splice.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/counts.h"
#include "eldr/jscan.h"
#include "eldr/routed_experts.h"

typedef struct edit {
  size_t off, len;  /* input span replaced (len 0: an insertion at off) */
  const char *rep;  /* its replacement: borrowed ... */
  char *own;        /* ... or owned */
  size_t rep_len;
  const char *pre;  /* an insertion's prefix (",\"key\":" or "\"key\":"), borrowed */
} edit;

typedef struct ctx {
  const char *dec, *pre;
  edit e[ELDR_SPLICE_MAX_EDITS];
  size_t n;
  int full;
} ctx;

static void add(ctx *c, size_t off, size_t len, const char *rep, char *own, size_t rep_len, const char *pre) {
  if (c->n >= ELDR_SPLICE_MAX_EDITS) {
    c->full = 1;
    free(own);
    return;
  }
  c->e[c->n++] = (edit){off, len, rep, own, rep_len, pre};
}

static eldr_js_span none(void) { return (eldr_js_span){0, 0, ELDR_JS_NONE}; }

/* The first element of an array span (NONE when empty or no array). */
static eldr_js_span first(const char *doc, eldr_js_span a) {
  eldr_js_span v = none();
  if (a.type != ELDR_JS_ARRAY) return v;
  eldr_js_iter it;
  eldr_js_iter_array(&it, doc, a);
  if (!eldr_js_next_elem(&it, &v)) v = none();
  return v;
}

static eldr_js_span get(const char *doc, eldr_js_span o, const char *key) {
  return o.type == ELDR_JS_OBJECT ? eldr_js_get(doc, o, key) : none();
}

/* Set obj[key] to the bytes val: the value replaced where the key is, else
 * the member appended before the object's closing brace. */
static void set_member(ctx *c, eldr_js_span obj, const char *key, const char *val, size_t vlen, const char *ins_first,
                       const char *ins_more) {
  eldr_js_span cur = eldr_js_get(c->dec, obj, key);
  if (cur.type != ELDR_JS_NONE) {
    add(c, cur.off, cur.len, val, NULL, vlen, NULL);
    return;
  }
  eldr_js_iter it;
  eldr_js_member m;
  eldr_js_iter_init(&it, c->dec, obj);
  const int empty = !eldr_js_next(&it, &m);
  add(c, obj.off + obj.len - 1, 0, val, NULL, vlen, empty ? ins_first : ins_more);
}

/* A base64 string value's bytes decoded into a new buffer. */
static int b64_of(const char *doc, eldr_js_span v, uint8_t **buf, size_t *n, eldr_diag *d) {
  const char *txt = doc + v.off + 1;
  size_t tl = v.len - 2;
  char *esc = NULL;
  if (memchr(txt, '\\', tl)) { /* escapes (base64 has none): the decoded string */
    if (!(esc = malloc(tl ? tl : 1))) return ELDR_ENOMEM;
    if (eldr_js_string(doc, v, esc, tl, &tl)) {
      free(esc);
      return eldr_diag_fail(d, ELDR_EPARSE, "routed_experts: a string the scanner cannot decode");
    }
    txt = esc;
  }
  size_t cap = eldr_b64_decoded_max(tl);
  *buf = malloc(cap ? cap : 1);
  int rc = *buf ? eldr_b64_decode(txt, tl, *buf, cap, n, d) : ELDR_ENOMEM;
  free(esc);
  if (rc) {
    free(*buf);
    *buf = NULL;
  }
  return rc;
}

/* An npy array's header and payload length checked: 3-d, payload exact. */
static int npy_of(const uint8_t *b, size_t n, eldr_npy_info *h, eldr_diag *d) {
  int rc = eldr_npy_parse_header(b, n, h, d);
  if (rc) return rc;
  size_t need;
  if (h->ndim != 3 || __builtin_mul_overflow(h->shape[0], h->shape[1] * h->shape[2], &need) ||
      __builtin_mul_overflow(need, eldr_sel_dtype_size(h->dtype), &need) || n - h->data_offset != need)
    return eldr_diag_fail(d, ELDR_ESHAPE, "routed_experts: not a (rows, layers, top_k) array of its length");
  return 0;
}

/* Store v as element i of a little-endian array of dtype t, when it fits. */
static int store(uint8_t *p, eldr_sel_dtype t, size_t i, int64_t v) {
  int64_t lo, hi;
  switch (t) {
  case ELDR_SEL_U8: lo = 0, hi = 255; break;
  case ELDR_SEL_U16LE: lo = 0, hi = 65535; break;
  case ELDR_SEL_I16LE: lo = -32768, hi = 32767; break;
  case ELDR_SEL_I32LE: lo = INT32_MIN, hi = INT32_MAX; break;
  case ELDR_SEL_I64LE: lo = INT64_MIN, hi = INT64_MAX; break;
  default: return -1;
  }
  if (v < lo || v > hi) return -1;
  const size_t w = eldr_sel_dtype_size(t);
  for (size_t b = 0; b < w; b++) p[i * w + b] = (uint8_t)((uint64_t)v >> (8 * b));
  return 0;
}

/* npy: the prefill's rows over the decode blob's prompt rows, in the
 * decoder's dtype, its header kept; the new string value in *rep. */
static int npy_splice(const char *dec, eldr_js_span dv, const uint8_t *pb, const eldr_npy_info *ph, int64_t P,
                      char **rep, size_t *rl, eldr_diag *d) {
  uint8_t *db = NULL;
  size_t dn = 0;
  eldr_npy_info dh;
  int rc = b64_of(dec, dv, &db, &dn, d);
  if (rc || (rc = npy_of(db, dn, &dh, d))) {
    free(db);
    return rc;
  }
  if (dh.shape[1] != ph->shape[1] || dh.shape[2] != ph->shape[2]) {
    free(db);
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "prefill and decode routed_experts differ in shape: (%zu, %zu, %zu) and (%zu, %zu, %zu)",
                          ph->shape[0], ph->shape[1], ph->shape[2], dh.shape[0], dh.shape[1], dh.shape[2]);
  }
  const size_t prow = ph->shape[0], drow = dh.shape[0], LK = dh.shape[1] * dh.shape[2];
  const size_t Pz = P >= 0 ? (size_t)P : prow, off = Pz >= prow ? Pz - prow : 0;
  const uint8_t *pp = pb + ph->data_offset;
  uint8_t *dp = db + dh.data_offset;
  for (size_t r = 0; r < prow && off + r < drow; r++)
    for (size_t i = 0; i < LK; i++) {
      const int64_t v = eldr_sel_load(pp, ph->dtype, r * LK + i);
      if (store(dp, dh.dtype, (off + r) * LK + i, v)) {
        free(db);
        return eldr_diag_fail(d, ELDR_ERANGE, "prefill expert id %lld does not fit the decode reply's dtype",
                              (long long)v);
      }
    }
  const size_t el = eldr_b64_encoded_len(dn);
  char *s = malloc(el + 3);
  if (!s) {
    free(db);
    return ELDR_ENOMEM;
  }
  s[0] = '"';
  eldr_b64_encode(db, dn, s + 1);
  s[el + 1] = '"';
  s[el + 2] = '\0';
  free(db);
  *rep = s;
  *rl = el + 2;
  return 0;
}

static size_t elems(const char *doc, eldr_js_span a) {
  eldr_js_iter it;
  eldr_js_span v;
  size_t n = 0;
  eldr_js_iter_array(&it, doc, a);
  while (eldr_js_next_elem(&it, &v)) n++;
  return n;
}

/* lists (PR #38939): the prefill's row bytes replace the decode list's rows
 * at the same prompt positions; the new list in *rep. */
static int lists_splice(const char *dec, eldr_js_span dv, const char *pre, eldr_js_span pv, int64_t P, char **rep,
                        size_t *rl, eldr_diag *d) {
  const size_t prow = elems(pre, pv);
  const size_t Pz = P >= 0 ? (size_t)P : prow, off = Pz >= prow ? Pz - prow : 0;
  char *s = malloc(dv.len + pv.len + 2);
  if (!s) return ELDR_ENOMEM;
  size_t o = 0, t = 0;
  s[o++] = '[';
  eldr_js_iter di, pi;
  eldr_js_span drv, prv;
  eldr_js_iter_array(&di, dec, dv);
  eldr_js_iter_array(&pi, pre, pv);
  for (; eldr_js_next_elem(&di, &drv); t++) {
    const char *src = dec + drv.off;
    size_t len = drv.len;
    if (t >= off && t - off < prow) {
      if (!eldr_js_next_elem(&pi, &prv) || prv.type != ELDR_JS_ARRAY || drv.type != ELDR_JS_ARRAY ||
          elems(pre, prv) != elems(dec, drv)) {
        free(s);
        return eldr_diag_fail(d, ELDR_ESHAPE, "prefill and decode routed_experts differ in shape");
      }
      src = pre + prv.off;
      len = prv.len;
    }
    if (t) s[o++] = ',';
    memcpy(s + o, src, len);
    o += len;
  }
  s[o++] = ']';
  s[o] = '\0';
  *rep = s;
  *rl = o;
  return 0;
}

/* The routed_experts edits, all or none (*spliced as the header says). */
static void splice_re(ctx *c, eldr_js_span droot, eldr_js_span proot, eldr_js_span dchoices, int *spliced,
                      eldr_diag *d) {
  *spliced = 0;
  const eldr_js_span ppre = get(c->pre, proot, "prompt_routed_experts");
  const eldr_js_span dpre = get(c->dec, droot, "prompt_routed_experts");
  if (ppre.type != ELDR_JS_NONE && ppre.type != ELDR_JS_NULL && dpre.type != ELDR_JS_NONE) {
    add(c, dpre.off, dpre.len, c->pre + ppre.off, NULL, ppre.len, NULL); /* vLLM 0.21 and later */
    *spliced = 1;
    return;
  }
  const eldr_js_span pre0 = get(c->pre, first(c->pre, get(c->pre, proot, "choices")), "routed_experts");
  if (pre0.type == ELDR_JS_NONE || pre0.type == ELDR_JS_NULL || ppre.type != ELDR_JS_NONE) {
    eldr_diag_fail(d, ELDR_ENOTFOUND, "prefill reply carries no prompt routed_experts to splice");
    return;
  }
  int64_t P = -1;
  eldr_js_int(c->pre, get(c->pre, get(c->pre, proot, "usage"), "prompt_tokens"), &P);
  uint8_t *pb = NULL;
  size_t pn = 0;
  eldr_npy_info ph;
  int rc = 0;
  if (pre0.type == ELDR_JS_STRING && ((rc = b64_of(c->pre, pre0, &pb, &pn, d)) || (rc = npy_of(pb, pn, &ph, d)))) {
    free(pb);
    *spliced = -1;
    return;
  }
  const size_t n0 = c->n;
  int count = 0;
  eldr_js_iter it;
  eldr_js_span ch;
  eldr_js_iter_array(&it, c->dec, dchoices);
  while (!rc && eldr_js_next_elem(&it, &ch)) {
    const eldr_js_span re = get(c->dec, ch, "routed_experts");
    char *rep = NULL;
    size_t rl = 0;
    if (re.type == ELDR_JS_STRING && pb) rc = npy_splice(c->dec, re, pb, &ph, P, &rep, &rl, d);
    else if (re.type == ELDR_JS_ARRAY && pre0.type == ELDR_JS_ARRAY) rc = lists_splice(c->dec, re, c->pre, pre0, P, &rep, &rl, d);
    else if (re.type != ELDR_JS_NONE && re.type != ELDR_JS_NULL)
      rc = eldr_diag_fail(d, ELDR_EINVAL, "prefill and decode routed_experts differ in layout");
    else continue;
    if (!rc) {
      add(c, re.off, re.len, rep, rep, rl, NULL);
      count++;
    }
  }
  free(pb);
  if (rc) { /* none of them */
    while (c->n > n0) free(c->e[--c->n].own);
    *spliced = rc == ELDR_ENOMEM ? -2 : -1;
    return;
  }
  if (!count) eldr_diag_fail(d, ELDR_ENOTFOUND, "decode reply carries no routed_experts");
  *spliced = count > 0;
}

static int by_off(const void *a, const void *b) {
  const edit *x = a, *y = b;
  return (x->off > y->off) - (x->off < y->off);
}

int eldr_reply_splice(const char *dec, size_t dlen, const char *pre, size_t plen, const eldr_splice_opts *o,
                      eldr_splice_result *res, eldr_diag *d) {
  memset(res, 0, sizeof *res);
  ctx *c = calloc(1, sizeof *c);
  if (!c) return ELDR_ENOMEM;
  c->dec = dec;
  c->pre = pre;
  eldr_js_span droot, proot;
  int rc = 0;
  if (memchr(dec, 0, dlen) || memchr(pre, 0, plen) || eldr_js_scan(dec, dlen, NULL, 0, NULL, &droot, NULL) ||
      eldr_js_scan(pre, plen, NULL, 0, NULL, &proot, NULL) || droot.type != ELDR_JS_OBJECT ||
      proot.type != ELDR_JS_OBJECT) {
    free(c);
    return eldr_diag_fail(d, ELDR_EPARSE, "decode or prefill reply is not a JSON object the scanner reads");
  }
  const eldr_js_span dchoices = get(dec, droot, "choices");
  eldr_diag sd = {{0}};
  if (o->routed_experts) {
    if (dchoices.type != ELDR_JS_ARRAY || !elems(dec, dchoices)) {
      res->spliced = -1;
      eldr_diag_fail(&sd, ELDR_EPARSE, "decode reply has no choices");
    } else {
      splice_re(c, droot, proot, dchoices, &res->spliced, &sd);
      if (res->spliced == -2) {
        rc = ELDR_ENOMEM;
        goto out;
      }
    }
  }
  if (o->prompt_logprobs) { /* the decoder computed no prompt logits: the prefill's */
    const eldr_js_span top = get(pre, proot, "prompt_logprobs");
    if (top.type != ELDR_JS_NONE && top.type != ELDR_JS_NULL)
      set_member(c, droot, "prompt_logprobs", pre + top.off, top.len, "\"prompt_logprobs\":", ",\"prompt_logprobs\":");
    const eldr_js_span pc = get(pre, first(pre, get(pre, proot, "choices")), "prompt_logprobs");
    if (pc.type != ELDR_JS_NONE && pc.type != ELDR_JS_NULL && dchoices.type == ELDR_JS_ARRAY) {
      eldr_js_iter it;
      eldr_js_span ch;
      eldr_js_iter_array(&it, dec, dchoices);
      while (eldr_js_next_elem(&it, &ch))
        if (ch.type == ELDR_JS_OBJECT)
          set_member(c, ch, "prompt_logprobs", pre + pc.off, pc.len, "\"prompt_logprobs\":", ",\"prompt_logprobs\":");
    }
  }
  if (c->full) {
    rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "more than %d values to edit in the decode reply", ELDR_SPLICE_MAX_EDITS);
    goto out;
  }
  if (!c->n) {
    rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "%s", sd.msg[0] ? sd.msg : "nothing to change in the decode reply");
    goto out;
  }
  if (res->spliced < 0 && d) *d = sd; /* why the rows were not spliced */
  qsort(c->e, c->n, sizeof *c->e, by_off);
  size_t total = dlen + 1;
  for (size_t i = 0; i < c->n; i++) total += c->e[i].rep_len + (c->e[i].pre ? strlen(c->e[i].pre) : 0);
  char *out = malloc(total);
  if (!out) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  size_t ip = 0, op = 0;
  for (size_t i = 0; i < c->n; i++) {
    const edit *e = &c->e[i];
    memcpy(out + op, dec + ip, e->off - ip);
    op += e->off - ip;
    const size_t start = op;
    if (e->pre) {
      memcpy(out + op, e->pre, strlen(e->pre));
      op += strlen(e->pre);
    }
    memcpy(out + op, e->rep, e->rep_len);
    op += e->rep_len;
    res->edits[res->nedits++] = (eldr_splice_edit){e->off, e->len, start, op - start};
    ip = e->off + e->len;
  }
  memcpy(out + op, dec + ip, dlen - ip);
  op += dlen - ip;
  out[op] = '\0';
  res->out = out;
  res->len = op;
out:
  for (size_t i = 0; i < c->n; i++) free(c->e[i].own);
  free(c);
  return rc;
}
