/* tracegen_phase.c — the distributions of one request phase (see
 * tracegen_int.h): Gaussian logit noise (tracegen_normal.c), per-layer softmax, and Vose alias
 * tables as 16-bit integer columns for the sampler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"
#include "tracegen_int.h"

#define ALIAS_GROUP 4 /* layers whose alias tables are built side by side */

void tracegen_scratch_free(tracegen_scratch *s) {
  free(s->logit);
  free(s->prob);
  free(s->aprob);
  free(s->col);
  free(s->mark);
  free(s->lmark);
  free(s->small);
  free(s->large);
  memset(s, 0, sizeof *s);
}

int tracegen_scratch_init(tracegen_scratch *s, const eldr_shape *sh) {
  size_t cells = eldr_shape_cells(sh);
  memset(s, 0, sizeof *s);
  s->logit = malloc(cells * sizeof *s->logit);
  s->prob = malloc(cells * sizeof *s->prob);
  s->aprob = malloc(cells * sizeof *s->aprob);
  s->col = malloc(cells * sizeof *s->col);
  s->mark = calloc(sh->num_experts, sizeof *s->mark);
  s->lmark = calloc((size_t)TRACEGEN_LANES * sh->num_experts, sizeof *s->lmark);
  s->small = malloc(ALIAS_GROUP * (size_t)sh->num_experts * sizeof *s->small); /* a group of layers */
  s->large = malloc(ALIAS_GROUP * (size_t)sh->num_experts * sizeof *s->large);
  if (!s->logit || !s->prob || !s->aprob || !s->col || !s->mark || !s->lmark || !s->small ||
      !s->large) {
    tracegen_scratch_free(s);
    return ELDR_ENOMEM;
  }
  tracegen_zig_init(&s->zig);
  return 0;
}

/* e^x for x <= 0 in float, for the softmax: 2^(x log2 e) = 2^n 2^f with n
 * the nearest integer and |f| <= 1/2, 2^f by its Taylor polynomial of
 * degree 7 (relative error < 1e-8 before rounding), 2^n in the exponent
 * bits; 0 below 2^-126. Plain + and * (no fused multiply-add in this
 * file): the same numbers on every platform, and a layer's loop
 * vectorizes. */
static inline float exp_neg(float x) {
  const float t = x * 1.44269504f;
  const float tc = t > -126.0f ? t : -126.0f;
  const int n = (int)(tc + 126.5f) - 126; /* nearest integer (the sum is > 0: truncation floors) */
  const float f = tc - (float)n;
  float p = 1.525273380e-05f;
  p = p * f + 1.540353039e-04f;
  p = p * f + 1.333355815e-03f;
  p = p * f + 9.618129108e-03f;
  p = p * f + 5.550410866e-02f;
  p = p * f + 2.402265070e-01f;
  p = p * f + 6.931471806e-01f;
  p = p * f + 1.0f;
  const int32_t bits = (n + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n * (float)(t >= -126.0f); /* a product, not a branch: the loop vectorizes */
}

/* The largest of p[0..E) (E >= 1; no NaN): eight running maxima, so the
 * loop vectorizes. The maximum of a set does not depend on the order it is
 * taken in (a -0 / +0 tie changes no softmax value: x - mx and exp_neg
 * give the same numbers for either zero). */
static float max_of(const float *p, size_t E) {
  float mx = p[0];
  size_t e = 1;
  if (E >= 16) {
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = p[j];
    for (e = 8; e + 8 <= E; e += 8)
      for (int j = 0; j < 8; j++) m[j] = p[e + j] > m[j] ? p[e + j] : m[j];
    mx = m[0];
    for (int j = 1; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
  }
  for (; e < E; e++) mx = p[e] > mx ? p[e] : mx;
  return mx;
}

/* pl[0..E) := softmax(pl) (float, summed in double in expert order). */
static void softmax(float *pl, size_t E) {
  const float mx = max_of(pl, E);
  for (size_t e = 0; e < E; e++) pl[e] = exp_neg(pl[e] - mx);
  double sum = 0;
  for (size_t e = 0; e < E; e++) sum += pl[e];
  float inv = (float)(1.0 / sum);
  for (size_t e = 0; e < E; e++) pl[e] *= inv;
}

/* Vose's alias method on pl[0..E) into the columns col (see
 * tracegen_scratch). A column whose threshold would be 65536 (always kept)
 * gets itself as alias and threshold 65535: the draw is the column either
 * way, and the threshold fits 16 bits.
 *
 * One layer's construction is a chain of dependent loads and float adds, so
 * ALIAS_GROUP layers are built side by side (alias_group): their steps
 * interleave in one loop while all have work, and each runs exactly the
 * steps it would alone (the layers share no memory), so the tables are the
 * same. */
typedef struct vose {
  const float *pl;
  float *ap;
  uint32_t *small, *large, *col;
  size_t ns, nl;
} vose;

static inline __attribute__((always_inline)) void vose_init(vose *v, uint32_t E) {
  size_t ns = 0, nl = 0; /* an expert goes on both stacks; one of them keeps it (no branch) */
  for (uint32_t e = 0; e < E; e++) {
    v->ap[e] = v->pl[e] * (float)E;
    const size_t sm = v->ap[e] < 1.0f;
    v->small[ns] = e;
    v->large[nl] = e;
    ns += sm;
    nl += 1 - sm;
  }
  v->ns = ns;
  v->nl = nl;
}

/* One pairing: the top small column takes its alias from the top large one. */
static inline __attribute__((always_inline)) void vose_step(float *restrict ap,
                                                            uint32_t *restrict small,
                                                            uint32_t *restrict large,
                                                            uint32_t *restrict col, size_t *ns,
                                                            size_t *nl) {
  uint32_t a = small[--*ns], b = large[--*nl];
  col[a] = b << 16;
  ap[b] = (ap[b] + ap[a]) - 1.0f;
  const size_t sm = ap[b] < 1.0f;
  small[*ns] = b;
  large[*nl] = b;
  *ns += sm;
  *nl += 1 - sm;
}

static inline __attribute__((always_inline)) void vose_finish(vose *v, uint32_t E) {
  float *ap = v->ap;
  uint32_t *col = v->col;
  while (v->nl) ap[v->large[--v->nl]] = 1.0f;
  while (v->ns) ap[v->small[--v->ns]] = 1.0f;
  /* u / 65536 < ap  <=>  u < ap * 65536 (exact: a power-of-two scale)
   * <=>  u < ceil(ap * 65536) for an integer u */
  for (uint32_t e = 0; e < E; e++) {
    const float x = ap[e] * 65536.0f; /* >= 0, < 2^24: t is ceilf(x), without a libm call */
    uint32_t t = (uint32_t)x;
    t += (float)t < x;
    col[e] = t >= 65536 ? (e << 16) | 0xffffu : (col[e] & 0xffff0000u) | t;
  }
}

/* n layers' tables (n a constant, 1..ALIAS_GROUP): the steps of all n
 * interleave while each has a pairing to make, then each finishes alone. */
static inline __attribute__((always_inline)) void alias_group(vose *v, const int n, uint32_t E) {
  size_t ns[ALIAS_GROUP], nl[ALIAS_GROUP];
  _Pragma("GCC unroll 4") for (int g = 0; g < n; g++) {
    vose_init(&v[g], E);
    ns[g] = v[g].ns;
    nl[g] = v[g].nl;
  }
  for (;;) {
    int all = 1;
    _Pragma("GCC unroll 4") for (int g = 0; g < n; g++) all &= ns[g] && nl[g];
    if (!all) break;
    _Pragma("GCC unroll 4") for (int g = 0; g < n; g++)
      vose_step(v[g].ap, v[g].small, v[g].large, v[g].col, &ns[g], &nl[g]);
  }
  _Pragma("GCC unroll 4") for (int g = 0; g < n; g++) {
    while (ns[g] && nl[g]) vose_step(v[g].ap, v[g].small, v[g].large, v[g].col, &ns[g], &nl[g]);
    v[g].ns = ns[g];
    v[g].nl = nl[g];
    vose_finish(&v[g], E);
  }
}

void tracegen_build_phase(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r, double sd) {
  tracegen_build_phase_scaled(sh, s, r, sd, 1.0f);
}

void tracegen_build_phase_scaled(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r, double sd,
                                 float scale) {
  const size_t L = sh->num_layers, E = sh->num_experts;
  float *p = s->prob;
  memcpy(p, s->logit, L * E * sizeof *p);
  if (scale != 1.0f)
    for (size_t i = 0; i < L * E; i++) p[i] *= scale;
  if (sd > 0) tracegen_fill_normal(&s->zig, r, p, L * E, (float)sd, 1);
  for (size_t l = 0; l < L; l++) softmax(p + l * E, E);
  vose v[ALIAS_GROUP];
  for (size_t l = 0; l < L; l += ALIAS_GROUP) {
    const size_t n = L - l < ALIAS_GROUP ? L - l : ALIAS_GROUP;
    for (size_t g = 0; g < n; g++)
      v[g] = (vose){p + (l + g) * E, s->aprob + (l + g) * E, s->small + g * E, s->large + g * E,
                    s->col + (l + g) * E, 0, 0};
    switch (n) {
    case 4: alias_group(v, 4, (uint32_t)E); break;
    case 3: alias_group(v, 3, (uint32_t)E); break;
    case 2: alias_group(v, 2, (uint32_t)E); break;
    default: alias_group(v, 1, (uint32_t)E); break;
    }
  }
}
