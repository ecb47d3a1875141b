/* bench_load.c — `eldr bench load`: replay a trace at a Poisson rate against
 * an OpenAI-compatible endpoint and report TTFT / TPOT percentiles. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/loadgen.h"
#include "eldr/trace.h"

static const char *CMD = "bench load";

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr bench load --target URL --trace T [options]\n\n"
          "Replays trace T at a Poisson rate against any OpenAI-compatible endpoint (eldr serve,\n"
          "eldr worker, a vLLM cluster), streaming, and reports TTFT and TPOT percentiles.\n"
          "Each request: a prompt of the record's prefill length (placeholder words, or the\n"
          "record's prompt), max_tokens = its decode length, ignore_eos, and \"eldr_trace_id\"\n"
          "(an eldr worker with the same trace replays the record's expert selections; one\n"
          "without a trace, and vLLM, ignore it). Arrivals stop after --duration; open\n"
          "requests are cancelled --drain seconds later.\n\n"
          "      --target URL        base URL, e.g. http://127.0.0.1:8000      (required)\n"
          "  -t, --trace T           JSONL trace, per-token or counts form (prompts and\n"
          "                          lengths are all it needs); a directory of *.jsonl or a\n"
          "                          glob; repeat for more                     (required)\n"
          "      --rate R            arrivals per second                       [2]\n"
          "      --duration S        seconds of arrivals                       [30]\n"
          "  -n, --requests N        stop after N arrivals                     [no limit]\n"
          "      --first I           first trace record to use                 [0]\n"
          "      --count N           records to cycle through                  [to the end]\n"
          "  -s, --seed N            arrival schedule seed                     [1]\n"
          "      --no-stream         non-streaming requests (TTFT = end-to-end, no TPOT)\n"
          "      --chat              /v1/chat/completions instead of /v1/completions\n"
          "  -m, --model NAME        send \"model\": NAME                      [omitted]\n"
          "      --max-tokens N      cap of every request's max_tokens         [no cap]\n"
          "      --no-trace-id       do not send \"eldr_trace_id\"\n"
          "      --timeout S         seconds a request may be idle             [60]\n"
          "      --drain S           seconds to wait for open requests after the last\n"
          "                          arrival                                   [60]\n"
          "      --json              one JSON object on stdout instead of the table\n"
          "  -h, --help              this help\n");
}

/* A progress line: rewritten in place on a terminal, one line every 5 s
 * otherwise (logs and CI see the run is alive). */
static void progress(void *ctx, size_t sent, size_t done, double el) {
  static double last = -1;
  (void)ctx;
  if (cli_stderr_tty()) {
    fprintf(stderr, "\r  %.0f s: %zu sent, %zu done   ", el, sent, done);
  } else {
    if (last >= 0 && el - last < 5) return;
    last = el;
    fprintf(stderr, "eldr bench load: %.0f s: %zu sent, %zu done\n", el, sent, done);
  }
  fflush(stderr);
}

/* A table cell in ms: "-" when nothing was measured (every request failed). */
static void cell(const char *fmt, double s) {
  if (isnan(s)) printf(" %10s", "-");
  else printf(fmt, s * 1e3);
}

int eldr_bench_load(int argc, char **argv) {
  eldr_loadgen_config c;
  eldr_loadgen_config_default(&c);
  c.rate = 2;
  c.duration_s = 30;
  c.seed = 1;
  cli_trace_inputs tin = {0};
  int json = 0;
  static const struct option opts[] = {
      {"target", required_argument, 0, 'u'},  {"trace", required_argument, 0, 't'},
      {"rate", required_argument, 0, 'r'},    {"duration", required_argument, 0, 'd'},
      {"requests", required_argument, 0, 'n'}, {"first", required_argument, 0, 'f'},
      {"count", required_argument, 0, 'c'},   {"seed", required_argument, 0, 's'},
      {"no-stream", no_argument, 0, 'S'},     {"stream", no_argument, 0, 'T'},
      {"chat", no_argument, 0, 'C'},          {"model", required_argument, 0, 'm'},
      {"max-tokens", required_argument, 0, 'M'}, {"no-trace-id", no_argument, 0, 'I'},
      {"timeout", required_argument, 0, 'o'}, {"drain", required_argument, 0, 'D'},
      {"json", no_argument, 0, 'j'},          {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0},
  };
  cli_getopt_reset();
  int o;
  while ((o = getopt_long(argc, argv, ":ht:n:s:m:", opts, NULL)) != -1) {
    switch (o) {
    case 'u': c.target = optarg; break;
    case 't': cli_trace_add(CMD, &tin, optarg); break;
    case 'r': c.rate = cli_parse_double(CMD, "--rate", optarg, 1e-3, 1e5); break;
    case 'd': c.duration_s = cli_parse_double(CMD, "--duration", optarg, 1e-3, 86400); break;
    case 'n': c.max_requests = (size_t)cli_parse_long(CMD, "--requests", optarg, 1, 100000000); break;
    case 'f': c.first = (size_t)cli_parse_long(CMD, "--first", optarg, 0, 1L << 40); break;
    case 'c': c.count = (size_t)cli_parse_long(CMD, "--count", optarg, 1, 1L << 40); break;
    case 's': c.seed = cli_parse_u64(CMD, "--seed", optarg); break;
    case 'S': c.stream = 0; break;
    case 'T': c.stream = 1; break;
    case 'C': c.chat = 1; break;
    case 'm': c.model = optarg; break;
    case 'M': c.max_tokens = (uint32_t)cli_parse_long(CMD, "--max-tokens", optarg, 1, 1 << 24); break;
    case 'I': c.send_trace_id = 0; break;
    case 'o': c.timeout_s = cli_parse_double(CMD, "--timeout", optarg, 0.01, 86400); break;
    case 'D': c.drain_s = cli_parse_double(CMD, "--drain", optarg, 0, 86400); break;
    case 'j': json = 1; break;
    case 'h': usage(stdout); return 0;
    default: cli_bad_option(CMD, argc, argv, o);
    }
  }
  if (optind < argc) cli_usage_error(CMD, "unexpected argument '%s' (see --help)", argv[optind]);
  if (!c.target) cli_usage_error(CMD, "--target is required (e.g. http://127.0.0.1:8000)");
  if (!tin.n) cli_usage_error(CMD, "--trace is required");
  eldr_diag d = {{0}};
  if (eldr_loadgen_target_check(c.target, NULL))
    cli_usage_error(CMD, "--target: '%s' is not an http://host[:port] URL", c.target);
  cli_trace_expand(CMD, &tin);
  eldr_trace *t = cli_trace_load(CMD, &tin);
  int rc;
  if (c.first >= t->n) cli_usage_error(CMD, "--first %zu: the trace has %zu records", c.first, t->n);
  c.trace = t;
  c.progress = progress;
  signal(SIGPIPE, SIG_IGN);
  if (!json)
    fprintf(stderr, "eldr bench load: %s, %.3g req/s for %.3g s (seed %llu, %s)\n", c.target, c.rate,
            c.duration_s, (unsigned long long)c.seed, c.stream ? "streaming" : "not streaming");
  eldr_loadgen_result r;
  rc = eldr_loadgen_run(&c, &r, &d);
  if (cli_stderr_tty() && !json) fprintf(stderr, "\n");
  if (rc < 0) {
    eldr_trace_free(t);
    cli_fail(CMD, "%s", eldr_diag_msg(&d, rc));
  }
  eldr_loadgen_summary s;
  if (eldr_loadgen_summarize(&r, &s) < 0) cli_fail(CMD, "out of memory");
  if (json) {
    json_t *j = json_pack("{s:s,s:f,s:f,s:I,s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f}", "target", c.target,
                          "rate", c.rate, "duration_s", c.duration_s, "seed", (json_int_t)c.seed,
                          "stream", c.stream, "sent", (json_int_t)r.n, "ok", (json_int_t)r.ok,
                          "failed", (json_int_t)r.failed, "timed_out", (json_int_t)r.timed_out,
                          "malformed", (json_int_t)r.malformed, "tokens", (json_int_t)r.tokens,
                          "wall_s", r.wall_s, "throughput_rps", s.throughput_rps, "tokens_per_s",
                          s.tokens_per_s);
    const char *names[] = {"ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s",
                           "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "tpot_mean_s",
                           "e2e_p50_s",  "e2e_p90_s",  "e2e_p99_s",  "e2e_mean_s"};
    double vals[] = {s.ttft_p50, s.ttft_p90, s.ttft_p99, s.ttft_mean, s.tpot_p50, s.tpot_p90,
                     s.tpot_p99, s.tpot_mean, s.e2e_p50,  s.e2e_p90,  s.e2e_p99,  s.e2e_mean};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
      json_object_set_new(j, names[i], isnan(vals[i]) ? json_null() : json_real(vals[i]));
    json_t *errs = json_array();
    for (size_t i = 0; i < r.n && json_array_size(errs) < 10; i++)
      if (!r.recs[i].ok) json_array_append_new(errs, json_string(r.recs[i].error));
    json_object_set_new(j, "errors", errs);
    char *out = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    printf("%s\n", out ? out : "{}");
    free(out);
    json_decref(j);
  } else {
    printf("requests %zu: ok %zu, failed %zu, timed out %zu, malformed streams %zu\n", r.n, r.ok,
           r.failed, r.timed_out, r.malformed);
    printf("throughput %.2f req/s, %.1f tokens/s over %.1f s\n", s.throughput_rps, s.tokens_per_s,
           r.wall_s);
    printf("%-6s %10s %10s %10s %10s\n", "(ms)", "p50", "p90", "p99", "mean");
    const struct { const char *name, *fmt; double v[4]; int show; } rows[] = {
        {"TTFT", " %10.2f", {s.ttft_p50, s.ttft_p90, s.ttft_p99, s.ttft_mean}, 1},
        {"TPOT", " %10.3f", {s.tpot_p50, s.tpot_p90, s.tpot_p99, s.tpot_mean}, c.stream},
        {"E2E", " %10.2f", {s.e2e_p50, s.e2e_p90, s.e2e_p99, s.e2e_mean}, 1},
    };
    for (size_t i = 0; i < 3; i++) {
      if (!rows[i].show) continue;
      printf("%-6s", rows[i].name);
      for (size_t q = 0; q < 4; q++) cell(rows[i].fmt, rows[i].v[q]);
      printf("\n");
    }
    size_t shown = 0;
    for (size_t i = 0; i < r.n && shown < 5; i++)
      if (!r.recs[i].ok) {
        printf("  failed: record %zu: %s\n", r.recs[i].trace_index, r.recs[i].error);
        shown++;
      }
  }
  int status = r.ok > 0 ? 0 : 1;
  eldr_loadgen_result_free(&r);
  eldr_trace_free(t);
  cli_trace_inputs_free(&tin);
  return status;
}
