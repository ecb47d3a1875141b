/* readfile.c — bounded whole-file read. */
#include "eldr/readfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"

int eldr_read_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                   eldr_diag *d) {
  *out = NULL;
  if (len) *len = 0;
  if (!what) what = "file";
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "%s: no path", what);
  FILE *f = fopen(path, "rb");
  if (!f) return eldr_diag_fail(d, ELDR_EIO, "%s '%s': cannot open: %s", what, path, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0;
  int rc = ELDR_OK;
  for (;;) {
    if (n + 1 >= cap && eldr_grow(&buf, &cap, n + 4096, 1, 8192)) {
      rc = eldr_diag_fail(d, ELDR_ENOMEM, "%s '%s': out of memory", what, path);
      break;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (n > max) {
      rc = eldr_diag_fail(d, ELDR_ERANGE, "%s '%s': larger than %zu bytes", what, path, max);
      break;
    }
    if (got == 0) {
      if (ferror(f))
        rc = eldr_diag_fail(d, ELDR_EIO, "%s '%s': read error: %s", what, path, strerror(errno));
      break;
    }
  }
  fclose(f);
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return ELDR_OK;
}
