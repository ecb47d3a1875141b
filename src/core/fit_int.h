/* fit_int.h — private seams between fit.c (passes, candidates, the
 * artifact) and fit_scale.c (K-means at scale, continuity). Not installed. */
#ifndef ELDR_FIT_INT_H
#define ELDR_FIT_INT_H

#include "eldr/fit.h"

/* What the K-means at scale needs: the source, the chosen spec, the counts
 * of usable requests, and (optional) the whole signature matrix or the sample's. */
typedef struct fit_rows {
  const eldr_fit_source *src;
  eldr_sigspec spec;    /* the chosen one (borrows the artifact's arrays) */
  size_t dim, n;        /* n: usable requests (n_prefill > 0) */
  float *x;             /* n * dim, or NULL when streamed */
  const float *sample;  /* ns * dim signatures of the sample */
  size_t ns;
} fit_rows;

/* Fill x (n * dim) with the signatures of every usable request (one pass). */
int eldr__fit_build_matrix(fit_rows *r, float *x, eldr_diag *d);

/* Balanced K-means at scale (mini-batch + final exact) into cent (k * dim),
 * sizes (k); *objective, *streamed_passes. */
int eldr__fit_kmeans_scale(fit_rows *r, const eldr_fit_opts *o, float *cent, size_t *sizes,
                           double *objective, int *passes, eldr_diag *d);

/* Warm start of the K-means at scale from o->previous (same k): cent
 * (k * dim, the sample's K-means) := the mean signature, in the new spec, of
 * the requests the previous artifact sends to each centroid (its own spec);
 * a centroid that drew no request keeps its row. One pass. */
int eldr__fit_warm_start(fit_rows *r, const eldr_fit_opts *o, float *cent, eldr_diag *d);

/* Continuity with o->previous: reorders a's centroids and cluster sizes,
 * fills the report's moved, moved_unaligned and perm. One pass. */
int eldr__fit_align_previous(const eldr_fit_source *src, const eldr_fit_opts *o,
                             eldr_artifact *a, eldr_fit_report *rep, eldr_diag *d);

#endif
