/* demo_args.c — `eldr demo`'s flags: its help, and each value checked
 * before the work directory or any process exists (exit 2 naming the flag,
 * exit 1 for an unreadable input, as every command). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "demo.h"
#include "eldr/cluster.h"
#include "eldr/fit.h"
#include "eldr/latency.h"
#include "eldr/plot.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"

static const char *CMD = "demo";

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr demo [options]\n\n"
          "A whole PD-disaggregated cluster on this machine: P prefill and D decode `eldr worker`\n"
          "processes (emulated vLLM engines timed by the latency model) behind an `eldr serve`\n"
          "router, on loopback. It generates a trace, fits an artifact on one split, drives the\n"
          "other split at a Poisson rate through the router under each policy in turn (workers\n"
          "and router restarted for each), and prints TPOT p50/p99 and TTFT p50 per policy and\n"
          "ELDR's change against the best load balancer, next to `eldr sim` on the same\n"
          "configuration. Emulated time runs --time-scale times slower than the modelled GPU so\n"
          "that a small machine keeps up; the table reports model time (wall time / scale).\n\n"
          "workload\n"
          "  -m, --model M           model preset                [qwen3-30b-a3b; with --trace:\n"
          "                                                       the preset of its shape]\n"
          "      --hardware H        mi300x | h200 | h100   [mi300x; h200 for llama4-maverick]\n"
          "  -w, --workload W        generated: realistic (calibrated to real traces) | task |\n"
          "                          language (paper-shaped presets)           [realistic]\n"
          "  -t, --trace T           use this JSONL trace instead of generating one  [none]\n"
          "      --fit-requests N    generated requests to fit on              [400]\n"
          "      --eval-requests N   generated requests to replay              [200]\n"
          "      --fit-fraction F    with --trace: fraction fitted on, seeded split  [0.6]\n"
          "      --max-decode N      cap of the generated output lengths, tokens  [64]\n"
          "cluster\n"
          "      --prefill P         prefill workers                           [2]\n"
          "      --decode D          decode workers                            [4]\n"
          "      --max-num-seqs B    decode batch limit per worker             [64]\n"
          "      --routers N         router replicas in front of the same workers, clients\n"
          "                          spread over them round robin (at most 8); a list\n"
          "                          (1,2,4) runs each count in turn, a fleet table  [1]\n"
          "      --bus LIST          none | nats | none,nats: the replicas share every\n"
          "                          decoder's in-flight state over a nats-server the demo\n"
          "                          starts (docs/serve.md, A fleet of routers); a list\n"
          "                          runs each                                 [none]\n"
          "      --kill-bus-after S  with --bus nats: kill the nats-server S wall seconds\n"
          "                          into each run (replicas fall back to their own view)\n"
          "                                                                    [never]\n"
          "      --pd FLOW           vllm: vLLM engines, the decoder chosen on the prefill's\n"
          "                          routed experts (NIXL pull) | sglang: SGLang engines,\n"
          "                          both legs at once, the decoder chosen at arrival on the\n"
          "                          predicted signature (docs/sglang.md) | sglang-exact:\n"
          "                          SGLang prefills publishing the prompt's expert counts at\n"
          "                          forward end                               [vllm]\n"
          "      --scrape-interval S  seconds between the routers' reads of the workers'\n"
          "                          /metrics, routed on (0 = off; docs/serve.md)  [0]\n"
          "runs\n"
          "      --rate R            arrivals per second of model time         [100]\n"
          "      --time-scale X      emulated durations = model time x X       [8]\n"
          "      --duration S        seconds (wall) of arrivals per policy     [20; --drift: 40]\n"
          "      --policies LIST     comma list of eldr, footprint, random, rr, jsq, p2c  [all six]\n"
          "  -s, --seed N            seed of the trace, split, fit and arrivals  [" ELDR_SEED_DEFAULT_STR "]\n"
          "      --no-sim            do not run `eldr sim` for comparison\n"
          "      --drift             the production loop instead: fit on half of the domains,\n"
          "                          replay them and then the others; the router's drift score\n"
          "                          rises, the demo refits on the shifted requests and reloads\n"
          "                          the router (POST /admin/reload); a table (and --plot) over\n"
          "                          time of drift and TPOT p50, ELDR vs JSQ\n"
          "output\n"
          "      --json              one JSON object on stdout instead of the table (ms of\n"
          "                          model time)\n"
          "      --plot FILE         a bar chart with gnuplot (.png or .svg)   [none]\n"
          "      --keep              keep the work directory (traces, artifact, logs)\n"
          "  -h, --help              this help\n\n"
          "Ctrl-C stops every process the demo started.\n");
}

/* --routers N or a comma list of at most 4 counts. */
static void parse_routers(demo *x, const char *arg) {
  char buf[64], *save = NULL;
  snprintf(buf, sizeof buf, "%s", arg);
  x->n_router_list = 0;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (x->n_router_list == 4) cli_usage_error(CMD, "--routers: at most 4 counts");
    x->router_list[x->n_router_list++] = cli_parse_long(CMD, "--routers", t, 1, ELDR_CLUSTER_MAX_ROUTERS);
  }
  if (!x->n_router_list) cli_usage_error(CMD, "--routers: empty list");
  x->routers = x->router_list[0];
}

/* --bus none, nats, or both. */
static void parse_bus(demo *x, const char *arg) {
  char buf[64], *save = NULL;
  snprintf(buf, sizeof buf, "%s", arg);
  x->n_bus_list = 0;
  for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int b = !strcmp(t, "nats") ? 1 : !strcmp(t, "none") ? 0 : -1;
    if (b < 0) cli_usage_error(CMD, "--bus: '%s' (none, nats)", t);
    for (size_t i = 0; i < x->n_bus_list; i++)
      if (x->bus_list[i] == b) cli_usage_error(CMD, "--bus: '%s' given twice", t);
    x->bus_list[x->n_bus_list++] = b;
  }
  if (!x->n_bus_list) cli_usage_error(CMD, "--bus: empty list");
  x->bus = x->bus_list[0];
}

/* Flags into x (exit 2 on a bad flag or value, 0 after --help). */
void demo_parse_args(int argc, char **argv, demo *x) {
  memset(x, 0, sizeof *x);
  x->workload = "realistic";
  x->policies_arg = "eldr,footprint,random,rr,jsq,p2c";
  x->n_fit = 400;
  x->n_eval = 200;
  x->max_decode = 64;
  x->P = 2;
  x->D = 4;
  x->max_seqs = 64;
  x->fit_fraction = 0.6;
  x->rate = 100;
  x->scale = 8;
  x->duration = 20;
  x->seed = ELDR_SEED_DEFAULT;
  x->do_sim = 1;
  x->routers = 1;
  static const struct option opts[] = {
      {"routers", required_argument, 0, 'R'},     {"scrape-interval", required_argument, 0, 'I'},
      {"model", required_argument, 0, 'm'},       {"hardware", required_argument, 0, 'H'},
      {"workload", required_argument, 0, 'w'},    {"trace", required_argument, 0, 't'},
      {"fit-requests", required_argument, 0, 'f'}, {"eval-requests", required_argument, 0, 'e'},
      {"fit-fraction", required_argument, 0, 'F'}, {"max-decode", required_argument, 0, 'x'},
      {"prefill", required_argument, 0, 'P'},     {"decode", required_argument, 0, 'D'},
      {"max-num-seqs", required_argument, 0, 'B'}, {"rate", required_argument, 0, 'r'},
      {"time-scale", required_argument, 0, 'T'},  {"duration", required_argument, 0, 'd'},
      {"policies", required_argument, 0, 'p'},    {"seed", required_argument, 0, 's'},
      {"no-sim", no_argument, 0, 'N'},            {"plot", required_argument, 0, 'o'},
      {"keep", no_argument, 0, 'k'},              {"help", no_argument, 0, 'h'},
      {"json", no_argument, 0, 'j'},              {"drift", no_argument, 0, 'W'},
      {"bus", required_argument, 0, 'U'},         {"kill-bus-after", required_argument, 0, 'K'},
      {"pd", required_argument, 0, 'Q'},
      {0, 0, 0, 0},
  };
  cli_getopt_reset();
  int o;
  while ((o = getopt_long(argc, argv, ":hm:w:t:s:", opts, NULL)) != -1) {
    switch (o) {
    case 'm': x->model = optarg; break;
    case 'H': x->hardware = optarg; x->hardware_set = 1; break;
    case 'w': x->workload = optarg; break;
    case 't': x->trace_path = optarg; break;
    case 'f': x->n_fit = cli_parse_long(CMD, "--fit-requests", optarg, 8, 1000000); break;
    case 'e': x->n_eval = cli_parse_long(CMD, "--eval-requests", optarg, 1, 1000000); break;
    case 'F': x->fit_fraction = cli_parse_double(CMD, "--fit-fraction", optarg, 0.05, 0.95); break;
    case 'x': x->max_decode = cli_parse_long(CMD, "--max-decode", optarg, 1, 1 << 20); break;
    case 'P': x->P = cli_parse_long(CMD, "--prefill", optarg, 1, 32); break;
    case 'D': x->D = cli_parse_long(CMD, "--decode", optarg, 1, 64); break;
    case 'B': x->max_seqs = cli_parse_long(CMD, "--max-num-seqs", optarg, 1, 4096); break;
    case 'r': x->rate = cli_parse_double(CMD, "--rate", optarg, 0.01, 1e5); break;
    case 'T': x->scale = cli_parse_double(CMD, "--time-scale", optarg, 0.01, 1000); break;
    case 'd': x->duration = cli_parse_double(CMD, "--duration", optarg, 0.5, 3600); x->duration_set = 1; break;
    case 'p': x->policies_arg = optarg; break;
    case 's': x->seed = cli_parse_u64(CMD, "--seed", optarg); break;
    case 'N': x->do_sim = 0; break;
    case 'R': parse_routers(x, optarg); break;
    case 'U': parse_bus(x, optarg); break;
    case 'K': x->kill_bus_s = cli_parse_double(CMD, "--kill-bus-after", optarg, 0.1, 3600); break;
    case 'I':
      x->scrape = cli_parse_double(CMD, "--scrape-interval", optarg, 0, 60);
      if (x->scrape > 0 && x->scrape < 0.01) cli_usage_error(CMD, "--scrape-interval: 0 (off) or >= 0.01");
      break;
    case 'o':
      if (!eldr_plot_terminal(optarg)) cli_usage_error(CMD, "--plot: '%s' must end in .png or .svg", optarg);
      x->plot = optarg;
      break;
    case 'k': x->keep = 1; break;
    case 'j': x->json = 1; break;
    case 'W': x->drift = 1; break;
    case 'Q':
      if (!strcmp(optarg, "vllm")) x->pd = NULL;
      else if (!strcmp(optarg, "sglang") || !strcmp(optarg, "sglang-exact")) x->pd = optarg;
      else cli_usage_error(CMD, "--pd: '%s' is not vllm, sglang or sglang-exact", optarg);
      break;
    case 'h': usage(stdout); exit(0);
    default: cli_bad_option(CMD, argc, argv, o);
    }
  }
  if (optind < argc) cli_usage_error(CMD, "unexpected argument '%s' (see --help)", argv[optind]);
  static const char *known[] = {"eldr", "random", "rr", "jsq", "p2c", "footprint"};
  char buf[256];
  snprintf(buf, sizeof buf, "%s", x->policies_arg);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    size_t k = 0;
    while (k < 6 && strcmp(tok, known[k])) k++;
    if (k == 6) cli_usage_error(CMD, "--policies: unknown policy '%s' (eldr, footprint, random, rr, jsq, p2c)", tok);
    for (size_t j = 0; j < x->npol; j++)
      if (x->pols[j] == known[k]) cli_usage_error(CMD, "--policies: '%s' given twice", tok);
    if (x->npol < 8) x->pols[x->npol++] = known[k];
  }
  if (!x->npol) cli_usage_error(CMD, "--policies: empty list");
  if (x->drift && x->trace_path) cli_usage_error(CMD, "--drift generates its own traces (two domain mixes): drop --trace");
  /* inputs and outputs are checked before the work directory exists */
  if (x->trace_path && access(x->trace_path, R_OK)) /* an input: exit 1, as every command */
    cli_fail(CMD, "--trace %s: %s", x->trace_path, strerror(errno));
  if (!x->hardware_set) x->hardware = cli_hardware_default(x->model); /* again once a trace names the model */
  if (x->plot) {
    const char *inputs[] = {x->trace_path, NULL};
    cli_check_output(CMD, "--plot", x->plot, inputs);
  }
  /* presets and the workload are flag values: checked before anything starts */
  eldr_diag d = {{0}};
  eldr_latency_model lm;
  int rc = eldr_latency_preset(x->model ? x->model : "qwen3-30b-a3b", x->hardware, &lm, &d);
  if (rc) cli_usage_error(CMD, "%s", eldr_diag_msg(&d, rc));
  if (!x->trace_path) {
    eldr_shape sh;
    char canon[64];
    eldr_tracegen *g = NULL;
    rc = eldr_tracegen_model_shape(x->model ? x->model : "qwen3-30b-a3b", &sh, canon, sizeof canon, &d);
    if (rc) cli_usage_error(CMD, "--model: %s", eldr_diag_msg(&d, rc));
    rc = eldr_tracegen_new(&sh, canon, x->workload, x->seed, &g, &d);
    if (rc) cli_usage_error(CMD, "--workload: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen_free(g);
  }
  snprintf(x->dbuf, sizeof x->dbuf, "%ld", x->D);
  snprintf(x->seedbuf, sizeof x->seedbuf, "%llu", (unsigned long long)x->seed);
  snprintf(x->seqbuf, sizeof x->seqbuf, "%ld", x->max_seqs);
}
