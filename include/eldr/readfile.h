/* eldr/readfile.h — read a whole file into memory, with a size bound
 * (base layer).
 *
 * Ownership: *out is malloc'd, NUL-terminated (not counted in *len), and
 * the caller frees it; on error *out is NULL.
 * Errors: ELDR_EIO (cannot open, or a read error; d names the path and the
 * system error), ELDR_ERANGE (larger than max bytes), ELDR_ENOMEM.
 * Messages start with "<what> '<path>'" (what defaults to "file").
 * Threads: any thread; no state.
 */
#ifndef ELDR_READFILE_H
#define ELDR_READFILE_H

#include <stddef.h>

#include "eldr/error.h"

int eldr_read_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                   eldr_diag *d);

#endif
