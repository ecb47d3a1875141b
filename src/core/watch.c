/* watch.c — drift reference, sliding window statistics and live rho (see
 * include/eldr/watch.h). Pure computation: no I/O. */
#include "eldr/watch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/dot.h"
#include "eldr/quality.h"

int eldr_watch_sim_bin(float s) {
  if (!(s > 0)) return 0;
  int b = (int)(s * ELDR_WATCH_SIM_BINS);
  return b >= ELDR_WATCH_SIM_BINS ? ELDR_WATCH_SIM_BINS - 1 : b;
}

eldr_drift_ref *eldr_drift_ref_new(size_t k) {
  if (!k) return NULL;
  eldr_drift_ref *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->k = k;
  if (!(r->nearest_share = calloc(k, sizeof *r->nearest_share))) {
    free(r);
    return NULL;
  }
  return r;
}

void eldr_drift_ref_free(eldr_drift_ref *r) {
  if (!r) return;
  free(r->nearest_share);
  free(r);
}

/* Index of the largest similarity (lower index on ties); -1 if none is a number. */
static int argmax(const float *sims, size_t k) {
  int best = -1;
  for (size_t c = 0; c < k; c++)
    if (!isnan(sims[c]) && (best < 0 || sims[c] > sims[best])) best = (int)c;
  return best;
}

int eldr_drift_ref_compute(const float *centroids, size_t k, size_t dim, const float *sigs,
                           size_t n, eldr_drift_ref **out) {
  if (!out || !centroids || !k || !dim || (n && !sigs)) return ELDR_EINVAL;
  *out = NULL;
  eldr_drift_ref *r = eldr_drift_ref_new(k);
  float *sims = malloc(k * sizeof *sims);
  if (!r || !sims) {
    eldr_drift_ref_free(r);
    free(sims);
    return ELDR_ENOMEM;
  }
  size_t used = 0;
  for (size_t i = 0; i < n; i++) {
    const float *s = sigs + i * dim;
    int zero = 1;
    for (size_t j = 0; j < dim && zero; j++) zero = s[j] == 0.0f;
    if (zero) continue;
    for (size_t c = 0; c < k; c++) sims[c] = eldr_dot_lanes8(s, centroids + c * dim, dim);
    int b = argmax(sims, k);
    if (b < 0) continue;
    r->nearest_share[b] += 1;
    r->sim_hist[eldr_watch_sim_bin(sims[b])] += 1;
    used++;
  }
  free(sims);
  if (!used) {
    eldr_drift_ref_free(r);
    return ELDR_EEMPTY;
  }
  for (size_t c = 0; c < k; c++) r->nearest_share[c] /= (double)used;
  for (int b = 0; b < ELDR_WATCH_SIM_BINS; b++) r->sim_hist[b] /= (double)used;
  r->n = used;
  *out = r;
  return 0;
}

static int check_dist(const double *p, size_t n, const char *field, int allow_zero, eldr_diag *d) {
  double sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(p[i]) || p[i] < 0)
      return eldr_diag_fail(d, ELDR_ERANGE, "fit.drift_ref.%s[%zu]: must be a finite fraction >= 0", field, i);
    sum += p[i];
  }
  if (!(fabs(sum - 1) <= 1e-6) && !(allow_zero && sum == 0))
    return eldr_diag_fail(d, ELDR_ERANGE, "fit.drift_ref.%s: fractions sum to %.9g, not 1", field, sum);
  return 0;
}

int eldr_drift_ref_validate(const eldr_drift_ref *r, eldr_diag *d) {
  if (!r || !r->k || !r->nearest_share) return eldr_diag_fail(d, ELDR_EINVAL, "fit.drift_ref: empty");
  int rc = check_dist(r->nearest_share, r->k, "nearest_share", r->n == 0, d);
  if (!rc) rc = check_dist(r->sim_hist, ELDR_WATCH_SIM_BINS, "similarity_hist", r->n == 0, d);
  return rc;
}

static double sum_of(const double *p, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += p[i];
  return s;
}

double eldr_js_divergence(const double *p, const double *q, size_t n) {
  double sp = sum_of(p, n), sq = sum_of(q, n);
  if (!(sp > 0) || !(sq > 0)) return NAN;
  double js = 0;
  for (size_t i = 0; i < n; i++) {
    double a = p[i] / sp, b = q[i] / sq, m = 0.5 * (a + b);
    if (a > 0) js += 0.5 * a * log2(a / m);
    if (b > 0) js += 0.5 * b * log2(b / m);
  }
  return js < 0 ? 0 : js > 1 ? 1 : js;
}

double eldr_ks_binned(const double *p, const double *q, size_t n) {
  double sp = sum_of(p, n), sq = sum_of(q, n);
  if (!(sp > 0) || !(sq > 0)) return NAN;
  double cp = 0, cq = 0, ks = 0;
  for (size_t i = 0; i < n; i++) {
    cp += p[i] / sp;
    cq += q[i] / sq;
    double g = fabs(cp - cq);
    if (g > ks) ks = g;
  }
  return ks > 1 ? 1 : ks;
}

void eldr_watch_capacity_share(size_t k, size_t n, double *share) {
  if (!k || !share) return;
  if (!n) {
    for (size_t c = 0; c < k; c++) share[c] = 0;
    return;
  }
  for (size_t c = 0; c < k; c++) {
    if (n >= k) {
      size_t dec = n / k + (c < n % k ? 1 : 0); /* decoders j < n with j % k == c */
      share[c] = (double)dec / (double)n;
    } else {
      size_t j = c % n, cents = k / n + (j < k % n ? 1 : 0); /* centroids c' < k with c' % n == j */
      share[c] = 1.0 / ((double)n * (double)cents);
    }
  }
}

/* ---- the sliding window ----------------------------------------------------- */

typedef struct entry {
  double t;
  int32_t nearest, chosen;
  float best, chosen_sim;
} entry;

struct eldr_watch {
  size_t cap, k, n, head; /* head: next slot */
  entry *e;
};

eldr_watch *eldr_watch_new(size_t cap, size_t k) {
  if (!cap || !k) return NULL;
  eldr_watch *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->cap = cap;
  w->k = k;
  if (!(w->e = calloc(cap, sizeof *w->e))) {
    free(w);
    return NULL;
  }
  return w;
}

void eldr_watch_free(eldr_watch *w) {
  if (!w) return;
  free(w->e);
  free(w);
}

size_t eldr_watch_k(const eldr_watch *w) { return w ? w->k : 0; }
size_t eldr_watch_cap(const eldr_watch *w) { return w ? w->cap : 0; }

void eldr_watch_reset(eldr_watch *w) {
  if (w) w->n = w->head = 0;
}

void eldr_watch_add(eldr_watch *w, double t, const float *sims, int chosen) {
  if (!w || !sims) return;
  int b = argmax(sims, w->k);
  if (b < 0) return;
  entry *e = &w->e[w->head];
  e->t = t;
  e->nearest = b;
  e->best = sims[b];
  e->chosen = chosen >= 0 && (size_t)chosen < w->k ? chosen : -1;
  e->chosen_sim = e->chosen >= 0 ? sims[e->chosen] : NAN;
  w->head = (w->head + 1) % w->cap;
  if (w->n < w->cap) w->n++;
}

void eldr_watch_stats_get(const eldr_watch *w, double now, double window_s,
                          const eldr_drift_ref *ref, eldr_watch_stats *out) {
  size_t k = w->k;
  double nearest_buf[256], *nearest = out->nearest;
  double *tmp = NULL;
  if (!nearest) nearest = k <= 256 ? nearest_buf : (tmp = calloc(k, sizeof *tmp));
  out->n = 0;
  out->mean_chosen_sim = out->mean_best_sim = out->js = out->ks = out->drift = NAN;
  out->stale = 0;
  for (size_t c = 0; c < k; c++) out->share[c] = 0;
  if (nearest)
    for (size_t c = 0; c < k; c++) nearest[c] = 0;
  double hist[ELDR_WATCH_SIM_BINS] = {0};
  double sum_best = 0, sum_chosen = 0;
  size_t n = 0, nchosen = 0;
  for (size_t i = 0; i < w->n; i++) {
    const entry *e = &w->e[(w->head + w->cap - 1 - i) % w->cap]; /* newest first */
    if (window_s > 0 && e->t < now - window_s) break;
    n++;
    if (nearest) nearest[e->nearest] += 1;
    hist[eldr_watch_sim_bin(e->best)] += 1;
    sum_best += e->best;
    if (e->chosen >= 0) {
      out->share[e->chosen] += 1;
      sum_chosen += e->chosen_sim;
      nchosen++;
    }
  }
  out->n = n;
  if (n) out->mean_best_sim = sum_best / (double)n;
  if (nchosen) {
    out->mean_chosen_sim = sum_chosen / (double)nchosen;
    for (size_t c = 0; c < k; c++) out->share[c] /= (double)nchosen;
  }
  if (n && ref && ref->k == k && ref->n > 0 && nearest) {
    out->js = eldr_js_divergence(nearest, ref->nearest_share, k);
    /* KS in excess of its 5% critical value: sampling noise alone scores 0 */
    double m = (double)ref->n, nn = (double)n;
    double crit = 1.358 * sqrt((nn + m) / (nn * m));
    double ks = eldr_ks_binned(hist, ref->sim_hist, ELDR_WATCH_SIM_BINS) - crit;
    out->ks = ks > 0 ? ks : 0;
    if (n >= ELDR_DRIFT_MIN_SAMPLES) {
      out->drift = out->js > out->ks ? out->js : out->ks;
      out->stale = out->drift > ELDR_DRIFT_THRESHOLD;
    }
  }
  if (out->nearest && n)
    for (size_t c = 0; c < k; c++) out->nearest[c] /= (double)n;
  free(tmp);
}

/* ---- live rho ---------------------------------------------------------------- */

struct eldr_rho_ring {
  size_t cap, sdim, ddim, n, head;
  float *sig, *dec;
};

eldr_rho_ring *eldr_rho_ring_new(size_t cap, size_t sdim, size_t ddim) {
  if (!cap || !sdim || !ddim || cap > SIZE_MAX / sizeof(float) / (sdim > ddim ? sdim : ddim)) return NULL;
  eldr_rho_ring *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->cap = cap;
  r->sdim = sdim;
  r->ddim = ddim;
  r->sig = malloc(cap * sdim * sizeof *r->sig);
  r->dec = malloc(cap * ddim * sizeof *r->dec);
  if (!r->sig || !r->dec) {
    eldr_rho_ring_free(r);
    return NULL;
  }
  return r;
}

void eldr_rho_ring_free(eldr_rho_ring *r) {
  if (!r) return;
  free(r->sig);
  free(r->dec);
  free(r);
}

int eldr_rho_ring_add(eldr_rho_ring *r, const float *sig, const uint32_t *dec_counts) {
  if (!r || !sig || !dec_counts) return ELDR_EINVAL;
  double ss = 0;
  for (size_t j = 0; j < r->ddim; j++) ss += (double)dec_counts[j] * dec_counts[j];
  if (!(ss > 0)) return 0;
  float inv = (float)(1.0 / sqrt(ss));
  float *d = r->dec + r->head * r->ddim;
  for (size_t j = 0; j < r->ddim; j++) d[j] = (float)dec_counts[j] * inv;
  memcpy(r->sig + r->head * r->sdim, sig, r->sdim * sizeof *sig);
  r->head = (r->head + 1) % r->cap;
  if (r->n < r->cap) r->n++;
  return 0;
}

size_t eldr_rho_ring_count(const eldr_rho_ring *r) { return r ? r->n : 0; }

int eldr_rho_ring_copy_into(eldr_rho_ring *dst, const eldr_rho_ring *src) {
  if (!dst || !src || dst->cap != src->cap || dst->sdim != src->sdim || dst->ddim != src->ddim)
    return ELDR_EINVAL;
  /* the filled slots are 0 .. n-1 (the ring wraps only once full) */
  memcpy(dst->sig, src->sig, src->n * src->sdim * sizeof *src->sig);
  memcpy(dst->dec, src->dec, src->n * src->ddim * sizeof *src->dec);
  dst->n = src->n;
  dst->head = src->head;
  return 0;
}

eldr_rho_ring *eldr_rho_ring_copy(const eldr_rho_ring *r) {
  if (!r) return NULL;
  eldr_rho_ring *c = eldr_rho_ring_new(r->cap, r->sdim, r->ddim);
  if (c) eldr_rho_ring_copy_into(c, r);
  return c;
}

int eldr_rho_ring_rho(const eldr_rho_ring *r, double *rho) {
  if (!r || !rho) return ELDR_EINVAL;
  if (r->n < 3) return ELDR_EEMPTY;
  eldr_pairs_opts po = {.max_pairs = 0, .seed = 1};
  int rc = eldr_quality_rho(r->sig, r->sdim, r->dec, r->ddim, r->n, &po, rho);
  return rc == ELDR_EINVAL || rc == ELDR_ERANGE ? ELDR_EEMPTY : rc;
}
