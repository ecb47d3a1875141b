/* artifact_values.c — the JSON float arrays every part of the artifact's
 * codec reads and writes (artifact.c, artifact_footprint.c; declared in
 * artifact_internal.h), in their own file so that those files do not call
 * each other. Pure: any thread. */
#include <math.h>

#include "artifact_internal.h"

/* n finite numbers that fit a float, from a JSON array of exactly n. */
int eldr__artifact_get_floats(const json_t *arr, size_t n, float *out, const char *what, eldr_diag *d) {
  if (json_array_size(arr) != n)
    return eldr_diag_fail(d, ELDR_ESHAPE, "%s: %zu values, expected %zu", what,
                          json_array_size(arr), n);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(arr, i);
    if (!json_is_number(v))
      return eldr_diag_fail(d, ELDR_EPARSE, "%s[%zu]: must be a number", what, i);
    double x = json_number_value(v);
    float f = (float)x;
    if (!isfinite(x) || !isfinite(f))
      return eldr_diag_fail(d, ELDR_ERANGE, "%s[%zu]: %g is not a finite float", what, i, x);
    out[i] = f;
  }
  return ELDR_OK;
}

json_t *eldr__artifact_float_array(const float *v, size_t n) {
  json_t *arr = json_array();
  if (!arr) return NULL;
  for (size_t i = 0; i < n; i++) {
    if (json_array_append_new(arr, json_real((double)v[i])) != 0) {
      json_decref(arr);
      return NULL;
    }
  }
  return arr;
}
