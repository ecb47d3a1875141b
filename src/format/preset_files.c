/* preset_files.c — latency override and workload files (see
 * eldr/preset_files.h): read the file, hand the text to core's parser. */
#include "eldr/preset_files.h"

#include <stdlib.h>
#include <string.h>

#include "eldr/readfile.h"

#define LATENCY_FILE_MAX ((size_t)16 << 20)
#define WORKLOAD_FILE_MAX ((size_t)64 << 20)

static int parse_latency(const char *text, size_t len, void *m, eldr_diag *d) {
  return eldr_latency_parse_overrides(text, len, m, d);
}

static int parse_latency_full(const char *text, size_t len, void *m, eldr_diag *d) {
  return eldr_latency_parse_full(text, len, m, d);
}

static int parse_workload(const char *text, size_t len, void *w, eldr_diag *d) {
  return eldr_tracegen_workload_parse(text, len, w, d);
}

int eldr_latency_load_overrides(const char *path, eldr_latency_model *m, eldr_diag *d) {
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "latency overrides: NULL path");
  return eldr_parse_file(path, LATENCY_FILE_MAX, NULL, parse_latency, m, d);
}

int eldr_latency_load_full(const char *path, eldr_latency_model *m, eldr_diag *d) {
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "latency model: NULL path");
  return eldr_parse_file(path, LATENCY_FILE_MAX, NULL, parse_latency_full, m, d);
}

int eldr_tracegen_new(const eldr_shape *shape, const char *model_name, const char *workload,
                      uint64_t seed, eldr_tracegen **out, eldr_diag *d) {
  if (out) *out = NULL;
  if (!workload) return eldr_diag_fail(d, ELDR_EINVAL, "workload missing");
  eldr_tracegen_workload w;
  int rc;
  if (!strncmp(workload, "custom:", 7))
    rc = eldr_parse_file(workload + 7, WORKLOAD_FILE_MAX, "workload file", parse_workload, &w, d);
  else
    rc = eldr_tracegen_workload_preset(workload, &w, d);
  if (rc) return rc;
  if (!strcmp(workload, "realistic") && shape)
    eldr_tracegen_realistic_for_shape(&w, shape->top_k, shape->num_experts);
  return eldr_tracegen_new_workload(shape, model_name, &w, seed, out, d);
}
