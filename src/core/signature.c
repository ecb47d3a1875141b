/* signature.c — expert signatures (see include/eldr/signature.h).
 *
 * The build is on the router's hot path: it allocates nothing and runs three
 * flat passes over the output (values per layer row, sum of squares, scale),
 * each written with 4-wide generic vectors (GCC/clang vector extensions,
 * portable across targets) because neither compiler vectorises these loops
 * reliably at -O2; a plain C fallback computes identical values.
 */
#include "eldr/signature.h"

#include "core/signature_int.h"

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

#if defined(__GNUC__) && !defined(ELDR_NO_VECTOR_EXT) /* GCC and clang: generic vectors */
#define SIG_VEC 1
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
static inline v4f ld4f(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline v4i ld4i(const uint32_t *p) {
  v4i v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void st4f(float *p, v4f v) { memcpy(p, &v, sizeof v); }
#endif

/* Sum of squares and dot product with 8 independent float lanes (two
 * 4-wide vectors; GCC and clang vectorise neither the plain reduction nor,
 * reliably, an 8-lane array at -O2), combined in double. The fallback
 * without vector extensions computes the same lanes in the same order. */
static double sumsq8(const float *v, size_t n) {
  float acc[8] = {0};
  size_t i = 0;
#ifdef SIG_VEC
  v4f a0 = {0, 0, 0, 0}, a1 = {0, 0, 0, 0};
  for (; i + 8 <= n; i += 8) {
    const v4f x = ld4f(v + i), y = ld4f(v + i + 4);
    a0 += x * x;
    a1 += y * y;
  }
  memcpy(acc, &a0, sizeof a0);
  memcpy(acc + 4, &a1, sizeof a1);
#else
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += v[i + k] * v[i + k];
#endif
  double s = 0.0;
  for (; i < n; i++) s += (double)v[i] * v[i];
  for (int k = 0; k < 8; k++) s += acc[k];
  return s;
}

static void scale_by(float *v, const float *w, size_t n) {
  size_t i = 0;
#ifdef SIG_VEC
  for (; i + 4 <= n; i += 4) st4f(v + i, ld4f(v + i) * ld4f(w + i));
#endif
  for (; i < n; i++) v[i] *= w[i];
}

static void scale(float *v, size_t n, float f) {
  size_t i = 0;
#ifdef SIG_VEC
  const v4f fv = {f, f, f, f};
  for (; i + 4 <= n; i += 4) st4f(v + i, ld4f(v + i) * fv);
#endif
  for (; i < n; i++) v[i] *= f;
}

/* Whether every count is < 2^31 (OR-reduction, vectorised). */
static int fits_int32(const uint32_t *c, size_t n) {
  uint32_t acc[8] = {0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] |= c[i + k];
  uint32_t all = 0;
  for (; i < n; i++) all |= c[i];
  for (int k = 0; k < 8; k++) all |= acc[k];
  return (all >> 31) == 0;
}

/* One layer row of the representation, IDF applied (w may be NULL).
 * GCC at -O2 does not vectorise loops of unknown length, so the common
 * cases use 4-wide generic vectors explicitly; the scalar tails (and the
 * fallback without vector extensions) compute the very same values. */
static void layer_values(eldr_repr repr, const uint32_t *c, const float *g, const float *w,
                         size_t E, float *o) {
  size_t e = 0;
  switch (repr) {
  case ELDR_REPR_COUNT:
    /* Signed conversion vectorises on every x86-64 (unsigned does not);
     * counts >= 2^31 (impossible in practice) take the exact scalar path. */
    if (!fits_int32(c, E)) {
      for (; e < E; e++) o[e] = (float)c[e] * (w ? w[e] : 1.0f);
      break;
    }
#ifdef SIG_VEC
    if (w)
      for (; e + 4 <= E; e += 4) st4f(o + e, __builtin_convertvector(ld4i(c + e), v4f) * ld4f(w + e));
    else
      for (; e + 4 <= E; e += 4) st4f(o + e, __builtin_convertvector(ld4i(c + e), v4f));
#endif
    for (; e < E; e++) o[e] = (float)(int32_t)c[e] * (w ? w[e] : 1.0f);
    break;
  case ELDR_REPR_BINARY: {
#ifdef SIG_VEC
    const v4i zero = {0, 0, 0, 0};
    const v4f one = {1.0f, 1.0f, 1.0f, 1.0f};
    for (; e + 4 <= E; e += 4) {
      const v4i nz = ld4i(c + e) != zero; /* -1 where c != 0 */
      const v4f v = w ? ld4f(w + e) : one;
      st4f(o + e, (v4f)((v4i)v & nz));
    }
#endif
    for (; e < E; e++) o[e] = c[e] ? (w ? w[e] : 1.0f) : 0.0f;
    break;
  }
  case ELDR_REPR_GATE:
    if (w) {
#ifdef SIG_VEC
      for (; e + 4 <= E; e += 4) st4f(o + e, ld4f(g + e) * ld4f(w + e));
#endif
      for (; e < E; e++) o[e] = g[e] * w[e];
    } else {
      memcpy(o, g, E * sizeof *o);
    }
    break;
  case ELDR_REPR_LOGIT:
    for (e = 0; e < E; e++) o[e] = g[e] > 0.0f ? log1pf(g[e]) : 0.0f;
    if (w) scale_by(o, w, E);
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
#ifdef SIG_VEC
  v4f a0 = {0, 0, 0, 0}, a1 = {0, 0, 0, 0};
  for (; i + 8 <= dim; i += 8) {
    a0 += ld4f(a + i) * ld4f(b + i);
    a1 += ld4f(a + i + 4) * ld4f(b + i + 4);
  }
  memcpy(acc, &a0, sizeof a0);
  memcpy(acc + 4, &a1, sizeof a1);
#else
  for (; i + 8 <= dim; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
#endif
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
