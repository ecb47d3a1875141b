/* fuzz_req_scan.c — the client request read by the byte scanner
 * (src/serve/reqscan.c) against the jansson path. Input: a client body
 * (fuzz_body.h: the first byte picks completions, chat or /generate). Whatever the scanner takes, jansson
 * takes too, with the same fields (stream, return_routed_experts,
 * prompt_logprobs, the prompt's text or token ids) and the same leg bodies
 * (the prefill and decode requests cut from the scanned request equal the
 * ones built from the tree); a second read into the same request (its
 * buffers reused) gives the same; and eldr__req_read, the router's entry,
 * returns what the jansson path returns, with the same error message. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_body.h"
#include "serve/serve_internal.h"

static void same_json(const char *a, size_t al, const char *b, size_t bl) {
  json_t *x = a ? json_loadb(a, al, 0, NULL) : NULL, *y = b ? json_loadb(b, bl, 0, NULL) : NULL;
  if (!x || !y || !json_equal(x, y)) abort();
  json_decref(x);
  json_decref(y);
}

static void same_fields(const eldr__req *s, const eldr__req *t) {
  if (s->stream != t->stream || s->want_routed_experts != t->want_routed_experts ||
      s->prompt_logprobs != t->prompt_logprobs || s->text_len != t->text_len ||
      memcmp(s->text, t->text, t->text_len + 1) || s->n_ids != t->n_ids ||
      (t->n_ids && memcmp(s->ids, t->ids, t->n_ids * sizeof *t->ids)) || !s->raw_ok || s->root)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_fuzz_body in;
  if (eldr_fuzz_body_split(data, size, &in)) return 0;
  eldr__req t;
  eldr_diag dt = {{0}};
  int rt = eldr__req_parse_tree(in.body, in.len, in.api, &t, &dt);
  /* the router's entry: the same result and message as the tree path */
  eldr__req r = {0};
  eldr_diag dr = {{0}};
  int rr = eldr__req_read(in.body, in.len, in.api, &r, &dr);
  if (rr != rt || strcmp(dr.msg, dt.msg)) abort();
  eldr__req_free(&r);
  if (!memchr(in.body, 0, in.len)) {
    eldr__req s = {0};
    for (int pass = 0; pass < 2; pass++) { /* the second into the same buffers */
      int rs = eldr__req_scan(in.body, in.len, in.api, &s);
      if (rs == ELDR_ENOMEM) break;
      if (rs == 1) continue; /* not taken: the tree path decides */
      if (rs != 0 || rt != 0) abort();
      same_fields(&s, &t);
      size_t tl = 0;
      eldr__buf sb = {0};
      if (eldr__prefill_body_buf(&s, &sb)) abort();
      char *tp = eldr__prefill_body_tree(&t, &tl);
      same_json(sb.p, sb.n, tp, tl);
      free(tp);
      static const char KV[] = "{\"do_remote_prefill\":true,\"remote_engine_id\":\"e0\",\"remote_block_ids\":[1,2]}";
      json_t *kv = json_loads(KV, 0, NULL);
      if (eldr__decode_body_buf(&s, KV, sizeof KV - 1, &sb)) abort();
      char *td = eldr__decode_body_tree(&t, kv, &tl);
      same_json(sb.p, sb.n, td, tl);
      eldr__buf_free(&sb);
      free(td);
      json_decref(kv);
      eldr__req_clear(&s);
    }
    eldr__req_free(&s);
  }
  if (rt == 0) eldr__req_free(&t);
  return 0;
}
