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
 * and rho = NaN (written as null). When no request carries decode
 * selections at all (a recording of streamed replies: prefill counts only)
 * the fit fails with ELDR_EEMPTY and a message saying so, unless the caller
 * named the representation and the layers or set opts.prefill_only; the
 * artifact records which evidence chose it (fit_chosen_by).
 *
 * At scale (eldr_fit_stream): the calibration requests come from a source
 * the fit reads in passes, one request at a time, as per-(layer, expert)
 * counts; nothing per token is held. Pass 1 counts the requests, the IDF
 * document frequencies over all of them, and keeps a seeded reservoir sample
 * of rho_sample requests (their prefill and decode counts): the candidates,
 * the greedy mask and rho (with its jackknife interval, eldr_quality_rho_ci)
 * are computed on that sample. With n <= rho_sample the sample is every
 * request in source order and the fit is the exact one of earlier versions
 * (same artifact bytes). Larger n: pass 2 builds the signature matrix (n x
 * dim float32, dim = |mask| * E) when it fits sig_budget bytes, and the
 * K-means is initialised by the exact balanced K-means (at most 30
 * iterations per restart) of max(1024, 32 k) rows of the sample, refined
 * by `epochs` of mini-batch balanced K-means (eldr/kmeans_mb.h), and closed by
 * `final_iters` exact balanced assignments of all n rows under capacity
 * ceil(n/k) (each followed by the member-mean centroid update): the capacity
 * guarantee is exact. When the matrix does not fit the budget every epoch and
 * the final assignment re-read the source (streamed: memory O(n k + sample),
 * final_iters = 1). With n <= exact_limit (and the matrix in memory) the
 * K-means is the exact one of eldr_kmeans_fit on all rows.
 *
 * Continuity (opts.previous): the new centroids are reordered so that the
 * calibration traffic each decoder keeps is maximal: M[i][j] = requests whose
 * nearest centroid is i under the previous artifact and j under the new one;
 * the Hungarian method (eldr_assign_hungarian) picks the permutation that
 * maximises the sum of M[i][pi(i)], and the report gives the fraction of
 * requests whose nearest-centroid decoder changes (1 - that sum / n). This
 * uses the previous artifact's own signature spec (mask, representation,
 * IDF), so it works when the new fit chose another mask. At scale (the
 * mini-batch path) the K-means also starts from the previous partition: each
 * centroid starts as the mean signature (new spec) of the requests the
 * previous artifact sends to it, so that a refit on similar traffic finds
 * similar clusters instead of another of the many near-equal balanced
 * partitions. The previous artifact must have the same model shape and k.
 *
 * Ownership: *out is a new artifact owned by the caller; the report is
 * caller-owned and released with eldr_fit_report_free(). A source's
 * callbacks run on the calling thread.
 */
#ifndef ELDR_FIT_H
#define ELDR_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact_model.h"
#include "eldr/fp_prior.h"
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
  /* at scale (eldr_fit_stream; see the top of this header) */
  size_t rho_sample;     /* requests sampled for rho and the mask (default 4000) */
  size_t exact_limit;    /* above: mini-batch + final exact (default 5000) */
  size_t batch;          /* mini-batch rows (default 4096) */
  int epochs;            /* mini-batch passes (default 2) */
  int final_iters;       /* exact balanced assignments at the end (default 2) */
  size_t sig_budget;     /* bytes for the in-memory signature matrix (3 GiB) */
  const struct eldr_artifact *previous; /* continuity with this artifact, or NULL */
  int prefill_only;      /* 1: accept a fit on requests none of which carries decode
                            selections (rho unmeasurable): count, every layer, IDF as
                            asked; 0 (default): such a fit fails (ELDR_EEMPTY) unless
                            repr and layers are both named */
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
 * 100 iterations, seed ELDR_SEED_DEFAULT, max_pairs 200000, and the scale
 * defaults listed in the struct. */
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
  size_t with_decode;       /* requests carrying decode selections */
  double kmeans_objective;
  size_t capacity;          /* ceil(n / k) (balanced) */
  double seconds_rho, seconds_kmeans;
  /* at scale */
  eldr_rho_ci rho_ci;       /* the chosen candidate's rho on the sample, with
                               its interval (se NaN when not measurable) */
  size_t sample;            /* requests in the rho sample */
  const char *mode;         /* "exact", "mini-batch" or "mini-batch (streamed)" */
  int passes;               /* passes over the source */
  double seconds_read;      /* pass 1 + signature pass */
  /* continuity (when opts.previous) */
  int have_previous;
  double moved;             /* fraction of requests changing decoder */
  double moved_unaligned;   /* the same without the reordering */
  int *perm;                /* owned, k: new position p holds the centroid the
                               fit made as number perm[p] */
  /* the footprint profile's prior, fitted on the rho sample (n = 0: none,
   * no request with decode counts; the artifact then has no prior) */
  eldr_fp_prior_report fp_prior;
} eldr_fit_report;

/* One calibration request as the fit sees it (borrowed for the visit). */
typedef struct eldr_fit_item {
  uint32_t n_prefill;        /* prompt tokens with selections; 0 = skipped */
  const uint32_t *prefill;   /* L*E counts */
  const uint32_t *decode;    /* L*E counts, or NULL when unknown */
  const float *gates;        /* L*E prefill gate sums, or NULL */
} eldr_fit_item;

/* visit returns 0 to go on, else that code stops the pass. */
typedef int (*eldr_fit_visit)(void *ud, const eldr_fit_item *it);

/* Calibration requests the fit can read several times, in the same order
 * each time. each() visits every request once and returns 0, the visit's
 * nonzero code, or its own error (with a message in d). */
typedef struct eldr_fit_source {
  const char *model;
  eldr_shape shape;
  const uint32_t *layer_ids;  /* L entries */
  const char *generator;      /* NULL when none */
  int (*each)(void *ctx, eldr_fit_visit visit, void *ud, eldr_diag *d);
  void *ctx;
} eldr_fit_source;

int eldr_fit_stream(const eldr_fit_source *src, const eldr_fit_opts *o, eldr_artifact **out,
                    eldr_fit_report *report, eldr_diag *d);

/* eldr_fit_stream over the trace (o->subset honoured). */
int eldr_fit(const eldr_trace *t, const eldr_fit_opts *o, eldr_artifact **out,
             eldr_fit_report *report, eldr_diag *d);
void eldr_fit_report_free(eldr_fit_report *r);

/* Gate-probability sums of a per-token request's prompt into out (L*E,
 * zeroed here; all zero without prefill_gates or token rows). */
void eldr_fit_gate_sums(const eldr_trace *t, const eldr_request *r, float *out);

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
