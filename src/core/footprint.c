/* footprint.c — per-decoder live expert footprints and the predicted added
 * cost of a request (see include/eldr/footprint.h, docs/footprint.md). */
#include "eldr/footprint.h"

#include "core/footprint_int.h"
#include "eldr/cpu.h"
#include "eldr/dot.h"

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

typedef struct ticket {
  uint32_t dec, nnz, ctx, gen;
  uint32_t *idx; /* nnz flat (l*E + e) indices, ascending */
  uint32_t *w;   /* nnz fixed-point contributions */
  int used;
  size_t next_free;
} ticket;

struct eldr_footprint {
  eldr_latency_model m;
  size_t L, E, K, D, B;
  uint8_t *mask;     /* L flags */
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
  const size_t LE = f->L * f->E, D = f->D;
  f->mask = malloc(f->L);
  f->acc = calloc(D * LE, sizeof *f->acc);
  f->q = malloc(D * LE * sizeof *f->q);
  f->U = calloc(D * f->L, sizeof *f->U);
  f->ctx = calloc(D, sizeof *f->ctx);
  f->inflight = calloc(D, sizeof *f->inflight);
  f->p = malloc(LE * sizeof *f->p);
  f->u0 = malloc(f->L * sizeof *f->u0);
  f->u1 = malloc(f->L * sizeof *f->u1);
  f->touched = malloc(f->L);
  f->dots = malloc(f->L * sizeof *f->dots);
  f->dots_k = pick_dots();
  if (!f->dots || !f->mask || !f->acc || !f->q || !f->U || !f->ctx || !f->inflight || !f->p || !f->u0 ||
      !f->u1 || !f->touched) {
    eldr_footprint_free(f);
    return eldr_diag_fail(d, ELDR_ENOMEM, "footprint: out of memory");
  }
  for (size_t l = 0; l < f->L; l++) f->mask[l] = o->layer_mask ? (o->layer_mask[l] != 0) : 1;
  for (size_t i = 0; i < D * LE; i++) f->q[i] = 1.0f;
  f->free_head = NO_FREE;
  *out = f;
  return 0;
}

void eldr_footprint_free(eldr_footprint *f) {
  if (!f) return;
  for (size_t i = 0; i < f->ntk; i++) {
    free(f->tk[i].idx);
    free(f->tk[i].w);
  }
  free(f->tk);
  free(f->dots);
  free(f->touched);
  free(f->u1);
  free(f->u0);
  free(f->p);
  free(f->inflight);
  free(f->ctx);
  free(f->U);
  free(f->q);
  free(f->acc);
  free(f->mask);
  free(f);
}

/* The request's per-token selection probabilities on the footprint layers
 * (0 elsewhere) into f->p. Returns 1 for the uniform profile (no counts). */
static int build_profile(eldr_footprint *f, const eldr_fp_request *r) {
  const size_t L = f->L, E = f->E;
  int uniform = !r || !r->counts || r->n_tokens == 0;
  const float pu = (float)((double)f->K / (double)E);
  /* counts <= tokens < 2^31 (a prompt); a float product (no division per cell)
   * keeps the loop vectorisable; p is a prediction input, 24 bits suffice */
  const float inv = uniform ? 0.0f : (float)(1.0 / (double)r->n_tokens);
  const float pmax = (float)ELDR_FP_PMAX;
  for (size_t l = 0; l < L; l++) {
    float *pl = f->p + l * E;
    if (!f->mask[l]) {
      memset(pl, 0, E * sizeof *pl);
      continue;
    }
    if (uniform) {
      for (size_t e = 0; e < E; e++) pl[e] = pu;
      continue;
    }
    const uint32_t *cl = r->counts + l * E;
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
  int uni = build_profile(f, r);
  if (uniform) *uniform = uni;
  const size_t L = f->L, E = f->E, LE = L * E, B = f->B;
  const double c_new = r ? (double)r->ctx_tokens : 0.0;
  int best = -1;
  double best_cost = 0, best_t = 0;
  for (size_t k = 0; k < n; k++) {
    if (healthy && !healthy[k]) continue;
    const size_t nk = loads[k];
    const size_t b0 = nk < B ? nk : B, b1 = nk + 1 < B ? nk + 1 : B;
    const float *qk = f->q + k * LE;
    const double *Uk = f->U + k * L;
    double uu0 = 0, uu1 = 0;
    int have_uniform = 0;
    f->dots_k(qk, f->p, L, E, f->mask, f->dots);
    for (size_t l = 0; l < L; l++) {
      if (f->mask[l]) {
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
    const double cost = (double)nk * (t1 - t0) + own;
    if (best < 0 || cost < best_cost) {
      best = (int)k;
      best_cost = cost;
      best_t = own;
    }
  }
  if (best < 0) return ELDR_EUNAVAIL;
  if (pred_tpot) *pred_tpot = best_t;
  return best;
}

/* Recompute U of decoder k on the layers flagged in f->touched from q
 * (itself recomputed from the integer sums where they changed): no state
 * is ever updated by adding a float delta, so nothing drifts. */
static void refresh_layers(eldr_footprint *f, size_t k) {
  const size_t L = f->L, E = f->E;
  for (size_t l = 0; l < L; l++) {
    if (!f->touched[l]) continue;
    const float *q = f->q + (k * L + l) * E;
    double u = 0;
    for (size_t e = 0; e < E; e++) u += 1.0 - (double)q[e];
    f->U[k * L + l] = u;
  }
}

/* q at flat index i of decoder k from its integer sum. */
static inline void set_q(eldr_footprint *f, size_t k, size_t i) {
  const size_t LE = f->L * f->E;
  f->q[k * LE + i] = expf((float)(-(double)f->acc[k * LE + i] * (1.0 / ELDR_FP_SCALE)));
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
  build_profile(f, r);
  const size_t L = f->L, E = f->E, LE = L * E;
  size_t nnz = 0;
  for (size_t i = 0; i < LE; i++) nnz += f->p[i] > 0;
  size_t s = take_slot(f);
  if (s == NO_FREE) {
    *err = ELDR_ENOMEM;
    return ELDR_FP_NO_TICKET;
  }
  ticket *t = &f->tk[s];
  t->idx = malloc((nnz ? nnz : 1) * sizeof *t->idx);
  t->w = malloc((nnz ? nnz : 1) * sizeof *t->w);
  if (!t->idx || !t->w) {
    free(t->idx);
    free(t->w);
    t->idx = t->w = NULL;
    t->next_free = f->free_head;
    f->free_head = s;
    *err = ELDR_ENOMEM;
    return ELDR_FP_NO_TICKET;
  }
  memset(f->touched, 0, L);
  int64_t *acc = f->acc + k * LE;
  uint32_t j = 0;
  for (size_t i = 0; i < LE; i++) {
    if (!(f->p[i] > 0)) continue;
    /* w <= -ln(1 - 0.999) * 2^24 < 2^27: the rounding to an integer is the
     * only rounding the footprint ever sees */
    uint32_t wi = (uint32_t)((double)-log1pf(-f->p[i]) * ELDR_FP_SCALE + 0.5);
    if (wi == 0) continue;
    t->idx[j] = (uint32_t)i;
    t->w[j] = wi;
    j++;
    acc[i] += wi;
    set_q(f, k, i);
    f->touched[i / E] = 1;
  }
  t->nnz = j;
  t->dec = (uint32_t)k;
  t->ctx = r ? r->ctx_tokens : 0;
  t->used = 1;
  f->ctx[k] += t->ctx;
  f->inflight[k]++;
  refresh_layers(f, k);
  return ((uint64_t)t->gen << 32) | (uint64_t)s;
}

int eldr_footprint_end(eldr_footprint *f, uint64_t tk) {
  if (!f || tk == ELDR_FP_NO_TICKET) return ELDR_ENOTFOUND;
  size_t s = (size_t)(tk & 0xffffffffu);
  uint32_t gen = (uint32_t)(tk >> 32);
  if (s >= f->ntk || !f->tk[s].used || f->tk[s].gen != gen) return ELDR_ENOTFOUND;
  ticket *t = &f->tk[s];
  const size_t k = t->dec, L = f->L, E = f->E;
  int64_t *acc = f->acc + k * L * E;
  memset(f->touched, 0, L);
  for (uint32_t j = 0; j < t->nnz; j++) {
    acc[t->idx[j]] -= t->w[j];
    set_q(f, k, t->idx[j]);
    f->touched[t->idx[j] / E] = 1;
  }
  f->ctx[k] -= t->ctx;
  f->inflight[k]--;
  refresh_layers(f, k);
  free(t->idx);
  free(t->w);
  t->idx = t->w = NULL;
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

double eldr_footprint_union(const eldr_footprint *f, size_t k, size_t l) {
  return f && k < f->D && l < f->L ? f->U[k * f->L + l] : 0.0;
}

int64_t eldr_footprint_raw(const eldr_footprint *f, size_t k, size_t l, size_t e) {
  return f && k < f->D && l < f->L && e < f->E ? f->acc[(k * f->L + l) * f->E + e] : 0;
}

/* ---- contributions routed elsewhere (the router's fleet bus) ------------------- */

int eldr_footprint_ticket(const eldr_footprint *f, uint64_t tk, size_t *k, uint32_t *nnz, const uint32_t **idx,
                          const uint32_t **w, uint32_t *ctx) {
  if (!f || tk == ELDR_FP_NO_TICKET) return ELDR_ENOTFOUND;
  size_t s = (size_t)(tk & 0xffffffffu);
  if (s >= f->ntk || !f->tk[s].used || f->tk[s].gen != (uint32_t)(tk >> 32)) return ELDR_ENOTFOUND;
  const ticket *t = &f->tk[s];
  *k = t->dec;
  *nnz = t->nnz;
  *idx = t->idx;
  *w = t->w;
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
    set_q(f, k, idx[j]);
    f->touched[idx[j] / f->E] = 1;
  }
  f->ctx[k] = (uint64_t)((int64_t)f->ctx[k] + dctx);
  refresh_layers(f, k);
  return 0;
}
