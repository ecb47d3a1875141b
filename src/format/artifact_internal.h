/* artifact_internal.h — the artifact's optional JSON sections kept in their
 * own files ("placement": artifact_placement.c, "footprint":
 * artifact_footprint.c), and the codec helpers they share with artifact.c. */
#ifndef ELDR_ARTIFACT_INTERNAL_H
#define ELDR_ARTIFACT_INTERNAL_H

#include <jansson.h>

#include "eldr/artifact.h"

/* Read root["placement"] (absent or null: a->placement stays NULL). */
int eldr__artifact_placement_parse(const json_t *root, eldr_artifact *a, eldr_diag *d);
/* Add "placement" to root when a has one; 0, or -1 when out of memory. */
int eldr__artifact_placement_dump(json_t *root, const eldr_artifact *a);

/* Read root["footprint"] (absent or null: no prior). */
int eldr__artifact_footprint_parse(const json_t *root, eldr_artifact *a, eldr_diag *d);
/* Add "footprint" to root when a has a prior; 0, or -1 when out of memory. */
int eldr__artifact_footprint_dump(json_t *root, const eldr_artifact *a);

/* n finite float values from a JSON array of exactly n numbers (errors name what). */
int eldr__artifact_get_floats(const json_t *arr, size_t n, float *out, const char *what, eldr_diag *d);
/* A JSON array of n floats (17 significant digits on dump), or NULL. */
json_t *eldr__artifact_float_array(const float *v, size_t n);

#endif
