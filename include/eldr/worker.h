/* eldr/worker.h — the emulated vLLM-compatible MoE engine behind
 * `eldr worker`: an HTTP server (libevent evhttp) that speaks vLLM's
 * OpenAI-compatible protocol, including the NIXL pull-style PD handoff
 * (kv_transfer_params) and --enable-return-routed-experts, and emulates the
 * engine's timing in real time from the latency model (eldr/latency.h):
 *
 *  - prefill: FIFO batches of waiting prompts (up to max_batched_tokens
 *    computed tokens), each batch lasting eldr_latency_prefill(computed
 *    tokens) x time_scale; a paged KV cache of ELDR_BLOCK_TOKENS-token blocks
 *    with prefix caching (block hash chain) and LRU eviction of unreferenced
 *    blocks, and the block-granular signature cache (eldr/sigcache.h)
 *    co-indexed with it (a row is stored when a block is computed and
 *    dropped when the block is evicted);
 *  - decode: continuous batching on a step timer; each step lasts
 *    eldr_latency_step(batch, union of the experts the batch members' current
 *    tokens select per layer, context tokens) x time_scale; a request pulled
 *    from a remote prefill (kv_transfer_params) first waits
 *    eldr_latency_kv_transfer(prompt tokens) x time_scale.
 *
 * Timing uses libevent timers on the caller's event_base, never sleeps: the
 * worker is single-threaded and runs entirely inside event_base_dispatch().
 *
 * Expert selections of a request come from the trace record named by the
 * request's "eldr_trace_id" field (when the worker has a trace), otherwise
 * they are derived from the prompt text by the trace generator
 * (eldr_tracegen_from_text), seeded by the text of the prompt's first KV
 * block so that a block's selections depend only on its prefix (like a real,
 * causal engine; this keeps block signature rows valid under prefix reuse).
 * Generated text is words of the corpus (corpus_dir), else placeholder words
 * (" tok0", " tok1", ...); n choices per request (n <= 16): the number of
 * tokens is the request's decode length — the trace record's decode length,
 * or max_tokens (default 16) when derived from text — capped by max_tokens.
 *
 * Ownership: eldr_worker_new borrows the event_base (the caller frees it
 * after eldr_worker_free) and copies the config strings it needs; the trace
 * passed in the config is borrowed and must outlive the worker.
 */
#ifndef ELDR_WORKER_H
#define ELDR_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/reply_experts.h"
#include "eldr/placement.h"
#include "eldr/trace.h"

struct event_base;

typedef enum eldr_worker_role {
  ELDR_WORKER_PREFILL = 0, /* KV producer: serves do_remote_decode prefill legs */
  ELDR_WORKER_DECODE,      /* KV consumer: serves do_remote_prefill decode legs */
  ELDR_WORKER_BOTH,        /* both legs */
} eldr_worker_role;

/* Which engine's protocol the worker speaks: vLLM's (NIXL pull handoff,
 * kv_transfer_params) or SGLang's (bootstrap rooms, both legs at once:
 * docs/sglang.md, src/worker/sgl.h). */
typedef enum eldr_worker_engine {
  ELDR_WORKER_ENGINE_VLLM = 0,
  ELDR_WORKER_ENGINE_SGLANG,
} eldr_worker_engine;

/* "prefill", "decode", "both"; parse returns ELDR_EINVAL if unknown. */
const char *eldr_worker_role_name(eldr_worker_role r);
int eldr_worker_role_parse(const char *name, eldr_worker_role *out);

typedef struct eldr_worker_config {
  eldr_worker_role role;
  const char *model;        /* latency + shape preset, e.g. "qwen3-30b-a3b" */
  const char *hardware;     /* latency preset, e.g. "h200" */
  const char *served_model_name; /* name in /v1/models and replies; NULL = model */
  const eldr_trace *trace;  /* borrowed, or NULL; its shape must match the model's */
  const char *host;         /* bind address; NULL = "127.0.0.1" */
  uint16_t port;            /* 0 = ephemeral (see eldr_worker_port) */
  double time_scale;        /* every emulated duration x this (> 0; 1 = real time) */
  size_t kv_blocks;         /* KV cache capacity in blocks (0 = default 4096) */
  size_t max_num_seqs;      /* decode batch limit (0 = default 256) */
  size_t max_batched_tokens;/* prefill batch token budget (0 = default 8192) */
  uint64_t seed;            /* tracegen seed for text-derived selections */
  const char *engine_id;    /* remote_engine_id it reports; NULL = derived from port */
  int return_routed_experts;/* 1: prefill replies carry routed_experts (vLLM flag) */
  eldr_re_layout routed_experts_layout; /* wire layout of them (default npy, vLLM main) */
  /* expert parallelism: ep_size > 0 times decode steps with
   * eldr_latency_step_ep on a TP tp x EP ep_size worker (tp 0 = ep_size),
   * tallying the batch on placement (borrowed, must outlive the worker; its
   * layers/experts must match the model and its EP size ep_size); NULL =
   * the linear layout. */
  uint32_t ep_size, tp;
  const eldr_placement *placement;
  int routed_experts_computed_only; /* 1: prompt rows of computed tokens only (vLLM before
                                       PR #39917); 0 (default): every prompt token's row */
  int routed_experts_decode; /* 1: decode-leg replies carry routed_experts too, as a vLLM
                               decode instance with the KV-connector patch (docs/vllm.md):
                               the sequence up to the last forwarded token, prompt rows
                               then the generated tokens' rows; 0 (default): none */
  int routed_experts_stream; /* with routed_experts_decode: 1 ("final") a streamed decode
                               reply's last token chunk carries the whole sequence's rows
                               (npy), as vLLM's /inference/v1/generate stream does (its
                               scheduler attaches them to the finishing output only);
                               0 (default, "none"): no routed_experts in any chunk, as
                               vLLM's /v1/completions and /v1/chat/completions streams */
  int routed_experts_moe_only; /* 1: rows of the MoE layers only (older vLLM builds,
                                  SGLang); 0 (default): vLLM's all-layers form, a row per
                                  hidden layer, the dense layers' rows 0 (docs/vllm.md,
                                  "The layer axis"; the same for models without dense layers) */
  int enable_prompt_tokens_details; /* 1: usage.prompt_tokens_details (vLLM's
                                       --enable-prompt-tokens-details); 0 (default): null */
  double kv_abort_timeout;  /* s a prefill holds a request's KV blocks for the decode
                               worker's pull (VLLM_NIXL_ABORT_REQUEST_TIMEOUT; 0 = 480) */
  double kv_pull_timeout;   /* s the decode side waits for the side channel (0 = 30) */
  eldr_worker_engine engine; /* protocol spoken (default vLLM) */
  uint16_t bootstrap_port;  /* SGLang prefill: its bootstrap server's port (SGLang's
                               --disaggregation-bootstrap-port; 0 = any free port) */
  int sglang_exact;         /* SGLang prefill with the contrib/ eldr-exact patch: the
                               forward runs before the decode registers, and the
                               prompt's counts are published at its end */
  double bootstrap_timeout; /* s an SGLang prefill item waits for its decode (0 = 300) */
  double waiting_timeout;   /* s an SGLang decode item waits for its KV (0 = 300) */
  const char *corpus_dir;   /* directory of *.txt texts generated words are drawn from;
                               NULL = placeholder words " tok<i>"; unreadable or
                               without words = ELDR_EIO from eldr_worker_new */
} eldr_worker_config;

/* Defaults: role BOTH, qwen3-30b-a3b on h200, time_scale 1, routed experts on. */
void eldr_worker_config_default(eldr_worker_config *c);

typedef struct eldr_worker eldr_worker;

/* Create the worker and bind its HTTP server. Errors: ELDR_ENOTFOUND (model
 * or hardware preset), ELDR_ESHAPE (trace shape differs from the model's),
 * ELDR_EINVAL (bad config), ELDR_EIO (cannot bind; d names host:port). */
int eldr_worker_new(struct event_base *base, const eldr_worker_config *cfg, eldr_worker **out,
                    eldr_diag *d);

/* Stop serving and release everything: open requests are dropped (their
 * connections closed by evhttp_free). NULL-safe. */
void eldr_worker_free(eldr_worker *w);

/* The bound TCP port (the ephemeral one when cfg.port was 0). */
uint16_t eldr_worker_port(const eldr_worker *w);
/* An SGLang prefill's bootstrap server port (0 for every other worker). */
uint16_t eldr_worker_bootstrap_port(const eldr_worker *w);

typedef struct eldr_worker_stats {
  size_t running, waiting;      /* decode batch members; queued (prefill + decode + pulls) */
  size_t kv_blocks_used, kv_blocks_total;
  uint64_t requests_done, requests_failed, requests_cancelled;
  uint64_t prompt_tokens, cached_tokens, generation_tokens;
  uint64_t steps;               /* decode steps run */
  double step_seconds;          /* sum of emulated step durations (scaled) */
  double union_sum;             /* sum over steps of the mean per-layer union */
  uint64_t batch_sum;           /* sum over steps of the batch size */
  double token_seconds;         /* sum over steps of batch x step duration (scaled):
                                   / batch_sum = the mean time per token the model gave */
  uint64_t prefix_queries, prefix_hits; /* in blocks */
  size_t kv_held;               /* prefill requests whose blocks wait for a pull */
  uint64_t kv_pulls_served, kv_held_expired; /* side channel: pulls answered, leases expired */
  uint64_t kv_pulls_failed;     /* decode side: pulls that failed (request answered 500) */
} eldr_worker_stats;
void eldr_worker_stats_get(const eldr_worker *w, eldr_worker_stats *s);

/* The prompt-side selections the worker assigns to a request (the same
 * function the HTTP path uses; exposed for tests): text of len bytes,
 * optional trace id (NULL = derive from text). *sel is malloc'd
 * (*n_tokens * L * K ids), the caller frees it. n_tokens = eldr_tokenize count. */
int eldr_worker_prompt_selections(const eldr_worker *w, const char *text, size_t len,
                                  const char *trace_id, uint16_t **sel, size_t *n_tokens,
                                  eldr_diag *d);

#endif
