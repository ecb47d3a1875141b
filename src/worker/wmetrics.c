/* wmetrics.c — the emulated worker's /metrics text (see wmetrics.h). */
#include "worker/wmetrics.h"

#include <event2/buffer.h>
#include <string.h>

#include "eldr/tokenize.h"

/* vllm/v1/metrics/loggers.py, PrometheusStatLogger.__init__ */
static const double TTFT_BUCKETS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                      0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                      20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double TPOT_BUCKETS[] = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
                                      0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,
                                      7.5,  10.0,  20.0, 40.0,  80.0};
static const double E2E_BUCKETS[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,  15.0, 20.0,
                                     30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const char *const FIN_NAMES[ELDR__FIN_N] = {"stop", "length", "abort", "error"};

#define NB(a) (sizeof(a) / sizeof(a)[0])

void eldr__wmetrics_init(eldr__wmetrics *m) {
  memset(m, 0, sizeof *m);
  m->ttft.bounds = TTFT_BUCKETS;
  m->ttft.n_bounds = NB(TTFT_BUCKETS);
  m->tpot.bounds = TPOT_BUCKETS;
  m->tpot.n_bounds = NB(TPOT_BUCKETS);
  m->e2e.bounds = E2E_BUCKETS;
  m->e2e.n_bounds = NB(E2E_BUCKETS);
}

void eldr__hist_observe(eldr__hist *h, double v) {
  size_t i = 0;
  while (i < h->n_bounds && v > h->bounds[i]) i++;
  h->counts[i]++;
  h->count++;
  h->sum += v;
}

typedef struct out {
  struct evbuffer *b;
  const char *model;
  int err;
} out;

static void head(out *o, const char *name, const char *type, const char *help) {
  if (evbuffer_add_printf(o->b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type) < 0) o->err = 1;
}

/* A vLLM series: labels model_name, engine. */
static void vllm_one(out *o, const char *name, const char *type, const char *help, double v) {
  head(o, name, type, help);
  if (evbuffer_add_printf(o->b, "%s{engine=\"0\",model_name=%s} %.17g\n", name, o->model, v) < 0)
    o->err = 1;
}

/* A counter: the family is named without _total, the sample with it. */
static void vllm_counter(out *o, const char *family, const char *help, double v) {
  head(o, family, "counter", help);
  if (evbuffer_add_printf(o->b, "%s_total{engine=\"0\",model_name=%s} %.17g\n", family, o->model, v) < 0)
    o->err = 1;
}

static void vllm_hist(out *o, const char *name, const char *help, const eldr__hist *h) {
  head(o, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i <= h->n_bounds; i++) {
    cum += h->counts[i];
    int n = i < h->n_bounds
                ? evbuffer_add_printf(o->b, "%s_bucket{engine=\"0\",le=\"%g\",model_name=%s} %llu\n",
                                      name, h->bounds[i], o->model, (unsigned long long)cum)
                : evbuffer_add_printf(o->b, "%s_bucket{engine=\"0\",le=\"+Inf\",model_name=%s} %llu\n",
                                      name, o->model, (unsigned long long)cum);
    if (n < 0) o->err = 1;
  }
  if (evbuffer_add_printf(o->b, "%s_sum{engine=\"0\",model_name=%s} %.17g\n%s_count{engine=\"0\",model_name=%s} %llu\n",
                          name, o->model, h->sum, name, o->model, (unsigned long long)h->count) < 0)
    o->err = 1;
}

static void eldr_one(out *o, const char *name, const char *type, const char *help, double v) {
  head(o, name, type, help);
  if (evbuffer_add_printf(o->b, "%s{model_name=%s} %.17g\n", name, o->model, v) < 0) o->err = 1;
}

int eldr__wmetrics_render(struct evbuffer *b, const char *model_json, const eldr_worker_stats *s,
                          const eldr__wmetrics *m, double time_scale) {
  out o = {b, model_json, 0};
  double usage = s->kv_blocks_total ? (double)s->kv_blocks_used / (double)s->kv_blocks_total : 0;
  vllm_one(&o, "vllm:num_requests_running", "gauge",
           "Number of requests in model execution batches.", (double)s->running);
  vllm_one(&o, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           (double)s->waiting);
  vllm_one(&o, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  vllm_one(&o, "vllm:gpu_cache_usage_perc", "gauge",
           "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
           usage);
  vllm_counter(&o, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
               (double)s->prefix_queries * ELDR_BLOCK_TOKENS);
  vllm_counter(&o, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
               (double)s->prefix_hits * ELDR_BLOCK_TOKENS);
  vllm_counter(&o, "vllm:prompt_tokens", "Number of prefill tokens processed.", (double)s->prompt_tokens);
  vllm_counter(&o, "vllm:generation_tokens", "Number of generation tokens processed.",
               (double)s->generation_tokens);
  head(&o, "vllm:request_success", "counter", "Count of successfully processed requests.");
  for (int i = 0; i < ELDR__FIN_N; i++)
    if (evbuffer_add_printf(b, "vllm:request_success_total{engine=\"0\",finished_reason=\"%s\",model_name=%s} %llu\n",
                            FIN_NAMES[i], model_json, (unsigned long long)m->finished[i]) < 0)
      o.err = 1;
  vllm_hist(&o, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &m->ttft);
  vllm_hist(&o, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.",
            &m->tpot);
  vllm_hist(&o, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", &m->e2e);
  eldr_one(&o, "eldr_worker_requests_failed_total", "counter", "Rejected requests.", (double)s->requests_failed);
  eldr_one(&o, "eldr_worker_requests_cancelled_total", "counter", "Client disconnects.",
           (double)s->requests_cancelled);
  eldr_one(&o, "eldr_worker_kv_held", "gauge", "Prefill requests whose KV blocks wait for a decode pull.",
           (double)s->kv_held);
  eldr_one(&o, "eldr_worker_kv_pulls_served_total", "counter", "KV pulls answered on the side channel.",
           (double)s->kv_pulls_served);
  eldr_one(&o, "eldr_worker_kv_held_expired_total", "counter",
           "Held KV blocks freed unpulled after the abort timeout.", (double)s->kv_held_expired);
  eldr_one(&o, "eldr_worker_kv_pulls_failed_total", "counter", "Decode-side KV pulls that failed.",
           (double)s->kv_pulls_failed);
  eldr_one(&o, "eldr_worker_decode_steps_total", "counter", "Decode steps run.", (double)s->steps);
  eldr_one(&o, "eldr_worker_decode_step_seconds_total", "counter", "Emulated decode step time (scaled).",
           s->step_seconds);
  eldr_one(&o, "eldr_worker_decode_union_experts_sum", "counter",
           "Sum over steps of the mean per-layer expert union.", s->union_sum);
  eldr_one(&o, "eldr_worker_decode_batch_sum", "counter", "Sum over steps of the decode batch size.",
           (double)s->batch_sum);
  eldr_one(&o, "eldr_worker_decode_token_seconds_sum", "counter",
           "Sum over steps of batch size x step time (scaled).", s->token_seconds);
  eldr_one(&o, "eldr_worker_time_scale", "gauge", "Emulated durations are model time x this.", time_scale);
  return o.err ? -1 : 0;
}
