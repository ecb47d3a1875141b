/* trace_stream.c — reading traces one request at a time (see eldr/trace.h):
 * each file is read in 1 MiB blocks; complete lines are parsed into a
 * header-only eldr_trace that holds one request while the visitor runs, so
 * memory is one line plus one request whatever the file size. A line longer
 * than ELDR_TRACE_MAX_LINE is an error; a last line without a newline goes
 * through the torn-line rule of trace_load.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eldr/grow.h"
#include "eldr/trace.h"
#include "format/trace_internal.h"

#define BLOCK ((size_t)1 << 20)

typedef struct stream {
  eldr_trace *t; /* header + at most one request */
  eldr_trace_visit_fn fn;
  void *ud;
  eldr_trace_read_info *info;
  size_t index;
} stream;

static int blank(const char *p, const char *e) {
  for (; p < e; p++)
    if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') return 0;
  return 1;
}

/* Hand the request just parsed (if any) to the visitor, then drop it. */
static int visit(stream *s) {
  if (s->t->n == 0) return ELDR_OK;
  eldr_request *r = &s->t->req[0];
  s->t->n = 0;
  int rc = s->fn(s->t, r, s->index++, s->ud);
  eldr_request_release(r);
  s->info->requests++;
  return rc;
}

static int one_line(stream *s, const char *p, const char *e, size_t lineno, const char *src,
                    int last, eldr_diag *d) {
  if (blank(p, e)) return ELDR_OK;
  int rc = last ? eldr__trace_parse_last_line(s->t, p, (size_t)(e - p), lineno, src, s->info, d)
                : eldr__trace_parse_line_src(s->t, p, (size_t)(e - p), lineno, src, d);
  if (rc == ELDR_ENOMEM)
    return eldr_diag_fail(d, rc, "%s:%zu: out of memory", src, lineno);
  if (rc) return rc;
  return visit(s);
}

static int stream_file(stream *s, const char *path, eldr_diag *d) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return eldr_diag_fail(d, ELDR_EIO, "%s: cannot open: %s", path, strerror(errno));
  char *buf = NULL;
  size_t cap = 0, len = 0, lineno = 0;
  int rc = ELDR_OK;
  for (;;) {
    if (len + BLOCK > cap) {
      if (len >= ELDR_TRACE_MAX_LINE) {
        rc = eldr_diag_fail(d, ELDR_ERANGE, "%s:%zu: line longer than %zu MiB", path, lineno + 1,
                            ELDR_TRACE_MAX_LINE >> 20);
        break;
      }
      if (eldr_grow(&buf, &cap, len + BLOCK, 1, BLOCK)) {
        rc = eldr_diag_fail(d, ELDR_ENOMEM, "%s: out of memory", path);
        break;
      }
    }
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0) {
      if (errno == EINTR) continue;
      rc = eldr_diag_fail(d, ELDR_EIO, "%s: read failed: %s", path, strerror(errno));
      break;
    }
    if (got == 0) { /* end of file: what is left is a last line without a newline */
      if (len) rc = one_line(s, buf, buf + len, lineno + 1, path, 1, d);
      break;
    }
    const char *p = buf, *e = buf + len + (size_t)got;
    const char *nl = memchr(buf + len, '\n', (size_t)got); /* earlier bytes hold no newline */
    while (nl) {
      if ((rc = one_line(s, p, nl, ++lineno, path, 0, d))) break;
      p = nl + 1;
      nl = memchr(p, '\n', (size_t)(e - p));
    }
    if (rc) break;
    len = (size_t)(e - p);
    memmove(buf, p, len);
    /* a block that grew for one long line shrinks back once it is done */
    if (cap > 4 * BLOCK && len + BLOCK < cap / 4) {
      char *q = realloc(buf, len + BLOCK);
      if (q) {
        buf = q;
        cap = len + BLOCK;
      }
    }
  }
  free(buf);
  close(fd);
  return rc;
}

int eldr_trace_foreach_inputs(char *const *paths, size_t n, eldr_trace_visit_fn fn, void *ud,
                              eldr_trace_read_info *info, eldr_diag *d) {
  eldr_trace_read_info scratch;
  if (!info) info = &scratch;
  memset(info, 0, sizeof *info);
  if (!paths || n == 0 || !fn) return eldr_diag_fail(d, ELDR_EINVAL, "no trace inputs or visitor");
  stream s = {.fn = fn, .ud = ud, .info = info};
  if (!(s.t = calloc(1, sizeof *s.t))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  int rc = ELDR_OK;
  for (size_t i = 0; i < n && rc == ELDR_OK; i++) {
    rc = stream_file(&s, paths[i], d);
    if (rc == ELDR_OK) info->files++;
  }
  if (rc == ELDR_OK && info->requests == 0)
    rc = eldr_diag_fail(d, ELDR_EEMPTY, "%s%s: empty trace (no requests)", paths[0],
                        n > 1 ? " and the other inputs" : "");
  eldr_trace_free(s.t);
  return rc;
}

int eldr_trace_foreach(const char *path, eldr_trace_visit_fn fn, void *ud, eldr_diag *d) {
  eldr_trace_read_info info;
  char *p = (char *)path;
  int rc = eldr_trace_foreach_inputs(&p, 1, fn, ud, &info, d);
  if (rc == ELDR_OK && d) snprintf(d->msg, sizeof d->msg, "%s", info.note);
  return rc;
}
