/* artifact_placement.c — the names of the expert-parallel placement files
 * an artifact carries (eldr/artifact_model.h); the JSON section is read and
 * written by src/format/artifact_placement.c. Pure computation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact_placement_int.h"
#include "eldr/placement.h"

void eldr__artifact_placement_free(eldr_artifact_placement *p, size_t k) {
  if (!p) return;
  free(p->global);
  if (p->decoders)
    for (size_t i = 0; i < k; i++) free(p->decoders[i]);
  free(p->decoders);
  free(p);
}

static int bad_name(const char *s) { return !s || !s[0] || strchr(s, '/') || strlen(s) > 255; }

int eldr__artifact_placement_validate(const eldr_artifact *a, eldr_diag *d) {
  const eldr_artifact_placement *p = a->placement;
  if (!p) return 0;
  if (p->ep_size < 1 || p->ep_size > ELDR_PLACEMENT_MAX_RANKS)
    return eldr_diag_fail(d, ELDR_ERANGE, "placement.ep_size: %u outside [1, %d]", p->ep_size,
                          ELDR_PLACEMENT_MAX_RANKS);
  if (p->redundant > ELDR_MAX_EXPERTS ||
      (a->shape.num_experts + p->redundant) % p->ep_size != 0)
    return eldr_diag_fail(d, ELDR_ERANGE,
                          "placement.redundant_experts: %u + %u experts do not split over %u ranks",
                          a->shape.num_experts, p->redundant, p->ep_size);
  if (bad_name(p->global))
    return eldr_diag_fail(d, ELDR_ERANGE, "placement.global: must be a file name without '/'");
  for (size_t i = 0; i < a->k; i++)
    if (!p->decoders || bad_name(p->decoders[i]))
      return eldr_diag_fail(d, ELDR_ERANGE, "placement.decoders[%zu]: must be a file name without '/'",
                            i);
  return 0;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int eldr_artifact_set_placement(eldr_artifact *a, uint32_t ep_size, uint32_t redundant,
                                const char *global, const char *const *decoders, eldr_diag *d) {
  if (!a || !decoders) return eldr_diag_fail(d, ELDR_EINVAL, "placement: NULL argument");
  eldr_artifact_placement *p = calloc(1, sizeof *p);
  if (p) p->decoders = calloc(a->k, sizeof *p->decoders);
  int rc = 0;
  if (!p || !p->decoders || !(p->global = dup_or_null(global))) rc = ELDR_ENOMEM;
  for (size_t i = 0; !rc && i < a->k; i++)
    if (!(p->decoders[i] = dup_or_null(decoders[i]))) rc = ELDR_ENOMEM;
  if (rc) {
    eldr__artifact_placement_free(p, a->k);
    return eldr_diag_fail(d, rc, "placement: out of memory or missing name");
  }
  p->ep_size = ep_size;
  p->redundant = redundant;
  eldr_artifact_placement *old = a->placement;
  a->placement = p;
  if ((rc = eldr__artifact_placement_validate(a, d)) < 0) {
    a->placement = old;
    eldr__artifact_placement_free(p, a->k);
    return rc;
  }
  eldr__artifact_placement_free(old, a->k);
  return 0;
}

int eldr_artifact_placement_path(const char *artifact_path, const char *name, char *out,
                                 size_t cap, eldr_diag *d) {
  if (!artifact_path || !name || !out) return eldr_diag_fail(d, ELDR_EINVAL, "placement: NULL path");
  const char *slash = strrchr(artifact_path, '/');
  int dirlen = slash ? (int)(slash - artifact_path + 1) : 0;
  int n = snprintf(out, cap, "%.*s%s", dirlen, artifact_path, name);
  if (n < 0 || (size_t)n >= cap)
    return eldr_diag_fail(d, ELDR_ERANGE, "placement: path of '%s' next to '%s' too long", name,
                          artifact_path);
  return 0;
}

