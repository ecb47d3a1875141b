/* study_internal.h — shared machinery of the paper studies (study.c) used by
 * the individual studies (study_figs.c). Not a public interface.
 *
 * An "arm" is one seed's honest setup: a seeded split (or fit trace + serve
 * trace), an artifact fitted on the fit part only, the served requests'
 * signatures and per-token bitsets. arm_sim runs one policy on it.
 * Ownership: an arm owns everything it allocates; arm_free releases.
 */
#ifndef ELDR_STUDY_INTERNAL_H
#define ELDR_STUDY_INTERNAL_H

#include "eldr/fit.h"
#include "eldr/sim.h"
#include "eldr/study.h"
#include "eldr/sweep.h"

typedef struct study_arm {
  const eldr_trace *ft, *st; /* fitted / served trace (borrowed) */
  size_t *fit_idx, n_fit;
  size_t *serve_idx, n_serve;
  eldr_artifact *art;
  eldr_fit_report rep;
  int have_rep;
  eldr_sweep_sigs ps; /* owned */
  const float *sigs;  /* = ps.sigs */
  const uint8_t *ok;  /* = ps.ok */
  eldr_sim_pool pool;
  eldr_sim_tokens *tokens; /* owned: the serve pool's compact decode tokens (or NULL) */
  uint64_t seed;
} study_arm;

/* Split (or fit/serve traces) for seed; fit with fo (NULL: defaults with
 * k = o->n_decode, tau, restarts, seed) unless fit == 0 (then no artifact:
 * only the split). */
int arm_build(const eldr_study_opts *o, uint64_t seed, const eldr_fit_opts *fo, int fit,
              study_arm *a, eldr_diag *d);
void arm_free(study_arm *a);

/* One simulation on the arm: n_decode decoders, policy kind, permute
 * (replay control), rate in requests/s (<= 0: load * capacity). */
int arm_sim(const eldr_study_opts *o, const study_arm *a, size_t n_decode, eldr_policy_kind kind,
            int permute, double tau, double rate, eldr_sim_result *r, eldr_diag *d);
/* Estimated capacity (requests/s) of the arm's pool with n_decode decoders. */
double arm_capacity(const eldr_study_opts *o, const study_arm *a, size_t n_decode);

/* Gains at one rate: best baseline TPOT, eldr and control gains; the same
 * on TPOT from prefill end (pf: mean over requests, its own best baseline). */
typedef struct study_gain {
  double rate, best_tpot, eldr_tpot, perm_tpot;
  const char *best;
  double gain, control, net; /* relative; < 0 = ELDR faster */
  double best_pf, eldr_pf, perm_pf, gain_pf, control_pf, net_pf;
  /* what the steps looked like: members per step and distinct experts per
   * layer per step, for eldr and the best baseline */
  double eldr_batch, eldr_union, best_batch, best_union;
  double eldr_copies, eldr_dup; /* eldr's replay: other copies in flight at routing, batch_dup_frac */
} study_gain;
int arm_gain(const eldr_study_opts *o, const study_arm *a, size_t n_decode, double tau,
             double rate, study_gain *g, eldr_diag *d);

/* Mean and sample sd of n values (sd 0 for n < 2). */
void study_mean_sd(const double *v, size_t n, double *mean, double *sd);
uint64_t study_seed(const eldr_study_opts *o, size_t i);
size_t study_n_seeds(const eldr_study_opts *o);
void study_progress(const eldr_study_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Result skeleton: {"study", "columns", "rows": [], "plot": {...}}. */
json_t *study_result(const char *name, const char *const *cols, size_t ncols, const char *x,
                     const char *const *y, size_t ny, const char *group, const char *kind,
                     const char *xlabel, const char *ylabel);
/* The figure's title (printf format): plot.title. */
void study_plot_title(json_t *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Series split by two columns (plot.group becomes [first, second]): the
 * first picks the line's dash, the second its colour; fmt1/fmt2 are the
 * legend's printf formats of their values ("overhead %s", "batch %s"). */
void study_plot_group2(json_t *res, const char *first, const char *fmt1, const char *second,
                       const char *fmt2);
/* Append a row: fmt chars 'd' double (NaN -> null), 's' string, 'u' size_t. */
int study_row(json_t *res, const char *fmt, ...);
/* The study's one-line result: "headline": {"label", "value", "sd"} (NaN -> null). */
void study_headline(json_t *res, const char *label, double value, double sd);

/* The studies (study_figs.c). */
int study_fig2(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_fig3(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_fig4(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_fig11(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_fig15(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_fig16(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_table2(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_rho_gain(const eldr_study_opts *o, json_t **out, eldr_diag *d);
int study_crossover(const eldr_study_opts *o, json_t **out, eldr_diag *d); /* study_crossover.c */

#endif
