/* fit_source.h — `eldr fit`'s calibration input as an eldr_fit_source: the
 * expanded trace inputs (files in per-token or counts form) read one request
 * at a time with eldr_trace_foreach_inputs (memory per request, not per
 * trace), and a cache of the usable requests' prefill counts (uint16 per
 * layer and expert) filled by the first pass while it fits a byte budget:
 * later passes (signatures, K-means at scale, continuity) then read the
 * cache instead of parsing the files again. The cache is dropped (and later
 * passes re-read the files) when it would pass the budget, a count exceeds
 * 65535, or the requests carry gate sums.
 *
 * Ownership: cli_fit_file owns its buffers and header copies; paths are
 * borrowed. cli_fit_file_close releases. Errors name the file, line and
 * field (the reader's). Threads: one thread.
 */
#ifndef ELDR_CLI_FIT_SOURCE_H
#define ELDR_CLI_FIT_SOURCE_H

#include <stdint.h>

#include "eldr/fit.h"
#include "eldr/trace.h"

typedef struct cli_fit_file {
  char *const *paths;
  size_t n_paths;
  char *model, *generator; /* header copies (generator NULL when none) */
  eldr_shape shape;
  uint32_t *layer_ids;
  uint32_t *pre, *dec;     /* L*E scratch */
  float *gates;            /* L*E scratch */
  size_t cache_budget;     /* bytes; 0 = no cache */
  uint16_t *cache;         /* usable requests * L*E, filled by pass 1 */
  size_t cache_n, cache_cap;
  int cache_state;         /* 0 filling, 1 complete, -1 dropped */
  int passes;
  eldr_trace_read_info info; /* of the first pass: torn lines, requests */
  eldr_fit_visit visit;    /* the pass in progress */
  void *ud;
  eldr_diag *d;
  const char *need_gates;  /* a representation name: a counts-form request
                              (no gates) fails naming it; NULL = no check */
  const char *label;       /* the inputs, in that message */
} cli_fit_file;

/* Read the first request's header (model, shape, layer ids) and fill src. */
int cli_fit_file_open(char *const *paths, size_t n_paths, size_t cache_budget, cli_fit_file *f,
                      eldr_fit_source *src, eldr_diag *d);
void cli_fit_file_close(cli_fit_file *f);

#endif
