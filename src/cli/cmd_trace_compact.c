/* cmd_trace_compact.c — `eldr trace compact IN... -o OUT`: rewrite traces in
 * the counts form (per-layer per-expert counts instead of per-token rows),
 * streaming: one request in memory at a time, whatever the input size. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "eldr/writefile.h"
#include "eldr/trace.h"

static const char COMPACT_HELP[] =
    "usage: eldr trace compact TRACE... -o OUT [options]\n"
    "\n"
    "Rewrite traces (files, directories of *.jsonl, globs; per-token or counts form)\n"
    "as one trace in the counts form: per request, prefill_counts and decode_counts\n"
    "(one row of num_experts counts per MoE layer) instead of one row per token. Ids,\n"
    "domains, prompts, arrivals and serve objects are kept; prefill_gates are not\n"
    "(the gate and logit representations need the per-token form). Everything that\n"
    "needs only counts (eldr fit with count/binary, eldr rho, trace stats (a) and (c))\n"
    "gives the same result on the output. See docs/trace.md.\n"
    "\n"
    "  -o, --output FILE   trace to write ('-' = stdout)                (required)\n"
    "      --no-decode     drop the decode counts (keep decode_tokens)\n"
    "  -q, --quiet         no summary on stderr\n"
    "  -h, --help          this help\n";

typedef struct compact_ctx {
  FILE *f;
  uint32_t *pre, *dec;
  size_t cap; /* cells the buffers hold */
  int no_decode;
  size_t gates_dropped;
  int werr; /* a write error (errno in err) */
  int err;
} compact_ctx;

static int compact_one(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  (void)index;
  compact_ctx *c = ud;
  const size_t cells = eldr_shape_cells(&t->shape);
  if (cells > c->cap) { /* the shape is fixed by the first line: sized once */
    free(c->pre);
    free(c->dec);
    c->pre = malloc(cells * sizeof *c->pre);
    c->dec = malloc(cells * sizeof *c->dec);
    if (!c->pre || !c->dec) return ELDR_ENOMEM;
    c->cap = cells;
  }
  eldr_request q = *r;
  if (!eldr_request_is_counts(r)) {
    eldr_trace_request_counts(t, r, 0, c->pre);
    eldr_trace_request_counts(t, r, 1, c->dec);
    q.prefill_counts = c->pre;
    q.decode_counts = c->dec;
  }
  if (r->prefill_gates) c->gates_dropped++;
  q.prefill = q.decode = NULL;
  q.prefill_gates = NULL;
  if (c->no_decode) q.decode_counts = NULL;
  int rc = eldr_trace_write_request(c->f, t, &q);
  if (rc == ELDR_OK && ferror(c->f)) rc = ELDR_EIO;
  if (rc == ELDR_EIO) {
    c->werr = 1;
    c->err = errno;
  }
  return rc;
}

static long long file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

int eldr_cmd_trace_compact(int argc, char **argv) {
  const char *cmd = "trace compact";
  const char *out_path = NULL;
  int quiet = 0, no_decode = 0;
  static const struct option lo[] = {{"output", required_argument, 0, 'o'},
                                     {"no-decode", no_argument, 0, 1},
                                     {"quiet", no_argument, 0, 'q'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":o:qh", lo, NULL)) != -1) {
    switch (c) {
    case 'o': out_path = optarg; break;
    case 1: no_decode = 1; break;
    case 'q': quiet = 1; break;
    case 'h': fputs(COMPACT_HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind >= argc) cli_usage_error(cmd, "a trace to compact is required (see --help)");
  if (!out_path) cli_usage_error(cmd, "--output is required (see --help)");
  cli_trace_inputs tin = {0};
  for (int i = optind; i < argc; i++) cli_trace_add(cmd, &tin, argv[i]);
  cli_trace_expand(cmd, &tin);
  const int to_stdout = !strcmp(out_path, "-");
  if (!to_stdout) {
    const char **inputs = cli_trace_paths_z(&tin);
    if (!inputs) cli_fail(cmd, "out of memory");
    cli_check_output(cmd, "-o", out_path, inputs);
    free(inputs);
  }

  /* a temporary file next to the output, renamed over it when complete (a
   * device such as /dev/null is written in place) */
  eldr_outfile of = {0};
  compact_ctx cx = {.f = stdout, .no_decode = no_decode};
  if (!to_stdout) {
    eldr_diag od = {{0}};
    if (eldr_outfile_open(&of, out_path, &od)) cli_fail(cmd, "%s", od.msg);
    cx.f = of.f;
  }
  static char iobuf[1 << 20];
  setvbuf(cx.f, iobuf, _IOFBF, sizeof iobuf);
  eldr_trace_read_info info;
  eldr_diag d = {{0}};
  int rc = eldr_trace_foreach_inputs(tin.paths, tin.n_paths, compact_one, &cx, &info, &d);
  if (rc == ELDR_OK && fflush(cx.f)) {
    cx.werr = 1;
    cx.err = errno;
    rc = ELDR_EIO;
  }
  free(cx.pre);
  free(cx.dec);
  if (!to_stdout) {
    eldr_diag od = {{0}};
    if (eldr_outfile_close(&of, rc == ELDR_OK, &od) && rc == ELDR_OK)
      cli_fail(cmd, "writing '%s': %s", out_path, od.msg);
  }
  if (rc) {
    if (cx.werr) cli_fail(cmd, "writing '%s': %s", to_stdout ? "stdout" : out_path, strerror(cx.err));
    if (rc == ELDR_ENOMEM && !d.msg[0]) cli_fail(cmd, "out of memory");
    cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (info.torn)
    fprintf(stderr, "eldr %s: note: %s%s\n", cmd, info.note,
            info.torn > 1 ? " (and more files with a torn last line)" : "");
  if (!quiet) {
    long long in_bytes = 0;
    for (size_t i = 0; i < tin.n_paths; i++) in_bytes += file_size(tin.paths[i]);
    fprintf(stderr, "eldr %s: %zu requests from %zu file%s (%lld bytes)", cmd, info.requests,
            info.files, info.files == 1 ? "" : "s", in_bytes);
    long long out_bytes = to_stdout ? -1 : file_size(out_path);
    if (out_bytes > 0)
      fprintf(stderr, " -> %s (%lld bytes, %.1fx smaller)", out_path, out_bytes,
              (double)in_bytes / (double)out_bytes);
    fputc('\n', stderr);
    if (cx.gates_dropped)
      fprintf(stderr, "eldr %s: note: prefill_gates of %zu requests dropped (the counts form has "
              "none)\n", cmd, cx.gates_dropped);
  }
  cli_trace_inputs_free(&tin);
  return 0;
}
