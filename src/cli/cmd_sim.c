/* cmd_sim.c — `eldr sim`: the discrete-event xPyD simulation of every
 * routing policy over a rate sweep, with the ELDR ablations and the replay
 * control. Fits the routing artifact in-process on a split of the trace
 * (the served requests are never the fitted ones) unless one is given. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "eldr/artifact.h"
#include "eldr/fit.h"
#include "eldr/latency.h"
#include "eldr/policy.h"
#include "eldr/rng.h"
#include "eldr/sim.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"

static const char SIM_HELP[] =
    "usage: eldr sim (--trace T | --generate W) [options]\n"
    "\n"
    "Simulate a PD-disaggregated cluster (P prefill, D decode workers, continuous\n"
    "batching, union-of-experts step latency) under each routing policy and rate.\n"
    "Decisions come from the same policy code as `eldr serve`.\n"
    "\n"
    "workload\n"
    "  -t, --trace FILE        expert trace (JSONL)\n"
    "      --generate W        generate in-process: task | language | custom:FILE\n"
    "      --gen-requests N    requests to generate                      [1000]\n"
    "      --serve-trace FILE  serve this trace; fit on all of --trace\n"
    "      --fit-fraction F    fit on a seeded random F of the requests, serve the rest [0.5]\n"
    "  -a, --artifact FILE     use this artifact instead of fitting (serves all of\n"
    "                          the trace unless --fit-fraction is given)\n"
    "      --arrivals trace    use the trace's arrival timestamps instead of --rates\n"
    "cluster and model\n"
    "      --prefill P         prefill workers                           [8]\n"
    "      --decode D          decode workers                            [16]\n"
    "      --max-batch B       decode batch limit per worker             [64]\n"
    "  -m, --model M           latency preset: qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b\n"
    "                          llama4-maverick olmoe-1b-7b   [from the trace's model]\n"
    "      --hardware H        mi300x | h200 | h100   [mi300x; h200 for llama4-maverick]\n"
    "      --latency FILE      JSON overrides of the latency model's fields\n"
    "runs\n"
    "      --rates LIST        requests/s  [sweep 20..95% of estimated capacity]\n"
    "      --requests N        arrivals per run                          [5000]\n"
    "      --policies LIST     all | comma list of random rr jsq p2c domain eldr\n"
    "                          eldr-permuted                             [all]\n"
    "      --tau X             ELDR locality band          [artifact's tau, or 0.1]\n"
    "      --taus LIST         also run ELDR at each tau (ablation)\n"
    "      --vanilla           also fit unbalanced K-means and run it (ablation)\n"
    "      --ablation          shorthand: --taus 0,0.05,0.1,0.2,0.5,1 --vanilla\n"
    "      --decorrelate       every arrival starts at a random offset of its recorded\n"
    "                          decode sequence (wrapping); default off\n"
    "      --decorrelated-rows also run eldr and the best baselines decorrelated\n"
    "      --seed S            seed of arrivals, split, fit and policies [1]\n"
    "      --jobs N            simulations run in parallel threads       [1]\n"
    "output\n"
    "      --json              JSON on stdout instead of the table\n"
    "      --csv FILE          one row per (policy, rate)\n"
    "      --plot DIR          gnuplot figures (PNG) into DIR\n"
    "  -q, --quiet             no progress on stderr\n"
    "  -h, --help              this help\n";

typedef struct variant {
  char label[48];
  eldr_policy_kind kind;
  double tau;
  int permute, decorrelate, vanilla;
  int is_baseline; /* random/rr/jsq/p2c */
  int is_headline; /* plotted in the main figure */
} variant;

typedef struct row {
  const variant *v;
  double rate;
  eldr_sim_result r;
} row;

typedef struct pool_sigs {
  eldr_artifact *a;
  float *sigs;
  uint8_t *ok;
  size_t n_ok;
} pool_sigs;

static void fit_progress(void *ctx, const char *stage, size_t done, size_t total) {
  const char *tag = ctx;
  char label[80];
  snprintf(label, sizeof label, "sim: fit %s: %s", tag, stage);
  cli_progress(label, done, total, done == total);
}

static const char *preset_for_trace_model(const char *model) {
  if (!model) return NULL;
  for (size_t i = 0; eldr_latency_model_name(i); i++) {
    eldr_shape s;
    char canon[128];
    if (eldr_tracegen_model_shape(eldr_latency_model_name(i), &s, canon, sizeof canon, NULL) == 0 &&
        (!strcmp(canon, model) || !strcmp(eldr_latency_model_name(i), model)))
      return eldr_latency_model_name(i);
  }
  return NULL;
}

static void add_variant(variant *vs, size_t *n, size_t cap, const char *label, eldr_policy_kind k,
                        double tau, int permute, int decor, int vanilla, int baseline, int headline) {
  if (*n >= cap) return;
  for (size_t i = 0; i < *n; i++)
    if (!strcmp(vs[i].label, label)) return;
  variant *v = &vs[(*n)++];
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

static int compute_sigs(const eldr_trace *t, const size_t *idx, size_t n, eldr_artifact *a,
                        pool_sigs *ps) {
  ps->a = a;
  ps->sigs = calloc(n * a->dim, sizeof *ps->sigs);
  ps->ok = calloc(n, 1);
  size_t LE = eldr_shape_cells(&t->shape);
  uint32_t *counts = calloc(LE, sizeof *counts);
  float *gates = calloc(LE, sizeof *gates);
  if (!ps->sigs || !ps->ok || !counts || !gates) {
    free(counts);
    free(gates);
    return ELDR_ENOMEM;
  }
  ps->n_ok = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = eldr_fit_request_signature(a, t, &t->req[idx[i]], counts, gates, ps->sigs + i * a->dim);
    ps->ok[i] = rc == 0;
    ps->n_ok += rc == 0;
  }
  free(counts);
  free(gates);
  return 0;
}

static pthread_mutex_t g_progress_lock = PTHREAD_MUTEX_INITIALIZER;

static void sim_progress(void *ctx, size_t done, size_t total) {
  const char *label = ctx;
  pthread_mutex_lock(&g_progress_lock);
  cli_progress(label, done, total, 0);
  pthread_mutex_unlock(&g_progress_lock);
}

/* The (rate, variant) runs of a sweep, shared by --jobs worker threads. */
typedef struct sweep {
  row *rows;
  size_t nrows, nv;
  const variant *vs;
  const double *rates;
  const eldr_sim_pool *pool, *pool_v;
  const eldr_latency_model *lm;
  const eldr_sim_config *cfg;
  int quiet;
  atomic_size_t next;
  atomic_int failed;
  eldr_diag diag;
  const char *fail_label;
  pthread_mutex_t lock;
} sweep;

static void *sweep_worker(void *arg) {
  sweep *sw = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&sw->next, 1);
    if (i >= sw->nrows || atomic_load(&sw->failed)) break;
    size_t ri = i / sw->nv, vi = i % sw->nv;
    const variant *v = &sw->vs[vi];
    row *rw = &sw->rows[i];
    rw->v = v;
    rw->rate = sw->rates[ri];
    eldr_sim_config c2 = *sw->cfg;
    c2.rate = sw->rates[ri];
    c2.policy = v->kind;
    c2.tau = v->tau;
    c2.permute_signatures = v->permute;
    c2.decorrelate = v->decorrelate;
    char label[192];
    snprintf(label, sizeof label, "sim: run %zu/%zu %.47s @ %g/s", i + 1, sw->nrows, v->label, sw->rates[ri]);
    if (!sw->quiet) {
      c2.progress = sim_progress;
      c2.progress_ctx = label;
    }
    eldr_diag d = {{0}};
    int rc = eldr_sim_run(v->vanilla ? sw->pool_v : sw->pool, sw->lm, &c2, &rw->r, &d);
    if (rc) {
      pthread_mutex_lock(&sw->lock);
      if (!atomic_load(&sw->failed)) {
        sw->diag = d;
        sw->fail_label = v->label;
        atomic_store(&sw->failed, rc);
      }
      pthread_mutex_unlock(&sw->lock);
      break;
    }
  }
  return NULL;
}

static double ms(double s) { return s * 1e3; }

/* A JSON number, or null for NaN/inf (e.g. TPOT when no request has two tokens). */
static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Best (lowest median TPOT) baseline row at a rate, or NULL. */
static const row *best_baseline(const row *rows, size_t nrows, double rate, int decor, int p99) {
  const row *b = NULL;
  for (size_t i = 0; i < nrows; i++) {
    if (rows[i].rate != rate || !rows[i].v->is_baseline || rows[i].v->decorrelate != decor) continue;
    double x = p99 ? rows[i].r.tpot_p99 : rows[i].r.tpot_p50;
    if (!b || x < (p99 ? b->r.tpot_p99 : b->r.tpot_p50)) b = &rows[i];
  }
  return b;
}

static const row *find_row(const row *rows, size_t nrows, double rate, const char *label) {
  for (size_t i = 0; i < nrows; i++)
    if (rows[i].rate == rate && !strcmp(rows[i].v->label, label)) return &rows[i];
  return NULL;
}

static int write_plots(const char *cmd, const char *dir, const row *rows, size_t nrows,
                       const variant *vs, size_t nv, const double *rates, size_t nr,
                       const double *taus, size_t ntaus, int vanilla, const char *title) {
  if (mkdir(dir, 0777) && errno != EEXIST) cli_fail(cmd, "--plot: cannot create '%s'", dir);
  char path[4096];
  /* data: one file, one block per variant: rate p50 p99 (ms) */
  snprintf(path, sizeof path, "%s/tpot_vs_rate.dat", dir);
  FILE *f = fopen(path, "w");
  if (!f) cli_fail(cmd, "--plot: cannot write '%s'", path);
  for (size_t v = 0; v < nv; v++) {
    fprintf(f, "# %s\n", vs[v].label);
    for (size_t i = 0; i < nr; i++) {
      const row *r = find_row(rows, nrows, rates[i], vs[v].label);
      if (r) fprintf(f, "%g %g %g\n", rates[i], ms(r->r.tpot_p50), ms(r->r.tpot_p99));
    }
    fprintf(f, "\n\n");
  }
  fclose(f);
  snprintf(path, sizeof path, "%s/plot.gp", dir);
  f = fopen(path, "w");
  if (!f) cli_fail(cmd, "--plot: cannot write '%s'", path);
  fprintf(f, "set terminal pngcairo size 900,600 noenhanced\nset grid\nset key left top\n"
             "set xlabel 'arrival rate (requests/s)'\n");
  for (int p99 = 0; p99 < 2; p99++) {
    fprintf(f, "set output '%s/tpot_%s_vs_rate.png'\nset ylabel '%s TPOT (ms)'\nset title '%s'\nplot ",
            dir, p99 ? "p99" : "p50", p99 ? "p99" : "median", title);
    int first = 1;
    for (size_t v = 0; v < nv; v++) {
      if (!vs[v].is_headline) continue;
      fprintf(f, "%s'%s/tpot_vs_rate.dat' index %zu using 1:%d with linespoints title '%s'",
              first ? "" : ", ", dir, v, p99 ? 3 : 2, vs[v].label);
      first = 0;
    }
    fprintf(f, "\n");
  }
  if (ntaus) {
    char tp[4096];
    snprintf(tp, sizeof tp, "%s/tau_sweep.dat", dir);
    FILE *g = fopen(tp, "w");
    if (!g) cli_fail(cmd, "--plot: cannot write '%s'", tp);
    for (size_t i = 0; i < nr; i++) {
      fprintf(g, "# rate %g\n", rates[i]);
      for (size_t k = 0; k < ntaus; k++) {
        char lab[48];
        snprintf(lab, sizeof lab, "eldr(tau=%g)", taus[k]);
        const row *r = find_row(rows, nrows, rates[i], lab);
        if (r) fprintf(g, "%g %g %g\n", taus[k], ms(r->r.tpot_p50), ms(r->r.tpot_p99));
      }
      fprintf(g, "\n\n");
    }
    fclose(g);
    fprintf(f, "set output '%s/tau_sweep.png'\nset xlabel 'tau'\nset ylabel 'median TPOT (ms)'\n"
               "set title 'ELDR locality band tau'\nset key outside right\nplot ", dir);
    for (size_t i = 0; i < nr; i++)
      fprintf(f, "%s'%s' index %zu using 1:2 with linespoints title 'rate %g'", i ? ", " : "", tp, i,
              rates[i]);
    fprintf(f, "\nset xlabel 'arrival rate (requests/s)'\nset key left top\n");
  }
  if (vanilla) {
    fprintf(f, "set output '%s/balanced_vs_vanilla.png'\nset ylabel 'TPOT (ms)'\n"
               "set title 'balanced vs vanilla K-means'\nplot ", dir);
    size_t vb = nv, vv = nv;
    for (size_t v = 0; v < nv; v++) {
      if (!strcmp(vs[v].label, "eldr")) vb = v;
      if (!strcmp(vs[v].label, "eldr-vanilla")) vv = v;
    }
    if (vb < nv && vv < nv)
      fprintf(f,
              "'%s/tpot_vs_rate.dat' index %zu using 1:2 with linespoints title 'balanced p50', "
              "'' index %zu using 1:3 with linespoints title 'balanced p99', "
              "'' index %zu using 1:2 with linespoints title 'vanilla p50', "
              "'' index %zu using 1:3 with linespoints title 'vanilla p99'\n",
              dir, vb, vb, vv, vv);
    else
      fprintf(f, "NaN notitle\n");
  }
  fclose(f);
  char cmdline[4200];
  snprintf(cmdline, sizeof cmdline, "gnuplot '%s' 2>&1", path);
  int rc = system(cmdline);
  if (rc != 0) {
    fprintf(stderr, "eldr sim: gnuplot failed (status %d); data and script are in %s\n", rc, dir);
    return -1;
  }
  return 0;
}

int eldr_cmd_sim(int argc, char **argv) {
  const char *cmd = "sim";
  const char *trace_path = NULL, *serve_path = NULL, *gen = NULL, *art_path = NULL;
  const char *model = NULL, *hardware = NULL, *lat_path = NULL, *csv_path = NULL, *plot_dir = NULL;
  const char *policies = "all";
  size_t gen_n = 1000, P = 8, D = 16, B = 64, nreq = 5000, jobs = 1;
  double frac = -1, tau = -1;
  double *rates = NULL, *taus = NULL;
  size_t nrates = 0, ntaus = 0;
  int vanilla = 0, decor = 0, decor_rows = 0, json = 0, quiet = 0, trace_arrivals = 0;
  uint64_t seed = 1;
  static const struct option lo[] = {
      {"trace", required_argument, 0, 't'},      {"generate", required_argument, 0, 1},
      {"gen-requests", required_argument, 0, 2}, {"serve-trace", required_argument, 0, 3},
      {"fit-fraction", required_argument, 0, 4}, {"artifact", required_argument, 0, 'a'},
      {"arrivals", required_argument, 0, 5},     {"prefill", required_argument, 0, 6},
      {"decode", required_argument, 0, 7},       {"max-batch", required_argument, 0, 8},
      {"model", required_argument, 0, 'm'},      {"hardware", required_argument, 0, 9},
      {"latency", required_argument, 0, 10},     {"rates", required_argument, 0, 11},
      {"requests", required_argument, 0, 12},    {"policies", required_argument, 0, 13},
      {"tau", required_argument, 0, 14},         {"taus", required_argument, 0, 15},
      {"vanilla", no_argument, 0, 16},           {"ablation", no_argument, 0, 17},
      {"decorrelate", no_argument, 0, 18},       {"decorrelated-rows", no_argument, 0, 19},
      {"seed", required_argument, 0, 20},        {"json", no_argument, 0, 21},
      {"csv", required_argument, 0, 22},         {"plot", required_argument, 0, 23},
      {"jobs", required_argument, 0, 24},        {"quiet", no_argument, 0, 'q'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":t:a:m:qh", lo, NULL)) != -1) {
    switch (c) {
    case 't': trace_path = optarg; break;
    case 1: gen = optarg; break;
    case 2: gen_n = (size_t)cli_parse_long(cmd, "--gen-requests", optarg, 2, 1000000); break;
    case 3: serve_path = optarg; break;
    case 4: frac = cli_parse_double(cmd, "--fit-fraction", optarg, 0.01, 0.99); break;
    case 'a': art_path = optarg; break;
    case 5:
      if (strcmp(optarg, "trace")) cli_usage_error(cmd, "--arrivals: only 'trace' is supported (else use --rates)");
      trace_arrivals = 1;
      break;
    case 6: P = (size_t)cli_parse_long(cmd, "--prefill", optarg, 1, 4096); break;
    case 7: D = (size_t)cli_parse_long(cmd, "--decode", optarg, 1, 4096); break;
    case 8: B = (size_t)cli_parse_long(cmd, "--max-batch", optarg, 1, 65536); break;
    case 'm': model = optarg; break;
    case 9: hardware = optarg; break;
    case 10: lat_path = optarg; break;
    case 11: free(rates); nrates = cli_parse_double_list(cmd, "--rates", optarg, 1e-6, 1e9, &rates); break;
    case 12: nreq = (size_t)cli_parse_long(cmd, "--requests", optarg, 1, 100000000); break;
    case 13: policies = optarg; break;
    case 14: tau = cli_parse_double(cmd, "--tau", optarg, 0.0, 2.0); break;
    case 15: free(taus); ntaus = cli_parse_double_list(cmd, "--taus", optarg, 0.0, 2.0, &taus); break;
    case 16: vanilla = 1; break;
    case 17:
      free(taus);
      ntaus = cli_parse_double_list(cmd, "--ablation", "0,0.05,0.1,0.2,0.5,1", 0.0, 2.0, &taus);
      vanilla = 1;
      break;
    case 18: decor = 1; break;
    case 19: decor_rows = 1; break;
    case 20: seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 21: json = 1; break;
    case 22: csv_path = optarg; break;
    case 23: plot_dir = optarg; break;
    case 24: jobs = (size_t)cli_parse_long(cmd, "--jobs", optarg, 1, 64); break;
    case 'q': quiet = 1; break;
    case 'h': fputs(SIM_HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s' (see --help)", argv[optind]);
  if (!trace_path && !gen) cli_usage_error(cmd, "--trace or --generate is required (see --help)");
  if (trace_path && gen) cli_usage_error(cmd, "--trace and --generate are exclusive");
  if (serve_path && frac > 0) cli_usage_error(cmd, "--serve-trace and --fit-fraction are exclusive");
  if (trace_arrivals && nrates) cli_usage_error(cmd, "--arrivals trace and --rates are exclusive");
  if (art_path && vanilla) cli_usage_error(cmd, "--vanilla fits in-process; it cannot be used with --artifact");

  /* ---- policies ---- */
  variant vs[64];
  size_t nv = 0;
  const char *base_names[] = {"random", "rr", "jsq", "p2c"};
  {
    char *copy = strdup(policies), *save = NULL;
    if (!copy) cli_fail(cmd, "out of memory");
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      if (!strcmp(tok, "all")) {
        for (size_t i = 0; i < 4; i++) {
          eldr_policy_kind k;
          eldr_policy_parse(base_names[i], &k);
          add_variant(vs, &nv, 64, base_names[i], k, 0, 0, decor, 0, 1, 1);
        }
        add_variant(vs, &nv, 64, "domain", ELDR_POLICY_DOMAIN, 0, 0, decor, 0, 0, 1);
        add_variant(vs, &nv, 64, "eldr", ELDR_POLICY_ELDR, -1, 0, decor, 0, 0, 1);
        add_variant(vs, &nv, 64, "eldr-permuted", ELDR_POLICY_ELDR, -1, 1, decor, 0, 0, 1);
        continue;
      }
      if (!strcmp(tok, "eldr-permuted")) {
        add_variant(vs, &nv, 64, tok, ELDR_POLICY_ELDR, -1, 1, decor, 0, 0, 1);
        continue;
      }
      eldr_policy_kind k;
      if (eldr_policy_parse(tok, &k))
        cli_usage_error(cmd, "--policies: unknown policy '%s' (random rr jsq p2c domain eldr eldr-permuted all)", tok);
      add_variant(vs, &nv, 64, eldr_policy_name(k), k, k == ELDR_POLICY_ELDR ? -1 : 0, 0, decor, 0,
                  k <= ELDR_POLICY_P2C, 1);
    }
    free(copy);
  }
  for (size_t i = 0; i < ntaus; i++) {
    char lab[48];
    snprintf(lab, sizeof lab, "eldr(tau=%g)", taus[i]);
    add_variant(vs, &nv, 64, lab, ELDR_POLICY_ELDR, taus[i], 0, decor, 0, 0, 0);
  }
  if (vanilla) add_variant(vs, &nv, 64, "eldr-vanilla", ELDR_POLICY_ELDR, -1, 0, decor, 1, 0, 0);
  if (decor_rows && !decor) {
    size_t n0 = nv;
    for (size_t i = 0; i < n0; i++) {
      if (!vs[i].is_headline) continue;
      char lab[48];
      snprintf(lab, sizeof lab, "%.36s+decor", vs[i].label);
      add_variant(vs, &nv, 64, lab, vs[i].kind, vs[i].tau, vs[i].permute, 1, 0, vs[i].is_baseline, 0);
    }
  }

  /* ---- workload ---- */
  eldr_diag d = {{0}};
  int rc;
  eldr_trace *t = NULL, *ts = NULL;
  char canon[128] = "";
  if (trace_path) {
    if (!quiet) fprintf(stderr, "sim: loading %s\n", trace_path);
    rc = eldr_trace_load(trace_path, &t, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  } else {
    const char *mname = model ? model : "qwen3-30b-a3b";
    eldr_shape s;
    rc = eldr_tracegen_model_shape(mname, &s, canon, sizeof canon, &d);
    if (rc) cli_usage_error(cmd, "--model: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen *g = NULL;
    rc = eldr_tracegen_new(&s, canon, gen, seed, &g, &d);
    if (rc) cli_usage_error(cmd, "--generate: %s", eldr_diag_msg(&d, rc));
    if (!quiet) fprintf(stderr, "sim: generating %zu %s requests for %s\n", gen_n, gen, canon);
    rc = eldr_tracegen_generate(g, gen_n, &t, &d);
    eldr_tracegen_free(g);
    if (rc) cli_fail(cmd, "--generate: %s", eldr_diag_msg(&d, rc));
  }
  if (serve_path) {
    rc = eldr_trace_load(serve_path, &ts, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    if (ts->shape.num_layers != t->shape.num_layers || ts->shape.num_experts != t->shape.num_experts ||
        ts->shape.top_k != t->shape.top_k)
      cli_fail(cmd, "--serve-trace: shape differs from --trace");
  }
  const eldr_trace *st = ts ? ts : t;

  /* ---- latency model ---- */
  if (!model) {
    model = preset_for_trace_model(t->model);
    if (!model)
      cli_usage_error(cmd, "--model is required: no latency preset for the trace's model '%s'", t->model);
  }
  if (!hardware) hardware = !strcmp(model, "llama4-maverick") ? "h200" : "mi300x";
  eldr_latency_model lm;
  rc = eldr_latency_preset(model, hardware, &lm, &d);
  if (rc) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
  if (lat_path) {
    rc = eldr_latency_load_overrides(lat_path, &lm, &d);
    if (rc) cli_fail(cmd, "--latency: %s", eldr_diag_msg(&d, rc));
  }
  if (lm.shape.num_layers != st->shape.num_layers || lm.shape.num_experts != st->shape.num_experts ||
      lm.shape.top_k != st->shape.top_k)
    cli_usage_error(cmd, "--model %s has %u layers x %u experts top-%u, the trace %u x %u top-%u",
                    model, lm.shape.num_layers, lm.shape.num_experts, lm.shape.top_k,
                    st->shape.num_layers, st->shape.num_experts, st->shape.top_k);

  /* ---- split: fit on one part, serve the other ---- */
  size_t *fit_idx = NULL, n_fit = 0, *serve_idx = NULL, n_serve = 0;
  {
    size_t n = t->n;
    size_t *perm = malloc(n * sizeof *perm);
    if (!perm) cli_fail(cmd, "out of memory");
    eldr_fit_shuffle(perm, n, seed);
    if (ts) { /* fit on all of --trace, serve all of --serve-trace */
      fit_idx = perm;
      n_fit = n;
      serve_idx = malloc(ts->n * sizeof *serve_idx);
      if (!serve_idx) cli_fail(cmd, "out of memory");
      for (size_t i = 0; i < ts->n; i++) serve_idx[i] = i;
      n_serve = ts->n;
    } else if (art_path && frac < 0) { /* artifact fitted elsewhere: serve everything */
      serve_idx = perm;
      n_serve = n;
    } else {
      double f = frac > 0 ? frac : 0.5;
      n_fit = (size_t)floor(f * (double)n);
      if (n_fit < 1 || n_fit >= n)
        cli_usage_error(cmd, "--fit-fraction %g leaves no fit or no serve requests (%zu requests)", f, n);
      fit_idx = perm;
      serve_idx = malloc((n - n_fit) * sizeof *serve_idx);
      if (!serve_idx) cli_fail(cmd, "out of memory");
      memcpy(serve_idx, perm + n_fit, (n - n_fit) * sizeof *serve_idx);
      n_serve = n - n_fit;
      /* ascending order in each part (deterministic, file order inside a part) */
    }
  }

  /* ---- artifacts ---- */
  eldr_artifact *art = NULL, *art_v = NULL;
  eldr_fit_report rep = {0}, rep_v = {0};
  int have_rep = 0, need_art = 0;
  for (size_t i = 0; i < nv; i++) need_art |= vs[i].kind == ELDR_POLICY_ELDR;
  if (art_path) {
    rc = eldr_artifact_load(art_path, &art, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    if (art->shape.num_layers != st->shape.num_layers || art->shape.num_experts != st->shape.num_experts ||
        art->shape.top_k != st->shape.top_k)
      cli_fail(cmd, "--artifact: model shape differs from the trace's");
  } else if (need_art) { /* no ELDR variant requested: no fit */
    for (int pass = 0; pass < 1 + vanilla; pass++) {
      eldr_fit_opts o;
      eldr_fit_opts_default(&o);
      o.k = D;
      o.tau = tau >= 0 ? tau : 0.1;
      o.seed = seed;
      o.balanced = pass == 0;
      o.subset = fit_idx;
      o.n_subset = n_fit;
      if (!quiet) {
        o.progress = fit_progress;
        o.progress_ctx = (void *)(pass ? "vanilla" : "balanced");
      }
      eldr_artifact **dst = pass ? &art_v : &art;
      rc = eldr_fit(t, &o, dst, pass ? &rep_v : &rep, &d);
      if (rc) cli_fail(cmd, "fit: %s", eldr_diag_msg(&d, rc));
    }
    have_rep = 1;
  }
  double tau_eff = tau >= 0 ? tau : art ? art->tau : 0.1;
  for (size_t i = 0; i < nv; i++)
    if (vs[i].tau < 0) vs[i].tau = tau_eff;

  pool_sigs ps = {0}, ps_v = {0};
  if (art && compute_sigs(st, serve_idx, n_serve, art, &ps)) cli_fail(cmd, "out of memory");
  if (art_v && compute_sigs(st, serve_idx, n_serve, art_v, &ps_v)) cli_fail(cmd, "out of memory");

  eldr_sim_pool pool = {.trace = st, .idx = serve_idx, .n = n_serve, .sigs = ps.sigs, .sig_ok = ps.ok,
                        .dim = art ? art->dim : 0, .centroids = art ? art->centroids : NULL,
                        .n_centroids = art ? art->k : 0};
  uint64_t *tokbits = NULL;
  size_t *tokoff = NULL;
  rc = eldr_sim_bitsets_build(&pool, &tokbits, &tokoff, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  pool.tokbits = tokbits;
  pool.tokoff = tokoff;
  eldr_sim_pool pool_v = pool;
  if (art_v) {
    pool_v.sigs = ps_v.sigs;
    pool_v.sig_ok = ps_v.ok;
    pool_v.dim = art_v->dim;
    pool_v.centroids = art_v->centroids;
    pool_v.n_centroids = art_v->k;
  }

  eldr_sim_config cfg;
  eldr_sim_config_default(&cfg);
  cfg.n_prefill = P;
  cfg.n_decode = D;
  cfg.max_batch = B;
  cfg.n_requests = nreq;
  cfg.seed = seed;
  double capacity = eldr_sim_capacity(&pool, &lm, &cfg);
  if (trace_arrivals) {
    free(rates);
    nrates = 1;
    rates = calloc(1, sizeof *rates);
    if (!rates) cli_fail(cmd, "out of memory");
    rates[0] = 0;
  } else if (!nrates) {
    static const double fr[] = {0.2, 0.4, 0.6, 0.8, 0.95};
    nrates = 5;
    rates = calloc(nrates, sizeof *rates);
    if (!rates) cli_fail(cmd, "out of memory");
    for (size_t i = 0; i < nrates; i++) rates[i] = round(fr[i] * capacity * 10) / 10;
  }

  /* ---- runs ---- */
  size_t nrows = nrates * nv;
  row *rows = calloc(nrows, sizeof *rows);
  if (!rows) cli_fail(cmd, "out of memory");
  double t_run0 = cli_now();
  uint64_t total_token_steps = 0, total_steps = 0;
  {
    sweep sw = {.rows = rows, .nrows = nrows, .nv = nv, .vs = vs, .rates = rates, .pool = &pool,
                .pool_v = &pool_v, .lm = &lm, .cfg = &cfg, .quiet = quiet};
    atomic_init(&sw.next, 0);
    atomic_init(&sw.failed, 0);
    pthread_mutex_init(&sw.lock, NULL);
    size_t nj = jobs < nrows ? jobs : nrows;
    pthread_t th[64];
    size_t started = 0;
    for (size_t j = 1; j < nj; j++) {
      if (pthread_create(&th[started], NULL, sweep_worker, &sw) != 0) break;
      started++;
    }
    sweep_worker(&sw);
    for (size_t j = 0; j < started; j++) pthread_join(th[j], NULL);
    pthread_mutex_destroy(&sw.lock);
    int frc = atomic_load(&sw.failed);
    if (frc) cli_fail(cmd, "%s: %s", sw.fail_label, eldr_diag_msg(&sw.diag, frc));
    for (size_t i = 0; i < nrows; i++) {
      total_token_steps += rows[i].r.token_steps;
      total_steps += rows[i].r.steps;
    }
  }
  double t_run = cli_now() - t_run0;
  if (!quiet) {
    fprintf(stderr, "\nsim: %zu runs in %.1f s (%.2fM decode token-steps/s, %.2fM batch steps/s)\n",
            nrows, t_run, t_run > 0 ? (double)total_token_steps / t_run / 1e6 : 0,
            t_run > 0 ? (double)total_steps / t_run / 1e6 : 0);
  }

  /* ---- output ---- */
  const char *src_name = trace_path ? trace_path : gen;
  if (csv_path) {
    FILE *f = fopen(csv_path, "w");
    if (!f) cli_fail(cmd, "--csv: cannot write '%s'", csv_path);
    fprintf(f, "policy,rate,tpot_p50_ms,tpot_p99_ms,tpot_mean_ms,ttft_p50_ms,ttft_p99_ms,"
               "throughput_tok_s,throughput_req_s,mean_batch,mean_union,copies_in_flight,"
               "batch_dup_frac,fallbacks,completed,pool_size,tau,decorrelate\n");
    for (size_t i = 0; i < nrows; i++) {
      const row *r = &rows[i];
      fprintf(f, "%s,%g,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.3f,%.3f,%.3f,%.4f,%.4f,%zu,%zu,%zu,%g,%d\n",
              r->v->label, r->rate, ms(r->r.tpot_p50), ms(r->r.tpot_p99), ms(r->r.tpot_mean),
              ms(r->r.ttft_p50), ms(r->r.ttft_p99), r->r.throughput_tok_s, r->r.throughput_req_s,
              r->r.mean_batch, r->r.mean_union, r->r.copies_in_flight, r->r.batch_dup_frac,
              r->r.fallbacks, r->r.completed, r->r.pool_size, r->v->tau, r->v->decorrelate);
    }
    if (fclose(f)) cli_fail(cmd, "--csv: write error on '%s'", csv_path);
  }
  if (json) {
    json_t *root = json_object();
    json_t *cj = json_object();
    json_object_set_new(cj, "workload", json_string(src_name));
    if (serve_path) json_object_set_new(cj, "serve_trace", json_string(serve_path));
    json_object_set_new(cj, "model", json_string(lm.model));
    json_object_set_new(cj, "hardware", json_string(lm.hardware));
    json_object_set_new(cj, "prefill", json_integer((json_int_t)P));
    json_object_set_new(cj, "decode", json_integer((json_int_t)D));
    json_object_set_new(cj, "max_batch", json_integer((json_int_t)B));
    json_object_set_new(cj, "requests_per_run", json_integer((json_int_t)(trace_arrivals ? n_serve : nreq)));
    json_object_set_new(cj, "seed", json_integer((json_int_t)seed));
    json_object_set_new(cj, "tau", jnum(tau_eff));
    json_object_set_new(cj, "fit_requests", json_integer((json_int_t)n_fit));
    json_object_set_new(cj, "pool_size", json_integer((json_int_t)n_serve));
    json_object_set_new(cj, "pool_signatures", json_integer((json_int_t)ps.n_ok));
    json_object_set_new(cj, "capacity_estimate_rps", jnum(capacity));
    json_object_set_new(cj, "decorrelate", json_boolean(decor));
    if (art_path) json_object_set_new(cj, "artifact", json_string(art_path));
    if (have_rep) {
      const eldr_fit_candidate *ch = &rep.cand[rep.chosen];
      json_object_set_new(cj, "representation", json_string(eldr_repr_name(ch->repr)));
      json_object_set_new(cj, "idf", json_boolean(ch->idf));
      json_object_set_new(cj, "rho", jnum(ch->rho_mask));
      json_object_set_new(cj, "mask_size", json_integer((json_int_t)ch->mask_size));
    }
    json_object_set_new(root, "config", cj);
    json_t *ra = json_array();
    for (size_t i = 0; i < nrows; i++) {
      const row *r = &rows[i];
      json_t *o = json_object();
      json_object_set_new(o, "policy", json_string(r->v->label));
      json_object_set_new(o, "rate", jnum(r->rate));
      json_object_set_new(o, "tau", jnum(r->v->tau));
      json_object_set_new(o, "decorrelate", json_boolean(r->v->decorrelate));
      json_object_set_new(o, "tpot_p50_ms", jnum(ms(r->r.tpot_p50)));
      json_object_set_new(o, "tpot_p99_ms", jnum(ms(r->r.tpot_p99)));
      json_object_set_new(o, "tpot_mean_ms", jnum(ms(r->r.tpot_mean)));
      json_object_set_new(o, "ttft_p50_ms", jnum(ms(r->r.ttft_p50)));
      json_object_set_new(o, "ttft_p99_ms", jnum(ms(r->r.ttft_p99)));
      json_object_set_new(o, "throughput_tok_s", jnum(r->r.throughput_tok_s));
      json_object_set_new(o, "throughput_req_s", jnum(r->r.throughput_req_s));
      json_object_set_new(o, "mean_batch", jnum(r->r.mean_batch));
      json_object_set_new(o, "mean_union", jnum(r->r.mean_union));
      json_object_set_new(o, "copies_in_flight", jnum(r->r.copies_in_flight));
      json_object_set_new(o, "batch_dup_frac", jnum(r->r.batch_dup_frac));
      json_object_set_new(o, "fallbacks", json_integer((json_int_t)r->r.fallbacks));
      json_object_set_new(o, "completed", json_integer((json_int_t)r->r.completed));
      json_object_set_new(o, "decode_steps", json_integer((json_int_t)r->r.steps));
      json_array_append_new(ra, o);
    }
    json_object_set_new(root, "rows", ra);
    json_t *ga = json_array();
    for (size_t ri = 0; ri < nrates; ri++) {
      const row *e = find_row(rows, nrows, rates[ri], decor ? "eldr" : "eldr");
      const row *b50 = best_baseline(rows, nrows, rates[ri], decor, 0);
      const row *b99 = best_baseline(rows, nrows, rates[ri], decor, 1);
      if (!e || !b50) continue;
      json_t *o = json_object();
      json_object_set_new(o, "rate", jnum(rates[ri]));
      json_object_set_new(o, "best_baseline_p50", json_string(b50->v->label));
      json_object_set_new(o, "gain_p50_pct", jnum(100.0 * (e->r.tpot_p50 / b50->r.tpot_p50 - 1)));
      json_object_set_new(o, "best_baseline_p99", json_string(b99->v->label));
      json_object_set_new(o, "gain_p99_pct", jnum(100.0 * (e->r.tpot_p99 / b99->r.tpot_p99 - 1)));
      json_array_append_new(ga, o);
    }
    json_object_set_new(root, "eldr_vs_best_baseline", ga);
    json_object_set_new(root, "wall_seconds", jnum(t_run));
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    if (!s) cli_fail(cmd, "out of memory");
    puts(s);
    free(s);
    json_decref(root);
  } else {
    printf("workload %s%s%s | %s on %s | %zuP%zuD batch %zu | pool %zu served, %zu in the fit split | %s\n",
           src_name, serve_path ? " -> " : "", serve_path ? serve_path : "", lm.model, lm.hardware, P, D, B,
           n_serve, n_fit, trace_arrivals ? "trace arrivals" : "Poisson arrivals");
    if (have_rep) {
      const eldr_fit_candidate *ch = &rep.cand[rep.chosen];
      printf("artifact: fitted in-process: %s%s, %zu layers in mask, rho %.3f, tau %g; capacity est. %.1f req/s\n",
             eldr_repr_name(ch->repr), ch->idf ? "-idf" : "", ch->mask_size, ch->rho_mask, tau_eff, capacity);
    } else if (art_path) {
      printf("artifact: %s, tau %g; capacity est. %.1f req/s\n", art_path, tau_eff, capacity);
    } else {
      printf("artifact: none (no ELDR policy requested, nothing fitted); capacity est. %.1f req/s\n", capacity);
    }
    printf("%-22s %8s %9s %9s %9s %10s %7s %7s %7s %6s\n", "policy", "rate", "TPOT p50", "TPOT p99",
           "TTFT p50", "tok/s", "batch", "union", "copies", "dup%");
    for (size_t ri = 0; ri < nrates; ri++) {
      for (size_t vi = 0; vi < nv; vi++) {
        const row *r = &rows[ri * nv + vi];
        printf("%-22s %8g %8.2fm %8.2fm %8.1fm %10.0f %7.2f %7.2f %7.3f %6.2f\n", r->v->label, r->rate,
               ms(r->r.tpot_p50), ms(r->r.tpot_p99), ms(r->r.ttft_p50), r->r.throughput_tok_s,
               r->r.mean_batch, r->r.mean_union, r->r.copies_in_flight, 100 * r->r.batch_dup_frac);
      }
      const row *e = find_row(rows, nrows, rates[ri], "eldr");
      const row *b50 = best_baseline(rows, nrows, rates[ri], decor, 0);
      const row *b99 = best_baseline(rows, nrows, rates[ri], decor, 1);
      if (e && b50 && b99)
        printf("  -> eldr vs best baseline at %g/s: p50 %+.1f%% (vs %s), p99 %+.1f%% (vs %s)\n", rates[ri],
               100.0 * (e->r.tpot_p50 / b50->r.tpot_p50 - 1), b50->v->label,
               100.0 * (e->r.tpot_p99 / b99->r.tpot_p99 - 1), b99->v->label);
    }
  }
  if (plot_dir) {
    char title[256];
    snprintf(title, sizeof title, "%s, %s on %s, %zuP%zuD", src_name, lm.model, lm.hardware, P, D);
    if (write_plots(cmd, plot_dir, rows, nrows, vs, nv, rates, nrates, taus, ntaus, vanilla, title) == 0 &&
        !quiet)
      fprintf(stderr, "sim: figures written to %s\n", plot_dir);
  }

  free(rows);
  free(tokbits);
  free(tokoff);
  free(ps.sigs);
  free(ps.ok);
  free(ps_v.sigs);
  free(ps_v.ok);
  if (have_rep) {
    eldr_fit_report_free(&rep);
    if (vanilla) eldr_fit_report_free(&rep_v);
  }
  eldr_artifact_free(art_v);
  eldr_artifact_free(art);
  free(serve_idx);
  free(fit_idx);
  if (fit_idx != serve_idx && !fit_idx) { /* serve_idx was perm */
  }
  eldr_trace_free(ts);
  eldr_trace_free(t);
  free(rates);
  free(taus);
  return 0;
}
