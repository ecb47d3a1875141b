/* quantile.c — quantiles on the 0..1 scale. */
#include "eldr/quantile.h"

#include <math.h>
#include <stdlib.h>

int eldr_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double eldr_quantile_sorted(const double *v, size_t n, double q) {
  if (n == 0) return NAN;
  if (!(q > 0)) return v[0];
  if (q >= 1) return v[n - 1];
  double pos = q * (double)(n - 1);
  size_t i = (size_t)pos;
  if (i + 1 >= n) return v[n - 1];
  double f = pos - (double)i;
  return v[i] * (1 - f) + v[i + 1] * f;
}

double eldr_quantile(double *v, size_t n, double q) {
  if (n == 0) return NAN;
  qsort(v, n, sizeof *v, eldr_cmp_double);
  return eldr_quantile_sorted(v, n, q);
}
