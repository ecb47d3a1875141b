#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/latency.h"
#include "eldr/tracegen.h"

/* "eldr <cmd>: <message>": a message that already starts with the
 * command's name ("eldr serve: ...", "worker: ..." from a library that
 * names its module after the command) is not prefixed twice. */
static void vreport(const char *cmd, const char *fmt, va_list ap) {
  char msg[4096];
  vsnprintf(msg, sizeof msg, fmt, ap);
  const char *m = msg;
  if (!strncmp(m, "eldr ", 5)) m += 5;
  const size_t n = strlen(cmd);
  if (!strncmp(m, cmd, n) && m[n] == ':' && m[n + 1] == ' ') m += n + 2;
  else m = msg;
  fprintf(stderr, "eldr %s: %s\n", cmd, m);
}

void cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(cmd, fmt, ap);
  va_end(ap);
  exit(2);
}

void cli_fail(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(cmd, fmt, ap);
  va_end(ap);
  exit(1);
}

void cli_fail_at(const char *cmd, const char *where, const char *msg) {
  const size_t n = strcspn(where, " ");
  if (n && !strncmp(msg, where, n)) cli_fail(cmd, "%s", msg); /* it names its file already */
  cli_fail(cmd, "%s: %s", where, msg);
}

void cli_check_output(const char *cmd, const char *flag, const char *path,
                      const char *const *inputs) {
  if (!*path) cli_usage_error(cmd, "%s: empty path", flag);
  struct stat st;
  int exists = stat(path, &st) == 0;
  for (size_t i = 0; exists && inputs && inputs[i]; i++) {
    struct stat in;
    if (stat(inputs[i], &in) == 0 && in.st_dev == st.st_dev && in.st_ino == st.st_ino)
      cli_usage_error(cmd, "%s %s: refusing to write over the input %s", flag, path, inputs[i]);
  }
  /* the rest is this machine's file system: an output that cannot be
   * written (exit 1, as an input that cannot be read) */
  if (exists && S_ISDIR(st.st_mode)) cli_fail(cmd, "%s %s: is a directory", flag, path);
  if (exists) {
    if (access(path, W_OK)) cli_fail(cmd, "%s %s: %s", flag, path, strerror(errno));
    return;
  }
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  const char *d = dirname(dir);
  struct stat ds;
  if (stat(d, &ds)) cli_fail(cmd, "%s %s: directory %s: %s", flag, path, d, strerror(errno));
  if (!S_ISDIR(ds.st_mode)) cli_fail(cmd, "%s %s: %s is not a directory", flag, path, d);
  if (access(d, W_OK | X_OK)) cli_fail(cmd, "%s %s: directory %s: %s", flag, path, d, strerror(errno));
}

void cli_check_outdir(const char *cmd, const char *flag, const char *dir) {
  if (!*dir) cli_usage_error(cmd, "%s: empty path", flag);
  struct stat st;
  if (stat(dir, &st) == 0) {
    if (!S_ISDIR(st.st_mode)) cli_fail(cmd, "%s %s: not a directory", flag, dir);
    if (access(dir, W_OK | X_OK)) cli_fail(cmd, "%s %s: %s", flag, dir, strerror(errno));
    return;
  }
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", dir);
  const char *p = dirname(parent);
  if (stat(p, &st)) cli_fail(cmd, "%s %s: directory %s: %s", flag, dir, p, strerror(errno));
  if (!S_ISDIR(st.st_mode)) cli_fail(cmd, "%s %s: %s is not a directory", flag, dir, p);
  if (access(p, W_OK | X_OK)) cli_fail(cmd, "%s %s: directory %s: %s", flag, dir, p, strerror(errno));
}

const char *cli_hardware_default(const char *model) {
  return model && !strcmp(model, "llama4-maverick") ? "h200" : "mi300x";
}

void cli_getopt_reset(void) {
  optind = 1;
  opterr = 0;
}

void cli_bad_option(const char *cmd, int argc, char **argv, int opt) {
  const char *arg = (optind - 1 >= 0 && optind - 1 < argc) ? argv[optind - 1] : "?";
  /* optstrings start with ':' so that a missing value is reported as ':' */
  if (opt == ':') cli_usage_error(cmd, "option '%s' needs a value (see --help)", arg);
  cli_usage_error(cmd, "unknown or incomplete option '%s' (see --help)", arg);
}

long cli_parse_long(const char *cmd, const char *flag, const char *val, long min, long max) {
  char *end = NULL;
  errno = 0;
  long v = strtol(val, &end, 10);
  if (errno || !end || end == val || *end)
    cli_usage_error(cmd, "%s: '%s' is not an integer", flag, val);
  if (v < min || v > max)
    cli_usage_error(cmd, "%s: %ld out of range [%ld, %ld]", flag, v, min, max);
  return v;
}

double cli_parse_double(const char *cmd, const char *flag, const char *val, double min,
                        double max) {
  char *end = NULL;
  errno = 0;
  double v = strtod(val, &end);
  if (errno || !end || end == val || *end || !isfinite(v))
    cli_usage_error(cmd, "%s: '%s' is not a number", flag, val);
  if (v < min || v > max) cli_usage_error(cmd, "%s: %g out of range [%g, %g]", flag, v, min, max);
  return v;
}

uint64_t cli_parse_u64(const char *cmd, const char *flag, const char *val) {
  char *end = NULL;
  errno = 0;
  if (val[0] == '-') cli_usage_error(cmd, "%s: '%s' must be non-negative", flag, val);
  unsigned long long v = strtoull(val, &end, 10);
  if (errno || !end || end == val || *end)
    cli_usage_error(cmd, "%s: '%s' is not a non-negative integer", flag, val);
  return (uint64_t)v;
}

/* The items of a comma-separated list: *copy is val's copy cut in place,
 * *tok (n entries) point into it; both the caller's to free. A usage error
 * (exit 2) when an item is empty. */
static size_t split_list(const char *cmd, const char *flag, const char *val, char **copy, char ***tok) {
  size_t n = 1;
  for (const char *p = val; *p; p++)
    if (*p == ',') n++;
  *copy = strdup(val);
  *tok = calloc(n, sizeof **tok);
  if (!*copy || !*tok) cli_fail(cmd, "out of memory");
  size_t i = 0;
  char *save = NULL;
  for (char *t = strtok_r(*copy, ",", &save); t && i < n; t = strtok_r(NULL, ",", &save)) (*tok)[i++] = t;
  if (i != n || !val[0]) cli_usage_error(cmd, "%s: '%s' is not a comma-separated list", flag, val);
  return n;
}

size_t cli_parse_double_list(const char *cmd, const char *flag, const char *val, double min,
                             double max, double **out) {
  char *copy, **tok;
  size_t n = split_list(cmd, flag, val, &copy, &tok);
  double *v = calloc(n, sizeof *v);
  if (!v) cli_fail(cmd, "out of memory");
  for (size_t i = 0; i < n; i++) v[i] = cli_parse_double(cmd, flag, tok[i], min, max);
  free(tok);
  free(copy);
  *out = v;
  return n;
}

size_t cli_parse_long_list(const char *cmd, const char *flag, const char *val, long min,
                           long max, long **out) {
  char *copy, **tok;
  size_t n = split_list(cmd, flag, val, &copy, &tok);
  long *v = calloc(n, sizeof *v);
  if (!v) cli_fail(cmd, "out of memory");
  for (size_t i = 0; i < n; i++) v[i] = cli_parse_long(cmd, flag, tok[i], min, max);
  free(tok);
  free(copy);
  *out = v;
  return n;
}

int cli_stderr_tty(void) { return isatty(2); }

void cli_progress(const char *label, size_t done, size_t total, int final) {
  static double last = 0;
  double now = eldr_clock_now();
  if (!final && now - last < (cli_stderr_tty() ? 0.2 : 2.0)) return;
  last = now;
  if (total)
    fprintf(stderr, "\r%s %zu/%zu (%.0f%%)", label, done, total, 100.0 * (double)done / (double)total);
  else
    fprintf(stderr, "\r%s %zu", label, done);
  if (final || !cli_stderr_tty()) fputc('\n', stderr);
  fflush(stderr);
}

const char *cli_latency_preset_for_model(const char *model) {
  if (!model) return NULL;
  for (size_t i = 0; eldr_latency_model_name(i); i++) {
    eldr_shape s;
    char canon[128];
    if (eldr_tracegen_model_shape(eldr_latency_model_name(i), &s, canon, sizeof canon, NULL) == 0 &&
        (!strcmp(canon, model) || !strcmp(eldr_latency_model_name(i), model)))
      return eldr_latency_model_name(i);
  }
  return NULL;
}
