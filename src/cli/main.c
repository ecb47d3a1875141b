/* main.c — `eldr <command> [args]`: dispatch to the command implementations.
 * Each command lives in src/cli/cmd_<name>.c and defines eldr_cmd_<name>.
 * The declarations are weak so that the binary links while a command is
 * still being written; an absent command says so and exits 2. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "eldr/cpu.h"

#define DECL(name) int eldr_cmd_##name(int argc, char **argv) __attribute__((weak));
DECL(fit)
DECL(rho)
DECL(trace)
DECL(sim)
DECL(serve)
DECL(worker)
DECL(demo)
DECL(bench)
DECL(study)
#undef DECL

typedef struct command {
  const char *name;
  int (*fn)(int, char **);
  const char *summary;
  const char *subs; /* "name\tsummary\n" lines of its subcommands, or NULL */
} command;

static void usage(FILE *f, const command *cmds, size_t n) {
  fprintf(f,
          "eldr — expert-locality-aware decode routing for PD-disaggregated MoE serving\n\n"
          "usage: eldr <command> [options]   (eldr <command> --help for details)\n"
          "       eldr --version             the version and the SIMD level in use\n"
          "       eldr --help                this list\n\ncommands:\n");
  for (size_t i = 0; i < n; i++) {
    fprintf(f, "  %-8s %s%s\n", cmds[i].name, cmds[i].summary, cmds[i].fn ? "" : " (not built)");
    for (const char *p = cmds[i].subs; p && *p;) {
      size_t tab = strcspn(p, "\t"), eol = strcspn(p, "\n");
      fprintf(f, "    %s %-10.*s %.*s\n", cmds[i].name, (int)tab, p, (int)(eol - tab - 1), p + tab + 1);
      p += eol + (p[eol] == '\n');
    }
  }
  fprintf(f,
          "\nexit status, every command:\n"
          "  0  done\n"
          "  1  the work failed: an input missing, unreadable or malformed, an output that\n"
          "     cannot be written, a port in use, a peer that failed (the message names it)\n"
          "  2  the command line is wrong: an unknown flag or command, a missing or malformed\n"
          "     value, a value out of range, flags that conflict (nothing was started)\n");
}

int main(int argc, char **argv) {
  const command cmds[] = {
      {"fit", eldr_cmd_fit, "fit a routing artifact (signature, layer mask, balanced K-means)", NULL},
      {"rho", eldr_cmd_rho, "signature quality rho of a representation or artifact on a trace", NULL},
      {"trace", eldr_cmd_trace, "generate synthetic expert traces; trace statistics",
       "gen\tgenerate a synthetic expert trace (JSONL)\n"
       "stats\tstatistics of a trace: prefill->decode, distinct experts per batch, domains\n"
       "compact\trewrite traces in the counts form (per-layer expert counts)\n"},
      {"sim", eldr_cmd_sim, "discrete-event xPyD cluster simulation of routing policies", NULL},
      {"serve", eldr_cmd_serve, "the HTTP router in front of prefill and decode workers", NULL},
      {"worker", eldr_cmd_worker, "an emulated vLLM-compatible MoE engine", NULL},
      {"demo", eldr_cmd_demo, "a local cluster: workers, router, load, per-policy results", NULL},
      {"bench", eldr_cmd_bench, "benchmarks",
       "moe-layer\ta real MoE FFN layer on this CPU: latency vs active experts and batch\n"
       "load\treplay a trace at a Poisson rate against an OpenAI-compatible endpoint\n"
       "route\trouter-side cost of signature extraction plus decision\n"},
      {"study", eldr_cmd_study, "one paper result (fig2..fig16, table2, rho-gain): CSV, JSON, PNG",
       NULL},
  };
  const size_t n = sizeof cmds / sizeof cmds[0];
  if (argc < 2) {
    usage(stderr, cmds, n);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout, cmds, n);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("eldr 0.1.0\nsimd: %s (this CPU: %s; ELDR_NO_SIMD=1 / ELDR_NO_AVX512=1 lower it)\n",
           eldr_cpu_level_name(eldr_cpu_level_now()), eldr_cpu_level_name(eldr_cpu_detected()));
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (strcmp(argv[1], cmds[i].name)) continue;
    if (!cmds[i].fn) {
      fprintf(stderr, "eldr: command '%s' is not built in this version\n", argv[1]);
      return 2;
    }
    return cmds[i].fn(argc - 1, argv + 1);
  }
  fprintf(stderr, "eldr: unknown command '%s' (see eldr --help)\n", argv[1]);
  return 2;
}
