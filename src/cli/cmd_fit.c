/* cmd_fit.c — `eldr fit` and `eldr rho`. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_ep.h"
#include "eldr/artifact.h"
#include "eldr/fit.h"
#include "eldr/latency.h"
#include "eldr/preset_files.h"
#include "eldr/quality.h"
#include "eldr/signature.h"
#include "eldr/trace.h"
#include "fit_source.h"

static const char FIT_HELP[] =
    "usage: eldr fit --trace T --decoders K -o ARTIFACT [options]\n"
    "\n"
    "Choose the signature representation, IDF and layer mask by rho, fit balanced\n"
    "K-means with one centroid per decoder, and write the routing artifact.\n"
    "\n"
    "  -t, --trace T           calibration trace: a JSONL file (per-token or counts\n"
    "                          form), a directory of *.jsonl or a glob; repeat for\n"
    "                          more (read as one trace)                  (required)\n"
    "  -k, --decoders K        decode workers = centroids                (required)\n"
    "  -o, --output FILE       artifact to write                         (required)\n"
    "      --tau X             locality band stored in the artifact       [0.1]\n"
    "      --representation R  auto|count|binary|gate|logit               [auto]\n"
    "      --idf M             auto|on|off                                [auto]\n"
    "      --layers L          auto (greedy mask) | all | comma list of MoE layer ids\n"
    "                          (as in the trace's 'layers')               [auto]\n"
    "      --seed N            split, K-means and pair-sampling seed      [" ELDR_SEED_DEFAULT_STR "]\n"
    "      --restarts N        K-means restarts                           [8]\n"
    "      --max-pairs N       request pairs for rho (0 = all)            [200000]\n"
    "      --vanilla           unbalanced K-means (ablation only)\n"
    "      --previous FILE     the artifact being replaced: order the new centroids so\n"
    "                          that each decoder keeps as much of its calibration\n"
    "                          traffic as possible, and report the share that moves\n"
    "                                                                     [none]\n"
    "      --rho-sample N      requests sampled for rho and the layer mask  [4000]\n"
    "      --exact-limit N     above N requests: mini-batch K-means closed by exact\n"
    "                          balanced assignments of every request      [5000]\n"
    "      --batch N           mini-batch rows                            [4096]\n"
    "      --epochs N          mini-batch passes                          [2]\n"
    "      --memory-mb M       signature matrix + counts cache budget; beyond it\n"
    "                          the K-means re-reads the trace (streamed)  [3072]\n"
    "      --prefill-only      accept a trace without decode selections (e.g. recorded\n"
    "                          streams): rho cannot choose, so count, every layer (IDF\n"
    "                          as --idf); without it such a fit fails unless it\n"
    "                          names both --representation and --layers  [off]\n"
    "      --created T         fit.created in the artifact (UTC, YYYY-MM-DDTHH:MM:SSZ)\n"
    "                          instead of now: the same seed and T give the same bytes\n"
    "                                                                     [now]\n"
    "      --fit-fraction F    fit on a random F of the requests (seeded by --seed,\n"
    "                          the split eldr sim uses)                   [1]\n"
    "      --ep-size R         also write expert-parallel placements for R EP ranks:\n"
    "                          one per decoder (its cluster's decode traffic) and\n"
    "                          a global one, as SGLang --init-expert-location files\n"
    "                          next to the artifact, which names them    [off]\n"
    "      --redundant-experts N  replicas of hot experts per layer (E + N must\n"
    "                          split over R ranks; SGLang --ep-num-redundant-experts) [0]\n"
    "      --model M           store this latency preset's coefficients in the artifact\n"
    "                          (the footprint policy needs them): qwen3-30b-a3b\n"
    "                          gpt-oss-120b qwen3-235b-a22b llama4-maverick olmoe-1b-7b\n"
    "                                                                     [none]\n"
    "      --hardware H        mi300x | h200 | h100 (with --model)\n"
    "                                           [mi300x; h200 for llama4-maverick]\n"
    "      --latency FILE      calibration JSON: overrides on --model's preset, or a\n"
    "                          complete model (every field) without --model  [none]\n"
    "      --json              print the report as JSON\n"
    "  -q, --quiet             no progress on stderr\n"
    "  -h, --help              this help\n";

/* JSON number, or null for NaN (an undefined rho). */
static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static void fit_progress(void *ctx, const char *stage, size_t done, size_t total) {
  (void)ctx;
  char label[64];
  snprintf(label, sizeof label, "fit: %s", stage);
  cli_progress(label, done, total, done == total);
}

/* Parse a comma list of MoE layer ids (as in trace.layers) into a mask. */
static void parse_layer_list(const char *cmd, const char *val, const eldr_trace *t, uint8_t *mask) {
  long *ids = NULL;
  size_t n = cli_parse_long_list(cmd, "--layers", val, 0, 1L << 30, &ids);
  memset(mask, 0, t->shape.num_layers);
  for (size_t i = 0; i < n; i++) {
    size_t l = 0;
    while (l < t->shape.num_layers && t->layer_ids[l] != (uint32_t)ids[i]) l++;
    if (l == t->shape.num_layers)
      cli_usage_error(cmd, "--layers: layer %ld is not a MoE layer of the trace", ids[i]);
    mask[l] = 1;
  }
  free(ids);
}

static void print_steps(const eldr_trace *t, const eldr_fit_candidate *c) {
  printf("greedy layer order (%s%s):", eldr_repr_name(c->repr), c->idf ? "-idf" : "");
  for (size_t i = 0; i < t->shape.num_layers; i++)
    printf(" %u:%.3f", t->layer_ids[c->steps[i].layer], c->steps[i].rho);
  printf("\n");
}

/* One `eldr fit` run: the flags as read, then what each phase makes. The
 * phases run in order and exit through cli_fail / cli_usage_error on an
 * error (the process ends: nothing to unwind). */
typedef struct fit_run {
  /* the flags */
  const char *out_path, *layers;
  cli_trace_inputs tin;
  const char *lat_model, *lat_hw, *lat_path;
  eldr_fit_opts o;
  int json, quiet;
  double frac;
  uint32_t ep_size, redundant;
  const char *created_arg, *prev_path;
  size_t mem_mb;
  /* the latency model for the artifact (fit_latency) */
  eldr_latency_model lm;
  int have_lm;
  /* the trace, loaded or streamed (fit_read) */
  const char *trace_path;
  int stream;
  eldr_trace *t, hdr;
  cli_fit_file ff;
  eldr_fit_source fsrc;
  eldr_artifact *prev;
  /* the fit's inputs (fit_choices) and results (fit_write) */
  uint8_t *list_mask;
  size_t *subset;
  eldr_artifact *a;
  eldr_fit_report rep;
  cli_ep_set eps;
  double t0, t_load, total;
} fit_run;

static const char *const cmd = "fit";

/* The flags into f; 1 when --help was printed. */
static int fit_args(fit_run *f, int argc, char **argv) {
  f->layers = "auto";
  eldr_fit_opts_default(&f->o);
  f->frac = 1.0;
  f->mem_mb = 3072;
  static const struct option lo[] = {
      {"trace", required_argument, 0, 't'},   {"decoders", required_argument, 0, 'k'},
      {"output", required_argument, 0, 'o'},  {"tau", required_argument, 0, 1},
      {"representation", required_argument, 0, 2}, {"idf", required_argument, 0, 3},
      {"layers", required_argument, 0, 4},    {"seed", required_argument, 0, 5},
      {"restarts", required_argument, 0, 6},  {"max-pairs", required_argument, 0, 7},
      {"vanilla", no_argument, 0, 8},         {"json", no_argument, 0, 9},
      {"fit-fraction", required_argument, 0, 10}, {"quiet", no_argument, 0, 'q'},
      {"ep-size", required_argument, 0, 11},  {"redundant-experts", required_argument, 0, 12},
      {"model", required_argument, 0, 13},    {"hardware", required_argument, 0, 14},
      {"latency", required_argument, 0, 15},
      {"created", required_argument, 0, 16},
      {"previous", required_argument, 0, 17}, {"rho-sample", required_argument, 0, 18},
      {"exact-limit", required_argument, 0, 19}, {"batch", required_argument, 0, 20},
      {"epochs", required_argument, 0, 21},   {"memory-mb", required_argument, 0, 22},
      {"prefill-only", no_argument, 0, 23},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":t:k:o:qh", lo, NULL)) != -1) {
    switch (c) {
    case 't': cli_trace_add(cmd, &f->tin, optarg); break;
    case 'k': f->o.k = (size_t)cli_parse_long(cmd, "--decoders", optarg, 1, 4096); break;
    case 'o': f->out_path = optarg; break;
    case 1: f->o.tau = cli_parse_double(cmd, "--tau", optarg, 0.0, 2.0); break;
    case 2:
      if (!strcmp(optarg, "auto")) f->o.repr = -1;
      else {
        eldr_repr r;
        if (eldr_repr_parse(optarg, &r))
          cli_usage_error(cmd, "--representation: unknown '%s' (auto|count|binary|gate|logit)", optarg);
        f->o.repr = (int)r;
      }
      break;
    case 3:
      if (!strcmp(optarg, "auto")) f->o.idf = ELDR_FIT_AUTO;
      else if (!strcmp(optarg, "on")) f->o.idf = ELDR_FIT_ON;
      else if (!strcmp(optarg, "off")) f->o.idf = ELDR_FIT_OFF;
      else cli_usage_error(cmd, "--idf: unknown '%s' (auto|on|off)", optarg);
      break;
    case 4: f->layers = optarg; break;
    case 5: f->o.seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 6: f->o.restarts = (int)cli_parse_long(cmd, "--restarts", optarg, 1, 1000); break;
    case 7: f->o.max_pairs = (size_t)cli_parse_long(cmd, "--max-pairs", optarg, 0, 1L << 40); break;
    case 8: f->o.balanced = 0; break;
    case 9: f->json = 1; break;
    case 10: f->frac = cli_parse_double(cmd, "--fit-fraction", optarg, 1e-9, 1.0); break;
    case 11: f->ep_size = (uint32_t)cli_parse_long(cmd, "--ep-size", optarg, 1, ELDR_PLACEMENT_MAX_RANKS); break;
    case 12: f->redundant = (uint32_t)cli_parse_long(cmd, "--redundant-experts", optarg, 0, ELDR_MAX_EXPERTS); break;
    case 13: f->lat_model = optarg; break;
    case 14: f->lat_hw = optarg; break;
    case 15: f->lat_path = optarg; break;
    case 16: {
      int y, mo, dd, hh, mi, ss, n = 0;
      if (strlen(optarg) != 20 ||
          sscanf(optarg, "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &y, &mo, &dd, &hh, &mi, &ss, &n) != 6 ||
          n != 20 || mo < 1 || mo > 12 || dd < 1 || dd > 31 || hh > 23 || mi > 59 || ss > 60)
        cli_usage_error(cmd, "--created: '%s' is not a UTC time YYYY-MM-DDTHH:MM:SSZ", optarg);
      f->created_arg = optarg;
      break;
    }
    case 17: f->prev_path = optarg; break;
    case 18: f->o.rho_sample = (size_t)cli_parse_long(cmd, "--rho-sample", optarg, 2, 1L << 24); break;
    case 19: f->o.exact_limit = (size_t)cli_parse_long(cmd, "--exact-limit", optarg, 0, 1L << 40); break;
    case 20: f->o.batch = (size_t)cli_parse_long(cmd, "--batch", optarg, 1, 1L << 24); break;
    case 21: f->o.epochs = (int)cli_parse_long(cmd, "--epochs", optarg, 0, 1000); break;
    case 22: f->mem_mb = (size_t)cli_parse_long(cmd, "--memory-mb", optarg, 1, 1L << 30); break;
    case 23: f->o.prefill_only = 1; break;
    case 'q': f->quiet = 1; break;
    case 'h': fputs(FIT_HELP, stdout); return 1;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s' (see --help)", argv[optind]);
  if (!f->tin.n) cli_usage_error(cmd, "--trace is required (see --help)");
  if (!f->o.k) cli_usage_error(cmd, "--decoders is required (see --help)");
  if (!f->out_path) cli_usage_error(cmd, "-o/--output is required (see --help)");
  if (f->redundant && !f->ep_size) cli_usage_error(cmd, "--redundant-experts needs --ep-size");
  if (f->lat_hw && !f->lat_model) cli_usage_error(cmd, "--hardware needs --model");
  return 0;
}

/* --model / --hardware / --latency: the latency model stored in the artifact. */
static void fit_latency(fit_run *f) {
  eldr_diag ld = {{0}};
  int lrc = 0;
  if (f->lat_model) {
    lrc = eldr_latency_preset(f->lat_model, f->lat_hw ? f->lat_hw : cli_hardware_default(f->lat_model), &f->lm, &ld);
    if (lrc) cli_usage_error(cmd, "--model/--hardware: %s", eldr_diag_msg(&ld, lrc));
    if (f->lat_path && (lrc = eldr_latency_load_overrides(f->lat_path, &f->lm, &ld)))
      cli_fail(cmd, "--latency: %s", eldr_diag_msg(&ld, lrc));
    f->have_lm = 1;
  } else if (f->lat_path) {
    if ((lrc = eldr_latency_load_full(f->lat_path, &f->lm, &ld)))
      cli_fail(cmd, "--latency: %s", eldr_diag_msg(&ld, lrc));
    f->have_lm = 1;
  }
}

/* The trace: loaded whole (placements need the token rows, and
 * --fit-fraction the split eldr sim fits on), else streamed (memory per
 * request, not per token); the --previous artifact; the latency model's
 * shape checked against the trace's. */
static void fit_read(fit_run *f) {
  cli_trace_expand(cmd, &f->tin);
  f->trace_path = f->tin.label;
  const char **inputs = cli_trace_paths_z(&f->tin);
  if (!inputs) cli_fail(cmd, "out of memory");
  cli_check_output(cmd, "-o", f->out_path, inputs);
  free(inputs);
  f->t0 = eldr_clock_now();
  eldr_diag d = {{0}};
  eldr_fit_opts *o = &f->o;
  int rc;
  f->stream = !f->ep_size && f->frac >= 1.0;
  if (!f->stream) {
    eldr_trace *t = f->t = cli_trace_load(cmd, &f->tin);
    if (o->repr == ELDR_REPR_GATE || o->repr == ELDR_REPR_LOGIT)
      for (size_t i = 0; i < t->n; i++)
        if (eldr_request_is_counts(&t->req[i]))
          cli_fail(cmd, "--representation %s needs per-token prefill_gates; %s: request '%s' is in "
                   "the counts form", eldr_repr_name((eldr_repr)o->repr), f->trace_path, t->req[i].id);
  } else {
    cli_fit_file *ff = &f->ff;
    rc = cli_fit_file_open(f->tin.paths, f->tin.n_paths, f->mem_mb << 19, ff, &f->fsrc, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    if (o->repr == ELDR_REPR_GATE || o->repr == ELDR_REPR_LOGIT) ff->need_gates = eldr_repr_name((eldr_repr)o->repr);
    ff->label = f->trace_path;
    f->hdr.model = ff->model; /* the header: model, shape, layer ids (borrowed) */
    f->hdr.generator = ff->generator;
    f->hdr.shape = ff->shape;
    f->hdr.layer_ids = ff->layer_ids;
    f->t = &f->hdr;
    o->sig_budget = f->mem_mb << 19;
  }
  f->t_load = eldr_clock_now() - f->t0;
  if (f->prev_path) {
    rc = eldr_artifact_load(f->prev_path, &f->prev, &d);
    if (rc) cli_fail(cmd, "--previous: %s", eldr_diag_msg(&d, rc));
    o->previous = f->prev;
  }
  const eldr_latency_model *lm = &f->lm;
  const eldr_trace *t = f->t;
  if (f->have_lm && (lm->shape.num_layers != t->shape.num_layers ||
                     lm->shape.num_experts != t->shape.num_experts || lm->shape.top_k != t->shape.top_k))
    cli_usage_error(cmd, "--model/--latency: the latency model '%s' has %u layers x %u experts top-%u, "
                    "the trace %u x %u top-%u", lm->model, lm->shape.num_layers, lm->shape.num_experts,
                    lm->shape.top_k, t->shape.num_layers, t->shape.num_experts, t->shape.top_k);
}

/* --layers and --fit-fraction into the fit's options; progress unless -q. */
static void fit_choices(fit_run *f) {
  eldr_fit_opts *o = &f->o;
  const eldr_trace *t = f->t;
  if (!strcmp(f->layers, "auto")) o->layers = ELDR_FIT_LAYERS_AUTO;
  else if (!strcmp(f->layers, "all")) o->layers = ELDR_FIT_LAYERS_ALL;
  else {
    f->list_mask = calloc(t->shape.num_layers, 1);
    if (!f->list_mask) cli_fail(cmd, "out of memory");
    parse_layer_list(cmd, f->layers, t, f->list_mask);
    o->layers = ELDR_FIT_LAYERS_LIST;
    o->layer_list_mask = f->list_mask;
  }
  if (f->frac < 1.0) {
    size_t m = (size_t)floor(f->frac * (double)t->n);
    if (m < 1) m = 1;
    f->subset = malloc(t->n * sizeof *f->subset);
    if (!f->subset) cli_fail(cmd, "out of memory");
    eldr_fit_shuffle(f->subset, t->n, o->seed); /* seeded random split: files are often sorted */
    o->subset = f->subset;
    o->n_subset = m;
  }
  if (!f->quiet) o->progress = fit_progress;
}

/* The fit, the artifact's trace and creation time, the placements
 * (--ep-size), the latency model; the artifact written. */
static void fit_write(fit_run *f) {
  eldr_diag d = {{0}};
  const eldr_fit_opts *o = &f->o;
  const eldr_trace *t = f->t;
  int rc = f->stream ? eldr_fit_stream(&f->fsrc, o, &f->a, &f->rep, &d) : eldr_fit(t, o, &f->a, &f->rep, &d);
  if (rc == ELDR_EUNSUPPORTED && f->ff.need_gates) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  if (rc) cli_fail_at(cmd, f->trace_path, eldr_diag_msg(&d, rc));
  if (f->stream && f->ff.info.torn)
    fprintf(stderr, "eldr fit: note: %s%s\n", f->ff.info.note,
            f->ff.info.torn > 1 ? " (and more files with a torn last line)" : "");
  eldr_artifact *a = f->a;
  free(a->trace);
  a->trace = strdup(f->trace_path);
  char created[32];
  if (f->created_arg) {
    snprintf(created, sizeof created, "%s", f->created_arg);
  } else {
    time_t now = time(NULL);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
  }
  free(a->created);
  a->created = strdup(created);
  if (f->ep_size) { /* placements from the fitted requests (the split's fit part) */
    size_t *all = NULL, nidx = o->subset ? o->n_subset : t->n;
    if (!o->subset) {
      all = malloc((t->n ? t->n : 1) * sizeof *all);
      if (!all) cli_fail(cmd, "out of memory");
      for (size_t i = 0; i < t->n; i++) all[i] = i;
    }
    cli_ep_fit_write(cmd, t, o->subset ? o->subset : all, nidx, a, f->out_path, f->ep_size, f->redundant, &f->eps);
    free(all);
  }
  if (f->have_lm && (rc = eldr_artifact_set_latency(a, &f->lm, &d)))
    cli_fail(cmd, "latency model for the artifact: %s", eldr_diag_msg(&d, rc));
  rc = eldr_artifact_save(f->out_path, a, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  f->total = eldr_clock_now() - f->t0;
}

/* The report as JSON (--json). */
static void fit_print_json(const fit_run *f) {
  const eldr_fit_report *r = &f->rep;
  const eldr_artifact *a = f->a;
  const eldr_trace *t = f->t;
  json_t *root = json_object();
  json_object_set_new(root, "trace", json_string(f->trace_path));
  json_object_set_new(root, "artifact", json_string(f->out_path));
  json_object_set_new(root, "requests", json_integer((json_int_t)r->n));
  json_object_set_new(root, "skipped_empty", json_integer((json_int_t)r->skipped_empty));
  json_object_set_new(root, "decoders", json_integer((json_int_t)a->k));
  json_t *cands = json_array();
  for (size_t i = 0; i < r->n_cand; i++) {
    const eldr_fit_candidate *cd = &r->cand[i];
    json_t *cj = json_object();
    json_object_set_new(cj, "representation", json_string(eldr_repr_name(cd->repr)));
    json_object_set_new(cj, "idf", json_boolean(cd->idf));
    json_object_set_new(cj, "rho_all_layers", jreal(cd->rho_all));
    json_object_set_new(cj, "rho_mask", jreal(cd->rho_mask));
    json_object_set_new(cj, "mask_size", json_integer((json_int_t)cd->mask_size));
    json_t *steps = json_array();
    for (size_t l = 0; l < t->shape.num_layers; l++) {
      json_t *sj = json_object();
      json_object_set_new(sj, "layer", json_integer(t->layer_ids[cd->steps[l].layer]));
      json_object_set_new(sj, "rho", jreal(cd->steps[l].rho));
      json_array_append_new(steps, sj);
    }
    json_object_set_new(cj, "greedy", steps);
    json_array_append_new(cands, cj);
  }
  json_object_set_new(root, "candidates", cands);
  json_object_set_new(root, "chosen", json_integer((json_int_t)r->chosen));
  json_object_set_new(root, "rho", jreal(a->fit_rho));
  json_object_set_new(root, "chosen_by", json_string(eldr_fit_evidence_name(a->fit_chosen_by)));
  json_object_set_new(root, "decode_requests", json_integer((json_int_t)r->with_decode));
  json_t *mask = json_array();
  for (size_t l = 0; l < t->shape.num_layers; l++)
    if (a->mask[l]) json_array_append_new(mask, json_integer(t->layer_ids[l]));
  json_object_set_new(root, "layer_mask", mask);
  json_t *sz = json_array();
  for (size_t i = 0; i < a->k; i++) json_array_append_new(sz, json_integer((json_int_t)a->cluster_sizes[i]));
  json_object_set_new(root, "cluster_sizes", sz);
  json_object_set_new(root, "capacity", json_integer((json_int_t)r->capacity));
  json_object_set_new(root, "balanced", json_boolean(f->o.balanced));
  json_object_set_new(root, "kmeans_objective", json_real(r->kmeans_objective));
  if (f->ep_size) {
    json_t *pj = json_object();
    json_object_set_new(pj, "ep_size", json_integer(f->ep_size));
    json_object_set_new(pj, "redundant_experts", json_integer(f->redundant));
    json_object_set_new(pj, "busiest_rank_share_linear", jreal(f->eps.share[0]));
    json_object_set_new(pj, "busiest_rank_share_global", jreal(f->eps.share[1]));
    json_object_set_new(pj, "busiest_rank_share_per_decoder", jreal(f->eps.share[2]));
    json_object_set_new(pj, "global", json_string(a->placement->global));
    json_t *names = json_array();
    for (size_t i = 0; i < a->k; i++) json_array_append_new(names, json_string(a->placement->decoders[i]));
    json_object_set_new(pj, "decoders", names);
    json_object_set_new(root, "placement", pj);
  }
  json_t *ci = json_object();
  json_object_set_new(ci, "rho", jreal(r->rho_ci.rho));
  json_object_set_new(ci, "se", jreal(r->rho_ci.se));
  json_object_set_new(ci, "lo", jreal(r->rho_ci.lo));
  json_object_set_new(ci, "hi", jreal(r->rho_ci.hi));
  json_object_set_new(ci, "pairs", json_integer((json_int_t)r->rho_ci.pairs));
  json_object_set_new(ci, "sample", json_integer((json_int_t)r->sample));
  json_object_set_new(ci, "method", json_string("delete-a-group jackknife over requests, 20 groups, rho -/+ 1.96 se"));
  json_object_set_new(root, "rho_interval", ci);
  json_object_set_new(root, "kmeans_mode", json_string(r->mode));
  json_object_set_new(root, "passes", json_integer(r->passes));
  if (r->have_previous) {
    json_t *pj = json_object();
    json_object_set_new(pj, "artifact", json_string(f->prev_path));
    json_object_set_new(pj, "moved", jreal(r->moved));
    json_object_set_new(pj, "moved_unaligned", jreal(r->moved_unaligned));
    json_t *perm = json_array();
    for (size_t i = 0; i < a->k; i++) json_array_append_new(perm, json_integer(r->perm[i]));
    json_object_set_new(pj, "order", perm);
    json_object_set_new(root, "previous", pj);
  }
  json_object_set_new(root, "seconds", json_real(f->total));
  char *s = json_dumps(root, JSON_INDENT(2));
  puts(s);
  free(s);
  json_decref(root);
}

/* The report as text. */
static void fit_print_text(const fit_run *f) {
  const eldr_fit_report *r = &f->rep;
  const eldr_artifact *a = f->a;
  const eldr_trace *t = f->t;
  const eldr_fit_candidate *ch = &r->cand[r->chosen];
  size_t maxsz = 0;
  for (size_t i = 0; i < a->k; i++)
    if (a->cluster_sizes[i] > maxsz) maxsz = a->cluster_sizes[i];
  printf("trace      %s: %zu requests (%zu without prefill skipped), model %s, %u layers x %u experts, top-%u\n",
         f->trace_path, r->n, r->skipped_empty, t->model, t->shape.num_layers, t->shape.num_experts,
         t->shape.top_k);
  printf("\n%-16s %10s %12s %10s\n", "representation", "rho(all)", "rho(greedy)", "|mask|");
  for (size_t i = 0; i < r->n_cand; i++) {
    const eldr_fit_candidate *cd = &r->cand[i];
    char name[32];
    snprintf(name, sizeof name, "%s%s", eldr_repr_name(cd->repr), cd->idf ? "-idf" : "");
    printf("%-16s %10.4f %12.4f %10zu%s\n", name, cd->rho_all, cd->rho_mask, cd->mask_size,
           i == r->chosen ? "   <- chosen" : "");
  }
  printf("\n");
  print_steps(t, ch);
  printf("layer mask (%zu of %u):", ch->mask_size, t->shape.num_layers);
  for (size_t l = 0; l < t->shape.num_layers; l++)
    if (a->mask[l]) printf(" %u", t->layer_ids[l]);
  printf("\nrho        %.4f\n", a->fit_rho);
  printf("chosen by  %s (%zu of %zu requests carry decode selections)\n",
         a->fit_chosen_by == ELDR_FIT_BY_RHO         ? "rho"
         : a->fit_chosen_by == ELDR_FIT_BY_NAMED     ? "the representation and layers named"
                                                     : "nothing: a prefill-only fit (--prefill-only), the defaults",
         r->with_decode, r->n);
  if (r->rho_undefined)
    printf("note       rho is undefined for %zu of %zu candidates (constant distances: do the\n"
           "           requests carry decode selections?)\n", r->rho_undefined, r->n_cand);
  printf("k-means    %s, k=%zu, capacity ceil(N/K)=%zu, objective %.4f\n",
         f->o.balanced ? "balanced" : "vanilla", a->k, r->capacity, r->kmeans_objective);
  printf("clusters  ");
  for (size_t i = 0; i < a->k; i++) printf(" %zu", a->cluster_sizes[i]);
  printf("   (max %zu)\n", maxsz);
  if (isfinite(r->rho_ci.se))
    printf("rho 95%%    [%.4f, %.4f] on %zu sampled requests, %zu pairs (jackknife over 20\n"
           "           request groups, rho -/+ 1.96 se; se %.4f)\n", r->rho_ci.lo, r->rho_ci.hi,
           r->sample, r->rho_ci.pairs, r->rho_ci.se);
  if (r->fp_prior.n) {
    const eldr_fp_prior_report *fp = &r->fp_prior;
    char beta[32];
    if (isinf(fp->beta)) snprintf(beta, sizeof beta, "none (global prior)");
    else snprintf(beta, sizeof beta, "%.3g", fp->beta);
    printf("footprint  profile priors on %zu requests: weight %.3g prompt tokens (likelihood's %.3g),\n"
           "           cluster priors' %s; batch union miss (rms) %.1f%% (raw prefill %.1f%%);\n"
           "           held-out decode log-likelihood per selection %.4f (prefill alone %.4f,\n"
           "           prior alone %.4f)\n", fp->n, fp->alpha, fp->alpha_ll, beta, 100 * fp->union_err,
           100 * fp->union_err_raw, fp->ll_union_alpha, fp->ll_prefill, fp->ll_prior);
  }
  if (r->n > r->sample)
    printf("scale      %s K-means, %d passes over the input\n", r->mode, r->passes);
  if (r->have_previous)
    printf("previous   %s: %.2f%% of the calibration requests change decoder (%.2f%% without\n"
           "           reordering the centroids)\n", f->prev_path, 100.0 * r->moved,
           100.0 * r->moved_unaligned);
  printf("time       %.2fs (read %.2fs, rho %.2fs, k-means %.2fs)\n", f->total, f->t_load + r->seconds_read,
         r->seconds_rho, r->seconds_kmeans);
  printf("artifact   %s\n", f->out_path);
  if (f->ep_size)
    printf("placement  EP %u, %u redundant: %s + %zu per-decoder files; busiest rank's share of\n"
           "           each decoder's own calibration decode traffic (mean over decoders): linear "
           "%.3f,\n           global %.3f, per-decoder %.3f (even: %.3f; in-sample)\n",
           f->ep_size, f->redundant, a->placement->global, a->k, f->eps.share[0], f->eps.share[1], f->eps.share[2],
           1.0 / f->ep_size);
}

static void fit_free(fit_run *f) {
  cli_ep_set_free(&f->eps);
  eldr_fit_report_free(&f->rep);
  eldr_artifact_free(f->a);
  if (f->stream) cli_fit_file_close(&f->ff);
  else eldr_trace_free(f->t);
  eldr_artifact_free(f->prev);
  free(f->subset);
  free(f->list_mask);
  cli_trace_inputs_free(&f->tin);
}

int eldr_cmd_fit(int argc, char **argv) {
  fit_run f = {0};
  if (fit_args(&f, argc, argv)) return 0;
  fit_latency(&f);
  fit_read(&f);
  fit_choices(&f);
  fit_write(&f);
  if (f.json) fit_print_json(&f);
  else fit_print_text(&f);
  fit_free(&f);
  return 0;
}
