/* fuzz_prefill_rewrite.c — the JSON rewriting of the PD legs. Input: a
 * client body (first byte picks completions/chat). For every body the
 * router accepts, the prefill leg must be the same object with exactly:
 * stream=false, max_tokens=1, max_completion_tokens=1 iff present,
 * stream_options and min_tokens removed, kv_transfer_params =
 * {do_remote_decode: true, do_remote_prefill: false, remote_*: null}; the
 * decode leg must be the original plus the given kv_transfer_params. Also
 * feeds the input to the prefill-reply reader and the routed_experts splice.
 * The bodies cut from the client's bytes (edit.c) and the decode reply's
 * usage edited in place equal what the jansson trees give. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/routed_experts.h"
#include "fuzz_body.h"
#include "serve/serve_internal.h"

static const char *const dropped[] = {"stream", "max_tokens", "max_completion_tokens",
                                      "stream_options", "min_tokens", "min_completion_tokens",
                                      "kv_transfer_params"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_fuzz_body in;
  if (eldr_fuzz_body_split(data, size, &in)) return 0;
  if (in.api == ELDR__API_GENERATE) return 0; /* the vLLM legs: the vLLM flow serves no /generate */
  eldr__req r;
  if (eldr__req_parse_tree(in.body, in.len, in.api, &r, NULL) == 0) { /* r.root: the tree to compare with */
    eldr__buf pb = {0};
    if (eldr__prefill_body_buf(&r, &pb)) abort();
    char *p = pb.p;
    const size_t pl = pb.n;
    json_t *pj = json_loadb(p, pl, 0, NULL);
    if (!pj) abort();
    if (!json_is_false(json_object_get(pj, "stream"))) abort();
    if (json_integer_value(json_object_get(pj, "max_tokens")) != 1) abort();
    json_t *mct = json_object_get(r.root, "max_completion_tokens");
    json_t *pmct = json_object_get(pj, "max_completion_tokens");
    if (mct ? json_integer_value(pmct) != 1 : pmct != NULL) abort();
    if (json_object_get(pj, "stream_options") || json_object_get(pj, "min_tokens") ||
        json_object_get(pj, "min_completion_tokens"))
      abort();
    json_t *want_kv = json_pack("{s:b,s:b,s:n,s:n,s:n,s:n}", "do_remote_decode", 1, "do_remote_prefill", 0,
                                "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
    if (!json_equal(json_object_get(pj, "kv_transfer_params"), want_kv)) abort();
    /* every other key unchanged */
    const char *k;
    json_t *v;
    json_object_foreach(r.root, k, v) {
      int skip = 0;
      for (size_t i = 0; i < sizeof dropped / sizeof *dropped; i++) skip |= !strcmp(k, dropped[i]);
      if (!skip && !json_equal(v, json_object_get(pj, k))) abort();
    }
    json_object_foreach(pj, k, v) {
      int skip = 0;
      for (size_t i = 0; i < sizeof dropped / sizeof *dropped; i++) skip |= !strcmp(k, dropped[i]);
      if (!skip && !json_object_get(r.root, k)) abort();
    }
    /* decode leg */
    char *kvs = json_dumps(want_kv, JSON_COMPACT | JSON_PRESERVE_ORDER);
    eldr__buf db = {0};
    if (!kvs || eldr__decode_body_buf(&r, kvs, strlen(kvs), &db)) abort();
    free(kvs);
    char *q = db.p;
    const size_t dl = db.n;
    json_t *dj = q ? json_loadb(q, dl, 0, NULL) : NULL;
    if (!dj) abort();
    /* without the prefill's: none at all (the client's never pass) */
    eldr__buf db2 = {0};
    if (eldr__decode_body_buf(&r, NULL, 0, &db2)) abort();
    json_t *dj2 = db2.p ? json_loadb(db2.p, db2.n, 0, NULL) : NULL;
    if (!dj2 || json_object_get(dj2, "kv_transfer_params")) abort();
    json_decref(dj2);
    eldr__buf_free(&db2);
    json_t *orig = json_deep_copy(r.root);
    json_object_del(orig, "prompt_logprobs");
    json_object_set(orig, "kv_transfer_params", want_kv);
    if (!json_equal(dj, orig)) abort();
    json_decref(orig);
    /* the bodies cut from the bytes equal the tree-built ones */
    size_t tl = 0;
    char *tp = eldr__prefill_body_tree(&r, &tl), *td = eldr__decode_body_tree(&r, want_kv, &tl);
    json_t *tpj = tp ? json_loads(tp, 0, NULL) : NULL, *tdj = td ? json_loads(td, 0, NULL) : NULL;
    if (!tpj || !tdj || !json_equal(tpj, pj) || !json_equal(tdj, dj)) abort();
    json_decref(tpj);
    json_decref(tdj);
    free(tp);
    free(td);
    json_decref(dj);
    json_decref(want_kv);
    json_decref(pj);
    free(q);
    free(p);
    eldr__req_free(&r);
  }
  /* the same bytes as a prefill reply and as a decode reply to splice */
  eldr_reply_prefill pr;
  if (eldr_reply_prefill_parse(in.body, in.len, &pr, NULL) == 0) {
    {
      char *out = NULL;
      size_t ol = 0;
      if (eldr__splice_routed_experts(in.body, in.len, pr.root, &out, &ol, NULL) == 0 && !out) abort();
      free(out);
    }
    /* read by the scanner alone: the same fields, the same tree on demand */
    eldr_reply_prefill ps = {0};
    if (eldr_reply_prefill_read(in.body, in.len, 0, &ps, NULL) != 0) abort();
    if (ps.prompt_tokens != pr.prompt_tokens || ps.cached_tokens != pr.cached_tokens ||
        ps.kv_len != pr.kv_len || ps.det_len != pr.det_len || (!ps.kv_len) != (!pr.kv_transfer_params) ||
        (ps.kv_len + ps.det_len && memcmp(ps.bytes, pr.bytes, ps.kv_len + ps.det_len)))
      abort();
    json_t *kvj = ps.kv_len ? json_loadb(ps.bytes, ps.kv_len, 0, NULL) : NULL;
    if (ps.kv_len && !json_equal(kvj, pr.kv_transfer_params)) abort();
    json_decref(kvj);
    if (!eldr_reply_prefill_root(&ps) || !json_equal(ps.root, pr.root)) abort();
    /* the same bytes as the decode reply: the usage edited in place equals
     * the tree's fix (same answer, same document) */
    {
      eldr__fix_opts fo = {0, 1, 0};
      char *b = NULL;
      size_t bl = 0;
      eldr__buf ab = {0};
      int ra = eldr__decode_reply_fix_buf(in.body, in.len, &pr, &fo, &ab, NULL, NULL);
      char *a = ab.p;
      size_t al = ab.n;
      int rb = eldr__decode_reply_fix(in.body, in.len, pr.root, &fo, &b, &bl, NULL, NULL);
      if (ra != rb) abort();
      if (ra == 0) {
        json_t *aj = json_loadb(a, al, 0, NULL), *bj = json_loadb(b, bl, 0, NULL);
        if (!aj || !bj || !json_equal(aj, bj)) abort();
        json_decref(aj);
        json_decref(bj);
      }
      free(a);
      free(b);
      eldr_reply_prefill_free(&ps);
      if (eldr_reply_prefill_read(in.body, in.len, 0, &ps, NULL) != 0) abort(); /* no tree built yet */
      ab = (eldr__buf){0};
      int rs = eldr__decode_reply_fix_buf(in.body, in.len, &ps, &fo, &ab, NULL, NULL);
      if (rs != rb) abort();
      eldr__buf_free(&ab);
      /* the reply's own buffer adopted (twice: buffers exchanged): the read's fields */
      eldr_reply_prefill pa;
      memset(&pa, 0, sizeof pa);
      for (int k = 0; k < 2; k++) {
        size_t cap = in.len + 1 + (size_t)k * 64;
        char *buf = malloc(cap);
        if (!buf) abort();
        memcpy(buf, in.body, in.len);
        buf[in.len] = 0;
        char *was = buf;
        size_t alen = in.len;
        if (eldr_reply_prefill_adopt(&buf, &cap, &alen, 0, &pa, NULL) != 0) abort();
        if (alen != (ps.raw ? 0 : in.len)) abort(); /* emptied only when exchanged */
        /* the scanner's read: buffers exchanged; else (a NUL byte: the tree) untouched */
        if ((!ps.raw) != (!pa.raw) || (ps.raw && (buf == was || memcmp(pa.raw, in.body, in.len))) ||
            (!ps.raw && buf != was) || pa.prompt_tokens != ps.prompt_tokens ||
            pa.cached_tokens != ps.cached_tokens || pa.kv_len != ps.kv_len || pa.det_len != ps.det_len ||
            (pa.kv_len + pa.det_len && memcmp(pa.bytes, ps.bytes, pa.kv_len + pa.det_len)) ||
            pa.routed_experts_len != ps.routed_experts_len || (!pa.routed_experts) != (!ps.routed_experts) ||
            (pa.routed_experts && memcmp(pa.routed_experts, ps.routed_experts, pa.routed_experts_len)))
          abort();
        free(buf);
      }
      eldr_reply_prefill_free(&pa);
      eldr_reply_prefill_free(&ps);
    }
    if (pr.routed_experts) {
      uint8_t *buf = NULL;
      size_t cap = 0;
      eldr_re_view v;
      eldr_shape sh = {2, 8, 2};
      eldr_routed_experts_view(pr.routed_experts, pr.routed_experts_len, &sh, &buf, &cap, &v, NULL);
      free(buf);
    }
    eldr_reply_prefill_free(&pr);
  }
  return 0;
}
