/* eldr/mooncake_io.h — the Mooncake trace format reader (format layer):
 * one JSON object per line, as the public Mooncake FAST'25 traces
 * (kvcache-ai/Mooncake, FAST25-release/traces) and
 * ../shared/traces/mooncake-conversation-dev.jsonl write them:
 *   timestamp      arrival, milliseconds (a number >= 0)
 *   input_length   prompt tokens (an integer, 1 .. ELDR_MOONCAKE_MAX_INPUT)
 *   output_length  generated tokens (an integer, 0 .. ELDR_MOONCAKE_MAX_OUTPUT)
 *   hash_ids       the prompt's 512-token blocks as prefix hash ids: exactly
 *                  ceil(input_length / 512) integers in [0, 2^53]
 * Other fields are ignored; blank lines are skipped; a line longer than
 * ELDR_MOONCAKE_MAX_LINE bytes, bad JSON, a missing or mistyped field or a
 * value out of range is an error naming the line (1-based) and the field,
 * e.g. "trace.jsonl:7: field 'hash_ids': 3 ids for 2000 tokens (expected 4)".
 *
 * Ownership: *out is the caller's (eldr_mooncake_free). Errors:
 * ELDR_EPARSE, ELDR_ERANGE, ELDR_EEMPTY (no record), ELDR_ENOMEM, ELDR_EIO
 * (load). Threads: any.
 */
#ifndef ELDR_MOONCAKE_IO_H
#define ELDR_MOONCAKE_IO_H

#include <stddef.h>

#include "eldr/error.h"
#include "eldr/mooncake.h"

#define ELDR_MOONCAKE_MAX_LINE ((size_t)1 << 20)
#define ELDR_MOONCAKE_MAX_RECORDS ((size_t)1 << 24)

/* Parse a buffer; name (may be NULL) prefixes the messages. At most
 * max_records records are read (0: ELDR_MOONCAKE_MAX_RECORDS); the lines
 * after them are not read. */
int eldr_mooncake_parse(const char *buf, size_t len, const char *name, size_t max_records,
                        eldr_mooncake *out, eldr_diag *d);

/* Read and parse a file (eldr_mooncake_parse). */
int eldr_mooncake_load(const char *path, size_t max_records, eldr_mooncake *out, eldr_diag *d);

#endif
