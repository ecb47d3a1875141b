/* cmd_sim.c — `eldr sim`: the discrete-event xPyD simulation of every
 * routing policy over a rate sweep, with the ELDR ablations and the replay
 * control. Fits the routing artifact in-process on a split of the trace
 * (the served requests are never the fitted ones) unless one is given. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cli_ep.h"
#include "figures.h"
#include "eldr/artifact.h"
#include "eldr/fit.h"
#include "eldr/provenance.h"
#include "eldr/latency.h"
#include "eldr/policy.h"
#include "eldr/rng.h"
#include "eldr/predict.h"
#include "eldr/sim.h"
#include "eldr/sweep.h"
#include "eldr/trace.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"

static const char SIM_HELP[] =
    "usage: eldr sim (--trace T | --generate W) [options]\n"
    "\n"
    "Simulate a PD-disaggregated cluster (P prefill, D decode workers, continuous\n"
    "batching, union-of-experts step latency) under each routing policy and rate.\n"
    "Decisions come from the same policy code as `eldr serve`.\n"
    "\n"
    "workload\n"
    "  -t, --trace FILE        expert trace (JSONL)   (required: this or --generate)\n"
    "      --generate W        generate in-process: realistic (calibrated to real\n"
    "                          traces) | task | language (paper-shaped presets) |\n"
    "                          custom:FILE             (required: this or --trace)\n"
    "      --gen-requests N    requests to generate                      [1000]\n"
    "      --serve-trace FILE  serve this trace; fit on all of --trace    [none]\n"
    "      --fit-fraction F    fit on a seeded random F of the requests, serve the rest [0.5]\n"
    "  -a, --artifact FILE     use this artifact instead of fitting (serves all of\n"
    "                          the trace unless --fit-fraction is given)  [none]\n"
    "      --arrivals trace    use the trace's arrival timestamps instead of --rates\n"
    "      --arrivals scaled   (--serve-mooncake) the trace's arrivals in order, time\n"
    "                          scaled to each rate of the sweep\n"
    "      --serve-mooncake FILE  serve a Mooncake trace's arrivals, lengths and block\n"
    "                          structure, each distinct block's experts drawn once from\n"
    "                          the generator of --generate (fitted on all of it) [none]\n"
    "      --mooncake-requests N  its first N lines                   [all]\n"
    "      --max-decode-tokens T  cap of its output lengths, tokens      [no cap]\n"
    "when the decoder is chosen\n"
    "      --pd LIST           vllm (at prefill end, true signature) | sglang (at\n"
    "                          arrival, predicted signature) | sglang-exact (at forward\n"
    "                          end, true signature, registration after it); a list runs\n"
    "                          each (rows of later modes named policy@mode)  [vllm]\n"
    "      --known-fraction F  decide knowing only the first F of each prompt [off]\n"
    "      --predict-threshold X  confidence a prediction needs        [0.5]\n"
    "      --register-ms X     decode leg dispatch + registration before the KV moves,\n"
    "                          where it is sent after the prefill (vllm, sglang-exact) [0]\n"
    "cluster and model\n"
    "      --prefill P         prefill workers                           [8]\n"
    "      --decode D          decode workers                            [16]\n"
    "      --max-batch B       decode batch limit per worker             [64]\n"
    "  -m, --model M           latency preset: qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b\n"
    "                          llama4-maverick olmoe-1b-7b deepseek-v3 [from the trace's model]\n"
    "      --hardware H        mi300x | h200 | h100   [mi300x; h200 for llama4-maverick]\n"
    "      --latency FILE      JSON overrides of the latency model's fields  [none]\n"
    "      --ep-size R         decoders run experts over R EP ranks (latency: slowest\n"
    "                          rank + all-to-all, eldr_latency_preset_ep); also prefill\n"
    "                                                                    [off]\n"
    "      --tp T              attention tensor parallelism with --ep-size  [= R]\n"
    "      --placement K       linear | global | per-decoder expert placement   [linear]\n"
    "                          (global/per-decoder: the artifact's files, else fitted\n"
    "                          on the calibration split)\n"
    "      --redundant-experts N  replicas of hot experts per layer (fitted placements) [0]\n"
    "runs\n"
    "      --rates LIST        requests/s  [sweep 20..95% of estimated capacity]\n"
    "      --loads LIST        rates as shares of the estimated capacity    [none]\n"
    "                          (0.1,0.5,...; not with --rates)\n"
    "      --requests N        arrivals per run                          [5000]\n"
    "      --policies LIST     all | comma list of random rr jsq p2c domain eldr\n"
    "                          eldr-permuted footprint footprint-oracle footprint-permuted\n"
    "                          footprint-all footprint-mask footprint-raw, and the replay\n"
    "                          controls footprint-oracle-permuted footprint-mask-permuted\n"
    "                          footprint-raw-permuted          [all: up to footprint]\n"
    "      --tau X             ELDR locality band          [artifact's tau, or 0.1]\n"
    "      --taus LIST         also run ELDR at each tau (ablation)      [none]\n"
    "      --vanilla           also fit unbalanced K-means and run it (ablation)\n"
    "      --ablation          shorthand: --taus 0,0.05,0.1,0.2,0.5,1 --vanilla\n"
    "      --decorrelate       every arrival starts at a random offset of its recorded\n"
    "                          decode sequence (wrapping); default off\n"
    "      --decorrelated-rows also run eldr and the best baselines decorrelated\n"
    "      --seed N            seed of arrivals, split, fit and policies [" ELDR_SEED_DEFAULT_STR "]\n"
    "  -j, --jobs N            simulations run in parallel threads       [1]\n"
    "output\n"
    "      --json              JSON on stdout instead of the table\n"
    "      --csv FILE          one row per (policy, rate)                [none]\n"
    "      --log FILE          one row per request and run (CSV): its times, latencies,\n"
    "                          decoder, the loads at its decision, footprint's\n"
    "                          prediction                                [none]\n"
    "      --plot DIR          gnuplot figures (PNG) into DIR            [none]\n"
    "      --print-latency     print the latency model (--model on --hardware, with\n"
    "                          the EP flags and --latency applied) as JSON and exit;\n"
    "                          needs --model, no trace\n"
    "  -q, --quiet             no progress on stderr\n"
    "  -h, --help              this help\n";

/* The flags of one run. */
typedef struct sim_args {
  const char *trace_path, *serve_path, *gen, *art_path;
  const char *model, *hardware, *lat_path, *csv_path, *plot_dir, *policies, *log_path;
  size_t gen_n, P, D, B, nreq, jobs;
  double frac, tau;
  double *rates, *taus, *loads;
  size_t nrates, ntaus, nloads;
  int vanilla, decor, decor_rows, json, quiet, trace_arrivals, print_latency;
  uint64_t seed;
  uint32_t ep_size, ep_tp, ep_redundant; /* expert parallelism (0: off) */
  eldr_sim_pd pds[3];        /* --pd: the modes, in order (none: vllm) */
  size_t npd;
  double known_fraction, predict_threshold, register_s;
  const char *mooncake;      /* --serve-mooncake (also serve_path) */
  size_t mc_requests;
  uint32_t mc_max_decode;
  int scaled_arrivals;
  eldr_placement_kind ep_kind;
  int ep_kind_set;
} sim_args;

/* What the run produced, for the table, JSON, CSV and figures. */
typedef struct sim_out {
  const sim_args *a;
  const char *src_name;
  const eldr_latency_model *lm;
  const eldr_sweep_row *rows;
  size_t nrows, nv;
  const eldr_sweep_variant *vs;
  size_t n_fit, n_serve, n_sigs;
  double tau_eff, capacity, wall_s;
  const eldr_fit_report *rep; /* NULL unless fitted in-process */
  const cli_ep_set *eps;      /* with --ep-size */
  eldr_sim_pd pd;             /* the base config's mode */
  const eldr_block_table *blocks; /* with --serve-mooncake */
} sim_out;

static void fit_progress(void *ctx, const char *stage, size_t done, size_t total) {
  const char *tag = ctx;
  char label[80];
  snprintf(label, sizeof label, "sim: fit %s: %s", tag, stage);
  cli_progress(label, done, total, done == total);
}

static void sweep_progress(void *ctx, const char *label, size_t done, size_t total) {
  (void)ctx;
  cli_progress(label, done, total, 0);
}

static double ms(double s) { return s * 1e3; }

/* A JSON number, or null for NaN/inf (e.g. TPOT when no request has two tokens). */
static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* --pd LIST: vllm | sglang | sglang-exact, each once. */
static void parse_pd(const char *cmd, const char *arg, sim_args *a) {
  a->npd = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", arg);
  for (char *sv = NULL, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
    eldr_sim_pd pd;
    if (eldr_sim_pd_parse(tok, &pd)) cli_usage_error(cmd, "--pd: unknown mode '%s' (vllm|sglang|sglang-exact)", tok);
    for (size_t i = 0; i < a->npd; i++)
      if (a->pds[i] == pd) cli_usage_error(cmd, "--pd: '%s' given twice", tok);
    if (a->npd == 3) cli_usage_error(cmd, "--pd: at most 3 modes");
    a->pds[a->npd++] = pd;
  }
  if (!a->npd) cli_usage_error(cmd, "--pd: empty list");
}

/* Parse argv into a (exit 2 on a bad flag or value; exit 0 after --help). */
static void parse_args(const char *cmd, int argc, char **argv, sim_args *a) {
  memset(a, 0, sizeof *a);
  a->policies = "all";
  a->gen_n = 1000;
  a->P = 8;
  a->D = 16;
  a->B = 64;
  a->nreq = 5000;
  a->jobs = 1;
  a->frac = -1;
  a->tau = -1;
  a->seed = ELDR_SEED_DEFAULT;
  a->known_fraction = -1;
  a->predict_threshold = ELDR_PREDICT_THRESHOLD_DEFAULT;
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
      {"ep-size", required_argument, 0, 25},     {"tp", required_argument, 0, 26},
      {"placement", required_argument, 0, 27},   {"redundant-experts", required_argument, 0, 28},
      {"print-latency", no_argument, 0, 29},     {"help", no_argument, 0, 'h'},
      {"log", required_argument, 0, 30},        {"loads", required_argument, 0, 31},
      {"pd", required_argument, 0, 32},          {"known-fraction", required_argument, 0, 33},
      {"predict-threshold", required_argument, 0, 34}, {"register-ms", required_argument, 0, 35},
      {"serve-mooncake", required_argument, 0, 36}, {"mooncake-requests", required_argument, 0, 37},
      {"max-decode-tokens", required_argument, 0, 38},
      {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":t:a:m:j:qh", lo, NULL)) != -1) {
    switch (c) {
    case 't': a->trace_path = optarg; break;
    case 1: a->gen = optarg; break;
    case 2: a->gen_n = (size_t)cli_parse_long(cmd, "--gen-requests", optarg, 2, 1000000); break;
    case 3: a->serve_path = optarg; break;
    case 4: a->frac = cli_parse_double(cmd, "--fit-fraction", optarg, 0.01, 0.99); break;
    case 'a': a->art_path = optarg; break;
    case 5:
      if (!strcmp(optarg, "scaled")) a->scaled_arrivals = 1;
      else if (!strcmp(optarg, "trace")) a->trace_arrivals = 1;
      else cli_usage_error(cmd, "--arrivals: 'trace' or 'scaled' (else use --rates)");
      break;
    case 6: a->P = (size_t)cli_parse_long(cmd, "--prefill", optarg, 1, 4096); break;
    case 7: a->D = (size_t)cli_parse_long(cmd, "--decode", optarg, 1, 4096); break;
    case 8: a->B = (size_t)cli_parse_long(cmd, "--max-batch", optarg, 1, 65536); break;
    case 'm': a->model = optarg; break;
    case 9: a->hardware = optarg; break;
    case 10: a->lat_path = optarg; break;
    case 11: free(a->rates); a->nrates = cli_parse_double_list(cmd, "--rates", optarg, 1e-6, 1e9, &a->rates); break;
    case 12: a->nreq = (size_t)cli_parse_long(cmd, "--requests", optarg, 1, 100000000); break;
    case 13: a->policies = optarg; break;
    case 14: a->tau = cli_parse_double(cmd, "--tau", optarg, 0.0, 2.0); break;
    case 15: free(a->taus); a->ntaus = cli_parse_double_list(cmd, "--taus", optarg, 0.0, 2.0, &a->taus); break;
    case 16: a->vanilla = 1; break;
    case 17:
      free(a->taus);
      a->ntaus = cli_parse_double_list(cmd, "--ablation", "0,0.05,0.1,0.2,0.5,1", 0.0, 2.0, &a->taus);
      a->vanilla = 1;
      break;
    case 18: a->decor = 1; break;
    case 19: a->decor_rows = 1; break;
    case 20: a->seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 21: a->json = 1; break;
    case 22: a->csv_path = optarg; break;
    case 23: a->plot_dir = optarg; break;
    case 'j':
    case 24: a->jobs = (size_t)cli_parse_long(cmd, "--jobs", optarg, 1, 64); break;
    case 25: a->ep_size = (uint32_t)cli_parse_long(cmd, "--ep-size", optarg, 1, 64); break;
    case 26: a->ep_tp = (uint32_t)cli_parse_long(cmd, "--tp", optarg, 1, 64); break;
    case 27:
      if (eldr_placement_kind_parse(optarg, &a->ep_kind))
        cli_usage_error(cmd, "--placement: unknown '%s' (linear|global|per-decoder)", optarg);
      a->ep_kind_set = 1;
      break;
    case 28:
      a->ep_redundant = (uint32_t)cli_parse_long(cmd, "--redundant-experts", optarg, 0, ELDR_MAX_EXPERTS);
      break;
    case 29: a->print_latency = 1; break;
    case 30: a->log_path = optarg; break;
    case 31: free(a->loads); a->nloads = cli_parse_double_list(cmd, "--loads", optarg, 1e-3, 10, &a->loads); break;
    case 32: parse_pd(cmd, optarg, a); break;
    case 33: a->known_fraction = cli_parse_double(cmd, "--known-fraction", optarg, 0, 1); break;
    case 34: a->predict_threshold = cli_parse_double(cmd, "--predict-threshold", optarg, 0, 1); break;
    case 35: a->register_s = cli_parse_double(cmd, "--register-ms", optarg, 0, 1e6) / 1e3; break;
    case 36: a->mooncake = a->serve_path = optarg; break;
    case 37: a->mc_requests = (size_t)cli_parse_long(cmd, "--mooncake-requests", optarg, 1, 100000000); break;
    case 38: a->mc_max_decode = (uint32_t)cli_parse_long(cmd, "--max-decode-tokens", optarg, 1, 1000000); break;
    case 'q': a->quiet = 1; break;
    case 'h': fputs(SIM_HELP, stdout); exit(0);
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s' (see --help)", argv[optind]);
  if (a->print_latency && !a->model) cli_usage_error(cmd, "--print-latency needs --model");
  if (!a->print_latency && !a->trace_path && !a->gen) cli_usage_error(cmd, "--trace or --generate is required (see --help)");
  if (a->trace_path && a->gen) cli_usage_error(cmd, "--trace and --generate are exclusive");
  if (a->mooncake && !a->gen)
    cli_usage_error(cmd, "--serve-mooncake needs --generate W (the blocks' experts come from the same "
                         "generator the artifact is fitted on, at request indices of their own)");
  if ((a->mc_requests || a->mc_max_decode) && !a->mooncake)
    cli_usage_error(cmd, "--mooncake-requests and --max-decode-tokens need --serve-mooncake");
  if (a->scaled_arrivals && !a->mooncake)
    cli_usage_error(cmd, "--arrivals scaled needs --serve-mooncake (a trace served in its own order)");
  if (a->serve_path && a->frac > 0) cli_usage_error(cmd, "--serve-trace and --fit-fraction are exclusive");
  if (a->trace_arrivals && a->nrates) cli_usage_error(cmd, "--arrivals trace and --rates are exclusive");
  if (a->nloads && (a->nrates || a->trace_arrivals))
    cli_usage_error(cmd, "--loads is exclusive with --rates and --arrivals trace");
  if (a->art_path && a->vanilla) cli_usage_error(cmd, "--vanilla fits in-process; it cannot be used with --artifact");
  if ((a->ep_kind_set || a->ep_tp || a->ep_redundant) && !a->ep_size)
    cli_usage_error(cmd, "--placement, --tp and --redundant-experts need --ep-size");
  /* outputs, before the minutes of work */
  const char *inputs[4] = {NULL, NULL, NULL, NULL};
  size_t ni = 0;
  const char *const given[3] = {a->trace_path, a->serve_path, a->art_path};
  for (int i = 0; i < 3; i++)
    if (given[i]) inputs[ni++] = given[i];
  if (a->csv_path) cli_check_output(cmd, "--csv", a->csv_path, inputs);
  if (a->plot_dir) cli_check_outdir(cmd, "--plot", a->plot_dir);
}

/* The trace to fit on (*t) and, with --serve-trace, the one to serve (*ts). */
static void load_workload(const char *cmd, const sim_args *a, eldr_trace **t_out, eldr_trace **ts_out,
                          eldr_block_table *bt) {
  eldr_diag d = {{0}};
  int rc;
  eldr_trace *t = NULL, *ts = NULL;
  char canon[128] = "";
  if (a->trace_path) {
    if (!a->quiet) fprintf(stderr, "sim: loading %s\n", a->trace_path);
    rc = eldr_trace_load(a->trace_path, &t, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  } else {
    const char *mname = a->model ? a->model : "qwen3-30b-a3b";
    eldr_shape s;
    rc = eldr_tracegen_model_shape(mname, &s, canon, sizeof canon, &d);
    if (rc) cli_usage_error(cmd, "--model: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen *g = NULL;
    rc = eldr_tracegen_new(&s, canon, a->gen, a->seed, &g, &d);
    if (rc) cli_usage_error(cmd, "--generate: %s", eldr_diag_msg(&d, rc));
    if (!a->quiet) fprintf(stderr, "sim: generating %zu %s requests for %s\n", a->gen_n, a->gen, canon);
    rc = eldr_tracegen_generate(g, a->gen_n, &t, &d);
    eldr_tracegen_free(g);
    if (rc) cli_fail(cmd, "--generate: %s", eldr_diag_msg(&d, rc));
  }
  if (a->mooncake) { /* the generator the fit trace came from, at indices of its own */
    eldr_tracegen *g = NULL;
    rc = eldr_tracegen_new(&t->shape, t->model, a->gen, a->seed, &g, &d);
    if (rc) cli_usage_error(cmd, "--generate: %s", eldr_diag_msg(&d, rc));
    ts = cli_mooncake_build(cmd, a->mooncake, g, a->mc_requests, a->mc_max_decode, a->quiet, bt);
    eldr_tracegen_free(g);
  } else if (a->serve_path) {
    rc = eldr_trace_load(a->serve_path, &ts, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    if (ts->shape.num_layers != t->shape.num_layers || ts->shape.num_experts != t->shape.num_experts ||
        ts->shape.top_k != t->shape.top_k)
      cli_fail(cmd, "--serve-trace: shape differs from --trace");
    char why[256];
    if (eldr_provenance_mismatch(t->model, t->generator, ts->model, ts->generator, why, sizeof why))
      fprintf(stderr, "eldr sim: warning: --serve-trace is not from --trace's source: %s\n", why);
  }
  /* the served requests are replayed token by token (the fit needs counts
   * only; a Mooncake pool keeps its decode rows beside its counts) */
  if (!a->mooncake)
    cli_trace_require_tokens(cmd, ts ? a->serve_path : a->trace_path, ts ? ts : t,
                           "sim replays per-token decode selections");
  *t_out = t;
  *ts_out = ts;
}

/* The latency model: --model (else the trace's) on --hardware, overrides from
 * --latency; checked against the served trace's shape when st is not NULL. */
static void latency_model(const char *cmd, const sim_args *a, const eldr_trace *t,
                          const eldr_trace *st, eldr_latency_model *out) {
  eldr_diag d = {{0}};
  int rc;
  const char *model = a->model, *hardware = a->hardware;
  if (!model && a->lat_path && (t ? !cli_latency_preset_for_model(t->model) : 1)) {
    /* a model outside the presets: a complete --latency file is the model
     * (as `eldr fit --latency` takes it) */
    eldr_diag ld = {{0}};
    if (hardware) cli_usage_error(cmd, "--hardware needs --model (a complete --latency is the whole model)");
    if (a->ep_size) cli_usage_error(cmd, "--ep-size needs --model (an EP preset)");
    rc = eldr_latency_load_full(a->lat_path, out, &ld);
    if (rc)
      cli_usage_error(cmd, "--latency: %s (without --model the file must be a complete model: "
                      "every field, as `eldr sim --print-latency` writes it)", eldr_diag_msg(&ld, rc));
    goto check;
  }
  if (!model) {
    model = t ? cli_latency_preset_for_model(t->model) : NULL;
    if (!model)
      cli_usage_error(cmd, "--model is required: no latency preset for the trace's model '%s' "
                      "(or give a complete model with --latency FILE)", t ? t->model : "?");
  }
  if (!hardware) hardware = cli_hardware_default(model);
  rc = a->ep_size ? eldr_latency_preset_ep(model, hardware, a->ep_tp ? a->ep_tp : a->ep_size,
                                           a->ep_size, out, &d)
                  : eldr_latency_preset(model, hardware, out, &d);
  if (rc) cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
  if (a->lat_path) {
    rc = eldr_latency_load_overrides(a->lat_path, out, &d);
    if (rc) cli_fail(cmd, "--latency: %s", eldr_diag_msg(&d, rc));
  }
check:
  if (st && (out->shape.num_layers != st->shape.num_layers || out->shape.num_experts != st->shape.num_experts ||
      out->shape.top_k != st->shape.top_k))
    cli_usage_error(cmd, "%s %s has %u layers x %u experts top-%u, the trace %u x %u top-%u",
                    model ? "--model" : "--latency", model ? model : out->model,
                    out->shape.num_layers, out->shape.num_experts, out->shape.top_k,
                    st->shape.num_layers, st->shape.num_experts, st->shape.top_k);
}

/* The split: fit on *fit_idx (n_fit rows of t), serve *serve_idx (rows of the served trace). */
static void split(const char *cmd, const sim_args *a, const eldr_trace *t, const eldr_trace *ts,
                  size_t **fit_out, size_t *n_fit_out, size_t **serve_out, size_t *n_serve_out) {
  size_t *fit_idx = NULL, n_fit = 0, *serve_idx = NULL, n_serve = 0;
  {
    size_t n = t->n;
    size_t *perm = malloc(n * sizeof *perm);
    if (!perm) cli_fail(cmd, "out of memory");
    eldr_fit_shuffle(perm, n, a->seed);
    if (ts) { /* fit on all of --trace, serve all of --serve-trace */
      fit_idx = perm;
      n_fit = n;
      serve_idx = malloc(ts->n * sizeof *serve_idx);
      if (!serve_idx) cli_fail(cmd, "out of memory");
      for (size_t i = 0; i < ts->n; i++) serve_idx[i] = i;
      n_serve = ts->n;
    } else if (a->art_path && a->frac < 0) { /* artifact fitted elsewhere: serve everything */
      serve_idx = perm;
      n_serve = n;
    } else {
      double f = a->frac > 0 ? a->frac : 0.5;
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

  *fit_out = fit_idx;
  *n_fit_out = n_fit;
  *serve_out = serve_idx;
  *n_serve_out = n_serve;
}

static void write_csv(const char *cmd, const char *csv_path, const sim_out *o) {
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
static void write_log(const char *cmd, const char *path, const sim_out *o, const eldr_trace *st,
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

static void write_json(const char *cmd, const sim_out *o) {
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
static void print_headlines(const sim_out *o, double rate) {
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

static void print_table(const sim_out *o) {
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
    print_headlines(o, o->a->rates[ri]);
  }
}

/* Was artifact a fitted on trace t (the file at path)? The same file
 * (its fit.trace, resolved), or the same generated requests (the same
 * generator string and model). */
static int fitted_on_this(const eldr_artifact *a, const char *path, const eldr_trace *t) {
  if (a->trace && path) {
    char *x = realpath(a->trace, NULL), *y = realpath(path, NULL);
    int same = x && y && !strcmp(x, y);
    free(x);
    free(y);
    if (same) return 1;
  }
  return a->trace_generator && t->generator && !strcmp(a->trace_generator, t->generator) &&
         a->model && t->model && !strcmp(a->model, t->model);
}

/* Replay dominates a run when a locality policy's batches mostly hold copies
 * of one recorded request: then its gain is largely the replay artifact.
 * Warn once, naming the worst row, the pool and what to do. */
#define REPLAY_WARN_DUP 0.5
static void warn_replay(const sim_out *o) {
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

/* The artifacts the ELDR variants need: --artifact, else fitted in-process on
 * the fit split (balanced, and with --vanilla unbalanced too). Returns 1 when
 * fitted (the reports are filled). */
static int get_artifacts(const char *cmd, const sim_args *a, const eldr_trace *t,
                         const eldr_trace *st, size_t *fit_idx, size_t n_fit,
                         const eldr_sweep_variant *vs, size_t nv, eldr_artifact **art,
                         eldr_artifact **art_v, eldr_fit_report *rep, eldr_fit_report *rep_v) {
  eldr_diag d = {{0}};
  int rc, need_art = 0;
  for (size_t i = 0; i < nv; i++)
    need_art |= vs[i].kind == ELDR_POLICY_ELDR || vs[i].kind == ELDR_POLICY_FOOTPRINT;
  need_art |= a->ep_kind != ELDR_PLACEMENT_LINEAR; /* fitted placements follow the clusters */
  if (a->art_path) {
    rc = eldr_artifact_load(a->art_path, art, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    if ((*art)->shape.num_layers != st->shape.num_layers ||
        (*art)->shape.num_experts != st->shape.num_experts || (*art)->shape.top_k != st->shape.top_k)
      cli_fail(cmd, "--artifact: model shape differs from the trace's");
    char why[256];
    if (eldr_provenance_mismatch((*art)->model, (*art)->trace_generator, st->model, st->generator,
                                 why, sizeof why))
      fprintf(stderr, "eldr sim: warning: the served trace is not from the artifact's source: %s\n",
              why);
    if (!a->serve_path && fitted_on_this(*art, a->trace_path, t)) {
      if (a->frac < 0)
        fprintf(stderr,
                "eldr sim: warning: --artifact was fitted on this trace (%s) and every request of "
                "it is served: the %zu fitted requests are evaluated on; give --fit-fraction F "
                "(and --seed) as the fit had, to serve only the held-out part\n",
                (*art)->trace ? (*art)->trace : a->trace_path, (*art)->fit_n);
      else if ((*art)->fit_n >= t->n)
        fprintf(stderr,
                "eldr sim: warning: --artifact was fitted on all %zu requests of this trace: the "
                "--fit-fraction %g held-out part was fitted on too; refit with `eldr fit "
                "--fit-fraction %g`\n", (*art)->fit_n, a->frac, a->frac);
    }
    if (a->frac > 0 && !a->serve_path && (*art)->fit_n < t->n && (*art)->fit_seed != a->seed)
      fprintf(stderr,
              "eldr sim: warning: --artifact was fitted with seed %llu, --seed is %llu: the "
              "--fit-fraction splits differ and some served requests were fitted on\n",
              (unsigned long long)(*art)->fit_seed, (unsigned long long)a->seed);
    return 0;
  }
  if (!need_art) return 0; /* no ELDR variant requested: no fit */
  for (int pass = 0; pass < 1 + a->vanilla; pass++) {
    eldr_fit_opts o;
    eldr_fit_opts_default(&o);
    o.k = a->D;
    o.tau = a->tau >= 0 ? a->tau : 0.1;
    o.seed = a->seed;
    o.balanced = pass == 0;
    o.subset = fit_idx;
    o.n_subset = n_fit;
    if (!a->quiet) {
      o.progress = fit_progress;
      o.progress_ctx = (void *)(pass ? "vanilla" : "balanced");
    }
    rc = eldr_fit(t, &o, pass ? art_v : art, pass ? rep_v : rep, &d);
    if (rc) cli_fail(cmd, "fit: %s", eldr_diag_msg(&d, rc));
  }
  return 1;
}

/* The served pool under an artifact (or none). */
static eldr_sim_pool make_pool(const eldr_sim_pool *base, const eldr_artifact *art,
                               const eldr_sweep_sigs *ps) {
  eldr_sim_pool p = *base;
  if (art) {
    p.sigs = ps->sigs;
    p.sig_ok = ps->ok;
    p.dim = art->dim;
    p.centroids = art->centroids;
    p.n_centroids = art->k;
  }
  return p;
}

int eldr_cmd_sim(int argc, char **argv) {
  const char *cmd = "sim";
  sim_args a;
  parse_args(cmd, argc, argv, &a);
  if (a.print_latency) { /* the model alone: no trace, no run */
    eldr_latency_model m;
    latency_model(cmd, &a, NULL, NULL, &m);
    char *js = eldr_latency_dump(&m);
    if (!js) cli_fail(cmd, "--print-latency: the latency model does not validate");
    printf("%s\n", js);
    free(js);
    free(a.rates);
    free(a.taus);
    free(a.loads);
    return 0;
  }
  eldr_diag d = {{0}};
  eldr_sweep_variant vs[ELDR_SWEEP_MAX_VARIANTS];
  size_t nv = 0;
  int rc = eldr_sweep_variants(a.policies, a.taus, a.ntaus, a.vanilla, a.decor, a.decor_rows, vs,
                               ELDR_SWEEP_MAX_VARIANTS, &nv, &d);
  if (rc == ELDR_ENOMEM) cli_fail(cmd, "out of memory");
  if (rc) cli_usage_error(cmd, "--policies: %s", eldr_diag_msg(&d, rc));
  if (a.npd > 1 && (rc = eldr_sweep_variants_pd(vs, &nv, ELDR_SWEEP_MAX_VARIANTS, a.pds, a.npd, &d)))
    cli_usage_error(cmd, "--pd: %s", eldr_diag_msg(&d, rc));

  eldr_trace *t = NULL, *ts = NULL;
  eldr_block_table bt = {0};
  load_workload(cmd, &a, &t, &ts, &bt);
  const eldr_trace *st = ts ? ts : t;
  eldr_latency_model lm;
  latency_model(cmd, &a, t, st, &lm);
  size_t *fit_idx = NULL, n_fit = 0, *serve_idx = NULL, n_serve = 0;
  split(cmd, &a, t, ts, &fit_idx, &n_fit, &serve_idx, &n_serve);

  eldr_artifact *art = NULL, *art_v = NULL;
  eldr_fit_report rep = {0}, rep_v = {0};
  int have_rep = get_artifacts(cmd, &a, t, st, fit_idx, n_fit, vs, nv, &art, &art_v, &rep, &rep_v);
  /* an in-process fit carries the coefficients of the model it is fitted
   * for, as `eldr fit --model --hardware --latency` does */
  for (int i = 0; have_rep && i < 2; i++) {
    eldr_artifact *x = i ? art_v : art;
    if (x && (rc = eldr_artifact_set_latency(x, &lm, &d)))
      cli_fail(cmd, "fit: latency model: %s", eldr_diag_msg(&d, rc));
  }
  int want_fp = 0;
  for (size_t i = 0; i < nv; i++) want_fp |= vs[i].kind == ELDR_POLICY_FOOTPRINT;
  if (want_fp && !(art && art->latency))
    fprintf(stderr, "eldr sim: footprint: the artifact carries no latency coefficients "
                    "(refit with `eldr fit --model M --hardware H`); footprint rows are JSQ\n");
  double tau_eff = a.tau >= 0 ? a.tau : art ? art->tau : 0.1;
  for (size_t i = 0; i < nv; i++)
    if (vs[i].tau < 0) vs[i].tau = tau_eff;

  eldr_sweep_sigs ps = {0}, ps_v = {0};
  if (art && eldr_sweep_sigs_compute(st, serve_idx, n_serve, art, &ps)) cli_fail(cmd, "out of memory");
  if (art_v && eldr_sweep_sigs_compute(st, serve_idx, n_serve, art_v, &ps_v))
    cli_fail(cmd, "out of memory");
  eldr_sim_pool base = {.trace = st, .idx = serve_idx, .n = n_serve,
                        .policy_model = art ? art->latency : NULL,
                        .policy_prior = art ? art->fp_prior : NULL,
                        .policy_n_priors = art ? art->fp_n_priors : 0,
                        .policy_prior_tokens = art ? art->fp_prior_tokens : 0};
  eldr_sigspec spec;
  if (art) eldr_artifact_sigspec(art, &spec);
  base.blocks = a.mooncake ? &bt : NULL;
  base.spec = art ? &spec : NULL;
  eldr_sim_pool pool = make_pool(&base, art, &ps);
  eldr_sim_tokens *tokens = NULL;
  rc = eldr_sim_tokens_build(&pool, ELDR_SIM_TOK_AUTO, &tokens, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  pool.tokens = tokens;
  eldr_sim_pool pool_v = art_v ? make_pool(&pool, art_v, &ps_v) : pool;

  cli_ep_set eps = {0};
  if (a.ep_size)
    cli_ep_sim_placements(cmd, a.ep_kind, t, fit_idx, n_fit, art, a.art_path, a.ep_size,
                          a.ep_redundant, a.D, &eps);
  eldr_sim_config cfg;
  eldr_sim_config_default(&cfg);
  cfg.placements = a.ep_size ? eps.dec : NULL;
  cfg.n_prefill = a.P;
  cfg.n_decode = a.D;
  cfg.max_batch = a.B;
  cfg.n_requests = a.nreq;
  cfg.seed = a.seed;
  cfg.pd = a.npd ? a.pds[0] : ELDR_SIM_PD_VLLM;
  cfg.known_fraction = a.known_fraction;
  cfg.predict_threshold = a.predict_threshold;
  cfg.register_s = a.register_s;
  cfg.scale_arrivals = a.scaled_arrivals;
  double capacity = eldr_sim_capacity(&pool, &lm, &cfg);
  if (a.trace_arrivals || !a.nrates) {
    static const double fr[] = {0.2, 0.4, 0.6, 0.8, 0.95};
    const double *loads = a.nloads ? a.loads : fr;
    free(a.rates);
    a.nrates = a.trace_arrivals ? 1 : a.nloads ? a.nloads : 5;
    a.rates = calloc(a.nrates, sizeof *a.rates);
    if (!a.rates) cli_fail(cmd, "out of memory");
    for (size_t i = 0; !a.trace_arrivals && i < a.nrates; i++)
      a.rates[i] = round(loads[i] * capacity * 10) / 10;
  }

  /* ---- runs ---- */
  size_t nrows = a.nrates * nv;
  eldr_sweep_row *rows = calloc(nrows, sizeof *rows);
  if (!rows) cli_fail(cmd, "out of memory");
  double t_run0 = eldr_clock_now();
  eldr_sweep sw = {.vs = vs, .nv = nv, .rates = a.rates, .nrates = a.nrates, .pool = &pool,
                   .pool_vanilla = &pool_v, .lm = &lm, .cfg = &cfg, .jobs = a.jobs,
                   .footprint_mask = art ? art->mask : NULL, .keep_logs = a.log_path != NULL,
                   .progress = a.quiet ? NULL : sweep_progress};
  rc = eldr_sweep_run(&sw, rows, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  uint64_t total_token_steps = 0, total_steps = 0;
  for (size_t i = 0; i < nrows; i++) {
    total_token_steps += rows[i].r.token_steps;
    total_steps += rows[i].r.steps;
  }
  double t_run = eldr_clock_now() - t_run0;
  if (!a.quiet)
    fprintf(stderr, "\nsim: %zu runs in %.1f s (%.2fM decode token-steps/s, %.2fM batch steps/s)\n",
            nrows, t_run, t_run > 0 ? (double)total_token_steps / t_run / 1e6 : 0,
            t_run > 0 ? (double)total_steps / t_run / 1e6 : 0);

  /* ---- output ---- */
  sim_out o = {.a = &a, .src_name = a.trace_path ? a.trace_path : a.gen, .lm = &lm, .rows = rows,
               .nrows = nrows, .nv = nv, .vs = vs, .n_fit = n_fit, .n_serve = n_serve,
               .n_sigs = ps.n_ok, .tau_eff = tau_eff, .capacity = capacity, .wall_s = t_run,
               .rep = have_rep ? &rep : NULL, .eps = a.ep_size ? &eps : NULL, .pd = cfg.pd,
               .blocks = &bt};
  warn_replay(&o);
  if (a.csv_path) write_csv(cmd, a.csv_path, &o);
  if (a.log_path) write_log(cmd, a.log_path, &o, st, serve_idx);
  if (a.json)
    write_json(cmd, &o);
  else
    print_table(&o);
  if (a.plot_dir) {
    char title[256];
    snprintf(title, sizeof title, "%s, %s on %s, %zuP%zuD", o.src_name, lm.model, lm.hardware, a.P, a.D);
    if (mkdir(a.plot_dir, 0777) && errno != EEXIST) cli_fail(cmd, "--plot: cannot create '%s'", a.plot_dir);
    rc = fig_sim(a.plot_dir, rows, nrows, vs, nv, a.rates, a.nrates, a.taus, a.ntaus, a.vanilla,
                 title, &d);
    if (rc) /* the table is out: a missing figure does not fail the run */
      fprintf(stderr, "eldr sim: --plot: %s; data and script are in %s\n", eldr_diag_msg(&d, rc),
              a.plot_dir);
    else if (!a.quiet)
      fprintf(stderr, "sim: figures written to %s\n", a.plot_dir);
  }

  cli_ep_set_free(&eps);
  eldr_sweep_rows_free(rows, nrows);
  free(rows);
  eldr_sim_tokens_free(tokens);
  eldr_sweep_sigs_free(&ps);
  eldr_sweep_sigs_free(&ps_v);
  if (have_rep) {
    eldr_fit_report_free(&rep);
    if (a.vanilla) eldr_fit_report_free(&rep_v);
  }
  eldr_artifact_free(art_v);
  eldr_artifact_free(art);
  free(serve_idx);
  free(fit_idx);
  eldr_trace_free(ts);
  eldr_trace_free(t);
  eldr_block_table_free(&bt);
  free(a.rates);
  free(a.taus);
  free(a.loads);
  return 0;
}
