/* eldr/dot.h — the one dot product of float vectors (core layer): every
 * similarity eldr computes (the decode policy's signature against each
 * centroid, the footprint's per-layer products, the watch's nearest
 * centroid, the recorder's) goes through it, so that one similarity has
 * the same bits wherever it is computed and however the vectors were
 * grouped.
 *
 * The order of the sum: eight float lanes over i = 0, 8, 16.., lane j
 * summing a[i+j]*b[i+j]; lanes j and j+4 added, the four reduced as
 * ((0+2)+(1+3)); then the tail (dim % 8) in order. Never contracted into
 * FMA.
 *
 * Errors: none. Threads: pure functions, any thread.
 */
#ifndef ELDR_DOT_H
#define ELDR_DOT_H

#include <stddef.h>

/* sum a[i] * b[i], i < dim, in the order above. */
float eldr_dot_lanes8(const float *a, const float *b, size_t dim);
/* The same for four vectors c, c + dim, c + 2 dim, c + 3 dim against sig
 * (read once): out[0..3], each the bits eldr_dot_lanes8 gives. */
void eldr_dot_lanes8_x4(const float *sig, const float *c, size_t dim, float *out);

#endif
