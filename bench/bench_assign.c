/* bench_assign.c — time of the exact capacitated assignment.
 *
 * Usage: bench_assign [reps] [extra_kmeans_n]   (e.g. 3 100000)
 * For n = 1k and 10k with k = 16, 32, 64 (cap = ceil(n/k)), random costs of
 * the K-means kind (1 - cos of random unit-ish vectors with a popularity
 * skew, so that the capacity binds), the median time of eldr_assign_capacitated
 * over `reps` runs. For small n, the Hungarian method on the slot-expanded
 * n x (k*cap) matrix as the baseline (same optimum, checked).
 * Then eldr_kmeans_fit (balanced and vanilla, restarts 1, max_iter 30) on
 * synthetic signature-like rows: 24 layers x 128 experts (dim 3072), each
 * request routes T tokens top-1 per layer from one of 8 domain-skewed
 * expert distributions, count representation, L2-normalised; T is short
 * (median ~16, sparse rows) or long (512 tokens, dense rows). total_s is
 * wall time (includes k-means++ seeding), cpu_s the process CPU time (less
 * sensitive to a loaded machine), per_iter_s = total_s / iterations.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "eldr/clock.h"
#include "eldr/assign.h"
#include "eldr/kmeans.h"
#include "eldr/rng.h"

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Costs in [0, 2]: a per-bin popularity bias plus noise, so most points
 * prefer a few bins and the capacity constraint is active. */
static void make_costs(double *cost, size_t n, size_t k, uint64_t seed) {
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++)
    for (size_t b = 0; b < k; b++) {
      double v = 0.6 + 0.3 * (double)b / (double)k + 0.25 * eldr_rng_normal(&r);
      cost[i * k + b] = fmin(2.0, fmax(0.0, v));
    }
}

#define SIG_LAYERS 24
#define SIG_EXPERTS 128

/* Signature-like rows; returns the fraction of non-zero entries. */
static double make_signatures(float *x, size_t n, int long_prompts, uint64_t seed) {
  const size_t dim = SIG_LAYERS * SIG_EXPERTS, domains = 8;
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  /* per domain and layer: a skewed expert popularity (Zipf over a domain
   * specific permutation) sampled by inverse CDF */
  static double cdf[8][SIG_LAYERS][SIG_EXPERTS];
  static int perm[8][SIG_LAYERS][SIG_EXPERTS];
  for (size_t d = 0; d < domains; d++)
    for (size_t l = 0; l < SIG_LAYERS; l++) {
      for (int e = 0; e < SIG_EXPERTS; e++) perm[d][l][e] = e;
      for (int e = SIG_EXPERTS - 1; e > 0; e--) {
        int j = (int)eldr_rng_below(&r, (uint64_t)e + 1);
        int t = perm[d][l][e];
        perm[d][l][e] = perm[d][l][j];
        perm[d][l][j] = t;
      }
      double acc = 0;
      for (int e = 0; e < SIG_EXPERTS; e++) {
        acc += 1.0 / pow((double)e + 1.0, 1.1);
        cdf[d][l][e] = acc;
      }
      for (int e = 0; e < SIG_EXPERTS; e++) cdf[d][l][e] /= acc;
    }
  size_t nnz = 0;
  for (size_t i = 0; i < n; i++) {
    float *xi = x + i * dim;
    for (size_t j = 0; j < dim; j++) xi[j] = 0.0f;
    size_t d = eldr_rng_below(&r, domains);
    size_t T = long_prompts ? 512 : (size_t)fmax(1.0, exp(log(16.0) + 0.8 * eldr_rng_normal(&r)));
    for (size_t t = 0; t < T; t++)
      for (size_t l = 0; l < SIG_LAYERS; l++) {
        double u = eldr_rng_uniform(&r);
        int e = 0;
        while (e < SIG_EXPERTS - 1 && cdf[d][l][e] < u) e++;
        xi[l * SIG_EXPERTS + (size_t)perm[d][l][e]] += 1.0f;
      }
    double nn = 0;
    for (size_t j = 0; j < dim; j++) nn += (double)xi[j] * xi[j];
    for (size_t j = 0; j < dim; j++) {
      xi[j] = (float)(xi[j] / sqrt(nn));
      nnz += xi[j] != 0.0f;
    }
  }
  return (double)nnz / ((double)n * (double)dim);
}

static int bench_kmeans(size_t extra_n) {
  const size_t dim = SIG_LAYERS * SIG_EXPERTS;
  const size_t ns[] = {1000, 10000, extra_n};
  const size_t ks[] = {16, 64};
  printf("\nK-means on signature-like rows (dim %zu, restarts 1, max_iter 30)\n", dim);
  printf("%-6s %-7s %-4s %-8s %8s %6s %10s %8s %10s %12s\n", "rows", "n", "k", "mode", "density",
         "iters", "total_s", "cpu_s", "per_iter_s", "objective");
  for (int lp = 0; lp < 2; lp++)
    for (size_t a = 0; a < 3; a++) {
      size_t n = ns[a];
      if (n == 0 || (lp && n > 1000)) continue; /* dense rows: 1k only (memory, time) */
      float *x = malloc(n * dim * sizeof *x);
      int *lab = malloc(n * sizeof *lab);
      if (!x || !lab) return 1;
      double density = make_signatures(x, n, lp, 1234 + n);
      for (size_t b = 0; b < 2; b++)
        for (int bal = 1; bal >= 0; bal--) {
          size_t k = ks[b];
          float *cent = malloc(k * dim * sizeof *cent);
          size_t *sizes = malloc(k * sizeof *sizes);
          if (!cent || !sizes) return 1;
          eldr_kmeans_opts o = {.k = k, .balanced = bal, .restarts = 1, .max_iter = 30, .seed = 7};
          eldr_kmeans_result res;
          double t0 = eldr_clock_now(), c0 = cpu_s();
          if (eldr_kmeans_fit(x, n, dim, &o, cent, lab, sizes, &res) != 0) return 1;
          double t = eldr_clock_now() - t0, tc = cpu_s() - c0;
          size_t mx = 0;
          for (size_t c = 0; c < k; c++) mx = sizes[c] > mx ? sizes[c] : mx;
          printf("%-6s %-7zu %-4zu %-8s %8.3f %6d %10.3f %8.3f %10.4f %12.3f  max_size %zu (cap %zu)\n",
                 lp ? "dense" : "sparse", n, k, bal ? "balanced" : "vanilla", density,
                 res.iterations, t, tc, t / res.iterations, res.objective, mx, (n + k - 1) / k);
          free(sizes);
          free(cent);
        }
      free(lab);
      free(x);
    }
  return 0;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 3;
  if (reps < 1) reps = 1;
  const size_t ns[] = {1000, 10000};
  const size_t ks[] = {16, 32, 64};
  printf("%-8s %-4s %-6s %12s %14s\n", "n", "k", "cap", "flow_ms", "total_cost");
  for (size_t a = 0; a < 2; a++)
    for (size_t b = 0; b < 3; b++) {
      size_t n = ns[a], k = ks[b], cap = (n + k - 1) / k;
      double *cost = malloc(n * k * sizeof *cost);
      int *assign = malloc(n * sizeof *assign);
      double *t = malloc((size_t)reps * sizeof *t);
      if (!cost || !assign || !t) return 1;
      make_costs(cost, n, k, 42 + n + k);
      double total = 0;
      for (int r = 0; r < reps; r++) {
        double t0 = eldr_clock_now();
        if (eldr_assign_capacitated(cost, n, k, cap, assign, &total) != 0) return 1;
        t[r] = eldr_clock_now() - t0;
      }
      qsort(t, (size_t)reps, sizeof *t, cmp_double);
      printf("%-8zu %-4zu %-6zu %12.2f %14.6f\n", n, k, cap, t[reps / 2] * 1e3, total);
      free(t);
      free(assign);
      free(cost);
    }

  printf("\nHungarian on the slot-expanded matrix (baseline)\n");
  printf("%-8s %-4s %12s %12s %8s %s\n", "n", "k", "flow_ms", "hung_ms", "ratio", "same_total");
  const size_t hn[] = {250, 500, 1000};
  for (size_t a = 0; a < 3; a++) {
    size_t n = hn[a], k = 16, cap = (n + k - 1) / k, cols = k * cap;
    double *cost = malloc(n * k * sizeof *cost);
    double *slots = malloc(n * cols * sizeof *slots);
    int *assign = malloc(n * sizeof *assign);
    if (!cost || !slots || !assign) return 1;
    make_costs(cost, n, k, 7 + n);
    for (size_t i = 0; i < n; i++)
      for (size_t c = 0; c < cols; c++) slots[i * cols + c] = cost[i * k + c / cap];
    double tf = 0, th = 0;
    double t0 = eldr_clock_now();
    if (eldr_assign_capacitated(cost, n, k, cap, assign, &tf) != 0) return 1;
    double t1 = eldr_clock_now();
    if (eldr_assign_hungarian(slots, n, cols, assign, &th) != 0) return 1;
    double t2 = eldr_clock_now();
    printf("%-8zu %-4zu %12.3f %12.3f %8.1f %s\n", n, k, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
           (t2 - t1) / (t1 - t0), fabs(tf - th) < 1e-7 ? "yes" : "NO");
    free(assign);
    free(slots);
    free(cost);
  }
  return bench_kmeans(argc > 2 ? (size_t)atol(argv[2]) : 0);
}
