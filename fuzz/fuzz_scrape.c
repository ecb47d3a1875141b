/* fuzz_scrape.c — the router's reader of a worker's /metrics
 * (src/serve/scrape.c): any Prometheus-ish text, no NUL terminator.
 * Checks: no crash or out-of-bounds read; a valid result is a finite,
 * bounded load; the load never falls below the router's own legs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_types.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_server s;
  memset(&s, 0, sizeof s);
  worker w;
  memset(&w, 0, sizeof w);
  w.s = &s;
  char *copy = malloc(size ? size : 1); /* exactly size bytes: reads past it are caught */
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  eldr__scrape_parse(&w, copy, size);
  free(copy);
  w.inflight = 3;
  w.inflight_at_scrape = 5;
  if (eldr__worker_load(&w) < 3) abort();
  if (s.m.scrapes[0] + s.m.scrapes[1] != 1) abort();
  return 0;
}
