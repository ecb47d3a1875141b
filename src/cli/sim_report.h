/* sim_report.h — `eldr sim`'s flags and what a run produced, shared by the
 * command (cmd_sim.c: flags, workload, fit, the sweep) and its reports
 * (sim_report.c: the table, headlines, JSON, CSV, per-request log). The
 * structs point into the command's own storage for the run's length; the
 * reports only read them. One thread; output errors exit through cli_fail
 * naming the file. */
#ifndef ELDR_CLI_SIM_REPORT_H
#define ELDR_CLI_SIM_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "cli_ep.h"
#include "eldr/fit.h"
#include "eldr/latency.h"
#include "eldr/mooncake.h"
#include "eldr/placement.h"
#include "eldr/sim.h"
#include "eldr/sweep.h"
#include "eldr/trace.h"

/* The flags of one run. */
typedef struct sim_args {
  const char *trace_path, *serve_path, *gen, *art_path;
  const char *model, *hardware, *lat_path, *csv_path, *plot_dir, *policies, *log_path;
  size_t gen_n, P, D, B, nreq, jobs;
  double frac, tau;
  double *rates, *taus, *loads;
  size_t nrates, ntaus, nloads;
  int vanilla, decor, decor_rows, json, quiet, trace_arrivals, print_latency;
  uint64_t seed;
  uint32_t ep_size, ep_tp, ep_redundant; /* expert parallelism (0: off) */
  eldr_sim_pd pds[3];        /* --pd: the modes, in order (none: vllm) */
  size_t npd;
  double known_fraction, predict_threshold, register_s;
  double fp_own_weight;      /* --fp-own-weight (0: footprint's default) */
  double fp_home_weight;     /* --fp-home-weight (0: off) */
  const char *mooncake;      /* --serve-mooncake (also serve_path) */
  size_t mc_requests;
  uint32_t mc_max_decode;
  int scaled_arrivals;
  eldr_placement_kind ep_kind;
  int ep_kind_set;
} sim_args;

/* What the run produced, for the table, JSON, CSV and figures. */
typedef struct sim_out {
  const sim_args *a;
  const char *src_name;
  const eldr_latency_model *lm;
  const eldr_sweep_row *rows;
  size_t nrows, nv;
  const eldr_sweep_variant *vs;
  size_t n_fit, n_serve, n_sigs;
  double tau_eff, capacity, wall_s;
  const eldr_fit_report *rep; /* NULL unless fitted in-process */
  const cli_ep_set *eps;      /* with --ep-size */
  eldr_sim_pd pd;             /* the base config's mode */
  const eldr_block_table *blocks; /* with --serve-mooncake */
} sim_out;

void sim_write_csv(const char *cmd, const char *csv_path, const sim_out *o);
void sim_write_log(const char *cmd, const char *path, const sim_out *o, const eldr_trace *st,
                   const size_t *serve_idx);
void sim_write_json(const char *cmd, const sim_out *o);
void sim_print_headlines(const sim_out *o, double rate);
void sim_print_table(const sim_out *o);
void sim_warn_replay(const sim_out *o);

#endif
