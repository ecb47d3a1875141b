/* study_crossover.c — `eldr study crossover`: where MoE decode stops being
 * union-bound (every distinct expert's weights read: locality pays) and
 * becomes batch-bound (each expert's GEMM has enough tokens to be
 * compute-bound: the FLOPs do not shrink with the union). For every model
 * preset and hardware, the step time and locality's predicted gain over
 * batch sizes 1..4096 (docs/sim.md, "The crossover"), and, when the caller
 * measured a real MoE FFN on this CPU (eldr_study_opts.cpu), the same
 * roofline fitted to it and checked against it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/tracegen.h"
#include "sim/study_internal.h"

#define CTX_PER_MEMBER 1024.0 /* context tokens of each batch member (KV reads, attention) */
#define PROFILE_PER_DOMAIN 24 /* generated requests per domain for the selection rates */
#define PROFILE_TOKENS 32     /* their decode tokens */
#define N_BATCH 13            /* 1, 2, 4, ..., 4096 */

/* Per layer, the selection rate per token of the workload (pi, L*E) and of
 * each domain (pid, D*L*E, with traffic shares w): the realistic
 * generator's requests of that shape, their decode selections pooled. */
typedef struct rates {
  size_t L, E, D;
  double *pi, *pid, w[ELDR_TRACEGEN_MAX_DOMAINS];
} rates;

static void rates_free(rates *r) {
  free(r->pi);
  free(r->pid);
}

static int rates_build(const char *model, uint64_t seed, rates *rt, eldr_diag *d) {
  memset(rt, 0, sizeof *rt);
  eldr_shape s;
  char canon[128];
  int rc = eldr_tracegen_model_shape(model, &s, canon, sizeof canon, d);
  if (rc) return rc;
  eldr_tracegen_workload w;
  if ((rc = eldr_tracegen_workload_preset("realistic", &w, d))) return rc;
  eldr_tracegen_realistic_for_shape(&w, s.top_k, s.num_experts);
  eldr_tracegen *g = NULL;
  if ((rc = eldr_tracegen_new_workload(&s, canon, &w, seed, &g, d))) return rc;
  eldr_tracegen_set_lengths(g, PROFILE_TOKENS, 0, 8);
  const size_t L = s.num_layers, E = s.num_experts, K = s.top_k, D = w.n_domains, LE = L * E;
  rt->L = L, rt->E = E, rt->D = D;
  rt->pi = calloc(LE, sizeof *rt->pi);
  rt->pid = calloc(D * LE, sizeof *rt->pid);
  double tok[ELDR_TRACEGEN_MAX_DOMAINS] = {0}, all = 0;
  if (!rt->pi || !rt->pid) {
    eldr_tracegen_free(g);
    rates_free(rt);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  /* requests in index order until every domain has its share */
  size_t have[ELDR_TRACEGEN_MAX_DOMAINS] = {0}, full = 0;
  for (size_t i = 0; full < D && i < 1000 * D * PROFILE_PER_DOMAIN; i++) {
    eldr_tracegen_req q;
    if ((rc = eldr_tracegen_request(g, i, &q, d))) break;
    size_t dm = (size_t)q.domain;
    if (have[dm] == PROFILE_PER_DOMAIN) continue;
    if (++have[dm] == PROFILE_PER_DOMAIN) full++;
    for (uint32_t t = 0; t < q.n_decode; t++)
      for (size_t l = 0; l < L; l++)
        for (size_t k = 0; k < K; k++) rt->pid[dm * LE + l * E + q.decode[(t * L + l) * K + k]] += 1;
    tok[dm] += q.n_decode;
  }
  eldr_tracegen_free(g);
  if (rc) {
    rates_free(rt);
    return rc;
  }
  for (size_t dm = 0; dm < D; dm++) all += w.domain_weight[dm];
  for (size_t dm = 0; dm < D; dm++) {
    rt->w[dm] = w.domain_weight[dm] / all;
    for (size_t i = 0; i < LE; i++) {
      rt->pid[dm * LE + i] /= tok[dm];
      rt->pi[i] += rt->w[dm] * rt->pid[dm * LE + i];
    }
  }
  return 0;
}

/* Distinct experts per layer (mean over layers) of b tokens drawn
 * independently at rates p (L*E): sum_e 1 - (1 - p)^b. */
static double union_of(const double *p, size_t L, size_t E, double b) {
  double u = 0;
  for (size_t i = 0; i < L * E; i++) u += 1.0 - pow(1.0 - (p[i] < 1 ? p[i] : 1), b);
  return u / (double)L;
}

/* Locality's union at batch b: a batch of one domain (the traffic-weighted
 * mean over domains); random: the workload's mixture. */
static void unions(const rates *rt, double b, double *u_rand, double *u_loc) {
  const size_t LE = rt->L * rt->E;
  *u_rand = union_of(rt->pi, rt->L, rt->E, b);
  *u_loc = 0;
  for (size_t dm = 0; dm < rt->D; dm++) *u_loc += rt->w[dm] * union_of(rt->pid + dm * LE, rt->L, rt->E, b);
}

static double step_at(const eldr_latency_model *m, double b, double u) {
  double un[ELDR_MAX_LAYERS];
  for (uint32_t l = 0; l < m->shape.num_layers && l < ELDR_MAX_LAYERS; l++) un[l] = u;
  return eldr_latency_step_f(m, (size_t)b, un, b * CTX_PER_MEMBER);
}

static double gain_at(const eldr_latency_model *m, const rates *rt, double b) {
  double ur, ul;
  unions(rt, b, &ur, &ul);
  return 1.0 - step_at(m, b, ul) / step_at(m, b, ur);
}

/* The CPU check: t(A, B) = max(A * w / bw, B * K * f / peak), bw from the
 * points at the smallest batch (weights read, nothing to compute), peak
 * from those at the largest batch with the fewest experts; then, per
 * active-expert count, the batch at which the latency has grown by a
 * quarter over its smallest-batch value, measured (interpolated in log
 * batch) and by the fitted roofline. */
static json_t *cpu_check(const eldr_study_cpu *c, char *line, size_t cap) {
  const double w = 3.0 * c->hidden * c->inter * 4.0, f = 2.0 * 3.0 * c->hidden * c->inter;
  double bmin = INFINITY, bmax = 0, amin = INFINITY;
  for (size_t i = 0; i < c->n; i++) {
    bmin = fmin(bmin, c->batch[i]);
    bmax = fmax(bmax, c->batch[i]);
    amin = fmin(amin, c->experts[i]);
  }
  double bw = 0, peak = 0;
  size_t nb = 0, np = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (c->batch[i] == bmin) bw += c->experts[i] * w / (c->ms[i] * 1e-3), nb++;
    if (c->batch[i] == bmax && c->experts[i] == amin)
      peak += c->batch[i] * c->top_k * f / (c->ms[i] * 1e-3), np++;
  }
  if (!nb || !np) return NULL;
  bw /= (double)nb;
  peak /= (double)np;
  json_t *o = json_object(), *rows = json_array();
  json_object_set_new(o, "fitted_weight_gb_s", json_real(bw / 1e9));
  json_object_set_new(o, "fitted_gflop_s", json_real(peak / 1e9));
  json_object_set_new(o, "roofline_tokens_per_expert", json_real(w * peak / (f * bw)));
  size_t len = 0;
  len += (size_t)snprintf(line + len, cap - len,
                          " On this CPU (a real MoE FFN, bench moe-layer: %.0f GB/s of weights, %.0f "
                          "GFLOP/s fitted) the roofline puts an expert's GEMM compute-bound from %.0f "
                          "tokens per expert; latency 25%% above its smallest-batch value at batch",
                          bw / 1e9, peak / 1e9, w * peak / (f * bw));
  double experts_seen[64];
  size_t ne = 0;
  for (size_t i = 0; i < c->n && ne < 64; i++) {
    size_t k = 0;
    while (k < ne && experts_seen[k] != c->experts[i]) k++;
    if (k == ne) experts_seen[ne++] = c->experts[i];
  }
  for (size_t k = 0; k < ne; k++) {
    const double A = experts_seen[k];
    double base = NAN, bprev = NAN, tprev = NAN, meas = NAN;
    for (size_t i = 0; i < c->n; i++) /* points in increasing batch for each expert count */
      if (c->experts[i] == A && isnan(base)) base = c->ms[i];
    for (size_t i = 0; i < c->n; i++) {
      if (c->experts[i] != A) continue;
      if (c->ms[i] > 1.25 * base && isnan(meas) && !isnan(tprev)) {
        double x = (1.25 * base - tprev) / (c->ms[i] - tprev);
        meas = exp(log(bprev) + x * (log(c->batch[i]) - log(bprev)));
      }
      bprev = c->batch[i], tprev = c->ms[i];
    }
    double t1 = A * w / bw, model = 1.25 * t1 * peak / (c->top_k * f); /* B where B K f / peak = 1.25 t1 */
    if (model < bmin) model = NAN;
    json_t *r = json_object();
    json_object_set_new(r, "active_experts", json_real(A));
    json_object_set_new(r, "batch_measured", isfinite(meas) ? json_real(meas) : json_null());
    json_object_set_new(r, "batch_roofline", isfinite(model) ? json_real(model) : json_null());
    json_array_append_new(rows, r);
    if (len < cap)
      len += (size_t)snprintf(line + len, cap - len, "%s %g experts: %s%.0f measured, %.0f roofline",
                              k ? ";" : "", A, isfinite(meas) ? "" : ">", isfinite(meas) ? meas : bmax,
                              model);
  }
  if (len < cap) snprintf(line + len, cap - len, ".");
  json_object_set_new(o, "batch_at_plus_25_pct", rows);
  return o;
}

int study_crossover(const eldr_study_opts *o, json_t **out, eldr_diag *d) {
  static const char *const cols[] = {"model",          "hardware",      "batch",
                                     "union_random",   "union_local",   "tokens_per_expert",
                                     "step_random_ms", "step_local_ms", "gain_pct"};
  static const char *const y[] = {"gain_pct"};
  json_t *res = study_result("crossover", cols, 9, "batch", y, 1, "model", "lines",
                             "decode batch (requests, one token each per step)",
                             "step time saved by locality (%)");
  if (!res) return ELDR_ENOMEM;
  study_plot_group2(res, "hardware", "%s", "model", "%s");
  study_plot_title(res, "crossover: step time saved by locality vs batch (solid mi300x, dashed "
                        "h200, dotted h100; grey: 1%%)");
  json_object_set_new(json_object_get(res, "plot"), "logx", json_integer(2));
  json_object_set_new(json_object_get(res, "plot"), "hline", json_real(1.0));
  json_t *table = json_array();
  char s[4096];
  size_t slen = (size_t)snprintf(s, sizeof s,
                                 "Batch at which locality's step-time gain falls under 1%% (a batch "
                                 "of one domain against a random one, realistic workload, %g context "
                                 "tokens per member):",
                                 CTX_PER_MEMBER);
  int rc = 0;
  for (size_t mi = 0; eldr_latency_model_name(mi) && !rc; mi++) {
    const char *model = eldr_latency_model_name(mi);
    rates rt;
    study_progress(o, "crossover: %s", model);
    if ((rc = rates_build(model, study_seed(o, 0), &rt, d))) break;
    for (size_t hi = 0; eldr_latency_hardware_name(hi); hi++) {
      const char *hw = eldr_latency_hardware_name(hi);
      eldr_latency_model m;
      if ((rc = eldr_latency_preset(model, hw, &m, d))) break;
      const double dens = m.expert_bytes * m.peak_flops / (m.hbm_bw * m.expert_flops_per_token);
      double gmax = -1, bmax = 1, g64 = NAN, cross = NAN, cross_tpe = NAN;
      for (int k = 0; k < N_BATCH; k++) {
        double b = ldexp(1.0, k), ur, ul;
        unions(&rt, b, &ur, &ul);
        double sr = step_at(&m, b, ur), sl = step_at(&m, b, ul), g = 1.0 - sl / sr;
        study_row(res, "ssddddddd", model, hw, b, ur, ul, b * m.shape.top_k / ur, 1e3 * sr, 1e3 * sl,
                  100 * g);
        if (g > gmax) gmax = g, bmax = b;
        if (b == 64) g64 = g;
      }
      /* the first batch past the peak where the gain is under 1 % (integer
       * bisection between the grid points around it) */
      for (int k = 0; k < N_BATCH && isnan(cross); k++) {
        double b = ldexp(1.0, k);
        if (b <= bmax || gain_at(&m, &rt, b) >= 0.01) continue;
        double lo = b / 2, up = b;
        while (up - lo > 1) {
          double mid = floor((lo + up) / 2);
          if (gain_at(&m, &rt, mid) >= 0.01) lo = mid;
          else up = mid;
        }
        cross = up;
        double ur, ul;
        unions(&rt, up, &ur, &ul);
        cross_tpe = up * m.shape.top_k / ur;
      }
      json_t *row = json_pack("{s:s,s:s,s:f,s:f,s:f,s:o,s:o,s:f}", "model", model, "hardware", hw,
                              "peak_gain_pct", 100 * gmax, "peak_gain_batch", bmax, "gain_at_64_pct",
                              100 * g64, "crossover_batch", isnan(cross) ? json_null() : json_real(cross),
                              "tokens_per_expert_at_crossover",
                              isnan(cross_tpe) ? json_null() : json_real(cross_tpe),
                              "roofline_tokens_per_expert", dens);
      json_array_append_new(table, row);
      if (slen < sizeof s) {
        if (isnan(cross))
          slen += (size_t)snprintf(s + slen, sizeof s - slen, " %s/%s > 4096;", model, hw);
        else
          slen += (size_t)snprintf(s + slen, sizeof s - slen, " %s/%s %.0f;", model, hw, cross);
      }
    }
    rates_free(&rt);
  }
  if (rc) {
    json_decref(table);
    json_decref(res);
    return rc;
  }
  if (slen < sizeof s) s[slen - 1] = '.';
  json_object_set_new(res, "crossover", table);
  if (o->cpu) {
    char line[1024] = "";
    json_t *cc = cpu_check(o->cpu, line, sizeof line);
    if (cc) {
      json_object_set_new(res, "cpu_check", cc);
      size_t l = strlen(s);
      snprintf(s + l, sizeof s - l, "%s", line);
    }
  }
  json_object_set_new(res, "summary", json_string(s));
  json_object_set_new(res, "paper", json_string("related work: union-bound (ELDR's regime) vs "
                                                "batch-bound MoE decode; the paper has no crossover"));
  /* the headline: the default preset (Qwen3-30B-A3B on MI300X) */
  study_headline(res, "batch where locality's gain falls under 1%, qwen3-30b-a3b on mi300x", NAN, NAN);
  for (size_t i = 0; i < json_array_size(table); i++) {
    json_t *r = json_array_get(table, i);
    if (!strcmp(json_string_value(json_object_get(r, "model")), "qwen3-30b-a3b") &&
        !strcmp(json_string_value(json_object_get(r, "hardware")), "mi300x"))
      study_headline(res, "batch where locality's gain falls under 1%, qwen3-30b-a3b on mi300x",
                     json_is_number(json_object_get(r, "crossover_batch"))
                         ? json_number_value(json_object_get(r, "crossover_batch"))
                         : NAN,
                     NAN);
  }
  *out = res;
  return ELDR_OK;
}
