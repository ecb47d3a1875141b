/* fuzz_reply_sglang.c — libFuzzer target for SGLang's routed_experts form
 * (eldr/reply_sglang.h: base64 of raw int32 rows over the model's hidden
 * layers, no shape on the wire), the bytes an SGLang prefill worker sends
 * in "sglext" / meta_info.
 *
 * Input: the first byte gives the rows the reader expects (1 + b % 8) and
 * whether a layer mask is used (b & 8); the rest is the base64 text, read
 * in place (ASan catches a read past it). The artifact: 2 MoE layers at
 * model layers 1 and 3, 8 experts, top-2. Checks: no crash or
 * out-of-bounds read; a success reports reason OK, hidden layers >= 4,
 * every kept id < 8, counts summing to rows x top_k in every kept layer
 * and 0 in a masked one, and the rows it read come back the same when
 * emitted at that hidden size and read again; a failure names a reason
 * and a message. Else abort. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_sglang.h"

enum { L = 2, E = 8, K = 2 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const uint32_t ids[L] = {1, 3};
  static const uint8_t mask[L] = {0, 1};
  size_t rows = 1 + data[0] % 8;
  eldr_sglang_opts o = {rows, L, ids, K, E, (data[0] & 8) ? mask : NULL};
  uint8_t *buf = NULL;
  size_t cap = 0;
  uint32_t hidden = 0, counts[L * E] = {0};
  eldr_re_reason why = ELDR_RE__N;
  eldr_diag d = {{0}};
  int rc = eldr_sglang_experts_read((const char *)data + 1, size - 1, &o, &buf, &cap, &hidden, counts, &why, &d);
  if (rc != 0) {
    if (why == ELDR_RE_OK || why >= ELDR_RE__N || !d.msg[0]) abort();
    free(buf);
    return 0;
  }
  if (why != ELDR_RE_OK || hidden < 4) abort();
  uint16_t sel[8 * L * K];
  for (size_t i = 0; i < rows * L * K; i++) {
    int32_t v = (int32_t)((uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 | (uint32_t)buf[4 * i + 2] << 16 |
                          (uint32_t)buf[4 * i + 3] << 24);
    if (v < 0 || v >= E) abort();
    sel[i] = (uint16_t)v;
  }
  for (uint32_t l = 0; l < L; l++) {
    uint32_t sum = 0;
    for (uint32_t e = 0; e < E; e++) sum += counts[l * E + e];
    if (sum != (o.layer_mask && !o.layer_mask[l] ? 0 : rows * K)) abort();
  }
  /* emitted again at that hidden size, it reads back to the same rows */
  eldr_shape sh = {L, E, K};
  char *b64 = NULL;
  size_t blen = 0;
  if (eldr_sglang_experts_emit(sel, rows, &sh, ids, hidden, &b64, &blen) != 0) abort();
  uint8_t *buf2 = NULL;
  size_t cap2 = 0;
  uint32_t hidden2 = 0;
  if (eldr_sglang_experts_read(b64, blen, &o, &buf2, &cap2, &hidden2, NULL, &why, &d) != 0 || hidden2 != hidden ||
      memcmp(buf, buf2, rows * L * K * 4))
    abort();
  free(b64);
  free(buf2);
  free(buf);
  return 0;
}
