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

/* Prints "eldr <cmd>: <message>\n" to stderr and exits with status 2. */
_Noreturn void cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prints "eldr <cmd>: <message>\n" to stderr and exits with status 1. */
_Noreturn void cli_fail(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

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
 * (NULL-terminated; NULL entries before the end are not allowed). Exits with a
 * usage error (status 2) naming the flag and the cause otherwise. Creates
 * nothing. */
void cli_check_output(const char *cmd, const char *flag, const char *path,
                      const char *const *inputs);

/* The latency preset key ("qwen3-30b-a3b", ...) whose model is named model
 * (a preset key or its canonical Hugging Face name), or NULL. */
const char *cli_latency_preset_for_model(const char *model);

/* Is stderr a terminal (for progress lines)? */
int cli_stderr_tty(void);
/* Progress line on stderr ("\r<label> done/total"), rate-limited; final=1 ends the line. */
void cli_progress(const char *label, size_t done, size_t total, int final);

#endif
