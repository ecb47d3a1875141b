/* eldr/sim.h — the discrete-event xPyD cluster simulator.
 *
 * P prefill workers (chosen by eldr_policy_prefill: prefix hash with a load
 * guard; chunked batches of queued prompts, compute-bound time from the
 * latency model), a KV-transfer delay, then D decode workers chosen by
 * eldr_policy_decode (the same code the router runs) with continuous
 * batching: a request joins at the next step when the running batch has
 * room (else it waits in a FIFO), decodes one token per step, and leaves
 * after its last token. Each step's latency comes from eldr_latency_step with
 * the per-layer union of the experts the batch's current decode tokens
 * select (each member contributes its own recorded decode token), computed
 * with per-layer bitsets.
 *
 * Arrivals: Poisson at a rate, drawing recorded requests from the serve pool
 * (cycling through seeded shuffles of the pool), or the trace's own arrival
 * timestamps (one pass over the pool in arrival order).
 *
 * Definitions (the latencies users feel; docs/sim.md says which policy
 * optimises which): TTFT = arrival -> end of the request's first decode
 * step (the client sees the stream from the decoder); TPOT = (finish -
 * first token) / (tokens - 1), for requests with >= 2 decode tokens (vLLM's
 * benchmark definition); TPOT from prefill end = (finish - end of its
 * prefill batch) / tokens, the same requests (the KV transfer, the wait for
 * a decoder slot and the first step count); ITL = the gaps between a
 * request's consecutive tokens, pooled over all requests (each is the
 * duration of the step that produced the later token); end-to-end =
 * arrival -> finish, every request. Decoder load given to
 * the policy = requests routed there and not finished (in transfer, waiting,
 * running); prefill load = queued + in the running prefill batch.
 *
 * Deterministic: same inputs and seed, same result. Arrivals, pool draws and
 * offsets use streams derived from the seed independent of the policy, so
 * every policy serves the very same arrival sequence.
 *
 * FOOTPRINT runs keep an eldr_footprint (include/eldr/footprint.h) for the
 * run: each decision gets the request's prefill selection counts (decode
 * counts with footprint_oracle; another pool request's with
 * permute_signatures), eldr_policy_on_route after it, eldr_policy_on_end when
 * the request finishes.
 *
 * Ownership: the pool and model are borrowed for the duration of a call; the
 * result is a plain value; a log (optional) is a caller-owned array.
 */
#ifndef ELDR_SIM_H
#define ELDR_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/latency.h"
#include "eldr/mooncake.h"
#include "eldr/placement.h"
#include "eldr/signature.h"
#include "eldr/policy.h"
#include "eldr/trace_model.h"

/* When the decode worker is chosen (docs/sim.md, "When the decoder is
 * chosen"):
 *   VLLM          at the end of the request's prefill batch, on its true
 *                 prefill signature (vLLM's NIXL flow: the decode leg is
 *                 sent after the prefill's reply); its KV moves after
 *                 register_s.
 *   SGLANG        at arrival, on the signature predicted from what is known
 *                 then (eldr/predict.h's rule: the pool's blocks held in the
 *                 run's signature cache, filled by earlier prefills as they
 *                 end, or the first known_fraction of the prompt); below
 *                 the confidence threshold by load (footprint: its neutral
 *                 cost). The decoder counts the request from arrival; at
 *                 the prefill's end footprint's ticket is replaced by the
 *                 true counts (eldr_footprint_replace) and the KV moves at
 *                 once (the decode worker registered at arrival).
 *   SGLANG_EXACT  at the prefill's forward end on the true signature (the
 *                 contrib/ patch publishes it): the decode leg's
 *                 registration waits for the forward, so the KV moves
 *                 register_s after it (TTFT), on an exact signature (TPOT). */
typedef enum eldr_sim_pd { ELDR_SIM_PD_VLLM = 0, ELDR_SIM_PD_SGLANG, ELDR_SIM_PD_SGLANG_EXACT } eldr_sim_pd;

/* "vllm", "sglang", "sglang-exact"; parse: 0 or ELDR_EINVAL. */
const char *eldr_sim_pd_name(eldr_sim_pd pd);
int eldr_sim_pd_parse(const char *name, eldr_sim_pd *out);

/* A pool's decode selections in a compact per-token form, read at every
 * decode step (eldr_sim_tokens_build; eldr/batch_union.h's row forms):
 * ELDR_SIM_TOK_IDS8, L * K one-byte ids per token, where E <= 256 and a
 * bitset would take at least 4x the bytes; else ELDR_SIM_TOK_BITS,
 * L * ceil(E/64) words per token, where that takes at most twice the
 * selections' bytes (else ids8 where E <= 256). */
typedef enum eldr_sim_tok_form {
  ELDR_SIM_TOK_AUTO = 0, /* eldr_sim_tokens_build: the smaller form that applies */
  ELDR_SIM_TOK_BITS,
  ELDR_SIM_TOK_IDS8
} eldr_sim_tok_form;

typedef struct eldr_sim_tokens {
  eldr_sim_tok_form form;   /* BITS or IDS8 */
  size_t row_bytes;         /* bytes of one token's row */
  unsigned char *rows;      /* owned: all rows, then ELDR_UNION_IDS8_PAD bytes */
  size_t *off;              /* owned: pool request i's first row is off[i] */
} eldr_sim_tokens;

/* The recorded requests to serve, and what the router knows about them. */
typedef struct eldr_sim_pool {
  const eldr_trace *trace;   /* borrowed */
  const size_t *idx;         /* n request indices into trace (the serve split) */
  size_t n;
  const float *sigs;         /* n * dim unit signatures (row i for idx[i]), or NULL */
  const uint8_t *sig_ok;     /* n flags (nonzero: signature valid), or NULL = all valid */
  size_t dim;
  const float *centroids;    /* n_centroids * dim, or NULL (ELDR falls back to JSQ) */
  size_t n_centroids;
  /* Optional, from eldr_sim_tokens_build (borrowed, read-only, may be shared
   * by concurrent runs): the pool's decode selections per token in a compact
   * form. NULL: each run builds its own when one applies. */
  const eldr_sim_tokens *tokens;
  /* FOOTPRINT: the latency coefficients the policy predicts with (the
   * artifact's latency section; NULL: the policy falls back to JSQ and every
   * decision counts as a fallback). Borrowed. */
  const eldr_latency_model *policy_model;
  /* FOOTPRINT: the request profile's priors (the artifact's "footprint"
   * section, eldr/fp_prior.h: policy_n_priors rows of L*E rates; with 1 + k
   * rows a request's row is that of the centroid nearest its signature) and
   * their weight; NULL: none. Borrowed. */
  const float *policy_prior;
  size_t policy_n_priors;
  double policy_prior_tokens;
  /* Optional (eldr/mooncake.h): the prompt blocks of every trace request
   * (indexed by trace request, blocks->n_req >= trace->n) and each distinct
   * block's counts: what a predicted signature is made of. Borrowed. */
  const eldr_block_table *blocks;
  /* The artifact's signature spec, to build a predicted signature (ELDR
   * on a prediction; NULL: ELDR decides those by load). Borrowed. */
  const eldr_sigspec *spec;
} eldr_sim_pool;

/* One request's history (optional, for tests and per-request output). */
typedef struct eldr_sim_log {
  uint32_t pool_index;   /* which recorded request */
  int prefill_worker, decoder;
  double arrival, prefill_done, first_token, finish;
  uint32_t tokens;       /* decode tokens generated */
  uint32_t completions;  /* times it finished (must be 1) */
  uint32_t chosen_load, min_load; /* decoder loads at the decision */
  int fallback;          /* eldr_fallback of the decision */
  double pred_tpot;      /* FOOTPRINT: predicted TPOT at the decision (s), else 0 */
  double pred_union;     /* FOOTPRINT: predicted distinct experts per layer of the chosen
                            decoder's batch with the request (eldr_fp_explain), else NaN */
  double confidence;     /* the prediction's confidence at the decision (-1: no prediction) */
  int predicted;         /* 1: decided on a predicted signature */
  double mean_union;     /* distinct experts per layer of its decode steps, mean over them */
  double mean_batch;     /* members of its decode steps, mean over them */
} eldr_sim_log;

typedef struct eldr_sim_config {
  size_t n_prefill, n_decode;
  size_t max_batch;          /* decode batch limit (default 64) */
  size_t prefill_max_tokens; /* prompt tokens per prefill batch (default 8192) */
  uint32_t prefill_guard;    /* eldr_policy_prefill load guard (default 4) */
  double rate;               /* requests/s; <= 0: use the trace's arrival timestamps */
  size_t n_requests;         /* arrivals (rate mode) */
  uint64_t seed;
  eldr_policy_kind policy;
  double tau;
  int permute_signatures;    /* control "eldr-permuted": signatures shuffled across pool requests */
  int decorrelate;           /* each arrival starts at a random offset of its decode sequence (wraps) */
  int footprint_oracle;      /* FOOTPRINT fed each request's decode selections, not its prefill's */
  const uint8_t *footprint_mask; /* FOOTPRINT: L flags of the layers predicted from the footprint (NULL: all) */
  int footprint_no_prior;    /* FOOTPRINT without the pool's prior (the raw prefill profile: ablation) */
  double footprint_own_weight; /* FOOTPRINT: eldr_footprint_opts.own_weight (0: the default, 1) */
  double footprint_home_weight; /* FOOTPRINT: eldr_footprint_opts.home_weight (0: off), with the
                                 * pool's centroids as the decoders' (needs one per decoder) */
  eldr_sim_log *log;         /* n_requests entries (or pool size in trace mode), or NULL */
  void (*progress)(void *ctx, size_t done, size_t total);
  void *progress_ctx;
  /* Expert parallelism: n_decode placements (decoder i uses placements[i];
   * borrowed), all with the trace's layers/experts and one EP size: steps
   * are timed by eldr_latency_step_ep from the per-rank tally (the model's
   * EP fields must be set: eldr_latency_preset_ep). NULL: the aggregate
   * eldr_latency_step. */
  const eldr_placement *const *placements;
  int direct_union;          /* 1: steps read the trace's selections even when the pool
                                has compact tokens (benchmarks and tests; the same result) */
  eldr_sim_pd pd;            /* when the decoder is chosen (default VLLM) */
  /* >= 0: the decision knows only the first known_fraction of each prompt
   * (token-form requests): its counts are the prediction, decided at the
   * pd mode's time (VLLM: prefill end, on the part alone). < 0 (default):
   * off; SGLANG then predicts from the pool's blocks. */
  double known_fraction;
  double predict_threshold;  /* eldr_predict_usable's threshold [ELDR_PREDICT_THRESHOLD_DEFAULT] */
  double register_s;         /* the decode leg's dispatch and registration before the KV can
                                move, where it is sent after the prefill (VLLM, SGLANG_EXACT) [0] */
  int scale_arrivals;        /* 1: the trace's arrivals in order, time scaled so that they
                                come at `rate` on average (one pass over the pool) */
} eldr_sim_config;

/* Defaults: 8P16D, batch 64, 8192 prefill tokens, guard 4, rate 10, 1000
 * requests, seed 1, JSQ, tau 0.1. */
void eldr_sim_config_default(eldr_sim_config *c);

typedef struct eldr_sim_result {
  size_t n_requests, completed, decode_requests; /* decode_requests: with >= 2 tokens (TPOT) */
  double tpot_p50, tpot_p99, tpot_mean, tpot_min; /* seconds */
  double tpot_pf_p50, tpot_pf_p99, tpot_pf_mean;  /* TPOT from prefill end */
  double ttft_p50, ttft_p99, ttft_mean;
  double itl_p50, itl_p99;    /* inter-token latency, pooled over requests */
  double e2e_p50, e2e_p99, e2e_mean; /* arrival -> finish */
  double makespan_s;          /* first arrival -> last finish */
  double throughput_tok_s, throughput_req_s;
  double mean_batch;          /* members per decode step */
  double mean_union;          /* distinct experts per layer per step */
  uint64_t steps, token_steps;
  double copies_in_flight;    /* mean other in-flight copies of the same recorded request, at decode routing */
  double batch_dup_frac;      /* fraction of token-steps whose batch holds another copy of the same request */
  double copy_affinity;       /* at decode routing, of the other copies of the request already routed
                                 and in flight, the share on the chosen decoder (mean over routings
                                 with such copies; 1/D = oblivious, 1 = always together); NaN
                                 when none had one, or pool size x decoders > 2^26 */
  size_t fallbacks;           /* decisions that did not run as asked */
  double pred_rel_err;        /* FOOTPRINT: mean |predicted - actual| / actual TPOT (NaN otherwise) */
  double pred_corr;           /* FOOTPRINT: Pearson correlation of predicted and actual TPOT */
  size_t pool_size;
  double sim_seconds;         /* simulated time of the last event */
  size_t decisions;           /* decode decisions (one per request) */
  size_t predicted;           /* of them made on a predicted signature */
  double confidence_mean;     /* mean confidence of the predictions (NaN: none made) */
  double ep_busiest_share;    /* with placements: sum over (step, layer) of the busiest EP
                                 rank's token-expert pairs / all pairs (1/R = even); else NaN */
} eldr_sim_result;

/* Run one simulation. Errors: ELDR_EINVAL (bad config: zero workers/batch,
 * empty pool, no arrival timestamps in trace mode, signature dim mismatch),
 * ELDR_ESHAPE (model shape differs from the trace's), ELDR_ENOMEM. */
int eldr_sim_run(const eldr_sim_pool *pool, const eldr_latency_model *m, const eldr_sim_config *c,
                 eldr_sim_result *r, eldr_diag *d);

/* Build the compact per-token form of a pool's decode selections (form
 * AUTO: as described at eldr_sim_tokens; BITS / IDS8:
 * that form where it applies) when it takes at most an eighth of the
 * machine's physical memory (at least 1 GiB); otherwise (or where no form
 * applies) returns 0 with *out = NULL and the runs read the selections
 * directly. Free with eldr_sim_tokens_free. ELDR_EINVAL on a NULL pool,
 * ELDR_ENOMEM on allocation failure. */
int eldr_sim_tokens_build(const eldr_sim_pool *pool, eldr_sim_tok_form form, eldr_sim_tokens **out,
                          eldr_diag *d);
void eldr_sim_tokens_free(eldr_sim_tokens *t);

/* Capacity estimate (requests/s) of a configuration for the pool: the lower
 * of decode (D full batches at the expected uniform union) and prefill
 * throughput (with c->placements: the EP step with the union spread evenly
 * over the ranks). Used to choose a rate sweep. */
double eldr_sim_capacity(const eldr_sim_pool *pool, const eldr_latency_model *m,
                         const eldr_sim_config *c);


#endif
