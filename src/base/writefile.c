/* writefile.c — write an output file whole or not at all (see
 * eldr/writefile.h). */
#define _GNU_SOURCE /* sync_file_range */
#include "eldr/writefile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int eldr_outfile_open(eldr_outfile *o, const char *path, eldr_diag *d) {
  memset(o, 0, sizeof *o);
  if (!path || !*path) return eldr_diag_fail(d, ELDR_EINVAL, "no output path");
  size_t pl = strlen(path);
  if (!(o->path = malloc(pl + 1))) return eldr_diag_fail(d, ELDR_ENOMEM, "%s: out of memory", path);
  memcpy(o->path, path, pl + 1);
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) { /* a device or a FIFO: in place */
    if (!(o->f = fopen(path, "wb"))) {
      int err = errno;
      free(o->path);
      o->path = NULL;
      return eldr_diag_fail(d, ELDR_EIO, "cannot write '%s': %s", path, strerror(err));
    }
    return ELDR_OK;
  }
  if (!(o->tmp = malloc(pl + 12))) {
    free(o->path);
    o->path = NULL;
    return eldr_diag_fail(d, ELDR_ENOMEM, "%s: out of memory", path);
  }
  memcpy(o->tmp, path, pl);
  memcpy(o->tmp + pl, ".tmp.XXXXXX", 12);
  int fd = mkstemp(o->tmp);
  if (fd >= 0) {
    (void)fchmod(fd, 0644);
    o->f = fdopen(fd, "wb");
  }
  if (!o->f) {
    int err = errno;
    if (fd >= 0) {
      close(fd);
      unlink(o->tmp);
    }
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
    return eldr_diag_fail(d, ELDR_EIO, "cannot write '%s' (a temporary file next to it: %s)", path,
                          strerror(err));
  }
  return ELDR_OK;
}

int eldr_outfile_close(eldr_outfile *o, int ok, eldr_diag *d) {
  int rc = ELDR_OK;
  if (!o->f) {
    rc = ok ? eldr_diag_fail(d, ELDR_EINVAL, "output not open") : ELDR_OK;
  } else {
    const char *name = o->tmp ? o->tmp : o->path;
    if (ok && (fflush(o->f) != 0 || ferror(o->f)))
      rc = eldr_diag_fail(d, ELDR_EIO, "%s: write failed: %s", name, strerror(errno));
    if (ok && !rc && o->tmp && fsync(fileno(o->f)) != 0)
      rc = eldr_diag_fail(d, ELDR_EIO, "%s: cannot sync: %s", name, strerror(errno));
    if (fclose(o->f) != 0 && ok && !rc)
      rc = eldr_diag_fail(d, ELDR_EIO, "%s: cannot close: %s", name, strerror(errno));
    if (o->tmp) {
      if (ok && !rc && rename(o->tmp, o->path) != 0)
        rc = eldr_diag_fail(d, ELDR_EIO, "cannot rename '%s' to '%s': %s", o->tmp, o->path, strerror(errno));
      if (!ok || rc) unlink(o->tmp);
    }
  }
  free(o->tmp);
  free(o->path);
  memset(o, 0, sizeof *o);
  return rc;
}

int eldr_write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (w == 0) {
      errno = EIO;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

#define WB_WINDOW (64ull << 20)

/* Write-behind on the temporary file: start the writeback of every window
 * completed since the last call, and wait for and drop from the page cache
 * those two windows behind (Linux; elsewhere the final fsync does it all).
 * Advisory: a failure here shows again in the final fsync. */
static void write_behind(eldr_outfile *o, unsigned long long before) {
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
  const int fd = fileno(o->f);
  for (unsigned long long w = before / WB_WINDOW; w < o->written / WB_WINDOW; w++) {
    (void)sync_file_range(fd, (off_t)(w * WB_WINDOW), (off_t)WB_WINDOW, SYNC_FILE_RANGE_WRITE);
    if (w < 2) continue;
    const unsigned long long old = (w - 2) * WB_WINDOW;
    (void)sync_file_range(fd, (off_t)old, (off_t)WB_WINDOW,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                              SYNC_FILE_RANGE_WAIT_AFTER);
    (void)posix_fadvise(fd, (off_t)old, (off_t)WB_WINDOW, POSIX_FADV_DONTNEED);
  }
#else
  (void)o;
  (void)before;
#endif
}

int eldr_outfile_write(eldr_outfile *o, const void *buf, size_t n, eldr_diag *d) {
  if (!o || !o->f || (!buf && n)) return eldr_diag_fail(d, ELDR_EINVAL, "output not open");
  const char *name = o->tmp ? o->tmp : o->path;
  if (fflush(o->f) != 0 || eldr_write_all(fileno(o->f), buf, n) != 0)
    return eldr_diag_fail(d, ELDR_EIO, "%s: write failed: %s", name, strerror(errno));
  const unsigned long long before = o->written;
  o->written += n;
  if (o->tmp) write_behind(o, before);
  return ELDR_OK;
}

int eldr_write_file(const char *path, const char *text, size_t len, eldr_diag *d) {
  eldr_outfile o;
  int rc = eldr_outfile_open(&o, path, d);
  if (rc) return rc;
  int ok = fwrite(text, 1, len, o.f) == len;
  if (!ok) eldr_diag_fail(d, ELDR_EIO, "%s: write failed: %s", path, strerror(errno));
  rc = eldr_outfile_close(&o, ok, d);
  return ok ? rc : ELDR_EIO;
}
