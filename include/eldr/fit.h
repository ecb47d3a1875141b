/* eldr/fit.h — the offline fit: trace -> routing artifact. Called by
 * `eldr fit`, and by `eldr sim` / `eldr demo` to fit on a calibration split.
 *
 * Steps: per-request prefill/decode counts; candidates representation x IDF
 * (count, count-IDF, binary, binary-IDF; gate/logit when the trace carries
 * gates) scored by rho with all layers and with the greedy mask; pick the
 * best (or the forced choice); balanced (or vanilla) K-means with k
 * centroids on the chosen signatures. When rho is undefined for every
 * candidate (constant distances, e.g. one decode token per request), the fit
 * still succeeds with the count representation (IDF as allowed), all layers,
 * and rho = NaN (written as null).
 *
 * Ownership: *out is a new artifact owned by the caller; the report is
 * caller-owned and released with eldr_fit_report_free().
 */
#ifndef ELDR_FIT_H
#define ELDR_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact_model.h"
#include "eldr/quality.h"
#include "eldr/trace_model.h"

typedef enum { ELDR_FIT_AUTO = -1, ELDR_FIT_OFF = 0, ELDR_FIT_ON = 1 } eldr_fit_tristate;
typedef enum { ELDR_FIT_LAYERS_AUTO = 0, ELDR_FIT_LAYERS_ALL, ELDR_FIT_LAYERS_LIST } eldr_fit_layers;

typedef struct eldr_fit_opts {
  size_t k;              /* decoders = centroids */
  double tau;            /* stored in the artifact */
  int repr;              /* an eldr_repr, or -1 = auto */
  eldr_fit_tristate idf; /* auto/off/on */
  eldr_fit_layers layers;
  const uint8_t *layer_list_mask; /* L flags for ELDR_FIT_LAYERS_LIST */
  int balanced;          /* 1 balanced (default), 0 vanilla (ablation) */
  int restarts;          /* K-means restarts (default 8) */
  int max_iter;          /* K-means iterations (default 100) */
  uint64_t seed;
  size_t max_pairs;      /* rho pair budget (0 = all pairs) */
  const size_t *subset;  /* request indices to fit on, or NULL = all */
  size_t n_subset;
  /* progress callback (may be NULL): stage name, done, total */
  void (*progress)(void *ctx, const char *stage, size_t done, size_t total);
  void *progress_ctx;
} eldr_fit_opts;

/* The one default seed of every command (fit, sim, demo, trace gen, study):
 * the same --fit-fraction then gives the same split everywhere, and a trace
 * generated with the default seed is the one the other commands generate. */
#define ELDR_SEED_DEFAULT 1
#define ELDR_SEED_DEFAULT_STR "1"

/* Defaults: k=required, tau=0.1, auto/auto/auto, balanced, 8 restarts,
 * 100 iterations, seed ELDR_SEED_DEFAULT, max_pairs 200000. */
void eldr_fit_opts_default(eldr_fit_opts *o);

typedef struct eldr_fit_candidate {
  eldr_repr repr;
  int idf;
  double rho_all;        /* all layers */
  double rho_mask;       /* greedy mask */
  size_t mask_size;      /* |greedy mask| */
  eldr_mask_step *steps; /* L steps of the greedy selection (owned) */
} eldr_fit_candidate;

typedef struct eldr_fit_report {
  eldr_fit_candidate *cand; /* owned */
  size_t n_cand;
  size_t chosen;            /* index into cand */
  size_t n;                 /* requests fitted */
  size_t skipped_empty;     /* requests with no prefill selections */
  size_t rho_undefined;     /* candidates whose rho is undefined (NaN): constant
                               distances, e.g. no decode selections */
  double kmeans_objective;
  size_t capacity;          /* ceil(n / k) (balanced) */
  double seconds_rho, seconds_kmeans;
} eldr_fit_report;

int eldr_fit(const eldr_trace *t, const eldr_fit_opts *o, eldr_artifact **out,
             eldr_fit_report *report, eldr_diag *d);
void eldr_fit_report_free(eldr_fit_report *r);

/* Signature of one trace request under an artifact (prefill counts ->
 * signature; out has a->dim floats). Returns eldr_signature_build's code. */
int eldr_fit_request_signature(const eldr_artifact *a, const eldr_trace *t,
                               const eldr_request *r, uint32_t *counts_scratch,
                               float *gates_scratch, float *out);

/* The seeded random split used by `eldr fit --fit-fraction`, `eldr sim` and
 * `eldr demo`: perm (n entries, caller's) receives a permutation of 0..n-1
 * (Fisher-Yates, a fixed function of seed); the first part fits, the rest is
 * served. A random split matters: trace files are often sorted by domain. */
void eldr_fit_shuffle(size_t *perm, size_t n, uint64_t seed);

#endif
