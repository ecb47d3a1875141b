/* eldr/quantile.h — quantiles of samples (base layer). One scale: q in
 * [0, 1] (the median is 0.5, p99 is 0.99); q outside is clamped.
 * Linear interpolation between order statistics: position q * (n - 1).
 *
 * Errors: NaN for n == 0. Threads: any thread; no state.
 */
#ifndef ELDR_QUANTILE_H
#define ELDR_QUANTILE_H

#include <stddef.h>

/* q-quantile of v[0..n), already sorted ascending. */
double eldr_quantile_sorted(const double *v, size_t n, double q);

/* Sort v[0..n) in place (ascending), then eldr_quantile_sorted. */
double eldr_quantile(double *v, size_t n, double q);

/* qsort comparator for doubles, ascending. */
int eldr_cmp_double(const void *a, const void *b);

#endif
