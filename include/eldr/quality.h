/* eldr/quality.h — the offline quality metric rho and layer-mask selection.
 *
 * rho = Spearman rank correlation (average ranks for ties), over request
 * pairs, between cosine distance of prefill signatures and cosine distance
 * of decode patterns (decode counts over all layers). Higher is better.
 *
 * Ownership: callers own every buffer; functions that need scratch memory
 * allocate and free it themselves and return ELDR_ENOMEM on failure.
 */
#ifndef ELDR_QUALITY_H
#define ELDR_QUALITY_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/signature.h"

/* Average ranks (1-based; ties get the mean of their positions) into ranks
 * (n, caller's). Exact comparison of the doubles. Returns 0, ELDR_EINVAL
 * (NULL, or a NaN in x), ELDR_ENOMEM. */
int eldr_rank_average(const double *x, size_t n, double *ranks);

/* Spearman correlation of x and y (n >= 2): Pearson correlation of their
 * average ranks. Returns 0 and *rho, or ELDR_EINVAL (n < 2, NULL, NaN) /
 * ELDR_EEMPTY (a constant vector: rho undefined; *rho untouched) /
 * ELDR_ENOMEM. */
int eldr_spearman(const double *x, const double *y, size_t n, double *rho);

/* Which request pairs rho is computed over: all pairs when
 * n*(n-1)/2 <= max_pairs (or max_pairs == 0), else max_pairs pairs drawn
 * with the seed. */
typedef struct eldr_pairs_opts {
  size_t max_pairs;
  uint64_t seed;
} eldr_pairs_opts;

/* rho between signature distances (sigs: n * sdim, unit rows or zero rows)
 * and decode-pattern distances (dec: n * ddim, unit rows or zero rows).
 * Distances are cosine distances 1 - cos (1 when either row is zero),
 * clamped to [0, 2] and rounded to multiples of 2^-16 before ranking, so
 * that distances equal up to float rounding of the inputs are ties. Pairs are
 * those eldr_pairs_opts chooses (all pairs, or a sample).
 * Errors: ELDR_EINVAL (NULL, n < 2, zero dim), ELDR_EEMPTY (all decode or
 * all signature distances equal: rho undefined), ELDR_ERANGE (a non-finite
 * row), ELDR_ENOMEM. */
int eldr_quality_rho(const float *sigs, size_t sdim, const float *dec, size_t ddim, size_t n,
                     const eldr_pairs_opts *po, double *rho);

/* rho with its uncertainty, for a rho measured on a sample of requests and
 * of their pairs. Statistic: rho as eldr_quality_rho (same pairs, same
 * distance grid). Uncertainty: the delete-a-group jackknife over requests:
 * request i is in group i % groups; rho_(g) is rho over the pairs that touch
 * no request of group g; se = sqrt((G-1)/G * sum_g (rho_(g) - mean)^2).
 * Deleting whole requests (not single pairs) accounts for the dependence of
 * pairs that share a request, which a pair-count formula (Fisher z with P
 * pairs) ignores and so makes far too narrow. The interval is the normal
 * one, rho -/+ 1.96 se (95%), clipped to [-1, 1]. */
typedef struct eldr_rho_ci {
  double rho;      /* on all the pairs */
  double se;       /* jackknife standard error (NaN if a deleted group left
                      rho undefined) */
  double lo, hi;   /* 95% interval (NaN with se) */
  size_t pairs;    /* pairs rho was computed over */
  size_t requests; /* n */
  size_t groups;   /* G */
} eldr_rho_ci;

/* As eldr_quality_rho plus the jackknife (groups >= 2, n >= 2 * groups,
 * else ELDR_EINVAL). Cost: (groups + 1) rankings of the pairs' keys, O(P)
 * each. Errors as eldr_quality_rho. */
int eldr_quality_rho_ci(const float *sigs, size_t sdim, const float *dec, size_t ddim, size_t n,
                        const eldr_pairs_opts *po, size_t groups, eldr_rho_ci *out);

/* Decode patterns: dec_counts (n * L*E) -> out (n * L*E), each row the
 * L2-normalised decode counts (zero rows stay zero). */
void eldr_quality_decode_patterns(const eldr_shape *s, const uint32_t *dec_counts, size_t n,
                                  float *out);

/* One step of greedy forward selection. */
typedef struct eldr_mask_step {
  int layer;  /* layer index added at this step */
  double rho; /* rho of the mask after adding it */
} eldr_mask_step;

/* Greedy forward layer selection: start empty, add the layer that maximises
 * rho (ties: the lower layer index; a mask whose rho is undefined, all
 * signature distances equal, ranks below any number and reports rho NaN),
 * until all L layers are in; steps[i] gets step i (L entries, caller's).
 * The rho of each mask equals eldr_quality_rho on signatures built with
 * eldr_signature_build for that mask (same pairs, up to float rounding of the
 * signature values). Best prefix ties go to the smaller mask.
 * Errors: ELDR_EINVAL (NULL, bad shape, n < 2), ELDR_EUNSUPPORTED (GATE/LOGIT
 * without gate_sums), ELDR_EEMPTY (decode distances all equal, or no mask
 * has a defined rho), ELDR_ERANGE (non-finite values), ELDR_ENOMEM.
 * best_mask (L flags) receives the prefix of steps with the highest rho;
 * *best_rho its value; *all_rho (optional) rho with all layers.
 * prefill_counts: n * L*E, gate_sums: n * L*E or NULL, dec: n * ddim unit rows.
 * idf: L*E or NULL. Complexity: precomputes the decode distances and the
 * per-layer dot of every pair (dense rows, or nonzero lists when fewer than
 * a quarter of the prefill cells are nonzero), then each candidate mask
 * costs O(P) for its distances (running sums over the chosen layers) plus a
 * counting sort of the grid keys: O(L^2 * P) in all. Measured (2-core VM,
 * gcc -O2, one thread): 259 requests x 24 layers, 33k pairs: 0.08 s;
 * 5000 x 48 layers, 200k pairs: 2.4 s.
 * Scratch memory: about P * (4 L + 36) + 8 n L bytes + 1.5 MB, plus the
 * prefill rows: 4 n L E bytes when dense, 6 bytes per nonzero when sparse. */
int eldr_quality_greedy_mask(const eldr_shape *s, eldr_repr repr, const float *idf,
                             const uint32_t *prefill_counts, const float *gate_sums,
                             const float *dec, size_t ddim, size_t n, const eldr_pairs_opts *po,
                             eldr_mask_step *steps, uint8_t *best_mask, double *best_rho,
                             double *all_rho);

#endif
