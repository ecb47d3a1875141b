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

/* ---- radix sort of packed (key << 32 | index) items ---------------------- */

/* LSD radix sort of n uint64 items by bits [lo, 64), 11-bit digits; passes
 * whose digit is the same for every item are skipped. Returns the buffer
 * (a or tmp) that holds the sorted items. */
static uint64_t *radix_sort_u64(uint64_t *a, uint64_t *tmp, size_t n, unsigned lo) {
  enum { BITS = 11, RADIX = 1 << BITS };
  const unsigned npass = (64 - lo + BITS - 1) / BITS;
  size_t(*hist)[RADIX] = calloc(npass, sizeof *hist);
  if (!hist) return NULL;
  for (size_t i = 0; i < n; i++) {
    const uint64_t v = a[i];
    for (unsigned p = 0; p < npass; p++) hist[p][(v >> (lo + p * BITS)) & (RADIX - 1)]++;
  }
  uint64_t *src = a, *dst = tmp;
  for (unsigned p = 0; p < npass; p++) {
    const unsigned shift = lo + p * BITS;
    size_t *h = hist[p];
    if (n > 0 && h[(src[0] >> shift) & (RADIX - 1)] == n) continue; /* trivial digit */
    size_t sum = 0;
    for (unsigned d = 0; d < RADIX; d++) {
      const size_t c = h[d];
      h[d] = sum;
      sum += c;
    }
    for (size_t i = 0; i < n; i++) {
      const uint64_t v = src[i];
      dst[h[(v >> shift) & (RADIX - 1)]++] = v;
    }
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  free(hist);
  return src;
}

#define DIST_GRID_BITS 16
/* Sort key of a cosine distance: 1 - dot / sqrt(na * nb), 1 when either side
 * is a zero vector, clamped to [0, 2], rounded to the grid (< 2^18). */
static inline uint32_t dist_key(double dot, double na, double nb) {
  double d = 1.0;
  if (na > 0.0 && nb > 0.0) d = 1.0 - dot / sqrt(na * nb);
  if (!(d > 0.0)) d = 0.0;
  if (d > 2.0) d = 2.0;
  return (uint32_t)(d * (double)(1u << DIST_GRID_BITS) + 0.5);
}

/* Walk sorted items in tie groups; for each item call the group's mean rank.
 * Sets sxx = sum (r - m)^2 and sxy = sum (r - m) * cy[index]. */
static void rank_sums(const uint64_t *s, size_t n, const double *cy, double *sxx, double *sxy) {
  const double m = 0.5 * ((double)n + 1.0);
  double xx = 0.0, xy = 0.0;
  for (size_t a = 0; a < n;) {
    const uint32_t key = (uint32_t)(s[a] >> 32);
    size_t b = a + 1;
    while (b < n && (uint32_t)(s[b] >> 32) == key) b++;
    const double dr = 0.5 * ((double)(a + 1) + (double)b) - m;
    double cs = 0.0;
    for (size_t k = a; k < b; k++) cs += cy[(uint32_t)s[k]];
    xx += (double)(b - a) * dr * dr;
    xy += dr * cs;
    a = b;
  }
  *sxx = xx;
  *sxy = xy;
}

/* Centred average ranks of sorted items: cy[index] = rank - (n+1)/2. */
static void centred_ranks(const uint64_t *s, size_t n, double *cy, double *syy) {
  const double m = 0.5 * ((double)n + 1.0);
  double yy = 0.0;
  for (size_t a = 0; a < n;) {
    const uint32_t key = (uint32_t)(s[a] >> 32);
    size_t b = a + 1;
    while (b < n && (uint32_t)(s[b] >> 32) == key) b++;
    const double dr = 0.5 * ((double)(a + 1) + (double)b) - m;
    for (size_t k = a; k < b; k++) cy[(uint32_t)s[k]] = dr;
    yy += (double)(b - a) * dr * dr;
    a = b;
  }
  *syy = yy;
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

/* Sorted distance keys of dense rows over the pairs into items/tmp;
 * returns the sorted buffer or NULL (ENOMEM / ERANGE in *rc). */
static uint64_t *dense_sorted_keys(const float *m, size_t dim, size_t n, const pairs *pp,
                                   uint64_t *items, uint64_t *tmp, int *rc) {
  double *nr = malloc(n * sizeof *nr);
  if (!nr) {
    *rc = ELDR_ENOMEM;
    return NULL;
  }
  *rc = row_norms(m, dim, n, nr);
  if (*rc) {
    free(nr);
    return NULL;
  }
  for (size_t p = 0; p < pp->n; p++) {
    const uint32_t a = pp->i[p], b = pp->j[p];
    const double dot = eldr_dot(m + (size_t)a * dim, m + (size_t)b * dim, dim);
    items[p] = (uint64_t)dist_key(dot, nr[a], nr[b]) << 32 | (uint32_t)p;
  }
  free(nr);
  uint64_t *s = radix_sort_u64(items, tmp, pp->n, 32);
  if (!s) *rc = ELDR_ENOMEM;
  return s;
}

/* cy (pp->n, centred decode ranks) and syy; ELDR_EEMPTY if all decode
 * distances are equal. */
static int decode_side(const float *dec, size_t ddim, size_t n, const pairs *pp, uint64_t *items,
                       uint64_t *tmp, double *cy, double *syy) {
  int rc = 0;
  const uint64_t *s = dense_sorted_keys(dec, ddim, n, pp, items, tmp, &rc);
  if (!s) return rc;
  centred_ranks(s, pp->n, cy, syy);
  return *syy > 0.0 ? ELDR_OK : ELDR_EEMPTY;
}

static int rho_of_sorted(const uint64_t *s, size_t n, const double *cy, double syy,
                         double *rho) {
  double sxx, sxy;
  rank_sums(s, n, cy, &sxx, &sxy);
  if (!(sxx > 0.0)) return ELDR_EEMPTY;
  *rho = sxy / sqrt(sxx * syy);
  return ELDR_OK;
}

/* ---- public: rho of built signatures ---------------------------------------- */

int eldr_quality_rho(const float *sigs, size_t sdim, const float *dec, size_t ddim, size_t n,
                     const eldr_pairs_opts *po, double *rho) {
  if (!sigs || !dec || !rho || sdim == 0 || ddim == 0 || n < 2) return ELDR_EINVAL;
  pairs pp;
  int rc = pairs_make(n, po, &pp);
  if (rc) return rc;
  const size_t P = pp.n;
  uint64_t *items = malloc(2 * P * sizeof *items);
  double *cy = malloc(P * sizeof *cy);
  if (!items || !cy) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  double syy;
  rc = decode_side(dec, ddim, n, &pp, items, items + P, cy, &syy);
  if (rc) goto out;
  const uint64_t *s = dense_sorted_keys(sigs, sdim, n, &pp, items, items + P, &rc);
  if (!s) goto out;
  rc = rho_of_sorted(s, P, cy, syy, rho);
out:
  free(cy);
  free(items);
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

/* Per (request, layer) nonzero entries of the weighted representation. */
typedef struct sparse_rows {
  size_t *off;  /* n*L + 1 offsets into e/v */
  uint16_t *e;  /* expert index */
  float *v;     /* value */
  size_t cap;
} sparse_rows;

static int sparse_push(sparse_rows *sr, size_t at, uint16_t e, float v) {
  if (at == sr->cap) {
    const size_t nc = sr->cap ? 2 * sr->cap : 4096;
    uint16_t *ne = realloc(sr->e, nc * sizeof *ne);
    if (!ne) return ELDR_ENOMEM;
    sr->e = ne;
    float *nv = realloc(sr->v, nc * sizeof *nv);
    if (!nv) return ELDR_ENOMEM;
    sr->v = nv;
    sr->cap = nc;
  }
  sr->e[at] = e;
  sr->v[at] = v;
  return ELDR_OK;
}

/* Build sparse rows and per-layer squared norms nl[l * n + i] (rounded to
 * float, like the pair dots, so identical rows give distance exactly 0). */
static int build_sparse(const eldr_shape *s, eldr_repr repr, const float *idf,
                        const uint32_t *counts, const float *gates, size_t n, sparse_rows *sr,
                        double *nl) {
  const size_t L = s->num_layers, E = s->num_experts, cells = L * E;
  float *row = malloc(E * sizeof *row);
  sr->off = malloc((n * L + 1) * sizeof *sr->off);
  if (!row || !sr->off) {
    free(row);
    return ELDR_ENOMEM;
  }
  size_t at = 0;
  int rc = ELDR_OK;
  sr->off[0] = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    for (size_t l = 0; l < L && rc == 0; l++) {
      eldr__signature_layer_values(repr, counts + i * cells + l * E,
                                   gates ? gates + i * cells + l * E : NULL,
                                   idf ? idf + l * E : NULL, E, row);
      double ss = 0.0;
      for (size_t e = 0; e < E && rc == 0; e++) {
        if (row[e] == 0.0f) continue;
        if (!isfinite(row[e])) {
          rc = ELDR_ERANGE;
          break;
        }
        ss += (double)row[e] * row[e];
        rc = sparse_push(sr, at++, (uint16_t)e, row[e]);
      }
      nl[l * n + i] = (double)(float)ss;
      sr->off[i * L + l + 1] = at;
    }
  }
  free(row);
  return rc;
}

/* D[l * P + p] = dot of pair p's layer-l rows (double sum, stored as float).
 * Pairs are grouped by i: scatter row i densely once, gather for each j. */
static int pair_layer_dots(const eldr_shape *s, const sparse_rows *sr, size_t n, const pairs *pp,
                           float *D) {
  const size_t L = s->num_layers, E = s->num_experts, P = pp->n;
  float *dense = calloc(L * E, sizeof *dense);
  if (!dense) return ELDR_ENOMEM;
  size_t p = 0;
  while (p < P) {
    const uint32_t i = pp->i[p];
    for (size_t l = 0; l < L; l++)
      for (size_t x = sr->off[i * L + l]; x < sr->off[i * L + l + 1]; x++)
        dense[l * E + sr->e[x]] = sr->v[x];
    for (; p < P && pp->i[p] == i; p++) {
      const uint32_t j = pp->j[p];
      for (size_t l = 0; l < L; l++) {
        const float *di = dense + l * E;
        double acc = 0.0;
        for (size_t x = sr->off[j * L + l]; x < sr->off[j * L + l + 1]; x++)
          acc += (double)di[sr->e[x]] * sr->v[x];
        D[l * P + p] = (float)acc;
      }
    }
    for (size_t l = 0; l < L; l++)
      for (size_t x = sr->off[i * L + l]; x < sr->off[i * L + l + 1]; x++)
        dense[l * E + sr->e[x]] = 0.0f;
  }
  (void)n;
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
  sparse_rows sr = {0};
  uint64_t *items = malloc(2 * P * sizeof *items);
  double *cy = malloc(P * sizeof *cy);
  double *R = calloc(P, sizeof *R);          /* running pair dots of the mask */
  double *Nrun = calloc(n, sizeof *Nrun);    /* running squared norms */
  double *nl = malloc(L * n * sizeof *nl);   /* per-layer squared norms */
  float *D = malloc(L * P * sizeof *D);      /* per-layer pair dots */
  uint8_t *in = calloc(L, 1);
  if (!items || !cy || !R || !Nrun || !nl || !D || !in) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  double syy;
  rc = decode_side(dec, ddim, n, &pp, items, items + P, cy, &syy);
  if (rc) goto out;
  rc = build_sparse(s, repr, idf, prefill_counts, gate_sums, n, &sr, nl);
  if (rc) goto out;
  rc = pair_layer_dots(s, &sr, n, &pp, D);
  if (rc) goto out;

  for (size_t step = 0; step < L; step++) {
    int best_l = -1;
    double best_r = NAN;
    for (size_t l = 0; l < L; l++) {
      if (in[l]) continue;
      const float *Dl = D + l * P;
      const double *nll = nl + l * n;
      for (size_t p = 0; p < P; p++) {
        const uint32_t a = pp.i[p], b = pp.j[p];
        items[p] = (uint64_t)dist_key(R[p] + Dl[p], Nrun[a] + nll[a], Nrun[b] + nll[b]) << 32 |
                   (uint32_t)p;
      }
      const uint64_t *sorted = radix_sort_u64(items, items + P, P, 32);
      if (!sorted) {
        rc = ELDR_ENOMEM;
        goto out;
      }
      double r = NAN;
      if (rho_of_sorted(sorted, P, cy, syy, &r) != 0) r = NAN;
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
  free(sr.off);
  free(sr.e);
  free(sr.v);
  free(in);
  free(D);
  free(nl);
  free(Nrun);
  free(R);
  free(cy);
  free(items);
  pairs_free(&pp);
  return rc;
}
