/* eldr/sweep.h — a sweep of simulations: every (rate, policy variant) pair
 * of `eldr sim`, run on a pool of worker threads, plus what the sweep needs
 * around eldr_sim_run (the variants a policy list names, the pool's
 * signatures under an artifact, lookups over the result rows).
 *
 * A variant is one policy as run: the baselines (random rr jsq p2c), the
 * domain oracle, ELDR at a tau, ELDR with permuted signatures (control), on
 * the vanilla K-means artifact (ablation), decorrelated (each arrival starts
 * at a random offset of its decode sequence).
 *
 * Determinism: the rows of a sweep do not depend on jobs (each run is
 * eldr_sim_run with its own config; results land at fixed indices).
 * Ownership: everything is borrowed for the call; rows are the caller's
 * array. Threads: eldr_sweep_run starts jobs - 1 threads and joins them
 * before it returns; the progress callback is called from any of them, one
 * call at a time (under the sweep's lock).
 */
#ifndef ELDR_SWEEP_H
#define ELDR_SWEEP_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact_model.h"
#include "eldr/error.h"
#include "eldr/latency.h"
#include "eldr/policy.h"
#include "eldr/sim.h"
#include "eldr/trace_model.h"

#define ELDR_SWEEP_MAX_VARIANTS 64
#define ELDR_SWEEP_MAX_JOBS 64

typedef struct eldr_sweep_variant {
  char label[48];        /* unique within a sweep: "eldr", "eldr(tau=0.2)", "jsq+decor", ... */
  eldr_policy_kind kind;
  double tau;            /* < 0: the artifact's (set by the caller before running) */
  int permute, decorrelate, vanilla;
  int oracle;            /* footprint-oracle: decode selections */
  int fp_layers;         /* footprint: 0/1 all MoE layers, 2 the artifact's mask */
  int fp_no_prior;       /* footprint-raw: without the artifact's profile prior */
  int is_baseline;       /* random/rr/jsq/p2c */
  int is_headline;       /* in the main figure */
  int pd_set;            /* 1: run at pd (eldr/sim.h), else the base config's */
  eldr_sim_pd pd;
} eldr_sweep_variant;

/* Copies of vs[0..*nv) at each further mode of pds[1..npd) (labels
 * "<label>@<mode>"); the first mode's rows keep their labels. Every
 * variant gets its mode (pd_set). ELDR_ERANGE when more than cap. */
int eldr_sweep_variants_pd(eldr_sweep_variant *vs, size_t *nv, size_t cap, const eldr_sim_pd *pds,
                           size_t npd, eldr_diag *d);

/* The variants a run of `eldr sim` asks for: policies is "all" or a comma
 * list of random rr jsq p2c domain eldr eldr-permuted; then ELDR at each of
 * taus, the vanilla ablation, and (decor_rows, when not decor) decorrelated
 * copies of the headline variants. Returns 0 or ELDR_EINVAL naming an
 * unknown policy; at most cap variants (the rest are dropped). */
int eldr_sweep_variants(const char *policies, const double *taus, size_t ntaus, int vanilla,
                        int decor, int decor_rows, eldr_sweep_variant *vs, size_t cap, size_t *nv,
                        eldr_diag *d);

/* The signatures of the pool's requests (trace rows idx[0..n)) under an
 * artifact: sigs n * a->dim, ok n flags (0: no valid signature). */
typedef struct eldr_sweep_sigs {
  float *sigs;
  uint8_t *ok;
  size_t n_ok;
} eldr_sweep_sigs;
int eldr_sweep_sigs_compute(const eldr_trace *t, const size_t *idx, size_t n,
                            const eldr_artifact *a, eldr_sweep_sigs *out);
void eldr_sweep_sigs_free(eldr_sweep_sigs *s);

/* One result: variant v at rate. */
typedef struct eldr_sweep_row {
  const eldr_sweep_variant *v;
  double rate;
  eldr_sim_result r;
  eldr_sim_log *log;     /* with keep_logs: r.n_requests entries (owned: eldr_sweep_rows_free) */
} eldr_sweep_row;

typedef void (*eldr_sweep_progress_fn)(void *ctx, const char *label, size_t done, size_t total);

typedef struct eldr_sweep {
  const eldr_sweep_variant *vs;
  size_t nv;
  const double *rates;   /* nrates rates (<= 0: trace arrivals) */
  size_t nrates;
  const eldr_sim_pool *pool;         /* balanced artifact's signatures */
  const eldr_sim_pool *pool_vanilla; /* for variants with vanilla set (may equal pool) */
  const eldr_latency_model *lm;
  const eldr_sim_config *cfg;        /* base config: workers, batch, requests, seed */
  const uint8_t *footprint_mask;     /* the artifact's layer mask (footprint-mask rows), or NULL */
  size_t jobs;                       /* threads, 1..ELDR_SWEEP_MAX_JOBS */
  int keep_logs;                     /* each row keeps its per-request log (eldr_sim_log) */
  eldr_sweep_progress_fn progress;   /* may be NULL */
  void *progress_ctx;
} eldr_sweep;

/* Run every (rate, variant): rows[ri * nv + vi] (nrates * nv rows). On the
 * first failing run the others stop and its error is returned with d
 * naming the variant. */
int eldr_sweep_run(const eldr_sweep *s, eldr_sweep_row *rows, eldr_diag *d);
/* Free what the rows own (their logs); the array itself stays the caller's. */
void eldr_sweep_rows_free(eldr_sweep_row *rows, size_t n);

/* The row of label at rate, or NULL. */
const eldr_sweep_row *eldr_sweep_find(const eldr_sweep_row *rows, size_t n, double rate,
                                      const char *label);
/* The best (lowest TPOT p50, or p99) baseline row at rate with the given
 * decorrelation, or NULL. */
const eldr_sweep_row *eldr_sweep_best_baseline(const eldr_sweep_row *rows, size_t n, double rate,
                                               int decor, int p99);

/* The latencies a result reports (eldr/sim.h defines each), for choosing
 * and comparing by any of them. */
typedef enum eldr_sweep_metric {
  ELDR_METRIC_TPOT_P50 = 0, ELDR_METRIC_TPOT_P99, ELDR_METRIC_TPOT_PF_P50, ELDR_METRIC_TPOT_PF_P99,
  ELDR_METRIC_TTFT_P50, ELDR_METRIC_TTFT_P99, ELDR_METRIC_ITL_P99, ELDR_METRIC_E2E_P50,
  ELDR_METRIC_E2E_P99, ELDR_METRIC__COUNT
} eldr_sweep_metric;
double eldr_sweep_metric_value(const eldr_sim_result *r, eldr_sweep_metric m);
/* "tpot_p50", "tpot_pf_p99", ... (the JSON and CSV stems). */
const char *eldr_sweep_metric_name(eldr_sweep_metric m);
/* eldr_sweep_best_baseline by metric m. */
const eldr_sweep_row *eldr_sweep_best_baseline_by(const eldr_sweep_row *rows, size_t n,
                                                  double rate, int decor, eldr_sweep_metric m);

#endif
