/* tracegen_phase.c — the distributions of one request phase (see
 * tracegen_int.h): Gaussian logit noise, per-layer softmax, and Vose alias
 * tables as 16-bit integer columns for the sampler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"
#include "tracegen_int.h"

void tracegen_scratch_free(tracegen_scratch *s) {
  free(s->logit);
  free(s->prob);
  free(s->aprob);
  free(s->col);
  free(s->mark);
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
  s->small = malloc(sh->num_experts * sizeof *s->small);
  s->large = malloc(sh->num_experts * sizeof *s->large);
  if (!s->logit || !s->prob || !s->aprob || !s->col || !s->mark || !s->small ||
      !s->large) {
    tracegen_scratch_free(s);
    return ELDR_ENOMEM;
  }
  return 0;
}

void tracegen_fill_normal(eldr_rng *r, float *v, size_t n, float scale, int add) {
  size_t i = 0;
  while (i < n) {
    double u1 = eldr_rng_bits_to_unit(eldr_rng_next(r));
    double u2 = eldr_rng_bits_to_unit(eldr_rng_next(r));
    if (u1 < 1e-300) u1 = 1e-300;
    double rad = sqrt(-2.0 * log(u1)) * scale, th = 6.283185307179586 * u2;
    float a = (float)(rad * cos(th)), b = (float)(rad * sin(th));
    if (add) {
      v[i++] += a;
      if (i < n) v[i++] += b;
    } else {
      v[i++] = a;
      if (i < n) v[i++] = b;
    }
  }
}

/* pl[0..E) := softmax(pl) (float, summed in double in expert order). */
static void softmax(float *pl, size_t E) {
  float mx = pl[0];
  for (size_t e = 1; e < E; e++) mx = pl[e] > mx ? pl[e] : mx;
  double sum = 0;
  for (size_t e = 0; e < E; e++) {
    pl[e] = expf(pl[e] - mx);
    sum += pl[e];
  }
  float inv = (float)(1.0 / sum);
  for (size_t e = 0; e < E; e++) pl[e] *= inv;
}

/* Vose's alias method on pl[0..E) into the columns col (see
 * tracegen_scratch). A column whose threshold would be 65536 (always kept)
 * gets itself as alias and threshold 65535: the draw is the column either
 * way, and the threshold fits 16 bits. */
static void alias_table(const float *pl, uint32_t E, float *ap, uint32_t *small, uint32_t *large,
                        uint32_t *col) {
  size_t ns = 0, nl = 0;
  for (uint32_t e = 0; e < E; e++) {
    ap[e] = pl[e] * (float)E;
    if (ap[e] < 1.0f)
      small[ns++] = e;
    else
      large[nl++] = e;
  }
  while (ns && nl) {
    uint32_t a = small[--ns], b = large[--nl];
    col[a] = b << 16;
    ap[b] = (ap[b] + ap[a]) - 1.0f;
    if (ap[b] < 1.0f)
      small[ns++] = b;
    else
      large[nl++] = b;
  }
  while (nl) ap[large[--nl]] = 1.0f;
  while (ns) ap[small[--ns]] = 1.0f;
  /* u / 65536 < ap  <=>  u < ap * 65536 (exact: a power-of-two scale)
   * <=>  u < ceil(ap * 65536) for an integer u */
  for (uint32_t e = 0; e < E; e++) {
    uint32_t t = (uint32_t)ceilf(ap[e] * 65536.0f);
    col[e] = t >= 65536 ? (e << 16) | 0xffffu : (col[e] & 0xffff0000u) | t;
  }
}

void tracegen_build_phase(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r, double sd) {
  const size_t L = sh->num_layers, E = sh->num_experts;
  float *p = s->prob;
  memcpy(p, s->logit, L * E * sizeof *p);
  if (sd > 0) tracegen_fill_normal(r, p, L * E, (float)sd, 1);
  for (size_t l = 0; l < L; l++) {
    softmax(p + l * E, E);
    alias_table(p + l * E, (uint32_t)E, s->aprob + l * E, s->small, s->large, s->col + l * E);
  }
}
