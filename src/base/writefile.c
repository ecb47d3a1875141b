/* writefile.c — write an output file whole or not at all (see
 * eldr/writefile.h). */
#include "eldr/writefile.h"

#include <errno.h>
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

int eldr_write_file(const char *path, const char *text, size_t len, eldr_diag *d) {
  eldr_outfile o;
  int rc = eldr_outfile_open(&o, path, d);
  if (rc) return rc;
  int ok = fwrite(text, 1, len, o.f) == len;
  if (!ok) eldr_diag_fail(d, ELDR_EIO, "%s: write failed: %s", path, strerror(errno));
  rc = eldr_outfile_close(&o, ok, d);
  return ok ? rc : ELDR_EIO;
}
