/* artifact_model.c — the routing artifact in memory (see
 * eldr/artifact_model.h): construction and validation. The JSON codec is
 * src/format/artifact.c. */
#include "eldr/artifact_model.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "artifact_placement_int.h"

/* Largest |L2 norm - 1| of a centroid. */
#define NORM_TOL 1e-3

eldr_artifact *eldr_artifact_new(const char *model, const eldr_shape *shape,
                                 const uint32_t *layer_ids, eldr_repr repr, int idf_enabled,
                                 const uint8_t *mask, size_t k) {
  if (!shape || eldr_shape_validate(shape, NULL) != ELDR_OK || k == 0) return NULL;
  const size_t L = shape->num_layers, E = shape->num_experts;
  size_t nmask = 0;
  for (size_t l = 0; l < L; l++) nmask += (!mask || mask[l]) ? 1 : 0;
  if (nmask == 0) return NULL;
  const size_t dim = nmask * E;
  if (k > SIZE_MAX / sizeof(float) / dim) return NULL;

  eldr_artifact *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->version = ELDR_ARTIFACT_VERSION;
  a->shape = *shape;
  a->repr = repr;
  a->idf_enabled = idf_enabled ? 1 : 0;
  a->k = k;
  a->dim = dim;
  a->model = strdup(model ? model : "");
  a->layer_ids = calloc(L, sizeof *a->layer_ids);
  a->mask = calloc(L, sizeof *a->mask);
  a->centroids = calloc(k * dim, sizeof *a->centroids);
  a->cluster_sizes = calloc(k, sizeof *a->cluster_sizes);
  a->fit_decode_n = SIZE_MAX; /* not recorded until a fit says */
  if (a->idf_enabled) a->idf = calloc(L * E, sizeof *a->idf);
  if (!a->model || !a->layer_ids || !a->mask || !a->centroids || !a->cluster_sizes ||
      (a->idf_enabled && !a->idf)) {
    eldr_artifact_free(a);
    return NULL;
  }
  for (size_t l = 0; l < L; l++) {
    a->layer_ids[l] = layer_ids ? layer_ids[l] : (uint32_t)l;
    a->mask[l] = (!mask || mask[l]) ? 1 : 0;
  }
  return a;
}

void eldr_artifact_free(eldr_artifact *a) {
  if (!a) return;
  eldr_drift_ref_free(a->drift_ref);
  eldr__artifact_placement_free(a->placement, a->k);
  free(a->latency);
  free(a->fp_prior);
  free(a->trace);
  free(a->trace_generator);
  free(a->created);
  free(a->cluster_sizes);
  free(a->centroids);
  free(a->mask);
  free(a->idf);
  free(a->layer_ids);
  free(a->model);
  free(a);
}

static int validate_fp_prior(const eldr_artifact *a, eldr_diag *d);

int eldr_artifact_validate(const eldr_artifact *a, eldr_diag *d) {
  if (!a) return eldr_diag_fail(d, ELDR_EINVAL, "artifact missing");
  if (a->version != ELDR_ARTIFACT_VERSION)
    return eldr_diag_fail(d, ELDR_EVERSION, "version: %d is not supported (this build reads %d)",
                          a->version, ELDR_ARTIFACT_VERSION);
  if (!a->model) return eldr_diag_fail(d, ELDR_EINVAL, "model.name missing");
  int rc = eldr_shape_validate(&a->shape, d);
  if (rc) {
    eldr_diag_prefix(d, "model");
    return rc;
  }
  const size_t L = a->shape.num_layers, E = a->shape.num_experts;
  if (!a->layer_ids) return eldr_diag_fail(d, ELDR_EINVAL, "model.layer_ids missing");
  for (size_t i = 0; i < L; i++)
    for (size_t j = 0; j < i; j++)
      if (a->layer_ids[i] == a->layer_ids[j])
        return eldr_diag_fail(d, ELDR_ERANGE, "model.layer_ids[%zu] = %" PRIu32
                              " repeats model.layer_ids[%zu]", i, a->layer_ids[i], j);
  if ((unsigned)a->repr > (unsigned)ELDR_REPR_LOGIT)
    return eldr_diag_fail(d, ELDR_EUNSUPPORTED, "representation: unknown value %d", (int)a->repr);
  if (a->idf_enabled) {
    if (!a->idf) return eldr_diag_fail(d, ELDR_EINVAL, "idf.weights missing while idf.enabled");
    for (size_t i = 0; i < L * E; i++) {
      if (!isfinite(a->idf[i]))
        return eldr_diag_fail(d, ELDR_ERANGE, "idf.weights[%zu] is not finite (%g)", i,
                              (double)a->idf[i]);
      if (a->idf[i] < 0)
        return eldr_diag_fail(d, ELDR_ERANGE, "idf.weights[%zu] = %g is negative", i,
                              (double)a->idf[i]);
    }
  }
  if (!a->mask) return eldr_diag_fail(d, ELDR_EINVAL, "layer_mask missing");
  size_t nmask = 0;
  for (size_t l = 0; l < L; l++) nmask += a->mask[l] ? 1 : 0;
  if (nmask == 0) return eldr_diag_fail(d, ELDR_ERANGE, "layer_mask: empty (no layer selected)");
  if (a->dim != nmask * E)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "centroids: dimension %zu != |layer_mask| %zu * num_experts %zu",
                          a->dim, nmask, E);
  if (a->k == 0) return eldr_diag_fail(d, ELDR_ESHAPE, "centroids: none (k = 0)");
  if (!a->centroids) return eldr_diag_fail(d, ELDR_EINVAL, "centroids missing");
  for (size_t c = 0; c < a->k; c++) {
    const float *row = a->centroids + c * a->dim;
    double ss = 0;
    for (size_t j = 0; j < a->dim; j++) {
      if (!isfinite(row[j]))
        return eldr_diag_fail(d, ELDR_ERANGE, "centroids[%zu][%zu] is not finite (%g)", c, j,
                              (double)row[j]);
      ss += (double)row[j] * row[j];
    }
    double norm = sqrt(ss);
    if (!(fabs(norm - 1.0) <= NORM_TOL))
      return eldr_diag_fail(d, ELDR_ERANGE,
                            "centroids[%zu]: L2 norm %.6g, expected 1 (tolerance %g)", c, norm,
                            NORM_TOL);
  }
  if (!(a->tau >= 0.0 && a->tau <= 2.0))
    return eldr_diag_fail(d, ELDR_ERANGE, "tau: %g outside [0, 2]", a->tau);
  if (isinf(a->fit_rho) || (!isnan(a->fit_rho) && fabs(a->fit_rho) > 1.0 + 1e-9))
    return eldr_diag_fail(d, ELDR_ERANGE, "fit.rho: %g outside [-1, 1]", a->fit_rho);
  if (a->fit_n > (size_t)INT64_MAX)
    return eldr_diag_fail(d, ELDR_ERANGE, "fit.n: %zu too large", a->fit_n);
  if (!a->cluster_sizes) return eldr_diag_fail(d, ELDR_EINVAL, "fit.cluster_sizes missing");
  for (size_t c = 0; c < a->k; c++)
    if (a->cluster_sizes[c] > (size_t)INT64_MAX)
      return eldr_diag_fail(d, ELDR_ERANGE, "fit.cluster_sizes[%zu]: %zu too large", c,
                            a->cluster_sizes[c]);
  if ((rc = eldr__artifact_placement_validate(a, d))) return rc;
  if (a->drift_ref) {
    if (a->drift_ref->k != a->k)
      return eldr_diag_fail(d, ELDR_ESHAPE, "fit.drift_ref.nearest_share: %zu entries, expected k = %zu",
                            a->drift_ref->k, a->k);
    if ((rc = eldr_drift_ref_validate(a->drift_ref, d))) return rc;
  }
  if ((rc = validate_fp_prior(a, d))) return rc;
  if (a->latency) {
    if ((rc = eldr_latency_validate(a->latency, d))) {
      eldr_diag_prefix(d, "latency");
      return rc;
    }
    const eldr_shape *ls = &a->latency->shape;
    if (ls->num_layers != a->shape.num_layers || ls->num_experts != a->shape.num_experts ||
        ls->top_k != a->shape.top_k)
      return eldr_diag_fail(d, ELDR_ESHAPE,
                            "latency: shape %u x %u top-%u differs from the model's %u x %u top-%u",
                            ls->num_layers, ls->num_experts, ls->top_k, a->shape.num_layers,
                            a->shape.num_experts, a->shape.top_k);
  }
  return ELDR_OK;
}

/* The footprint prior: rates in [0, 1], each layer summing to K. */
static int validate_fp_prior(const eldr_artifact *a, eldr_diag *d) {
  if (!a->fp_prior) return ELDR_OK;
  if (!(a->fp_prior_tokens > 0) || !(a->fp_prior_tokens < 1e9))
    return eldr_diag_fail(d, ELDR_ERANGE, "footprint.prior_tokens: %g must be in (0, 1e9)",
                          a->fp_prior_tokens);
  if (a->fp_n_priors != 1 && a->fp_n_priors != 1 + a->k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "footprint: %zu prior rows, expected 1 or 1 + k = %zu",
                          a->fp_n_priors, 1 + a->k);
  const size_t L = a->shape.num_layers, E = a->shape.num_experts;
  for (size_t r = 0; r < a->fp_n_priors; r++)
    for (size_t l = 0; l < L; l++) {
      const char *what = r ? "footprint.cluster_priors" : "footprint.prior";
      const float *row = a->fp_prior + (r * L + l) * E;
      double s = 0;
      for (size_t e = 0; e < E; e++) {
        if (!(row[e] >= 0.0f && row[e] <= 1.0f))
          return eldr_diag_fail(d, ELDR_ERANGE, "%s[%zu]: value %g at layer %zu must be in [0, 1]",
                                what, r ? r - 1 : 0, (double)row[e], l);
        s += row[e];
      }
      if (fabs(s - a->shape.top_k) > 1e-3 * a->shape.top_k)
        return eldr_diag_fail(d, ELDR_ERANGE, "%s[%zu]: layer %zu sums to %g, not top_k %u", what,
                              r ? r - 1 : 0, l, s, a->shape.top_k);
    }
  return ELDR_OK;
}

int eldr_artifact_set_fp_prior(eldr_artifact *a, const float *prior, size_t n_priors,
                               double tokens, eldr_diag *d) {
  if (!a) return eldr_diag_fail(d, ELDR_EINVAL, "artifact missing");
  if (!prior) {
    free(a->fp_prior);
    a->fp_prior = NULL;
    a->fp_n_priors = 0;
    a->fp_prior_tokens = 0;
    return ELDR_OK;
  }
  const size_t LE = eldr_shape_cells(&a->shape);
  if (n_priors != 1 && n_priors != 1 + a->k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "footprint: %zu prior rows, expected 1 or 1 + k = %zu",
                          n_priors, 1 + a->k);
  float *c = malloc(n_priors * LE * sizeof *c);
  if (!c) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  memcpy(c, prior, n_priors * LE * sizeof *c);
  float *old = a->fp_prior;
  double old_t = a->fp_prior_tokens;
  size_t old_n = a->fp_n_priors;
  a->fp_prior = c;
  a->fp_n_priors = n_priors;
  a->fp_prior_tokens = tokens;
  int rc = validate_fp_prior(a, d);
  if (rc) {
    a->fp_prior = old;
    a->fp_n_priors = old_n;
    a->fp_prior_tokens = old_t;
    free(c);
    return rc;
  }
  free(old);
  return ELDR_OK;
}

void eldr_artifact_sigspec(const eldr_artifact *a, eldr_sigspec *spec) {
  if (!a || !spec) return;
  spec->shape = a->shape;
  spec->repr = a->repr;
  spec->idf = a->idf_enabled ? a->idf : NULL;
  spec->mask = a->mask;
}

int eldr_artifact_set_latency(eldr_artifact *a, const eldr_latency_model *m, eldr_diag *d) {
  if (!a) return eldr_diag_fail(d, ELDR_EINVAL, "artifact missing");
  if (!m) {
    free(a->latency);
    a->latency = NULL;
    return ELDR_OK;
  }
  eldr_latency_model *c = malloc(sizeof *c);
  if (!c) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  *c = *m;
  eldr_latency_model *old = a->latency;
  a->latency = c;
  int rc = eldr_artifact_validate(a, d);
  if (rc) {
    a->latency = old;
    free(c);
    return rc;
  }
  free(old);
  return ELDR_OK;
}

const char *eldr_fit_evidence_name(int e) {
  static const char *const names[] = {"unknown", "rho", "named", "prefill_only"};
  return e >= 0 && e < (int)(sizeof names / sizeof *names) ? names[e] : "unknown";
}
