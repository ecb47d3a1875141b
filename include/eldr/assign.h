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
 */
#ifndef ELDR_ASSIGN_H
#define ELDR_ASSIGN_H

#include <stddef.h>

/* cost: n*k row-major. assign: n entries in [0, k). total: optional. */
int eldr_assign_capacitated(const double *cost, size_t n, size_t k, size_t cap, int *assign,
                            double *total);

/* cost: rows*cols row-major, rows <= cols. row_to_col: rows entries. */
int eldr_assign_hungarian(const double *cost, size_t rows, size_t cols, int *row_to_col,
                          double *total);

#endif
