/* eldr/loadgen.h — replay a trace at a Poisson rate against any
 * OpenAI-compatible endpoint (eldr serve, eldr worker, a vLLM cluster) over
 * HTTP, streaming, and measure TTFT and TPOT per request.
 *
 * Each arrival sends trace record i (cyclically over the chosen range) as a
 * /v1/completions (or /v1/chat/completions) request: a prompt of the record's
 * prefill length in placeholder words (or the record's own prompt text),
 * max_tokens = the record's decode length, "ignore_eos": true (so a real vLLM
 * produces exactly that many tokens), and the extension field
 * "eldr_trace_id" (an eldr worker with the trace then replays the record's
 * expert selections; other servers ignore unknown fields or can be told not
 * to get it). Inter-arrival times are exponential with the given rate from a
 * seeded generator: the same seed gives the same schedule.
 *
 * Streams are checked for well-formed SSE: every event is "data: <JSON
 * object>" or the final "data: [DONE]", nothing follows [DONE], and a JSON
 * "error" object is an error. TTFT = first token event - send time; TPOT =
 * (last token - first token) / (tokens - 1); ITL = the gaps between a
 * stream's consecutive token events, pooled over the streams.
 *
 * Bounded: arrivals stop after duration_s (or max_requests), and requests
 * still open drain_s later are cancelled and counted as timed out.
 * Runs its own event loop on the calling thread; no globals.
 *
 * Ownership: the config borrows the trace; the result owns its arrays
 * (eldr_loadgen_result_free).
 */
#ifndef ELDR_LOADGEN_H
#define ELDR_LOADGEN_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/trace.h"

typedef void (*eldr_loadgen_progress_fn)(void *ctx, size_t sent, size_t done, double elapsed_s);

#define ELDR_LOADGEN_MAX_TARGETS 16

typedef struct eldr_loadgen_config {
  const char *target;       /* "http://host:port" (a path prefix is kept) */
  const char *const *targets; /* n_targets > 0: request i goes to targets[i % n_targets]
                               * instead (clients spread over router replicas) */
  size_t n_targets;         /* 0..ELDR_LOADGEN_MAX_TARGETS */
  const eldr_trace *trace;  /* borrowed */
  size_t first, count;      /* records [first, first + count); count 0 = to the end */
  double rate;              /* arrivals per second (> 0) */
  double duration_s;        /* arrivals stop after this (> 0) */
  size_t max_requests;      /* 0 = no limit besides duration */
  double drain_s;           /* wait for open requests after the last arrival (default 60) */
  double timeout_s;         /* per-request inactivity timeout (default 60) */
  uint64_t seed;
  int stream;               /* 1 = stream (default) */
  int chat;                 /* 1 = /v1/chat/completions */
  int send_trace_id;        /* 1 = add "eldr_trace_id" (default) */
  const char *model;        /* "model" field, or NULL to omit it */
  uint32_t max_tokens;      /* > 0: cap every request's max_tokens */
  eldr_loadgen_progress_fn progress; /* called about once a second, may be NULL */
  void *progress_ctx;
  const volatile int *stop;  /* when non-NULL and set (e.g. by a signal handler), the run
                                ends within 0.1 s: open requests are cancelled */
} eldr_loadgen_config;

void eldr_loadgen_config_default(eldr_loadgen_config *c);

/* One request's outcome. */
typedef struct eldr_loadgen_rec {
  size_t trace_index;
  double send_s;            /* since the start */
  double ttft_s, tpot_s, e2e_s; /* < 0 when not measured */
  uint32_t tokens;          /* token events received */
  int status;               /* HTTP status, 0 = no response (connection failed / timeout) */
  int ok;                   /* completed: 200, well-formed, [DONE] seen (when streaming) */
  int timed_out;
  char engine[48];          /* "eldr_engine_id" of the first chunk, when present */
  char error[160];          /* why it failed (empty when ok) */
} eldr_loadgen_rec;

typedef struct eldr_loadgen_result {
  eldr_loadgen_rec *recs;   /* owned, n entries in send order */
  size_t n;
  double *itl;              /* owned: every gap between two token events of one stream, s */
  size_t n_itl, itl_cap;
  size_t ok, failed, timed_out, malformed;
  uint64_t tokens;
  double wall_s;            /* first send to last completion */
} eldr_loadgen_result;

/* Run the load. Returns 0 (request failures are reported in the result, not
 * as errors) or ELDR_EINVAL (bad target URL / config, d says which),
 * ELDR_ENOMEM. */
int eldr_loadgen_run(const eldr_loadgen_config *c, eldr_loadgen_result *r, eldr_diag *d);
void eldr_loadgen_result_free(eldr_loadgen_result *r);

/* Check a target the way eldr_loadgen_run parses it (http://host[:port]
 * [/prefix]): 0 or ELDR_EINVAL with d naming it. For callers that validate
 * flags before starting anything. */
int eldr_loadgen_target_check(const char *target, eldr_diag *d);

/* Summary of the ok requests. Percentiles interpolate linearly between order
 * statistics; NaN when there is no sample. */
typedef struct eldr_loadgen_summary {
  size_t n_ok, n_tpot;
  double ttft_p50, ttft_p90, ttft_p99, ttft_mean;
  double tpot_p50, tpot_p90, tpot_p99, tpot_mean;
  double e2e_p50, e2e_p90, e2e_p99, e2e_mean;
  double itl_p50, itl_p99;  /* over the gaps of every stream (eldr_loadgen_result.itl) */
  double throughput_rps, tokens_per_s;
} eldr_loadgen_summary;
int eldr_loadgen_summarize(const eldr_loadgen_result *r, eldr_loadgen_summary *s);


/* The SSE checker used on every stream: one event (the bytes between two
 * blank lines, without them) at a time. A well-formed stream is events of
 * one "data: <JSON object>" line (comment lines ':' allowed) and a final
 * "data: [DONE]". Token events are chunks whose choices[0].text or
 * choices[0].delta.content is a non-empty string; an "error" object marks
 * the stream malformed. The first problem is kept in error. Never reads out
 * of bounds; allocates only inside jansson. */
typedef struct eldr_sse_state {
  int done;           /* [DONE] seen */
  int malformed;      /* a problem was found (see error) */
  uint32_t tokens;    /* token events */
  char engine[48];    /* "eldr_engine_id" of the first event carrying one */
  char error[160];
} eldr_sse_state;
void eldr_sse_event(eldr_sse_state *st, const char *ev, size_t len);

/* The prompt text sent for trace record i (the record's prompt, or
 * "r<i>" followed by n_prefill - 1 placeholder words). malloc'd. */
char *eldr_loadgen_prompt(const eldr_trace *t, size_t i);

#endif
