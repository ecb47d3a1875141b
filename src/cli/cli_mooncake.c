/* cli_mooncake.c — a Mooncake trace's structure with generated experts
 * (eldr/mooncake.h), for `eldr trace gen --from-mooncake` and `eldr sim
 * --serve-mooncake`: one loader with progress and the command's errors. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "eldr/mooncake_io.h"

static void mc_progress(void *ctx, size_t done, size_t total) {
  cli_progress((const char *)ctx, done, total, done == total);
}

eldr_trace *cli_mooncake_build(const char *cmd, const char *path, eldr_tracegen *g, size_t requests,
                               uint32_t max_decode, int quiet, eldr_block_table *bt) {
  eldr_diag d = {{0}};
  eldr_mooncake m;
  int rc = eldr_mooncake_load(path, requests, &m, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  eldr_trace *t = NULL;
  char label[96];
  snprintf(label, sizeof label, "%s: experts of %s's blocks", cmd, path);
  rc = eldr_mooncake_build(g, &m, requests, max_decode, &t, bt, quiet ? NULL : mc_progress, label, &d);
  eldr_mooncake_free(&m);
  if (rc) cli_fail(cmd, "%s: %s", path, eldr_diag_msg(&d, rc));
  return t;
}
