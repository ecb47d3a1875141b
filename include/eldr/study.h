/* eldr/study.h — one function per result of the ELDR paper, each producing
 * a table (columns x rows), a summary paragraph and the paper's number.
 *
 * Studies: "fig2" (step-latency model: step time vs distinct experts and
 * batch), "fig3" (prefill->decode Pearson with the random-pair and
 * same-domain null baselines), "fig4" (distinct experts per batching rule:
 * random, domain, artifact cluster), "fig11" (TPOT vs load, every policy),
 * "fig15" (balanced vs vanilla K-means), "fig16" (the locality band tau),
 * "table2" (8P8D / 8P16D / 8P24D), "rho-gain" (each representation's rho
 * against its simulated gain, Spearman rank correlation), "crossover"
 * (every preset and hardware: locality's step-time gain against the batch
 * size, where it falls under 1 %; no trace).
 *
 * Honesty rules built in: the artifact is always fitted on one part of a
 * seeded split (or on --trace, serving --serve-trace) and the simulation
 * serves only requests it never saw; every simulated gain is reported raw
 * and net of the replay control ("eldr-permuted": ELDR's routing with the
 * signatures shuffled across requests, which keeps the co-located replay
 * copies but removes prefill->decode locality); every number is the mean
 * over the seeds with its sample standard deviation. The seed moves the
 * split, the fit, the arrivals and the null pairings together.
 *
 * Gains are relative changes of mean TPOT against the best (lowest-TPOT)
 * load-oblivious or load-aware baseline (random, rr, jsq, p2c) of the same
 * run: gain < 0 means ELDR is faster. net = gain(eldr) - gain(eldr-permuted).
 *
 * Result: a jansson object
 *   {"study": name, "columns": [str...], "rows": [[number|string...]...],
 *    "summary": str, "paper": str, "plot": {"x": col, "y": [cols...],
 *    "group": col or null, "kind": "lines"|"bars", "xlabel", "ylabel"},
 *    "config": {...}}
 * owned by the caller (json_decref).
 *
 * Threads: a study runs on the calling thread; options are read-only.
 * Errors: ELDR_EINVAL (unknown study, bad option), ELDR_ESHAPE (latency
 * model vs trace shape), ELDR_ENOMEM, and whatever fit/sim report.
 */
#ifndef ELDR_STUDY_H
#define ELDR_STUDY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact_model.h"
#include "eldr/error.h"
#include "eldr/latency.h"
#include "eldr/trace_model.h"

/* A real MoE FFN layer measured on this CPU (`eldr bench moe-layer`'s
 * points, in increasing batch for each active-expert count), for the
 * crossover study's check of its roofline. */
typedef struct eldr_study_cpu {
  double hidden, inter; /* the layer's shape */
  uint32_t top_k;
  size_t n;
  const double *experts, *batch, *ms; /* n points: active experts, tokens, median ms */
} eldr_study_cpu;

typedef struct eldr_study_opts {
  const eldr_trace *trace;  /* fitted on (split by fit_fraction unless serve is set); borrowed */
  const eldr_trace *serve;  /* served instead of the held-out split, or NULL */
  double fit_fraction;      /* (0, 1): fitted share of trace when serve is NULL [0.5] */
  eldr_latency_model lm;    /* step-latency model matching the trace's shape */
  size_t n_prefill, n_decode, max_batch; /* [8, 16, 64] */
  size_t n_requests;        /* arrivals per simulation [2000] */
  double load;              /* share of the estimated capacity for one-rate studies [0.95] */
  const uint64_t *seeds;    /* NULL: 1, 2, 3 */
  size_t n_seeds;
  double tau;               /* ELDR locality band [0.1] */
  int restarts;             /* K-means restarts [4] */
  const eldr_study_cpu *cpu; /* crossover: a CPU measurement to check the roofline on, or NULL */
  /* progress (may be NULL): one line of what is running */
  void (*progress)(void *ctx, const char *what);
  void *progress_ctx;
} eldr_study_opts;

void eldr_study_opts_default(eldr_study_opts *o);

/* Names of the studies, NULL-terminated. */
extern const char *const eldr_study_names[];

int eldr_study_run(const char *name, const eldr_study_opts *o, json_t **out, eldr_diag *d);

/* Spearman rank correlation of x and y (n >= 2, average ranks for ties);
 * NAN when undefined. */
double eldr_study_spearman(const double *x, const double *y, size_t n);

#endif
