/* kmeans.c — spherical K-means, balanced (capacitated) or vanilla.
 *
 * Points are used by direction: each row carries a scale 1/||x_i|| (0 for a
 * zero row, whose cost to every centroid is then exactly 1). Signature rows
 * are sparse (a short prompt touches few experts), so when at most half of
 * the entries are non-zero the rows are copied once into CSR form; the
 * scores of one point against all k centroids are then a sequence of axpy's
 * over the rows of the transposed centroid matrix CT (dim x kp, kp = k
 * rounded up to 8), which the compiler vectorises. Dense input is scanned in
 * place with the same kernel (zeros skipped). Every loop runs in a fixed
 * order, so the same input and seed give bit-identical results.
 */
#include "eldr/kmeans.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/assign.h"
#include "eldr/error.h"
#include "eldr/parallel.h"
#include "eldr/rng.h"

#define KM_LANES 8

typedef struct {
  const float *x; /* dense input (used when csr == 0) */
  size_t n, dim;
  int csr;
  size_t *rowptr; /* n+1 */
  unsigned *idx;  /* nnz */
  float *val;     /* nnz */
  float *scale;   /* n: 1/||x_i|| or 0 */
  size_t nonzero_rows;
} kdata;

typedef struct {
  size_t k, kp, dim;
  float *cent;  /* k*dim, unit rows (the working centroids) */
  float *ct;    /* dim*kp transposed, zero padded */
  double *sum;  /* k*dim accumulators for the update */
  float *acc;   /* kp scratch */
  float *score; /* n*k scores (cos) */
  double *cost; /* n*k, balanced only */
  int *lab, *newlab;
  size_t *size;
  double *dmin; /* n, k-means++ distances / farthest search */
  float *cscore; /* n*KM_LANES, k-means++ candidate scores */
  unsigned char *used;
} kwork;

/* out[c0 .. c0+W) = sum_e val[e] * CT[idx[e]][c0 ..] (idx NULL: e itself)
 * for one block of W lanes; the accumulators stay in registers. Every lane
 * sums in the order of e whatever the blocking, so results do not depend on
 * it. */
#define KM_BLOCK_FN(NAME, WIDTH)                                                               \
  static inline void NAME(const unsigned *restrict idx, const float *restrict val, size_t m,   \
                          const float *restrict ct, size_t kp, size_t c0, float *restrict out) { \
    float a[WIDTH];                                                                            \
    for (size_t t = 0; t < WIDTH; t++) a[t] = 0.0f;                                            \
    const float *base = ct + c0;                                                               \
    if (idx) {                                                                                 \
      for (size_t e = 0; e < m; e++) {                                                         \
        const float v = val[e];                                                                \
        const float *restrict row = base + (size_t)idx[e] * kp;                                \
        for (size_t t = 0; t < WIDTH; t++) a[t] += v * row[t];                                 \
      }                                                                                        \
    } else {                                                                                   \
      for (size_t e = 0; e < m; e++) {                                                         \
        const float v = val[e];                                                                \
        const float *restrict row = base + e * kp;                                             \
        for (size_t t = 0; t < WIDTH; t++) a[t] += v * row[t];                                 \
      }                                                                                        \
    }                                                                                          \
    for (size_t t = 0; t < WIDTH; t++) out[c0 + t] = a[t];                                     \
  }
KM_BLOCK_FN(score_block16, 16)
KM_BLOCK_FN(score_block8, 8)

/* acc[0..kp) = sum_j x_ij * CT[j][.] (unscaled). Dense rows are not tested
 * for zeros: a zero adds an exact 0, and a data-dependent branch costs more
 * than the multiply. */
static void scores_row(const kdata *X, size_t i, const float *restrict ct, size_t kp,
                       float *restrict acc) {
  const unsigned *idx = NULL;
  const float *val;
  size_t m;
  if (X->csr) {
    idx = X->idx + X->rowptr[i];
    val = X->val + X->rowptr[i];
    m = X->rowptr[i + 1] - X->rowptr[i];
  } else {
    val = X->x + i * X->dim;
    m = X->dim;
  }
  size_t c0 = 0;
  for (; c0 + 16 <= kp; c0 += 16) score_block16(idx, val, m, ct, kp, c0, acc);
  for (; c0 < kp; c0 += 8) score_block8(idx, val, m, ct, kp, c0, acc);
}

/* cos(x_i, c) for one dense unit vector c. */
static double dot_one(const kdata *X, size_t i, const float *c) {
  double s = 0.0;
  if (X->csr) {
    for (size_t e = X->rowptr[i]; e < X->rowptr[i + 1]; e++)
      s += (double)X->val[e] * (double)c[X->idx[e]];
  } else {
    const float *xi = X->x + i * X->dim;
    for (size_t j = 0; j < X->dim; j++) s += (double)xi[j] * (double)c[j];
  }
  return s * (double)X->scale[i];
}

/* Centroid c := x_i / ||x_i||. */
static void centroid_from_point(const kdata *X, size_t i, float *c) {
  memset(c, 0, X->dim * sizeof *c);
  if (X->csr) {
    for (size_t e = X->rowptr[i]; e < X->rowptr[i + 1]; e++)
      c[X->idx[e]] = X->val[e] * X->scale[i];
  } else {
    const float *xi = X->x + i * X->dim;
    for (size_t j = 0; j < X->dim; j++) c[j] = xi[j] * X->scale[i];
  }
}

static void build_ct(kwork *W) {
  size_t k = W->k, kp = W->kp, dim = W->dim;
  memset(W->ct, 0, dim * kp * sizeof *W->ct);
  for (size_t c = 0; c < k; c++) {
    const float *cc = W->cent + c * dim;
    for (size_t j = 0; j < dim; j++) W->ct[j * kp + c] = cc[j];
  }
}

/* score[i*k + c] = cos(x_i, centroid c) for all i, c. */
static void all_scores(const kdata *X, kwork *W) {
  build_ct(W);
  for (size_t i = 0; i < X->n; i++) {
    scores_row(X, i, W->ct, W->kp, W->acc);
    float s = X->scale[i];
    float *out = W->score + i * W->k;
    for (size_t c = 0; c < W->k; c++) out[c] = W->acc[c] * s;
  }
}

/* One D^2-style draw (D = 1 - cos here): index i with probability
 * dmin[i] / total, or n when every weight is zero. */
static size_t draw_weighted(const double *dmin, size_t n, double total, eldr_rng *rng) {
  if (!(total > 0.0)) return n;
  double u = eldr_rng_uniform(rng) * total, cum = 0.0;
  size_t last = n;
  for (size_t i = 0; i < n; i++) {
    if (dmin[i] <= 0.0) continue;
    last = i;
    cum += dmin[i];
    if (cum > u) return i;
  }
  return last; /* rounding at the top end */
}

/* Greedy k-means++ seeding into W->cent: each step draws 2 + floor(ln k)
 * candidates with probability proportional to their distance (1 - cos) to
 * the nearest chosen centroid and keeps the one that lowers the summed
 * distance most. Zero rows are never drawn. */
static void seed_plusplus(const kdata *X, kwork *W, eldr_rng *rng) {
  size_t n = X->n, k = W->k, dim = W->dim;
  memset(W->used, 0, n);
  if (X->nonzero_rows == 0) {
    /* Nothing to seed from: unit basis vectors. */
    memset(W->cent, 0, k * dim * sizeof *W->cent);
    for (size_t c = 0; c < k; c++) W->cent[c * dim + c % dim] = 1.0f;
    return;
  }
  const int trials = 2 + (int)floor(log((double)k));
  /* First: uniform among the non-zero rows. */
  size_t m = (size_t)eldr_rng_below(rng, X->nonzero_rows), first = 0;
  for (size_t i = 0; i < n; i++)
    if (X->scale[i] > 0.0f && m-- == 0) {
      first = i;
      break;
    }
  centroid_from_point(X, first, W->cent);
  W->used[first] = 1;
  for (size_t i = 0; i < n; i++) {
    double d = X->scale[i] > 0.0f ? 1.0 - dot_one(X, i, W->cent) : 0.0;
    W->dmin[i] = d > 0.0 ? d : 0.0;
  }
  /* Candidates are scored together with the multi-centroid kernel: their
   * unit vectors go to the first `trials` lanes of a dim x KM_LANES CT. */
  size_t cand[KM_LANES];
  for (size_t c = 1; c < k; c++) {
    float *cc = W->cent + c * dim;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += W->dmin[i];
    int nc = 0;
    for (int t = 0; t < trials; t++) {
      size_t ci = draw_weighted(W->dmin, n, total, rng);
      if (ci == n) break;
      cand[nc++] = ci;
    }
    size_t pick = n;
    if (nc > 0) {
      memset(W->ct, 0, dim * KM_LANES * sizeof *W->ct);
      for (int t = 0; t < nc; t++) {
        centroid_from_point(X, cand[t], cc);
        for (size_t j = 0; j < dim; j++)
          if (cc[j] != 0.0f) W->ct[j * KM_LANES + (size_t)t] = cc[j];
      }
      double sums[KM_LANES] = {0};
      for (size_t i = 0; i < n; i++) {
        if (X->scale[i] <= 0.0f) continue; /* zero rows: distance 0, never drawn */
        float *cs = W->cscore + i * KM_LANES;
        scores_row(X, i, W->ct, KM_LANES, cs);
        for (int t = 0; t < nc; t++) {
          double e = 1.0 - (double)(cs[t] * X->scale[i]);
          double d = W->dmin[i];
          if (e < d) d = e > 0.0 ? e : 0.0;
          sums[t] += d;
        }
      }
      int bt = 0;
      for (int t = 1; t < nc; t++)
        if (sums[t] < sums[bt]) bt = t;
      pick = cand[bt];
      for (size_t i = 0; i < n; i++) {
        if (X->scale[i] <= 0.0f) continue;
        double e = 1.0 - (double)(W->cscore[i * KM_LANES + (size_t)bt] * X->scale[i]);
        if (e < W->dmin[i]) W->dmin[i] = e > 0.0 ? e : 0.0;
      }
      centroid_from_point(X, pick, cc);
    } else {
      /* All non-zero rows coincide with chosen centroids (every distance
       * is 0): take the first unused non-zero row, else repeat the first
       * centroid; the distances stay 0. */
      for (size_t i = 0; i < n && pick == n; i++)
        if (X->scale[i] > 0.0f && !W->used[i]) pick = i;
      if (pick == n) pick = first;
      centroid_from_point(X, pick, cc);
    }
    W->used[pick] = 1;
  }
}

/* Give every empty cluster the point farthest from its own centroid, taken
 * from a cluster with more than one member (non-zero rows preferred). Moving
 * a point into an empty cluster never breaks a capacity. */
static void fix_empty(const kdata *X, kwork *W) {
  size_t n = X->n, k = W->k;
  for (size_t i = 0; i < n; i++) {
    int l = W->newlab[i];
    W->dmin[i] = 1.0 - (double)W->score[i * k + (size_t)l];
  }
  memset(W->used, 0, n);
  for (size_t c = 0; c < k; c++) {
    if (W->size[c] > 0) continue;
    size_t best = n;
    for (int pass = 0; pass < 2 && best == n; pass++) {
      double bd = -INFINITY;
      for (size_t i = 0; i < n; i++) {
        if (W->used[i] || W->size[W->newlab[i]] < 2) continue;
        if (pass == 0 && X->scale[i] <= 0.0f) continue;
        if (W->dmin[i] > bd) {
          bd = W->dmin[i];
          best = i;
        }
      }
    }
    if (best == n) continue; /* cannot happen when k <= n */
    W->used[best] = 1;
    W->size[W->newlab[best]]--;
    W->newlab[best] = (int)c;
    W->size[c] = 1;
  }
}

/* Centroids := normalised member means; a cluster whose sum is zero keeps
 * its centroid. */
static void update_centroids(const kdata *X, kwork *W) {
  size_t n = X->n, k = W->k, dim = W->dim;
  memset(W->sum, 0, k * dim * sizeof *W->sum);
  for (size_t i = 0; i < n; i++) {
    double s = (double)X->scale[i];
    if (s == 0.0) continue;
    double *acc = W->sum + (size_t)W->lab[i] * dim;
    if (X->csr) {
      for (size_t e = X->rowptr[i]; e < X->rowptr[i + 1]; e++)
        acc[X->idx[e]] += (double)X->val[e] * s;
    } else {
      const float *xi = X->x + i * dim;
      for (size_t j = 0; j < dim; j++)
        if (xi[j] != 0.0f) acc[j] += (double)xi[j] * s;
    }
  }
  for (size_t c = 0; c < k; c++) {
    const double *acc = W->sum + c * dim;
    double nn = 0.0;
    for (size_t j = 0; j < dim; j++) nn += acc[j] * acc[j];
    if (!(nn > 0.0)) continue;
    double inv = 1.0 / sqrt(nn);
    float *cc = W->cent + c * dim;
    for (size_t j = 0; j < dim; j++) cc[j] = (float)(acc[j] * inv);
  }
}

/* One assignment step into W->newlab (and W->size). */
static int assign_step(const kdata *X, kwork *W, int balanced, size_t cap) {
  size_t n = X->n, k = W->k;
  all_scores(X, W);
  memset(W->size, 0, k * sizeof *W->size);
  if (balanced) {
    for (size_t i = 0; i < n * k; i++) W->cost[i] = 1.0 - (double)W->score[i];
    int rc = eldr_assign_capacitated(W->cost, n, k, cap, W->newlab, NULL);
    if (rc) return rc;
  } else {
    for (size_t i = 0; i < n; i++) {
      const float *s = W->score + i * k;
      size_t b = 0;
      for (size_t c = 1; c < k; c++)
        if (s[c] > s[b]) b = c;
      W->newlab[i] = (int)b;
    }
  }
  for (size_t i = 0; i < n; i++) W->size[W->newlab[i]]++;
  fix_empty(X, W);
  return 0;
}

static double objective(const kdata *X, const kwork *W) {
  double obj = 0.0;
  for (size_t i = 0; i < X->n; i++)
    obj += 1.0 - dot_one(X, i, W->cent + (size_t)W->lab[i] * W->dim);
  return obj;
}

static void kwork_free(kwork *W) {
  free(W->used);
  free(W->cscore);
  free(W->dmin);
  free(W->size);
  free(W->newlab);
  free(W->lab);
  free(W->cost);
  free(W->score);
  free(W->acc);
  free(W->sum);
  free(W->ct);
  free(W->cent);
}

static void kdata_free(kdata *X) {
  free(X->scale);
  free(X->val);
  free(X->idx);
  free(X->rowptr);
}

/* Norms, validation and (when at most half of the entries are non-zero)
 * the CSR copy, in one pass over x; the CSR arrays grow by doubling and are
 * dropped for the dense path as soon as they would pass half of n*dim. */
static int kdata_init(kdata *X, const float *x, size_t n, size_t dim) {
  memset(X, 0, sizeof *X);
  X->x = x;
  X->n = n;
  X->dim = dim;
  X->scale = malloc(n * sizeof *X->scale);
  if (!X->scale) return ELDR_ENOMEM;
  const size_t limit = n * dim / 2;
  int build = dim <= 0xffffffffu;
  size_t capa = 0, e = 0;
  if (build) {
    X->rowptr = malloc((n + 1) * sizeof *X->rowptr);
    if (!X->rowptr) return ELDR_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const float *xi = x + i * dim;
    double nn = 0.0;
    if (build) {
      X->rowptr[i] = e;
      if (capa - e < dim && capa < limit) {
        size_t nc = capa ? 2 * capa : (dim > 1024 ? dim : 1024);
        if (nc - e < dim) nc = e + dim;
        if (nc > limit) nc = limit;
        unsigned *ni = realloc(X->idx, nc * sizeof *ni);
        if (ni) X->idx = ni;
        float *nv = ni ? realloc(X->val, nc * sizeof *nv) : NULL;
        if (nv) X->val = nv;
        if (!ni || !nv) return ELDR_ENOMEM;
        capa = nc;
      }
    }
    for (size_t j = 0; j < dim; j++) {
      const float v = xi[j];
      if (!isfinite(v)) return ELDR_EINVAL;
      if (v != 0.0f) {
        nn += (double)v * (double)v;
        if (build) {
          if (e == capa) { /* past half of n*dim: dense path */
            build = 0;
            continue;
          }
          X->idx[e] = (unsigned)j;
          X->val[e] = v;
          e++;
        }
      }
    }
    X->scale[i] = nn > 0.0 ? (float)(1.0 / sqrt(nn)) : 0.0f;
    if (X->scale[i] > 0.0f && isfinite(X->scale[i])) X->nonzero_rows++;
    else X->scale[i] = 0.0f;
  }
  if (!build) {
    free(X->rowptr);
    free(X->idx);
    free(X->val);
    X->rowptr = NULL;
    X->idx = NULL;
    X->val = NULL;
    return 0;
  }
  if (!X->idx) { /* no entry at all: keep the pointers non-NULL */
    X->idx = malloc(sizeof *X->idx);
    X->val = malloc(sizeof *X->val);
    if (!X->idx || !X->val) return ELDR_ENOMEM;
  }
  X->rowptr[n] = e;
  X->csr = 1;
  return 0;
}

static int kwork_alloc(kwork *W, size_t n, size_t k, size_t dim, int balanced) {
  memset(W, 0, sizeof *W);
  W->k = k;
  W->kp = (k + KM_LANES - 1) / KM_LANES * KM_LANES;
  W->dim = dim;
  W->cent = malloc(k * dim * sizeof *W->cent);
  W->ct = malloc(dim * W->kp * sizeof *W->ct); /* kp >= KM_LANES: also the seeding CT */
  W->sum = malloc(k * dim * sizeof *W->sum);
  W->acc = malloc(W->kp * sizeof *W->acc);
  W->score = malloc(n * k * sizeof *W->score);
  W->cost = balanced ? malloc(n * k * sizeof *W->cost) : NULL;
  W->lab = malloc(n * sizeof *W->lab);
  W->newlab = malloc(n * sizeof *W->newlab);
  W->size = malloc(k * sizeof *W->size);
  W->dmin = malloc(n * sizeof *W->dmin);
  W->cscore = malloc(n * KM_LANES * sizeof *W->cscore);
  W->used = malloc(n);
  if (!W->cent || !W->ct || !W->sum || !W->acc || !W->score || (balanced && !W->cost) ||
      !W->lab || !W->newlab || !W->size || !W->dmin || !W->cscore || !W->used)
    return ELDR_ENOMEM;
  return 0;
}

/* One thread's share of the restarts: r = first, first + step, ... Keeps
 * its best run (lowest objective; on ties the lowest r, as a sequential
 * loop would) in best_cent / best_lab. */
typedef struct restart_job {
  const kdata *X;
  kwork W;
  const eldr_kmeans_opts *opts;
  const uint64_t *seeds;
  size_t cap;
  int first, step;
  float *best_cent;
  int *best_lab;
  double best_obj;
  int best_r, best_iters;
  int rc;
} restart_job;

static void *run_restarts(void *arg) {
  restart_job *j = arg;
  const kdata *X = j->X;
  kwork *W = &j->W;
  const size_t n = X->n, k = W->k, dim = W->dim;
  j->best_obj = INFINITY;
  j->best_r = -1;
  for (int r = j->first; r < j->opts->restarts; r += j->step) {
    eldr_rng rng;
    eldr_rng_seed(&rng, j->seeds[r]);
    seed_plusplus(X, W, &rng);
    for (size_t i = 0; i < n; i++) W->lab[i] = -1;
    int iters = 0;
    for (int it = 1; it <= j->opts->max_iter; it++) {
      j->rc = assign_step(X, W, j->opts->balanced, j->cap);
      if (j->rc) return NULL;
      int changed = 0;
      for (size_t i = 0; i < n; i++)
        if (W->newlab[i] != W->lab[i]) {
          changed = 1;
          break;
        }
      memcpy(W->lab, W->newlab, n * sizeof *W->lab);
      iters = it;
      if (!changed) break; /* centroids already are the means of these labels */
      update_centroids(X, W);
    }
    double obj = objective(X, W);
    if (obj < j->best_obj) {
      j->best_obj = obj;
      j->best_r = r;
      j->best_iters = iters;
      memcpy(j->best_cent, W->cent, k * dim * sizeof *j->best_cent);
      memcpy(j->best_lab, W->lab, n * sizeof *j->best_lab);
    }
  }
  return NULL;
}

/* Parallel-for task t: run restart_job t's share of the restarts. */
static void restart_task(void *jobs, size_t t) { run_restarts((restart_job *)jobs + t); }

int eldr_kmeans_fit(const float *x, size_t n, size_t dim, const eldr_kmeans_opts *opts,
                    float *centroids, int *labels, size_t *sizes, eldr_kmeans_result *res) {
  if (!opts || !x || !centroids || !labels || dim == 0) return ELDR_EINVAL;
  size_t k = opts->k;
  if (k == 0 || k > n || opts->restarts < 1 || opts->max_iter < 1) return ELDR_EINVAL;
  if (n > (size_t)0x3fffffff || k > (size_t)0x7fffffff - KM_LANES) return ELDR_EINVAL;

  /* Restarts are independent: up to KM_THREADS run at once, each thread with
   * its own workspace; restart r's seed is the r-th splitmix64 output of the
   * seed whatever the thread count, and the merge keeps the lowest objective
   * with ties to the lowest r, so the result is that of a sequential loop. */
  enum { KM_THREADS = 2 };
  const int nt = opts->restarts < KM_THREADS ? opts->restarts : KM_THREADS;
  kdata X;
  restart_job jobs[KM_THREADS];
  memset(jobs, 0, sizeof jobs);
  uint64_t *seeds = NULL;
  int rc = kdata_init(&X, x, n, dim);
  if (rc) goto out;
  rc = ELDR_ENOMEM;
  seeds = malloc((size_t)opts->restarts * sizeof *seeds);
  if (!seeds) goto out;
  uint64_t st = opts->seed;
  for (int r = 0; r < opts->restarts; r++) seeds[r] = eldr_splitmix64(&st);
  for (int t = 0; t < nt; t++) {
    restart_job *j = &jobs[t];
    if (kwork_alloc(&j->W, n, k, dim, opts->balanced)) goto out;
    j->best_cent = t == 0 ? centroids : malloc(k * dim * sizeof *j->best_cent);
    j->best_lab = t == 0 ? labels : malloc(n * sizeof *j->best_lab);
    if (!j->best_cent || !j->best_lab) goto out;
    j->X = &X;
    j->opts = opts;
    j->seeds = seeds;
    j->cap = (n + k - 1) / k;
    j->first = t;
    j->step = nt;
  }
  eldr_parallel_for((size_t)nt, KM_THREADS, restart_task, jobs);
  rc = 0;
  for (int t = 0; t < nt; t++)
    if (jobs[t].rc) rc = jobs[t].rc;
  if (rc) goto out;
  int win = 0;
  for (int t = 1; t < nt; t++)
    if (jobs[t].best_obj < jobs[win].best_obj ||
        (jobs[t].best_obj == jobs[win].best_obj && jobs[t].best_r < jobs[win].best_r))
      win = t;
  if (win != 0) {
    memcpy(centroids, jobs[win].best_cent, k * dim * sizeof *centroids);
    memcpy(labels, jobs[win].best_lab, n * sizeof *labels);
  }
  if (res) {
    res->objective = jobs[win].best_obj;
    res->iterations = jobs[win].best_iters;
    res->restart = jobs[win].best_r;
  }
  if (sizes) {
    memset(sizes, 0, k * sizeof *sizes);
    for (size_t i = 0; i < n; i++) sizes[labels[i]]++;
  }
out:
  for (int t = 0; t < nt; t++) {
    kwork_free(&jobs[t].W);
    if (t > 0) {
      free(jobs[t].best_cent);
      free(jobs[t].best_lab);
    }
  }
  free(seeds);
  kdata_free(&X);
  return rc;
}
