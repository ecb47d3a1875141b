/* fuzz_body.h — the input convention of the fuzz targets that read a
 * client body (fuzz_req_scan, fuzz_prefill_rewrite, fuzz_worker_request):
 * the first byte picks the API ('g': SGLang's /generate, else odd: chat,
 * even: completions), the rest is the body.
 * Ownership: body points into the fuzzer's input (nothing is copied; the
 * input ends where the body ends, so a read past it is caught by ASan).
 * Errors: -1 for an empty input (the target returns at once), else 0.
 * Threads: none. */
#ifndef ELDR_FUZZ_BODY_H
#define ELDR_FUZZ_BODY_H

#include <stddef.h>
#include <stdint.h>

#include "serve/serve_internal.h"

typedef struct eldr_fuzz_body {
  eldr__api api;
  const char *body;
  size_t len;
} eldr_fuzz_body;

static inline int eldr_fuzz_body_split(const uint8_t *data, size_t size, eldr_fuzz_body *in) {
  if (size < 1) return -1;
  in->api = data[0] == 'g' ? ELDR__API_GENERATE : (data[0] & 1) ? ELDR__API_CHAT : ELDR__API_COMPLETIONS;
  in->body = (const char *)data + 1;
  in->len = size - 1;
  return 0;
}

#endif
