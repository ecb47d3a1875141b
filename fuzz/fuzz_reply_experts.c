/* fuzz_reply_experts.c — libFuzzer target for the routed_experts reply
 * reader (eldr/reply_experts.h).
 *
 * The input is read three ways: as a whole reply body (completions and
 * chat, expecting L=2 K=2 E=8, with and without a layer mask, and with no
 * expectation), and wrapped so the fuzzer reaches the payload decoders
 * directly: base64 of the input as a choice's npy string and as the data of
 * a compact {"encoding","dtype","shape","data"} object. On success every id
 * of every view (in the mask's layers) must be in [0, E) and every view must
 * lie inside what the reader owns (ASan checks the reads); on failure the
 * reason and the message are set and the result is empty. Each read is
 * repeated with a caller's scratch (reused across inputs) and fused counting
 * (eldr_re_opts.counts): same return code, reason and message, the same
 * views' contents, and counts equal to the per-id reference count of the
 * first choice's prompt view (core/counts_ref.h). And each read is done by
 * the span reader too (eldr_reply_experts_scan, no tree), on a body without
 * NUL bytes: same return code, reason, message (but a NOT_JSON one's
 * wording), layout, views and counts as the tree reader; and on a body the
 * scanner accepts, eldr_reply_experts_scanned (no second validation) gives
 * what eldr_reply_experts_scan does, and eldr_reply_experts_scanned_skip
 * the same less the first choice's prompt rows it was told to leave out.
 * Else abort. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/counts_ref.h"
#include "eldr/jscan.h"
#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"

static eldr_re_scratch scratch; /* reused across inputs, as the router does */

static int same_view(const eldr_re_view *a, const eldr_re_view *b) {
  if (!a->data || !b->data) return !a->data && !b->data && a->rows == b->rows;
  return a->dtype == b->dtype && a->rows == b->rows && a->layers == b->layers &&
         a->top_k == b->top_k && a->first_token == b->first_token &&
         !memcmp(a->data, b->data, a->rows * a->layers * a->top_k * eldr_sel_dtype_size(a->dtype));
}

static int64_t elem(const eldr_re_view *v, size_t i) { return eldr_sel_load(v->data, v->dtype, i); }

static void check_view(const eldr_re_view *v, const eldr_re_opts *o) {
  if (!v->data) {
    if (v->rows) abort();
    return;
  }
  if (!v->rows || v->layers < 1 || v->layers > ELDR_MAX_LAYERS || v->top_k < 1 || v->top_k > ELDR_MAX_TOPK)
    abort();
  if ((o->num_layers && v->layers != o->num_layers) || (o->top_k && v->top_k != o->top_k)) abort();
  const int64_t lim = o->num_experts ? o->num_experts : ELDR_MAX_EXPERTS;
  for (size_t t = 0; t < v->rows; t++)
    for (size_t l = 0; l < v->layers; l++) {
      if (o->layer_mask && !o->layer_mask[l]) continue;
      for (size_t k = 0; k < v->top_k; k++) {
        int64_t e = elem(v, (t * v->layers + l) * v->top_k + k);
        if (e < 0 || e >= lim) abort();
      }
    }
}

static void one(const char *body, size_t len, const eldr_re_opts *o) {
  eldr_reply_experts r;
  eldr_re_reason why = ELDR_RE__N;
  eldr_diag d;
  d.msg[0] = '\0';
  int rc = eldr_reply_experts_read(body, len, o, &r, &why, &d);
  if (rc) {
    if (why == ELDR_RE_OK || why >= ELDR_RE__N || d.msg[0] == '\0' || r.choices || r.nchoices) abort();
    eldr_reply_experts_free(&r);
    return;
  }
  if (why != ELDR_RE_OK) abort();
  for (size_t i = 0; i < r.nchoices; i++) {
    check_view(&r.choices[i].prompt, o);
    check_view(&r.choices[i].generated, o);
  }
  eldr_reply_experts_free(&r);
}

/* The same read with scratch and fused counting against the plain one. */
static void fused(const char *body, size_t len, const eldr_re_opts *o) {
  eldr_reply_experts r, f;
  eldr_re_reason w1 = ELDR_RE__N, w2 = ELDR_RE__N;
  eldr_diag d1, d2;
  d1.msg[0] = d2.msg[0] = '\0';
  uint32_t counts[2 * 8];
  memset(counts, 0, sizeof counts);
  eldr_re_opts fo = *o;
  fo.scratch = &scratch;
  fo.counts = counts;
  int r1 = eldr_reply_experts_read(body, len, o, &r, &w1, &d1);
  int r2 = eldr_reply_experts_read(body, len, &fo, &f, &w2, &d2);
  if (r1 != r2 || w1 != w2 || strcmp(d1.msg, d2.msg)) abort();
  if (!r1) {
    if (r.nchoices != f.nchoices || r.layout != f.layout) abort();
    for (size_t i = 0; i < r.nchoices; i++)
      if (!same_view(&r.choices[i].prompt, &f.choices[i].prompt) ||
          !same_view(&r.choices[i].generated, &f.choices[i].generated))
        abort();
    const eldr_re_view *pv = f.nchoices ? &f.choices[0].prompt : NULL;
    if (f.counted != (pv && pv->data != NULL)) abort();
    if (f.counted) {
      uint32_t ref[2 * 8];
      memset(ref, 0, sizeof ref);
      const eldr_shape s = {2, 8, 2};
      if (eldr__counts_ref(&s, pv->data, pv->dtype, pv->rows, o->layer_mask, ref, NULL) ||
          memcmp(ref, counts, sizeof ref))
        abort();
    }
  }
  eldr_reply_experts_free(&r);
  eldr_reply_experts_free(&f);
}

/* Whether the reader may leave rows out of body's first choice: its prompt
 * rows come apart (prompt_routed_experts), or the generated token count
 * that splits a whole-sequence array is known (as the reader takes it:
 * choice 0's token_ids, or usage.completion_tokens with one choice). */
static int may_skip(const char *body, size_t len) {
  json_t *r = json_loadb(body, len, 0, NULL);
  json_t *ch = json_array_get(json_object_get(r, "choices"), 0);
  json_t *ct = json_object_get(json_object_get(r, "usage"), "completion_tokens");
  int ok = json_object_get(r, "prompt_routed_experts") != NULL || json_is_array(json_object_get(ch, "token_ids")) ||
           (json_array_size(json_object_get(r, "choices")) == 1 && json_is_integer(ct) && json_integer_value(ct) >= 0);
  json_decref(r);
  return ok;
}

/* eldr_reply_experts_scanned_skip against the whole read full (which
 * succeeded, counted): it succeeds too, its first choice's prompt view is
 * the full one without the rows of prompt tokens before skip (at most all
 * but the last, none without usage), its counts those of that view, every
 * other view the same. */
static void skipped(const char *body, size_t len, const eldr_re_opts *o, eldr_js_span known,
                    const eldr_reply_experts *full, size_t skip, int skips) {
  uint32_t c[2 * 8];
  memset(c, 0, sizeof c);
  eldr_re_opts os = *o;
  os.counts = c;
  eldr_reply_experts s;
  eldr_re_reason w = ELDR_RE__N;
  eldr_diag d;
  d.msg[0] = '\0';
  if (eldr_reply_experts_scanned_skip(body, len, &os, known, skip, &s, &w, &d) || s.nchoices != full->nchoices ||
      s.layout != full->layout || !s.counted)
    abort();
  eldr_re_view want = full->choices[0].prompt;
  size_t k = 0;
  if (full->prompt_tokens >= 0 && skip > want.first_token && want.rows >= 2 && skips)
    k = skip - want.first_token < want.rows - 1 ? skip - want.first_token : want.rows - 1;
  want.data = (const uint8_t *)want.data + k * want.layers * want.top_k * eldr_sel_dtype_size(want.dtype);
  want.rows -= k;
  want.first_token += k;
  if (!same_view(&s.choices[0].prompt, &want)) abort();
  for (size_t i = 0; i < s.nchoices; i++)
    if ((i && !same_view(&s.choices[i].prompt, &full->choices[i].prompt)) ||
        !same_view(&s.choices[i].generated, &full->choices[i].generated))
      abort();
  uint32_t ref[2 * 8];
  memset(ref, 0, sizeof ref);
  const eldr_shape sh = {2, 8, 2};
  if (eldr__counts_ref(&sh, want.data, want.dtype, want.rows, o->layer_mask, ref, NULL) || memcmp(ref, c, sizeof c))
    abort();
  eldr_reply_experts_free(&s);
}

/* The span reader against the tree reader (counts with both, or neither). */
static void spans(const char *body, size_t len, const eldr_re_opts *o) {
  if (memchr(body, 0, len)) return; /* jansson reads past some NULs, the scanner refuses them */
  eldr_reply_experts r, f;
  eldr_re_reason w1 = ELDR_RE__N, w2 = ELDR_RE__N;
  eldr_diag d1, d2;
  d1.msg[0] = d2.msg[0] = '\0';
  uint32_t c1[2 * 8], c2[2 * 8];
  memset(c1, 0, sizeof c1);
  memset(c2, 0, sizeof c2);
  eldr_re_opts o1 = *o, o2 = *o;
  if (o->num_layers == 2) {
    o1.counts = c1;
    o2.counts = c2;
    o2.scratch = &scratch;
  }
  int r1 = eldr_reply_experts_read(body, len, &o1, &r, &w1, &d1);
  int r2 = eldr_reply_experts_scan(body, len, &o2, &f, &w2, &d2);
  if (r1 != r2 || w1 != w2 || (w1 != ELDR_RE_NOT_JSON && strcmp(d1.msg, d2.msg))) abort();
  if (!r1) {
    if (r.nchoices != f.nchoices || r.layout != f.layout || r.prompt_tokens != f.prompt_tokens ||
        r.counted != f.counted || memcmp(c1, c2, sizeof c1))
      abort();
    for (size_t i = 0; i < r.nchoices; i++)
      if (r.choices[i].index != f.choices[i].index || !same_view(&r.choices[i].prompt, &f.choices[i].prompt) ||
          !same_view(&r.choices[i].generated, &f.choices[i].generated))
        abort();
  }
  eldr_reply_experts_free(&r);
  eldr_reply_experts_free(&f);
  /* a document the scanner accepted, read again without validation (the
   * router's signature path): what the validating span reader gave */
  eldr_js_span root, blob[2];
  /* the spans the router's prefill reply scan finds: each one as a known string */
  static const eldr_js_path paths[] = {{{"choices", "#0", "routed_experts", NULL}},
                                       {{"prompt_routed_experts", NULL}}};
  if (eldr_js_scan(body, len, paths, 2, blob, &root, NULL) == 0)
    for (int k = 0; k < 3; k++) {
      const eldr_js_span known = k == 0 ? (eldr_js_span){0, 0, ELDR_JS_NONE} : blob[k - 1];
      if (k && known.type != ELDR_JS_STRING) continue;
      w1 = w2 = ELDR_RE__N;
      d1.msg[0] = d2.msg[0] = '\0';
      memset(c1, 0, sizeof c1);
      memset(c2, 0, sizeof c2);
      r1 = eldr_reply_experts_scan(body, len, &o1, &r, &w1, &d1);
      r2 = eldr_reply_experts_scanned(body, len, &o2, known, &f, &w2, &d2);
      if (r1 != r2 || w1 != w2 || strcmp(d1.msg, d2.msg) || memcmp(c1, c2, sizeof c1)) abort();
      if (!r1) {
        if (r.nchoices != f.nchoices || r.layout != f.layout || r.counted != f.counted) abort();
        for (size_t i = 0; i < r.nchoices; i++)
          if (!same_view(&r.choices[i].prompt, &f.choices[i].prompt) ||
              !same_view(&r.choices[i].generated, &f.choices[i].generated))
            abort();
        if (o->num_layers == 2 && r.counted) skipped(body, len, &o2, known, &r, len % 7, may_skip(body, len));
      }
      eldr_reply_experts_free(&r);
      eldr_reply_experts_free(&f);
    }
}

static void all(const char *body, size_t len) {
  static const uint8_t mask[2] = {0, 1};
  static const uint32_t ids[2] = {1, 3}; /* an all-layers array of 4 or more layers: rows 1 and 3 */
  const eldr_re_opts os[] = {
      {ELDR_RE_COMPLETIONS, 2, 2, 8, NULL, NULL, NULL, NULL, 0, NULL},
      {ELDR_RE_CHAT, 2, 2, 8, mask, NULL, NULL, NULL, 0, NULL},
      {ELDR_RE_COMPLETIONS, 0, 0, 0, NULL, NULL, NULL, NULL, 0, NULL},
      {ELDR_RE_COMPLETIONS, 2, 2, 8, mask, NULL, NULL, ids, 0, NULL},
      {ELDR_RE_CHAT, 0, 0, 8, NULL, NULL, NULL, NULL, 1, NULL},
  };
  for (size_t i = 0; i < sizeof os / sizeof *os; i++) {
    one(body, len, &os[i]);
    spans(body, len, &os[i]);
  }
  fused(body, len, &os[0]);
  fused(body, len, &os[1]);
  fused(body, len, &os[3]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  all((const char *)data, size);
  if (size > (1u << 20)) return 0;
  char *b64 = malloc(eldr_b64_encoded_len(size) + 1);
  char *wrap = malloc(eldr_b64_encoded_len(size) + 512);
  if (!b64 || !wrap) abort();
  eldr_b64_encode(data, size, b64);
  int n = sprintf(wrap, "{\"usage\":{\"prompt_tokens\":3},\"choices\":[{\"routed_experts\":\"%s\"}]}", b64);
  all(wrap, (size_t)n);
  /* shape from the first bytes so that lengths sometimes agree */
  unsigned rows = size ? data[0] % 5 : 0, L = size > 1 ? data[1] % 6 : 2, K = size > 2 ? data[2] % 3 : 2;
  const char *dt[] = {"int16", "uint8", "int32", "int64", "uint16"};
  n = sprintf(wrap,
              "{\"usage\":{\"prompt_tokens\":4},\"choices\":[{}],\"prompt_routed_experts\":"
              "{\"encoding\":\"base64\",\"dtype\":\"%s\",\"shape\":[%u,%u,%u],\"data\":\"%s\"}}",
              dt[size % 5], rows, L, K, b64);
  all(wrap, (size_t)n);
  free(b64);
  free(wrap);
  return 0;
}
