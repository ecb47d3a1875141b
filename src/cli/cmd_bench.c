/* cmd_bench.c — `eldr bench <name>`: dispatch to the benchmarks. Each lives
 * in its own file as eldr_bench_<name>(argc, argv) (weak here, so the
 * binary links while one is being written). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define DECL(name) int eldr_bench_##name(int argc, char **argv) __attribute__((weak));
DECL(moe_layer)
DECL(load)
DECL(route)
#undef DECL

int eldr_cmd_bench(int argc, char **argv) {
  const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
  } subs[] = {
      {"moe-layer", eldr_bench_moe_layer, "a real MoE FFN layer on this CPU: latency vs active experts and batch"},
      {"load", eldr_bench_load, "replay a trace at a Poisson rate against an OpenAI-compatible endpoint"},
      {"route", eldr_bench_route, "router-side cost of signature extraction plus decision"},
  };
  const size_t n = sizeof subs / sizeof subs[0];
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    FILE *f = argc < 2 ? stderr : stdout;
    fprintf(f, "usage: eldr bench <name> [options]   (eldr bench <name> --help)\n\nbenchmarks:\n");
    for (size_t i = 0; i < n; i++)
      fprintf(f, "  %-10s %s%s\n", subs[i].name, subs[i].summary, subs[i].fn ? "" : " (not built)");
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (strcmp(argv[1], subs[i].name)) continue;
    if (!subs[i].fn) cli_usage_error("bench", "benchmark '%s' is not built in this version", argv[1]);
    return subs[i].fn(argc - 1, argv + 1);
  }
  cli_usage_error("bench", "unknown benchmark '%s' (see eldr bench --help)", argv[1]);
}
