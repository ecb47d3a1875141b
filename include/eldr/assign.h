/* eldr/assign.h — exact minimum-cost assignment with capacities.
 *
 * eldr_assign_capacitated: each of n points goes to one of k bins, at most
 * cap points per bin (k * cap >= n), minimising the summed cost. Exact:
 * successive shortest paths on the transportation network (min-cost flow).
 * eldr_assign_hungarian: the classic O(r^2 c) Hungarian method for an
 * r x c matrix, r <= c; the reference the flow solver is tested against
 * (the slot-expanded matrix n x (k*cap) gives the same optimum).
 *
 * Ownership: caller owns all buffers; scratch is allocated internally
 * (ELDR_ENOMEM on failure). Costs must be finite (ELDR_EINVAL otherwise).
 *
 * Details of eldr_assign_capacitated: the residual network is collapsed onto
 * the k bins (the cheapest way to move a point from bin a to bin b is kept
 * in one lazy heap per ordered pair), so one augmentation is a Dijkstra
 * over k+1 nodes: about O(n k^2 + moves * k log n) time, O((n + moves) k
 * + k^2) memory (16 bytes per entry). Built for k << n; for k > n the
 * k^2 terms dominate. Measured on the 2-core dev machine
 * (bench_assign): n = 10k, k = 64 in about 60 ms; n = 100k, k = 64 in
 * about 1 s. Errors:
 * ELDR_EINVAL for k == 0, k * cap < n, a NULL cost or assign with n > 0, a
 * cost that is not finite or whose magnitude exceeds 1e150 (path sums must
 * not overflow). n == 0 succeeds with total 0. Ties are broken
 * deterministically (same input, same labels), not by any documented rule.
 */
#ifndef ELDR_ASSIGN_H
#define ELDR_ASSIGN_H

#include <stddef.h>

/* cost: n*k row-major. assign: n entries in [0, k). total: optional. */
int eldr_assign_capacitated(const double *cost, size_t n, size_t k, size_t cap, int *assign,
                            double *total);

/* cost: rows*cols row-major, rows <= cols. row_to_col: rows entries.
 * ELDR_EINVAL for rows > cols, NULL buffers with rows > 0, costs that are
 * not finite or exceed 1e150 in magnitude. */
int eldr_assign_hungarian(const double *cost, size_t rows, size_t cols, int *row_to_col,
                          double *total);

#endif
