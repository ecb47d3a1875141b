/* figures.h — every figure the commands draw, in one place: `eldr sim
 * --plot DIR` (TPOT against rate, the tau sweep, balanced against vanilla
 * K-means), `eldr demo --plot FILE` (TPOT per policy) and `eldr trace stats
 * --plot FILE` (distinct experts against batch size). Each builds a gnuplot
 * script in memory in the house style of eldr/plot.h and runs it with
 * eldr_plot_run (no shell, the script through a pipe).
 *
 * Errors: 0, or an eldr_err with d naming what failed (ELDR_ENOTFOUND:
 * gnuplot is not installed; ELDR_EIO: a file could not be written or
 * gnuplot failed; ELDR_EINVAL: an output name not ending in .png/.svg).
 * Nothing is printed. Threads: the calling thread.
 */
#ifndef ELDR_CLI_FIGURES_H
#define ELDR_CLI_FIGURES_H

#include <stddef.h>

#include "eldr/error.h"
#include "eldr/sweep.h"
#include "eldr/tracestats.h"

/* Into dir (created): tpot_vs_rate.dat, tau_sweep.dat (with taus), the
 * script plot.gp, and tpot_p50_vs_rate.png, tpot_p99_vs_rate.png,
 * tau_sweep.png (with taus), balanced_vs_vanilla.png (with vanilla). */
int fig_sim(const char *dir, const eldr_sweep_row *rows, size_t nrows,
            const eldr_sweep_variant *vs, size_t nv, const double *rates, size_t nr,
            const double *taus, size_t ntaus, int vanilla, const char *title, eldr_diag *d);

/* A clustered bar chart of TPOT p50, mean and p99 (ms) per policy. */
int fig_demo(const char *out, const char *title, size_t n, const char *const *policies,
             const double *p50, const double *mean, const double *p99, eldr_diag *d);

/* Mean distinct experts per layer per decode step against batch size, one
 * curve per batching rule that has values. */
int fig_trace_stats(const char *out, const eldr_tracestats *s, eldr_diag *d);

#endif
