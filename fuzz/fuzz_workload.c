/* fuzz_workload.c — libFuzzer target for the custom workload parser of the
 * trace generator (eldr trace gen --workload custom:FILE).
 *
 * Any input: eldr_tracegen_workload_parse returns an error with a message,
 * or a workload that validates and builds a generator whose first request
 * (lengths capped small) has valid, distinct selections. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/tracegen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_tracegen_workload w;
  eldr_diag d = {{0}};
  int rc = eldr_tracegen_workload_parse((const char *)data, size, &w, &d);
  if (rc != 0) {
    if (!d.msg[0]) abort();
    return 0;
  }
  if (eldr_tracegen_workload_validate(&w, NULL) != 0) abort();
  eldr_shape s = {2, 8, 2};
  eldr_tracegen *g = NULL;
  rc = eldr_tracegen_new_workload(&s, "fuzz", &w, 1, &g, &d);
  if (rc != 0) {
    if (w.generalists < s.num_experts || !d.msg[0]) abort();
    return 0;
  }
  eldr_tracegen_set_lengths(g, 2, 0, 2);
  eldr_tracegen_req q;
  if (eldr_tracegen_request(g, 0, &q, NULL) != 0) abort();
  if (q.domain < 0 || (size_t)q.domain >= w.n_domains) abort();
  if (q.n_decode != 2 || q.n_prefill < 1 || q.n_prefill > 2) abort();
  for (uint32_t t = 0; t < q.n_decode * s.num_layers; t++) {
    const uint16_t *o = q.decode + (size_t)t * s.top_k;
    if (o[0] >= s.num_experts || o[1] >= s.num_experts || o[0] == o[1]) abort();
  }
  eldr_tracegen_free(g);
  return 0;
}
