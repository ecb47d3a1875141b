/* demo_latency.h — TPOT from the prefill's end in `eldr demo`: the client
 * sees tokens, the router sees when each request's prefill ended (its
 * --access-log's prefill_ms); joined by the load generator's X-Request-Id. */
#ifndef ELDR_CLI_DEMO_LATENCY_H
#define ELDR_CLI_DEMO_LATENCY_H

#include <stdint.h>

#include "eldr/loadgen.h"

/* For every ok request of r with >= 2 tokens and a prefill_ms line in the
 * access log: (its end-to-end time - prefill_ms) / tokens, wall seconds;
 * *p50 and *p99 over them (NaN when none), *n how many. The ids are the
 * load generator's ("lg-<seed hex>-<index>"). 0, or -1 when the log cannot
 * be read (then the outputs are NaN). */
int demo_tpot_pf(const char *access_log, const eldr_loadgen_result *r, uint64_t seed, double *p50,
                 double *p99, size_t *n);

#endif
