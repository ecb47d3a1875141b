/* cmd_trace_split.c — `eldr trace split TRACE --fit FILE --held-out FILE`:
 * the seeded split every command fits and serves with (eldr fit / sim /
 * study / demo --fit-fraction F --seed S), written out as two traces, so a
 * statistic can be measured on each part (docs/trace.md). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/fit.h"
#include "eldr/provenance.h"
#include "eldr/trace.h"

static const char SPLIT_HELP[] =
    "usage: eldr trace split TRACE --fit FILE --held-out FILE [options]\n"
    "\n"
    "Write the two parts of TRACE's seeded split: the requests `eldr fit\n"
    "--fit-fraction F --seed S` fits on, and those `eldr sim` (--fit-fraction F\n"
    "--seed S) and `eldr study` serve. Each part keeps TRACE's line order.\n"
    "\n"
    "      --fit FILE          the fitted part                          (required)\n"
    "      --held-out FILE     the rest                                 (required)\n"
    "      --fit-fraction F    the fitted share, in (0, 1)              [0.5]\n"
    "      --seed S            the split's seed                         [" ELDR_SEED_DEFAULT_STR "]\n"
    "  -q, --quiet             no summary on stderr\n"
    "  -h, --help              this help\n";

static void write_part(const char *cmd, const char *path, const eldr_trace *t, const uint8_t *in,
                       uint8_t want) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) cli_fail(cmd, "cannot write '%s'", path);
  for (size_t i = 0; i < t->n; i++)
    if (in[i] == want && eldr_trace_write_request(f, t, &t->req[i]) < 0) {
      fclose(f);
      remove(tmp);
      cli_fail(cmd, "write error on '%s'", path);
    }
  if (fclose(f) || rename(tmp, path)) {
    remove(tmp);
    cli_fail(cmd, "write error on '%s'", path);
  }
}

int eldr_cmd_trace_split(int argc, char **argv) {
  const char *cmd = "trace split";
  const char *fit_path = NULL, *held_path = NULL;
  double frac = 0.5;
  uint64_t seed = ELDR_SEED_DEFAULT;
  int quiet = 0;
  static const struct option lo[] = {
      {"fit", required_argument, 0, 1},   {"held-out", required_argument, 0, 2},
      {"fit-fraction", required_argument, 0, 3}, {"seed", required_argument, 0, 4},
      {"quiet", no_argument, 0, 'q'},     {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":qh", lo, NULL)) != -1) {
    switch (c) {
    case 1: fit_path = optarg; break;
    case 2: held_path = optarg; break;
    case 3: frac = cli_parse_double(cmd, "--fit-fraction", optarg, 1e-6, 1 - 1e-6); break;
    case 4: seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 'q': quiet = 1; break;
    case 'h': fputs(SPLIT_HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind >= argc) cli_usage_error(cmd, "TRACE is required (see --help)");
  if (optind + 1 < argc) cli_usage_error(cmd, "one TRACE only ('%s' is extra)", argv[optind + 1]);
  if (!fit_path || !held_path) cli_usage_error(cmd, "--fit and --held-out are required");
  if (!strcmp(fit_path, held_path)) cli_usage_error(cmd, "--fit and --held-out name the same file");
  eldr_diag d = {{0}};
  eldr_trace *t = NULL;
  int rc = eldr_trace_load(argv[optind], &t, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  const size_t n = t->n, n_fit = (size_t)floor(frac * (double)n);
  if (n_fit < 1 || n_fit >= n)
    cli_usage_error(cmd, "--fit-fraction %g leaves no fit or no held-out requests (%zu requests)", frac, n);
  size_t *perm = malloc(n * sizeof *perm);
  uint8_t *in = calloc(n, 1);
  if (!perm || !in) cli_fail(cmd, "out of memory");
  eldr_fit_shuffle(perm, n, seed); /* the split of eldr fit / sim / study / demo */
  for (size_t i = 0; i < n_fit; i++) in[perm[i]] = 1;
  write_part(cmd, fit_path, t, in, 1);
  write_part(cmd, held_path, t, in, 0);
  if (!quiet)
    fprintf(stderr, "eldr trace split: %zu requests: %zu fitted -> %s, %zu held out -> %s (seed %llu)\n",
            n, n_fit, fit_path, n - n_fit, held_path, (unsigned long long)seed);
  free(perm);
  free(in);
  eldr_trace_free(t);
  return 0;
}
