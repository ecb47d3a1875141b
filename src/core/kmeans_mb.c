/* kmeans_mb.c — balanced K-means at scale (see include/eldr/kmeans_mb.h). */
#include "eldr/kmeans_mb.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/assign.h"
#include "eldr/error.h"

#ifdef ELDR_HAVE_OPENBLAS
#include <cblas.h>
#endif

void eldr_kmeans_scores(const float *x, size_t n, size_t dim, const float *cent, size_t k,
                        float *out) {
  if (n == 0 || k == 0) return;
#ifdef ELDR_HAVE_OPENBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)k, (int)dim, 1.0f, x,
              (int)dim, cent, (int)dim, 0.0f, out, (int)k);
#else
  /* blocks of 4 rows share each centroid row while it is in cache */
  for (size_t i0 = 0; i0 < n; i0 += 4) {
    const size_t i1 = i0 + 4 < n ? i0 + 4 : n;
    for (size_t c = 0; c < k; c++) {
      const float *cc = cent + c * dim;
      for (size_t i = i0; i < i1; i++) {
        const float *xi = x + i * dim;
        float s = 0.0f;
        for (size_t j = 0; j < dim; j++) s += xi[j] * cc[j];
        out[i * k + c] = s;
      }
    }
  }
#endif
}

int eldr_kmeans_assign_scores(const float *scores, size_t n, size_t k, size_t cap, int *labels,
                              size_t *sizes, double *objective) {
  if (!scores || !labels || k == 0) return ELDR_EINVAL;
  if (n == 0) {
    if (sizes) memset(sizes, 0, k * sizeof *sizes);
    if (objective) *objective = 0.0;
    return ELDR_OK;
  }
  double *cost = malloc(n * k * sizeof *cost);
  if (!cost) return ELDR_ENOMEM;
  for (size_t i = 0; i < n * k; i++) {
    if (!isfinite(scores[i])) {
      free(cost);
      return ELDR_EINVAL;
    }
    cost[i] = 1.0 - (double)scores[i];
  }
  double total = 0.0;
  int rc = eldr_assign_capacitated(cost, n, k, cap, labels, &total);
  free(cost);
  if (rc) return rc;
  if (sizes) {
    memset(sizes, 0, k * sizeof *sizes);
    for (size_t i = 0; i < n; i++) sizes[labels[i]]++;
  }
  if (objective) *objective = total;
  return ELDR_OK;
}

int eldr_centroid_acc_init(eldr_centroid_acc *a, size_t k, size_t dim) {
  memset(a, 0, sizeof *a);
  if (k == 0 || dim == 0) return ELDR_EINVAL;
  a->k = k;
  a->dim = dim;
  a->sum = calloc(k * dim, sizeof *a->sum);
  a->count = calloc(k, sizeof *a->count);
  if (!a->sum || !a->count) {
    eldr_centroid_acc_free(a);
    return ELDR_ENOMEM;
  }
  return ELDR_OK;
}

void eldr_centroid_acc_free(eldr_centroid_acc *a) {
  if (!a) return;
  free(a->sum);
  free(a->count);
  a->sum = NULL;
  a->count = NULL;
}

void eldr_centroid_acc_reset(eldr_centroid_acc *a) {
  memset(a->sum, 0, a->k * a->dim * sizeof *a->sum);
  memset(a->count, 0, a->k * sizeof *a->count);
}

void eldr_centroid_acc_add(eldr_centroid_acc *a, const float *x, int c) {
  double *s = a->sum + (size_t)c * a->dim;
  for (size_t j = 0; j < a->dim; j++) s[j] += (double)x[j];
  a->count[c]++;
}

/* Normalise one double row into a float row; 0 when the row is zero. */
static int normalise_into(const double *s, size_t dim, float *out) {
  double nn = 0.0;
  for (size_t j = 0; j < dim; j++) nn += s[j] * s[j];
  if (!(nn > 0.0) || !isfinite(nn)) return 0;
  const double inv = 1.0 / sqrt(nn);
  for (size_t j = 0; j < dim; j++) out[j] = (float)(s[j] * inv);
  return 1;
}

void eldr_centroid_acc_finish(const eldr_centroid_acc *a, float *cent) {
  for (size_t c = 0; c < a->k; c++)
    normalise_into(a->sum + c * a->dim, a->dim, cent + c * a->dim);
}

struct eldr_mbkmeans {
  size_t k, dim, max_batch;
  float *cent;     /* k * dim */
  double *run;     /* k * dim: running mean of absorbed rows (unnormalised) */
  size_t *count;   /* k: rows absorbed */
  float *score;    /* max_batch * k */
  int *lab;        /* max_batch */
  eldr_centroid_acc batch;
};

void eldr_mbkmeans_free(eldr_mbkmeans *m) {
  if (!m) return;
  eldr_centroid_acc_free(&m->batch);
  free(m->lab);
  free(m->score);
  free(m->count);
  free(m->run);
  free(m->cent);
  free(m);
}

int eldr_mbkmeans_new(size_t k, size_t dim, size_t max_batch, const float *init,
                      eldr_mbkmeans **out) {
  if (!out || !init || k == 0 || dim == 0 || max_batch == 0) return ELDR_EINVAL;
  *out = NULL;
  eldr_mbkmeans *m = calloc(1, sizeof *m);
  if (!m) return ELDR_ENOMEM;
  m->k = k;
  m->dim = dim;
  m->max_batch = max_batch;
  m->cent = malloc(k * dim * sizeof *m->cent);
  m->run = malloc(k * dim * sizeof *m->run);
  m->count = calloc(k, sizeof *m->count);
  m->score = malloc(max_batch * k * sizeof *m->score);
  m->lab = malloc(max_batch * sizeof *m->lab);
  if (!m->cent || !m->run || !m->count || !m->score || !m->lab ||
      eldr_centroid_acc_init(&m->batch, k, dim)) {
    eldr_mbkmeans_free(m);
    return ELDR_ENOMEM;
  }
  for (size_t i = 0; i < k * dim; i++) {
    if (!isfinite(init[i])) {
      eldr_mbkmeans_free(m);
      return ELDR_EINVAL;
    }
    m->cent[i] = init[i];
    m->run[i] = init[i];
  }
  *out = m;
  return ELDR_OK;
}

int eldr_mbkmeans_step(eldr_mbkmeans *m, const float *x, size_t b) {
  if (!m || !x || b == 0 || b > m->max_batch) return ELDR_EINVAL;
  const size_t k = m->k, dim = m->dim;
  eldr_kmeans_scores(x, b, dim, m->cent, k, m->score);
  int rc = eldr_kmeans_assign_scores(m->score, b, k, (b + k - 1) / k, m->lab, NULL, NULL);
  if (rc) return rc;
  eldr_centroid_acc_reset(&m->batch);
  for (size_t i = 0; i < b; i++) eldr_centroid_acc_add(&m->batch, x + i * dim, m->lab[i]);
  for (size_t c = 0; c < k; c++) {
    const size_t got = m->batch.count[c];
    if (!got) continue;
    m->count[c] += got;
    /* run += (sum - got * run) / count: the running mean of every row the
     * centroid absorbed (rate 1/count per row) */
    const double inv = 1.0 / (double)m->count[c];
    double *r = m->run + c * dim;
    const double *s = m->batch.sum + c * dim;
    for (size_t j = 0; j < dim; j++) r[j] += (s[j] - (double)got * r[j]) * inv;
    normalise_into(r, dim, m->cent + c * dim);
  }
  return ELDR_OK;
}

const float *eldr_mbkmeans_centroids(const eldr_mbkmeans *m) { return m->cent; }
