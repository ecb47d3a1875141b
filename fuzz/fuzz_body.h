/* fuzz_body.h — the input convention of the fuzz targets that read a
 * client body: the first byte picks the API (odd: chat), the rest is the
 * body. 0 and the parts, or -1 for an empty input. */
#ifndef ELDR_FUZZ_BODY_H
#define ELDR_FUZZ_BODY_H

#include <stddef.h>
#include <stdint.h>

#include "serve/serve_internal.h"

static inline int eldr_fuzz_body(const uint8_t *data, size_t size, eldr__api *api, const char **body, size_t *len) {
  if (size < 1) return -1;
  *api = (data[0] & 1) ? ELDR__API_CHAT : ELDR__API_COMPLETIONS;
  *body = (const char *)data + 1;
  *len = size - 1;
  return 0;
}

#endif
