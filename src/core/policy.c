/* policy.c — routing decisions (see include/eldr/policy.h).
 *
 * Computation only: no I/O, and no allocation in a decision. What a call
 * changes: a decision, the policy's own rng (RANDOM, P2C) and rr_next (RR);
 * a FOOTPRINT decision also the attached footprint's scratch (its per-layer
 * products: not its state); eldr_policy_on_route and eldr_policy_on_end the
 * footprint's live sums and tickets (on_route allocates the ticket's
 * arrays, footprint.c). The similarities are eldr/dot.h's. */
#include "eldr/policy.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

#include "eldr/dot.h"
#include "eldr/error.h"

/* Tolerance on the ELDR band edge, so that tau = 0 keeps exact (and
 * float-rounding) ties in the band. */
#define ELDR_BAND_EPS 1e-6

/* Similarities of up to this many decoders are kept on the stack between the
 * two passes of an ELDR decision; beyond it they are recomputed. */
#define ELDR_SIM_CACHE 256

static const char *const policy_names[ELDR_POLICY__COUNT] = {
    [ELDR_POLICY_RANDOM] = "random", [ELDR_POLICY_RR] = "rr",
    [ELDR_POLICY_JSQ] = "jsq",       [ELDR_POLICY_P2C] = "p2c",
    [ELDR_POLICY_DOMAIN] = "domain", [ELDR_POLICY_ELDR] = "eldr",
    [ELDR_POLICY_FOOTPRINT] = "footprint",
};

const char *eldr_policy_name(eldr_policy_kind k) {
  if ((int)k < 0 || k >= ELDR_POLICY__COUNT) return "unknown";
  return policy_names[k];
}

int eldr_policy_parse(const char *name, eldr_policy_kind *out) {
  if (!name || !out) return ELDR_EINVAL;
  for (int i = 0; i < ELDR_POLICY__COUNT; i++) {
    if (strcmp(name, policy_names[i]) == 0) {
      *out = (eldr_policy_kind)i;
      return ELDR_OK;
    }
  }
  if (strcmp(name, "round-robin") == 0) {
    *out = ELDR_POLICY_RR;
    return ELDR_OK;
  }
  if (strcmp(name, "power-of-two") == 0) {
    *out = ELDR_POLICY_P2C;
    return ELDR_OK;
  }
  return ELDR_EINVAL;
}

int eldr_policy_init(eldr_policy *p, eldr_policy_kind kind, double tau, uint64_t seed,
                     const float *centroids, size_t n_centroids, size_t dim, size_t n_domains) {
  if (!p) return ELDR_EINVAL;
  if ((int)kind < 0 || kind >= ELDR_POLICY__COUNT) return ELDR_EINVAL;
  if (isnan(tau) || tau < 0.0) return ELDR_EINVAL;
  if (centroids && n_centroids > 0 && dim == 0) return ELDR_EINVAL;
  if (kind == ELDR_POLICY_DOMAIN && n_domains == 0) return ELDR_EINVAL;
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->tau = tau;
  eldr_rng_seed(&p->rng, seed);
  p->rr_next = 0;
  p->centroids = n_centroids > 0 ? centroids : NULL;
  p->n_centroids = p->centroids ? n_centroids : 0;
  p->dim = dim;
  p->n_domains = n_domains;
  return ELDR_OK;
}

static inline int is_up(const uint8_t *healthy, size_t i) { return !healthy || healthy[i]; }

/* Least-loaded healthy decoder in [lo, hi), lower index on ties; -1 if none. */
static int jsq_range(const uint32_t *loads, const uint8_t *healthy, size_t lo, size_t hi) {
  int best = -1;
  uint32_t best_load = 0;
  for (size_t i = lo; i < hi; i++) {
    if (!is_up(healthy, i)) continue;
    if (best < 0 || loads[i] < best_load) {
      best = (int)i;
      best_load = loads[i];
    }
  }
  return best;
}

/* The idx-th healthy decoder (0-based); caller guarantees it exists. */
static size_t nth_healthy(const uint8_t *healthy, size_t n, size_t idx) {
  if (!healthy) return idx;
  for (size_t i = 0; i < n; i++) {
    if (healthy[i]) {
      if (idx == 0) return i;
      idx--;
    }
  }
  return 0; /* unreachable when idx < number of healthy decoders */
}


static int decide_domain(const eldr_policy *p, const uint32_t *loads, const uint8_t *healthy,
                         size_t n, const eldr_route_req *req, eldr_decision *dec) {
  if (req && req->domain >= 0 && (size_t)req->domain < p->n_domains) {
    size_t d = (size_t)req->domain, lo, hi;
    if (p->n_domains > n) {
      lo = d % n;
      hi = lo + 1;
    } else {
      lo = d * n / p->n_domains;
      hi = (d + 1) * n / p->n_domains;
    }
    int c = jsq_range(loads, healthy, lo, hi);
    if (c >= 0) return c;
  }
  dec->fallback = ELDR_FALLBACK_NO_DOMAIN;
  return jsq_range(loads, healthy, 0, n);
}

/* Decoder k's similarity: of centroid k % nc when n >= nc, else the best
 * of its centroids c = k, k + n, k + 2n, ... < nc (lower c on ties);
 * *cent (optional) receives that centroid. */
static float decoder_sim(const eldr_policy *p, const float *sig, const float *cache, size_t ncache,
                         size_t k, size_t n, int *cent) {
  const size_t nc = p->n_centroids, dim = p->dim;
  float best = NAN;
  size_t bc = k % nc;
  for (size_t c = k % nc; c < nc; c += n) {
    float s = c < ncache ? cache[c] : eldr_dot_lanes8(sig, p->centroids + c * dim, dim);
    if (c == k % nc || s > best) {
      best = s;
      bc = c;
    }
    if (n >= nc) break;
  }
  if (cent) *cent = (int)bc;
  return best;
}

static int decide_eldr(const eldr_policy *p, const uint32_t *loads, const uint8_t *healthy,
                       size_t n, const eldr_route_req *req, eldr_decision *dec) {
  if (!p->centroids || p->n_centroids == 0) {
    dec->fallback = ELDR_FALLBACK_NO_ARTIFACT;
    return jsq_range(loads, healthy, 0, n);
  }
  if (!req || !req->sig) {
    dec->fallback = ELDR_FALLBACK_NO_SIGNATURE;
    return jsq_range(loads, healthy, 0, n);
  }
  const size_t dim = p->dim, nc = p->n_centroids;
  /* every centroid is some decoder's (n >= nc: decoder k's is k % nc; n <
   * nc: decoder k serves every c with c % n == k) */
  float cache[ELDR_SIM_CACHE];
  const size_t ncache = nc < ELDR_SIM_CACHE ? nc : ELDR_SIM_CACHE;
  size_t c0 = 0;
  for (; c0 + 4 <= ncache; c0 += 4) eldr_dot_lanes8_x4(req->sig, p->centroids + c0 * dim, dim, cache + c0);
  for (; c0 < ncache; c0++) cache[c0] = eldr_dot_lanes8(req->sig, p->centroids + c0 * dim, dim);
  if (req->sims)
    for (size_t c = 0; c < nc; c++)
      req->sims[c] = c < ncache ? cache[c] : eldr_dot_lanes8(req->sig, p->centroids + c * dim, dim);

  float best = -INFINITY;
  for (size_t k = 0; k < n; k++) {
    if (!is_up(healthy, k)) continue;
    float s = decoder_sim(p, req->sig, cache, ncache, k, n, NULL);
    if (s > best) best = s;
  }
  if (!(best > -INFINITY)) { /* NaN / -inf similarities: an unusable signature */
    dec->fallback = ELDR_FALLBACK_NO_SIGNATURE;
    return jsq_range(loads, healthy, 0, n);
  }
  const double edge = (double)best - p->tau - ELDR_BAND_EPS;
  int choice = -1, band = 0, ccent = -1;
  uint32_t cload = 0;
  float csim = 0.0f;
  for (size_t k = 0; k < n; k++) {
    if (!is_up(healthy, k)) continue;
    int cent;
    float s = decoder_sim(p, req->sig, cache, ncache, k, n, &cent);
    if (!((double)s >= edge)) continue;
    band++;
    if (choice < 0 || loads[k] < cload || (loads[k] == cload && s > csim)) {
      choice = (int)k;
      cload = loads[k];
      csim = s;
      ccent = cent;
    }
  }
  dec->best_sim = best;
  dec->band_size = band;
  dec->centroid = ccent;
  return choice;
}

static int decide_footprint(const eldr_policy *p, const uint32_t *loads, const uint8_t *healthy,
                            size_t n, const eldr_fp_request *fr, eldr_decision *dec) {
  if (!p->fp) {
    dec->fallback = ELDR_FALLBACK_NO_MODEL;
    return jsq_range(loads, healthy, 0, n);
  }
  int uniform = 0;
  int c = eldr_footprint_decide(p->fp, loads, healthy, n, fr, &uniform, &dec->pred_tpot);
  if (c == ELDR_EINVAL) { /* a state built for another number of decoders */
    dec->fallback = ELDR_FALLBACK_NO_MODEL;
    return jsq_range(loads, healthy, 0, n);
  }
  if (uniform) dec->fallback = ELDR_FALLBACK_NO_SIGNATURE;
  return c;
}

void eldr_policy_attach_footprint(eldr_policy *p, eldr_footprint *fp) {
  if (p) p->fp = fp;
}

uint64_t eldr_policy_on_route(eldr_policy *p, int k, const eldr_fp_request *fr) {
  if (!p || p->kind != ELDR_POLICY_FOOTPRINT || !p->fp || k < 0) return ELDR_FP_NO_TICKET;
  return eldr_footprint_route(p->fp, (size_t)k, fr, NULL);
}

void eldr_policy_on_end(eldr_policy *p, uint64_t ticket) {
  if (!p || !p->fp || ticket == ELDR_FP_NO_TICKET) return;
  (void)eldr_footprint_end(p->fp, ticket);
}

int eldr_policy_decode(eldr_policy *p, const uint32_t *loads, const uint8_t *healthy, size_t n,
                       const eldr_route_req *req, eldr_decision *out) {
  return eldr_policy_decide(p, loads, healthy, n, req, NULL, out);
}

int eldr_policy_decide(eldr_policy *p, const uint32_t *loads, const uint8_t *healthy, size_t n,
                       const eldr_route_req *req, const eldr_fp_request *fr, eldr_decision *out) {
  if (!p || !loads || n == 0 || n > (size_t)INT32_MAX) return ELDR_EINVAL;
  size_t up = 0;
  for (size_t i = 0; i < n; i++) up += is_up(healthy, i) ? 1 : 0;
  if (up == 0) return ELDR_EUNAVAIL;

  eldr_decision dec = {.decoder = -1, .fallback = ELDR_FALLBACK_NONE, .centroid = -1};
  int c = -1;
  switch (p->kind) {
  case ELDR_POLICY_RANDOM:
    c = (int)nth_healthy(healthy, n, (size_t)eldr_rng_below(&p->rng, up));
    break;
  case ELDR_POLICY_RR: {
    size_t start = p->rr_next % n;
    for (size_t j = 0; j < n; j++) {
      size_t i = (start + j) % n;
      if (is_up(healthy, i)) {
        c = (int)i;
        break;
      }
    }
    p->rr_next = ((size_t)c + 1) % n;
    break;
  }
  case ELDR_POLICY_JSQ:
    c = jsq_range(loads, healthy, 0, n);
    break;
  case ELDR_POLICY_P2C: {
    if (up == 1) {
      c = jsq_range(loads, healthy, 0, n);
      break;
    }
    size_t a = (size_t)eldr_rng_below(&p->rng, up);
    size_t b = (size_t)eldr_rng_below(&p->rng, up - 1);
    if (b >= a) b++;
    size_t ia = nth_healthy(healthy, n, a), ib = nth_healthy(healthy, n, b);
    c = (int)(loads[ib] < loads[ia] ? ib : ia);
    break;
  }
  case ELDR_POLICY_DOMAIN:
    c = decide_domain(p, loads, healthy, n, req, &dec);
    break;
  case ELDR_POLICY_ELDR:
    c = decide_eldr(p, loads, healthy, n, req, &dec);
    break;
  case ELDR_POLICY_FOOTPRINT:
    c = decide_footprint(p, loads, healthy, n, fr, &dec);
    break;
  default:
    return ELDR_EINVAL;
  }
  if (c < 0) return ELDR_EUNAVAIL; /* not reached: some decoder is healthy */
  dec.decoder = c;
  if (out) *out = dec;
  return c;
}

/* Rendezvous weight of the worker whose identity is id for a key. */
static uint64_t hrw_weight(uint64_t key, uint64_t id) {
  uint64_t buf[2] = {key, id};
  return XXH64(buf, sizeof buf, 0x656c6472ULL /* "eldr" */);
}

uint64_t eldr_policy_worker_key(const char *name) { return XXH64(name, strlen(name), 0x656c6472ULL); }

int eldr_policy_prefill(uint64_t prefix_hash, const uint64_t *keys, const uint32_t *loads,
                        const uint8_t *healthy, size_t n, uint32_t guard) {
  if (!loads || n == 0 || n > (size_t)INT32_MAX) return ELDR_EINVAL;
  int home = -1;
  uint64_t home_w = 0;
  for (size_t i = 0; i < n; i++) {
    if (!is_up(healthy, i)) continue;
    uint64_t w = hrw_weight(prefix_hash, keys ? keys[i] : (uint64_t)i);
    if (home < 0 || w > home_w) {
      home = (int)i;
      home_w = w;
    }
  }
  if (home < 0) return ELDR_EUNAVAIL;
  int least = jsq_range(loads, healthy, 0, n);
  if ((uint64_t)loads[home] > (uint64_t)loads[least] + guard) return least;
  return home;
}
