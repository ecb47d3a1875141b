/* sim_report.c — `eldr sim`'s reports of a run (sim_report.h): the table
 * and its headline gains against the best load balancer, the JSON with
 * each policy net of its replay control, the CSV rows, the per-request log,
 * and the warning when the replay control is the only thing that moved. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sim_report.h"

static double ms(double s) { return s * 1e3; }

/* A JSON number, or null for NaN/inf (e.g. TPOT when no request has two tokens). */
static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

void sim_write_csv(const char *cmd, const char *csv_path, const sim_out *o) {
  const eldr_sweep_row *rows = o->rows;
  FILE *f = fopen(csv_path, "w");
  if (!f) cli_fail(cmd, "--csv: cannot write '%s'", csv_path);
  fprintf(f, "policy,rate,tpot_p50_ms,tpot_p99_ms,tpot_mean_ms,ttft_p50_ms,ttft_p99_ms,"
             "throughput_tok_s,throughput_req_s,mean_batch,mean_union,copies_in_flight,"
             "batch_dup_frac,fallbacks,completed,pool_size,tau,decorrelate,pred_rel_err,pred_corr,"
             "tpot_pf_p50_ms,tpot_pf_p99_ms,tpot_pf_mean_ms,itl_p50_ms,itl_p99_ms,e2e_p50_ms,"
             "e2e_p99_ms,e2e_mean_ms,ttft_mean_ms,copy_affinity\n");
  for (size_t i = 0; i < o->nrows; i++) {
    const eldr_sweep_row *r = &rows[i];
    fprintf(f, "%s,%g,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.3f,%.3f,%.3f,%.4f,%.4f,%zu,%zu,%zu,%g,%d,%.4f,%.4f,"
               "%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.3f,%.3f,%.4f,%.4f\n",
            r->v->label, r->rate, ms(r->r.tpot_p50), ms(r->r.tpot_p99), ms(r->r.tpot_mean),
            ms(r->r.ttft_p50), ms(r->r.ttft_p99), r->r.throughput_tok_s, r->r.throughput_req_s,
            r->r.mean_batch, r->r.mean_union, r->r.copies_in_flight, r->r.batch_dup_frac,
            r->r.fallbacks, r->r.completed, r->r.pool_size, r->v->tau, r->v->decorrelate,
            r->r.pred_rel_err, r->r.pred_corr, ms(r->r.tpot_pf_p50), ms(r->r.tpot_pf_p99),
            ms(r->r.tpot_pf_mean), ms(r->r.itl_p50), ms(r->r.itl_p99), ms(r->r.e2e_p50),
            ms(r->r.e2e_p99), ms(r->r.e2e_mean), ms(r->r.ttft_mean), r->r.copy_affinity);
  }
  if (fclose(f)) cli_fail(cmd, "--csv: write error on '%s'", csv_path);
}

/* A CSV field: quoted when it holds a comma, quote or newline. */
static void csv_field(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\n")) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* --log: one line per request of every run. */
void sim_write_log(const char *cmd, const char *path, const sim_out *o, const eldr_trace *st,
                   const size_t *serve_idx) {
  FILE *f = fopen(path, "w");
  if (!f) cli_fail(cmd, "--log: cannot write '%s'", path);
  fprintf(f, "policy,rate,request,id,decoder,arrival_s,prefill_done_s,first_token_s,finish_s,"
             "tokens,ttft_ms,tpot_ms,tpot_pf_ms,e2e_ms,chosen_load,min_load,fallback,"
             "pred_tpot_ms,pred_union,mean_union,mean_batch\n");
  for (size_t i = 0; i < o->nrows; i++) {
    const eldr_sweep_row *r = &o->rows[i];
    for (size_t j = 0; r->log && j < r->r.n_requests; j++) {
      const eldr_sim_log *g = &r->log[j];
      double tp = g->tokens >= 2 ? (g->finish - g->first_token) / (g->tokens - 1) : NAN;
      double tpf = g->tokens >= 2 ? (g->finish - g->prefill_done) / g->tokens : NAN;
      fprintf(f, "%s,%g,%zu,", r->v->label, r->rate, j);
      csv_field(f, st->req[serve_idx[g->pool_index]].id);
      fprintf(f, ",%d,%.6f,%.6f,%.6f,%.6f,%u,%.4f,%.4f,%.4f,%.4f,%u,%u,%d,%.4f,%.4f,%.4f,%.3f\n",
              g->decoder, g->arrival, g->prefill_done, g->first_token, g->finish, g->tokens,
              ms(g->first_token - g->arrival), ms(tp), ms(tpf), ms(g->finish - g->arrival),
              g->chosen_load, g->min_load, g->fallback, ms(g->pred_tpot), g->pred_union,
              g->mean_union, g->mean_batch);
    }
  }
  if (fclose(f)) cli_fail(cmd, "--log: write error on '%s'", path);
}

/* The replay control of a headline row: eldr-permuted for eldr,
 * footprint-permuted for footprint, at the same rate and decorrelation; NULL
 * when the run has none. */
static const eldr_sweep_row *control_of(const sim_out *o, const eldr_sweep_row *e) {
  char lab[64];
  if (strncmp(e->v->label, "eldr", 4) && strncmp(e->v->label, "footprint", 9)) return NULL;
  snprintf(lab, sizeof lab, "%s-permuted", e->v->kind == ELDR_POLICY_ELDR ? "eldr" : "footprint");
  for (size_t i = 0; i < o->nrows; i++)
    if (o->rows[i].rate == e->rate && !strcmp(o->rows[i].v->label, lab) &&
        o->rows[i].v->decorrelate == e->v->decorrelate)
      return &o->rows[i];
  return NULL;
}

/* Row x against baseline row b on metric m, in % (< 0: x is faster). */
static double gain_pct(const eldr_sweep_row *x, const eldr_sweep_row *b, eldr_sweep_metric m) {
  return 100.0 * (eldr_sweep_metric_value(&x->r, m) / eldr_sweep_metric_value(&b->r, m) - 1);
}

void sim_write_json(const char *cmd, const sim_out *o) {
  json_t *root = json_object();
  json_t *cj = json_object();
  json_object_set_new(cj, "workload", json_string(o->src_name));
  if (o->a->serve_path) json_object_set_new(cj, "serve_trace", json_string(o->a->serve_path));
  json_object_set_new(cj, "model", json_string(o->lm->model));
  json_object_set_new(cj, "hardware", json_string(o->lm->hardware));
  json_object_set_new(cj, "prefill", json_integer((json_int_t)o->a->P));
  json_object_set_new(cj, "decode", json_integer((json_int_t)o->a->D));
  json_object_set_new(cj, "max_batch", json_integer((json_int_t)o->a->B));
  json_object_set_new(cj, "requests_per_run", json_integer((json_int_t)(o->a->trace_arrivals ? o->n_serve : o->a->nreq)));
  json_object_set_new(cj, "seed", json_integer((json_int_t)o->a->seed));
  json_object_set_new(cj, "tau", jnum(o->tau_eff));
  json_object_set_new(cj, "fit_requests", json_integer((json_int_t)o->n_fit));
  json_object_set_new(cj, "pool_size", json_integer((json_int_t)o->n_serve));
  json_object_set_new(cj, "pool_signatures", json_integer((json_int_t)o->n_sigs));
  json_object_set_new(cj, "capacity_estimate_rps", jnum(o->capacity));
  json_object_set_new(cj, "decorrelate", json_boolean(o->a->decor));
  if (o->eps) {
    const eldr_placement *p0 = o->eps->dec[0];
    json_object_set_new(cj, "ep_size", json_integer(o->a->ep_size));
    json_object_set_new(cj, "tp", json_integer((json_int_t)o->lm->tp));
    json_object_set_new(cj, "placement", json_string(eldr_placement_kind_name(o->a->ep_kind)));
    json_object_set_new(cj, "redundant_experts", json_integer(p0->num_physical - p0->num_experts));
    json_object_set_new(cj, "a2a_latency_s", jnum(o->lm->a2a_latency_s));
    json_object_set_new(cj, "rank_hbm_bw", jnum(o->lm->rank_hbm_bw));
  }
  if (o->a->art_path) json_object_set_new(cj, "artifact", json_string(o->a->art_path));
  json_object_set_new(cj, "known_fraction", o->a->known_fraction >= 0 ? jnum(o->a->known_fraction) : json_null());
  json_object_set_new(cj, "predict_threshold", jnum(o->a->predict_threshold));
  json_object_set_new(cj, "register_ms", jnum(o->a->register_s * 1e3));
  if (o->a->mooncake) {
    json_object_set_new(cj, "mooncake", json_string(o->a->mooncake));
    json_object_set_new(cj, "mooncake_blocks", json_integer((json_int_t)o->blocks->n_blocks));
  }
  if (o->rep) {
    const eldr_fit_candidate *ch = &o->rep->cand[o->rep->chosen];
    json_object_set_new(cj, "representation", json_string(eldr_repr_name(ch->repr)));
    json_object_set_new(cj, "idf", json_boolean(ch->idf));
    json_object_set_new(cj, "rho", jnum(ch->rho_mask));
    json_object_set_new(cj, "mask_size", json_integer((json_int_t)ch->mask_size));
  }
  json_object_set_new(root, "config", cj);
  json_t *ra = json_array();
  for (size_t i = 0; i < o->nrows; i++) {
    const eldr_sweep_row *r = &o->rows[i];
    json_t *jo = json_object();
    json_object_set_new(jo, "policy", json_string(r->v->label));
    json_object_set_new(jo, "rate", jnum(r->rate));
    json_object_set_new(jo, "tau", jnum(r->v->tau));
    json_object_set_new(jo, "decorrelate", json_boolean(r->v->decorrelate));
    json_object_set_new(jo, "tpot_p50_ms", jnum(ms(r->r.tpot_p50)));
    json_object_set_new(jo, "tpot_p99_ms", jnum(ms(r->r.tpot_p99)));
    json_object_set_new(jo, "tpot_mean_ms", jnum(ms(r->r.tpot_mean)));
    json_object_set_new(jo, "ttft_p50_ms", jnum(ms(r->r.ttft_p50)));
    json_object_set_new(jo, "ttft_p99_ms", jnum(ms(r->r.ttft_p99)));
    json_object_set_new(jo, "ttft_mean_ms", jnum(ms(r->r.ttft_mean)));
    json_object_set_new(jo, "tpot_pf_p50_ms", jnum(ms(r->r.tpot_pf_p50)));
    json_object_set_new(jo, "tpot_pf_p99_ms", jnum(ms(r->r.tpot_pf_p99)));
    json_object_set_new(jo, "tpot_pf_mean_ms", jnum(ms(r->r.tpot_pf_mean)));
    json_object_set_new(jo, "itl_p50_ms", jnum(ms(r->r.itl_p50)));
    json_object_set_new(jo, "itl_p99_ms", jnum(ms(r->r.itl_p99)));
    json_object_set_new(jo, "e2e_p50_ms", jnum(ms(r->r.e2e_p50)));
    json_object_set_new(jo, "e2e_p99_ms", jnum(ms(r->r.e2e_p99)));
    json_object_set_new(jo, "e2e_mean_ms", jnum(ms(r->r.e2e_mean)));
    json_object_set_new(jo, "throughput_tok_s", jnum(r->r.throughput_tok_s));
    json_object_set_new(jo, "throughput_req_s", jnum(r->r.throughput_req_s));
    json_object_set_new(jo, "mean_batch", jnum(r->r.mean_batch));
    json_object_set_new(jo, "mean_union", jnum(r->r.mean_union));
    json_object_set_new(jo, "copies_in_flight", jnum(r->r.copies_in_flight));
    json_object_set_new(jo, "batch_dup_frac", jnum(r->r.batch_dup_frac));
    json_object_set_new(jo, "copy_affinity", jnum(r->r.copy_affinity));
    json_object_set_new(jo, "fallbacks", json_integer((json_int_t)r->r.fallbacks));
    json_object_set_new(jo, "completed", json_integer((json_int_t)r->r.completed));
    json_object_set_new(jo, "decode_steps", json_integer((json_int_t)r->r.steps));
    if (o->eps) json_object_set_new(jo, "ep_busiest_share", jnum(r->r.ep_busiest_share));
    json_object_set_new(jo, "pred_rel_err", jnum(r->r.pred_rel_err));
    json_object_set_new(jo, "pred_corr", jnum(r->r.pred_corr));
    json_object_set_new(jo, "pd", json_string(eldr_sim_pd_name(r->v->pd_set ? r->v->pd : o->pd)));
    json_object_set_new(jo, "decisions", json_integer((json_int_t)r->r.decisions));
    json_object_set_new(jo, "predicted", json_integer((json_int_t)r->r.predicted));
    json_object_set_new(jo, "predicted_share",
                        jnum(r->r.decisions ? (double)r->r.predicted / (double)r->r.decisions : NAN));
    json_object_set_new(jo, "confidence_mean", jnum(r->r.confidence_mean));
    json_array_append_new(ra, jo);
  }
  json_object_set_new(root, "rows", ra);
  static const char *const heads[] = {"eldr", "footprint"};
  for (size_t h = 0; h < 2; h++) {
    json_t *ga = json_array();
    for (size_t ri = 0; ri < o->a->nrates; ri++) {
      const eldr_sweep_row *e = eldr_sweep_find(o->rows, o->nrows, o->a->rates[ri], heads[h]);
      if (!e || !eldr_sweep_best_baseline(o->rows, o->nrows, o->a->rates[ri], o->a->decor, 0)) continue;
      const eldr_sweep_row *ctl = control_of(o, e);
      json_t *jo = json_object();
      json_object_set_new(jo, "rate", jnum(o->a->rates[ri]));
      if (ctl) json_object_set_new(jo, "control", json_string(ctl->v->label));
      for (int m = 0; m < ELDR_METRIC__COUNT; m++) {
        const eldr_sweep_row *b = eldr_sweep_best_baseline_by(o->rows, o->nrows, o->a->rates[ri], o->a->decor, m);
        char key[64];
        const char *mn = eldr_sweep_metric_name(m);
        snprintf(key, sizeof key, "best_baseline_%s", mn);
        json_object_set_new(jo, key, json_string(b->v->label));
        snprintf(key, sizeof key, "gain_%s_pct", mn);
        json_object_set_new(jo, key, jnum(gain_pct(e, b, m)));
        if (ctl) {
          snprintf(key, sizeof key, "control_%s_pct", mn);
          json_object_set_new(jo, key, jnum(gain_pct(ctl, b, m)));
        }
      }
      /* the older names of the TPOT gains */
      json_object_set_new(jo, "best_baseline_p50", json_string(
          eldr_sweep_best_baseline(o->rows, o->nrows, o->a->rates[ri], o->a->decor, 0)->v->label));
      json_object_set_new(jo, "gain_p50_pct", json_incref(json_object_get(jo, "gain_tpot_p50_pct")));
      json_object_set_new(jo, "best_baseline_p99", json_string(
          eldr_sweep_best_baseline(o->rows, o->nrows, o->a->rates[ri], o->a->decor, 1)->v->label));
      json_object_set_new(jo, "gain_p99_pct", json_incref(json_object_get(jo, "gain_tpot_p99_pct")));
      json_array_append_new(ga, jo);
    }
    char key[64];
    snprintf(key, sizeof key, "%s_vs_best_baseline", heads[h]);
    if (json_array_size(ga) || h == 0)
      json_object_set_new(root, key, ga);
    else
      json_decref(ga);
  }
  json_object_set_new(root, "wall_seconds", jnum(o->wall_s));
  char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
  if (!s) cli_fail(cmd, "out of memory");
  puts(s);
  free(s);
  json_decref(root);
}

/* Per headline policy (eldr, footprint) at rate: its change against the
 * best baseline on TPOT and TPOT from prefill end, and its replay control's
 * beside it (the control keeps co-located replay copies and nothing else:
 * what the headline gains beyond it is locality). */
void sim_print_headlines(const sim_out *o, double rate) {
  static const char *const heads[] = {"eldr", "footprint"};
  char where[48];
  if (o->a->trace_arrivals) snprintf(where, sizeof where, "at the trace's arrivals");
  else snprintf(where, sizeof where, "at %g/s", rate);
  for (size_t h = 0; h < 2; h++) {
    const eldr_sweep_row *e = eldr_sweep_find(o->rows, o->nrows, rate, heads[h]);
    const eldr_sweep_row *b[4];
    for (int m = 0; m < 4; m++)
      b[m] = eldr_sweep_best_baseline_by(o->rows, o->nrows, rate, o->a->decor, (eldr_sweep_metric)m);
    if (!e || !b[0] || !b[1] || !b[2] || !b[3]) continue;
    printf("  -> %s vs best baseline %s: TPOT p50 %+.1f%% (vs %s), p99 %+.1f%% (vs %s); from prefill "
           "end p50 %+.1f%%, p99 %+.1f%%\n", heads[h], where, gain_pct(e, b[0], 0), b[0]->v->label,
           gain_pct(e, b[1], 1), b[1]->v->label, gain_pct(e, b[2], 2), gain_pct(e, b[3], 3));
    const eldr_sweep_row *c = control_of(o, e);
    if (c)
      printf("     replay control %s alone: TPOT p50 %+.1f%%, p99 %+.1f%%; net of it p50 %+.1f, p99 "
             "%+.1f points\n", c->v->label, gain_pct(c, b[0], 0), gain_pct(c, b[1], 1),
             gain_pct(e, b[0], 0) - gain_pct(c, b[0], 0), gain_pct(e, b[1], 1) - gain_pct(c, b[1], 1));
  }
}

void sim_print_table(const sim_out *o) {
  printf("workload %s%s%s | %s on %s | %zuP%zuD batch %zu | pool %zu served, %zu in the fit split | %s\n",
         o->src_name, o->a->serve_path ? " -> " : "", o->a->serve_path ? o->a->serve_path : "", o->lm->model, o->lm->hardware, o->a->P, o->a->D, o->a->B,
         o->n_serve, o->n_fit, o->a->trace_arrivals ? "trace arrivals" : o->a->scaled_arrivals ? "trace arrivals scaled to each rate" : "Poisson arrivals");
  if (o->rep) {
    const eldr_fit_candidate *ch = &o->rep->cand[o->rep->chosen];
    printf("artifact: fitted in-process: %s%s, %zu layers in mask, rho %.3f, tau %g; capacity est. %.1f req/s\n",
           eldr_repr_name(ch->repr), ch->idf ? "-idf" : "", ch->mask_size, ch->rho_mask, o->tau_eff, o->capacity);
  } else if (o->a->art_path) {
    printf("artifact: %s, tau %g; capacity est. %.1f req/s\n", o->a->art_path, o->tau_eff, o->capacity);
  } else {
    printf("artifact: none (no ELDR policy requested, nothing fitted); capacity est. %.1f req/s\n", o->capacity);
  }
  if (o->eps)
    printf("expert parallelism: TP%g x EP%u, %s placement, %u physical experts per layer; "
           "busiest EP rank's share of expert traffic per row below (even = %.3f)\n",
           o->lm->tp, o->a->ep_size, eldr_placement_kind_name(o->a->ep_kind),
           o->eps->dec[0]->num_physical, 1.0 / o->a->ep_size);
  /* units in the header; with trace arrivals the rate column says so */
  printf("%-22s %8s %8s %8s %8s %8s %8s %8s %8s %9s %6s %7s %6s %5s\n", "policy", "req/s", "TTFT",
         "TPOT", "TPOT", "TPOT-pf", "TPOT-pf", "ITL", "E2E", "tok/s", "batch", "union", "copies",
         "dup%");
  printf("%-22s %8s %8s %8s %8s %8s %8s %8s %8s %9s %6s %7s %6s %5s\n", "", "", "p50 ms", "p50 ms",
         "p99 ms", "p50 ms", "p99 ms", "p99 ms", "p50 ms", "", "seqs", "experts", "", "");
  for (size_t ri = 0; ri < o->a->nrates; ri++) {
    for (size_t vi = 0; vi < o->nv; vi++) {
      const eldr_sweep_row *r = &o->rows[ri * o->nv + vi];
      char rate[32];
      if (o->a->trace_arrivals) snprintf(rate, sizeof rate, "trace");
      else snprintf(rate, sizeof rate, "%g", r->rate);
      printf("%-22s %8s %8.1f %8.2f %8.2f %8.2f %8.2f %8.2f %8.0f %9.0f %6.2f %7.2f %6.3f %5.1f",
             r->v->label, rate, ms(r->r.ttft_p50), ms(r->r.tpot_p50), ms(r->r.tpot_p99),
             ms(r->r.tpot_pf_p50), ms(r->r.tpot_pf_p99), ms(r->r.itl_p99), ms(r->r.e2e_p50),
             r->r.throughput_tok_s, r->r.mean_batch, r->r.mean_union, r->r.copies_in_flight,
             100 * r->r.batch_dup_frac);
      if (o->eps) printf("  rank %.3f", r->r.ep_busiest_share);
      if (r->r.confidence_mean == r->r.confidence_mean)
        printf("  predicted %.1f%% (confidence %.2f)", 100.0 * (double)r->r.predicted / (double)r->r.decisions,
               r->r.confidence_mean);
      printf("\n");
    }
    sim_print_headlines(o, o->a->rates[ri]);
  }
}

/* Replay dominates a run when a locality policy's batches mostly hold copies
 * of one recorded request: then its gain is largely the replay artifact.
 * Warn once, naming the worst row, the pool and what to do. */
#define REPLAY_WARN_DUP 0.5

void sim_warn_replay(const sim_out *o) {
  const eldr_sweep_row *w = NULL;
  for (size_t i = 0; i < o->nrows; i++) {
    const eldr_sweep_row *r = &o->rows[i];
    if (strcmp(r->v->label, "eldr") && strcmp(r->v->label, "footprint")) continue;
    if (r->r.batch_dup_frac > REPLAY_WARN_DUP && (!w || r->r.batch_dup_frac > w->r.batch_dup_frac)) w = r;
  }
  if (!w) return;
  fprintf(stderr,
          "eldr sim: warning: replay dominates: %s's batches hold another copy of the same recorded "
          "request at %.0f%% of its decode token-steps (at %g/s; %.1f other copies in flight at "
          "routing): %zu distinct requests serve %zu arrivals per run. Its gain is partly the "
          "replay artifact: read it net of its replay control (printed beside it), or serve more "
          "distinct requests (a larger trace, --gen-requests) or fewer arrivals (--requests)\n",
          w->v->label, 100 * w->r.batch_dup_frac, w->rate, w->r.copies_in_flight, o->n_serve,
          o->a->trace_arrivals ? o->n_serve : o->a->nreq);
}
