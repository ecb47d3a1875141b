/* demo.h — `eldr demo`'s run state, shared by its command (cmd_demo.c) and
 * its flags (demo_args.c). One struct per run, owned by eldr_cmd_demo's
 * stack; the strings it points at are argv's or static. One thread. */
#ifndef ELDR_CLI_DEMO_H
#define ELDR_CLI_DEMO_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "eldr/loadgen.h"
#include "eldr/trace.h"

typedef struct prow {
  const char *policy;
  eldr_loadgen_summary s; /* seconds of wall time (scaled) */
  size_t sent, ok, failed;
  double sim_tpot_p50, sim_tpot_p99, sim_ttft_p50, sim_tpot_mean; /* ms of model time; NaN if absent */
  double pf_p50, pf_p99;                 /* TPOT from prefill end, wall s (router's prefill end) */
  double sim_pf_p50, sim_pf_p99, sim_itl_p99, sim_e2e_p50; /* ms of model time; NaN if absent */
  double batch, uni, sim_batch, sim_uni;            /* mean decode batch / per-layer union */
  double tok_ms; /* mean model step time per generated token on the decoders (ms) */
  double lag_p99, lag_max; /* the bus: the routers' worst lag p99 bound and max (s; NaN without) */
  long lag_n, peers;       /* messages behind them; peers seen by the first router */
  double sgl_pred, sgl_exact, sgl_all; /* --pd sglang[-exact]: decoders chosen on a predicted
                             * signature, on the prefill's exact counts, of all (the
                             * routers' eldr_sglang_decisions_total; NaN otherwise) */
} prow;

/* One run of the demo: flags, work files, results. */
typedef struct demo {
  const char *model, *hardware, *workload, *trace_path, *plot, *policies_arg;
  long n_fit, n_eval, max_decode, P, D, max_seqs;
  double fit_fraction, rate, scale, duration, scrape;
  long routers;
  long router_list[4];  /* --routers 1,2,4: one fleet run per count */
  size_t n_router_list;
  int bus_list[2];      /* --bus none,nats: 0 none, 1 nats */
  size_t n_bus_list;
  int bus;              /* the run's */
  double kill_bus_s;    /* --kill-bus-after S: the bus's nats-server killed S wall seconds into each bus run */
  uint64_t seed;
  int do_sim, json, drift, duration_set, hardware_set, keep;
  const char *pd;       /* --pd: NULL (vllm), "sglang" or "sglang-exact" */
  const char *pols[8];
  size_t npol;
  char fit_path[PATH_MAX + 32], eval_path[PATH_MAX + 32], art_path[PATH_MAX + 32],
      log_path[PATH_MAX + 32], sim_path[PATH_MAX + 32];
  char seedbuf[32], dbuf[32], seqbuf[32];
  size_t nfit;
  eldr_trace *eval;
  prow rows[8];
  prow fleet[4][2][8];  /* routers x bus x policy */
  size_t sched_n, *sched_idx; /* the schedule of the first policy, for the simulator */
  double *sched_t;
  int have_sim;
  double t_start;
} demo;

/* Flags into x (exit 2 on a bad flag or value naming it, 0 after --help);
 * presets and the workload are checked before anything starts. */
void demo_parse_args(int argc, char **argv, demo *x);

#endif
