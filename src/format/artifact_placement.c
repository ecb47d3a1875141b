/* artifact_placement.c — the artifact's optional "placement" JSON section:
 * the names of the EP placement files `eldr fit --ep-size` writes next to
 * it (see include/eldr/artifact.h; the names in memory: src/core). */
#include <stdlib.h>
#include <string.h>

#include "artifact_internal.h"
#include "eldr/placement.h"

#define FORMAT "sglang-init-expert-location"

int eldr__artifact_placement_parse(const json_t *root, eldr_artifact *a, eldr_diag *d) {
  json_t *pj = json_object_get(root, "placement");
  if (!pj || json_is_null(pj)) return 0;
  if (!json_is_object(pj)) return eldr_diag_fail(d, ELDR_EPARSE, "placement: must be an object");
  json_t *r = json_object_get(pj, "ep_size"), *n = json_object_get(pj, "redundant_experts");
  json_t *f = json_object_get(pj, "format"), *g = json_object_get(pj, "global");
  json_t *ds = json_object_get(pj, "decoders");
  if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > ELDR_PLACEMENT_MAX_RANKS)
    return eldr_diag_fail(d, ELDR_EPARSE, "placement.ep_size: must be an integer in [1, %d]",
                          ELDR_PLACEMENT_MAX_RANKS);
  if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > ELDR_MAX_EXPERTS)
    return eldr_diag_fail(d, ELDR_EPARSE, "placement.redundant_experts: must be an integer in [0, %d]",
                          ELDR_MAX_EXPERTS);
  if (!json_is_string(f) || strcmp(json_string_value(f), FORMAT))
    return eldr_diag_fail(d, ELDR_EPARSE, "placement.format: must be \"" FORMAT "\"");
  if (!json_is_string(g)) return eldr_diag_fail(d, ELDR_EPARSE, "placement.global: must be a string");
  if (!json_is_array(ds) || json_array_size(ds) != a->k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "placement.decoders: must be an array of k = %zu names", a->k);
  const char **names = calloc(a->k, sizeof *names);
  if (!names) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  for (size_t i = 0; i < a->k; i++) {
    json_t *v = json_array_get(ds, i);
    if (!json_is_string(v)) {
      free(names);
      return eldr_diag_fail(d, ELDR_EPARSE, "placement.decoders[%zu]: must be a string", i);
    }
    names[i] = json_string_value(v);
  }
  int rc = eldr_artifact_set_placement(a, (uint32_t)json_integer_value(r),
                                       (uint32_t)json_integer_value(n), json_string_value(g),
                                       names, d);
  free(names);
  return rc;
}

int eldr__artifact_placement_dump(json_t *root, const eldr_artifact *a) {
  const eldr_artifact_placement *p = a->placement;
  if (!p) return 0;
  json_t *o = json_object(), *ds = json_array();
  int bad = !o || !ds;
  for (size_t i = 0; !bad && i < a->k; i++)
    bad |= json_array_append_new(ds, json_string(p->decoders[i])) != 0;
  if (!bad) {
    bad |= json_object_set_new(o, "ep_size", json_integer(p->ep_size)) != 0;
    bad |= json_object_set_new(o, "redundant_experts", json_integer(p->redundant)) != 0;
    bad |= json_object_set_new(o, "format", json_string(FORMAT)) != 0;
    bad |= json_object_set_new(o, "global", json_string(p->global)) != 0;
    bad |= json_object_set_new(o, "decoders", ds) != 0;
    ds = NULL;
  }
  json_decref(ds);
  if (!bad) {
    bad = json_object_set_new(root, "placement", o) != 0;
    o = NULL;
  }
  json_decref(o);
  return bad ? -1 : 0;
}
