/* cmd_demo.c — `eldr demo`: a whole xPyD cluster on loopback. Generates (or
 * loads) a trace, fits an artifact on one split, then for every policy starts
 * P prefill and D decode `eldr worker` processes and an `eldr serve` router
 * (the cluster supervisor, eldr/cluster.h), drives the other split at a
 * Poisson rate through the router with the load generator, stops them, and
 * prints TPOT p50/p99 and TTFT p50 per policy with ELDR's change against the
 * best load balancer — next to `eldr sim` on the same configuration.
 *
 * Every child runs in the supervisor's process group with a parent-death
 * signal; SIGINT/SIGTERM/SIGHUP, failure and normal exit all stop them. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "demo_drift.h"
#include "demo_latency.h"
#include "figures.h"
#include "eldr/cluster.h"
#include "eldr/http_fetch.h"
#include "eldr/fit.h"
#include "eldr/latency.h"
#include "eldr/loadgen.h"
#include "eldr/plot.h"
#include "eldr/trace.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"

static const char *CMD = "demo";

static volatile int g_stop = 0;
static eldr_cluster *volatile g_cluster; /* the children, for the signal handler and cleanup */
static char g_tmp[PATH_MAX];    /* the work directory */
static int g_keep = 0; /* --keep (x->keep), or kept after a failure */

static void on_signal(int sig) {
  if (g_stop) { /* second signal: leave now */
    eldr_cluster_kill_async(g_cluster, SIGKILL);
    _exit(128 + sig);
  }
  g_stop = sig;
  eldr_cluster_kill_async(g_cluster, SIGTERM);
  static const char msg[] = "\neldr demo: interrupted, stopping every process it started\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
}

/* Unlink the entries of dir (plain files). */
static void remove_files(const char *path) {
  DIR *dir = opendir(path);
  if (!dir) return;
  struct dirent *e;
  char p[PATH_MAX + 300];
  while ((e = readdir(dir))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    unlink(p);
  }
  closedir(dir);
}

static void cleanup(void) {
  eldr_cluster *c = g_cluster;
  g_cluster = NULL; /* before the free: the signal handler must not see it freed */
  eldr_cluster_free(c);
  if (!g_tmp[0] || g_keep) return;
  /* the work directory holds plain files the demo wrote, and the router's
   * records (--drift) one level down */
  char rec[PATH_MAX + 16];
  snprintf(rec, sizeof rec, "%s/records", g_tmp);
  remove_files(rec);
  rmdir(rec);
  remove_files(g_tmp);
  rmdir(g_tmp);
}

void demo_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "eldr demo: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  /* a failure keeps the work directory (its processes.log says why) */
  if (!g_stop && g_tmp[0] && !g_keep) {
    g_keep = 1;
    fprintf(stderr, "eldr demo: work directory kept for inspection: %s\n", g_tmp);
  }
  cleanup();
  exit(g_stop ? 128 + g_stop : 1);
}

#include "demo.h"


static const char *preset_for_shape(const eldr_shape *s) {
  static const char *presets[] = {"qwen3-30b-a3b", "gpt-oss-120b", "qwen3-235b-a22b",
                                  "llama4-maverick", "olmoe-1b-7b"};
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
    eldr_shape p;
    if (eldr_tracegen_model_shape(presets[i], &p, NULL, 0, NULL) == 0 &&
        p.num_layers == s->num_layers && p.num_experts == s->num_experts && p.top_k == s->top_k)
      return presets[i];
  }
  return NULL;
}

int demo_save_subset(const eldr_trace *t, const size_t *idx, size_t n, const char *path, eldr_diag *d);
int demo_save_subset(const eldr_trace *t, const size_t *idx, size_t n, const char *path, eldr_diag *d) {
  eldr_trace *o = eldr_trace_new(t->model, &t->shape, t->layer_ids);
  if (!o || eldr_trace_set_generator(o, t->generator)) {
    eldr_trace_free(o);
    return ELDR_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    const eldr_request *q = &t->req[idx[i]];
    const char *dom = q->domain >= 0 ? t->domains[q->domain] : NULL;
    if (eldr_trace_append(o, q->id, dom, q->prompt, q->arrival, q->prefill, q->n_prefill, q->decode,
                          q->n_decode, q->prefill_gates) < 0) {
      eldr_trace_free(o);
      return ELDR_ENOMEM;
    }
  }
  int rc = eldr_trace_save(path, o, d);
  eldr_trace_free(o);
  return rc;
}

static void progress_cb(void *ctx, size_t sent, size_t done, double el) {
  const char *pol = ctx;
  if (!cli_stderr_tty()) return;
  fprintf(stderr, "\r  %-6s %4.0f s: %zu sent, %zu done   ", pol, el, sent, done);
  fflush(stderr);
}

static double pct(double x, double base) { return (x / base - 1.0) * 100.0; }

/* 1. the trace and its two splits: fit_path and eval_path; x->eval loaded. */
static void make_splits(demo *x) {
  eldr_diag d = {{0}};
  eldr_trace *all = NULL;
  size_t *idx = NULL, neval = 0;
  if (x->trace_path) {
    fprintf(stderr, "eldr demo: [1/4] loading %s\n", x->trace_path);
    int rc = eldr_trace_load(x->trace_path, &all, &d);
    if (rc < 0) demo_fail("--trace: %s", eldr_diag_msg(&d, rc));
    cli_trace_require_tokens("demo", x->trace_path, all, "the demo's workers replay per-token selections");
    if (all->n < 4) demo_fail("--trace: %zu requests; need at least 4 to split", all->n);
    if (!x->model) x->model = preset_for_shape(&all->shape);
    if (!x->hardware_set) x->hardware = cli_hardware_default(x->model);
    if (!x->model)
      demo_fail("--trace: no model preset has its shape (%u layers, %u experts, top-%u); pass --model",
                all->shape.num_layers, all->shape.num_experts, all->shape.top_k);
    /* seeded random split */
    idx = malloc(all->n * sizeof *idx);
    if (!idx) demo_fail("out of memory");
    eldr_fit_shuffle(idx, all->n, x->seed); /* the split eldr fit and eldr sim use */
    x->nfit = (size_t)(x->fit_fraction * (double)all->n);
    if (x->nfit < 2) x->nfit = 2;
    if (x->nfit > all->n - 1) x->nfit = all->n - 1;
    neval = all->n - x->nfit;
  } else {
    if (!x->model) x->model = "qwen3-30b-a3b";
    fprintf(stderr, "eldr demo: [1/4] generating %ld + %ld requests (%s, workload %s, seed %llu)\n",
            x->n_fit, x->n_eval, x->model, x->workload, (unsigned long long)x->seed);
    eldr_shape sh;
    char canon[64];
    int rc = eldr_tracegen_model_shape(x->model, &sh, canon, sizeof canon, &d);
    if (rc < 0) demo_fail("--model: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen *g = NULL;
    rc = eldr_tracegen_new(&sh, canon, x->workload, x->seed, &g, &d);
    if (rc < 0) demo_fail("--workload: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen_set_lengths(g, 0, (uint32_t)x->max_decode, 0);
    rc = eldr_tracegen_generate(g, (size_t)(x->n_fit + x->n_eval), &all, &d);
    eldr_tracegen_free(g);
    if (rc < 0) demo_fail("trace generation: %s", eldr_diag_msg(&d, rc));
    idx = malloc(all->n * sizeof *idx);
    if (!idx) demo_fail("out of memory");
    for (size_t i = 0; i < all->n; i++) idx[i] = i;
    x->nfit = (size_t)x->n_fit;
    neval = (size_t)x->n_eval;
  }
  if (demo_save_subset(all, idx, x->nfit, x->fit_path, &d) < 0 || demo_save_subset(all, idx + x->nfit, neval, x->eval_path, &d) < 0)
    demo_fail("cannot write the trace splits: %s", d.msg);
  free(idx);
  eldr_trace_free(all);
  x->eval = NULL;
  if (eldr_trace_load(x->eval_path, &x->eval, &d) < 0) demo_fail("cannot re-read %s: %s", x->eval_path, d.msg);

}

/* 2. the artifact, by `eldr fit` on the fit split. */
static void fit_artifact(demo *x) {
  fprintf(stderr, "eldr demo: [2/4] fitting the artifact on %zu requests for %ld decoders\n", x->nfit, x->D);
  char *args[] = {"fit", "--trace", x->fit_path, "--decoders", x->dbuf, "-o", x->art_path, "--seed",
                  x->seedbuf, "-q", x->model ? "--model" : NULL, (char *)x->model, "--hardware",
                  (char *)x->hardware, NULL}; /* coefficients for footprint, when the model is a preset */
  eldr_diag d = {{0}};
  int code = -1;
  int rc = eldr_cluster_run(g_cluster, args, NULL, &code, &d);
  if (g_stop) demo_fail("interrupted");
  if (rc) demo_fail("%s", eldr_diag_msg(&d, rc));
  if (code != 0) demo_fail("eldr fit failed (exit %d); see %s", code, x->log_path);
}

typedef struct prog {
  const char *policy;
  demo *x;
  int killed;
} prog;

static void fleet_progress(void *ctx, size_t sent, size_t done, double el) {
  prog *p = ctx;
  if (p->x->bus && p->x->kill_bus_s > 0 && !p->killed && el >= p->x->kill_bus_s) {
    p->killed = 1;
    eldr_cluster_kill_bus(g_cluster);
    fprintf(stderr, "\r  %-6s the bus's nats-server killed at %.1f s\n", p->policy, el);
  }
  progress_cb((void *)p->policy, sent, done, el);
}

/* The bus's lag as each router measured it (GET /eldr/status): the worst
 * p99 bound and max over the routers into row. */
static void bus_lag(demo *x, prow *row) {
  row->lag_p99 = row->lag_max = NAN;
  row->lag_n = row->peers = 0;
  if (!x->bus) return;
  const char *const *urls;
  size_t n = eldr_cluster_routers(g_cluster, &urls);
  for (size_t i = 0; i < n; i++) {
    int st = 0;
    char *body = NULL;
    eldr_diag d = {{0}};
    if (eldr_http_fetch(urls[i], "GET", "/eldr/status", NULL, NULL, 5, &st, &body, &d) || st != 200) {
      free(body);
      continue;
    }
    json_t *j = json_loads(body, 0, NULL), *bus = json_object_get(j, "bus"), *lag = json_object_get(bus, "lag_seconds");
    double p99 = json_number_value(json_object_get(lag, "p99_le")), mx = json_number_value(json_object_get(lag, "max"));
    if (json_is_number(json_object_get(lag, "p99_le")) && !(p99 <= row->lag_p99)) row->lag_p99 = p99;
    if (json_is_number(json_object_get(lag, "max")) && !(mx <= row->lag_max)) row->lag_max = mx;
    row->lag_n += (long)json_integer_value(json_object_get(lag, "messages"));
    if (i == 0) row->peers = (long)json_integer_value(json_object_get(bus, "peers"));
    json_decref(j);
    free(body);
  }
  fprintf(stderr, "    bus: %ld peers seen by r0; lag p99 <= %.4g ms, max %.4g ms over %ld messages (all routers)\n",
          row->peers, row->lag_p99 * 1e3, row->lag_max * 1e3, row->lag_n);
}

/* --pd sglang[-exact]: how many decoders each router chose on a predicted
 * signature and on the prefill's exact counts (its /metrics'
 * eldr_sglang_decisions_total), into row. */
static void sgl_decisions(demo *x, prow *row) {
  row->sgl_pred = row->sgl_exact = row->sgl_all = NAN;
  if (!x->pd) return;
  const char *const *urls;
  size_t n = eldr_cluster_routers(g_cluster, &urls);
  double pred = 0, exact = 0, all = 0;
  for (size_t i = 0; i < n; i++) {
    int st = 0;
    char *body = NULL;
    eldr_diag d = {{0}};
    if (eldr_http_fetch(urls[i], "GET", "/metrics", NULL, NULL, 5, &st, &body, &d) || st != 200) {
      free(body);
      return; /* a router not read: no figure rather than a wrong one */
    }
    static const char key[] = "\neldr_sglang_decisions_total{signature=\"";
    for (const char *p = strstr(body, key); p; p = strstr(p + 1, key)) {
      const char *lab = p + sizeof key - 1, *sp = strchr(lab, ' ');
      if (!sp) break;
      double v = strtod(sp + 1, NULL);
      all += v;
      if (!strncmp(lab, "predicted\"", 10)) pred += v;
      if (!strncmp(lab, "exact\"", 6)) exact += v;
    }
    free(body);
  }
  row->sgl_pred = pred;
  row->sgl_exact = exact;
  row->sgl_all = all;
  fprintf(stderr, "    decoders chosen on a signature before the prefill's reply: %.0f exact, %.0f predicted, of %.0f\n",
          exact, pred, all);
}

/* 3. one policy: its cluster up, the load through it, its counters, down. */
static void run_policy_into(demo *x, size_t pi, prow *row);
static void run_policy(demo *x, size_t pi) { run_policy_into(x, pi, &x->rows[pi]); }
static void run_policy_into(demo *x, size_t pi, prow *row) {
  row->policy = x->pols[pi];
  row->sim_tpot_p50 = row->sim_tpot_p99 = row->sim_ttft_p50 = NAN;
  row->sim_batch = row->sim_uni = row->sim_tpot_mean = NAN;
  row->sim_pf_p50 = row->sim_pf_p99 = row->sim_itl_p99 = row->sim_e2e_p50 = NAN;
  char alog[PATH_MAX + 64];
  snprintf(alog, sizeof alog, "%s/access-%zu.jsonl", g_tmp, pi);
  eldr_cluster_spec cs = {.pd = x->pd, .n_prefill = (size_t)x->P, .n_decode = (size_t)x->D, .model = x->model,
                          .hardware = x->hardware, .trace_path = x->eval_path,
                          .time_scale = x->scale, .max_num_seqs = (size_t)x->max_seqs,
                          .artifact_path = x->art_path, .policy = x->pols[pi], .seed = x->seed,
                          .n_routers = (size_t)x->routers, .scrape_interval = x->scrape, .bus = x->bus,
                          .access_log = alog};
  eldr_diag d = {{0}};
  char target[64];
  int rc = eldr_cluster_up(g_cluster, &cs, target, sizeof target, &d);
  if (rc) demo_fail("%s", eldr_diag_msg(&d, rc));
  eldr_loadgen_config lc;
  eldr_loadgen_config_default(&lc);
  lc.target = target;
  lc.n_targets = eldr_cluster_routers(g_cluster, &lc.targets); /* clients spread over the replicas */
  lc.trace = x->eval;
  lc.rate = x->rate / x->scale;
  lc.duration_s = x->duration;
  lc.seed = x->seed;
  lc.drain_s = 120;
  lc.timeout_s = 60;
  lc.stop = &g_stop;
  prog pg = {x->pols[pi], x, 0};
  lc.progress = fleet_progress;
  lc.progress_ctx = &pg;
  eldr_loadgen_result r;
  rc = eldr_loadgen_run(&lc, &r, &d);
  if (cli_stderr_tty()) fprintf(stderr, "\r%60s\r", "");
  if (rc < 0) demo_fail("load generator: %s", eldr_diag_msg(&d, rc));
  eldr_loadgen_summarize(&r, &row->s);
  if (pi == 0 && r.n && !x->sched_idx) { /* the schedule the simulator replays */
    x->sched_n = r.n;
    x->sched_idx = malloc(r.n * sizeof *x->sched_idx);
    x->sched_t = malloc(r.n * sizeof *x->sched_t);
    if (!x->sched_idx || !x->sched_t) demo_fail("out of memory");
    for (size_t i = 0; i < r.n; i++) {
      x->sched_idx[i] = r.recs[i].trace_index;
      x->sched_t[i] = r.recs[i].send_s / x->scale;
    }
  }
  row->sent = r.n;
  row->ok = r.ok;
  row->failed = r.n - r.ok;
  bus_lag(x, row);
  sgl_decisions(x, row);
  eldr_decode_counters dc;
  int scraped = eldr_cluster_scrape_decoders(g_cluster, 5, &dc, &d) == 0;
  row->tok_ms = scraped && dc.batch_sum > 0 ? dc.token_s / dc.batch_sum / x->scale * 1e3 : NAN;
  row->batch = scraped && dc.steps > 0 ? dc.batch_sum / dc.steps : NAN;
  row->uni = scraped && dc.steps > 0 ? dc.union_sum / dc.steps : NAN;
  fprintf(stderr,
          "  %-6s %zu requests, %zu ok; TPOT p50 %.3f ms, mean %.3f ms; decoders' model time per "
          "token %.3f ms\n",
          x->pols[pi], r.n, r.ok, row->s.tpot_p50 / x->scale * 1e3, row->s.tpot_mean / x->scale * 1e3,
          row->tok_ms);
  if (r.n > r.ok) {
    for (size_t i = 0; i < r.n; i++)
      if (!r.recs[i].ok) {
        fprintf(stderr, "    first failure: %s\n", r.recs[i].error);
        break;
      }
  }
  eldr_cluster_stop_all(g_cluster); /* the routers' access log is complete */
  size_t npf;
  if (demo_tpot_pf(alog, &r, x->seed, &row->pf_p50, &row->pf_p99, &npf) || npf < r.ok / 2)
    fprintf(stderr, "eldr demo: %s: TPOT from prefill end for %zu of %zu requests (router access log %s)\n",
            x->pols[pi], npf, r.ok, alog);
  eldr_loadgen_result_free(&r);
}

/* 4. `eldr sim` on the same configuration and the same arrivals (request
 * and model time) as the demo's first policy, replayed with --arrivals trace. */
static void run_sim(demo *x) {
  eldr_diag d = {{0}};
  /* the same load as the demo: the requests it sent, in its order, at the
   * times it sent them (model time), replayed with --arrivals trace */
  char sent_path[PATH_MAX + 32];
  snprintf(sent_path, sizeof sent_path, "%s/sent.jsonl", g_tmp);
  eldr_trace *sent = eldr_trace_new(x->eval->model, &x->eval->shape, x->eval->layer_ids);
  if (!sent || eldr_trace_set_generator(sent, x->eval->generator)) demo_fail("out of memory");
  for (size_t i = 0; i < x->sched_n; i++) {
    const eldr_request *q = &x->eval->req[x->sched_idx[i]];
    char id[360];
    snprintf(id, sizeof id, "%.300s#%zu", q->id, i);
    const char *dom = q->domain >= 0 ? x->eval->domains[q->domain] : NULL;
    if (eldr_trace_append(sent, id, dom, NULL, x->sched_t[i], q->prefill, q->n_prefill, q->decode,
                          q->n_decode, q->prefill_gates) < 0)
      demo_fail("out of memory");
  }
  if (eldr_trace_save(sent_path, sent, &d) < 0) demo_fail("cannot write %s: %s", sent_path, d.msg);
  eldr_trace_free(sent);
  fprintf(stderr,
          "eldr demo: [4/4] eldr sim on the same configuration and the same %zu arrivals "
          "(request and time)\n",
          x->sched_n);
  char pbuf[16], polbuf[128];
  snprintf(pbuf, sizeof pbuf, "%ld", x->P);
  snprintf(polbuf, sizeof polbuf, "%s", x->policies_arg);
  char *args[] = {"sim", "--trace", sent_path, "--artifact", x->art_path, "--arrivals", "trace",
                  "--prefill", pbuf, "--decode", x->dbuf, "--max-batch", x->seqbuf, "--model",
                  (char *)x->model, "--hardware", (char *)x->hardware, "--policies", polbuf, "--seed",
                  x->seedbuf, "--json", "-q", NULL, NULL, NULL};
  if (x->pd) { /* the simulator decides when the flow does (eldr sim --pd) */
    size_t na = 0;
    while (args[na]) na++;
    args[na] = "--pd";
    args[na + 1] = (char *)x->pd;
  }
  int rc = -1;
  if (eldr_cluster_run(g_cluster, args, x->sim_path, &rc, &d)) rc = -1;
  if (g_stop) demo_fail("interrupted");
  json_t *j = rc == 0 ? json_load_file(x->sim_path, 0, NULL) : NULL;
  json_t *srows = json_object_get(j, "rows");
  size_t i;
  json_t *row;
  json_array_foreach(srows, i, row) {
    const char *pol = json_string_value(json_object_get(row, "policy"));
    for (size_t k = 0; pol && k < x->npol; k++)
      if (!strcmp(pol, x->rows[k].policy)) {
        x->rows[k].sim_tpot_p50 = json_number_value(json_object_get(row, "tpot_p50_ms"));
        x->rows[k].sim_tpot_p99 = json_number_value(json_object_get(row, "tpot_p99_ms"));
        x->rows[k].sim_ttft_p50 = json_number_value(json_object_get(row, "ttft_p50_ms"));
        x->rows[k].sim_tpot_mean = json_number_value(json_object_get(row, "tpot_mean_ms"));
        x->rows[k].sim_batch = json_number_value(json_object_get(row, "mean_batch"));
        x->rows[k].sim_uni = json_number_value(json_object_get(row, "mean_union"));
        x->rows[k].sim_pf_p50 = json_number_value(json_object_get(row, "tpot_pf_p50_ms"));
        x->rows[k].sim_pf_p99 = json_number_value(json_object_get(row, "tpot_pf_p99_ms"));
        x->rows[k].sim_itl_p99 = json_number_value(json_object_get(row, "itl_p99_ms"));
        x->rows[k].sim_e2e_p50 = json_number_value(json_object_get(row, "e2e_p50_ms"));
        x->have_sim = 1;
      }
  }
  json_decref(j);
  if (!x->have_sim) fprintf(stderr, "eldr demo: eldr sim gave no result (exit %d); see %s\n", rc, x->log_path);
}

/* The table: model time (wall / scale), ms. */
static void print_table(const demo *x) {
  /* model time (wall / scale), ms */
  printf("\neldr demo: %ldP%ldD%s%s, %s on %s, %zu requests per policy at %g req/s (model time; "
         "realised %.4g), max %s seqs per decoder\n",
         x->P, x->D, x->pd ? " --pd " : "", x->pd ? x->pd : "", x->model, x->hardware, x->rows[0].sent, x->rate, (double)x->rows[0].sent / (x->duration / x->scale),
         x->seqbuf);
  printf("times are model time in ms = wall time / %g (the workers ran %gx slower than the "
         "modelled GPU)\n\n",
         x->scale, x->scale);
  /* demo: TTFT, TPOT, TPOT from prefill end, ITL, end-to-end (client-side,
   * the prefill's end from the router's access log); then the simulator's */
  static const char *const h1[] = {"policy", "ok/sent", "TTFT", "TPOT", "TPOT", "TPOT", "TPOT-pf",
                                   "TPOT-pf", "ITL", "E2E", "batch", "union"};
  static const char *const h2[] = {"", "", "p50", "p50", "p99", "mean", "p50", "p99", "p99", "p50",
                                   "", ""};
  for (int h = 0; h < 2; h++) {
    const char *const *hh = h ? h2 : h1;
    printf("%-10s %8s %7s %7s %7s %7s %7s %7s %7s %8s %6s %6s", hh[0], hh[1], hh[2], hh[3], hh[4],
           hh[5], hh[6], hh[7], hh[8], hh[9], hh[10], hh[11]);
    if (x->have_sim)
      printf(" | %-7s %7s %7s %7s %7s %7s %6s %6s", h ? "" : "sim", hh[3], hh[4], hh[6], hh[7],
             hh[8], hh[10], hh[11]);
    printf("\n");
  }
  int eldr_i = -1;
  for (size_t k = 0; k < x->npol; k++) {
    const prow *w = &x->rows[k];
    char okb[32];
    snprintf(okb, sizeof okb, "%zu/%zu", w->ok, w->sent);
    const double ms = 1e3 / x->scale;
    printf("%-10s %8s %7.2f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %8.1f %6.2f %6.2f", w->policy, okb,
           w->s.ttft_p50 * ms, w->s.tpot_p50 * ms, w->s.tpot_p99 * ms, w->s.tpot_mean * ms,
           w->pf_p50 * ms, w->pf_p99 * ms, w->s.itl_p99 * ms, w->s.e2e_p50 * ms, w->batch, w->uni);
    if (x->have_sim)
      printf(" |         %7.3f %7.3f %7.3f %7.3f %7.3f %6.2f %6.2f", w->sim_tpot_p50, w->sim_tpot_p99,
             w->sim_pf_p50, w->sim_pf_p99, w->sim_itl_p99, w->sim_batch, w->sim_uni);
    printf("\n");
    if (!strcmp(w->policy, "eldr")) eldr_i = (int)k;
  }
  int exact = x->pd && !strcmp(x->pd, "sglang-exact");
  for (size_t k = 0; x->pd && k < x->npol; k++) { /* where the signature came from */
    const prow *w = &x->rows[k];
    if (k == 0)
      printf(exact ? "\ndecoders chosen on the prefill's exact counts, or else a predicted signature (the rest by load):"
                   : "\ndecoders chosen at arrival on a predicted signature (the rest by load):");
    if (w->sgl_all > 0 && exact)
      printf(" %s %.0f + %.0f of %.0f%s", w->policy, w->sgl_exact, w->sgl_pred, w->sgl_all, k + 1 < x->npol ? "," : "\n");
    else if (w->sgl_all > 0)
      printf(" %s %.0f/%.0f (%.0f%%)%s", w->policy, w->sgl_pred, w->sgl_all, 100 * w->sgl_pred / w->sgl_all,
             k + 1 < x->npol ? "," : "\n");
    else
      printf(" %s -%s", w->policy, k + 1 < x->npol ? "," : "\n");
  }
  /* ELDR against the best load balancer (random, rr, jsq, p2c: footprint
   * is locality-aware too), per metric (smaller is better) */
  enum { M_P50, M_P99, M_MEAN, M_TTFT, M_PF50, M_PF99, M_N };
  const char *mname[M_N] = {"TPOT p50", "TPOT p99", "TPOT mean", "TTFT p50",
                            "TPOT-pf p50", "TPOT-pf p99"};
  for (int src = 0; src < 2 && eldr_i >= 0; src++) {
    if (src == 1 && !x->have_sim) break;
    printf(src ? "eldr sim, same configuration:  " : "\nELDR vs the best load balancer:");
    for (int m = 0; m < M_N; m++) {
      double ev = 0, best = INFINITY;
      const char *bp = NULL;
      for (size_t k = 0; k < x->npol; k++) {
        const prow *w = &x->rows[k];
        double v = src == 0 ? (m == M_P50    ? w->s.tpot_p50
                               : m == M_P99  ? w->s.tpot_p99
                               : m == M_MEAN ? w->s.tpot_mean
                               : m == M_TTFT ? w->s.ttft_p50
                               : m == M_PF50 ? w->pf_p50
                                             : w->pf_p99)
                            : (m == M_P50    ? w->sim_tpot_p50
                               : m == M_P99  ? w->sim_tpot_p99
                               : m == M_MEAN ? w->sim_tpot_mean
                               : m == M_TTFT ? w->sim_ttft_p50
                               : m == M_PF50 ? w->sim_pf_p50
                                             : w->sim_pf_p99);
        if ((int)k == eldr_i) ev = v;
        else if (strcmp(w->policy, "footprint") && !isnan(v) && v < best) /* load-only policies */
          best = v, bp = w->policy;
      }
      if (bp && !isnan(ev)) printf(" %s %+.1f%% (vs %s)%s", mname[m], pct(ev, best), bp, m + 1 < M_N ? "," : "");
    }
    printf("\n");
  }
  printf("(negative = ELDR faster; total %.0f s)\n", eldr_clock_now() - x->t_start);

}

static json_t *jms(double v) { return isnan(v) ? json_null() : json_real(v); }

/* The table as one JSON object: times in ms of model time; "sim" null without it. */
static void print_json(const demo *x) {
  json_t *rows = json_array();
  for (size_t k = 0; k < x->npol; k++) {
    const prow *w = &x->rows[k];
    json_t *r = json_pack("{s:s,s:I,s:I,s:o,s:o,s:o,s:o,s:f,s:f}", "policy", w->policy, "sent",
                          (json_int_t)w->sent, "ok", (json_int_t)w->ok, "tpot_p50_ms",
                          jms(w->s.tpot_p50 / x->scale * 1e3), "tpot_p99_ms",
                          jms(w->s.tpot_p99 / x->scale * 1e3), "tpot_mean_ms",
                          jms(w->s.tpot_mean / x->scale * 1e3), "ttft_p50_ms",
                          jms(w->s.ttft_p50 / x->scale * 1e3), "mean_batch", w->batch,
                          "mean_union", w->uni);
    if (r) {
      json_object_set_new(r, "tpot_pf_p50_ms", jms(w->pf_p50 / x->scale * 1e3));
      json_object_set_new(r, "tpot_pf_p99_ms", jms(w->pf_p99 / x->scale * 1e3));
      json_object_set_new(r, "itl_p99_ms", jms(w->s.itl_p99 / x->scale * 1e3));
      json_object_set_new(r, "e2e_p50_ms", jms(w->s.e2e_p50 / x->scale * 1e3));
      if (x->pd) {
        json_object_set_new(r, "predicted_decisions", jms(w->sgl_pred));
        json_object_set_new(r, "exact_decisions", jms(w->sgl_exact));
        json_object_set_new(r, "decisions", jms(w->sgl_all));
      }
    }
    json_t *sim = x->have_sim
                      ? json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "tpot_p50_ms", jms(w->sim_tpot_p50),
                                  "tpot_p99_ms", jms(w->sim_tpot_p99), "tpot_mean_ms",
                                  jms(w->sim_tpot_mean), "ttft_p50_ms", jms(w->sim_ttft_p50),
                                  "mean_batch", jms(w->sim_batch), "mean_union", jms(w->sim_uni))
                      : json_null();
    if (json_is_object(sim)) {
      json_object_set_new(sim, "tpot_pf_p50_ms", jms(w->sim_pf_p50));
      json_object_set_new(sim, "tpot_pf_p99_ms", jms(w->sim_pf_p99));
      json_object_set_new(sim, "itl_p99_ms", jms(w->sim_itl_p99));
      json_object_set_new(sim, "e2e_p50_ms", jms(w->sim_e2e_p50));
    }
    if (r) json_object_set_new(r, "sim", sim);
    json_array_append_new(rows, r);
  }
  json_t *j = json_pack("{s:s,s:s?,s:s?,s:I,s:I,s:f,s:f,s:f,s:I,s:o}", "pd", x->pd ? x->pd : "vllm",
                        "model", x->model, "hardware", x->hardware, "prefill", (json_int_t)x->P, "decode",
                        (json_int_t)x->D, "rate_req_s", x->rate, "time_scale", x->scale,
                        "duration_s", x->duration, "seed", (json_int_t)x->seed, "rows", rows);
  char *out = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) : NULL;
  printf("%s\n", out ? out : "{}");
  free(out);
  json_decref(j);
}

/* Returns 0 when the plot was written; otherwise the cause is on stderr. */
static int plot_figure(const demo *x) {
  const char *names[8];
  double p50[8], mean[8], p99[8];
  for (size_t k = 0; k < x->npol; k++) {
    names[k] = x->rows[k].policy;
    p50[k] = x->rows[k].s.tpot_p50 / x->scale * 1e3;
    mean[k] = x->rows[k].s.tpot_mean / x->scale * 1e3;
    p99[k] = x->rows[k].s.tpot_p99 / x->scale * 1e3;
  }
  char title[256];
  snprintf(title, sizeof title, "eldr demo: %ldP%ldD %s on %s, %g req/s (model time, scale %g)",
           x->P, x->D, x->model, x->hardware, x->rate, x->scale);
  eldr_diag d = {{0}};
  int rc = fig_demo(x->plot, title, x->npol, names, p50, mean, p99, &d);
  if (rc)
    fprintf(stderr, "eldr demo: --plot %s: %s\n", x->plot, eldr_diag_msg(&d, rc));
  else
    fprintf(stderr, "eldr demo: plot written to %s\n", x->plot);
  return rc;
}

/* The fleet (--routers LIST and/or --bus LIST): every policy at every router
 * count, with and without the bus; footprint's TPOT p50 against the best
 * load balancer of the same run (random, rr, jsq, p2c: whichever of them
 * were asked), and that gain as a share of the one-router gain without the
 * bus (the first row). Model time, ms. */
static void demo_fleet_run(demo *x) {
  size_t nr = x->n_router_list ? x->n_router_list : 1, nb = x->n_bus_list ? x->n_bus_list : 1;
  if (!x->n_router_list) x->router_list[0] = x->routers;
  if (!x->n_bus_list) x->bus_list[0] = 0;
  fprintf(stderr,
          "eldr demo: [3/3] the fleet: %zu router count%s x %zu bus setting%s x %zu policies, %ld prefill + %ld "
          "decode workers (%s on %s, time scale %g), %.3g req/s of model time for %g s each\n",
          nr, nr > 1 ? "s" : "", nb, nb > 1 ? "s" : "", x->npol, x->P, x->D, x->model, x->hardware, x->scale, x->rate,
          x->duration);
  for (size_t i = 0; i < nr && !g_stop; i++)
    for (size_t b = 0; b < nb && !g_stop; b++) {
      x->routers = x->router_list[i];
      x->bus = x->bus_list[b];
      fprintf(stderr, "  %ld router%s, bus %s\n", x->routers, x->routers > 1 ? "s" : "", x->bus ? "nats" : "none");
      for (size_t pi = 0; pi < x->npol && !g_stop; pi++) run_policy_into(x, pi, &x->fleet[i][b][pi]);
    }
  if (g_stop) demo_fail("interrupted");
  /* footprint's gain over the best load balancer, per (routers, bus) */
  double gain[4][2], base = NAN;
  const char *lb[4][2];
  for (size_t i = 0; i < nr; i++)
    for (size_t b = 0; b < nb; b++) {
      double fp = NAN, best = INFINITY;
      lb[i][b] = NULL;
      for (size_t pi = 0; pi < x->npol; pi++) {
        double v = x->fleet[i][b][pi].s.tpot_p50;
        if (!strcmp(x->pols[pi], "footprint")) fp = v;
        else if (strcmp(x->pols[pi], "eldr") && v < best) best = v, lb[i][b] = x->pols[pi];
      }
      gain[i][b] = lb[i][b] && !isnan(fp) ? -pct(fp, best) : NAN; /* positive: footprint faster */
      if (i == 0 && b == 0 && x->router_list[0] == 1 && x->bus_list[0] == 0) base = gain[i][b]; /* the one-router gain */
    }
  if (x->json) {
    json_t *rows = json_array();
    for (size_t i = 0; i < nr; i++)
      for (size_t b = 0; b < nb; b++)
        for (size_t pi = 0; pi < x->npol; pi++) {
          const prow *w = &x->fleet[i][b][pi];
          json_array_append_new(rows, json_pack("{sIsssssIsIsosososososo}", "routers", (json_int_t)x->router_list[i],
                                                "bus", x->bus_list[b] ? "nats" : "none", "policy", x->pols[pi], "sent",
                                                (json_int_t)w->sent, "ok", (json_int_t)w->ok, "tpot_p50_ms",
                                                jms(w->s.tpot_p50 / x->scale * 1e3), "tpot_mean_ms",
                                                jms(w->s.tpot_mean / x->scale * 1e3), "tpot_p99_ms",
                                                jms(w->s.tpot_p99 / x->scale * 1e3), "mean_union", jms(w->uni),
                                                "footprint_gain_pct", jms(gain[i][b]), "share_of_one_router_gain",
                                                jms(gain[i][b] / base)));
          json_t *last = json_array_get(rows, json_array_size(rows) - 1);
          json_object_set_new(last, "bus_lag_p99_le_ms", jms(w->lag_p99 * 1e3));
          json_object_set_new(last, "bus_lag_max_ms", jms(w->lag_max * 1e3));
        }
    json_t *j = json_pack("{sssssIsIsfsfsfsfsIso}", "model", x->model, "hardware", x->hardware, "prefill",
                          (json_int_t)x->P, "decode", (json_int_t)x->D, "rate_req_s", x->rate, "time_scale", x->scale,
                          "duration_s", x->duration, "kill_bus_after_s", x->kill_bus_s, "seed", (json_int_t)x->seed,
                          "rows", rows);
    char *out = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) : NULL;
    printf("%s\n", out ? out : "{}");
    free(out);
    json_decref(j);
    return;
  }
  printf("\neldr demo, the fleet: %ldP%ldD, %s on %s, %g req/s (model time), time scale %g%s\n", x->P, x->D, x->model,
         x->hardware, x->rate, x->scale, x->kill_bus_s > 0 ? ", the bus killed mid-run" : "");
  printf("%-7s %-4s %-9s %9s %8s %8s %8s %6s\n", "routers", "bus", "policy", "ok/sent", "TPOT p50", "mean", "p99",
         "union");
  for (size_t i = 0; i < nr; i++)
    for (size_t b = 0; b < nb; b++)
      for (size_t pi = 0; pi < x->npol; pi++) {
        const prow *w = &x->fleet[i][b][pi];
        char okb[32];
        snprintf(okb, sizeof okb, "%zu/%zu", w->ok, w->sent);
        printf("%-7ld %-4s %-9s %9s %8.3f %8.3f %8.3f %6.2f\n", x->router_list[i], x->bus_list[b] ? "nats" : "none",
               x->pols[pi], okb, w->s.tpot_p50 / x->scale * 1e3, w->s.tpot_mean / x->scale * 1e3,
               w->s.tpot_p99 / x->scale * 1e3, w->uni);
      }
  printf("\nfootprint's TPOT p50 gain over the best load balancer (positive = footprint faster):\n");
  for (size_t i = 0; i < nr; i++)
    for (size_t b = 0; b < nb; b++) {
      printf("  %ld router%s, bus %-4s: ", x->router_list[i], x->router_list[i] > 1 ? "s" : " ",
             x->bus_list[b] ? "nats" : "none");
      if (isnan(gain[i][b])) printf("no footprint and load-balancer pair\n");
      else if (!i && !b && !isnan(base)) printf("%+.1f%% (vs %s), the one-router gain\n", gain[i][b], lb[i][b]);
      else if (isnan(base)) printf("%+.1f%% (vs %s)\n", gain[i][b], lb[i][b]);
      else printf("%+.1f%% (vs %s), %.0f%% of the one-router gain\n", gain[i][b], lb[i][b], 100 * gain[i][b] / base);
    }
  int said = 0;
  for (size_t i = 0; i < nr; i++)
    for (size_t b = 0; b < nb; b++)
      for (size_t pi = 0; x->bus_list[b] && pi < x->npol; pi++) {
        const prow *w = &x->fleet[i][b][pi];
        if (!w->lag_n) continue;
        printf("%s%ld router%s, %s: bus lag p99 <= %.3g ms, max %.3g ms over %ld messages\n",
               said++ ? "" : "\nthe bus, as the routers measured it (an event on one to its application on another):\n",
               x->router_list[i], x->router_list[i] > 1 ? "s" : "", x->pols[pi], w->lag_p99 * 1e3, w->lag_max * 1e3, w->lag_n);
      }
  printf("\n(total %.0f s)\n", eldr_clock_now() - x->t_start);
}

int eldr_cmd_demo(int argc, char **argv) {
  static demo x; /* large; one per process */
  demo_parse_args(argc, argv, &x);
  if (x.keep) g_keep = 1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  x.t_start = eldr_clock_now();
  snprintf(g_tmp, sizeof g_tmp, "%s/eldr-demo-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_tmp)) {
    g_tmp[0] = 0;
    cli_fail(CMD, "cannot create a work directory: %s", strerror(errno));
  }
  snprintf(x.fit_path, sizeof x.fit_path, "%s/fit.jsonl", g_tmp);
  snprintf(x.eval_path, sizeof x.eval_path, "%s/eval.jsonl", g_tmp);
  snprintf(x.art_path, sizeof x.art_path, "%s/artifact.json", g_tmp);
  snprintf(x.log_path, sizeof x.log_path, "%s/processes.log", g_tmp);
  snprintf(x.sim_path, sizeof x.sim_path, "%s/sim.json", g_tmp);
  fprintf(stderr, "eldr demo: work directory %s%s\n", g_tmp, g_keep ? " (kept)" : "");
  eldr_diag d = {{0}};
  eldr_cluster *c = NULL;
  int rc = eldr_cluster_new(NULL, x.log_path, &g_stop, &c, &d);
  if (rc) demo_fail("%s", eldr_diag_msg(&d, rc));
  g_cluster = c;

  if (x.drift) { /* the production loop: docs/demo.md "Drift" */
    demo_drift_opts dop = {.model = x.model ? x.model : "qwen3-30b-a3b", .hardware = x.hardware,
                           .workload = x.workload, .plot = x.plot, .dir = g_tmp, .log_path = x.log_path,
                           .P = x.P, .D = x.D, .max_seqs = x.max_seqs, .n_fit = x.n_fit,
                           .max_decode = x.max_decode, .rate = x.rate, .scale = x.scale,
                           .duration = x.duration_set ? x.duration : 40, .seed = x.seed, .json = x.json, .cluster = c,
                           .stop = &g_stop};
    int drc = demo_drift_run(&dop);
    cleanup();
    return drc;
  }
  make_splits(&x);
  fit_artifact(&x);
  if (x.n_router_list > 1 || x.n_bus_list > 0) { /* the fleet: docs/demo.md "A fleet of routers" */
    demo_fleet_run(&x);
    int frc = x.plot ? 0 : 0;
    eldr_trace_free(x.eval);
    free(x.sched_idx);
    free(x.sched_t);
    cleanup();
    return frc;
  }
  fprintf(stderr,
          "eldr demo: [3/4] %ld prefill + %ld decode workers (%s on %s, time scale %g) and %ld "
          "router%s (scrape %s), %.3g req/s of model time (%.3g req/s wall) for %g s per policy\n",
          x.P, x.D, x.model, x.hardware, x.scale, x.routers, x.routers > 1 ? " replicas" : "",
          x.scrape > 0 ? "on" : "off", x.rate, x.rate / x.scale, x.duration);
  for (size_t pi = 0; pi < x.npol && !g_stop; pi++) run_policy(&x, pi);
  if (g_stop) demo_fail("interrupted");
  if (x.do_sim && x.sched_n > 0) run_sim(&x);
  if (x.json) print_json(&x);
  else print_table(&x);
  int plot_rc = x.plot ? plot_figure(&x) : 0;
  free(x.sched_idx);
  free(x.sched_t);
  eldr_trace_free(x.eval);
  cleanup();
  return plot_rc ? 1 : 0;
}
