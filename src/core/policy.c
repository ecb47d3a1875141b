/* policy.c — routing decisions (see include/eldr/policy.h).
 *
 * Pure computation: no allocation, no I/O. The only state a decision changes
 * is the policy's own rng (RANDOM, P2C) and rr_next (RR). */
#include "eldr/policy.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

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

/* Similarities. Every similarity is computed with the same arithmetic
 * whichever kernel computes it: eight float lanes (two 4-lane halves, lo and
 * hi) over i = 0, 8, 16.., lane j summing a[i+j]*b[i+j]; then lo + hi, the
 * four lanes reduced in a fixed order, then the tail (dim % 8) in order. So
 * a similarity does not depend on how centroids were grouped, and lane-wise
 * vector ops (exact IEEE operations, never contracted into FMA) give the
 * same bits on every target. sim4 reads the signature once for four
 * centroids; 4-lane vectors stay in SSE registers on baseline x86-64. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* GCC: off already in ISO C mode (-std=c17) */
#endif
typedef float v4f __attribute__((vector_size(16)));

/* Unaligned load. */
#define LOAD4(dst, p) memcpy(&(dst), (p), sizeof(v4f))

static inline float reduce(const v4f *lo, const v4f *hi, float tail) {
  v4f s = *lo + *hi;
  return ((s[0] + s[2]) + (s[1] + s[3])) + tail;
}

static inline float tail_dot(const float *a, const float *b, size_t from, size_t dim) {
  float t = 0.0f;
  for (size_t i = from; i < dim; i++) t += a[i] * b[i];
  return t;
}

float eldr__dot_lanes8(const float *sig, const float *c, size_t dim) {
  v4f lo = {0}, hi = {0};
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    v4f x0, x1, y0, y1;
    LOAD4(x0, sig + i);
    LOAD4(x1, sig + i + 4);
    LOAD4(y0, c + i);
    LOAD4(y1, c + i + 4);
    lo += x0 * y0;
    hi += x1 * y1;
  }
  return reduce(&lo, &hi, tail_dot(sig, c, i, dim));
}

static void sim4(const float *sig, const float *c, size_t dim, float *out) {
  const float *c0 = c, *c1 = c + dim, *c2 = c + 2 * dim, *c3 = c + 3 * dim;
  v4f l0 = {0}, h0 = {0}, l1 = {0}, h1 = {0}, l2 = {0}, h2 = {0}, l3 = {0}, h3 = {0};
  size_t i = 0;
  for (; i + 8 <= dim; i += 8) {
    v4f x0, x1, y0, y1;
    LOAD4(x0, sig + i);
    LOAD4(x1, sig + i + 4);
    LOAD4(y0, c0 + i);
    LOAD4(y1, c0 + i + 4);
    l0 += x0 * y0;
    h0 += x1 * y1;
    LOAD4(y0, c1 + i);
    LOAD4(y1, c1 + i + 4);
    l1 += x0 * y0;
    h1 += x1 * y1;
    LOAD4(y0, c2 + i);
    LOAD4(y1, c2 + i + 4);
    l2 += x0 * y0;
    h2 += x1 * y1;
    LOAD4(y0, c3 + i);
    LOAD4(y1, c3 + i + 4);
    l3 += x0 * y0;
    h3 += x1 * y1;
  }
  out[0] = reduce(&l0, &h0, tail_dot(sig, c0, i, dim));
  out[1] = reduce(&l1, &h1, tail_dot(sig, c1, i, dim));
  out[2] = reduce(&l2, &h2, tail_dot(sig, c2, i, dim));
  out[3] = reduce(&l3, &h3, tail_dot(sig, c3, i, dim));
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
    float s = c < ncache ? cache[c] : eldr__dot_lanes8(sig, p->centroids + c * dim, dim);
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
  for (; c0 + 4 <= ncache; c0 += 4) sim4(req->sig, p->centroids + c0 * dim, dim, cache + c0);
  for (; c0 < ncache; c0++) cache[c0] = eldr__dot_lanes8(req->sig, p->centroids + c0 * dim, dim);
  if (req->sims)
    for (size_t c = 0; c < nc; c++)
      req->sims[c] = c < ncache ? cache[c] : eldr__dot_lanes8(req->sig, p->centroids + c * dim, dim);

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

/* Rendezvous weight of worker i for a key. */
static uint64_t hrw_weight(uint64_t key, size_t i) {
  uint64_t buf[2] = {key, (uint64_t)i};
  return XXH64(buf, sizeof buf, 0x656c6472ULL /* "eldr" */);
}

int eldr_policy_prefill(uint64_t prefix_hash, const uint32_t *loads, const uint8_t *healthy,
                        size_t n, uint32_t guard) {
  if (!loads || n == 0 || n > (size_t)INT32_MAX) return ELDR_EINVAL;
  int home = -1;
  uint64_t home_w = 0;
  for (size_t i = 0; i < n; i++) {
    if (!is_up(healthy, i)) continue;
    uint64_t w = hrw_weight(prefix_hash, i);
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
