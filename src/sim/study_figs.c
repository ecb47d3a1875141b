/* study_figs.c — the individual paper studies (eldr/study.h) on the shared
 * machinery of study.c. Each returns a result table, a summary paragraph
 * and what the paper reports. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/quantile.h"
#include "eldr/rng.h"
#include "eldr/signature.h"
#include "eldr/tracestats.h"
#include "sim/study_internal.h"

#define MAX_SEEDS 64
#define PCT(x) (100.0 * (x))

static int too_many_seeds(const eldr_study_opts *o, eldr_diag *d) {
  if (study_n_seeds(o) > MAX_SEEDS)
    return eldr_diag_fail(d, ELDR_EINVAL, "study: at most %d seeds", MAX_SEEDS);
  return 0;
}

static void set_text(json_t *res, const char *key, const char *text) {
  json_object_set_new(res, key, json_string(text));
}

/* ---- fig2: the step-latency model ------------------------------------- */

static double uniform_step(const eldr_latency_model *m, size_t batch, uint32_t u) {
  uint32_t un[1024];
  uint32_t L = m->shape.num_layers < 1024 ? m->shape.num_layers : 1024;
  for (uint32_t l = 0; l < L; l++) un[l] = u;
  return eldr_latency_step(m, batch, un, (double)batch * 1024.0);
}

int study_fig2(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  (void)d;
  static const char *const cols[] = {"overhead", "batch", "distinct", "step_ms"};
  static const char *const y[] = {"step_ms"};
  json_t *res = study_result("fig2", cols, 4, "distinct", y, 1, "batch", "lines",
                             "distinct experts per layer", "decode step (ms)");
  if (!res) return ELDR_ENOMEM;
  study_plot_group2(res, "overhead", "per-layer overhead: %s", "batch", "batch %s");
  study_plot_title(res, "fig2: decode step time vs distinct experts per layer, %s on %s",
                   o->lm.model, o->lm.hardware);
  static const size_t batches[] = {1, 16, 64};
  const uint32_t E = o->lm.shape.num_experts, K = o->lm.shape.top_k;
  double ratio[2] = {NAN, NAN};
  for (int ov = 0; ov < 2; ov++) {
    eldr_latency_model m = o->lm;
    if (ov) m.layer_overhead_s = 0;
    for (size_t b = 0; b < 3; b++) {
      uint32_t maxu = (uint32_t)(batches[b] * K < E ? batches[b] * K : E);
      for (uint32_t u = K; u <= maxu; u += (maxu - K) / 8 ? (maxu - K) / 8 : 1)
        study_row(res, "sudd", ov ? "zero" : "preset", batches[b], (double)u,
                  1e3 * uniform_step(&m, batches[b], u));
    }
    uint32_t full = (uint32_t)(64 * K < E ? 64 * K : E);
    ratio[ov] = uniform_step(&m, 64, full) / uniform_step(&m, 64, K);
  }
  char s[900];
  snprintf(s, sizeof s,
           "Step-latency model %s on %s: at batch 64 a step whose batch touches %u distinct "
           "experts per layer takes %.2fx one that touches %u (per-layer overhead %.1f us as in "
           "the preset, which is fitted, not measured); with that overhead set to 0 the ratio is "
           "%.2fx. The overhead dilutes how much a smaller expert union saves.",
           o->lm.model, o->lm.hardware, (unsigned)(64 * K < E ? 64 * K : E), ratio[0], K,
           1e6 * o->lm.layer_overhead_s, ratio[1]);
  set_text(res, "summary", s);
  set_text(res, "paper", "Fig. 2: step time grows with distinct experts (4.7x on MI300X)");
  study_headline(res, "step time, all vs top-k experts at batch 64 (x)", ratio[0], NAN);
  *out = res;
  return ELDR_OK;
}

/* ---- fig3: prefill->decode correlation vs null baselines ---------------- */

static double median_of(double *v, size_t n) {
  return n ? eldr_quantile(v, n, 0.5) : NAN;
}

int study_fig3(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  const eldr_trace *t = o->serve ? o->serve : o->trace;
  const size_t n = t->n, LE = eldr_shape_cells(&t->shape), ns = study_n_seeds(o);
  uint32_t *pre = malloc(n * LE * sizeof *pre), *dec = malloc(n * LE * sizeof *dec);
  double *v = malloc((n ? n : 1) * sizeof *v);
  size_t *same = malloc((n ? n : 1) * sizeof *same);
  double med[3][MAX_SEEDS];
  if (!pre || !dec || !v || !same) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory (%zu x %zu counts)", n, LE);
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    eldr_trace_request_counts(t, &t->req[i], 0, pre + i * LE);
    eldr_trace_request_counts(t, &t->req[i], 1, dec + i * LE);
  }
  for (size_t s = 0; s < ns; s++) {
    eldr_rng r;
    eldr_rng_seed(&r, study_seed(o, s) ^ 0xf163ULL);
    for (int kind = 0; kind < 3; kind++) { /* 0 own, 1 random pair, 2 same-domain pair */
      size_t k = 0;
      for (size_t i = 0; i < n && n > 1; i++) {
        size_t j = i;
        if (kind == 1) {
          j = (size_t)eldr_rng_below(&r, n - 1);
          if (j >= i) j++;
        } else if (kind == 2) {
          size_t m = 0;
          if (t->req[i].domain < 0) continue;
          for (size_t q = 0; q < n; q++)
            if (q != i && t->req[q].domain == t->req[i].domain) same[m++] = q;
          if (!m) continue;
          j = same[eldr_rng_below(&r, m)];
        }
        double p = eldr_tracestats_pearson(pre + i * LE, dec + j * LE, LE);
        if (isfinite(p)) v[k++] = p;
      }
      med[kind][s] = median_of(v, k);
    }
  }
  static const char *const cols[] = {"pairing", "median_pearson", "sd_over_seeds"};
  static const char *const y[] = {"median_pearson"};
  json_t *res = study_result("fig3", cols, 3, "pairing", y, 1, NULL, "bars", "",
                             "median Pearson (prefill vs decode counts)");
  if (!res) {
    rc = ELDR_ENOMEM;
    goto done;
  }
  study_plot_title(res, "fig3: prefill->decode correlation of a request's expert counts, %s", t->model);
  static const char *const names[] = {"own request", "random pair", "same-domain pair"};
  double m[3], sd[3];
  for (int k = 0; k < 3; k++) {
    study_mean_sd(med[k], ns, &m[k], &sd[k]);
    study_row(res, "sdd", names[k], m[k], sd[k]);
  }
  char s[900];
  snprintf(s, sizeof s,
           "On %zu requests of %s, a request's decode expert counts correlate with its own "
           "prefill counts at a median Pearson of %.3f, against %.3f for a random other request "
           "and %.3f for another request of the same domain (null baselines, %zu seeds, sd "
           "%.3f/%.3f). The gap between own and same-domain is what a per-request signature "
           "knows beyond the domain label.",
           n, t->model, m[0], m[1], m[2], ns, sd[1], sd[2]);
  set_text(res, "summary", s);
  set_text(res, "paper", "Fig. 3: prefill->decode correlation 0.83-0.85, well above the null pairings");
  study_headline(res, "median prefill->decode Pearson", m[0], sd[0]);
  *out = res;
done:
  free(pre);
  free(dec);
  free(v);
  free(same);
  return rc;
}

/* ---- fig4: distinct experts per batching rule --------------------------- */

int study_fig4(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  static const size_t bs[] = {8, 16, 32, 64};
  enum { NB = 4 };
  const size_t ns = study_n_seeds(o);
  double dist[NB][ELDR_BATCH__COUNT][MAX_SEEDS];
  for (size_t s = 0; s < ns; s++) {
    study_arm a;
    study_progress(o, "fig4: seed %zu/%zu: fit", s + 1, ns);
    if ((rc = arm_build(o, study_seed(o, s), NULL, 1, &a, d))) return rc;
    /* a view of the served requests only (shallow copies, freed below) */
    eldr_trace view = *a.st;
    view.req = malloc(a.n_serve * sizeof *view.req);
    int *cl = malloc(a.n_serve * sizeof *cl);
    if (!view.req || !cl) {
      free(view.req);
      free(cl);
      arm_free(&a);
      return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    }
    view.n = view.cap = a.n_serve;
    for (size_t i = 0; i < a.n_serve; i++) {
      view.req[i] = a.st->req[a.serve_idx[i]];
      cl[i] = -1;
      double best = -INFINITY;
      for (size_t k = 0; a.ok[i] && k < a.art->k; k++) {
        double v = eldr_dot(a.sigs + i * a.art->dim, a.art->centroids + k * a.art->dim, a.art->dim);
        if (v > best) best = v, cl[i] = (int)k;
      }
    }
    eldr_tracestats_opts so;
    eldr_tracestats_opts_default(&so);
    so.batch_sizes = bs;
    so.n_batch_sizes = NB;
    so.seed = study_seed(o, s);
    so.cluster = cl;
    so.batches = 32;
    eldr_tracestats st;
    rc = eldr_tracestats_compute(&view, &so, &st, d);
    free(view.req);
    free(cl);
    arm_free(&a);
    if (rc) return rc;
    for (size_t b = 0; b < NB; b++)
      for (int r = 0; r < ELDR_BATCH__COUNT; r++) dist[b][r][s] = st.batch[b].distinct[r];
    eldr_tracestats_free(&st);
  }
  static const char *const cols[] = {"batch", "rule", "distinct", "distinct_sd", "reduction_pct",
                                     "reduction_sd"};
  static const char *const y[] = {"distinct"};
  json_t *res = study_result("fig4", cols, 6, "batch", y, 1, "rule", "lines", "decode batch size",
                             "distinct experts per layer per step");
  if (!res) return ELDR_ENOMEM;
  study_plot_title(res, "fig4: distinct experts per decode step by batching rule, %s (held out)",
                   o->trace->model);
  double red_sum[ELDR_BATCH__COUNT] = {0};
  size_t red_n[ELDR_BATCH__COUNT] = {0};
  for (size_t b = 0; b < NB; b++) {
    for (int r = 0; r < ELDR_BATCH__COUNT; r++) {
      double m, sd, red[MAX_SEEDS], rm, rsd;
      study_mean_sd(dist[b][r], ns, &m, &sd);
      for (size_t s = 0; s < ns; s++) red[s] = 1.0 - dist[b][r][s] / dist[b][ELDR_BATCH_RANDOM][s];
      study_mean_sd(red, ns, &rm, &rsd);
      if (b < 3 && isfinite(rm)) red_sum[r] += rm, red_n[r]++;
      study_row(res, "usdddd", bs[b], eldr_tracestats_rule_name(r), m, sd, PCT(rm), PCT(rsd));
    }
  }
  char s[900];
  snprintf(s, sizeof s,
           "Held-out requests of %s (artifact fitted on the other part, %zu seeds): decode "
           "batches of one domain touch %.1f%% fewer distinct experts per layer than random "
           "batches and batches of one artifact cluster %.1f%% fewer (mean over the batch sizes "
           "8-32 that could be formed: %zu and %zu of 3; a cluster rule needs a cluster with at "
           "least B held-out requests).",
           o->trace->model, ns, PCT(red_sum[ELDR_BATCH_DOMAIN] / (double)red_n[ELDR_BATCH_DOMAIN]),
           PCT(red_sum[ELDR_BATCH_CLUSTER] / (double)red_n[ELDR_BATCH_CLUSTER]),
           red_n[ELDR_BATCH_DOMAIN], red_n[ELDR_BATCH_CLUSTER]);
  set_text(res, "summary", s);
  set_text(res, "paper", "Fig. 4: same-domain batches touch 14-19% fewer distinct experts");
  study_headline(res, "same-domain batches, fewer distinct experts (%, batch 8-32)",
                 PCT(red_sum[ELDR_BATCH_DOMAIN] / (double)red_n[ELDR_BATCH_DOMAIN]), NAN);
  *out = res;
  return ELDR_OK;
}

/* ---- fig11: TPOT vs load, every policy ---------------------------------- */

int study_fig11(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  static const double loads[] = {0.2, 0.4, 0.6, 0.8, 0.95};
  enum { NL = 5, NP = 6 };
  static const char *const pname[NP] = {"random", "rr", "jsq", "p2c", "eldr", "eldr-permuted"};
  static const eldr_policy_kind pk[NP] = {ELDR_POLICY_RANDOM, ELDR_POLICY_RR, ELDR_POLICY_JSQ,
                                          ELDR_POLICY_P2C, ELDR_POLICY_ELDR, ELDR_POLICY_ELDR};
  const size_t ns = study_n_seeds(o);
  /* per load, policy and seed: mean TPOT, mean TPOT from prefill end, mean
   * TTFT, ITL p99, mean end-to-end */
  enum { M_TPOT, M_PF, M_TTFT, M_ITL, M_E2E, NM };
  static double v[NM][NL][NP][MAX_SEEDS], rate[NL][MAX_SEEDS];
  for (size_t s = 0; s < ns; s++) {
    study_arm a;
    study_progress(o, "fig11: seed %zu/%zu: fit", s + 1, ns);
    if ((rc = arm_build(o, study_seed(o, s), NULL, 1, &a, d))) return rc;
    double cap = arm_capacity(o, &a, o->n_decode);
    for (size_t l = 0; l < NL; l++) {
      rate[l][s] = loads[l] * cap;
      study_progress(o, "fig11: seed %zu/%zu: load %.2f", s + 1, ns, loads[l]);
      for (size_t p = 0; p < NP; p++) {
        eldr_sim_result r;
        if ((rc = arm_sim(o, &a, o->n_decode, pk[p], p == NP - 1, o->tau, rate[l][s], &r, d))) {
          arm_free(&a);
          return rc;
        }
        v[M_TPOT][l][p][s] = r.tpot_mean;
        v[M_PF][l][p][s] = r.tpot_pf_mean;
        v[M_TTFT][l][p][s] = r.ttft_mean;
        v[M_ITL][l][p][s] = r.itl_p99;
        v[M_E2E][l][p][s] = r.e2e_mean;
      }
    }
    arm_free(&a);
  }
  static const char *const cols[] = {"load",        "policy",      "rate",    "tpot_ms",
                                     "tpot_sd_ms",  "gain_vs_best_pct", "gain_sd_pct",
                                     "tpot_pf_ms",  "gain_pf_vs_best_pct", "ttft_ms",
                                     "itl_p99_ms",  "e2e_ms"};
  static const char *const y[] = {"tpot_ms"};
  json_t *res = study_result("fig11", cols, 12, "load", y, 1, "policy", "lines",
                             "load (share of estimated capacity)", "mean TPOT (ms)");
  if (!res) return ELDR_ENOMEM;
  study_plot_title(res, "fig11: mean TPOT vs load, %zuP%zuD, %s (held out)", o->n_prefill,
                   o->n_decode, o->trace->model);
  double net_hi = NAN, net_hi_sd = NAN, gain_hi = NAN, net_lo = NAN, pf_net_hi = NAN;
  for (size_t l = 0; l < NL; l++) {
    double best[2][MAX_SEEDS]; /* TPOT, from prefill end */
    for (int m = 0; m < 2; m++)
      for (size_t s = 0; s < ns; s++) {
        best[m][s] = INFINITY;
        for (size_t p = 0; p < 4; p++) best[m][s] = fmin(best[m][s], v[m][l][p][s]);
      }
    double rm, rsd;
    study_mean_sd(rate[l], ns, &rm, &rsd);
    for (size_t p = 0; p < NP; p++) {
      double x[NM][MAX_SEEDS], mean[NM], sd[NM], g[2][MAX_SEEDS], gm[2], gsd[2];
      for (int m = 0; m < NM; m++) {
        for (size_t s = 0; s < ns; s++) x[m][s] = 1e3 * v[m][l][p][s];
        study_mean_sd(x[m], ns, &mean[m], &sd[m]);
      }
      for (int m = 0; m < 2; m++) {
        for (size_t s = 0; s < ns; s++) g[m][s] = v[m][l][p][s] / best[m][s] - 1;
        study_mean_sd(g[m], ns, &gm[m], &gsd[m]);
      }
      study_row(res, "dsdddddddddd", loads[l], pname[p], rm, mean[M_TPOT], sd[M_TPOT], PCT(gm[0]),
                PCT(gsd[0]), mean[M_PF], PCT(gm[1]), mean[M_TTFT], mean[M_ITL], mean[M_E2E]);
    }
    double net[MAX_SEEDS], gn[MAX_SEEDS], npf[MAX_SEEDS], nm, nsd, gmm, gsd2, pm, psd;
    for (size_t s = 0; s < ns; s++) {
      gn[s] = v[M_TPOT][l][4][s] / best[0][s] - 1;
      net[s] = gn[s] - (v[M_TPOT][l][5][s] / best[0][s] - 1);
      npf[s] = v[M_PF][l][4][s] / best[1][s] - v[M_PF][l][5][s] / best[1][s];
    }
    study_mean_sd(net, ns, &nm, &nsd);
    study_mean_sd(gn, ns, &gmm, &gsd2);
    study_mean_sd(npf, ns, &pm, &psd);
    if (l == NL - 1) net_hi = nm, net_hi_sd = nsd, gain_hi = gmm, pf_net_hi = pm;
    if (l == 0) net_lo = nm;
  }
  char s[900];
  snprintf(s, sizeof s,
           "%zuP%zuD, %s: at %.0f%% of the estimated capacity ELDR's mean TPOT is %+.1f%% "
           "against the best baseline, %+.1f%% net of the replay control (sd %.1f over %zu "
           "seeds); at %.0f%% load the net gain is %+.1f%%. On TPOT from prefill end (the wait "
           "for a decoder's first step counts) the net gain at the top load is %+.1f%%. Served "
           "requests were never fitted on.",
           o->n_prefill, o->n_decode, o->trace->model, PCT(loads[NL - 1]), PCT(gain_hi),
           PCT(net_hi), PCT(net_hi_sd), ns, PCT(loads[0]), PCT(net_lo), PCT(pf_net_hi));
  set_text(res, "summary", s);
  set_text(res, "paper", "Fig. 11: ELDR lowers TPOT most at high load");
  study_headline(res, "TPOT vs best baseline at the top load, net of control (%)", PCT(net_hi),
                 PCT(net_hi_sd));
  *out = res;
  return ELDR_OK;
}

/* ---- gains per seed for a list of settings (table2, fig15, fig16, rho) --- */

typedef struct gain_stats {
  double gain, gain_sd, control, control_sd, net, net_sd;
  double net_pf, net_pf_sd; /* the net gain on TPOT from prefill end */
} gain_stats;

static void gains_summarise(const study_gain *g, size_t ns, gain_stats *out) {
  double a[MAX_SEEDS], b[MAX_SEEDS], c[MAX_SEEDS], e[MAX_SEEDS];
  for (size_t s = 0; s < ns; s++) a[s] = g[s].gain, b[s] = g[s].control, c[s] = g[s].net, e[s] = g[s].net_pf;
  study_mean_sd(a, ns, &out->gain, &out->gain_sd);
  study_mean_sd(b, ns, &out->control, &out->control_sd);
  study_mean_sd(c, ns, &out->net, &out->net_sd);
  study_mean_sd(e, ns, &out->net_pf, &out->net_pf_sd);
}

static const char *const k_gain_cols[] = {"gain_pct", "gain_sd", "control_pct", "control_sd",
                                          "net_pct", "net_sd", "net_pf_pct", "net_pf_sd"};

static json_t *gain_result(const char *name, const char *xcol, const char *xlabel,
                           const char *extra) {
  const char *cols[11];
  size_t n = 0;
  cols[n++] = xcol;
  if (extra) cols[n++] = extra;
  for (size_t i = 0; i < 8; i++) cols[n++] = k_gain_cols[i];
  static const char *const y[] = {"gain_pct", "control_pct", "net_pct"};
  return study_result(name, cols, n, xcol, y, 3, NULL, "lines", xlabel,
                      "mean TPOT vs best baseline (%)");
}

static int gain_row(json_t *res, const char *xfmt, const void *x, const gain_stats *g) {
  if (xfmt[0] == 'u')
    return study_row(res, "udddddddd", *(const size_t *)x, PCT(g->gain), PCT(g->gain_sd),
                     PCT(g->control), PCT(g->control_sd), PCT(g->net), PCT(g->net_sd),
                     PCT(g->net_pf), PCT(g->net_pf_sd));
  if (xfmt[0] == 'd')
    return study_row(res, "ddddddddd", *(const double *)x, PCT(g->gain), PCT(g->gain_sd),
                     PCT(g->control), PCT(g->control_sd), PCT(g->net), PCT(g->net_sd),
                     PCT(g->net_pf), PCT(g->net_pf_sd));
  return study_row(res, "sdddddddd", (const char *)x, PCT(g->gain), PCT(g->gain_sd),
                   PCT(g->control), PCT(g->control_sd), PCT(g->net), PCT(g->net_sd),
                   PCT(g->net_pf), PCT(g->net_pf_sd));
}

int study_table2(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  static const size_t D[] = {8, 16, 24};
  const size_t ns = study_n_seeds(o);
  static const char *const cols[] = {"decoders",   "gain_pct",   "gain_sd",    "control_pct",
                                     "control_sd", "net_pct",    "net_sd",     "net_pf_pct",
                                     "net_pf_sd",  "eldr_batch", "best_batch", "eldr_union",
                                     "best_union", "eldr_copies", "eldr_dup_pct"};
  static const char *const y[] = {"gain_pct", "control_pct", "net_pct"};
  json_t *res = study_result("table2", cols, 15, "decoders", y, 3, NULL, "lines", "decode workers",
                             "mean TPOT vs best baseline (%)");
  if (!res) return ELDR_ENOMEM;
  study_plot_title(res, "table2: ELDR's TPOT change vs the decode pool, %zu prefill, %.0f%% load, %s",
                   o->n_prefill, PCT(o->load), o->trace->model);
  gain_stats gs[3];
  double st[3][6]; /* seed means: eldr batch, best batch, eldr union, best union, copies, dup */
  for (size_t k = 0; k < 3; k++) {
    study_gain g[MAX_SEEDS];
    for (int j = 0; j < 6; j++) st[k][j] = 0;
    for (size_t s = 0; s < ns; s++) {
      study_arm a;
      eldr_fit_opts fo;
      eldr_fit_opts_default(&fo);
      fo.k = D[k];
      fo.tau = o->tau;
      fo.restarts = o->restarts;
      study_progress(o, "table2: %zuP%zuD seed %zu/%zu", o->n_prefill, D[k], s + 1, ns);
      if ((rc = arm_build(o, study_seed(o, s), &fo, 1, &a, d)) ||
          (rc = arm_gain(o, &a, D[k], o->tau, 0, &g[s], d))) {
        arm_free(&a);
        json_decref(res);
        return rc;
      }
      arm_free(&a);
      const double x[6] = {g[s].eldr_batch, g[s].best_batch, g[s].eldr_union, g[s].best_union,
                           g[s].eldr_copies, g[s].eldr_dup};
      for (int j = 0; j < 6; j++) st[k][j] += x[j] / (double)ns;
    }
    gains_summarise(g, ns, &gs[k]);
    study_row(res, "udddddddddddddd", D[k], PCT(gs[k].gain), PCT(gs[k].gain_sd), PCT(gs[k].control),
              PCT(gs[k].control_sd), PCT(gs[k].net), PCT(gs[k].net_sd), PCT(gs[k].net_pf),
              PCT(gs[k].net_pf_sd), st[k][0], st[k][1], st[k][2], st[k][3], st[k][4],
              PCT(st[k][5]));
  }
  char s[1400];
  snprintf(s, sizeof s,
           "%s at %.0f%% load, %zu prefill workers, %zu seeds: ELDR vs the best baseline "
           "%+.1f / %+.1f / %+.1f%% with 8 / 16 / 24 decoders; the replay control alone "
           "%+.1f / %+.1f / %+.1f%%; net %+.1f / %+.1f / %+.1f%% (sd %.1f / %.1f / %.1f); on TPOT "
           "from prefill end net %+.1f / %+.1f / %+.1f%%. Every pool runs at the same share of "
           "its capacity, which grows with the pool, for the same simulated time (arrivals in "
           "proportion to the pool), so each decoder sees about the same batch (ELDR %.1f / %.1f "
           "/ %.1f members per step, the best baseline %.1f / %.1f / %.1f) and the same distinct "
           "experts per layer per step (ELDR %.2f / %.2f / %.2f, baseline %.2f / %.2f / %.2f): "
           "with k = D clusters over the same served requests, more decoders do not make a "
           "decoder's batch more alike. What grows is the number of in-flight copies of each "
           "served request (%.1f / %.1f / %.1f other copies at routing).",
           o->trace->model, PCT(o->load), o->n_prefill, ns, PCT(gs[0].gain), PCT(gs[1].gain),
           PCT(gs[2].gain), PCT(gs[0].control), PCT(gs[1].control), PCT(gs[2].control),
           PCT(gs[0].net), PCT(gs[1].net), PCT(gs[2].net), PCT(gs[0].net_sd), PCT(gs[1].net_sd),
           PCT(gs[2].net_sd), PCT(gs[0].net_pf), PCT(gs[1].net_pf), PCT(gs[2].net_pf), st[0][0],
           st[1][0], st[2][0], st[0][1], st[1][1], st[2][1], st[0][2], st[1][2], st[2][2], st[0][3],
           st[1][3], st[2][3], st[0][4], st[1][4], st[2][4]);
  set_text(res, "summary", s);
  set_text(res, "paper", "Table 2: the gain grows with the decoder pool (8P8D < 8P16D < 8P24D)");
  study_headline(res, "net gain at 24 minus at 8 decoders (points; < 0 = grows with the pool)",
                 PCT(gs[2].net - gs[0].net), NAN);
  *out = res;
  return ELDR_OK;
}

/* One setting's gains over the seeds: fit options fo (NULL: defaults). */
static int setting_gains(const eldr_study_opts *o, const eldr_fit_opts *fo, double tau,
                         gain_stats *gs, double *rho, eldr_diag *d) {
  const size_t ns = study_n_seeds(o);
  study_gain g[MAX_SEEDS];
  double rh[MAX_SEEDS];
  for (size_t s = 0; s < ns; s++) {
    study_arm a;
    int rc = arm_build(o, study_seed(o, s), fo, 1, &a, d);
    if (!rc) rc = arm_gain(o, &a, o->n_decode, tau, 0, &g[s], d);
    if (!rc && a.have_rep) {
      const eldr_fit_candidate *c = &a.rep.cand[a.rep.chosen];
      rh[s] = fo && fo->layers == ELDR_FIT_LAYERS_ALL ? c->rho_all : c->rho_mask;
    } else {
      rh[s] = NAN;
    }
    arm_free(&a);
    if (rc) return rc;
  }
  gains_summarise(g, ns, gs);
  if (rho) {
    double sd;
    study_mean_sd(rh, ns, rho, &sd);
  }
  return ELDR_OK;
}

static void fit_defaults(const eldr_study_opts *o, eldr_fit_opts *fo) {
  eldr_fit_opts_default(fo);
  fo->k = o->n_decode;
  fo->tau = o->tau;
  fo->restarts = o->restarts;
}

int study_fig15(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  json_t *res = gain_result("fig15", "kmeans", "K-means", NULL);
  if (!res) return ELDR_ENOMEM;
  study_plot_title(res, "fig15: balanced vs vanilla K-means, %.0f%% load, %s", PCT(o->load),
                   o->trace->model);
  json_object_set_new(json_object_get(res, "plot"), "kind", json_string("bars"));
  gain_stats gs[2];
  for (int b = 0; b < 2; b++) {
    eldr_fit_opts fo;
    fit_defaults(o, &fo);
    fo.balanced = b == 0;
    study_progress(o, "fig15: %s", b ? "vanilla" : "balanced");
    if ((rc = setting_gains(o, &fo, o->tau, &gs[b], NULL, d))) {
      json_decref(res);
      return rc;
    }
    gain_row(res, "s", b ? "vanilla" : "balanced", &gs[b]);
  }
  char s[900];
  snprintf(s, sizeof s,
           "%s at %.0f%% load, %zu seeds: ELDR with balanced K-means %+.1f%% against the best "
           "baseline (sd %.1f), with vanilla K-means %+.1f%% (sd %.1f). Compare these raw gains "
           "here: the replay control routes with the same clusters, so with unbalanced clusters "
           "it also pays their imbalance (%+.1f%% vs %+.1f%% for balanced), and the net figures "
           "(%+.1f%% balanced, %+.1f%% vanilla) credit ELDR with that penalty.",
           o->trace->model, PCT(o->load), study_n_seeds(o), PCT(gs[0].gain), PCT(gs[0].gain_sd),
           PCT(gs[1].gain), PCT(gs[1].gain_sd), PCT(gs[1].control), PCT(gs[0].control),
           PCT(gs[0].net), PCT(gs[1].net));
  set_text(res, "summary", s);
  set_text(res, "paper", "Fig. 15: balanced clustering beats vanilla K-means");
  study_headline(res, "raw gain, balanced minus vanilla (points; < 0 = balanced better)",
                 PCT(gs[0].gain - gs[1].gain), NAN);
  *out = res;
  return ELDR_OK;
}

int study_fig16(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  static const double taus[] = {0, 0.05, 0.1, 0.2, 0.5, 1.0};
  enum { NT = 6 };
  const size_t ns = study_n_seeds(o);
  json_t *res = gain_result("fig16", "tau", "locality band tau", NULL);
  if (!res) return ELDR_ENOMEM;
  study_plot_title(res, "fig16: ELDR's TPOT change vs the locality band tau, %.0f%% load, %s",
                   PCT(o->load), o->trace->model);
  static study_gain g[NT][MAX_SEEDS];
  for (size_t s = 0; s < ns; s++) {
    study_arm a;
    study_progress(o, "fig16: seed %zu/%zu", s + 1, ns);
    if ((rc = arm_build(o, study_seed(o, s), NULL, 1, &a, d))) {
      json_decref(res);
      return rc;
    }
    double rate = o->load * arm_capacity(o, &a, o->n_decode);
    for (size_t k = 0; k < NT && !rc; k++) rc = arm_gain(o, &a, o->n_decode, taus[k], rate, &g[k][s], d);
    arm_free(&a);
    if (rc) {
      json_decref(res);
      return rc;
    }
  }
  size_t best = 0;
  gain_stats gs[NT];
  for (size_t k = 0; k < NT; k++) {
    gains_summarise(g[k], ns, &gs[k]);
    gain_row(res, "d", &taus[k], &gs[k]);
    if (gs[k].net < gs[best].net) best = k;
  }
  char s[600];
  snprintf(s, sizeof s,
           "%s at %.0f%% load, %zu seeds: the net gain is best at tau %.2f (%+.1f%%, sd %.1f); "
           "tau 0 (pure load balance inside the band) gives %+.1f%%, tau 1 %+.1f%%.",
           o->trace->model, PCT(o->load), ns, taus[best], PCT(gs[best].net), PCT(gs[best].net_sd),
           PCT(gs[0].net), PCT(gs[NT - 1].net));
  set_text(res, "summary", s);
  set_text(res, "paper", "Fig. 16: a small locality band (tau ~0.1) is best");
  char hl[96];
  snprintf(hl, sizeof hl, "best net gain (%%), at tau %.2f", taus[best]);
  study_headline(res, hl, PCT(gs[best].net), PCT(gs[best].net_sd));
  *out = res;
  return ELDR_OK;
}

/* ---- rho-gain ------------------------------------------------------------ */

int study_rho_gain(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  int rc = too_many_seeds(o, d);
  if (rc) return rc;
  int gates = 0;
  for (size_t i = 0; i < o->trace->n && !gates; i++) gates = o->trace->req[i].prefill_gates != NULL;
  const int nrepr = gates ? 4 : 2;
  json_t *res = gain_result("rho-gain", "variant", "representation", "rho");
  if (!res) return ELDR_ENOMEM;
  study_plot_title(res, "rho-gain: a representation's rho against its net TPOT gain, %s",
                   o->trace->model);
  json_t *plot = json_object_get(res, "plot");
  json_object_set_new(plot, "x", json_string("rho"));
  json_t *yy = json_array();
  json_array_append_new(yy, json_string("net_pct"));
  json_object_set_new(plot, "y", yy);
  json_object_set_new(plot, "kind", json_string("points"));
  json_object_set_new(plot, "xlabel", json_string("rho (fit quality)"));
  json_object_set_new(plot, "ylabel", json_string("net TPOT gain (%)"));
  double rho[16], net[16];
  size_t nv = 0;
  for (int r = 0; r < nrepr; r++) {
    for (int idf = 0; idf < 2; idf++) {
      for (int all = 0; all < 2; all++) {
        eldr_fit_opts fo;
        fit_defaults(o, &fo);
        fo.repr = r;
        fo.idf = idf ? ELDR_FIT_ON : ELDR_FIT_OFF;
        fo.layers = all ? ELDR_FIT_LAYERS_ALL : ELDR_FIT_LAYERS_AUTO;
        char name[64];
        snprintf(name, sizeof name, "%s%s/%s", eldr_repr_name((eldr_repr)r), idf ? "-idf" : "",
                 all ? "all-layers" : "greedy-mask");
        study_progress(o, "rho-gain: %s", name);
        gain_stats gs;
        if ((rc = setting_gains(o, &fo, o->tau, &gs, &rho[nv], d))) {
          json_decref(res);
          return rc;
        }
        net[nv] = gs.net;
        study_row(res, "sddddddddd", name, rho[nv], PCT(gs.gain), PCT(gs.gain_sd), PCT(gs.control),
                  PCT(gs.control_sd), PCT(gs.net), PCT(gs.net_sd), PCT(gs.net_pf), PCT(gs.net_pf_sd));
        nv++;
      }
    }
  }
  /* higher rho should mean a more negative (better) net gain */
  double sp = -eldr_study_spearman(rho, net, nv);
  json_object_set_new(res, "spearman", isfinite(sp) ? json_real(sp) : json_null());
  char s[600];
  snprintf(s, sizeof s,
           "%s at %.0f%% load, %zu seeds, %zu representation variants: Spearman rank correlation "
           "between a variant's rho and its net TPOT improvement (gain net of the replay "
           "control, sign flipped so that positive means rho predicts the gain) is %.2f.",
           o->trace->model, PCT(o->load), study_n_seeds(o), nv, sp);
  set_text(res, "summary", s);
  set_text(res, "paper", "Sec. 4: rho predicts which representation routes best");
  study_headline(res, "Spearman(rho, net gain)", sp, NAN);
  *out = res;
  return ELDR_OK;
}
