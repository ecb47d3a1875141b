/* eldr/kmeans.h — spherical K-means on unit signatures, balanced or vanilla.
 *
 * Cost of point i to centroid c is 1 - cos(x_i, c); centroids are the
 * L2-normalised means of their members. Balanced: every assignment step is
 * an exact capacitated assignment (eldr_assign_capacitated) with
 * cap = ceil(n/k). Vanilla (the ablation): nearest centroid. k-means++
 * initialisation, `restarts` independent runs, the lowest objective wins
 * (ties: the lowest restart index). Restarts run on up to 2 threads, each
 * with its own workspace; the result is bit-identical to a sequential run.
 * Same seed, same input => identical output.
 *
 * Ownership: caller owns x, centroids (k*dim), labels (n), sizes (k).
 *
 * Details: rows are used by direction (a non-unit row is normalised on the
 * fly); a zero row costs exactly 1 to every centroid and is never a seed.
 * Seeding is greedy k-means++ (2 + floor(ln k) distance-weighted candidates
 * per step, the best kept); restart r uses the r-th splitmix64 output of
 * opts->seed, so restart 0 is the same run whatever opts->restarts is. A
 * run stops when the labels stop changing or after max_iter assignment
 * steps. A cluster left empty by an assignment step (vanilla, or balanced
 * when (k-1)*cap >= n) takes the point farthest from its centroid among
 * clusters with two or more members. Output centroids are unit norm (a
 * cluster whose members are all zero rows keeps its previous centroid; with
 * no non-zero row at all the centroids are unit basis vectors). When at
 * most half of all entries of x are non-zero, rows are scored through an
 * internal CSR copy (extra memory 8 bytes per non-zero). max_iter < 1, dim == 0, a
 * NULL buffer (other than sizes/res) or a non-finite entry: ELDR_EINVAL.
 */
#ifndef ELDR_KMEANS_H
#define ELDR_KMEANS_H

#include <stddef.h>
#include <stdint.h>

typedef struct eldr_kmeans_opts {
  size_t k;        /* clusters (>= 1, <= n) */
  int balanced;    /* 1 = capacitated assignment, 0 = vanilla */
  int restarts;    /* >= 1 */
  int max_iter;    /* per restart, e.g. 100 */
  uint64_t seed;
} eldr_kmeans_opts;

typedef struct eldr_kmeans_result {
  double objective; /* sum of (1 - cos) of the winning run */
  int iterations;   /* iterations of the winning run */
  int restart;      /* index of the winning restart */
} eldr_kmeans_result;

/* Fit. x: n*dim rows (unit or zero). Returns 0, ELDR_EINVAL (k == 0, k > n,
 * restarts < 1), ELDR_ENOMEM. sizes may be NULL. */
int eldr_kmeans_fit(const float *x, size_t n, size_t dim, const eldr_kmeans_opts *opts,
                    float *centroids, int *labels, size_t *sizes, eldr_kmeans_result *res);

#endif
