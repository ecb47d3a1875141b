/* quality_int.h — internal to core/quality.c (and its tests). */
#ifndef ELDR_CORE_QUALITY_INT_H
#define ELDR_CORE_QUALITY_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/quality.h"

/* The pairs rho is computed over, i < j,
 * sorted by (i, j), distinct. *pi receives one malloc'ed block holding both
 * arrays (*pj points into it; free(*pi) only). ELDR_EINVAL for n < 2 or
 * n > UINT32_MAX, ELDR_ERANGE if the pair count needs >= 2^32, ELDR_ENOMEM. */
int eldr__quality_pairs(size_t n, const eldr_pairs_opts *po, uint32_t **pi, uint32_t **pj,
                        size_t *npairs);

#endif
