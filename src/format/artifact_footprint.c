/* artifact_footprint.c — the artifact's optional "footprint" section: the
 * footprint policy's profile priors (eldr/fp_prior.h),
 *
 *   "footprint": {"prior_tokens": number > 0, "prior": [L*E numbers],
 *                 "cluster_priors": [[L*E numbers] x k]   (optional)}
 *
 * absent or null: no prior (the policy uses the raw prefill profile). */
#include <stdio.h>
#include <stdlib.h>

#include "artifact_internal.h"

int eldr__artifact_footprint_parse(const json_t *root, eldr_artifact *a, eldr_diag *d) {
  const json_t *v = json_object_get(root, "footprint");
  if (!v || json_is_null(v)) return ELDR_OK;
  if (!json_is_object(v)) return eldr_diag_fail(d, ELDR_EPARSE, "footprint: must be an object or null");
  const json_t *t = json_object_get(v, "prior_tokens"), *p = json_object_get(v, "prior"),
               *cp = json_object_get(v, "cluster_priors");
  if (!json_is_number(t)) return eldr_diag_fail(d, ELDR_EPARSE, "footprint.prior_tokens: must be a number");
  if (!json_is_array(p)) return eldr_diag_fail(d, ELDR_EPARSE, "footprint.prior: must be an array");
  if (cp && !json_is_null(cp) && (!json_is_array(cp) || json_array_size(cp) != a->k))
    return eldr_diag_fail(d, ELDR_ESHAPE, "footprint.cluster_priors: must be an array of k = %zu arrays",
                          a->k);
  const size_t LE = eldr_shape_cells(&a->shape), n = cp && !json_is_null(cp) ? 1 + a->k : 1;
  float *prior = malloc(n * (LE ? LE : 1) * sizeof *prior);
  if (!prior) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  int rc = eldr__artifact_get_floats(p, LE, prior, "footprint.prior", d);
  for (size_t c = 1; !rc && c < n; c++) {
    char what[64];
    snprintf(what, sizeof what, "footprint.cluster_priors[%zu]", c - 1);
    const json_t *row = json_array_get(cp, c - 1);
    if (!json_is_array(row)) rc = eldr_diag_fail(d, ELDR_EPARSE, "%s: must be an array", what);
    else rc = eldr__artifact_get_floats(row, LE, prior + c * LE, what, d);
  }
  if (!rc) rc = eldr_artifact_set_fp_prior(a, prior, n, json_number_value(t), d);
  free(prior);
  return rc;
}

int eldr__artifact_footprint_dump(json_t *root, const eldr_artifact *a) {
  if (!a->fp_prior) return 0;
  const size_t LE = eldr_shape_cells(&a->shape);
  json_t *o = json_object();
  if (!o) return -1;
  int bad = json_object_set_new(o, "prior_tokens", json_real(a->fp_prior_tokens)) ||
            json_object_set_new(o, "prior", eldr__artifact_float_array(a->fp_prior, LE));
  if (!bad && a->fp_n_priors > 1) {
    json_t *cp = json_array();
    bad = json_object_set_new(o, "cluster_priors", cp);
    for (size_t c = 1; !bad && c < a->fp_n_priors; c++)
      bad = json_array_append_new(cp, eldr__artifact_float_array(a->fp_prior + c * LE, LE));
  }
  if (bad) {
    json_decref(o);
    return -1;
  }
  return json_object_set_new(root, "footprint", o) ? -1 : 0;
}
