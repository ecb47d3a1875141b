/* wmetrics.h — the emulated worker's Prometheus text (internal to src/worker).
 *
 * Names, types, labels and buckets are vLLM's v1 PrometheusStatLogger's
 * (vllm/v1/metrics/loggers.py): every vllm: series carries the labels
 * model_name and engine (the engine index, "0" here), request_success carries
 * finished_reason, and the TTFT / TPOT histograms use vLLM's bucket bounds.
 * eldr's own series (eldr_worker_*) carry model_name only.
 *
 * Ownership: plain values, no allocation except in the caller's evbuffer.
 * Not thread-safe (the worker is single-threaded).
 */
#ifndef ELDR_WORKER_WMETRICS_H
#define ELDR_WORKER_WMETRICS_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/worker.h"

struct evbuffer;

#define ELDR__HIST_MAX 24

/* A cumulative Prometheus histogram over fixed upper bounds. */
typedef struct eldr__hist {
  const double *bounds; /* ascending, n_bounds of them (borrowed, static) */
  size_t n_bounds;
  uint64_t counts[ELDR__HIST_MAX]; /* per bucket, not cumulative; [n_bounds] = +Inf */
  uint64_t count;
  double sum;
} eldr__hist;

/* vLLM's request finish reasons (vllm/v1/engine FinishReason, str()). */
enum { ELDR__FIN_STOP, ELDR__FIN_LENGTH, ELDR__FIN_ABORT, ELDR__FIN_ERROR, ELDR__FIN_N };

typedef struct eldr__wmetrics {
  eldr__hist ttft, tpot, e2e;
  uint64_t finished[ELDR__FIN_N];
} eldr__wmetrics;

void eldr__wmetrics_init(eldr__wmetrics *m);
void eldr__hist_observe(eldr__hist *h, double v);

/* Append the whole exposition to b: the vLLM series from s and m, then
 * eldr's own; model_json is the served model name, JSON-quoted (a valid
 * Prometheus label value: same escapes). Returns 0, or -1 when b is full. */
int eldr__wmetrics_render(struct evbuffer *b, const char *model_json, const eldr_worker_stats *s,
                          const eldr__wmetrics *m, double time_scale);

#endif
