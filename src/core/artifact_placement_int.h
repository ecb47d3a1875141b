/* artifact_placement_int.h — core-internal hooks of the artifact's
 * placement names (src/core/artifact_placement.c), called by
 * artifact_model.c: free them with the artifact, check them in its
 * validator. */
#ifndef ELDR_ARTIFACT_PLACEMENT_INT_H
#define ELDR_ARTIFACT_PLACEMENT_INT_H

#include <stddef.h>

#include "eldr/artifact_model.h"

/* Checks of an attached placement (ep_size, divisibility, names). */
int eldr__artifact_placement_validate(const eldr_artifact *a, eldr_diag *d);
/* Free p and its k decoder names. NULL-safe. */
void eldr__artifact_placement_free(eldr_artifact_placement *p, size_t k);

#endif
