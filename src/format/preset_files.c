/* preset_files.c — latency override and workload files (see
 * eldr/preset_files.h): read the file, hand the text to core's parser. */
#include "eldr/preset_files.h"

#include <stdlib.h>
#include <string.h>

#include "eldr/readfile.h"

#define LATENCY_FILE_MAX ((size_t)16 << 20)
#define WORKLOAD_FILE_MAX ((size_t)64 << 20)

int eldr_latency_load_overrides(const char *path, eldr_latency_model *m, eldr_diag *d) {
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "latency overrides: NULL path");
  char *buf;
  size_t len;
  int rc = eldr_read_file(path, LATENCY_FILE_MAX, "latency overrides", &buf, &len, d);
  if (rc) return rc;
  rc = eldr_latency_parse_overrides(buf, len, m, d);
  if (rc < 0) eldr_diag_prefix(d, "%s", path);
  free(buf);
  return rc;
}

int eldr_tracegen_new(const eldr_shape *shape, const char *model_name, const char *workload,
                      uint64_t seed, eldr_tracegen **out, eldr_diag *d) {
  if (out) *out = NULL;
  if (!workload) return eldr_diag_fail(d, ELDR_EINVAL, "workload missing");
  eldr_tracegen_workload w;
  int rc;
  if (!strncmp(workload, "custom:", 7)) {
    char *buf;
    size_t len;
    const char *path = workload + 7;
    if ((rc = eldr_read_file(path, WORKLOAD_FILE_MAX, "workload file", &buf, &len, d))) return rc;
    rc = eldr_tracegen_workload_parse(buf, len, &w, d);
    free(buf);
    if (rc) {
      eldr_diag_prefix(d, "%s", path);
      return rc;
    }
  } else if ((rc = eldr_tracegen_workload_preset(workload, &w, d))) {
    return rc;
  }
  return eldr_tracegen_new_workload(shape, model_name, &w, seed, out, d);
}
