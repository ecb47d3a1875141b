/* fit_scale.c — the fit's K-means at scale and its continuity with a
 * previous artifact (see include/eldr/fit.h and eldr/kmeans_mb.h).
 *
 * Rows (signatures under the chosen spec) come either from the in-memory
 * matrix or from a pass over the source that builds them batch by batch;
 * the same three batch consumers serve both: a mini-batch step, the scores
 * of the final assignment, and the member-mean accumulation.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/assign.h"
#include "eldr/kmeans_mb.h"
#include "eldr/rng.h"
#include "eldr/signature.h"
#include "fit_int.h"

/* ---- rows, batch by batch ------------------------------------------------ */

typedef enum { ROWS_STEP, ROWS_SCORES, ROWS_MEANS, ROWS_MATRIX } rows_use;

typedef struct rowpass {
  fit_rows *r;
  rows_use use;
  float *xb;            /* B * dim batch buffer (ROWS_MATRIX: the matrix) */
  size_t b, B, seen;
  eldr_mbkmeans *mb;    /* ROWS_STEP */
  const float *cent;    /* ROWS_SCORES */
  size_t k;
  float *scores;        /* ROWS_SCORES: n * k */
  const int *labels;    /* ROWS_MEANS */
  eldr_centroid_acc *acc;
  eldr_diag *d;
} rowpass;

/* Consume rows [first, first + b) held in x. */
static int rows_flush(rowpass *p, const float *x, size_t b, size_t first) {
  const size_t dim = p->r->dim;
  switch (p->use) {
  case ROWS_STEP: {
    int rc = eldr_mbkmeans_step(p->mb, x, b);
    return rc ? eldr_diag_fail(p->d, rc, "mini-batch K-means: %s", eldr_strerror(rc)) : 0;
  }
  case ROWS_SCORES:
    eldr_kmeans_scores(x, b, dim, p->cent, p->k, p->scores + first * p->k);
    return 0;
  case ROWS_MEANS:
    for (size_t i = 0; i < b; i++) eldr_centroid_acc_add(p->acc, x + i * dim, p->labels[first + i]);
    return 0;
  case ROWS_MATRIX:
    return 0;
  }
  return 0;
}

static int rows_visit(void *ud, const eldr_fit_item *it) {
  rowpass *p = ud;
  if (it->n_prefill == 0) return 0;
  const size_t dim = p->r->dim;
  if (p->seen >= p->r->n)
    return eldr_diag_fail(p->d, ELDR_ERANGE, "the calibration input changed between passes "
                          "(more than %zu usable requests)", p->r->n);
  float *row = p->use == ROWS_MATRIX ? p->xb + p->seen * dim : p->xb + p->b * dim;
  int rc = eldr_signature_build(&p->r->spec, it->prefill, it->gates, row);
  if (rc && rc != ELDR_EEMPTY)
    return eldr_diag_fail(p->d, rc, "signature of request %zu: %s", p->seen, eldr_strerror(rc));
  p->seen++;
  if (p->use == ROWS_MATRIX) return 0;
  if (++p->b == p->B) {
    rc = rows_flush(p, p->xb, p->b, p->seen - p->b);
    p->b = 0;
  }
  return rc;
}

/* One pass over the source for p's use. */
static int rows_pass(rowpass *p) {
  p->b = p->seen = 0;
  int rc = p->r->src->each(p->r->src->ctx, rows_visit, p, p->d);
  if (!rc && p->b) rc = rows_flush(p, p->xb, p->b, p->seen - p->b);
  if (!rc && p->seen != p->r->n)
    rc = eldr_diag_fail(p->d, ELDR_ERANGE, "the calibration input changed between passes "
                        "(%zu usable requests, first pass %zu)", p->seen, p->r->n);
  return rc;
}

/* All rows in order: from the matrix in batches of B, else a pass. */
static int rows_all(rowpass *p) {
  const fit_rows *r = p->r;
  if (!r->x) return rows_pass(p);
  for (size_t i = 0; i < r->n; i += p->B) {
    const size_t b = r->n - i < p->B ? r->n - i : p->B;
    int rc = rows_flush(p, r->x + i * r->dim, b, i);
    if (rc) return rc;
  }
  return 0;
}

int eldr__fit_build_matrix(fit_rows *r, float *x, eldr_diag *d) {
  rowpass p = {.r = r, .use = ROWS_MATRIX, .xb = x, .d = d};
  return rows_pass(&p);
}

/* ---- K-means at scale ------------------------------------------------------ */

int eldr__fit_kmeans_scale(fit_rows *r, const eldr_fit_opts *o, float *cent, size_t *sizes,
                           double *objective, int *passes, eldr_diag *d) {
  if (!o->balanced)
    return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                          "vanilla K-means (the ablation) needs every signature in memory: %zu "
                          "requests x %zu dims exceed the signature budget", r->n, r->dim);
  const size_t k = o->k, dim = r->dim, n = r->n;
  size_t B = o->batch ? o->batch : 4096;
  if (B < k) B = k;
  if (B > n) B = n;
  int rc = ELDR_OK;
  eldr_mbkmeans *mb = NULL;
  float *xb = malloc(B * dim * sizeof *xb), *scores = malloc(n * k * sizeof *scores);
  int *labels = malloc(n * sizeof *labels);
  size_t *perm = NULL;
  eldr_centroid_acc acc = {0};
  if (!xb || !scores || !labels || eldr_centroid_acc_init(&acc, k, dim)) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory (K-means at scale, %zu x %zu)", n, k);
    goto out;
  }
  if ((rc = eldr_mbkmeans_new(k, dim, B, cent, &mb))) {
    eldr_diag_fail(d, rc, "mini-batch K-means: %s", eldr_strerror(rc));
    goto out;
  }
  rowpass p = {.r = r, .xb = xb, .B = B, .k = k, .d = d, .mb = mb};

  /* mini-batch epochs: the matrix in a fresh seeded order each epoch, or
   * the source in its own order */
  if (r->x && !(perm = malloc(n * sizeof *perm))) { rc = ELDR_ENOMEM; goto out; }
  for (int ep = 0; ep < o->epochs; ep++) {
    if (o->progress) o->progress(o->progress_ctx, "mini-batch", (size_t)ep, (size_t)o->epochs);
    p.use = ROWS_STEP;
    if (!r->x) {
      if ((rc = rows_pass(&p))) goto out;
      (*passes)++;
      continue;
    }
    eldr_fit_shuffle(perm, n, o->seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(ep + 1));
    for (size_t i = 0; i < n; i += B) {
      const size_t b = n - i < B ? n - i : B;
      for (size_t q = 0; q < b; q++) memcpy(xb + q * dim, r->x + perm[i + q] * dim, dim * sizeof *xb);
      if ((rc = rows_flush(&p, xb, b, 0))) goto out;
    }
  }
  memcpy(cent, eldr_mbkmeans_centroids(mb), k * dim * sizeof *cent);

  /* the exact end: capacity ceil(n/k) on all n rows, then member means */
  const int iters = r->x ? (o->final_iters > 0 ? o->final_iters : 1) : 1;
  const size_t cap = (n + k - 1) / k;
  for (int it = 0; it < iters; it++) {
    if (o->progress) o->progress(o->progress_ctx, "exact assignment", (size_t)it, (size_t)iters);
    p.use = ROWS_SCORES;
    p.cent = cent;
    p.scores = scores;
    if ((rc = rows_all(&p))) goto out;
    if (!r->x) (*passes)++;
    if ((rc = eldr_kmeans_assign_scores(scores, n, k, cap, labels, sizes, objective))) {
      eldr_diag_fail(d, rc, "exact balanced assignment of %zu requests: %s", n, eldr_strerror(rc));
      goto out;
    }
    p.use = ROWS_MEANS;
    p.labels = labels;
    p.acc = &acc;
    eldr_centroid_acc_reset(&acc);
    if ((rc = rows_all(&p))) goto out;
    if (!r->x) (*passes)++;
    eldr_centroid_acc_finish(&acc, cent);
  }
out:
  eldr_centroid_acc_free(&acc);
  eldr_mbkmeans_free(mb);
  free(perm);
  free(labels);
  free(scores);
  free(xb);
  return rc;
}

/* ---- continuity with a previous artifact ---------------------------------- */

typedef struct alignpass {
  eldr_sigspec old_spec, new_spec;
  const eldr_artifact *old, *new_a;
  float *s_old, *s_new;
  size_t *M, used, seen;
  eldr_diag *d;
} alignpass;

static size_t nearest(const float *sig, const float *cent, size_t k, size_t dim) {
  size_t best = 0;
  double bs = -INFINITY;
  for (size_t c = 0; c < k; c++) {
    const double v = eldr_dot(sig, cent + c * dim, dim);
    if (v > bs) {
      bs = v;
      best = c;
    }
  }
  return best;
}

static int align_visit(void *ud, const eldr_fit_item *it) {
  alignpass *p = ud;
  if (it->n_prefill == 0) return 0;
  p->seen++;
  int a = eldr_signature_build(&p->old_spec, it->prefill, it->gates, p->s_old);
  int b = eldr_signature_build(&p->new_spec, it->prefill, it->gates, p->s_new);
  if ((a && a != ELDR_EEMPTY) || (b && b != ELDR_EEMPTY))
    return eldr_diag_fail(p->d, a && a != ELDR_EEMPTY ? a : b, "signature of request %zu for the "
                          "continuity pass: %s", p->seen - 1,
                          eldr_strerror(a && a != ELDR_EEMPTY ? a : b));
  const size_t k = p->new_a->k;
  const size_t i = nearest(p->s_old, p->old->centroids, k, p->old->dim);
  const size_t j = nearest(p->s_new, p->new_a->centroids, k, p->new_a->dim);
  p->M[i * k + j]++;
  p->used++;
  return 0;
}

int eldr__fit_align_previous(const eldr_fit_source *src, const eldr_fit_opts *o,
                             eldr_artifact *a, eldr_fit_report *rep, eldr_diag *d) {
  const eldr_artifact *old = o->previous;
  const size_t k = a->k, dim = a->dim;
  int rc = ELDR_OK;
  alignpass p = {.old = old, .new_a = a, .d = d};
  eldr_artifact_sigspec(old, &p.old_spec);
  eldr_artifact_sigspec(a, &p.new_spec);
  p.s_old = malloc(old->dim * sizeof *p.s_old);
  p.s_new = malloc(dim * sizeof *p.s_new);
  p.M = calloc(k * k, sizeof *p.M);
  double *cost = malloc(k * k * sizeof *cost);
  int *to = malloc(k * sizeof *to);
  float *cent = malloc(k * dim * sizeof *cent);
  size_t *sz = malloc(k * sizeof *sz);
  rep->perm = malloc(k * sizeof *rep->perm);
  if (!p.s_old || !p.s_new || !p.M || !cost || !to || !cent || !sz || !rep->perm) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    goto out;
  }
  if (o->progress) o->progress(o->progress_ctx, "continuity", 0, 1);
  if ((rc = src->each(src->ctx, align_visit, &p, d))) goto out;
  /* old decoder i keeps new centroid to[i]: maximise the traffic kept */
  for (size_t x = 0; x < k * k; x++) cost[x] = -(double)p.M[x];
  if ((rc = eldr_assign_hungarian(cost, k, k, to, NULL))) {
    eldr_diag_fail(d, rc, "continuity assignment: %s", eldr_strerror(rc));
    goto out;
  }
  size_t kept = 0, kept0 = 0;
  for (size_t i = 0; i < k; i++) {
    kept += p.M[i * k + (size_t)to[i]];
    kept0 += p.M[i * k + i];
    memcpy(cent + i * dim, a->centroids + (size_t)to[i] * dim, dim * sizeof *cent);
    sz[i] = a->cluster_sizes[to[i]];
    rep->perm[i] = to[i];
  }
  memcpy(a->centroids, cent, k * dim * sizeof *cent);
  memcpy(a->cluster_sizes, sz, k * sizeof *sz);
  rep->have_previous = 1;
  rep->moved = p.used ? 1.0 - (double)kept / (double)p.used : 0.0;
  rep->moved_unaligned = p.used ? 1.0 - (double)kept0 / (double)p.used : 0.0;
  if (o->progress) o->progress(o->progress_ctx, "continuity", 1, 1);
out:
  free(sz);
  free(cent);
  free(to);
  free(cost);
  free(p.M);
  free(p.s_new);
  free(p.s_old);
  return rc;
}

/* ---- warm start from a previous artifact's partition ---------------------- */

typedef struct warmpass {
  eldr_sigspec old_spec;
  const fit_rows *r;
  const eldr_artifact *old;
  float *s_old, *s_new;
  eldr_centroid_acc *acc;
  size_t seen;
  eldr_diag *d;
} warmpass;

static int warm_visit(void *ud, const eldr_fit_item *it) {
  warmpass *p = ud;
  if (it->n_prefill == 0) return 0;
  int a = eldr_signature_build(&p->old_spec, it->prefill, it->gates, p->s_old);
  int b = eldr_signature_build(&p->r->spec, it->prefill, it->gates, p->s_new);
  const int bad = a && a != ELDR_EEMPTY ? a : (b && b != ELDR_EEMPTY ? b : 0);
  if (bad)
    return eldr_diag_fail(p->d, bad, "signature of request %zu (warm start): %s", p->seen,
                          eldr_strerror(bad));
  p->seen++;
  eldr_centroid_acc_add(p->acc, p->s_new, (int)nearest(p->s_old, p->old->centroids, p->old->k, p->old->dim));
  return 0;
}

int eldr__fit_warm_start(fit_rows *r, const eldr_fit_opts *o, float *cent, eldr_diag *d) {
  const eldr_artifact *old = o->previous;
  eldr_centroid_acc acc;
  int rc = eldr_centroid_acc_init(&acc, old->k, r->dim);
  if (rc) return eldr_diag_fail(d, rc, "out of memory");
  warmpass p = {.r = r, .old = old, .acc = &acc, .d = d};
  eldr_artifact_sigspec(old, &p.old_spec);
  p.s_old = malloc(old->dim * sizeof *p.s_old);
  p.s_new = malloc(r->dim * sizeof *p.s_new);
  if (!p.s_old || !p.s_new) rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  if (!rc) rc = r->src->each(r->src->ctx, warm_visit, &p, d);
  /* a centroid whose old decoder drew no request keeps its row of cent */
  if (!rc) eldr_centroid_acc_finish(&acc, cent);
  free(p.s_new);
  free(p.s_old);
  eldr_centroid_acc_free(&acc);
  return rc;
}
