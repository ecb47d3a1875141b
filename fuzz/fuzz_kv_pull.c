/* fuzz_kv_pull.c — the emulated NIXL side channel's pull parser
 * (eldr__pull_parse, the body of POST /eldr/nixl/pull that any peer can
 * send to a prefill worker). Checks: never crashes or reads out of bounds;
 * on success the id strings are NUL-terminated within their bounds and the
 * block count is within ELDR__PULL_MAX_IDS with no negative id; on failure
 * there is a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/sidechan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static eldr__pull p;
  char err[200];
  err[0] = 0;
  if (eldr__pull_parse((const char *)data, size, &p, err, sizeof err) == 0) {
    if (!memchr(p.rid, 0, sizeof p.rid) || !memchr(p.engine, 0, sizeof p.engine) || !p.rid[0]) abort();
    if (p.n_ids > ELDR__PULL_MAX_IDS) abort();
    for (size_t i = 0; i < p.n_ids; i++)
      if (p.ids[i] < 0) abort();
  } else if (!err[0]) {
    abort();
  }
  return 0;
}
