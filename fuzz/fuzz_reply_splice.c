/* fuzz_reply_splice.c — libFuzzer target for the byte splice of a decode
 * reply (eldr/reply_splice.h: the router puts the prefill's prompt rows and
 * prompt_logprobs into the decoder's reply by editing bytes).
 *
 * The input is the decode reply; the prefill reply is one of three fixed
 * ones (npy rows, vLLM 0.21's top-level lists, PR #38939's per-choice
 * lists; each with prompt_logprobs). For each, with every option set, the
 * result must be: sorted, non-overlapping edits inside the input; every
 * input byte outside an edited span equal to the output's in the same
 * place between edits (the decoder's bytes, never re-serialised); an output
 * the scanner accepts; an npy splice whose prompt rows are the prefill's.
 * Else abort. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"
#include "eldr/reply_splice.h"
#include "eldr/routed_experts.h"

static char npy_prefill[512];

static void init(void) {
  if (npy_prefill[0]) return;
  const uint16_t sel[8] = {1, 2, 3, 4, 5, 6, 7, 0}; /* (2 rows, 2 layers, top-2) */
  const eldr_shape s = {2, 8, 2};
  char *b64 = NULL;
  if (eldr_routed_experts_encode(sel, 2, &s, ELDR_SEL_U8, &b64, NULL)) abort();
  snprintf(npy_prefill, sizeof npy_prefill,
           "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"routed_experts\":\"%s\","
           "\"prompt_logprobs\":[null,{\"5\":{\"logprob\":-0.1}}]}],\"usage\":{\"prompt_tokens\":2}}",
           b64);
  free(b64);
}

static const char V021[] =
    "{\"object\":\"chat.completion\",\"prompt_routed_experts\":[[[1,2],[3,4]],[[5,6],[7,0]]],"
    "\"prompt_logprobs\":[null,{\"9\":{\"logprob\":-1.2345678e-05}}],\"choices\":[{\"index\":0}],"
    "\"usage\":{\"prompt_tokens\":2}}";
static const char LISTS[] =
    "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"routed_experts\":[[[1,2],[3,4]],[[5,6],[7,0]]]}],"
    "\"usage\":{\"prompt_tokens\":2}}";

static void one(const char *dec, size_t n, const char *pre) {
  eldr_splice_opts o = {1, 1};
  eldr_splice_result r;
  int rc = eldr_reply_splice(dec, n, pre, strlen(pre), &o, &r, NULL);
  if (rc == ELDR_EPARSE || rc == ELDR_ENOTFOUND) {
    if (r.out) abort();
    return;
  }
  if (rc) abort(); /* ENOMEM does not happen at these sizes */
  if (!r.out || r.out[r.len] != '\0' || !r.nedits) abort();
  size_t ip = 0, op = 0;
  for (size_t i = 0; i < r.nedits; i++) {
    const eldr_splice_edit *e = &r.edits[i];
    if (e->in_off < ip || e->in_off + e->in_len > n || e->out_off < op || e->out_off + e->out_len > r.len) abort();
    if (e->in_off - ip != e->out_off - op || memcmp(dec + ip, r.out + op, e->in_off - ip)) abort();
    ip = e->in_off + e->in_len;
    op = e->out_off + e->out_len;
  }
  if (n - ip != r.len - op || memcmp(dec + ip, r.out + op, n - ip)) abort();
  eldr_js_span root;
  if (eldr_js_scan(r.out, r.len, NULL, 0, NULL, &root, NULL) || root.type != ELDR_JS_OBJECT) abort();
  if (r.spliced == 1 && pre == npy_prefill) { /* decode rows [P - 2, P) are the prefill's (P = 2) */
    static const eldr_js_path re0[1] = {{{"choices", "#0", "routed_experts", NULL}}};
    eldr_js_span f;
    if (eldr_js_scan(r.out, r.len, re0, 1, &f, NULL, NULL) == 0 && f.type == ELDR_JS_STRING &&
        !memchr(r.out + f.off + 1, '\\', f.len - 2)) {
      uint16_t *sel = NULL;
      size_t rows = 0;
      eldr_shape sh;
      if (eldr_routed_experts_decode(r.out + f.off + 1, f.len - 2, NULL, &sel, &rows, &sh, NULL) == 0) {
        static const uint16_t want[8] = {1, 2, 3, 4, 5, 6, 7, 0};
        if (sh.num_layers != 2 || sh.top_k != 2) abort(); /* spliced: the prefill's shape */
        for (size_t i = 0; i < 8 && i / 4 < rows; i++)
          if (sel[i] != want[i]) abort();
        free(sel);
      }
    }
  }
  free(r.out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  init();
  const char *dec = (const char *)data;
  one(dec, size, npy_prefill);
  one(dec, size, V021);
  one(dec, size, LISTS);
  return 0;
}
