/* fp_prior.c — the footprint profile's priors and their weights, fitted on
 * calibration requests (see eldr/fp_prior.h). */
#include "eldr/fp_prior.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"
#include "eldr/rng.h"

typedef struct fit_ctx {
  const eldr_shape *s;
  size_t LE, k;
  const uint32_t *pre, *dec;
  const int *label;     /* cluster of each request, or NULL */
  const size_t *use;    /* requests with prefill and decode */
  size_t n_use;
  const double *tot;    /* pooled decode counts, LE */
  double tokens;        /* pooled decode tokens */
  const double *ctot;   /* k * LE per-cluster decode counts */
  const double *ctok;   /* k per-cluster decode tokens */
  const double *m, *np; /* per used request: decode, prefill tokens */
  double sel;           /* decode selections of the used requests */
} fit_ctx;

static double row_tokens(const uint32_t *c, const eldr_shape *s) {
  double t = 0; /* a layer's row sums to tokens * K */
  for (uint32_t e = 0; e < s->num_experts; e++) t += c[e];
  return t / s->top_k;
}

/* Mean leave-one-out log-likelihood per decode selection with weights
 * alpha (request over prior) and beta (cluster prior over global prior;
 * inf: the global prior only). alpha inf: the prior alone. */
static double loo_ll(const fit_ctx *x, double alpha, double beta) {
  const double E = x->s->num_experts, K = x->s->top_k, u = K / E;
  const int clusters = x->label && !isinf(beta);
  double ll = 0;
  for (size_t j = 0; j < x->n_use; j++) {
    const size_t r = x->use[j];
    const uint32_t *c = x->pre + r * x->LE, *dv = x->dec + r * x->LE;
    const double m = x->m[j], n = x->np[j], den_pi = x->tokens - m + 1.0;
    const int cl = clusters ? x->label[r] : -1;
    const double *ct = cl >= 0 ? x->ctot + (size_t)cl * x->LE : NULL;
    const double den_c = cl >= 0 ? x->ctok[cl] - m + beta : 1;
    for (size_t i = 0; i < x->LE; i++) {
      if (!dv[i]) continue;
      double pi = (x->tot[i] - dv[i] + u) / den_pi; /* its own decode left out */
      if (ct) pi = (ct[i] - dv[i] + beta * pi) / den_c;
      double p = isinf(alpha) ? pi : (c[i] + alpha * pi) / (n + alpha);
      ll += dv[i] * log(p / K);
    }
  }
  return ll / x->sel;
}

/* The alpha maximising loo_ll at beta: a log grid, then golden-section
 * search in log alpha around its best point. */
static double best_alpha(const fit_ctx *x, double beta, double *ll_out) {
  double best_a = 1, best = -INFINITY;
  for (int k = -6; k <= 14; k++) {
    double a = ldexp(1.0, k), v = loo_ll(x, a, beta);
    if (v > best) best = v, best_a = a;
  }
  double lo = log(best_a) - log(2.0), hi = log(best_a) + log(2.0);
  const double g = (sqrt(5.0) - 1) / 2;
  double x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
  double f1 = loo_ll(x, exp(x1), beta), f2 = loo_ll(x, exp(x2), beta);
  for (int it = 0; it < 24; it++) {
    if (f1 > f2) {
      hi = x2, x2 = x1, f2 = f1;
      x1 = hi - g * (hi - lo);
      f1 = loo_ll(x, exp(x1), beta);
    } else {
      lo = x1, x1 = x2, f1 = f2;
      x2 = lo + g * (hi - lo);
      f2 = loo_ll(x, exp(x2), beta);
    }
  }
  double a = exp((lo + hi) / 2), fa = loo_ll(x, a, beta);
  if (fa < best) a = best_a, fa = best;
  *ll_out = fa;
  return a;
}

/* ---- union calibration ---------------------------------------------------
 *
 * What the policy does with a profile is predict the expected distinct
 * experts of a batch, sum_e 1 - prod_r (1 - p_r(e)). Calibration batches of
 * the used requests (sizes 4..64, drawn at random and from one cluster, as
 * the policy's batches are), each member with its leave-one-out prior:
 * err(alpha) = mean squared relative miss of the predicted union (summed
 * over layers) against the union its members' decode selections predict
 * (the same formula with p_r = decode counts / decode tokens: the oracle's
 * union, within a few per cent of the simulated steps' real union). */

#define CAL_PER_RULE 16 /* batches per (size, rule) */
static const size_t k_cal_sizes[] = {4, 8, 16, 32, 64};
#define N_CAL_SIZES (sizeof k_cal_sizes / sizeof k_cal_sizes[0])

typedef struct cal_set {
  size_t nb;       /* batches */
  size_t *size;    /* nb */
  size_t **member; /* nb arrays of indices into x->use */
  double *target;  /* nb: the decode-predicted union, summed over layers */
  double *pit;     /* n_use x LE prior rates at the set's beta (NULL: over the
                    * memory bound, computed per member as needed) */
  double *fac;     /* n_use x LE: 1 - p of each member at the current alpha
                    * (with pit; NULL over the bound) */
  uint8_t *inset;  /* n_use: 1 where the request is a member of some batch */
} cal_set;

/* The prior rates are kept for every request while they take at most this. */
#define CAL_PIT_BYTES ((size_t)64 << 20)

static void cal_free(cal_set *c) {
  for (size_t b = 0; b < c->nb && c->member; b++) free(c->member[b]);
  free(c->member);
  free(c->size);
  free(c->target);
  free(c->pit);
  free(c->fac);
  free(c->inset);
  memset(c, 0, sizeof *c);
}

/* Request ui's prior rate at each cell: the pooled decode without its own
 * (shrunk towards its cluster's at beta). */
static void prior_row(const fit_ctx *x, size_t ui, double beta, double *pi_out) {
  const double u = (double)x->s->top_k / x->s->num_experts;
  const size_t r = x->use[ui];
  const uint32_t *dv = x->dec + r * x->LE;
  const double m = x->m[ui], den_pi = x->tokens - m + 1.0;
  const int cl = x->label && !isinf(beta) ? x->label[r] : -1;
  const double *ct = cl >= 0 ? x->ctot + (size_t)cl * x->LE : NULL;
  const double den_c = cl >= 0 ? x->ctok[cl] - m + beta : 1;
  for (size_t i = 0; i < x->LE; i++) {
    double pi = (x->tot[i] - dv[i] + u) / den_pi;
    if (ct) pi = (ct[i] - dv[i] + beta * pi) / den_c;
    pi_out[i] = pi;
  }
}

/* The union (summed over layers) of members mem[0..b) with profiles from
 * their decode counts (alpha < 0) or prefill shrunk towards their prior
 * (the rows of pit, n_use x LE at this beta, or computed here when pit is
 * NULL: the same numbers either way). */
static double cal_union(const fit_ctx *x, const size_t *mem, size_t b, double alpha, double beta,
                        const double *pit, double *q /* 2 LE scratch */) {
  double *pr = q + x->LE;
  for (size_t i = 0; i < x->LE; i++) q[i] = 1.0;
  for (size_t j = 0; j < b; j++) {
    const size_t ui = mem[j], r = x->use[ui];
    const uint32_t *c = x->pre + r * x->LE, *dv = x->dec + r * x->LE;
    const double m = x->m[ui], n = x->np[ui];
    if (alpha < 0) {
      for (size_t i = 0; i < x->LE; i++) {
        double p = dv[i] / m;
        if (p > 0.999) p = 0.999;
        q[i] *= 1.0 - p;
      }
      continue;
    }
    const double *pi = pit ? pit + ui * x->LE : pr;
    if (!pit) prior_row(x, ui, beta, pr);
    for (size_t i = 0; i < x->LE; i++) {
      double p = (c[i] + alpha * pi[i]) / (n + alpha);
      if (p > 0.999) p = 0.999;
      q[i] *= 1.0 - p;
    }
  }
  double s = 0;
  for (size_t i = 0; i < x->LE; i++) s += 1.0 - q[i];
  return s;
}

/* The calibration batches (a fixed seed: the same for every fit of the
 * same requests). */
static int cal_build(const fit_ctx *x, double beta, double *q, cal_set *c) {
  const size_t nu = x->n_use, nb = N_CAL_SIZES * 2 * CAL_PER_RULE;
  c->size = calloc(nb, sizeof *c->size);
  c->member = calloc(nb, sizeof *c->member);
  c->target = calloc(nb, sizeof *c->target);
  size_t *pool = malloc(nu * sizeof *pool);
  if (!c->size || !c->member || !c->target || !pool) {
    free(pool);
    return ELDR_ENOMEM;
  }
  eldr_rng r;
  eldr_rng_seed(&r, 0x75636c31ULL); /* "ucl1" */
  for (size_t si = 0; si < N_CAL_SIZES; si++)
    for (int rule = 0; rule < 2; rule++)
      for (size_t t = 0; t < CAL_PER_RULE; t++) {
        size_t b = k_cal_sizes[si], np = 0;
        size_t anchor = (size_t)eldr_rng_below(&r, nu);
        int cl = rule && x->label ? x->label[x->use[anchor]] : -1;
        for (size_t j = 0; j < nu; j++)
          if (cl < 0 || x->label[x->use[j]] == cl) pool[np++] = j;
        size_t *mem = malloc(b * sizeof *mem);
        if (!mem) {
          free(pool);
          return ELDR_ENOMEM;
        }
        for (size_t j = 0; j < b; j++) { /* without replacement while the pool lasts */
          size_t left = np > j ? np - j : 0;
          if (left) {
            size_t pick = j + (size_t)eldr_rng_below(&r, left);
            size_t tmp = pool[j];
            pool[j] = pool[pick];
            pool[pick] = tmp;
            mem[j] = pool[j];
          } else {
            mem[j] = pool[(size_t)eldr_rng_below(&r, np)];
          }
        }
        c->member[c->nb] = mem;
        c->size[c->nb] = b;
        c->target[c->nb++] = cal_union(x, mem, b, -1, beta, NULL, q);
      }
  free(pool);
  /* every cal_err at this beta reads the same prior rates: once, where they fit */
  if (nu <= CAL_PIT_BYTES / sizeof(double) / x->LE && (c->pit = malloc(nu * x->LE * sizeof *c->pit)))
    for (size_t j = 0; j < nu; j++) prior_row(x, j, beta, c->pit + j * x->LE);
  if (c->pit && nu <= CAL_PIT_BYTES / sizeof(double) / x->LE) {
    c->fac = malloc(nu * x->LE * sizeof *c->fac);
    c->inset = calloc(nu, 1);
    if (!c->fac || !c->inset) { /* the slower path still works */
      free(c->fac);
      free(c->inset);
      c->fac = NULL;
      c->inset = NULL;
    } else {
      for (size_t b = 0; b < c->nb; b++)
        for (size_t j = 0; j < c->size[b]; j++) c->inset[c->member[b][j]] = 1;
    }
  }
  return 0;
}

static double cal_err(const fit_ctx *x, const cal_set *c, double alpha, double beta, double *q) {
  double e = 0;
  if (c->fac) { /* each member's 1 - p once per alpha, then products only: the same bits */
    const size_t LE = x->LE;
    for (size_t ui = 0; ui < x->n_use; ui++) {
      if (!c->inset[ui]) continue;
      const size_t r = x->use[ui];
      const uint32_t *cn = x->pre + r * LE;
      const double *pi = c->pit + ui * LE, n = x->np[ui];
      double *f = c->fac + ui * LE;
      for (size_t i = 0; i < LE; i++) {
        double p = (cn[i] + alpha * pi[i]) / (n + alpha);
        if (p > 0.999) p = 0.999;
        f[i] = 1.0 - p;
      }
    }
    for (size_t b = 0; b < c->nb; b++) {
      for (size_t i = 0; i < LE; i++) q[i] = 1.0;
      for (size_t j = 0; j < c->size[b]; j++) {
        const double *f = c->fac + c->member[b][j] * LE;
        for (size_t i = 0; i < LE; i++) q[i] *= f[i];
      }
      double s = 0;
      for (size_t i = 0; i < LE; i++) s += 1.0 - q[i];
      double d = s / c->target[b] - 1.0;
      e += d * d;
    }
    return e / (double)c->nb;
  }
  for (size_t b = 0; b < c->nb; b++) {
    double d = cal_union(x, c->member[b], c->size[b], alpha, beta, c->pit, q) / c->target[b] - 1.0;
    e += d * d;
  }
  return e / (double)c->nb;
}

/* The alpha whose predicted batch unions match the decode-predicted ones
 * best (least squared relative miss): a log grid, then golden-section. */
static double union_alpha(const fit_ctx *x, const cal_set *c, double beta, double *q, double *err) {
  double best_a = 1, best = INFINITY;
  for (int k = -6; k <= 14; k++) {
    double a = ldexp(1.0, k), v = cal_err(x, c, a, beta, q);
    if (v < best) best = v, best_a = a;
  }
  double lo = log(best_a) - log(2.0), hi = log(best_a) + log(2.0);
  const double g = (sqrt(5.0) - 1) / 2;
  double x1 = hi - g * (hi - lo), x2 = lo + g * (hi - lo);
  double f1 = cal_err(x, c, exp(x1), beta, q), f2 = cal_err(x, c, exp(x2), beta, q);
  for (int it = 0; it < 20; it++) {
    if (f1 < f2) {
      hi = x2, x2 = x1, f2 = f1;
      x1 = hi - g * (hi - lo);
      f1 = cal_err(x, c, exp(x1), beta, q);
    } else {
      lo = x1, x1 = x2, f1 = f2;
      x2 = lo + g * (hi - lo);
      f2 = cal_err(x, c, exp(x2), beta, q);
    }
  }
  double a = exp((lo + hi) / 2), fa = cal_err(x, c, a, beta, q);
  if (fa > best) a = best_a, fa = best;
  *err = fa;
  return a;
}

int eldr_fp_prior_fit(const eldr_shape *s, const uint32_t *pre, const uint32_t *dec,
                      const int *label, size_t n, size_t k, float *prior,
                      eldr_fp_prior_report *rep) {
  if (!s || !pre || !dec || !prior || !s->num_experts || !s->top_k || (label && !k))
    return ELDR_EINVAL;
  const size_t L = s->num_layers, E = s->num_experts, LE = L * E;
  const size_t kc = label ? k : 0;
  eldr_fp_prior_report rp = {0};
  double *tot = calloc(LE, sizeof *tot), *m = malloc((n ? n : 1) * sizeof *m),
         *np = malloc((n ? n : 1) * sizeof *np);
  double *ctot = kc ? calloc(kc * LE, sizeof *ctot) : NULL, *ctok = kc ? calloc(kc, sizeof *ctok) : NULL;
  size_t *use = malloc((n ? n : 1) * sizeof *use);
  int rc = 0;
  if (!tot || !m || !np || !use || (kc && (!ctot || !ctok))) {
    rc = ELDR_ENOMEM;
    goto out;
  }
  fit_ctx x = {.s = s, .LE = LE, .k = kc, .pre = pre, .dec = dec, .label = label, .use = use,
               .tot = tot, .ctot = ctot, .ctok = ctok, .m = m, .np = np};
  for (size_t r = 0; r < n; r++) {
    double mr = row_tokens(dec + r * LE, s), nr = row_tokens(pre + r * LE, s);
    if (!(mr > 0) || !(nr > 0)) continue;
    if (label && label[r] >= 0 && (size_t)label[r] >= kc) {
      rc = ELDR_EINVAL;
      goto out;
    }
    for (size_t i = 0; i < LE; i++) tot[i] += dec[r * LE + i];
    if (kc && label[r] >= 0) {
      double *ct = ctot + (size_t)label[r] * LE;
      for (size_t i = 0; i < LE; i++) ct[i] += dec[r * LE + i];
      ctok[label[r]] += mr;
    }
    m[x.n_use] = mr;
    np[x.n_use] = nr;
    use[x.n_use++] = r;
    x.tokens += mr;
    x.sel += mr * (double)s->top_k * (double)L;
  }
  if (x.n_use == 0) {
    rc = ELDR_EEMPTY;
    goto out;
  }
  const double u = (double)s->top_k / (double)E;
  for (size_t i = 0; i < LE; i++) prior[i] = (float)((tot[i] + u) / (x.tokens + 1.0));
  /* beta over a log grid (inf: no cluster priors), alpha best at each */
  double beta = INFINITY, ll;
  double alpha = best_alpha(&x, INFINITY, &ll);
  rp.ll_global = ll;
  for (int b = 0; kc && b <= 12; b++) {
    double bt = ldexp(1.0, 2 * b - 4), lb; /* 1/16 .. 2^20 */
    double ab = best_alpha(&x, bt, &lb);
    if (lb > ll) ll = lb, alpha = ab, beta = bt;
  }
  rp.n = x.n_use;
  rp.alpha_ll = alpha;
  rp.beta = beta;
  rp.ll_alpha = ll;
  rp.ll_prior = loo_ll(&x, INFINITY, beta);
  rp.ll_prefill = loo_ll(&x, 1.0 / 64, beta);
  { /* alpha for the union the policy predicts, at the likelihood's beta */
    double *q = malloc(2 * LE * sizeof *q);
    cal_set cs = {0};
    if (!q || cal_build(&x, beta, q, &cs)) {
      free(q);
      cal_free(&cs);
      rc = ELDR_ENOMEM;
      goto out;
    }
    rp.union_err_ll = sqrt(cal_err(&x, &cs, rp.alpha_ll, beta, q));
    rp.union_err_raw = sqrt(cal_err(&x, &cs, 1.0 / 64, beta, q));
    rp.alpha = union_alpha(&x, &cs, beta, q, &rp.union_err);
    rp.union_err = sqrt(rp.union_err);
    rp.ll_union_alpha = loo_ll(&x, rp.alpha, beta);
    free(q);
    cal_free(&cs);
  }
  if (kc && !isinf(beta)) /* each cluster's prior: its pooled decode shrunk towards the global */
    for (size_t c = 0; c < kc; c++)
      for (size_t i = 0; i < LE; i++)
        prior[(c + 1) * LE + i] = (float)((ctot[c * LE + i] + beta * (double)prior[i]) / (ctok[c] + beta));
  else
    for (size_t c = 0; c < kc; c++) memcpy(prior + (c + 1) * LE, prior, LE * sizeof *prior);
out:
  free(tot);
  free(m);
  free(np);
  free(use);
  free(ctot);
  free(ctok);
  if (rep) *rep = rp;
  return rc;
}
