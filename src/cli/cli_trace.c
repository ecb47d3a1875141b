/* cli_trace.c — trace inputs for the commands (see cli.h): repeated
 * --trace values, their expansion (files, directories, globs), loading them
 * as one trace with torn-line notes, and the check for commands that need
 * per-token rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/grow.h"
#include "eldr/trace.h"

void cli_trace_add(const char *cmd, cli_trace_inputs *in, const char *arg) {
  if (!*arg) cli_usage_error(cmd, "--trace: empty path");
  if (eldr_grow_array(in->args, in->cap, in->n + 1)) cli_fail(cmd, "out of memory");
  in->args[in->n++] = arg;
}

void cli_trace_expand(const char *cmd, cli_trace_inputs *in) {
  eldr_diag d = {{0}};
  int rc = eldr_trace_inputs_expand(in->args, in->n, &in->paths, &in->n_paths, &d);
  if (rc == ELDR_ENOMEM) cli_fail(cmd, "out of memory");
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  if (in->n == 1 && in->n_paths == 1)
    snprintf(in->label, sizeof in->label, "%s", in->paths[0]);
  else if (in->n == 1)
    snprintf(in->label, sizeof in->label, "%s (%zu files)", in->args[0], in->n_paths);
  else
    snprintf(in->label, sizeof in->label, "%s + %zu more inputs (%zu files)", in->args[0],
             in->n - 1, in->n_paths);
}

eldr_trace *cli_trace_load(const char *cmd, const cli_trace_inputs *in) {
  eldr_trace *t = NULL;
  eldr_trace_read_info info;
  eldr_diag d = {{0}};
  int rc = eldr_trace_load_inputs(in->paths, in->n_paths, &t, &info, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  if (info.torn)
    fprintf(stderr, "eldr %s: note: %s%s\n", cmd, info.note,
            info.torn > 1 ? " (and more files with a torn last line)" : "");
  return t;
}

const char **cli_trace_paths_z(const cli_trace_inputs *in) {
  const char **z = calloc(in->n_paths + 1, sizeof *z);
  if (!z) return NULL;
  for (size_t i = 0; i < in->n_paths; i++) z[i] = in->paths[i];
  return z;
}

void cli_trace_inputs_free(cli_trace_inputs *in) {
  eldr_trace_inputs_free(in->paths, in->n_paths);
  free(in->args);
  memset(in, 0, sizeof *in);
}

void cli_trace_require_tokens(const char *cmd, const char *label, const eldr_trace *t,
                              const char *what) {
  for (size_t i = 0; i < t->n; i++)
    if (eldr_request_is_counts(&t->req[i]))
      cli_fail(cmd,
               "%s: request '%.80s' is in the counts form (per-layer expert counts, no per-token "
               "rows); %s: use a per-token trace",
               label ? label : "trace", t->req[i].id, what);
}
