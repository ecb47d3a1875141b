/* eldr/policy.h — the routing decision: one API called by the simulator and
 * by the server alike (the thing measured is the thing that serves).
 *
 * Decode policies: random, round-robin, JSQ (join the shortest queue),
 * power-of-two-choices, Domain (oracle label -> a contiguous group of
 * decoders, JSQ inside), and ELDR: sim_k = cos(sig, centroid_k),
 * band = {k : sim_k >= max sim - tau}, least-loaded decoder in the band.
 * K centroids in front of D decoders (an autoscaler adds or removes
 * decoders; docs/serve.md "K != D"): D >= K: decoder i uses centroid i % K
 * (several decoders share a centroid: the band then holds all of them and
 * the least loaded wins); D < K: decoder i serves centroids i, i + D,
 * i + 2D, ... and its similarity is the best of theirs. Every centroid is
 * served either way. tau = 0 is nearest centroid,
 * Signatures are non-negative, so similarities lie in [0, 1] and tau = 1
 * puts every decoder in the band: pure shortest queue.
 * FOOTPRINT (ours, not the paper's): the decoder with the lowest predicted
 * added cost from the decoders' live expert footprints and the latency model
 * (include/eldr/footprint.h, docs/footprint.md); it needs a footprint state
 * attached (eldr_policy_attach_footprint) and the on_route / on_end calls,
 * else it is JSQ with ELDR_FALLBACK_NO_MODEL.
 * Prefill: prefix hash picks a home worker; if its load exceeds the least
 * load + guard, the least-loaded worker takes it (load guard).
 *
 * Ties are broken deterministically: JSQ by lower index; ELDR band by higher
 * similarity, then lower index; P2C by the first drawn. Only RANDOM and P2C
 * draw from the policy's own seeded generator.
 *
 * No allocation, no I/O in a decision. A decision changes the policy's rng
 * (RANDOM, P2C) and round-robin position (RR), and a FOOTPRINT decision the
 * attached footprint's scratch; on_route / on_end change the footprint's
 * live sums. The policy borrows the centroids and the footprint state (the
 * caller keeps them alive, e.g. the loaded artifact). Not thread-safe: one
 * policy object per decision thread, or a lock around eldr_policy_decode.
 */
#ifndef ELDR_POLICY_H
#define ELDR_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/footprint.h"
#include "eldr/rng.h"

typedef enum eldr_policy_kind {
  ELDR_POLICY_RANDOM = 0,
  ELDR_POLICY_RR,
  ELDR_POLICY_JSQ,
  ELDR_POLICY_P2C,
  ELDR_POLICY_DOMAIN,
  ELDR_POLICY_ELDR,
  ELDR_POLICY_FOOTPRINT,
  ELDR_POLICY__COUNT
} eldr_policy_kind;

/* "random", "rr", "jsq", "p2c", "domain", "eldr", "footprint". */
const char *eldr_policy_name(eldr_policy_kind k);
/* Parse a name (also "round-robin", "power-of-two"); ELDR_EINVAL if unknown. */
int eldr_policy_parse(const char *name, eldr_policy_kind *out);

/* Why a decision did not use the requested policy's locality information. */
typedef enum eldr_fallback {
  ELDR_FALLBACK_NONE = 0,
  ELDR_FALLBACK_NO_SIGNATURE, /* ELDR without a signature (no routed_experts / malformed / empty) */
  ELDR_FALLBACK_NO_ARTIFACT,  /* ELDR without centroids */
  ELDR_FALLBACK_NO_DOMAIN,    /* DOMAIN without a label */
  ELDR_FALLBACK_NO_MODEL,     /* FOOTPRINT without latency coefficients (no footprint state) */
} eldr_fallback;

typedef struct eldr_policy {
  eldr_policy_kind kind;
  double tau;
  eldr_rng rng;
  size_t rr_next;
  const float *centroids; /* borrowed: n_centroids * dim unit rows, or NULL */
  size_t n_centroids;
  size_t dim;
  size_t n_domains;       /* DOMAIN: number of labels (>= 1) */
  eldr_footprint *fp;     /* FOOTPRINT: borrowed state, or NULL (JSQ fallback) */
} eldr_policy;

/* Initialise. centroids may be NULL (ELDR then falls back to JSQ).
 * Returns 0 or ELDR_EINVAL (tau < 0 or NaN, dim == 0 with centroids). */
int eldr_policy_init(eldr_policy *p, eldr_policy_kind kind, double tau, uint64_t seed,
                     const float *centroids, size_t n_centroids, size_t dim, size_t n_domains);

/* What is known about the request at decode-routing time. */
typedef struct eldr_route_req {
  const float *sig; /* unit signature of dim p->dim, or NULL */
  int domain;       /* oracle label for DOMAIN, or -1 */
  float *sims;      /* ELDR: caller's n_centroids floats receiving every centroid's
                       similarity (when a signature was used), or NULL */
} eldr_route_req;

typedef struct eldr_decision {
  int decoder;            /* chosen index in [0, n) */
  eldr_fallback fallback; /* ELDR_FALLBACK_NONE when the policy ran as asked */
  float best_sim;         /* ELDR: max similarity (else 0) */
  int band_size;          /* ELDR: decoders in the band (else 0) */
  int centroid;           /* ELDR: the centroid the chosen decoder matched (else -1) */
  double pred_tpot;       /* FOOTPRINT: predicted time per token on the chosen decoder, s (else 0) */
} eldr_decision;

/* Choose a decode worker. loads: n in-flight counts; healthy: n flags or
 * NULL (all healthy). Returns the chosen index (also in out->decoder if out
 * != NULL), or ELDR_EUNAVAIL when no decoder is healthy, ELDR_EINVAL on n == 0.
 * Unhealthy decoders are never chosen.
 * Details: RANDOM draws uniformly among healthy decoders. RR takes the first
 * healthy decoder at or after rr_next (cyclically) and moves rr_next past it.
 * P2C draws two distinct healthy decoders (one healthy: that one).
 * DOMAIN: with D = n_domains <= n, label d owns decoders
 * [d*n/D, (d+1)*n/D) (contiguous, sizes differ by at most one); with D > n,
 * label d owns decoder d % n. A label outside [0, D), or a group with no
 * healthy member, gives JSQ over all with ELDR_FALLBACK_NO_DOMAIN.
 * ELDR: the band edge is max sim - tau - 1e-6, so tau = 0 keeps exact ties.
 * Without centroids: JSQ with ELDR_FALLBACK_NO_ARTIFACT (checked first);
 * without a signature (or one whose similarities are NaN): JSQ with
 * ELDR_FALLBACK_NO_SIGNATURE.
 * FOOTPRINT through eldr_policy_decode: no selection counts (the uniform
 * profile, ELDR_FALLBACK_NO_SIGNATURE); use eldr_policy_decide. */
int eldr_policy_decode(eldr_policy *p, const uint32_t *loads, const uint8_t *healthy, size_t n,
                       const eldr_route_req *req, eldr_decision *out);

/* eldr_policy_decode plus what FOOTPRINT needs (fr: the request's prefill
 * selection counts, token count and prompt tokens; NULL = none; ignored by
 * every other policy). FOOTPRINT runs eldr_footprint_decide: without counts
 * it uses the uniform profile K/E and reports ELDR_FALLBACK_NO_SIGNATURE;
 * without an attached footprint it is JSQ with ELDR_FALLBACK_NO_MODEL. */
int eldr_policy_decide(eldr_policy *p, const uint32_t *loads, const uint8_t *healthy, size_t n,
                       const eldr_route_req *req, const eldr_fp_request *fr, eldr_decision *out);

/* FOOTPRINT: attach the footprint state (borrowed; NULL detaches). */
void eldr_policy_attach_footprint(eldr_policy *p, eldr_footprint *fp);

/* The router's two bookkeeping calls around a decision; no-ops returning
 * ELDR_FP_NO_TICKET / nothing for every policy but an attached FOOTPRINT.
 * on_route: the request (the same fr given to eldr_policy_decide) was sent
 * to decoder k; returns the ticket to keep with the request.
 * on_end: the request's decode leg ended (finished, failed, cancelled, or its
 * decoder was lost); call exactly once per ticket. Unknown tickets are ignored. */
uint64_t eldr_policy_on_route(eldr_policy *p, int k, const eldr_fp_request *fr);
void eldr_policy_on_end(eldr_policy *p, uint64_t ticket);

/* Choose a prefill worker by prefix hash with a load guard: home =
 * hash-ordered healthy worker (rendezvous hashing); if loads[home] > min
 * healthy load + guard, the least-loaded healthy worker (lowest index on
 * ties). Returns index or ELDR_EUNAVAIL (ELDR_EINVAL when loads is NULL or
 * n == 0). The rendezvous weight of worker i is XXH64 of (prefix_hash,
 * keys[i]), highest wins (lower index on ties): keys[i] is the worker's
 * identity (the router: a hash of its URL, eldr_policy_worker_key), so a
 * prompt keeps its home worker however the list is ordered, through a
 * reload or a DNS change that reorders it, and only the prompts whose
 * home leaves, or that a new worker wins, move. keys NULL: the index is
 * the identity (the simulator, whose worker list never changes). */
int eldr_policy_prefill(uint64_t prefix_hash, const uint64_t *keys, const uint32_t *loads,
                        const uint8_t *healthy, size_t n, uint32_t guard);
/* The rendezvous key of a worker named by a string (its URL): XXH64. */
uint64_t eldr_policy_worker_key(const char *name);


#endif
