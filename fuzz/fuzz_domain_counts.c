/* fuzz_domain_counts.c — libFuzzer target for the per-domain expert counts
 * reader of `eldr trace stats --olmoe-counts`.
 *
 * Any input: eldr_tracestats_domain_counts_skew returns an error with a
 * message, or shares in [0, 1] (or NaN for all-zero counts). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "eldr/tracestats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char model[64], names[8][48];
  double shares[8], mean = 0, overall = 0;
  size_t n = 0;
  eldr_diag d = {{0}};
  int rc = eldr_tracestats_domain_counts_skew((const char *)data, size, NULL, model, sizeof model,
                                              names, shares, 8, &n, &mean, &overall, &d);
  if (rc != 0) {
    if (!d.msg[0]) abort();
    return 0;
  }
  if (n == 0) abort();
  for (size_t i = 0; i < n && i < 8; i++)
    if (!isnan(shares[i]) && (shares[i] < 0 || shares[i] > 1 + 1e-9)) abort();
  if (!isnan(overall) && (overall < 0 || overall > 1 + 1e-9)) abort();
  return 0;
}
