/* eldr/policy.h — the routing decision: one API called by the simulator and
 * by the server alike (the thing measured is the thing that serves).
 *
 * Decode policies: random, round-robin, JSQ (join the shortest queue),
 * power-of-two-choices, Domain (oracle label -> a contiguous group of
 * decoders, JSQ inside), and ELDR: sim_k = cos(sig, centroid_k),
 * band = {k : sim_k >= max sim - tau}, least-loaded decoder in the band.
 * Decoder i uses centroid i % n_centroids. tau = 0 is nearest centroid,
 * Signatures are non-negative, so similarities lie in [0, 1] and tau = 1
 * puts every decoder in the band: pure shortest queue.
 * Prefill: prefix hash picks a home worker; if its load exceeds the least
 * load + guard, the least-loaded worker takes it (load guard).
 *
 * Ties are broken deterministically: JSQ by lower index; ELDR band by higher
 * similarity, then lower index; P2C by the first drawn. Only RANDOM and P2C
 * draw from the policy's own seeded generator.
 *
 * No allocation, no I/O. The policy borrows the centroids (the caller keeps
 * them alive, e.g. the loaded artifact). Not thread-safe: one policy object
 * per decision thread, or a lock around eldr_policy_decode.
 */
#ifndef ELDR_POLICY_H
#define ELDR_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/rng.h"

typedef enum eldr_policy_kind {
  ELDR_POLICY_RANDOM = 0,
  ELDR_POLICY_RR,
  ELDR_POLICY_JSQ,
  ELDR_POLICY_P2C,
  ELDR_POLICY_DOMAIN,
  ELDR_POLICY_ELDR,
  ELDR_POLICY__COUNT
} eldr_policy_kind;

/* "random", "rr", "jsq", "p2c", "domain", "eldr". */
const char *eldr_policy_name(eldr_policy_kind k);
/* Parse a name (also "round-robin", "power-of-two"); ELDR_EINVAL if unknown. */
int eldr_policy_parse(const char *name, eldr_policy_kind *out);

/* Why a decision did not use the requested policy's locality information. */
typedef enum eldr_fallback {
  ELDR_FALLBACK_NONE = 0,
  ELDR_FALLBACK_NO_SIGNATURE, /* ELDR without a signature (no routed_experts / malformed / empty) */
  ELDR_FALLBACK_NO_ARTIFACT,  /* ELDR without centroids */
  ELDR_FALLBACK_NO_DOMAIN,    /* DOMAIN without a label */
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
} eldr_policy;

/* Initialise. centroids may be NULL (ELDR then falls back to JSQ).
 * Returns 0 or ELDR_EINVAL (tau < 0 or NaN, dim == 0 with centroids). */
int eldr_policy_init(eldr_policy *p, eldr_policy_kind kind, double tau, uint64_t seed,
                     const float *centroids, size_t n_centroids, size_t dim, size_t n_domains);

/* What is known about the request at decode-routing time. */
typedef struct eldr_route_req {
  const float *sig; /* unit signature of dim p->dim, or NULL */
  int domain;       /* oracle label for DOMAIN, or -1 */
} eldr_route_req;

typedef struct eldr_decision {
  int decoder;            /* chosen index in [0, n) */
  eldr_fallback fallback; /* ELDR_FALLBACK_NONE when the policy ran as asked */
  float best_sim;         /* ELDR: max similarity (else 0) */
  int band_size;          /* ELDR: decoders in the band (else 0) */
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
 * ELDR_FALLBACK_NO_SIGNATURE. */
int eldr_policy_decode(eldr_policy *p, const uint32_t *loads, const uint8_t *healthy, size_t n,
                       const eldr_route_req *req, eldr_decision *out);

/* Choose a prefill worker by prefix hash with a load guard: home =
 * hash-ordered healthy worker (rendezvous hashing, stable when workers come
 * and go); if loads[home] > min healthy load + guard, the least-loaded
 * healthy worker (lowest index on ties). Returns index or ELDR_EUNAVAIL
 * (ELDR_EINVAL when loads is NULL or n == 0). The rendezvous weight of
 * worker i is XXH64 of (prefix_hash, i), highest wins (lower index on ties). */
int eldr_policy_prefill(uint64_t prefix_hash, const uint32_t *loads, const uint8_t *healthy,
                        size_t n, uint32_t guard);

#endif
