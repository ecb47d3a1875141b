/* eldr/footprint.h — the live expert footprint of each decoder and the
 * predicted cost of adding a request to it: the state behind the `footprint`
 * decode policy (include/eldr/policy.h; derivation in docs/footprint.md).
 *
 * A request's profile: p(l,e) = count(l,e) / tokens, the per-token probability
 * that it selects expert e at layer l (from its prefill selections; the
 * simulator's oracle uses its decode selections), clamped to <= 0.999. Each
 * decoder keeps, per (layer, expert), the fixed-point sum over its in-flight
 * requests of w = -ln(1 - p) (scale 2^24, 64-bit integers): its footprint.
 * A request's rounded contributions are stored with its ticket and
 * subtracted exactly when it ends, so the footprint never drifts: after any
 * sequence of routes and ends it equals the sum over the requests still in
 * flight, bit for bit (tests/core/test_footprint.c checks it after a million
 * requests). From it q(l,e) = exp(-sum w) = prod_r (1 - p_r) (the exact
 * product form for independent selections) and the expected distinct
 * experts of layer l, U_l = sum_e (1 - q), are kept per decoder, refreshed
 * only on the layers a route or an end touches.
 *
 * A decision, for each healthy decoder k with n in-flight requests and
 * prompt context C: U'_l = U_l + sum_e q(l,e) p_new(l,e);
 * T0 = eldr_latency_step_f(min(n, B), U, C), T1 = step(min(n+1, B), U', C + c);
 * cost = n (T1 - T0) + T1 * max(1, (n+1)/B): the extra time per token of the
 * requests already there plus the new request's own time per token. Lowest
 * cost wins (lower index on ties). Layers outside the optional layer mask use
 * the uniform expected union E (1 - (1 - K/E)^b) instead of the footprint.
 * Cost: D * L * E multiply-adds plus 2 D step evaluations, independent of
 * the number of requests in flight.
 *
 * Ownership: eldr_footprint_new copies the latency model and mask; the
 * object owns its per-ticket storage (allocated on route, freed on end).
 * Threads: not thread-safe; one object per decision thread (or a lock around
 * decide / route / end, as around eldr_policy_decode).
 */
#ifndef ELDR_FOOTPRINT_H
#define ELDR_FOOTPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/latency.h"

typedef struct eldr_footprint eldr_footprint;

/* Returned for "nothing tracked" (other policies, a failed route). */
#define ELDR_FP_NO_TICKET UINT64_MAX

/* Fixed-point scale of the footprint sums. */
#define ELDR_FP_SCALE 16777216.0 /* 2^24 */
/* Largest per-token probability used (w = -ln(1 - p) <= 6.9). */
#define ELDR_FP_PMAX 0.999

typedef struct eldr_footprint_opts {
  size_t n_decoders;         /* >= 1 */
  size_t max_batch;          /* decode batch limit per decoder; 0: 64 */
  const uint8_t *layer_mask; /* L flags (copied): layers predicted from the footprint; NULL: all */
  /* The profile's priors (eldr/fp_prior.h; the artifact's "footprint"
   * section): n_priors rows (0 counts as 1) of L*E per-token selection
   * rates (copied; each layer sums to K), row 0 the global prior, row
   * 1 + c cluster c's; and their weight in pseudo-tokens. A request's
   * profile is then (c + prior_tokens * pi) / (n + prior_tokens) on the
   * mask's layers with pi its row (its nearest centroid's), pi itself on
   * the other layers and without counts. NULL or prior_tokens 0: no prior
   * (the raw prefill profile; uniform K/E without counts; layers outside
   * the mask by the uniform expected union). */
  const float *prior;
  size_t n_priors;
  double prior_tokens;
  /* With cluster priors (n_priors = 1 + k): the artifact's k centroids
   * (k * dim floats, copied) that pick a request's row from its signature
   * (the largest dot product; lower index on ties). */
  const float *centroids;
  size_t dim;
  /* The weight of the request's own time in a decision's cost (0: 1, the
   * policy as fitted and studied): cost = n (T1 - T0) + w T1 max(1,
   * (n + 1) / B). Above 1 the request's own TPOT counts more against the
   * time it adds to the n requests already there, so a decoder that
   * already holds many similar requests is chosen less (the tail;
   * docs/footprint.md, "The own-time weight"). Finite, in [0, 100]. */
  double own_weight;
  /* ELDR's home decoders as a term of the cost (docs/footprint.md, "The
   * home term"; 0: off, the default): with home_centroids (n_decoders *
   * dim floats, copied: decoder k's centroid, the artifact's one per
   * decoder) and a request's signature, cost_k += home_weight * T1 *
   * (s_max - s_k), s_k = sig . centroid_k and s_max the largest. It keeps a
   * decoder's batch to one region of the experts beyond what is in flight
   * now (light load, where the footprint is thin). Finite, in [0, 100];
   * above 0 it needs home_centroids and dim. */
  double home_weight;
  const float *home_centroids;
} eldr_footprint_opts;

/* What the footprint knows about one request. counts: L*E selection counts
 * over n_tokens tokens (NULL or n_tokens == 0: the uniform profile K/E,
 * reported as a fallback); ctx_tokens: its prompt tokens (KV context). */
typedef struct eldr_fp_request {
  const uint32_t *counts;
  uint32_t n_tokens;
  uint32_t ctx_tokens;
  const float *sig; /* its signature under the artifact (dim floats), or NULL: with
                       cluster priors, the prior of the centroid nearest to it (the
                       global prior without one) */
} eldr_fp_request;

/* Create. m must validate; its shape gives L, E, K. Errors: ELDR_EINVAL
 * (n_decoders 0 or > 4096, NULL m), the latency model's error, ELDR_ENOMEM. */
int eldr_footprint_new(const eldr_latency_model *m, const eldr_footprint_opts *o,
                       eldr_footprint **out, eldr_diag *d);
void eldr_footprint_free(eldr_footprint *f);

/* Choose a decoder for r: the lowest predicted added cost among healthy
 * decoders (healthy may be NULL: all). loads: in-flight requests per decoder
 * (the router's count: the batch term). Returns the index, ELDR_EUNAVAIL when
 * none is healthy, ELDR_EINVAL on bad arguments (n != n_decoders).
 * *uniform (if not NULL) is set when r had no counts. *pred_tpot (if not
 * NULL) gets the chosen decoder's predicted time per token (T1 * queue
 * factor), seconds. No allocation. */
int eldr_footprint_decide(eldr_footprint *f, const uint32_t *loads, const uint8_t *healthy,
                          size_t n, const eldr_fp_request *r, int *uniform, double *pred_tpot);

/* r was routed to decoder k: add its contribution and return a ticket (>= 0)
 * for eldr_footprint_end, or ELDR_FP_NO_TICKET with *err set (ELDR_EINVAL
 * for k out of range, ELDR_ENOMEM). Cost O(L*E), independent of in-flight. */
uint64_t eldr_footprint_route(eldr_footprint *f, size_t k, const eldr_fp_request *r, int *err);

/* The ticket's request ended (finished, failed or cancelled): remove exactly
 * what route added. An unknown or already-ended ticket is ignored and
 * returns ELDR_ENOTFOUND (0 otherwise). */
int eldr_footprint_end(eldr_footprint *f, uint64_t ticket);

/* What the footprint knows of ticket tk's request got better: a decoder
 * chosen at arrival on a predicted signature (eldr/predict.h), whose
 * prefill's true counts arrived since. Its contribution on its decoder is
 * replaced by r's (the sums as if r had been routed there in the first
 * place) and a new ticket returned; tk has ended. ELDR_FP_NO_TICKET with
 * *err: ELDR_ENOTFOUND (tk unknown or ended), ELDR_ENOMEM (nothing
 * changed: tk still holds the old contribution). The router's peers learn
 * of it as of any route and end (the old ticket's end, the new one's
 * route). Cost O(L*E). */
uint64_t eldr_footprint_replace(eldr_footprint *f, uint64_t tk, const eldr_fp_request *r, int *err);

/* Contributions routed elsewhere (another event loop or router replica,
 * over the router's fleet bus): the ticket's decoder, its nnz flat
 * (l*E + e) indices (ascending), fixed-point weights and prompt tokens, as
 * route added them, recomputed from the ticket's counts as its end will
 * (with profile priors every cell of the tracked layers has a weight).
 * idx and w are f's scratch, valid until the next call on f (copy them);
 * ELDR_ENOTFOUND for an unknown or ended ticket. */
int eldr_footprint_ticket(eldr_footprint *f, uint64_t ticket, size_t *k, uint32_t *nnz,
                          const uint32_t **idx, const uint32_t **w, uint32_t *ctx);
/* Add n integer deltas dw at flat indices idx (each < L*E, any order, no
 * repeats) to decoder k's sums, and dctx to its prompt tokens in flight:
 * what requests routed elsewhere add and remove. The caller keeps them
 * consistent (it removes exactly what it added), so the sums stay exact.
 * ELDR_EINVAL for k or an index out of range (nothing changed). O(n + the
 * touched layers' E). */
int eldr_footprint_adjust(eldr_footprint *f, size_t k, const uint32_t *idx, const int64_t *dw, size_t n,
                          int64_t dctx);

/* Inspection (tests, diagnostics). Requests in flight on decoder k; its
 * expected distinct experts at layer l; its raw fixed-point sum at (l, e). */
size_t eldr_footprint_inflight(const eldr_footprint *f, size_t k);

/* What the last eldr_footprint_decide predicted for the decoder it chose
 * (diagnostics: the simulator logs it per request). */
typedef struct eldr_fp_explain {
  int decoder;        /* the choice, -1 before any decision */
  double union_mean;  /* U' averaged over the layers: distinct experts per layer with the request */
  double t0, t1;      /* predicted step time without and with the request, s */
  double cost;        /* the decision's cost, s */
} eldr_fp_explain;
void eldr_footprint_explain(const eldr_footprint *f, eldr_fp_explain *out);
double eldr_footprint_union(const eldr_footprint *f, size_t k, size_t l);
int64_t eldr_footprint_raw(const eldr_footprint *f, size_t k, size_t l, size_t e);

#endif
