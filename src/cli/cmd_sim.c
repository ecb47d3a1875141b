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
    "      --fp-own-weight W   footprint's weight of the request's own time in its\n"
    "                          cost, every footprint row (docs/footprint.md)     [1]\n"
    "      --fp-home-weight H  footprint's home term: H x its step time x how much\n"
    "                          closer the best decoder's centroid is, every footprint\n"
    "                          row (docs/footprint.md)                  [0: off]\n"
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

#include "sim_report.h"

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
      {"max-decode-tokens", required_argument, 0, 38}, {"fp-own-weight", required_argument, 0, 39},
      {"fp-home-weight", required_argument, 0, 40},
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
    case 39: a->fp_own_weight = cli_parse_double(cmd, "--fp-own-weight", optarg, 0, 100); break;
    case 40: a->fp_home_weight = cli_parse_double(cmd, "--fp-home-weight", optarg, 0, 100); break;
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
  cfg.footprint_own_weight = a.fp_own_weight;
  cfg.footprint_home_weight = a.fp_home_weight;
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
  sim_warn_replay(&o);
  if (a.csv_path) sim_write_csv(cmd, a.csv_path, &o);
  if (a.log_path) sim_write_log(cmd, a.log_path, &o, st, serve_idx);
  if (a.json)
    sim_write_json(cmd, &o);
  else
    sim_print_table(&o);
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
