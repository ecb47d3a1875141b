/* sim_int.h — the simulator's private state and the seams between its files
 * (eldr/sim.h is the interface). Not installed.
 *
 *   sim.c          the run in named phases: check, setup, the event loop and
 *                  its handlers (arrival, prefill, decode routing, KV
 *                  transfer, decode steps), collect, free
 *   sim_metrics.c  what a finished request and a decode step add to the
 *                  run's metrics, and the result and log built from them
 *   sim_tokens.c   the pool's compact decode tokens
 *
 * Ownership: a simst is one run's, on the caller's stack; everything it
 * points to is owned by it (freed by sim_free) except what the pool, model
 * and config lend. Threads: one run per thread; runs share nothing but the
 * read-only pool. */
#ifndef ELDR_SIM_INT_H
#define ELDR_SIM_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/batch_union.h"
#include "eldr/footprint.h"
#include "eldr/rng.h"
#include "eldr/sim.h"

/* Events of the loop. At one instant, the wakes (an idle worker starting
 * work "at the end of this instant") come after every other event of the
 * instant, so that everything arriving at that time joins the same batch. */
enum { EV_ARRIVAL = 0, EV_PREFILL_DONE, EV_KV_ARRIVE, EV_STEP_DONE, EV_WAKE, EV_PREFILL_WAKE };

typedef struct sim_event {
  double t;
  uint64_t seq;
  uint32_t type, id;
} sim_event;

typedef struct sim_heap {
  sim_event *v;
  size_t n, cap;
  uint64_t seq;
} sim_heap;

typedef struct sreq {
  const unsigned char *trow; /* first decode token's compact row, or NULL */
  const uint16_t *tids;  /* the recorded decode selections (n_decode * L * K) */
  uint32_t pool_i;
  uint32_t n_prefill, n_decode, pos, offset;
  int32_t next; /* queue / batch link */
  int pw, dec;
  double arrival, pf_done, first, finish, pred, pred_union;
  double useen, bseen;   /* sums over its steps of the per-layer union and the batch */
  uint32_t done;
  uint64_t ticket; /* FOOTPRINT */
  double confidence; /* the prediction's at its decision, or -1 */
  int predicted;     /* decided on a prediction */
} sreq;

typedef struct pworker {
  int32_t qhead, qtail, bhead;
  uint32_t qlen, blen;
  int busy;
} pworker;

typedef struct dworker {
  int32_t whead, wtail;
  uint32_t wlen, nrun;
  uint32_t *run; /* max_batch ids */
  int busy;
  int changed;   /* the batch's membership changed since dups was counted */
  uint32_t dups; /* members whose recorded request has another copy in the batch */
  double t_start;  /* the running step's start */
  uint32_t n_gaps; /* members of the running step that emitted a token before it */
} dworker;

/* Inter-token gaps: one entry per decode step, its duration d counted for
 * the w members whose token at its end was not their first. */
typedef struct sim_gap {
  double d;
  uint32_t w;
} sim_gap;

typedef struct sim_gaps {
  sim_gap *v;
  size_t n, cap;
} sim_gaps;

typedef struct simst {
  const eldr_sim_pool *pool;
  const eldr_trace *tr;
  const eldr_latency_model *m;
  const eldr_sim_config *c;
  size_t L, K, W, P, D, B, N;
  int trace_mode;
  sim_heap h;
  sreq *rq;
  pworker *pw;
  dworker *dw;
  uint32_t *run_store, *ploads, *dloads, *uni, *perm, *copies, *bcount, *shuffle;
  uint32_t *copies_on;   /* pool.n * D in-flight copies per decoder, or NULL (too large) */
  eldr_union un;       /* the step's per-layer expert union */
  uint64_t *stamp, *phash;
  const eldr_sim_tokens *tok; /* the pool's compact decode tokens, or NULL */
  eldr_sim_tokens *own_tok;   /* built by this run (freed at its end), or NULL */
  const void **rows;   /* B: the step's members' rows (compact, or selections) */
  double *tpot, *ttft, *tpot_pf, *e2e;
  sim_gaps gaps;
  size_t completed, n_tpot, fallbacks, shuf_pos, next_arrival;
  uint64_t steps, token_steps, union_sum, dup_steps, tokens_out;
  double copies_sum, first_arrival, last_finish, tpot_min, t0;
  double affinity_sum;   /* over routings with other copies routed: their share on the chosen decoder */
  size_t affinity_n;
  eldr_rng rng_arr, rng_pick, rng_off;
  eldr_policy pol;
  eldr_ep_tally ep; /* with c->placements */
  eldr_footprint *fp;  /* FOOTPRINT with a policy model, else NULL */
  uint32_t *counts;    /* L*E scratch (FOOTPRINT) */
  uint32_t *pcounts;   /* L*E: a predicted signature's counts (predicting runs) */
  float *psig;         /* dim: the predicted signature */
  uint8_t *held;       /* blocks->n_blocks: the run's signature cache (a block is held once
                          a prefill holding it ended) */
  double tscale;       /* scale_arrivals: simulated seconds per trace second (else 1) */
  size_t predicted;
  double conf_sum;
  size_t conf_n;
  double pe_sum, pa_sum, pp_sum, aa_sum, ap_sum, rel_sum;
  size_t n_pred;
} simst;

/* sim_metrics.c */
/* Request q finished on decoder k at now: its latencies into the run's
 * arrays, the policy's end, the loads and copies. */
void sim_finish_request(simst *st, sreq *q, uint32_t k, double now);
/* A step of `members` members, `gaps` of them past their first token,
 * ended after `dur` seconds. ELDR_ENOMEM when the gap list cannot grow. */
int sim_step_gaps(simst *st, uint32_t gaps, double dur);
/* The result (and c->log) from a completed run; sorts the metric arrays. */
void sim_collect(simst *st, double now, eldr_sim_result *res);

#endif
