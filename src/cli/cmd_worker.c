/* cmd_worker.c — `eldr worker`: run the emulated vLLM-compatible MoE engine. */
#include <event2/event.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "eldr/latency.h"
#include "eldr/placement_io.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"
#include "eldr/worker.h"

static const char *CMD = "worker";

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr worker --role prefill|decode|both [options]\n\n"
          "An emulated vLLM engine: the OpenAI-compatible HTTP API (/v1/completions,\n"
          "/v1/chat/completions, streaming or not, /health, /v1/models, /metrics with vLLM's\n"
          "metric names) with the PD handoff (kv_transfer_params) and routed_experts, timed in\n"
          "real time by the latency model: prefill batches last the prefill model's time, each\n"
          "decode step lasts the step model's time for the union of experts its batch selects.\n"
          "Generated text is words of the corpus (else placeholder words \" tok0 tok1 ...\");\n"
          "their number is the request's decode length (trace record, else max_tokens,\n"
          "default 16), capped by max_tokens.\n\n"
          "engine\n"
          "      --role R            prefill, decode or both                   [both]\n"
          "      --engine E          vllm (NIXL pull handoff, kv_transfer_params) or sglang\n"
          "                          (bootstrap rooms, both legs at once: docs/sglang.md)  [vllm]\n"
          "      --bootstrap-port N  sglang prefill: its bootstrap server's port (as\n"
          "                          SGLang's --disaggregation-bootstrap-port; 0 = any free)  [8998]\n"
          "      --exact             sglang prefill with contrib/sglang-eldr-exact: the\n"
          "                          forward does not wait for the decode, and publishes\n"
          "                          the prompt's expert counts at its end     [off]\n"
          "      --bootstrap-timeout S  sglang: seconds a prefill item waits for its decode\n"
          "                          (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)  [300]\n"
          "      --waiting-timeout S  sglang: seconds a decode item waits for its KV\n"
          "                          (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)   [300]\n"
          "  -m, --model M           model preset: qwen3-30b-a3b gpt-oss-120b qwen3-235b-a22b\n"
          "                          llama4-maverick olmoe-1b-7b deepseek-v3   [qwen3-30b-a3b]\n"
          "      --hardware H        mi300x | h200 | h100   [mi300x; h200 for llama4-maverick]\n"
          "      --time-scale X      emulated durations = model time x X (4 runs 4x slower\n"
          "                          than the modelled GPU, for small machines)  [1]\n"
          "      --kv-blocks N       KV cache blocks of 16 tokens              [4096]\n"
          "      --max-num-seqs N    decode batch limit                        [256]\n"
          "      --max-batched-tokens N  prefill batch budget, tokens          [8192]\n"
          "      --ep-size R         a TP x EP decode worker: steps last the slowest EP\n"
          "                          rank's expert time plus the all-to-all (docs/sim.md)\n"
          "                                                                    [off]\n"
          "      --tp T              attention tensor parallelism with --ep-size  [R]\n"
          "      --placement P       linear, or an SGLang --init-expert-location JSON file\n"
          "                          (e.g. one `eldr fit --ep-size` wrote for this decoder)\n"
          "                                                                    [linear]\n"
          "      --kv-abort-timeout S  seconds a prefill holds a request's KV for the decode\n"
          "                          pull (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)  [480]\n"
          "      --kv-pull-timeout S  seconds of the decode side's side-channel timeout  [30]\n"
          "what it sends\n"
          "  -t, --trace T           JSONL trace: a request naming \"eldr_trace_id\" uses that\n"
          "                          record's expert selections; others derive them from\n"
          "                          the prompt (without a trace eldr_trace_id is ignored,\n"
          "                          as vLLM ignores fields it does not know)  [none]\n"
          "      --corpus DIR        generated words from DIR/*.txt (none: placeholder words)\n"
          "                          [<prefix>/share/eldr/corpus beside the program, else the\n"
          "                          build's shared corpus, else none; never the current\n"
          "                          directory]\n"
          "      --seed N            seed of the text-derived selections       [0]\n"
          "      --served-model-name NAME  model name in replies               [the preset]\n"
          "      --engine-id ID      remote_engine_id reported                 [eldr-ROLE-PORT]\n"
          "      --no-routed-experts  no routed_experts on prefill replies     [sent]\n"
          "      --routed-experts-layout L  their wire layout, as vLLM shipped it (docs/vllm.md):\n"
          "                          npy (vLLM main: base64 .npy per choice), v021-lists (vLLM\n"
          "                          0.21: prompt_routed_experts + per-choice nested lists),\n"
          "                          v021-base64 (the same split, each an {encoding,dtype,\n"
          "                          shape,data} int16 object), lists (vLLM PR #38939: the\n"
          "                          whole sequence as nested lists), compact (no\n"
          "                          routed_experts: the prompt's per-(layer, expert) counts\n"
          "                          in kv_transfer_params.eldr_expert_counts)  [npy]\n"
          "      --routed-experts-layers L  all: a row per hidden layer, the dense layers' rows\n"
          "                          0 (vLLM's capturer); moe: the MoE layers' rows only\n"
          "                          (older builds, SGLang)                    [all]\n"
          "      --routed-experts-stream none|final  with --routed-experts-decode: final: a\n"
          "                          streamed reply's last chunk carries the whole sequence's rows\n"
          "                          (npy), as vLLM's /inference/v1/generate stream; none: no\n"
          "                          chunk does, as its /v1/completions and chat streams  [none]\n"
          "      --routed-experts-prompt P  full: prompt rows of every token (vLLM since PR\n"
          "                          #39917); computed: of the computed tokens only  [full]\n"
          "      --routed-experts-decode  decode replies carry routed_experts too (prompt\n"
          "                          rows, then the generated tokens'), as a patched vLLM\n"
          "                          decode instance                           [off]\n"
          "      --enable-prompt-tokens-details  usage.prompt_tokens_details.cached_tokens\n"
          "                          (as vLLM's flag)                          [off: null]\n"
          "listening\n"
          "      --host ADDR         listen address                            [127.0.0.1]\n"
          "      --port N            listen port (0 = any free port)           [8100]\n"
          "  -h, --help              this help\n\n"
          "On start it prints one line \"eldr worker: listening on http://HOST:PORT ...\" on\n"
          "stdout. SIGINT / SIGTERM stop it. Exit status: 0 stopped; 1 it could not start\n"
          "(a file that cannot be read, a port in use); 2 a wrong flag or value.\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
  (void)sig;
  (void)what;
  event_base_loopbreak(arg);
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The corpus: --corpus DIR (exit 1 when it is not a directory; "none":
 * placeholder words); else the
 * one installed beside the program (<prefix>/share/eldr/corpus for
 * <prefix>/bin/eldr) or, for a program in its build tree, the build's
 * shared data (ELDR_CORPUS_DIR, fixed at configure time); else NULL
 * (placeholder words). Never a path relative to the current directory:
 * the text must not change with where the worker is started. */
static const char *find_corpus(const char *flag, char *buf, size_t cap) {
  if (flag && !strcmp(flag, "none")) return NULL;
  if (flag) {
    if (!is_dir(flag)) cli_fail(CMD, "--corpus: '%s' is not a directory", flag);
    return flag;
  }
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      if ((size_t)snprintf(buf, cap, "%s/../share/eldr/corpus", exe) < cap && is_dir(buf)) return buf;
    }
  }
#ifdef ELDR_CORPUS_DIR
  if (is_dir(ELDR_CORPUS_DIR)) return ELDR_CORPUS_DIR;
#endif
  return NULL;
}

int eldr_cmd_worker(int argc, char **argv) {
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.port = 8100;
  const char *trace_path = NULL, *placement_path = NULL;
  const char *corpus = NULL, *hardware = NULL;
  int boot_port_set = 0;
  static const struct option opts[] = {
      {"role", required_argument, 0, 'r'},
      {"model", required_argument, 0, 'm'},
      {"hardware", required_argument, 0, 'H'},
      {"trace", required_argument, 0, 't'},
      {"host", required_argument, 0, 'A'},
      {"port", required_argument, 0, 'p'},
      {"time-scale", required_argument, 0, 's'},
      {"kv-blocks", required_argument, 0, 'k'},
      {"max-num-seqs", required_argument, 0, 'n'},
      {"max-batched-tokens", required_argument, 0, 'b'},
      {"seed", required_argument, 0, 'S'},
      {"served-model-name", required_argument, 0, 'M'},
      {"engine-id", required_argument, 0, 'e'},
      {"no-routed-experts", no_argument, 0, 'R'},
      {"routed-experts-layout", required_argument, 0, 'L'},
      {"ep-size", required_argument, 0, 'E'},
      {"tp", required_argument, 0, 'T'},
      {"placement", required_argument, 0, 'P'},
      {"routed-experts-prompt", required_argument, 0, 'q'},
      {"enable-prompt-tokens-details", no_argument, 0, 'D'},
      {"routed-experts-decode", no_argument, 0, 'G'},
      {"routed-experts-layers", required_argument, 0, 'Y'},
      {"routed-experts-stream", required_argument, 0, 'Z'},
      {"kv-abort-timeout", required_argument, 0, 'a'},
      {"kv-pull-timeout", required_argument, 0, 'U'},
      {"corpus", required_argument, 0, 'C'},
      {"engine", required_argument, 0, 1001},
      {"bootstrap-port", required_argument, 0, 1002},
      {"exact", no_argument, 0, 1003},
      {"bootstrap-timeout", required_argument, 0, 1004},
      {"waiting-timeout", required_argument, 0, 1005},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":hm:t:", opts, NULL)) != -1) {
    switch (c) {
    case 'r':
      if (eldr_worker_role_parse(optarg, &cfg.role) < 0)
        cli_usage_error(CMD, "--role: '%s' is not prefill, decode or both", optarg);
      break;
    case 'm': cfg.model = optarg; break;
    case 'H': hardware = optarg; break;
    case 't': trace_path = optarg; break;
    case 'A': cfg.host = optarg; break;
    case 'p': cfg.port = (uint16_t)cli_parse_long(CMD, "--port", optarg, 0, 65535); break;
    case 's': cfg.time_scale = cli_parse_double(CMD, "--time-scale", optarg, 1e-3, 1e4); break;
    case 'k': cfg.kv_blocks = (size_t)cli_parse_long(CMD, "--kv-blocks", optarg, 1, 1L << 24); break;
    case 'n': cfg.max_num_seqs = (size_t)cli_parse_long(CMD, "--max-num-seqs", optarg, 1, 65536); break;
    case 'b':
      cfg.max_batched_tokens = (size_t)cli_parse_long(CMD, "--max-batched-tokens", optarg, 1, 1L << 24);
      break;
    case 'S': cfg.seed = cli_parse_u64(CMD, "--seed", optarg); break;
    case 'M': cfg.served_model_name = optarg; break;
    case 'e': cfg.engine_id = optarg; break;
    case 'R': cfg.return_routed_experts = 0; break;
    case 'L':
      if (eldr_re_layout_parse(optarg, &cfg.routed_experts_layout) < 0)
        cli_usage_error(CMD, "--routed-experts-layout: '%s' is not npy, v021-lists, v021-base64, lists or compact",
                        optarg);
      break;
    case 'E': cfg.ep_size = (uint32_t)cli_parse_long(CMD, "--ep-size", optarg, 1, 64); break;
    case 'T': cfg.tp = (uint32_t)cli_parse_long(CMD, "--tp", optarg, 1, 64); break;
    case 'P': placement_path = strcmp(optarg, "linear") ? optarg : NULL; break;
    case 'q':
      if (!strcmp(optarg, "full")) cfg.routed_experts_computed_only = 0;
      else if (!strcmp(optarg, "computed")) cfg.routed_experts_computed_only = 1;
      else cli_usage_error(CMD, "--routed-experts-prompt: '%s' is not full or computed", optarg);
      break;
    case 'D': cfg.enable_prompt_tokens_details = 1; break;
    case 'G': cfg.routed_experts_decode = 1; break;
    case 'Z':
      if (!strcmp(optarg, "none")) cfg.routed_experts_stream = 0;
      else if (!strcmp(optarg, "final")) cfg.routed_experts_stream = 1;
      else cli_usage_error(CMD, "--routed-experts-stream: '%s' is not none or final", optarg);
      break;
    case 'Y':
      if (!strcmp(optarg, "all")) cfg.routed_experts_moe_only = 0;
      else if (!strcmp(optarg, "moe")) cfg.routed_experts_moe_only = 1;
      else cli_usage_error(CMD, "--routed-experts-layers: '%s' is not all or moe", optarg);
      break;
    case 'a': cfg.kv_abort_timeout = cli_parse_double(CMD, "--kv-abort-timeout", optarg, 1e-3, 1e6); break;
    case 'U': cfg.kv_pull_timeout = cli_parse_double(CMD, "--kv-pull-timeout", optarg, 1e-3, 1e6); break;
    case 'C': corpus = optarg; break;
    case 1001:
      if (!strcmp(optarg, "vllm")) cfg.engine = ELDR_WORKER_ENGINE_VLLM;
      else if (!strcmp(optarg, "sglang")) cfg.engine = ELDR_WORKER_ENGINE_SGLANG;
      else cli_usage_error(CMD, "--engine: '%s' is not vllm or sglang", optarg);
      break;
    case 1002:
      cfg.bootstrap_port = (uint16_t)cli_parse_long(CMD, "--bootstrap-port", optarg, 0, 65535);
      boot_port_set = 1;
      break;
    case 1003: cfg.sglang_exact = 1; break;
    case 1004: cfg.bootstrap_timeout = cli_parse_double(CMD, "--bootstrap-timeout", optarg, 1e-3, 1e6); break;
    case 1005: cfg.waiting_timeout = cli_parse_double(CMD, "--waiting-timeout", optarg, 1e-3, 1e6); break;
    case 'h': usage(stdout); return 0;
    default: cli_bad_option(CMD, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(CMD, "unexpected argument '%s' (see --help)", argv[optind]);
  if (cfg.engine != ELDR_WORKER_ENGINE_SGLANG && (boot_port_set || cfg.sglang_exact || cfg.bootstrap_timeout > 0 ||
                                                  cfg.waiting_timeout > 0))
    cli_usage_error(CMD, "--bootstrap-port, --exact, --bootstrap-timeout and --waiting-timeout need --engine sglang");
  if ((boot_port_set || cfg.sglang_exact) && cfg.role != ELDR_WORKER_PREFILL)
    cli_usage_error(CMD, "--bootstrap-port and --exact are a prefill worker's (--role prefill)");
  if (cfg.engine == ELDR_WORKER_ENGINE_SGLANG && !boot_port_set) cfg.bootstrap_port = 8998;
  cfg.hardware = hardware ? hardware : cli_hardware_default(cfg.model);
  if (cfg.routed_experts_stream && !cfg.routed_experts_decode)
    cli_usage_error(CMD, "--routed-experts-stream final needs --routed-experts-decode (only a decode leg's "
                         "stream carries rows)");

  char corpus_buf[PATH_MAX];
  cfg.corpus_dir = corpus = find_corpus(corpus, corpus_buf, sizeof corpus_buf);
  eldr_diag d = {{0}};
  /* a bad --model/--hardware is a bad flag value (exit 2), found before anything starts */
  eldr_latency_model lm;
  int prc = eldr_latency_preset(cfg.model, cfg.hardware, &lm, &d);
  if (prc) cli_usage_error(CMD, "%s", eldr_diag_msg(&d, prc));
  if ((cfg.tp || placement_path) && !cfg.ep_size) cli_usage_error(CMD, "--tp and --placement need --ep-size");
  eldr_placement *placement = NULL;
  if (placement_path) { /* rows of the file are the model's layer ids */
    eldr_shape s;
    int rc = eldr_tracegen_model_shape(cfg.model, &s, NULL, 0, &d);
    if (rc < 0) cli_usage_error(CMD, "--model: %s", eldr_diag_msg(&d, rc));
    uint32_t ids[ELDR_MAX_LAYERS];
    eldr_tracegen_layer_ids(cfg.model, &s, ids);
    rc = eldr_placement_load(placement_path, s.num_experts, cfg.ep_size, ids, s.num_layers, &placement, &d);
    if (rc < 0) cli_fail(CMD, "--placement: %s", eldr_diag_msg(&d, rc));
    cfg.placement = placement;
  }
  eldr_trace *trace = NULL;
  if (trace_path) {
    int rc = eldr_trace_load(trace_path, &trace, &d);
    if (rc < 0) cli_fail(CMD, "--trace: %s", eldr_diag_msg(&d, rc));
    cli_trace_require_tokens(CMD, trace_path, trace,
                             "the worker replays per-token expert selections in its replies");
    cfg.trace = trace;
  }
  signal(SIGPIPE, SIG_IGN);
  /* precise timers (timerfd): decode steps last a few milliseconds */
  struct event_config *ecfg = event_config_new();
  if (ecfg) event_config_set_flag(ecfg, EVENT_BASE_FLAG_PRECISE_TIMER);
  struct event_base *base = ecfg ? event_base_new_with_config(ecfg) : NULL;
  if (ecfg) event_config_free(ecfg);
  if (!base) base = event_base_new();
  if (!base) cli_fail(CMD, "cannot create the event loop");
  eldr_worker *w = NULL;
  int rc = eldr_worker_new(base, &cfg, &w, &d);
  if (rc < 0) {
    event_base_free(base);
    eldr_trace_free(trace);
    eldr_placement_free(placement);
    cli_fail(CMD, "%s", eldr_diag_msg(&d, rc));
  }
  struct event *sint = evsignal_new(base, SIGINT, on_signal, base);
  struct event *sterm = evsignal_new(base, SIGTERM, on_signal, base);
  if (sint) event_add(sint, NULL);
  if (sterm) event_add(sterm, NULL);
  char epdesc[96] = "";
  if (cfg.ep_size)
    snprintf(epdesc, sizeof epdesc, " tp=%u ep=%u placement=%s", cfg.tp ? cfg.tp : cfg.ep_size,
             cfg.ep_size, placement ? "file" : "linear");
  char sgdesc[96] = "";
  if (cfg.engine == ELDR_WORKER_ENGINE_SGLANG)
    snprintf(sgdesc, sizeof sgdesc, " engine=sglang%s", cfg.sglang_exact ? " exact=yes" : "");
  if (eldr_worker_bootstrap_port(w))
    snprintf(sgdesc + strlen(sgdesc), sizeof sgdesc - strlen(sgdesc), " bootstrap=%u",
             (unsigned)eldr_worker_bootstrap_port(w));
  printf("eldr worker: listening on http://%s:%u role=%s model=%s hardware=%s time_scale=%g%s%s%s corpus=%s\n",
         cfg.host ? cfg.host : "127.0.0.1", (unsigned)eldr_worker_port(w),
         eldr_worker_role_name(cfg.role), cfg.model, cfg.hardware, cfg.time_scale,
         trace ? " trace=yes" : "", epdesc, sgdesc, corpus ? corpus : "none");
  fflush(stdout);
  event_base_dispatch(base);
  if (sint) event_free(sint);
  if (sterm) event_free(sterm);
  eldr_worker_free(w);
  event_base_free(base);
  eldr_trace_free(trace);
  eldr_placement_free(placement);
  return 0;
}
