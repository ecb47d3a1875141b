/* readfile.c — bounded whole-file read. */
#include "eldr/readfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eldr/grow.h"

/* "<what> '<path>'" or "<path>" */
static void name(char *dst, size_t n, const char *path, const char *what) {
  if (what)
    snprintf(dst, n, "%s '%s'", what, path);
  else
    snprintf(dst, n, "%s", path);
}

int eldr_read_fd(int fd, const char *path, size_t max, const char *what, char **out, size_t *len,
                 eldr_diag *d) {
  *out = NULL;
  if (len) *len = 0;
  char *buf = NULL;
  size_t n = 0, cap = 0;
  char nm[512];
  for (;;) {
    if (n + 1 >= cap && eldr_grow(&buf, &cap, n + 4096, 1, 1 << 16)) {
      free(buf);
      name(nm, sizeof nm, path, what);
      return eldr_diag_fail(d, ELDR_ENOMEM, "%s: out of memory", nm);
    }
    ssize_t r = read(fd, buf + n, cap - n - 1);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      free(buf);
      name(nm, sizeof nm, path, what);
      return eldr_diag_fail(d, ELDR_EIO, "%s: read failed: %s", nm, strerror(err));
    }
    if (r == 0) break;
    n += (size_t)r;
    if (n > max) {
      free(buf);
      name(nm, sizeof nm, path, what);
      return eldr_diag_fail(d, ELDR_ERANGE, "%s: larger than %zu bytes", nm, max);
    }
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return ELDR_OK;
}

int eldr_read_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                   eldr_diag *d) {
  *out = NULL;
  if (len) *len = 0;
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "%s: no path", what ? what : "file");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    char nm[512];
    name(nm, sizeof nm, path, what);
    return eldr_diag_fail(d, ELDR_EIO, "%s: cannot open: %s", nm, strerror(errno));
  }
  int rc = eldr_read_fd(fd, path, max, what, out, len, d);
  close(fd);
  return rc;
}

int eldr_parse_file(const char *path, size_t max, const char *what,
                    int (*parse)(const char *text, size_t len, void *ctx, eldr_diag *d),
                    void *ctx, eldr_diag *d) {
  char *buf;
  size_t len;
  int rc = eldr_read_file(path, max, what, &buf, &len, d);
  if (rc) return rc;
  rc = parse(buf, len, ctx, d);
  if (rc) {
    char nm[512];
    name(nm, sizeof nm, path, what);
    eldr_diag_prefix(d, "%s", nm);
  }
  free(buf);
  return rc;
}
