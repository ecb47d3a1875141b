/* eldr/preset_files.h — the model-description files (format layer): a
 * latency calibration override file and a trace-generator workload chosen
 * by name ("custom:FILE" reads a JSON workload file). The parsing itself is
 * in core (eldr_latency_parse_overrides, eldr_tracegen_workload_parse); this
 * module only reads the files (bounded, eldr/readfile.h).
 *
 * Ownership: *out generators belong to the caller (eldr_tracegen_free).
 * Errors: ELDR_EIO (a file that cannot be opened or read; the message names
 * the path), ELDR_ERANGE (a file over its size bound), ELDR_ENOMEM, and the
 * parsers' errors prefixed with the path.
 * Threads: any thread; no state.
 */
#ifndef ELDR_PRESET_FILES_H
#define ELDR_PRESET_FILES_H

#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/latency.h"
#include "eldr/tracegen.h"

/* eldr_latency_parse_overrides on the contents of path (at most 16 MiB). */
int eldr_latency_load_overrides(const char *path, eldr_latency_model *m, eldr_diag *d);
/* eldr_latency_parse_full (a complete model) on the contents of path. */
int eldr_latency_load_full(const char *path, eldr_latency_model *m, eldr_diag *d);

/* eldr_tracegen_new_workload for a workload by name: a preset ("realistic",
 * adapted to the shape by eldr_tracegen_realistic_for_shape, or the
 * paper-shaped "task", "language"; eldr_tracegen_workload_preset) or "custom:FILE" with a
 * JSON workload description (at most 64 MiB). */
int eldr_tracegen_new(const eldr_shape *shape, const char *model_name, const char *workload,
                      uint64_t seed, eldr_tracegen **out, eldr_diag *d);

#endif
