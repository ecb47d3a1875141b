/* eldr/readfile.h — read a whole file into memory, with a size bound
 * (base layer). The one read-whole-file loop of the project.
 *
 * Ownership: *out is malloc'd, NUL-terminated (the NUL is not counted in
 * *len), and the caller frees it; on error *out is NULL. eldr_read_fd does
 * not close fd.
 * Errors: ELDR_EINVAL (no path), ELDR_EIO (cannot open, or a read error;
 * d names the path and the system error), ELDR_ERANGE (more than max
 * bytes), ELDR_ENOMEM. Messages read "<what> '<path>': ..." or, with what
 * NULL, "<path>: ...".
 * Threads: any thread; no state.
 */
#ifndef ELDR_READFILE_H
#define ELDR_READFILE_H

#include <stddef.h>

#include "eldr/error.h"

int eldr_read_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                   eldr_diag *d);

/* Read path (as eldr_read_file) and hand its text to parse(text, len, ctx,
 * d); a parse error's message is prefixed with the file's name as above.
 * Returns 0, the read error or the parser's. */
int eldr_parse_file(const char *path, size_t max, const char *what,
                    int (*parse)(const char *text, size_t len, void *ctx, eldr_diag *d),
                    void *ctx, eldr_diag *d);

/* The same from an open descriptor (a pipe or special file included); path
 * only names it in messages. */
int eldr_read_fd(int fd, const char *path, size_t max, const char *what, char **out, size_t *len,
                 eldr_diag *d);

#endif
