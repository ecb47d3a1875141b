/* eldr/fp_prior.h — the prior of the footprint policy's request profile,
 * fitted on calibration requests (core layer; docs/footprint.md).
 *
 * A request's prefill says little about its decode when the prompt is
 * short: 16 prompt tokens of a top-1 model select at most 16 experts of a
 * layer, while its 128 decode tokens spread over more. Profiles taken
 * straight from the prefill counts are too concentrated, and the expected
 * distinct experts of a batch built from them falls short of the real
 * union more and more as the batch grows. The profile is therefore
 * shrunk towards a prior,
 *
 *     p(l,e) = (c(l,e) + alpha * pi_g(l,e)) / (n + alpha),
 *
 * c the request's prefill counts over n tokens, alpha a weight in
 * pseudo-tokens (alpha -> 0: the raw prefill profile; alpha -> inf: the
 * prior alone), and pi_g the decode selection rate (per token; a layer's
 * rates sum to K) of the request's group g: its cluster of the routing
 * artifact (the centroid nearest to its signature), whose requests share
 * a domain's experts. A global prior pools every calibration request; a
 * cluster's is its own requests' pooled decode, shrunk towards the global
 * one with weight beta (pseudo-tokens). Requests of one cluster thus share
 * their prior mass on the same experts, so a batch of alike requests is
 * predicted to touch few distinct experts (as it does), where a global
 * prior alone would spread every member's mass over the experts of all
 * domains.
 *
 * Fit: pi_global = the pooled decode counts / decode tokens, mixed with one
 * pseudo-token of the uniform rate K/E (no expert has rate 0). beta (with
 * the alpha that goes with it) maximises the leave-one-out log-likelihood
 * of each calibration request's decode selections under its profile (its
 * own decode counts left out of every prior), over a log grid 1/16 .. 2^20
 * and "none" (the global prior alone). Then alpha is fitted for what the
 * policy uses a profile for, the expected distinct experts of a batch:
 * calibration batches of 4..64 requests, drawn at random and from one
 * cluster, with the union their prefill profiles predict against the one
 * their decode selections predict; alpha minimises the mean squared
 * relative miss (a log grid refined by golden-section search). The
 * likelihood's alpha is larger (it fits a request's whole distribution,
 * where the union is set mostly by how many experts each member spreads
 * over); both are reported. Requests without decode counts (or without
 * prefill) do not count; with none left there is no prior (ELDR_EEMPTY).
 *
 * Ownership: the caller's buffers. Threads: any; no state. */
#ifndef ELDR_FP_PRIOR_H
#define ELDR_FP_PRIOR_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"

typedef struct eldr_fp_prior_report {
  size_t n;          /* requests with prefill and decode counts used */
  double alpha;      /* the weight used: request over prior (pseudo-tokens), by union calibration */
  double beta;       /* cluster prior over the global one (pseudo-tokens); inf: no cluster priors */
  double alpha_ll;   /* the likelihood's alpha at beta */
  double ll_alpha;   /* mean leave-one-out log-likelihood per decode selection at (alpha_ll, beta) */
  double ll_union_alpha; /* the same at (alpha, beta) */
  double ll_global;  /* the best with the global prior alone */
  double ll_prior;   /* at beta with the prior alone (alpha -> inf) */
  double ll_prefill; /* at beta with alpha = 1/64 (nearly the raw prefill profile) */
  double union_err;  /* rms relative miss of the calibration batches' union at alpha */
  double union_err_ll;  /* the same at alpha_ll */
  double union_err_raw; /* the same with the raw prefill profile (alpha = 1/64) */
} eldr_fp_prior_report;

/* pre, dec: n requests' L*E prefill and decode counts (a request whose
 * decode or prefill counts are all 0 is skipped); label: each request's
 * cluster in [0, k) (< 0: none), or NULL for the global prior only.
 * prior: (1 + k) * L*E floats out (k = 0 without labels): row 0 the global
 * prior, row 1 + c cluster c's (the global one's copy when beta is inf).
 * Returns 0, ELDR_EEMPTY (no request with both), ELDR_EINVAL (a label
 * >= k), ELDR_ENOMEM. */
int eldr_fp_prior_fit(const eldr_shape *s, const uint32_t *pre, const uint32_t *dec,
                      const int *label, size_t n, size_t k, float *prior,
                      eldr_fp_prior_report *rep);

#endif
