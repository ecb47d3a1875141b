/* eldr/kmeans_mb.h — the pieces of balanced K-means at scale: dense scores
 * through sgemm, mini-batch balanced updates, the final exact capacitated
 * assignment, and member means accumulated row by row (so that rows may
 * stream past and never be held together).
 *
 * Rows are signatures: unit L2 norm or all zero (a zero row scores 0 against
 * every centroid, i.e. costs 1). Centroids are unit rows (k * dim).
 *
 * Mini-batch balanced K-means (eldr_mbkmeans_step): each batch of b rows is
 * assigned exactly under capacity ceil(b / k) per centroid (the batch is a
 * small balanced K-means assignment step, eldr_assign_capacitated), then each
 * centroid moves towards the mean of its batch members with a per-centroid
 * rate 1/count (count = rows it has absorbed so far, Sculley 2010), and is
 * renormalised. The balance of the batches keeps centroids from collapsing;
 * the exact capacity guarantee on all n rows comes from the final pass
 * (eldr_kmeans_assign_scores with cap = ceil(n / k)), not from the batches.
 *
 * Ownership: callers own every buffer they pass; an eldr_mbkmeans owns its
 * centroids and scratch (eldr_mbkmeans_free). Errors: ELDR_EINVAL (k == 0,
 * dim == 0, NULL buffers, non-finite values), ELDR_ENOMEM. Threads: an
 * object is used by one thread at a time; the sgemm may use OpenBLAS's own
 * threads. Deterministic for the same inputs, OpenBLAS build and thread
 * count.
 */
#ifndef ELDR_KMEANS_MB_H
#define ELDR_KMEANS_MB_H

#include <stddef.h>
#include <stdint.h>

/* out[i * k + c] = dot(x_i, cent_c) for n rows of x (n * dim) and k
 * centroids (k * dim): one cblas_sgemm when built with OpenBLAS, else a
 * blocked loop. */
void eldr_kmeans_scores(const float *x, size_t n, size_t dim, const float *cent, size_t k,
                        float *out);

/* Exact balanced assignment from scores (n * k cosines): every row to one
 * centroid, at most cap rows per centroid (k * cap >= n), minimising the sum
 * of 1 - score. labels: n entries; sizes (k, optional) receive the counts;
 * *objective (optional) the minimised sum. ELDR_EINVAL, ELDR_ENOMEM (scratch
 * of about 8 n k bytes plus the flow solver's). */
int eldr_kmeans_assign_scores(const float *scores, size_t n, size_t k, size_t cap, int *labels,
                              size_t *sizes, double *objective);

/* Running member sums for the centroid update, in double. */
typedef struct eldr_centroid_acc {
  size_t k, dim;
  double *sum;    /* k * dim */
  size_t *count;  /* k */
} eldr_centroid_acc;

int eldr_centroid_acc_init(eldr_centroid_acc *a, size_t k, size_t dim);
void eldr_centroid_acc_free(eldr_centroid_acc *a);
void eldr_centroid_acc_reset(eldr_centroid_acc *a);
/* Add row x (dim floats) to centroid c's sum. */
void eldr_centroid_acc_add(eldr_centroid_acc *a, const float *x, int c);
/* cent (k * dim) := the normalised sums; a centroid whose sum is zero keeps
 * its row of cent. */
void eldr_centroid_acc_finish(const eldr_centroid_acc *a, float *cent);

typedef struct eldr_mbkmeans eldr_mbkmeans;

/* A mini-batch run from init (k * dim unit rows, copied); max_batch is the
 * largest b a step will be given. */
int eldr_mbkmeans_new(size_t k, size_t dim, size_t max_batch, const float *init,
                      eldr_mbkmeans **out);
void eldr_mbkmeans_free(eldr_mbkmeans *m);
/* One mini-batch step on b rows (b <= max_batch, b >= 1). */
int eldr_mbkmeans_step(eldr_mbkmeans *m, const float *x, size_t b);
/* The current centroids (k * dim, owned by m, valid until the next step). */
const float *eldr_mbkmeans_centroids(const eldr_mbkmeans *m);

#endif
