/* fuzz_sglang_reply.c — libFuzzer target for an SGLang worker's reply as
 * the router will read it (eldr/reply_sglang.h, eldr_sglang_reply_experts:
 * "sglext" / meta_info routed_experts, the rows from the reply's
 * prompt_tokens). Input: the reply's bytes, read in place. The artifact:
 * 3 MoE layers at model layers 1, 3 and 6 of 16 experts, top-2, with a
 * layer mask or not (the input's length parity). Checks: no crash, no
 * read past the input, no allocation a short payload did not pay for (ASan's
 * allocation limit); 0: rows > 0, at least 7 hidden layers, every kept id
 * < 16 and counts summing to rows x top_k per kept layer; 1: nothing read;
 * an error: a reason and a message. Else abort. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_sglang.h"

enum { L = 3, E = 16, K = 2 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const uint32_t ids[L] = {1, 3, 6};
  static const uint8_t mask[L] = {1, 0, 1};
  eldr_sglang_opts o = {0, L, ids, K, E, (size & 1) ? mask : NULL};
  uint8_t *buf = NULL;
  size_t cap = 0, rows = 0;
  uint32_t hidden = 0, counts[L * E] = {0};
  eldr_re_reason why = ELDR_RE__N;
  eldr_diag d = {{0}};
  int rc = eldr_sglang_reply_experts((const char *)data, size, &o, &buf, &cap, &hidden, &rows, counts, &why, &d);
  if (rc < 0) {
    if (why == ELDR_RE_OK || why >= ELDR_RE__N || !d.msg[0]) abort();
  } else if (rc == 1) {
    if (why != ELDR_RE_OK) abort();
  } else if (rc == 0) {
    if (why != ELDR_RE_OK || !rows || hidden < 7) abort();
    for (uint32_t l = 0; l < L; l++) {
      uint64_t sum = 0;
      for (uint32_t e = 0; e < E; e++) sum += counts[l * E + e];
      if (sum != (o.layer_mask && !o.layer_mask[l] ? 0 : (uint64_t)rows * K)) abort();
    }
  } else {
    abort();
  }
  free(buf);
  return 0;
}
