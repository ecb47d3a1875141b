/* eldr/signature.h — expert signatures.
 *
 * A signature is the L2-normalised concatenation, over the layers in the
 * mask S (in layer order), of per-expert values v(l, e):
 *   count:  c(l,e)                      binary: [c(l,e) > 0]
 *   gate:   sum of gate probabilities   logit:  log(1 + gate sum)  (need gates)
 * each multiplied by w(l,e) = log((N+1)/(df(l,e)+1)) when IDF is on.
 * Dimension = |S| * E.
 *
 * Pure computation. eldr_signature_build allocates nothing (hot path).
 */
#ifndef ELDR_SIGNATURE_H
#define ELDR_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"

typedef enum eldr_repr {
  ELDR_REPR_COUNT = 0,
  ELDR_REPR_BINARY,
  ELDR_REPR_GATE,  /* gate-probability sums; needs per-token gate scores */
  ELDR_REPR_LOGIT, /* log1p of gate sums; needs per-token gate scores */
} eldr_repr;

/* "count", "binary", "gate", "logit". */
const char *eldr_repr_name(eldr_repr r);
/* Parse a name; ELDR_EINVAL if unknown. */
int eldr_repr_parse(const char *name, eldr_repr *out);

/* What a signature is made of. Pointers are borrowed, not owned. */
typedef struct eldr_sigspec {
  eldr_shape shape;
  eldr_repr repr;
  const float *idf;     /* L*E IDF weights, or NULL for IDF off */
  const uint8_t *mask;  /* L flags (nonzero = layer in S), or NULL for all */
} eldr_sigspec;

/* |S| * E. */
size_t eldr_signature_dim(const eldr_sigspec *spec);

/* Build a signature into out (eldr_signature_dim floats).
 * counts: L*E selection counts (required). gate_sums: L*E gate sums,
 * required only for GATE/LOGIT (else ignored, may be NULL).
 * Returns 0; ELDR_EEMPTY if the masked, weighted vector is all zero (out is
 * then all zero); ELDR_EUNSUPPORTED for GATE/LOGIT without gate_sums (out
 * zeroed); ELDR_ERANGE if the vector holds NaN/inf (bad gate sums or IDF
 * weights; out zeroed); ELDR_EINVAL for NULL arguments or an unknown repr. */
int eldr_signature_build(const eldr_sigspec *spec, const uint32_t *counts,
                         const float *gate_sums, float *out);

/* IDF weights from n calibration count matrices (contiguous, n * L * E):
 * df(l,e) = #requests with counts > 0; idf = log((n+1)/(df+1)). */
void eldr_idf_compute(const eldr_shape *s, const uint32_t *counts, size_t n, float *idf);

/* Cosine similarity of two vectors of length dim (0 if either is zero). */
double eldr_cosine(const float *a, const float *b, size_t dim);
/* Dot product. */
double eldr_dot(const float *a, const float *b, size_t dim);
/* Scale v to unit L2 norm in place; returns the old norm (v unchanged if 0
 * or not finite). */
double eldr_l2_normalize(float *v, size_t dim);

#endif
