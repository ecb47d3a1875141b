/* artifact_internal.h — the artifact's optional "placement" JSON section,
 * kept in its own file (artifact_placement.c); called by artifact.c only. */
#ifndef ELDR_ARTIFACT_INTERNAL_H
#define ELDR_ARTIFACT_INTERNAL_H

#include <jansson.h>

#include "eldr/artifact.h"

/* Read root["placement"] (absent or null: a->placement stays NULL). */
int eldr__artifact_placement_parse(const json_t *root, eldr_artifact *a, eldr_diag *d);
/* Add "placement" to root when a has one; 0, or -1 when out of memory. */
int eldr__artifact_placement_dump(json_t *root, const eldr_artifact *a);

#endif
