/* cmd_worker.c — `eldr worker`: run the emulated vLLM-compatible MoE engine. */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
          "Generated text is words of --corpus (else placeholder words \" tok0 tok1 ...\"); their number is the\n"
          "request's decode length (trace record, else max_tokens, default 16), capped by\n"
          "max_tokens.\n\n"
          "options:\n"
          "  --role R              prefill, decode or both (default both)\n"
          "  --model M             model preset (default qwen3-30b-a3b; also gpt-oss-120b,\n"
          "                        qwen3-235b-a22b, llama4-maverick, olmoe-1b-7b, deepseek-v3)\n"
          "  --hardware H          hardware preset: h200 (default), h100, mi300x\n"
          "  --trace T             JSONL trace: a request naming \"eldr_trace_id\" uses that\n"
          "                        record's expert selections; others derive them from the prompt\n"
          "  --host A              listen address (default 127.0.0.1)\n"
          "  --port N              listen port (default 8100; 0 = any free port)\n"
          "  --time-scale S        emulated durations = model time x S (default 1; 4 runs\n"
          "                        4x slower than the modelled GPU, for small machines)\n"
          "  --kv-blocks N         KV cache blocks of 16 tokens (default 4096)\n"
          "  --max-num-seqs N      decode batch limit (default 256)\n"
          "  --max-batched-tokens N  prefill batch token budget (default 8192)\n"
          "  --seed N              seed of the text-derived selections (default 0)\n"
          "  --served-model-name S model name in replies (default: the preset)\n"
          "  --engine-id S         remote_engine_id reported (default eldr-<role>-<port>)\n"
          "  --no-routed-experts   do not return routed_experts on prefill replies\n"
          "  --routed-experts-layout L  their wire layout, as vLLM shipped it (docs/vllm.md):\n"
          "                        npy (default; vLLM main: base64 .npy per choice),\n"
          "                        v021-lists (vLLM 0.21: prompt_routed_experts + per-choice\n"
          "                        nested lists) or v021-base64 (the same split, each an\n"
          "                        {encoding,dtype,shape,data} int16 object) or lists\n"
          "                        (vLLM PR #38939: whole sequence as nested lists) or compact\n"
          "                        (no routed_experts: the prompt's per-(layer, expert) counts in\n"
          "                        kv_transfer_params.eldr_expert_counts, docs/vllm.md)\n"
          "  --routed-experts-stream none|final  with --routed-experts-decode: a streamed reply's\n"
          "                        last chunk carries the whole sequence's rows (npy), as vLLM's\n"
          "                        /inference/v1/generate stream; none (default): no chunk does,\n"
          "                        as vLLM's /v1/completions and /v1/chat/completions streams\n"
          "  --routed-experts-layers all|moe  a row per hidden layer, the dense layers' rows 0\n"
          "                        (default: vLLM's capturer) or the MoE layers' rows only\n"
          "                        (older builds, SGLang)\n"
          "  --ep-size R           a TP x EP decode worker: steps last the slowest EP rank's\n"
          "                        expert time plus the all-to-all (docs/sim.md)\n"
          "  --tp T                attention tensor parallelism with --ep-size (default R)\n"
          "  --placement P         linear (default) or an SGLang --init-expert-location JSON\n"
          "                        file (e.g. one `eldr fit --ep-size` wrote for this decoder)\n"
          "  --routed-experts-prompt full|computed  prompt rows of every token (default, vLLM\n"
          "                        since PR #39917) or of the computed tokens only\n"
          "  --routed-experts-decode  decode replies carry routed_experts too (prompt rows, then\n"
          "                        the generated tokens'), as a patched vLLM decode instance\n"
          "  --enable-prompt-tokens-details  usage.prompt_tokens_details.cached_tokens (as vLLM's\n"
          "                        flag; default: null)\n"
          "  --kv-abort-timeout S  a prefill holds a request's KV for the decode pull this long\n"
          "                        (default 480, vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)\n"
          "  --kv-pull-timeout S   the decode side's side-channel timeout (default 30)\n"
          "  --corpus DIR          draw generated words from DIR/*.txt (default ../shared/corpus\n"
          "                        when it exists, else placeholder words)\n"
          "  -h, --help            this text\n\n"
          "On start it prints one line \"eldr worker: listening on http://HOST:PORT ...\" on\n"
          "stdout. SIGINT / SIGTERM stop it.\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
  (void)sig;
  (void)what;
  event_base_loopbreak(arg);
}

int eldr_cmd_worker(int argc, char **argv) {
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.port = 8100;
  const char *trace_path = NULL, *placement_path = NULL;
  const char *corpus = NULL;
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
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
    case 'r':
      if (eldr_worker_role_parse(optarg, &cfg.role) < 0)
        cli_usage_error(CMD, "--role: '%s' is not prefill, decode or both", optarg);
      break;
    case 'm': cfg.model = optarg; break;
    case 'H': cfg.hardware = optarg; break;
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
    case 'h': usage(stdout); return 0;
    default: cli_bad_option(CMD, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(CMD, "unexpected argument '%s' (see --help)", argv[optind]);
  if (cfg.routed_experts_stream && !cfg.routed_experts_decode)
    cli_usage_error(CMD, "--routed-experts-stream final needs --routed-experts-decode (only a decode leg's "
                         "stream carries rows)");

  /* the corpus: the flag (must be readable), else ../shared/corpus when present */
  struct stat cst;
  if (corpus && (stat(corpus, &cst) < 0 || !S_ISDIR(cst.st_mode)))
    cli_usage_error(CMD, "--corpus: '%s' is not a directory", corpus);
  if (!corpus && stat("../shared/corpus", &cst) == 0 && S_ISDIR(cst.st_mode)) corpus = "../shared/corpus";
  cfg.corpus_dir = corpus;
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
  printf("eldr worker: listening on http://%s:%u role=%s model=%s hardware=%s time_scale=%g%s%s\n",
         cfg.host ? cfg.host : "127.0.0.1", (unsigned)eldr_worker_port(w),
         eldr_worker_role_name(cfg.role), cfg.model, cfg.hardware, cfg.time_scale,
         trace ? " trace=yes" : "", epdesc);
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
