/* signature.c — expert signatures (see include/eldr/signature.h).
 *
 * The build is on the router's hot path: it allocates nothing and is written
 * as flat loops over one layer row (E entries) at a time, with independent
 * partial sums so the compiler can keep them in vector registers.
 */
#include "eldr/signature.h"

#include <math.h>
#include <string.h>

static const char *const repr_names[] = {"count", "binary", "gate", "logit"};

const char *eldr_repr_name(eldr_repr r) {
  if ((unsigned)r < sizeof repr_names / sizeof repr_names[0]) return repr_names[r];
  return "unknown";
}

int eldr_repr_parse(const char *name, eldr_repr *out) {
  if (!name || !out) return ELDR_EINVAL;
  for (unsigned i = 0; i < sizeof repr_names / sizeof repr_names[0]; i++) {
    if (strcmp(name, repr_names[i]) == 0) {
      *out = (eldr_repr)i;
      return ELDR_OK;
    }
  }
  return ELDR_EINVAL;
}

size_t eldr_signature_dim(const eldr_sigspec *spec) {
  if (!spec) return 0;
  size_t layers = spec->shape.num_layers;
  if (spec->mask) {
    layers = 0;
    for (uint32_t l = 0; l < spec->shape.num_layers; l++) layers += spec->mask[l] != 0;
  }
  return layers * spec->shape.num_experts;
}

/* Sum of squares with 8 independent float lanes (vectorisable without
 * reassociation flags), combined in double. */
static double sumsq8(const float *v, size_t n) {
  float acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += v[i + k] * v[i + k];
  double s = 0.0;
  for (; i < n; i++) s += (double)v[i] * v[i];
  for (int k = 0; k < 8; k++) s += acc[k];
  return s;
}

static void scale(float *v, size_t n, float f) {
  for (size_t i = 0; i < n; i++) v[i] *= f;
}

/* One layer row of the representation, IDF applied (w may be NULL). */
static void layer_values(eldr_repr repr, const uint32_t *c, const float *g, const float *w,
                         size_t E, float *o) {
  switch (repr) {
  case ELDR_REPR_COUNT:
    if (w)
      for (size_t e = 0; e < E; e++) o[e] = (float)c[e] * w[e];
    else
      for (size_t e = 0; e < E; e++) o[e] = (float)c[e];
    break;
  case ELDR_REPR_BINARY:
    if (w)
      for (size_t e = 0; e < E; e++) o[e] = c[e] ? w[e] : 0.0f;
    else
      for (size_t e = 0; e < E; e++) o[e] = c[e] ? 1.0f : 0.0f;
    break;
  case ELDR_REPR_GATE:
    if (w)
      for (size_t e = 0; e < E; e++) o[e] = g[e] * w[e];
    else
      memcpy(o, g, E * sizeof *o);
    break;
  case ELDR_REPR_LOGIT:
    for (size_t e = 0; e < E; e++) o[e] = g[e] > 0.0f ? log1pf(g[e]) : 0.0f;
    if (w)
      for (size_t e = 0; e < E; e++) o[e] *= w[e];
    break;
  }
}

void eldr__signature_layer_values(eldr_repr repr, const uint32_t *c, const float *g,
                                  const float *w, size_t E, float *o) {
  layer_values(repr, c, g, w, E, o);
}

int eldr_signature_build(const eldr_sigspec *spec, const uint32_t *counts,
                         const float *gate_sums, float *out) {
  if (!spec || !counts || !out) return ELDR_EINVAL;
  const eldr_repr repr = spec->repr;
  if ((unsigned)repr > ELDR_REPR_LOGIT) return ELDR_EINVAL;
  const size_t L = spec->shape.num_layers, E = spec->shape.num_experts;
  const int needs_gates = repr == ELDR_REPR_GATE || repr == ELDR_REPR_LOGIT;
  if (needs_gates && !gate_sums) {
    memset(out, 0, eldr_signature_dim(spec) * sizeof *out);
    return ELDR_EUNSUPPORTED;
  }
  float *o = out;
  for (size_t l = 0; l < L; l++) {
    if (spec->mask && !spec->mask[l]) continue;
    layer_values(repr, counts + l * E, needs_gates ? gate_sums + l * E : NULL,
                 spec->idf ? spec->idf + l * E : NULL, E, o);
    o += E;
  }
  const size_t dim = (size_t)(o - out);
  const double ss = sumsq8(out, dim);
  if (!(ss > 0.0)) {
    /* All zero (or NaN from bad gate input): leave a zero vector. */
    memset(out, 0, dim * sizeof *out);
    return ss == 0.0 ? ELDR_EEMPTY : ELDR_ERANGE;
  }
  if (!isfinite(ss)) {
    memset(out, 0, dim * sizeof *out);
    return ELDR_ERANGE;
  }
  scale(out, dim, (float)(1.0 / sqrt(ss)));
  return ELDR_OK;
}

void eldr_idf_compute(const eldr_shape *s, const uint32_t *counts, size_t n, float *idf) {
  const size_t cells = eldr_shape_cells(s);
  /* df accumulated in the output buffer (exact in float up to 2^24 requests;
   * beyond that a double pass per cell would be needed). */
  for (size_t c = 0; c < cells; c++) idf[c] = 0.0f;
  if (n > (1u << 24)) {
    for (size_t c = 0; c < cells; c++) {
      size_t df = 0;
      for (size_t r = 0; r < n; r++) df += counts[r * cells + c] != 0;
      idf[c] = (float)log(((double)n + 1.0) / ((double)df + 1.0));
    }
    return;
  }
  for (size_t r = 0; r < n; r++) {
    const uint32_t *row = counts + r * cells;
    for (size_t c = 0; c < cells; c++) idf[c] += row[c] != 0 ? 1.0f : 0.0f;
  }
  for (size_t c = 0; c < cells; c++)
    idf[c] = (float)log(((double)n + 1.0) / ((double)idf[c] + 1.0));
}

double eldr_dot(const float *a, const float *b, size_t dim) {
  float acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= dim; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
  double s = 0.0;
  for (; i < dim; i++) s += (double)a[i] * b[i];
  for (int k = 0; k < 8; k++) s += acc[k];
  return s;
}

double eldr_cosine(const float *a, const float *b, size_t dim) {
  const double na = eldr_dot(a, a, dim), nb = eldr_dot(b, b, dim);
  if (!(na > 0.0) || !(nb > 0.0)) return 0.0;
  /* sqrt(na * nb), not sqrt(na) * sqrt(nb): identical vectors give exactly 1. */
  return eldr_dot(a, b, dim) / sqrt(na * nb);
}

double eldr_l2_normalize(float *v, size_t dim) {
  const double ss = sumsq8(v, dim);
  const double norm = sqrt(ss);
  if (norm > 0.0 && isfinite(norm)) scale(v, dim, (float)(1.0 / norm));
  return norm;
}
