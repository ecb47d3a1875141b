/* cli.h — helpers shared by the `eldr <command>` implementations.
 * Only src/cli/ prints and exits. Every command is
 *   int eldr_cmd_<name>(int argc, char **argv)   (argv[0] = command name)
 * returning the process exit status. Parse flags with getopt_long after
 * calling cli_getopt_reset(), with an optstring that starts with ':' and has 'h'
 * (-h and --help print the usage on stdout and exit 0); report bad flags/values
 * with cli_usage_error() (one line naming the flag, exit status 2) before
 * anything starts: no banner, no process, no file first. Library work goes
 * through the library (sweep, cluster, plot); a command file parses flags,
 * calls it and prints. tests/cli/test_cli_conventions.c checks every command.
 */
#ifndef ELDR_CLI_H
#define ELDR_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/clock.h" /* eldr_clock_now: the commands' timing */
#include "eldr/mooncake.h"

/* The exit status of every command (README, `eldr --help`):
 *   0  done;
 *   1  the work failed: an input missing, unreadable or malformed, an
 *      output that cannot be written, a port in use, a peer that failed
 *      (cli_fail: the message names the file, port or peer);
 *   2  the command line is wrong: an unknown flag or subcommand, a missing
 *      or malformed value, a value out of range, flags that conflict
 *      (cli_usage_error; before anything starts).
 * A message that already starts with "<cmd>: " is not prefixed twice. */

/* Prints "eldr <cmd>: <message>\n" to stderr and exits with status 2. */
_Noreturn void cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prints "eldr <cmd>: <message>\n" to stderr and exits with status 1. */
_Noreturn void cli_fail(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* cli_fail with "<where>: <msg>", or msg alone when it already starts with
 * where's path (a reader's "FILE:LINE: ..."): no file named twice. */
_Noreturn void cli_fail_at(const char *cmd, const char *where, const char *msg);

/* Reset getopt state (optind=1, opterr=0) before parsing a command's argv. */
void cli_getopt_reset(void);
/* Report the getopt failure for the current option (unknown flag or missing
 * value) as a one-line usage error; argv as passed to getopt_long. */
_Noreturn void cli_bad_option(const char *cmd, int argc, char **argv, int opt);

/* Value parsers: exit with a usage error naming flag on bad input. */
long cli_parse_long(const char *cmd, const char *flag, const char *val, long min, long max);
double cli_parse_double(const char *cmd, const char *flag, const char *val, double min,
                        double max);
uint64_t cli_parse_u64(const char *cmd, const char *flag, const char *val);
/* Comma list of numbers; *out malloc'd; returns count (>= 1). */
size_t cli_parse_double_list(const char *cmd, const char *flag, const char *val, double min,
                             double max, double **out);
size_t cli_parse_long_list(const char *cmd, const char *flag, const char *val, long min,
                           long max, long **out);

/* Check, before any work, that `path` (given with `flag`) can be written as an
 * output file: not a directory, its directory exists and is writable, an
 * existing file is writable, and it is not the same file as any of `inputs`
 * (NULL-terminated; NULL entries before the end are not allowed). An empty
 * path or one of the inputs is a usage error (status 2); a path the file
 * system refuses exits 1, naming the flag and the cause. Creates nothing. */
void cli_check_output(const char *cmd, const char *flag, const char *path,
                      const char *const *inputs);

/* The same for an output directory `dir` (created by the command): it is a
 * writable directory, or can be made in one. Creates nothing. */
void cli_check_outdir(const char *cmd, const char *flag, const char *dir);

/* The one default of --hardware, every command alike: mi300x, or h200 for a
 * model the mi300x presets do not serve on one worker (llama4-maverick). */
const char *cli_hardware_default(const char *model);

/* The latency preset key ("qwen3-30b-a3b", ...) whose model is named model
 * (a preset key or its canonical Hugging Face name), or NULL. */
const char *cli_latency_preset_for_model(const char *model);

/* Is stderr a terminal (for progress lines)? */
int cli_stderr_tty(void);
/* Progress line on stderr ("\r<label> done/total"), rate-limited; final=1 ends the line. */
void cli_progress(const char *label, size_t done, size_t total, int final);

/* ---- trace inputs (cli_trace.c) ------------------------------------------
 * Commands that read a trace take one or more inputs (repeated --trace, each
 * a file, a directory of *.jsonl or a glob: eldr_trace_inputs_expand). */
typedef struct eldr_trace eldr_trace;
typedef struct eldr_request eldr_request;
typedef struct cli_trace_inputs {
  const char **args; /* as given, in order */
  size_t n, cap;
  char **paths; /* expanded by cli_trace_expand */
  size_t n_paths;
  char label[256]; /* "a.jsonl", "rec/ (3 files)", "a.jsonl + 2 more inputs" */
} cli_trace_inputs;

/* Add one --trace value (the string is borrowed from argv). */
void cli_trace_add(const char *cmd, cli_trace_inputs *in, const char *arg);
/* Expand the inputs into paths; a missing file, an empty directory or a glob
 * without matches fails (exit 1, as an unreadable file does). */
void cli_trace_expand(const char *cmd, cli_trace_inputs *in);
/* Load every path as one trace (cli_trace_expand first); torn last lines
 * are skipped with a note on stderr; any other error fails (exit 1). */
eldr_trace *cli_trace_load(const char *cmd, const cli_trace_inputs *in);
/* The expanded paths as a NULL-terminated list for cli_check_output
 * (malloc'd array; the strings stay in's). */
const char **cli_trace_paths_z(const cli_trace_inputs *in);
void cli_trace_inputs_free(cli_trace_inputs *in);
/* Fail (exit 1) naming the first request of t in counts form: `what` needs
 * per-token rows (e.g. "sim replays per-token decode selections"). */
void cli_trace_require_tokens(const char *cmd, const char *label, const eldr_trace *t,
                              const char *what);

/* A real MoE FFN layer on this CPU (bench_moe_layer.c, OpenBLAS): median
 * seconds per forward for nex active-expert counts x nbs batch sizes into
 * res (nex * nbs; NaN where B * K < A), hidden H, expert inter NI, E
 * experts allocated, top-K. progress: a progress line on stderr. 0,
 * ELDR_EUNSUPPORTED (built without OpenBLAS), ELDR_ENOMEM. */
int cli_moe_layer_measure(size_t H, size_t NI, size_t E, size_t K, const long *ex, size_t nex,
                          const long *bs, size_t nbs, int threads, double min_time, uint64_t seed,
                          int progress, double *res);

/* `eldr trace compact` (cmd_trace_compact.c), dispatched by `eldr trace`. */
/* The trace and block table of a Mooncake file's first `requests` records
 * (0: all) with g's experts (eldr_mooncake_build; decode capped at
 * max_decode when > 0), progress on stderr unless quiet. Exits with the
 * reader's or builder's message on error. cli_mooncake.c. */
eldr_trace *cli_mooncake_build(const char *cmd, const char *path, eldr_tracegen *g, size_t requests,
                               uint32_t max_decode, int quiet, eldr_block_table *bt);

int eldr_cmd_trace_compact(int argc, char **argv);
/* `eldr trace split` (cmd_trace_split.c). */
int eldr_cmd_trace_split(int argc, char **argv);

#endif
