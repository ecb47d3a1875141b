/* eldr/writefile.h — write an output file whole or not at all (base
 * layer). The one temporary-file-and-rename writer of the project.
 *
 * eldr_outfile_open opens a temporary file next to path (mkstemp, mode
 * 0644); eldr_outfile_close(ok = 1) flushes, syncs and closes it and
 * renames it over path, so a reader never sees half a file and a failed
 * write leaves the old file as it was; ok = 0 (or any failure) closes and
 * removes the temporary file. A path that exists and is not a regular file
 * (/dev/null, a FIFO, a terminal) is opened and written in place: renaming
 * over it would replace the device node itself (run as root,
 * `-o /dev/null` once turned /dev/null into a regular file).
 *
 * eldr_outfile_write writes a large output chunk by chunk, past the
 * stream's buffer, with write-behind on Linux: the writeback of each
 * completed 64 MiB window starts at once, and a window is waited for and
 * dropped from the page cache once two more after it are complete. So a
 * multi-gigabyte output neither fills memory with dirty pages nor leaves
 * its whole writeback to the final sync (a reader reads it back from
 * disk); an output under 192 MiB stays cached as with fwrite. The bytes
 * are the same either way.
 *
 * Ownership: o belongs to the caller between open and close; close frees
 * what open allocated, whatever it returns. o->f is the stream to write.
 * Errors: ELDR_EINVAL (no path), ELDR_ENOMEM, ELDR_EIO (cannot create,
 * write, sync, close or rename: d names the path and the system error).
 * Threads: any thread; no shared state.
 */
#ifndef ELDR_WRITEFILE_H
#define ELDR_WRITEFILE_H

#include <stdio.h>

#include "eldr/error.h"

typedef struct eldr_outfile {
  FILE *f;    /* the stream to write */
  char *tmp;  /* the temporary file, NULL when written in place */
  char *path; /* the output */
  unsigned long long written; /* bytes through eldr_outfile_write */
} eldr_outfile;

int eldr_outfile_open(eldr_outfile *o, const char *path, eldr_diag *d);
/* ok: the writes succeeded, keep the file; returns the first failure. */
int eldr_outfile_close(eldr_outfile *o, int ok, eldr_diag *d);
/* n bytes of buf at the end of the output (after what o->f buffered):
 * ELDR_OK or ELDR_EIO (d names the path and the system error). */
int eldr_outfile_write(eldr_outfile *o, const void *buf, size_t n, eldr_diag *d);
/* All n bytes of buf to fd (retrying short writes and EINTR): 0, or -1
 * with errno set. */
int eldr_write_all(int fd, const void *buf, size_t n);
/* text (len bytes) as the whole of path. */
int eldr_write_file(const char *path, const char *text, size_t len, eldr_diag *d);

#endif
