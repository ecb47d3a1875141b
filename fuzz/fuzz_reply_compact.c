/* fuzz_reply_compact.c — libFuzzer target for the compact signature form a
 * prefill worker can send (eldr/reply_compact.h: the counts object in
 * kv_transfer_params, read by the router's signature path and recorder).
 *
 * The input is the object's JSON text; when the scanner accepts it, it is
 * read as an artifact of 2 MoE layers at model layers 1 and 3 (8 experts,
 * top-2, with and without a mask) and with no layers given. Checks: no
 * crash or out-of-bounds read (ASan); a success reports a reason of OK and
 * counts no entry above the tokens it says (or the 65535 saturation) and
 * no more layers than rows; a failure names a reason. Else abort. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_compact.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *doc = (const char *)data;
  eldr_js_span root;
  if (memchr(doc, 0, size) || eldr_js_scan(doc, size, NULL, 0, NULL, &root, NULL)) return 0;
  static const uint32_t ids[2] = {1, 3};
  static const uint8_t mask[2] = {0, 1};
  const eldr_compact_opts os[3] = {{2, ids, 8, 2, NULL}, {2, ids, 8, 2, mask}, {0, NULL, 0, 0, NULL}};
  for (int i = 0; i < 3; i++) {
    uint32_t *counts = calloc((size_t)ELDR_MAX_LAYERS * 8, sizeof *counts);
    uint32_t lids[ELDR_MAX_LAYERS];
    eldr_compact_info ci;
    eldr_re_reason why = ELDR_RE__N;
    eldr_diag d = {{0}};
    /* with no layers given the counts are rows x E: only read when E fits the buffer */
    int rc = eldr_compact_read(doc, root, &os[i], i < 2 ? counts : NULL, lids, &ci, &why, &d);
    if (rc == 0) {
      if (why != ELDR_RE_OK || ci.layers > ci.rows || (i < 2 && ci.experts != 8)) abort();
      for (size_t c = 0; i < 2 && c < 2 * 8; c++)
        if (counts[c] > ci.tokens && counts[c] != 65535) abort();
    } else if (why == ELDR_RE_OK || why >= ELDR_RE__N || !d.msg[0]) {
      abort();
    }
    free(counts);
  }
  return 0;
}
