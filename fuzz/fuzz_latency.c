/* fuzz_latency.c — libFuzzer target for the latency-model override parser.
 *
 * Any input: eldr_latency_parse_overrides must return an error (leaving the
 * model unchanged) or a model that validates; the step, prefill and transfer
 * functions on an accepted model must return a finite, non-negative time
 * (or +inf for a zero denominator forbidden by validation: abort). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/latency.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_latency_model m, m0;
  if (eldr_latency_preset("olmoe-1b-7b", "h100", &m, NULL) != 0) abort();
  m0 = m;
  eldr_diag d;
  int rc = eldr_latency_parse_overrides((const char *)data, size, &m, &d);
  if (rc != 0) {
    if (memcmp(&m, &m0, sizeof m) != 0) abort();
    return 0;
  }
  if (eldr_latency_validate(&m, NULL) != 0) abort();
  if (m.shape.num_layers > ELDR_MAX_LAYERS) abort();
  static uint32_t u[ELDR_MAX_LAYERS];
  for (uint32_t l = 0; l < m.shape.num_layers; l++) u[l] = m.shape.top_k;
  double t = eldr_latency_step(&m, 4, u, 100);
  double p = eldr_latency_prefill(&m, 100);
  double k = eldr_latency_kv_transfer(&m, 100);
  if (isnan(t) || t < 0 || isnan(p) || p < 0 || isnan(k) || k < 0) abort();
  return 0;
}
