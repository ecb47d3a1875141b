/* quality.c — rho (Spearman over request pairs) and greedy layer-mask
 * selection (see include/eldr/quality.h).
 *
 * Both the slow path (eldr_quality_rho on built signatures) and the fast path
 * (eldr_quality_greedy_mask on per-layer pair dot products) turn a pair's
 * cosine distance into the same integer sort key and rank the keys with the
 * same radix sort. The key is the distance on a grid of 2^-16: distances
 * that are mathematically equal (frequent with small integer counts) differ
 * by float rounding noise (~1e-7) that depends on how they were computed;
 * rounding to the grid makes them ties in both paths (except in the rare
 * case that the noise straddles a grid boundary), so the two paths agree to
 * ~1e-7 in rho instead of ~1e-5.
 */
#include "eldr/quality.h"

#include "core/quality_int.h"
#include "core/signature_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/rng.h"

/* ---- average ranks and Spearman on doubles ------------------------------ */

typedef struct {
  double v;
  size_t i;
} val_idx;

static int cmp_val_idx(const void *pa, const void *pb) {
  const val_idx *a = pa, *b = pb;
  if (a->v < b->v) return -1;
  if (a->v > b->v) return 1;
  return (a->i > b->i) - (a->i < b->i);
}

int eldr_rank_average(const double *x, size_t n, double *ranks) {
  if (!x || !ranks) return ELDR_EINVAL;
  if (n == 0) return ELDR_OK;
  for (size_t i = 0; i < n; i++)
    if (isnan(x[i])) return ELDR_EINVAL;
  val_idx *t = malloc(n * sizeof *t);
  if (!t) return ELDR_ENOMEM;
  for (size_t i = 0; i < n; i++) t[i] = (val_idx){x[i], i};
  qsort(t, n, sizeof *t, cmp_val_idx);
  for (size_t a = 0; a < n;) {
    size_t b = a + 1;
    while (b < n && t[b].v == t[a].v) b++;
    /* positions a+1 .. b (1-based) share the mean rank */
    const double r = 0.5 * ((double)(a + 1) + (double)b);
    for (size_t k = a; k < b; k++) ranks[t[k].i] = r;
    a = b;
  }
  free(t);
  return ELDR_OK;
}

int eldr_spearman(const double *x, const double *y, size_t n, double *rho) {
  if (!x || !y || !rho) return ELDR_EINVAL;
  if (n < 2) return ELDR_EINVAL;
  double *rx = malloc(2 * n * sizeof *rx);
  if (!rx) return ELDR_ENOMEM;
  double *ry = rx + n;
  int rc = eldr_rank_average(x, n, rx);
  if (rc == 0) rc = eldr_rank_average(y, n, ry);
  if (rc == 0) {
    /* Average ranks always have mean (n+1)/2. */
    const double m = 0.5 * ((double)n + 1.0);
    double sxy = 0, sxx = 0, syy = 0;
    for (size_t i = 0; i < n; i++) {
      const double a = rx[i] - m, b = ry[i] - m;
      sxy += a * b;
      sxx += a * a;
      syy += b * b;
    }
    if (sxx == 0.0 || syy == 0.0)
      rc = ELDR_EEMPTY;
    else
      *rho = sxy / sqrt(sxx * syy);
  }
  free(rx);
  return rc;
}

/* ---- distance keys and their ranks (counting sort) ----------------------- */

#define DIST_GRID_BITS 16
#define NKEYS ((2u << DIST_GRID_BITS) + 1) /* keys 0 .. 2 * 2^16 */

/* Sort key of a cosine similarity: the distance 1 - cos clamped to [0, 2]
 * and rounded to the grid. */
static inline uint32_t key_of_cos(double cos) {
  double d = 1.0 - cos;
  if (!(d > 0.0)) d = 0.0;
  if (d > 2.0) d = 2.0;
  return (uint32_t)(d * (double)(1u << DIST_GRID_BITS) + 0.5);
}

/* Cosine from a dot and two squared norms; 0 when either is a zero vector. */
static inline double cos_of(double dot, double na, double nb) {
  return (na > 0.0 && nb > 0.0) ? dot / sqrt(na * nb) : 0.0;
}

/* Average ranks of grid keys without sorting: a histogram of the keys, then
 * one pass over the key range gives each key's tie group its mean position. */
typedef struct ranker {
  uint32_t *hist;  /* NKEYS counters, all zero between uses */
  double *table;   /* NKEYS centred mean ranks (valid for present keys) */
} ranker;

static int ranker_init(ranker *rk) {
  rk->hist = calloc(NKEYS, sizeof *rk->hist);
  rk->table = malloc(NKEYS * sizeof *rk->table);
  return rk->hist && rk->table ? ELDR_OK : ELDR_ENOMEM;
}

static void ranker_free(ranker *rk) {
  free(rk->table);
  free(rk->hist);
}

/* After hist holds the keys of P items: table[k] = mean 1-based position of
 * key k's group minus (P+1)/2; hist is cleared; returns sum (rank - m)^2. */
static double ranker_table(ranker *rk, size_t P) {
  const double m = 0.5 * ((double)P + 1.0);
  double pos = 0.0, ss = 0.0;
  for (uint32_t k = 0; k < NKEYS; k++) {
    const uint32_t c = rk->hist[k];
    if (!c) continue;
    rk->hist[k] = 0;
    const double dr = pos + 0.5 * ((double)c + 1.0) - m;
    rk->table[k] = dr;
    ss += (double)c * dr * dr;
    pos += c;
  }
  return ss;
}

/* rho of P keys (already counted into rk->hist) against centred decode ranks
 * cy with sum of squares syy. ELDR_EEMPTY when all keys are equal. */
static int ranker_rho(ranker *rk, const uint32_t *keys, size_t P, const double *cy, double syy,
                      double *rho) {
  const double sxx = ranker_table(rk, P);
  if (!(sxx > 0.0)) return ELDR_EEMPTY;
  const double *t = rk->table;
  double sxy = 0.0;
  for (size_t p = 0; p < P; p++) sxy += t[keys[p]] * cy[p];
  *rho = sxy / sqrt(sxx * syy);
  return ELDR_OK;
}

/* ---- request pairs ---------------------------------------------------------- */

typedef struct pairs {
  uint32_t *i, *j; /* i < j, sorted by (i, j) */
  size_t n;
} pairs;

static void pairs_free(pairs *p) {
  free(p->i);
  p->i = p->j = NULL;
  p->n = 0;
}

static int cmp_u64(const void *pa, const void *pb) {
  const uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
  return (a > b) - (a < b);
}

/* k distinct values of [0, T), sorted ascending, uniformly at random
 * (k <= T / 2 + 1 keeps the rejection rounds few). */
static int sample_distinct(uint64_t T, size_t k, eldr_rng *rng, uint64_t *out) {
  size_t have = 0;
  while (have < k) {
    for (size_t x = have; x < k; x++) out[x] = eldr_rng_below(rng, T);
    qsort(out, k, sizeof *out, cmp_u64);
    size_t u = 0;
    for (size_t x = 0; x < k; x++)
      if (u == 0 || out[x] != out[u - 1]) out[u++] = out[x];
    have = u;
  }
  return ELDR_OK;
}

/* The pairs rho is computed over (see eldr_pairs_opts). */
static int pairs_make(size_t n, const eldr_pairs_opts *po, pairs *out) {
  memset(out, 0, sizeof *out);
  if (n < 2 || n > UINT32_MAX) return ELDR_EINVAL;
  const uint64_t T = (uint64_t)n * (n - 1) / 2;
  const size_t maxp = po ? po->max_pairs : 0;
  const int all = maxp == 0 || T <= maxp;
  const uint64_t P = all ? T : maxp;
  if (P >= UINT32_MAX || P > SIZE_MAX / (2 * sizeof(uint64_t))) return ELDR_ERANGE;
  uint32_t *buf = malloc(2 * (size_t)P * sizeof *buf);
  if (!buf) return ELDR_ENOMEM;
  out->i = buf;
  out->j = buf + P;
  out->n = (size_t)P;
  if (all) {
    size_t k = 0;
    for (uint32_t a = 0; a + 1 < n; a++)
      for (uint32_t b = a + 1; b < n; b++, k++) {
        out->i[k] = a;
        out->j[k] = b;
      }
    return ELDR_OK;
  }
  /* Sample P distinct linear pair indices: directly when P <= T/2, else
   * sample the T-P excluded ones (T < 2P then, so listing T is cheap). */
  eldr_rng rng;
  eldr_rng_seed(&rng, po->seed);
  const int complement = P > T / 2;
  const size_t k = complement ? (size_t)(T - P) : (size_t)P;
  uint64_t *lin = malloc((k ? k : 1) * sizeof *lin);
  if (!lin) {
    pairs_free(out);
    return ELDR_ENOMEM;
  }
  sample_distinct(T, k, &rng, lin);
  /* Walk the linear indices in order; row a starts at row_start. */
  uint64_t a = 0, row_start = 0, row_len = n - 1, lidx = 0;
  size_t x = 0; /* next excluded index (complement) */
  for (size_t w = 0; w < P; w++, lidx++) {
    if (complement) {
      while (x < k && lin[x] == lidx) {
        x++;
        lidx++;
      }
    } else {
      lidx = lin[w];
    }
    while (lidx >= row_start + row_len) {
      row_start += row_len;
      a++;
      row_len--;
    }
    out->i[w] = (uint32_t)a;
    out->j[w] = (uint32_t)(a + 1 + (lidx - row_start));
  }
  free(lin);
  return ELDR_OK;
}

int eldr__quality_pairs(size_t n, const eldr_pairs_opts *po, uint32_t **pi, uint32_t **pj,
                        size_t *npairs) {
  if (!pi || !pj || !npairs) return ELDR_EINVAL;
  pairs pp;
  int rc = pairs_make(n, po, &pp);
  if (rc) return rc;
  *pi = pp.i;
  *pj = pp.j;
  *npairs = pp.n;
  return ELDR_OK;
}

/* ---- shared: the decode side ---------------------------------------------- */

/* Row squared norms; ELDR_ERANGE if any is not finite. */
static int row_norms(const float *m, size_t dim, size_t n, double *out) {
  for (size_t r = 0; r < n; r++) {
    out[r] = eldr_dot(m + r * dim, m + r * dim, dim);
    if (!isfinite(out[r])) return ELDR_ERANGE;
  }
  return ELDR_OK;
}

/* Distance keys of dense rows over the pairs, counted into rk->hist. */
static int dense_keys(const float *m, size_t dim, size_t n, const pairs *pp, ranker *rk,
                      uint32_t *keys) {
  double *nr = malloc(n * sizeof *nr);
  if (!nr) return ELDR_ENOMEM;
  int rc = row_norms(m, dim, n, nr);
  if (rc == 0) {
    for (size_t p = 0; p < pp->n; p++) {
      const uint32_t a = pp->i[p], b = pp->j[p];
      const double dot = eldr_dot(m + (size_t)a * dim, m + (size_t)b * dim, dim);
      const uint32_t k = key_of_cos(cos_of(dot, nr[a], nr[b]));
      keys[p] = k;
      rk->hist[k]++;
    }
  }
  free(nr);
  return rc;
}

/* cy (pp->n, centred decode ranks) and syy; ELDR_EEMPTY if all decode
 * distances are equal. keys: pp->n scratch. */
static int decode_side(const float *dec, size_t ddim, size_t n, const pairs *pp, ranker *rk,
                       uint32_t *keys, double *cy, double *syy) {
  int rc = dense_keys(dec, ddim, n, pp, rk, keys);
  if (rc) {
    memset(rk->hist, 0, NKEYS * sizeof *rk->hist);
    return rc;
  }
  *syy = ranker_table(rk, pp->n);
  for (size_t p = 0; p < pp->n; p++) cy[p] = rk->table[keys[p]];
  return *syy > 0.0 ? ELDR_OK : ELDR_EEMPTY;
}

/* ---- public: rho of built signatures ---------------------------------------- */

int eldr_quality_rho(const float *sigs, size_t sdim, const float *dec, size_t ddim, size_t n,
                     const eldr_pairs_opts *po, double *rho) {
  if (!sigs || !dec || !rho || sdim == 0 || ddim == 0 || n < 2) return ELDR_EINVAL;
  pairs pp;
  int rc = pairs_make(n, po, &pp);
  if (rc) return rc;
  const size_t P = pp.n;
  ranker rk = {0};
  uint32_t *keys = malloc(P * sizeof *keys);
  double *cy = malloc(P * sizeof *cy);
  if (!keys || !cy || ranker_init(&rk) != 0) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  double syy;
  rc = decode_side(dec, ddim, n, &pp, &rk, keys, cy, &syy);
  if (rc) goto out;
  rc = dense_keys(sigs, sdim, n, &pp, &rk, keys);
  if (rc) goto out;
  rc = ranker_rho(&rk, keys, P, cy, syy, rho);
out:
  ranker_free(&rk);
  free(cy);
  free(keys);
  pairs_free(&pp);
  return rc;
}

/* rho of the pairs p with keep[i[p]] && keep[j[p]] (keep NULL: all). */
static int rho_subset(const pairs *pp, const uint32_t *ks, const uint32_t *kd,
                      const uint8_t *keep, ranker *rk, uint32_t *sk, double *cy, double *rho) {
  size_t m = 0;
  for (size_t p = 0; p < pp->n; p++) {
    if (keep && !(keep[pp->i[p]] && keep[pp->j[p]])) continue;
    rk->hist[kd[p]]++;
    sk[m++] = ks[p];
  }
  if (m < 2) {
    memset(rk->hist, 0, NKEYS * sizeof *rk->hist);
    return ELDR_EEMPTY;
  }
  const double syy = ranker_table(rk, m);
  m = 0;
  for (size_t p = 0; p < pp->n; p++) {
    if (keep && !(keep[pp->i[p]] && keep[pp->j[p]])) continue;
    cy[m++] = rk->table[kd[p]];
  }
  for (size_t q = 0; q < m; q++) rk->hist[sk[q]]++;
  if (!(syy > 0.0)) {
    ranker_table(rk, m); /* clears hist */
    return ELDR_EEMPTY;
  }
  return ranker_rho(rk, sk, m, cy, syy, rho);
}

int eldr_quality_rho_ci(const float *sigs, size_t sdim, const float *dec, size_t ddim, size_t n,
                        const eldr_pairs_opts *po, size_t groups, eldr_rho_ci *out) {
  if (!sigs || !dec || !out || sdim == 0 || ddim == 0 || groups < 2 || n < 2 * groups)
    return ELDR_EINVAL;
  memset(out, 0, sizeof *out);
  pairs pp;
  int rc = pairs_make(n, po, &pp);
  if (rc) return rc;
  const size_t P = pp.n;
  ranker rk = {0};
  uint32_t *ks = malloc(P * sizeof *ks), *kd = malloc(P * sizeof *kd), *sk = malloc(P * sizeof *sk);
  double *cy = malloc(P * sizeof *cy);
  uint8_t *keep = malloc(n);
  if (!ks || !kd || !sk || !cy || !keep || ranker_init(&rk) != 0) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  /* keys of both sides (dense_keys counts them into hist: clear it) */
  if ((rc = dense_keys(dec, ddim, n, &pp, &rk, kd)) != 0) goto out;
  memset(rk.hist, 0, NKEYS * sizeof *rk.hist);
  if ((rc = dense_keys(sigs, sdim, n, &pp, &rk, ks)) != 0) goto out;
  memset(rk.hist, 0, NKEYS * sizeof *rk.hist);
  if ((rc = rho_subset(&pp, ks, kd, NULL, &rk, sk, cy, &out->rho)) != 0) goto out;
  out->pairs = P;
  out->requests = n;
  out->groups = groups;
  double sum = 0.0, sum2 = 0.0;
  int defined = 1;
  double *rg = malloc(groups * sizeof *rg);
  if (!rg) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  for (size_t g = 0; g < groups && defined; g++) {
    for (size_t i = 0; i < n; i++) keep[i] = i % groups != g;
    if (rho_subset(&pp, ks, kd, keep, &rk, sk, cy, &rg[g]) != 0) defined = 0;
    else sum += rg[g];
  }
  if (defined) {
    const double mean = sum / (double)groups;
    for (size_t g = 0; g < groups; g++) sum2 += (rg[g] - mean) * (rg[g] - mean);
    out->se = sqrt((double)(groups - 1) / (double)groups * sum2);
    out->lo = fmax(-1.0, out->rho - 1.96 * out->se);
    out->hi = fmin(1.0, out->rho + 1.96 * out->se);
  } else {
    out->se = out->lo = out->hi = NAN;
  }
  free(rg);
out:
  ranker_free(&rk);
  free(keep);
  free(cy);
  free(sk);
  free(kd);
  free(ks);
  pairs_free(&pp);
  return rc;
}

void eldr_quality_decode_patterns(const eldr_shape *s, const uint32_t *dec_counts, size_t n,
                                  float *out) {
  const size_t cells = eldr_shape_cells(s);
  for (size_t r = 0; r < n; r++) {
    const uint32_t *c = dec_counts + r * cells;
    float *o = out + r * cells;
    for (size_t x = 0; x < cells; x++) o[x] = (float)c[x];
    eldr_l2_normalize(o, cells);
  }
}

/* ---- greedy forward layer selection (fast path) -------------------------- */

/* The weighted prefill rows (representation and IDF applied, not
 * normalised), stored densely (n * L * E floats) when more than a quarter of
 * the cells can be nonzero, else as per-(request, layer) nonzero lists. */
typedef struct prows {
  int dense;
  float *v;    /* dense: n*L*E values; sparse: the nonzero values */
  uint16_t *e; /* sparse: expert index of each value */
  size_t *off; /* sparse: n*L + 1 offsets into e/v */
} prows;

static void prows_free(prows *pr) {
  free(pr->off);
  free(pr->e);
  free(pr->v);
}

/* Dot of a dense row with a nonzero list; four chains to hide add latency. */
static double sparse_dot(const float *dense, const uint16_t *e, const float *v, size_t cnt) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t x = 0;
  for (; x + 4 <= cnt; x += 4) {
    a0 += (double)dense[e[x]] * v[x];
    a1 += (double)dense[e[x + 1]] * v[x + 1];
    a2 += (double)dense[e[x + 2]] * v[x + 2];
    a3 += (double)dense[e[x + 3]] * v[x + 3];
  }
  for (; x < cnt; x++) a0 += (double)dense[e[x]] * v[x];
  return (a0 + a1) + (a2 + a3);
}

/* Build the rows and per-layer squared norms nl[l * n + i], computed with
 * the same kernel as the pair dots. ELDR_ERANGE on a non-finite value. */
static int build_rows(const eldr_shape *s, eldr_repr repr, const float *idf,
                      const uint32_t *counts, const float *gates, size_t n, prows *pr,
                      double *nl) {
  const size_t L = s->num_layers, E = s->num_experts, cells = L * E;
  const int use_gates = repr == ELDR_REPR_GATE || repr == ELDR_REPR_LOGIT;
  /* Upper bound of the nonzeros: the nonzero inputs. */
  size_t ub = 0;
  for (size_t x = 0; x < n * cells; x++) ub += use_gates ? gates[x] != 0.0f : counts[x] != 0;
  memset(pr, 0, sizeof *pr);
  pr->dense = ub > n * cells / 4;
  float *row = malloc(E * sizeof *row);
  if (pr->dense) {
    pr->v = malloc(n * cells * sizeof *pr->v);
  } else {
    pr->v = malloc((ub ? ub : 1) * sizeof *pr->v);
    pr->e = malloc((ub ? ub : 1) * sizeof *pr->e);
    pr->off = malloc((n * L + 1) * sizeof *pr->off);
  }
  if (!row || !pr->v || (!pr->dense && (!pr->e || !pr->off))) {
    free(row);
    return ELDR_ENOMEM;
  }
  size_t at = 0;
  if (!pr->dense) pr->off[0] = 0;
  for (size_t i = 0; i < n; i++) {
    for (size_t l = 0; l < L; l++) {
      const size_t base = i * cells + l * E;
      float *o = pr->dense ? pr->v + base : row;
      eldr__signature_layer_values(repr, counts + base, use_gates ? gates + base : NULL,
                                   idf ? idf + l * E : NULL, E, o);
      for (size_t e = 0; e < E; e++) {
        if (o[e] == 0.0f) continue;
        if (!isfinite(o[e])) {
          free(row);
          return ELDR_ERANGE;
        }
        if (!pr->dense) {
          pr->e[at] = (uint16_t)e;
          pr->v[at++] = o[e];
        }
      }
      if (pr->dense) {
        nl[l * n + i] = (double)(float)eldr_dot(o, o, E);
      } else {
        pr->off[i * L + l + 1] = at;
        const size_t b0 = pr->off[i * L + l];
        nl[l * n + i] = (double)(float)sparse_dot(row, pr->e + b0, pr->v + b0, at - b0);
      }
    }
  }
  free(row);
  return ELDR_OK;
}

/* D[l * P + p] = dot of pair p's layer-l rows (stored as float, like nl).
 * Sparse rows: pairs are grouped by i, so row i is scattered densely once
 * and each j's nonzero list is gathered against it. */
static int pair_layer_dots(const eldr_shape *s, const prows *pr, const pairs *pp, float *D) {
  const size_t L = s->num_layers, E = s->num_experts, cells = L * E, P = pp->n;
  if (pr->dense) {
    for (size_t p = 0; p < P; p++) {
      const float *vi = pr->v + pp->i[p] * cells, *vj = pr->v + pp->j[p] * cells;
      for (size_t l = 0; l < L; l++) D[l * P + p] = (float)eldr_dot(vi + l * E, vj + l * E, E);
    }
    return ELDR_OK;
  }
  float *dense = calloc(cells, sizeof *dense);
  if (!dense) return ELDR_ENOMEM;
  for (size_t p = 0; p < P;) {
    const uint32_t i = pp->i[p];
    const size_t *oi = pr->off + (size_t)i * L;
    for (size_t l = 0; l < L; l++)
      for (size_t x = oi[l]; x < oi[l + 1]; x++) dense[l * E + pr->e[x]] = pr->v[x];
    for (; p < P && pp->i[p] == i; p++) {
      const size_t *oj = pr->off + (size_t)pp->j[p] * L;
      for (size_t l = 0; l < L; l++)
        D[l * P + p] = (float)sparse_dot(dense + l * E, pr->e + oj[l], pr->v + oj[l], oj[l + 1] - oj[l]);
    }
    for (size_t l = 0; l < L; l++)
      for (size_t x = oi[l]; x < oi[l + 1]; x++) dense[l * E + pr->e[x]] = 0.0f;
  }
  free(dense);
  return ELDR_OK;
}

/* NaN (undefined rho) ranks below every number. */
static int rho_better(double a, double b) {
  if (isnan(a)) return 0;
  if (isnan(b)) return 1;
  return a > b;
}

int eldr_quality_greedy_mask(const eldr_shape *s, eldr_repr repr, const float *idf,
                             const uint32_t *prefill_counts, const float *gate_sums,
                             const float *dec, size_t ddim, size_t n, const eldr_pairs_opts *po,
                             eldr_mask_step *steps, uint8_t *best_mask, double *best_rho,
                             double *all_rho) {
  if (!s || !prefill_counts || !dec || !steps || !best_mask || !best_rho || ddim == 0 || n < 2)
    return ELDR_EINVAL;
  if (eldr_shape_validate(s, NULL) != 0) return ELDR_EINVAL;
  if ((unsigned)repr > ELDR_REPR_LOGIT) return ELDR_EINVAL;
  if ((repr == ELDR_REPR_GATE || repr == ELDR_REPR_LOGIT) && !gate_sums)
    return ELDR_EUNSUPPORTED;
  const size_t L = s->num_layers;

  pairs pp;
  int rc = pairs_make(n, po, &pp);
  if (rc) return rc;
  const size_t P = pp.n;
  prows pr = {0};
  ranker rk = {0};
  uint32_t *keys = malloc(P * sizeof *keys);
  double *cy = malloc(P * sizeof *cy);       /* centred decode ranks */
  double *R = calloc(P, sizeof *R);          /* running pair dots of the mask */
  double *Nrun = calloc(n, sizeof *Nrun);    /* running squared norms */
  double *q = malloc(n * sizeof *q);         /* 1/norm of a candidate mask */
  double *nl = malloc(L * n * sizeof *nl);   /* per-layer squared norms */
  float *D = malloc(L * P * sizeof *D);      /* per-layer pair dots */
  uint8_t *in = calloc(L, 1);
  if (!keys || !cy || !R || !Nrun || !q || !nl || !D || !in || ranker_init(&rk) != 0) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  double syy;
  rc = decode_side(dec, ddim, n, &pp, &rk, keys, cy, &syy);
  if (rc) goto out;
  rc = build_rows(s, repr, idf, prefill_counts, gate_sums, n, &pr, nl);
  if (rc) goto out;
  rc = pair_layer_dots(s, &pr, &pp, D);
  if (rc) goto out;

  for (size_t step = 0; step < L; step++) {
    int best_l = -1;
    double best_r = NAN;
    for (size_t l = 0; l < L; l++) {
      if (in[l]) continue;
      const float *Dl = D + l * P;
      const double *nll = nl + l * n;
      /* cos = dot / sqrt(na * nb) as dot * q[a] * q[b]: n square roots per
       * mask instead of P; q = 0 for a zero row gives cos 0, distance 1. */
      for (size_t i = 0; i < n; i++) {
        const double na = Nrun[i] + nll[i];
        q[i] = na > 0.0 ? 1.0 / sqrt(na) : 0.0;
      }
      for (size_t p = 0; p < P; p++) {
        const uint32_t k = key_of_cos((R[p] + Dl[p]) * q[pp.i[p]] * q[pp.j[p]]);
        keys[p] = k;
        rk.hist[k]++;
      }
      double r = NAN;
      if (ranker_rho(&rk, keys, P, cy, syy, &r) != 0) r = NAN;
      if (best_l < 0 || rho_better(r, best_r)) {
        best_l = (int)l;
        best_r = r;
      }
    }
    in[best_l] = 1;
    const float *Dl = D + (size_t)best_l * P;
    for (size_t p = 0; p < P; p++) R[p] += Dl[p];
    for (size_t i = 0; i < n; i++) Nrun[i] += nl[(size_t)best_l * n + i];
    steps[step].layer = best_l;
    steps[step].rho = best_r;
  }

  size_t best_k = 0;
  for (size_t k = 1; k < L; k++)
    if (rho_better(steps[k].rho, steps[best_k].rho)) best_k = k;
  memset(best_mask, 0, L);
  for (size_t k = 0; k <= best_k; k++) best_mask[steps[k].layer] = 1;
  *best_rho = steps[best_k].rho;
  if (all_rho) *all_rho = steps[L - 1].rho;
  if (isnan(*best_rho)) rc = ELDR_EEMPTY;
out:
  prows_free(&pr);
  free(in);
  free(D);
  free(nl);
  free(q);
  free(Nrun);
  free(R);
  free(cy);
  free(keys);
  ranker_free(&rk);
  pairs_free(&pp);
  return rc;
}
