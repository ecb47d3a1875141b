/* footprint.c — per-decoder live expert footprints and the predicted added
 * cost of a request (see include/eldr/footprint.h, docs/footprint.md). */
#include "eldr/footprint.h"

#include "core/footprint_int.h"
#include "eldr/cpu.h"
#include "eldr/dot.h"
#include "eldr/policy.h"
#include "core/fp_math_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* Per layer l with mask[l]: out[l] = sum_e q[l*E+e] * p[l*E+e]. Eight float
 * lanes, lane j summing the products at e = j mod 8, then lanes j and j+4
 * added, the four reduced as ((0+2)+(1+3)), plus the tail summed in order: the
 * same bits from the baseline (two 4-lane halves) and the AVX kernel (one
 * 8-lane vector, footprint_avx2.c), picked at run time where eldr/cpu.h
 * allows AVX2. Never contracted into FMA. */
typedef void (*dots_fn)(const float *q, const float *p, size_t L, size_t E, const uint8_t *mask,
                        float *out);

static void dots_base(const float *q, const float *p, size_t L, size_t E, const uint8_t *mask,
                      float *out) {
  for (size_t l = 0; l < L; l++)
    if (mask[l]) out[l] = eldr_dot_lanes8(q + l * E, p + l * E, E);
}

/* Picked once per footprint, at its creation. */
static dots_fn pick_dots(void) {
#ifdef ELDR_FP_X86
  if (eldr_cpu_has(ELDR_CPU_AVX2)) return eldr__fp_dots_avx;
#endif
  return dots_base;
}

/* A routed request: what its contributions are computed from (its counts
 * on the mask's layers, sparse; its tokens; its prior row), so that its end
 * recomputes exactly the integers its route added. */
typedef struct ticket {
  uint32_t dec, nnz, ctx, gen, ntok, row;
  uint32_t *idx; /* nnz flat (l*E + e) cells with a count, ascending */
  uint32_t *cnt; /* their counts */
  int used, uniform;
  size_t next_free;
} ticket;

struct eldr_footprint {
  eldr_latency_model m;
  size_t L, E, K, D, B;
  uint8_t *mask;     /* L flags: layers whose profile comes from the request's counts */
  uint8_t *tracked;  /* L flags: layers in the footprint (the mask's, every one with a prior) */
  float *prior;      /* n_priors * L*E prior rates (row 0 the global prior), or NULL */
  size_t n_priors;
  double alpha;      /* the prior's weight (pseudo-tokens), 0 without a prior */
  double own_w;      /* the own time's weight in the cost (eldr_footprint_opts.own_weight; 1 by default) */
  float *cent;       /* (n_priors - 1) * dim centroids picking a request's row, or NULL */
  double home_w;     /* eldr_footprint_opts.home_weight (0: no home term) */
  float *home;       /* D * dim: decoder k's centroid (the home term), or NULL */
  double *hs;        /* D scratch: the request's similarity to each home centroid */
  size_t dim;
  const float *row_sig; /* the signature whose row was last picked, and the row */
  size_t row;
  int64_t *acc;      /* D*L*E fixed-point sums of -ln(1-p) */
  float *q;          /* D*L*E: exp(-acc / SCALE) */
  double *U;         /* D*L: sum_e (1 - q) */
  uint64_t *ctx;     /* D: prompt tokens in flight */
  size_t *inflight;  /* D */
  float *p;          /* L*E scratch: the request's profile */
  double *u0, *u1;   /* L scratch */
  float *dots;       /* L scratch */
  dots_fn dots_k;
  uint8_t *touched;  /* L scratch */
  uint32_t *w;       /* L*E scratch: a request's fixed-point contributions */
  uint32_t *cnt;     /* L*E scratch: an ending request's counts */
  uint32_t *tidx;    /* L*E scratch: eldr_footprint_ticket's cells (with f->w their weights) */
  eldr_fp_explain last;
  ticket *tk;
  size_t ntk, cap, free_head;
};

#define NO_FREE SIZE_MAX

int eldr_footprint_new(const eldr_latency_model *m, const eldr_footprint_opts *o,
                       eldr_footprint **out, eldr_diag *d) {
  if (out) *out = NULL;
  if (!m || !o || !out) return eldr_diag_fail(d, ELDR_EINVAL, "footprint: NULL argument");
  if (o->n_decoders == 0 || o->n_decoders > 4096)
    return eldr_diag_fail(d, ELDR_EINVAL, "footprint: %zu decoders (need 1..4096)", o->n_decoders);
  if (!(o->own_weight >= 0 && o->own_weight <= 100)) /* NaN fails both */
    return eldr_diag_fail(d, ELDR_EINVAL, "footprint: own-time weight %g (need 0..100; 0: the default 1)",
                          o->own_weight);
  if (!(o->home_weight >= 0 && o->home_weight <= 100))
    return eldr_diag_fail(d, ELDR_EINVAL, "footprint: home weight %g (need 0..100; 0: off)", o->home_weight);
  if (o->home_weight > 0 && (!o->home_centroids || !o->dim))
    return eldr_diag_fail(d, ELDR_EINVAL, "footprint: a home weight needs one centroid per decoder (%zu)",
                          o->n_decoders);
  int rc = eldr_latency_validate(m, d);
  if (rc < 0) return rc;
  eldr_footprint *f = calloc(1, sizeof *f);
  if (!f) return eldr_diag_fail(d, ELDR_ENOMEM, "footprint: out of memory");
  f->m = *m;
  f->L = m->shape.num_layers;
  f->E = m->shape.num_experts;
  f->K = m->shape.top_k;
  f->D = o->n_decoders;
  f->B = o->max_batch ? o->max_batch : 64;
  f->own_w = o->own_weight > 0 ? o->own_weight : 1.0;
  const size_t LE = f->L * f->E, D = f->D;
  f->mask = malloc(f->L);
  f->tracked = malloc(f->L);
  f->acc = calloc(D * LE, sizeof *f->acc);
  f->q = malloc(D * LE * sizeof *f->q);
  f->U = calloc(D * f->L, sizeof *f->U);
  f->ctx = calloc(D, sizeof *f->ctx);
  f->inflight = calloc(D, sizeof *f->inflight);
  f->p = malloc(LE * sizeof *f->p);
  f->u0 = malloc(f->L * sizeof *f->u0);
  f->u1 = malloc(f->L * sizeof *f->u1);
  f->touched = malloc(f->L);
  f->w = malloc(LE * sizeof *f->w);
  f->cnt = malloc(LE * sizeof *f->cnt);
  f->tidx = malloc(LE * sizeof *f->tidx);
  f->dots = malloc(f->L * sizeof *f->dots);
  f->dots_k = pick_dots();
  if (!f->dots || !f->mask || !f->tracked || !f->w || !f->cnt || !f->tidx || !f->acc || !f->q || !f->U || !f->ctx || !f->inflight || !f->p || !f->u0 ||
      !f->u1 || !f->touched) {
    eldr_footprint_free(f);
    return eldr_diag_fail(d, ELDR_ENOMEM, "footprint: out of memory");
  }
  for (size_t l = 0; l < f->L; l++) f->mask[l] = o->layer_mask ? (o->layer_mask[l] != 0) : 1;
  for (size_t i = 0; i < D * LE; i++) f->q[i] = 1.0f;
  if (o->prior && o->prior_tokens > 0) {
    const size_t np = o->n_priors ? o->n_priors : 1;
    if (!(o->prior_tokens < 1e9) || np > 65536) {
      eldr_footprint_free(f);
      return eldr_diag_fail(d, ELDR_ERANGE, "footprint: prior weight %g or %zu priors out of range",
                            o->prior_tokens, np);
    }
    for (size_t i = 0; i < np * LE; i++)
      if (!(o->prior[i] >= 0.0f && o->prior[i] <= 1.0f)) {
        eldr_footprint_free(f);
        return eldr_diag_fail(d, ELDR_ERANGE, "footprint: prior rate %zu = %g not in [0, 1]", i,
                              (double)o->prior[i]);
      }
    f->prior = malloc(np * LE * sizeof *f->prior);
    if (!f->prior) {
      eldr_footprint_free(f);
      return eldr_diag_fail(d, ELDR_ENOMEM, "footprint: out of memory");
    }
    memcpy(f->prior, o->prior, np * LE * sizeof *f->prior);
    f->n_priors = np;
    f->alpha = o->prior_tokens;
    if (np > 1) {
      if (!o->centroids || !o->dim) {
        eldr_footprint_free(f);
        return eldr_diag_fail(d, ELDR_EINVAL, "footprint: %zu cluster priors without centroids", np - 1);
      }
      if (!(f->cent = malloc((np - 1) * o->dim * sizeof *f->cent))) {
        eldr_footprint_free(f);
        return eldr_diag_fail(d, ELDR_ENOMEM, "footprint: out of memory");
      }
      memcpy(f->cent, o->centroids, (np - 1) * o->dim * sizeof *f->cent);
      f->dim = o->dim;
    }
  }
  if (o->home_weight > 0) {
    f->home = malloc(D * o->dim * sizeof *f->home);
    f->hs = malloc(D * sizeof *f->hs);
    if (!f->home || !f->hs) {
      eldr_footprint_free(f);
      return eldr_diag_fail(d, ELDR_ENOMEM, "footprint: out of memory");
    }
    memcpy(f->home, o->home_centroids, D * o->dim * sizeof *f->home);
    f->home_w = o->home_weight;
    f->dim = o->dim;
  }
  for (size_t l = 0; l < f->L; l++) f->tracked[l] = f->mask[l] || f->prior;
  f->free_head = NO_FREE;
  f->last.decoder = -1;
  *out = f;
  return 0;
}

void eldr_footprint_free(eldr_footprint *f) {
  if (!f) return;
  for (size_t i = 0; i < f->ntk; i++) {
    free(f->tk[i].idx);
    free(f->tk[i].cnt);
  }
  free(f->tk);
  free(f->dots);
  free(f->touched);
  free(f->w);
  free(f->cnt);
  free(f->tidx);
  free(f->u1);
  free(f->u0);
  free(f->p);
  free(f->inflight);
  free(f->ctx);
  free(f->U);
  free(f->q);
  free(f->acc);
  free(f->mask);
  free(f->prior);
  free(f->cent);
  free(f->home);
  free(f->hs);
  free(f->tracked);
  free(f);
}

/* The prior row of request r: its nearest centroid's (1 + c), or the
 * global prior (0) without cluster priors or a signature. A decision keeps
 * its pick (reuse 0), which the route right after it takes (reuse 1; the
 * same signature pointer), then forgets. */
static size_t pick_row(eldr_footprint *f, const eldr_fp_request *r, int reuse) {
  size_t row = 0;
  if (f->cent && r && r->sig) {
    if (reuse && r->sig == f->row_sig) {
      row = f->row;
    } else {
      float best = 0;
      for (size_t c = 0; c + 1 < f->n_priors; c++) {
        float v = eldr_dot_lanes8(r->sig, f->cent + c * f->dim, f->dim);
        if (c == 0 || v > best) best = v, row = c + 1;
      }
      if (!(best == best)) row = 0; /* NaN similarities: an unusable signature */
      f->row_sig = r->sig;
      f->row = row;
    }
  }
  return row;
}

/* A request's per-token selection probabilities on the footprint layers
 * (0 elsewhere) into f->p: on the mask's layers from its counts over
 * n_tokens (shrunk towards prior row `row` when there are priors), on the
 * others its prior. Returns 1 for the uniform profile (no counts). */
static int build_profile(eldr_footprint *f, const uint32_t *counts, uint32_t n_tokens, size_t row) {
  const size_t L = f->L, E = f->E;
  int uniform = !counts || n_tokens == 0;
  const float pu = (float)((double)f->K / (double)E);
  /* counts <= tokens < 2^31 (a prompt); a float product (no division per cell)
   * keeps the loop vectorisable; p is a prediction input, 24 bits suffice */
  const float inv = uniform ? 0.0f : (float)(1.0 / (double)n_tokens);
  const float pmax = (float)ELDR_FP_PMAX;
  const float *prior = f->prior ? f->prior + row * L * E : NULL;
  for (size_t l = 0; l < L; l++) {
    float *pl = f->p + l * E;
    if (prior && (uniform || !f->mask[l])) {
      memcpy(pl, prior + l * E, E * sizeof *pl);
      continue;
    }
    if (!f->mask[l]) {
      memset(pl, 0, E * sizeof *pl);
      continue;
    }
    if (uniform) {
      for (size_t e = 0; e < E; e++) pl[e] = pu;
      continue;
    }
    const uint32_t *cl = counts + l * E;
    if (prior) { /* shrunk towards the prior: (c + alpha pi) / (n + alpha) */
      const float a = (float)f->alpha, ia = (float)(1.0 / ((double)n_tokens + f->alpha));
      const float *pr = prior + l * E;
      for (size_t e = 0; e < E; e++) {
        float x = ((float)(int32_t)cl[e] + a * pr[e]) * ia;
        pl[e] = x < pmax ? x : pmax;
      }
      continue;
    }
    size_t e = 0;
    const v4f vinv = {inv, inv, inv, inv}, vmax = {pmax, pmax, pmax, pmax};
    for (; e + 4 <= E; e += 4) { /* four lanes: convert, scale, clamp */
      v4i c;
      memcpy(&c, cl + e, sizeof c);
      v4f x = __builtin_convertvector(c, v4f) * vinv;
      v4i lt = x < vmax;
      v4i y = ((v4i)x & lt) | ((v4i)vmax & ~lt);
      memcpy(pl + e, &y, sizeof y);
    }
    for (; e < E; e++) {
      float x = (float)(int32_t)cl[e] * inv;
      pl[e] = x < pmax ? x : pmax;
    }
  }
  return uniform;
}

static double uniform_union(const eldr_footprint *f, size_t batch) {
  return eldr_latency_expected_union(&f->m.shape, batch);
}

int eldr_footprint_decide(eldr_footprint *f, const uint32_t *loads, const uint8_t *healthy,
                          size_t n, const eldr_fp_request *r, int *uniform, double *pred_tpot) {
  if (!f || !loads || n != f->D) return ELDR_EINVAL;
  int uni = build_profile(f, r ? r->counts : NULL, r ? r->n_tokens : 0, pick_row(f, r, 0));
  if (uniform) *uniform = uni;
  const size_t L = f->L, E = f->E, LE = L * E, B = f->B;
  const double c_new = r ? (double)r->ctx_tokens : 0.0;
  int best = -1;
  double best_cost = 0, best_t = 0;
  /* a full decoder (B in flight) queues a new request until a member ends:
   * a wait the per-token cost below does not see; none is chosen while a
   * healthy decoder has a free batch slot */
  int room = 0;
  for (size_t k = 0; k < n && !room; k++) room = (!healthy || healthy[k]) && loads[k] < B;
  /* the home term: the request's similarity to each decoder's centroid */
  const int home = f->home && r && r->sig;
  double smax = 0;
  for (size_t k = 0; home && k < n; k++) {
    f->hs[k] = eldr_dot_lanes8(r->sig, f->home + k * f->dim, f->dim);
    if (k == 0 || f->hs[k] > smax) smax = f->hs[k];
  }
  for (size_t k = 0; k < n; k++) {
    if (healthy && !healthy[k]) continue;
    if (room && loads[k] >= B) continue;
    const size_t nk = loads[k];
    const size_t b0 = nk < B ? nk : B, b1 = nk + 1 < B ? nk + 1 : B;
    const float *qk = f->q + k * LE;
    const double *Uk = f->U + k * L;
    double uu0 = 0, uu1 = 0;
    int have_uniform = 0;
    f->dots_k(qk, f->p, L, E, f->tracked, f->dots);
    for (size_t l = 0; l < L; l++) {
      if (f->tracked[l]) {
        f->u0[l] = Uk[l];
        f->u1[l] = Uk[l] + (double)f->dots[l];
      } else {
        if (!have_uniform) {
          uu0 = uniform_union(f, b0);
          uu1 = uniform_union(f, b1);
          have_uniform = 1;
        }
        f->u0[l] = uu0;
        f->u1[l] = uu1;
      }
    }
    const double C = (double)f->ctx[k];
    const double t1 = eldr_latency_step_f(&f->m, b1, f->u1, C + c_new);
    const double t0 = nk ? eldr_latency_step_f(&f->m, b0, f->u0, C) : t1;
    const double queue = (double)(nk + 1) / (double)B;
    const double own = t1 * (queue > 1 ? queue : 1);
    double cost = (double)nk * (t1 - t0) + f->own_w * own;
    if (home && smax == smax && f->hs[k] == f->hs[k]) /* NaN (an unusable signature): no term */
      cost += f->home_w * t1 * (smax - f->hs[k]);
    if (best < 0 || cost < best_cost) {
      best = (int)k;
      best_cost = cost;
      best_t = own;
      double us = 0;
      for (size_t l = 0; l < L; l++) us += f->u1[l];
      f->last = (eldr_fp_explain){(int)k, us / (double)L, t0, t1, cost};
    }
  }
  if (best < 0) return ELDR_EUNAVAIL;
  if (pred_tpot) *pred_tpot = best_t;
  return best;
}

/* f->w := the fixed-point contributions of the profile in f->p,
 * round(2^24 * -ln(1 - p)) (0 where p is 0; p <= 0.999, so w < 2^27: the
 * rounding to an integer is the only rounding the footprint's sums ever
 * see). Sixteen cells at a time in four independent vectors (the series'
 * dependent steps overlap); the last few through padded vectors. Sets
 * f->touched on the layers with a contribution. */
static inline void contrib4(const float *p, uint32_t *w) {
  const fpm_v4f scale = fpm_splat((float)ELDR_FP_SCALE), half = fpm_splat(0.5f);
  fpm_v4f x;
  memcpy(&x, p, sizeof x);
  fpm_v4i v = __builtin_convertvector(fp_neglog1m4(x) * scale + half, fpm_v4i);
  memcpy(w, &v, sizeof v);
}

static void contributions(eldr_footprint *f) {
  const size_t L = f->L, E = f->E, LE = L * E;
  size_t i = 0;
  for (; i + 16 <= LE; i += 16) {
    contrib4(f->p + i, f->w + i);
    contrib4(f->p + i + 4, f->w + i + 4);
    contrib4(f->p + i + 8, f->w + i + 8);
    contrib4(f->p + i + 12, f->w + i + 12);
  }
  for (; i < LE; i += 4) {
    float p[4] = {0, 0, 0, 0};
    uint32_t w[4];
    size_t n = LE - i < 4 ? LE - i : 4;
    memcpy(p, f->p + i, n * sizeof *p);
    contrib4(p, w);
    memcpy(f->w + i, w, n * sizeof *w);
  }
  for (size_t l = 0; l < L; l++) {
    uint32_t any = 0;
    for (size_t e = 0; e < E; e++) any |= f->w[l * E + e];
    f->touched[l] = any != 0;
  }
}

static inline void exp4(const float *x, float *q) {
  fpm_v4f v;
  memcpy(&v, x, sizeof v);
  v = fp_exp4(v);
  memcpy(q, &v, sizeof v);
}

/* Add (sign 1) or remove (-1) f->w at decoder k; then q = exp(-sum / 2^24)
 * and U of every touched layer are recomputed from the integer sums: no
 * state is ever updated by adding a float delta, so nothing drifts. */
static void refresh_layer(eldr_footprint *f, size_t k, size_t l);

static void apply(eldr_footprint *f, size_t k, int sign) {
  const size_t L = f->L, E = f->E, LE = L * E;
  int64_t *acc = f->acc + k * LE;
  for (size_t l = 0; l < L; l++) {
    if (!f->touched[l]) continue;
    int64_t *al = acc + l * E;
    const uint32_t *wl = f->w + l * E;
    if (sign > 0)
      for (size_t e = 0; e < E; e++) al[e] += wl[e];
    else
      for (size_t e = 0; e < E; e++) al[e] -= wl[e];
    refresh_layer(f, k, l);
  }
}

/* q and U of decoder k's layer l from its integer sums (the profile scratch
 * f->p is the space of the exponents: call only after the profile is used). */
static void refresh_layer(eldr_footprint *f, size_t k, size_t l) {
  const size_t L = f->L, E = f->E, LE = L * E;
  const int64_t *al = f->acc + k * LE + l * E;
  float *x = f->p;
  const float inv = (float)(1.0 / ELDR_FP_SCALE);
  {
    for (size_t e = 0; e < E; e++) x[e] = (float)(-(double)al[e]) * inv;
    float *ql = f->q + k * LE + l * E;
    size_t e = 0;
    for (; e + 16 <= E; e += 16) {
      exp4(x + e, ql + e);
      exp4(x + e + 4, ql + e + 4);
      exp4(x + e + 8, ql + e + 8);
      exp4(x + e + 12, ql + e + 12);
    }
    for (; e < E; e += 4) {
      float xx[4] = {0, 0, 0, 0}, qq[4];
      size_t n = E - e < 4 ? E - e : 4;
      memcpy(xx, x + e, n * sizeof *xx);
      exp4(xx, qq);
      memcpy(ql + e, qq, n * sizeof *qq);
    }
    double u[4] = {0, 0, 0, 0}; /* four running sums: no chain of dependent adds */
    size_t j = 0;
    for (; j + 4 <= E; j += 4)
      for (int m = 0; m < 4; m++) u[m] += 1.0 - (double)ql[j + m];
    for (; j < E; j++) u[0] += 1.0 - (double)ql[j];
    f->U[k * L + l] = (u[0] + u[1]) + (u[2] + u[3]);
  }
}

static size_t take_slot(eldr_footprint *f) {
  if (f->free_head != NO_FREE) {
    size_t i = f->free_head;
    f->free_head = f->tk[i].next_free;
    return i;
  }
  if (f->ntk == f->cap) {
    if (f->cap >= ((size_t)1 << 31)) return NO_FREE;
    size_t nc = f->cap ? f->cap * 2 : 64;
    ticket *nt = realloc(f->tk, nc * sizeof *nt);
    if (!nt) return NO_FREE;
    f->tk = nt;
    f->cap = nc;
  }
  memset(&f->tk[f->ntk], 0, sizeof f->tk[f->ntk]);
  return f->ntk++;
}

uint64_t eldr_footprint_route(eldr_footprint *f, size_t k, const eldr_fp_request *r, int *err) {
  int dummy;
  if (!err) err = &dummy;
  *err = 0;
  if (!f || k >= f->D) {
    *err = ELDR_EINVAL;
    return ELDR_FP_NO_TICKET;
  }
  const size_t L = f->L, E = f->E;
  const size_t row = pick_row(f, r, 1);
  f->row_sig = NULL;
  const uint32_t *counts = r ? r->counts : NULL, ntok = r ? r->n_tokens : 0;
  const int uniform = build_profile(f, counts, ntok, row);
  size_t nnz = 0; /* the counts the profile read */
  for (size_t l = 0; !uniform && l < L; l++)
    for (size_t e = 0; f->mask[l] && e < E; e++) nnz += counts[l * E + e] != 0;
  size_t s = take_slot(f);
  if (s == NO_FREE) {
    *err = ELDR_ENOMEM;
    return ELDR_FP_NO_TICKET;
  }
  ticket *t = &f->tk[s];
  t->idx = malloc((nnz ? nnz : 1) * sizeof *t->idx);
  t->cnt = malloc((nnz ? nnz : 1) * sizeof *t->cnt);
  if (!t->idx || !t->cnt) {
    free(t->idx);
    free(t->cnt);
    t->idx = t->cnt = NULL;
    t->next_free = f->free_head;
    f->free_head = s;
    *err = ELDR_ENOMEM;
    return ELDR_FP_NO_TICKET;
  }
  uint32_t j = 0;
  for (size_t l = 0; !uniform && l < L; l++)
    for (size_t e = 0; f->mask[l] && e < E; e++)
      if (counts[l * E + e]) {
        t->idx[j] = (uint32_t)(l * E + e);
        t->cnt[j++] = counts[l * E + e];
      }
  t->nnz = j;
  t->ntok = ntok;
  t->row = (uint32_t)row;
  t->uniform = uniform;
  t->dec = (uint32_t)k;
  t->ctx = r ? r->ctx_tokens : 0;
  t->used = 1;
  contributions(f);
  apply(f, k, 1);
  f->ctx[k] += t->ctx;
  f->inflight[k]++;
  return ((uint64_t)t->gen << 32) | (uint64_t)s;
}

int eldr_footprint_end(eldr_footprint *f, uint64_t tk) {
  if (!f || tk == ELDR_FP_NO_TICKET) return ELDR_ENOTFOUND;
  size_t s = (size_t)(tk & 0xffffffffu);
  uint32_t gen = (uint32_t)(tk >> 32);
  if (s >= f->ntk || !f->tk[s].used || f->tk[s].gen != gen) return ELDR_ENOTFOUND;
  ticket *t = &f->tk[s];
  const size_t k = t->dec, LE = f->L * f->E;
  /* the same profile as at the route, from the same counts: the same integers */
  memset(f->cnt, 0, LE * sizeof *f->cnt);
  for (uint32_t j = 0; j < t->nnz; j++) f->cnt[t->idx[j]] = t->cnt[j];
  build_profile(f, t->uniform ? NULL : f->cnt, t->ntok, t->row);
  contributions(f);
  apply(f, k, -1);
  f->ctx[k] -= t->ctx;
  f->inflight[k]--;
  free(t->idx);
  free(t->cnt);
  t->idx = t->cnt = NULL;
  t->nnz = 0;
  t->used = 0;
  t->gen++;
  t->next_free = f->free_head;
  f->free_head = s;
  return 0;
}

uint64_t eldr_footprint_replace(eldr_footprint *f, uint64_t tk, const eldr_fp_request *r, int *err) {
  int dummy;
  if (!err) err = &dummy;
  size_t k;
  uint32_t nnz, ctx;
  const uint32_t *idx, *w;
  if (eldr_footprint_ticket(f, tk, &k, &nnz, &idx, &w, &ctx) != 0) {
    *err = ELDR_ENOTFOUND;
    return ELDR_FP_NO_TICKET;
  }
  uint64_t nt = eldr_footprint_route(f, k, r, err); /* first: a failure leaves tk as it was */
  if (nt != ELDR_FP_NO_TICKET) eldr_footprint_end(f, tk);
  return nt;
}

size_t eldr_footprint_inflight(const eldr_footprint *f, size_t k) {
  return f && k < f->D ? f->inflight[k] : 0;
}

void eldr_footprint_explain(const eldr_footprint *f, eldr_fp_explain *out) {
  if (!out) return;
  if (!f) {
    *out = (eldr_fp_explain){-1, 0, 0, 0, 0};
    return;
  }
  *out = f->last;
}

double eldr_footprint_union(const eldr_footprint *f, size_t k, size_t l) {
  return f && k < f->D && l < f->L ? f->U[k * f->L + l] : 0.0;
}

int64_t eldr_footprint_raw(const eldr_footprint *f, size_t k, size_t l, size_t e) {
  return f && k < f->D && l < f->L && e < f->E ? f->acc[(k * f->L + l) * f->E + e] : 0;
}

/* ---- contributions routed elsewhere (the router's fleet bus) ------------------- */

int eldr_footprint_ticket(eldr_footprint *f, uint64_t tk, size_t *k, uint32_t *nnz, const uint32_t **idx,
                          const uint32_t **w, uint32_t *ctx) {
  if (!f || tk == ELDR_FP_NO_TICKET) return ELDR_ENOTFOUND;
  size_t s = (size_t)(tk & 0xffffffffu);
  if (s >= f->ntk || !f->tk[s].used || f->tk[s].gen != (uint32_t)(tk >> 32)) return ELDR_ENOTFOUND;
  const ticket *t = &f->tk[s];
  const size_t LE = f->L * f->E;
  /* the integers its route added, recomputed as its end will: every cell
   * the profile reaches (with priors, every cell of the tracked layers) */
  memset(f->cnt, 0, LE * sizeof *f->cnt);
  for (uint32_t j = 0; j < t->nnz; j++) f->cnt[t->idx[j]] = t->cnt[j];
  build_profile(f, t->uniform ? NULL : f->cnt, t->ntok, t->row);
  contributions(f);
  uint32_t m = 0;
  for (size_t i = 0; i < LE; i++)
    if (f->w[i]) {
      f->tidx[m] = (uint32_t)i;
      f->w[m++] = f->w[i]; /* m <= i: compacted in place */
    }
  *k = t->dec;
  *nnz = m;
  *idx = f->tidx;
  *w = f->w;
  *ctx = t->ctx;
  return 0;
}

int eldr_footprint_adjust(eldr_footprint *f, size_t k, const uint32_t *idx, const int64_t *dw, size_t n,
                          int64_t dctx) {
  if (!f || k >= f->D) return ELDR_EINVAL;
  const size_t LE = f->L * f->E;
  for (size_t j = 0; j < n; j++)
    if (idx[j] >= LE) return ELDR_EINVAL;
  memset(f->touched, 0, f->L);
  int64_t *acc = f->acc + k * LE;
  for (size_t j = 0; j < n; j++) {
    acc[idx[j]] += dw[j];
    f->touched[idx[j] / f->E] = 1;
  }
  for (size_t l = 0; l < f->L; l++)
    if (f->touched[l]) refresh_layer(f, k, l);
  f->ctx[k] = (uint64_t)((int64_t)f->ctx[k] + dctx);
  return 0;
}
