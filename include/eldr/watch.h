/* eldr/watch.h — watching a routing artifact go stale (core layer, pure):
 * the fit-time reference of the signature distribution, a sliding window of
 * live decisions, the statistics over it (traffic share of each centroid
 * against its capacity share, mean similarity, drift score) and the live rho
 * of recorded prefill/decode pairs. `eldr fit` computes the reference and
 * stores it in the artifact (fit.drift_ref); `eldr serve` feeds the window
 * and shows the statistics on /metrics and GET /eldr/status; `eldr demo
 * --drift` plots them.
 *
 * The drift score (eldr_signature_drift, docs/serve.md "Watch"):
 *   drift = max(JS, KS)
 *   JS = Jensen-Shannon divergence, base 2 (in [0, 1]), between the live
 *        histogram of each request's nearest centroid and the fit-time one;
 *   KS = Kolmogorov-Smirnov distance (largest gap of the two CDFs, in
 *        [0, 1]) between the live distribution of each request's best
 *        similarity and the fit-time one, both binned in
 *        ELDR_WATCH_SIM_BINS equal bins of [0, 1], less its 5% critical
 *        value 1.358 sqrt((n + m) / (n m)) (n live, m fit-time requests),
 *        floored at 0: sampling noise alone scores 0.
 * It is unknown (NaN) without a reference (an artifact from before the
 * field) or with fewer than ELDR_DRIFT_MIN_SAMPLES requests in the window;
 * above ELDR_DRIFT_THRESHOLD the artifact is stale (refit and reload).
 *
 * Ownership: eldr_drift_ref and eldr_watch are owned by their creator and
 * freed with their _free. Errors: ELDR_EINVAL (bad arguments), ELDR_ENOMEM.
 * Threads: no global state; an eldr_watch is not locked (one writer, or a
 * lock around it).
 */
#ifndef ELDR_WATCH_H
#define ELDR_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"

#define ELDR_WATCH_SIM_BINS 20
#define ELDR_DRIFT_THRESHOLD 0.15
#define ELDR_DRIFT_MIN_SAMPLES 100

/* The fit-time reference (the artifact's fit.drift_ref). */
typedef struct eldr_drift_ref {
  size_t k;
  size_t n;                 /* signatures it was computed from */
  double *nearest_share;    /* owned, k fractions summing to 1 */
  double sim_hist[ELDR_WATCH_SIM_BINS]; /* fractions summing to 1 */
} eldr_drift_ref;

/* The bin of a similarity: floor(s * BINS) clamped to [0, BINS). */
int eldr_watch_sim_bin(float s);

/* The reference of n signatures (n * dim, unit rows; zero rows skipped)
 * against k unit centroids. ELDR_EEMPTY when every row is zero. */
int eldr_drift_ref_compute(const float *centroids, size_t k, size_t dim, const float *sigs,
                           size_t n, eldr_drift_ref **out);
/* A reference for k centroids with zeroed arrays (for the codec); NULL on ENOMEM or k == 0. */
eldr_drift_ref *eldr_drift_ref_new(size_t k);
void eldr_drift_ref_free(eldr_drift_ref *r);
/* Fractions non-negative, finite, each set summing to 1 within 1e-6
 * (an all-zero reference with n == 0 too): 0 or ELDR_ERANGE naming the field. */
int eldr_drift_ref_validate(const eldr_drift_ref *r, eldr_diag *d);

/* Jensen-Shannon divergence, base 2, of two distributions of n (each
 * normalised by its own sum; an all-zero one gives NaN). */
double eldr_js_divergence(const double *p, const double *q, size_t n);
/* Largest |CDF_p - CDF_q| over the n bins (normalised as above). */
double eldr_ks_binned(const double *p, const double *q, size_t n);

/* Capacity share of each of k centroids in front of n decoders under the
 * policy's decoder -> centroid mapping (eldr/policy.h): n >= k: decoders
 * of centroid c / n; n < k: 1 / (n * centroids of c's decoder). */
void eldr_watch_capacity_share(size_t k, size_t n, double *share);

/* ---- the sliding window ----------------------------------------------------- */

typedef struct eldr_watch eldr_watch;

/* A window of the last cap decisions for k centroids. NULL on ENOMEM / 0. */
eldr_watch *eldr_watch_new(size_t cap, size_t k);
void eldr_watch_free(eldr_watch *w);
size_t eldr_watch_k(const eldr_watch *w);
size_t eldr_watch_cap(const eldr_watch *w);
/* Forget every decision (after an artifact swap). */
void eldr_watch_reset(eldr_watch *w);
/* One locality decision at time t (seconds, any monotonic clock): sims are
 * the request's similarities to the k centroids; chosen the centroid of the
 * decoder it went to (-1: unknown). NaN similarities are ignored. */
void eldr_watch_add(eldr_watch *w, double t, const float *sims, int chosen);

typedef struct eldr_watch_stats {
  size_t n;               /* decisions in the window */
  double *share;          /* caller's k: traffic share of each chosen centroid (0 when n == 0) */
  double *nearest;        /* caller's k or NULL: share of each nearest centroid */
  double mean_chosen_sim; /* mean similarity to the chosen centroid (NaN when n == 0) */
  double mean_best_sim;   /* mean best similarity (NaN when n == 0) */
  double js, ks;          /* the two parts (NaN without a reference / n == 0) */
  double drift;           /* max(js, ks); NaN when unknown */
  int stale;              /* drift > ELDR_DRIFT_THRESHOLD */
} eldr_watch_stats;

/* Statistics over the decisions with t >= now - window_s (window_s <= 0:
 * all kept) against ref (NULL: drift unknown; a ref for another k is
 * ignored). out->share (and out->nearest) must hold k doubles. */
void eldr_watch_stats_get(const eldr_watch *w, double now, double window_s,
                          const eldr_drift_ref *ref, eldr_watch_stats *out);

/* ---- live rho ---------------------------------------------------------------- */

/* The last cap (signature, decode pattern) pairs; rho as eldr_quality_rho. */
typedef struct eldr_rho_ring eldr_rho_ring;
eldr_rho_ring *eldr_rho_ring_new(size_t cap, size_t sdim, size_t ddim);
void eldr_rho_ring_free(eldr_rho_ring *r);
/* Copy one pair in (sig: sdim unit floats; dec: ddim decode counts, which
 * are L2-normalised here). A zero decode row is not added (returns 0). */
int eldr_rho_ring_add(eldr_rho_ring *r, const float *sig, const uint32_t *dec_counts);
size_t eldr_rho_ring_count(const eldr_rho_ring *r);
/* A new ring holding the same pairs as r (to compute rho on while r goes
 * on taking pairs); NULL on ENOMEM. */
eldr_rho_ring *eldr_rho_ring_copy(const eldr_rho_ring *r);
/* Make dst (from eldr_rho_ring_copy of a ring of the same dimensions) hold
 * src's pairs again: 0, or ELDR_EINVAL when the dimensions differ. */
int eldr_rho_ring_copy_into(eldr_rho_ring *dst, const eldr_rho_ring *src);
/* rho over the pairs held: 0 and *rho, or ELDR_EEMPTY (fewer than 3 pairs,
 * or undefined), ELDR_ENOMEM. */
int eldr_rho_ring_rho(const eldr_rho_ring *r, double *rho);

#endif
