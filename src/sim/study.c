/* study.c — the shared machinery of the paper studies (eldr/study.h): the
 * honest per-seed setup (split, fit on the fit part only, served pool), one
 * simulation, gains net of the replay control, result tables. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/study_internal.h"

const char *const eldr_study_names[] = {"fig2",  "fig3",   "fig4",     "fig11",     "fig15",
                                        "fig16", "table2", "rho-gain", "crossover", NULL};

static const uint64_t k_default_seeds[] = {1, 2, 3};

void eldr_study_opts_default(eldr_study_opts *o) {
  memset(o, 0, sizeof *o);
  o->fit_fraction = 0.5;
  o->n_prefill = 8;
  o->n_decode = 16;
  o->max_batch = 64;
  o->n_requests = 2000;
  o->load = 0.95;
  o->tau = 0.1;
  o->restarts = 4;
}

size_t study_n_seeds(const eldr_study_opts *o) {
  return o->seeds && o->n_seeds ? o->n_seeds : sizeof k_default_seeds / sizeof k_default_seeds[0];
}

uint64_t study_seed(const eldr_study_opts *o, size_t i) {
  return o->seeds && o->n_seeds ? o->seeds[i] : k_default_seeds[i];
}

void study_progress(const eldr_study_opts *o, const char *fmt, ...) {
  if (!o->progress) return;
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  o->progress(o->progress_ctx, buf);
}

void study_mean_sd(const double *v, size_t n, double *mean, double *sd) {
  double s = 0;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (isfinite(v[i])) s += v[i], k++;
  double m = k ? s / (double)k : NAN, q = 0;
  for (size_t i = 0; i < n; i++)
    if (isfinite(v[i])) q += (v[i] - m) * (v[i] - m);
  *mean = m;
  *sd = k > 1 ? sqrt(q / (double)(k - 1)) : 0;
}

double eldr_study_spearman(const double *x, const double *y, size_t n) {
  if (n < 2) return NAN;
  double *rx = malloc(n * sizeof *rx), *ry = malloc(n * sizeof *ry);
  if (!rx || !ry) {
    free(rx);
    free(ry);
    return NAN;
  }
  for (int pass = 0; pass < 2; pass++) {
    const double *v = pass ? y : x;
    double *r = pass ? ry : rx;
    for (size_t i = 0; i < n; i++) {
      size_t less = 0, eq = 0;
      for (size_t j = 0; j < n; j++) less += v[j] < v[i], eq += v[j] == v[i];
      r[i] = (double)less + ((double)eq + 1.0) / 2.0; /* average rank, 1-based */
    }
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; i++) mx += rx[i], my += ry[i];
  mx /= (double)n;
  my /= (double)n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; i++) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  free(rx);
  free(ry);
  return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
}

void arm_free(study_arm *a) {
  if (!a) return;
  free(a->fit_idx);
  free(a->serve_idx);
  eldr_artifact_free(a->art);
  if (a->have_rep) eldr_fit_report_free(&a->rep);
  eldr_sweep_sigs_free(&a->ps);
  eldr_sim_tokens_free(a->tokens);
  memset(a, 0, sizeof *a);
}

int arm_build(const eldr_study_opts *o, uint64_t seed, const eldr_fit_opts *fo, int fit,
              study_arm *a, eldr_diag *d) {
  memset(a, 0, sizeof *a);
  a->seed = seed;
  const eldr_trace *t = o->trace;
  if (!t || !t->n) return eldr_diag_fail(d, ELDR_EINVAL, "study: no trace");
  a->ft = t;
  a->st = o->serve ? o->serve : t;
  size_t n = t->n;
  a->fit_idx = malloc(n * sizeof *a->fit_idx);
  if (!a->fit_idx) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  eldr_fit_shuffle(a->fit_idx, n, seed); /* the split eldr fit / sim / demo use */
  if (o->serve) {
    a->n_fit = n;
    a->n_serve = o->serve->n;
    a->serve_idx = malloc((a->n_serve ? a->n_serve : 1) * sizeof *a->serve_idx);
    if (!a->serve_idx) goto oom;
    for (size_t i = 0; i < a->n_serve; i++) a->serve_idx[i] = i;
  } else {
    a->n_fit = (size_t)floor(o->fit_fraction * (double)n);
    if (a->n_fit < 1 || a->n_fit >= n) {
      arm_free(a);
      return eldr_diag_fail(d, ELDR_EINVAL,
                            "study: fit fraction %g leaves no fit or no serve requests (%zu)",
                            o->fit_fraction, n);
    }
    a->n_serve = n - a->n_fit;
    a->serve_idx = malloc(a->n_serve * sizeof *a->serve_idx);
    if (!a->serve_idx) goto oom;
    memcpy(a->serve_idx, a->fit_idx + a->n_fit, a->n_serve * sizeof *a->serve_idx);
  }
  a->pool = (eldr_sim_pool){.trace = a->st, .idx = a->serve_idx, .n = a->n_serve};
  if (fit) {
    eldr_fit_opts f;
    if (fo) {
      f = *fo;
    } else {
      eldr_fit_opts_default(&f);
      f.k = o->n_decode;
      f.tau = o->tau;
      f.restarts = o->restarts;
    }
    f.seed = seed;
    f.subset = a->fit_idx;
    f.n_subset = a->n_fit;
    int rc = eldr_fit(t, &f, &a->art, &a->rep, d);
    if (rc) {
      arm_free(a);
      return rc;
    }
    a->have_rep = 1;
    if (eldr_sweep_sigs_compute(a->st, a->serve_idx, a->n_serve, a->art, &a->ps)) goto oom;
    a->sigs = a->ps.sigs;
    a->ok = a->ps.ok;
    a->pool.sigs = a->sigs;
    a->pool.sig_ok = a->ok;
    a->pool.dim = a->art->dim;
    a->pool.centroids = a->art->centroids;
    a->pool.n_centroids = a->art->k;
  }
  int rc = eldr_sim_tokens_build(&a->pool, ELDR_SIM_TOK_AUTO, &a->tokens, d);
  if (rc) {
    arm_free(a);
    return rc;
  }
  a->pool.tokens = a->tokens;
  return ELDR_OK;
oom:
  arm_free(a);
  return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
}

static void arm_config(const eldr_study_opts *o, const study_arm *a, size_t n_decode,
                       eldr_sim_config *c) {
  eldr_sim_config_default(c);
  c->n_prefill = o->n_prefill;
  c->n_decode = n_decode;
  c->max_batch = o->max_batch;
  c->n_requests = o->n_requests;
  /* a pool of another size at the same load serves proportionally more (or
   * fewer) requests per second: its runs get proportionally more arrivals,
   * so that every pool size runs as long in simulated time and fills and
   * drains for the same share of its run (table2; the other studies run
   * o->n_decode decoders) */
  if (n_decode != o->n_decode && o->n_decode)
    c->n_requests = (size_t)((double)o->n_requests * (double)n_decode / (double)o->n_decode + 0.5);
  if (!c->n_requests) c->n_requests = 1;
  c->seed = a->seed;
  c->tau = o->tau;
}

double arm_capacity(const eldr_study_opts *o, const study_arm *a, size_t n_decode) {
  eldr_sim_config c;
  arm_config(o, a, n_decode, &c);
  return eldr_sim_capacity(&a->pool, &o->lm, &c);
}

int arm_sim(const eldr_study_opts *o, const study_arm *a, size_t n_decode, eldr_policy_kind kind,
            int permute, double tau, double rate, eldr_sim_result *r, eldr_diag *d) {
  eldr_sim_config c;
  arm_config(o, a, n_decode, &c);
  c.policy = kind;
  c.permute_signatures = permute;
  c.tau = tau;
  c.rate = rate > 0 ? rate : o->load * eldr_sim_capacity(&a->pool, &o->lm, &c);
  if (!(c.rate > 0)) return eldr_diag_fail(d, ELDR_EINVAL, "study: capacity estimate is 0");
  return eldr_sim_run(&a->pool, &o->lm, &c, r, d);
}

int arm_gain(const eldr_study_opts *o, const study_arm *a, size_t n_decode, double tau,
             double rate, study_gain *g, eldr_diag *d) {
  static const eldr_policy_kind base[] = {ELDR_POLICY_RANDOM, ELDR_POLICY_RR, ELDR_POLICY_JSQ,
                                          ELDR_POLICY_P2C};
  memset(g, 0, sizeof *g);
  if (!(rate > 0)) rate = o->load * arm_capacity(o, a, n_decode);
  g->rate = rate;
  g->best_tpot = g->best_pf = INFINITY;
  eldr_sim_result r;
  int rc;
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
    if ((rc = arm_sim(o, a, n_decode, base[i], 0, tau, rate, &r, d))) return rc;
    if (r.tpot_mean < g->best_tpot) {
      g->best_tpot = r.tpot_mean;
      g->best = eldr_policy_name(base[i]);
      g->best_batch = r.mean_batch;
      g->best_union = r.mean_union;
    }
    if (r.tpot_pf_mean < g->best_pf) g->best_pf = r.tpot_pf_mean;
  }
  if ((rc = arm_sim(o, a, n_decode, ELDR_POLICY_ELDR, 0, tau, rate, &r, d))) return rc;
  g->eldr_tpot = r.tpot_mean;
  g->eldr_pf = r.tpot_pf_mean;
  g->eldr_batch = r.mean_batch;
  g->eldr_union = r.mean_union;
  g->eldr_copies = r.copies_in_flight;
  g->eldr_dup = r.batch_dup_frac;
  if ((rc = arm_sim(o, a, n_decode, ELDR_POLICY_ELDR, 1, tau, rate, &r, d))) return rc;
  g->perm_tpot = r.tpot_mean;
  g->perm_pf = r.tpot_pf_mean;
  g->gain = g->eldr_tpot / g->best_tpot - 1.0;
  g->control = g->perm_tpot / g->best_tpot - 1.0;
  g->net = g->gain - g->control;
  g->gain_pf = g->eldr_pf / g->best_pf - 1.0;
  g->control_pf = g->perm_pf / g->best_pf - 1.0;
  g->net_pf = g->gain_pf - g->control_pf;
  return ELDR_OK;
}

json_t *study_result(const char *name, const char *const *cols, size_t ncols, const char *x,
                     const char *const *y, size_t ny, const char *group, const char *kind,
                     const char *xlabel, const char *ylabel) {
  json_t *res = json_object(), *c = json_array(), *yy = json_array(), *plot = json_object();
  if (!res || !c || !yy || !plot) goto fail;
  for (size_t i = 0; i < ncols; i++) json_array_append_new(c, json_string(cols[i]));
  for (size_t i = 0; i < ny; i++) json_array_append_new(yy, json_string(y[i]));
  json_object_set_new(plot, "x", json_string(x));
  json_object_set_new(plot, "y", yy);
  json_object_set_new(plot, "group", group ? json_string(group) : json_null());
  json_object_set_new(plot, "kind", json_string(kind));
  json_object_set_new(plot, "xlabel", json_string(xlabel));
  json_object_set_new(plot, "ylabel", json_string(ylabel));
  json_object_set_new(res, "study", json_string(name));
  json_object_set_new(res, "columns", c);
  json_object_set_new(res, "rows", json_array());
  json_object_set_new(res, "plot", plot);
  return res;
fail:
  json_decref(res);
  json_decref(c);
  json_decref(yy);
  json_decref(plot);
  return NULL;
}

void study_plot_title(json_t *res, const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  json_object_set_new(json_object_get(res, "plot"), "title", json_string(buf));
}

void study_plot_group2(json_t *res, const char *first, const char *fmt1, const char *second,
                       const char *fmt2) {
  json_t *plot = json_object_get(res, "plot");
  json_object_set_new(plot, "group", json_pack("[s,s]", first, second));
  json_object_set_new(plot, "group_format", json_pack("[s,s]", fmt1, fmt2));
}

int study_row(json_t *res, const char *fmt, ...) {
  json_t *row = json_array();
  if (!row) return ELDR_ENOMEM;
  va_list ap;
  va_start(ap, fmt);
  for (const char *f = fmt; *f; f++) {
    json_t *v = NULL;
    if (*f == 'd') {
      double x = va_arg(ap, double);
      v = isfinite(x) ? json_real(x) : json_null();
    } else if (*f == 'u') {
      v = json_integer((json_int_t)va_arg(ap, size_t));
    } else {
      const char *s = va_arg(ap, const char *);
      v = json_string(s ? s : "");
    }
    if (!v || json_array_append_new(row, v)) {
      va_end(ap);
      json_decref(row);
      return ELDR_ENOMEM;
    }
  }
  va_end(ap);
  return json_array_append_new(json_object_get(res, "rows"), row) ? ELDR_ENOMEM : ELDR_OK;
}

void study_headline(json_t *res, const char *label, double value, double sd) {
  json_t *h = json_object();
  json_object_set_new(h, "label", json_string(label));
  json_object_set_new(h, "value", isfinite(value) ? json_real(value) : json_null());
  json_object_set_new(h, "sd", isfinite(sd) ? json_real(sd) : json_null());
  json_object_set_new(res, "headline", h);
}

static void study_config(json_t *res, const eldr_study_opts *o) {
  json_t *c = json_object(), *seeds = json_array();
  for (size_t i = 0; i < study_n_seeds(o); i++)
    json_array_append_new(seeds, json_integer((json_int_t)study_seed(o, i)));
  json_object_set_new(c, "model", json_string(o->trace ? o->trace->model : ""));
  if (o->trace && o->trace->generator)
    json_object_set_new(c, "generator", json_string(o->trace->generator));
  json_object_set_new(c, "requests_in_trace", json_integer(o->trace ? (json_int_t)o->trace->n : 0));
  json_object_set_new(c, "serve_trace", json_boolean(o->serve != NULL));
  json_object_set_new(c, "fit_fraction", json_real(o->fit_fraction));
  json_object_set_new(c, "latency", json_string(o->lm.model));
  json_object_set_new(c, "hardware", json_string(o->lm.hardware));
  json_object_set_new(c, "prefill", json_integer((json_int_t)o->n_prefill));
  json_object_set_new(c, "decode", json_integer((json_int_t)o->n_decode));
  json_object_set_new(c, "max_batch", json_integer((json_int_t)o->max_batch));
  json_object_set_new(c, "requests", json_integer((json_int_t)o->n_requests));
  json_object_set_new(c, "load", json_real(o->load));
  json_object_set_new(c, "tau", json_real(o->tau));
  json_object_set_new(c, "seeds", seeds);
  json_object_set_new(res, "config", c);
}

int eldr_study_run(const char *name, const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  static const struct {
    const char *name;
    int (*fn)(const eldr_study_opts *, json_t **, eldr_diag *);
  } k[] = {{"fig2", study_fig2},   {"fig3", study_fig3},     {"fig4", study_fig4},
           {"fig11", study_fig11}, {"fig15", study_fig15},   {"fig16", study_fig16},
           {"table2", study_table2}, {"rho-gain", study_rho_gain},
           {"crossover", study_crossover}};
  if (!out || !o) return eldr_diag_fail(d, ELDR_EINVAL, "study: argument missing");
  *out = NULL;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    if (strcmp(name, k[i].name)) continue;
    if (strcmp(name, "fig2") && strcmp(name, "crossover")) { /* the model studies need no trace */
      if (!o->trace) return eldr_diag_fail(d, ELDR_EINVAL, "study %s: no trace", name);
      const eldr_shape *s = &o->trace->shape, *m = &o->lm.shape;
      if (s->num_layers != m->num_layers || s->num_experts != m->num_experts ||
          s->top_k != m->top_k)
        return eldr_diag_fail(d, ELDR_ESHAPE,
                              "study: latency model %s is %u x %u top-%u, the trace %u x %u top-%u",
                              o->lm.model, m->num_layers, m->num_experts, m->top_k, s->num_layers,
                              s->num_experts, s->top_k);
      if (o->serve && (o->serve->shape.num_layers != s->num_layers ||
                       o->serve->shape.num_experts != s->num_experts ||
                       o->serve->shape.top_k != s->top_k))
        return eldr_diag_fail(d, ELDR_ESHAPE, "study: the serve trace's shape differs");
    }
    int rc = k[i].fn(o, out, d);
    if (rc == ELDR_OK && *out) study_config(*out, o);
    return rc;
  }
  return eldr_diag_fail(d, ELDR_EINVAL,
                        "unknown study '%s' (fig2, fig3, fig4, fig11, fig15, fig16, table2, "
                        "rho-gain, crossover)",
                        name);
}
