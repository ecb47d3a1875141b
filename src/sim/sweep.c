/* sweep.c — the (rate, variant) runs of a simulation sweep on a thread pool
 * (see eldr/sweep.h). */
#include "eldr/sweep.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/fit.h"
#include "eldr/parallel.h"

static void add_variant(eldr_sweep_variant *vs, size_t *n, size_t cap, const char *label,
                        eldr_policy_kind k, double tau, int permute, int decor, int vanilla,
                        int baseline, int headline) {
  if (*n >= cap) return;
  for (size_t i = 0; i < *n; i++)
    if (!strcmp(vs[i].label, label)) return;
  eldr_sweep_variant *v = &vs[(*n)++];
  memset(v, 0, sizeof *v);
  snprintf(v->label, sizeof v->label, "%s", label);
  v->kind = k;
  v->tau = tau;
  v->permute = permute;
  v->decorrelate = decor;
  v->vanilla = vanilla;
  v->is_baseline = baseline;
  v->is_headline = headline;
}

/* The footprint family: footprint, -oracle (decode selections), -permuted
 * (another request's selections: the replay control), -all / -mask (layers
 * predicted from the footprint), -raw (without the profile prior), and the
 * replay controls of -oracle, -mask and -raw. Returns 1 when tok was one
 * of them. */
static int add_footprint_variant(eldr_sweep_variant *vs, size_t *n, size_t cap, const char *tok,
                                 int decor) {
  static const struct {
    const char *name;
    int permute, oracle, layers, no_prior;
  } fam[] = {{"footprint", 0, 0, 0, 0},
             {"footprint-oracle", 0, 1, 0, 1}, /* the truth needs no prior */
             {"footprint-permuted", 1, 0, 0, 0},
             {"footprint-all", 0, 0, 1, 0},
             {"footprint-mask", 0, 0, 2, 0},
             {"footprint-raw", 0, 0, 0, 1},
             {"footprint-oracle-permuted", 1, 1, 0, 1},
             {"footprint-mask-permuted", 1, 0, 2, 0},
             {"footprint-raw-permuted", 1, 0, 0, 1}};
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
    if (strcmp(tok, fam[i].name)) continue;
    size_t before = *n;
    add_variant(vs, n, cap, tok, ELDR_POLICY_FOOTPRINT, 0, fam[i].permute, decor, 0, 0, 1);
    if (*n > before) {
      vs[*n - 1].oracle = fam[i].oracle;
      vs[*n - 1].fp_layers = fam[i].layers;
      vs[*n - 1].fp_no_prior = fam[i].no_prior;
    }
    return 1;
  }
  return 0;
}

int eldr_sweep_variants(const char *policies, const double *taus, size_t ntaus, int vanilla,
                        int decor, int decor_rows, eldr_sweep_variant *vs, size_t cap, size_t *nv,
                        eldr_diag *d) {
  static const char *base_names[] = {"random", "rr", "jsq", "p2c"};
  *nv = 0;
  char *copy = strdup(policies), *save = NULL;
  if (!copy) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (!strcmp(tok, "all")) {
      for (size_t i = 0; i < 4; i++) {
        eldr_policy_kind k;
        eldr_policy_parse(base_names[i], &k);
        add_variant(vs, nv, cap, base_names[i], k, 0, 0, decor, 0, 1, 1);
      }
      add_variant(vs, nv, cap, "domain", ELDR_POLICY_DOMAIN, 0, 0, decor, 0, 0, 1);
      add_variant(vs, nv, cap, "eldr", ELDR_POLICY_ELDR, -1, 0, decor, 0, 0, 1);
      add_variant(vs, nv, cap, "eldr-permuted", ELDR_POLICY_ELDR, -1, 1, decor, 0, 0, 1);
      add_variant(vs, nv, cap, "footprint", ELDR_POLICY_FOOTPRINT, 0, 0, decor, 0, 0, 1);
      continue;
    }
    if (add_footprint_variant(vs, nv, cap, tok, decor)) continue;
    if (!strcmp(tok, "eldr-permuted")) {
      add_variant(vs, nv, cap, tok, ELDR_POLICY_ELDR, -1, 1, decor, 0, 0, 1);
      continue;
    }
    eldr_policy_kind k;
    if (eldr_policy_parse(tok, &k)) {
      int rc = eldr_diag_fail(
          d, ELDR_EINVAL,
          "unknown policy '%s' (random rr jsq p2c domain eldr eldr-permuted footprint "
          "footprint-oracle footprint-permuted footprint-all footprint-mask footprint-raw "
          "footprint-oracle-permuted footprint-mask-permuted footprint-raw-permuted all)", tok);
      free(copy);
      return rc;
    }
    add_variant(vs, nv, cap, eldr_policy_name(k), k, k == ELDR_POLICY_ELDR ? -1 : 0, 0, decor, 0,
                k <= ELDR_POLICY_P2C, 1);
  }
  free(copy);
  for (size_t i = 0; i < ntaus; i++) {
    char lab[48];
    snprintf(lab, sizeof lab, "eldr(tau=%g)", taus[i]);
    add_variant(vs, nv, cap, lab, ELDR_POLICY_ELDR, taus[i], 0, decor, 0, 0, 0);
  }
  if (vanilla) add_variant(vs, nv, cap, "eldr-vanilla", ELDR_POLICY_ELDR, -1, 0, decor, 1, 0, 0);
  if (decor_rows && !decor) {
    size_t n0 = *nv;
    for (size_t i = 0; i < n0; i++) {
      if (!vs[i].is_headline) continue;
      char lab[48];
      snprintf(lab, sizeof lab, "%.36s+decor", vs[i].label);
      add_variant(vs, nv, cap, lab, vs[i].kind, vs[i].tau, vs[i].permute, 1, 0, vs[i].is_baseline,
                  0);
      if (*nv > 0 && !strcmp(vs[*nv - 1].label, lab)) {
        vs[*nv - 1].oracle = vs[i].oracle;
        vs[*nv - 1].fp_layers = vs[i].fp_layers;
        vs[*nv - 1].fp_no_prior = vs[i].fp_no_prior;
      }
    }
  }
  return 0;
}

int eldr_sweep_variants_pd(eldr_sweep_variant *vs, size_t *nv, size_t cap, const eldr_sim_pd *pds,
                           size_t npd, eldr_diag *d) {
  const size_t n = *nv;
  if (!npd) return 0;
  if (n * npd > cap)
    return eldr_diag_fail(d, ELDR_ERANGE, "%zu variants at %zu modes: more than %zu runs per rate", n, npd, cap);
  for (size_t m = 0; m < npd; m++)
    for (size_t i = 0; i < n; i++) {
      eldr_sweep_variant *v = &vs[m * n + i];
      if (m) {
        *v = vs[i];
        char lab[sizeof v->label];
        snprintf(lab, sizeof lab, "%.30s@%s", vs[i].label, eldr_sim_pd_name(pds[m]));
        memcpy(v->label, lab, sizeof lab);
      }
      v->pd_set = 1;
      v->pd = pds[m];
    }
  *nv = n * npd;
  return 0;
}

int eldr_sweep_sigs_compute(const eldr_trace *t, const size_t *idx, size_t n,
                            const eldr_artifact *a, eldr_sweep_sigs *ps) {
  memset(ps, 0, sizeof *ps);
  ps->sigs = calloc(n * a->dim, sizeof *ps->sigs);
  ps->ok = calloc(n, 1);
  size_t LE = eldr_shape_cells(&t->shape);
  uint32_t *counts = calloc(LE, sizeof *counts);
  float *gates = calloc(LE, sizeof *gates);
  if (!ps->sigs || !ps->ok || !counts || !gates) {
    free(counts);
    free(gates);
    eldr_sweep_sigs_free(ps);
    return ELDR_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    int rc = eldr_fit_request_signature(a, t, &t->req[idx[i]], counts, gates, ps->sigs + i * a->dim);
    ps->ok[i] = rc == 0;
    ps->n_ok += rc == 0;
  }
  free(counts);
  free(gates);
  return 0;
}

void eldr_sweep_sigs_free(eldr_sweep_sigs *s) {
  free(s->sigs);
  free(s->ok);
  memset(s, 0, sizeof *s);
}

/* The runs of a sweep, shared by the worker threads. */
typedef struct sweep_state {
  const eldr_sweep *s;
  eldr_sweep_row *rows;
  size_t nrows;
  atomic_int failed;
  eldr_diag diag;
  pthread_mutex_t lock; /* the failure and the progress callback */
} sweep_state;

typedef struct run_progress {
  sweep_state *st;
  const char *label;
} run_progress;

static void on_sim_progress(void *ctx, size_t done, size_t total) {
  run_progress *rp = ctx;
  pthread_mutex_lock(&rp->st->lock);
  rp->st->s->progress(rp->st->s->progress_ctx, rp->label, done, total);
  pthread_mutex_unlock(&rp->st->lock);
}

/* Run i of the sweep (a parallel-for task); none after a failure. */
static void sweep_task(void *arg, size_t i) {
  sweep_state *st = arg;
  const eldr_sweep *s = st->s;
  if (atomic_load(&st->failed)) return;
  size_t ri = i / s->nv, vi = i % s->nv;
  const eldr_sweep_variant *v = &s->vs[vi];
  eldr_sweep_row *rw = &st->rows[i];
  rw->v = v;
  rw->rate = s->rates[ri];
  eldr_sim_config c2 = *s->cfg;
  c2.rate = s->rates[ri];
  c2.policy = v->kind;
  c2.tau = v->tau;
  c2.permute_signatures = v->permute;
  c2.decorrelate = v->decorrelate;
  c2.footprint_oracle = v->oracle;
  c2.footprint_mask = v->fp_layers == 2 ? s->footprint_mask : NULL;
  c2.footprint_no_prior = v->fp_no_prior;
  if (v->pd_set) c2.pd = v->pd;
  char label[192];
  snprintf(label, sizeof label, "sim: run %zu/%zu %.47s @ %g/s", i + 1, st->nrows, v->label,
           s->rates[ri]);
  run_progress rp = {st, label};
  if (s->progress) {
    c2.progress = on_sim_progress;
    c2.progress_ctx = &rp;
  }
  eldr_diag d = {{0}};
  int rc = 0;
  const eldr_sim_pool *pool = v->vanilla ? s->pool_vanilla : s->pool;
  if (s->keep_logs) { /* one entry per arrival (trace arrivals: the pool) */
    size_t n = c2.rate > 0 ? c2.n_requests : pool->n;
    c2.log = rw->log = calloc(n ? n : 1, sizeof *rw->log);
    if (!rw->log) rc = eldr_diag_fail(&d, ELDR_ENOMEM, "out of memory (request log)");
  }
  if (!rc) rc = eldr_sim_run(pool, s->lm, &c2, &rw->r, &d);
  if (rc) {
    pthread_mutex_lock(&st->lock);
    if (!atomic_load(&st->failed)) {
      if (d.msg[0]) {
        st->diag = d;
        eldr_diag_prefix(&st->diag, "%s", v->label);
      } else {
        eldr_diag_fail(&st->diag, rc, "%s: %s", v->label, eldr_strerror(rc));
      }
      atomic_store(&st->failed, rc);
    }
    pthread_mutex_unlock(&st->lock);
  }
}

int eldr_sweep_run(const eldr_sweep *s, eldr_sweep_row *rows, eldr_diag *d) {
  if (!s->nv || !s->nrates || !s->pool || !s->lm || !s->cfg || s->jobs < 1 ||
      s->jobs > ELDR_SWEEP_MAX_JOBS)
    return eldr_diag_fail(d, ELDR_EINVAL, "sweep: empty or bad configuration");
  sweep_state st = {.s = s, .rows = rows, .nrows = s->nrates * s->nv};
  atomic_init(&st.failed, 0);
  pthread_mutex_init(&st.lock, NULL);
  eldr_parallel_for(st.nrows, (unsigned)s->jobs, sweep_task, &st);
  pthread_mutex_destroy(&st.lock);
  int rc = atomic_load(&st.failed);
  if (rc && d) *d = st.diag;
  return rc;
}

void eldr_sweep_rows_free(eldr_sweep_row *rows, size_t n) {
  for (size_t i = 0; rows && i < n; i++) {
    free(rows[i].log);
    rows[i].log = NULL;
  }
}

const eldr_sweep_row *eldr_sweep_find(const eldr_sweep_row *rows, size_t n, double rate,
                                      const char *label) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].rate == rate && !strcmp(rows[i].v->label, label)) return &rows[i];
  return NULL;
}

double eldr_sweep_metric_value(const eldr_sim_result *r, eldr_sweep_metric m) {
  switch (m) {
  case ELDR_METRIC_TPOT_P50: return r->tpot_p50;
  case ELDR_METRIC_TPOT_P99: return r->tpot_p99;
  case ELDR_METRIC_TPOT_PF_P50: return r->tpot_pf_p50;
  case ELDR_METRIC_TPOT_PF_P99: return r->tpot_pf_p99;
  case ELDR_METRIC_TTFT_P50: return r->ttft_p50;
  case ELDR_METRIC_TTFT_P99: return r->ttft_p99;
  case ELDR_METRIC_ITL_P99: return r->itl_p99;
  case ELDR_METRIC_E2E_P50: return r->e2e_p50;
  case ELDR_METRIC_E2E_P99: return r->e2e_p99;
  default: return NAN;
  }
}

const char *eldr_sweep_metric_name(eldr_sweep_metric m) {
  static const char *const names[ELDR_METRIC__COUNT] = {
      "tpot_p50", "tpot_p99", "tpot_pf_p50", "tpot_pf_p99", "ttft_p50",
      "ttft_p99", "itl_p99",  "e2e_p50",     "e2e_p99"};
  return (int)m >= 0 && m < ELDR_METRIC__COUNT ? names[m] : "unknown";
}

const eldr_sweep_row *eldr_sweep_best_baseline_by(const eldr_sweep_row *rows, size_t n,
                                                  double rate, int decor, eldr_sweep_metric m) {
  const eldr_sweep_row *b = NULL;
  for (size_t i = 0; i < n; i++) {
    if (rows[i].rate != rate || !rows[i].v->is_baseline || rows[i].v->decorrelate != decor)
      continue;
    double x = eldr_sweep_metric_value(&rows[i].r, m);
    if (!b || x < eldr_sweep_metric_value(&b->r, m)) b = &rows[i];
  }
  return b;
}

const eldr_sweep_row *eldr_sweep_best_baseline(const eldr_sweep_row *rows, size_t n, double rate,
                                               int decor, int p99) {
  return eldr_sweep_best_baseline_by(rows, n, rate, decor,
                                     p99 ? ELDR_METRIC_TPOT_P99 : ELDR_METRIC_TPOT_P50);
}
