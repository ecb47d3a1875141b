/* signature_int.h — internal to core: the representation's per-layer
 * values, which signature.c builds and quality.c's fast path reads. Pure
 * function: any thread. */
#ifndef ELDR_CORE_SIGNATURE_INT_H
#define ELDR_CORE_SIGNATURE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/signature.h"

/* Shared with quality.c so that its fast path computes exactly the
 * values eldr_signature_build does: one layer row of the representation,
 * IDF applied. c: E counts; g: E gate sums (GATE/LOGIT only, else unused);
 * w: E IDF weights or NULL; o: E outputs (not normalised). */
void eldr__signature_layer_values(eldr_repr repr, const uint32_t *c, const float *g,
                                  const float *w, size_t E, float *o);

#endif
