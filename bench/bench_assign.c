/* bench_assign.c — time of the exact capacitated assignment.
 *
 * Usage: bench_assign [reps]
 * For n = 1k and 10k with k = 16, 32, 64 (cap = ceil(n/k)), random costs of
 * the K-means kind (1 - cos of random unit-ish vectors with a popularity
 * skew, so that the capacity binds), the median time of eldr_assign_capacitated
 * over `reps` runs. For small n, the Hungarian method on the slot-expanded
 * n x (k*cap) matrix as the baseline (same optimum, checked).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "eldr/assign.h"
#include "eldr/rng.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
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
        double t0 = now_s();
        if (eldr_assign_capacitated(cost, n, k, cap, assign, &total) != 0) return 1;
        t[r] = now_s() - t0;
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
    double t0 = now_s();
    if (eldr_assign_capacitated(cost, n, k, cap, assign, &tf) != 0) return 1;
    double t1 = now_s();
    if (eldr_assign_hungarian(slots, n, cols, assign, &th) != 0) return 1;
    double t2 = now_s();
    printf("%-8zu %-4zu %12.3f %12.3f %8.1f %s\n", n, k, (t1 - t0) * 1e3, (t2 - t1) * 1e3,
           (t2 - t1) / (t1 - t0), fabs(tf - th) < 1e-7 ? "yes" : "NO");
    free(assign);
    free(slots);
    free(cost);
  }
  return 0;
}
