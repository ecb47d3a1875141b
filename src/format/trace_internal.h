/* trace_internal.h — the seam between the trace line parser (trace.c) and
 * the whole-file loader (trace_load.c). Internal to src/format. */
#ifndef ELDR_FORMAT_TRACE_INTERNAL_H
#define ELDR_FORMAT_TRACE_INTERNAL_H

#include <stddef.h>

#include "eldr/error.h"
#include "eldr/trace.h"

/* Parse one request line into t (as eldr_trace_parse_line), with errors
 * naming src:lineno (src NULL: "line N"). d may be NULL. Thread-safe on
 * distinct traces. */
int eldr__trace_parse_line_src(eldr_trace *t, const char *line, size_t len, size_t lineno,
                               const char *src, eldr_diag *d);

#endif
