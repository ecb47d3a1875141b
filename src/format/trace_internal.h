/* trace_internal.h — the seams between the trace line parser (trace.c), its
 * counts-form part (trace_counts.c) and the whole-file loaders
 * (trace_load.c, trace_stream.c). Internal to src/format. */
#ifndef ELDR_FORMAT_TRACE_INTERNAL_H
#define ELDR_FORMAT_TRACE_INTERNAL_H

#include <stddef.h>

#include "eldr/error.h"
#include "eldr/trace.h"
#include "format/trace_json.h"

/* Parse one request line into t (as eldr_trace_parse_line), with errors
 * naming src:lineno (src NULL: "line N"). d may be NULL. Thread-safe on
 * distinct traces. */
int eldr__trace_parse_line_src(eldr_trace *t, const char *line, size_t len, size_t lineno,
                               const char *src, eldr_diag *d);

/* The counts-form fields of one line: f[0..3] = prefill_tokens,
 * decode_tokens, prefill_counts, decode_counts (f[3].p NULL or "null":
 * unknown). On success *pc (and *dc, or NULL) are malloc'd L*E matrices
 * that passed eldr_counts_rows_check; errors name the line and field. */
int eldr__trace_parse_counts_fields(const lctx *c, const span f[4], const eldr_shape *sh,
                                    uint32_t *n_pre, uint32_t *n_dec, uint32_t **pc,
                                    uint32_t **dc);

/* A file's last line without a newline: parsed into t, or, when it is not
 * one complete JSON object (a torn write), skipped with a note in info
 * (counted; info may be NULL). Other errors fail as usual. */
int eldr__trace_parse_last_line(eldr_trace *t, const char *line, size_t len, size_t lineno,
                                const char *src, eldr_trace_read_info *info, eldr_diag *d);

#endif
