/* trace_load.c — loading a whole trace (see eldr/trace.h): the file is
 * mapped (or read, when it cannot be mapped) once and parsed line by line by
 * the line parser in trace.c; inputs of 64 MiB and more are parsed in two
 * halves on two threads and joined into the trace a sequential parse gives.
 * Errors name the file and line. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/parallel.h"
#include "eldr/readfile.h"
#include "eldr/trace.h"
#include "format/trace_internal.h"

/* A line of only JSON white space (skipped, as blank lines are). */
static int blank(const char *p, const char *e) {
  for (; p < e; p++)
    if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') return 0;
  return 1;
}

/* Parse the lines of [p, e) into t; lineno: the number of lines before p. */
static int parse_range(eldr_trace *t, const char *p, const char *e, size_t lineno,
                       const char *src, eldr_diag *d) {
  while (p < e) {
    lineno++;
    const char *nl = memchr(p, '\n', (size_t)(e - p));
    const char *le = nl ? nl : e;
    if (!blank(p, le)) {
      int rc = eldr__trace_parse_line_src(t, p, (size_t)(le - p), lineno, src, d);
      if (rc) {
        if (rc == ELDR_ENOMEM) eldr_diag_fail(d, rc, "%s%sline %zu: out of memory", src ? src : "",
                                              src ? ": " : "", lineno);
        return rc;
      }
    }
    p = nl ? nl + 1 : e;
  }
  return ELDR_OK;
}

/* Large inputs are parsed in two halves on two threads. The second half's
 * trace first parses the file's first request line (which defines the
 * model, shape and layers every later line is checked against, exactly as
 * in a sequential parse) and drops it again; its line numbers start after a
 * count of the first half's newlines. The halves are then joined in file
 * order, the second half's domains re-interned in their order of first
 * appearance, so the trace is the one a sequential parse gives. An error in
 * the first half wins over one in the second, so the message names the
 * first bad line, as sequentially. */
#ifndef ELDR_TRACE_SPLIT_MIN
#define ELDR_TRACE_SPLIT_MIN ((size_t)64 << 20)
#endif

typedef struct half_job {
  const char *buf, *split, *e; /* whole input; the second half is [split, e) */
  const char *first, *first_e; /* the first request line */
  size_t first_lineno;
  const char *src;
  eldr_trace *t;
  eldr_diag d;
  int rc;
} half_job;

static void parse_second_half(half_job *j) {
  j->d.msg[0] = '\0';
  size_t lines = 0;
  for (const char *p = j->buf; (p = memchr(p, '\n', (size_t)(j->split - p))) != NULL; p++)
    lines++;
  j->rc = eldr__trace_parse_line_src(j->t, j->first, (size_t)(j->first_e - j->first),
                                     j->first_lineno, j->src, NULL);
  if (j->rc == ELDR_OK) j->rc = parse_range(j->t, j->split, j->e, lines, j->src, &j->d);
}

/* The two halves as parallel-for tasks: 0 parses the first into t (errors
 * in d), 1 the second into j->t (errors in j->d). */
typedef struct halves {
  half_job *j;
  eldr_trace *t;
  eldr_diag *d;
  int rc;
} halves;

static void parse_half(void *arg, size_t i) {
  halves *h = arg;
  if (i == 1)
    parse_second_half(h->j);
  else
    h->rc = parse_range(h->t, h->j->buf, h->j->split, 0, h->j->src, h->d);
}

/* Append b's requests after its first (the repeated first line) to a. */
static int join_halves(eldr_trace *a, eldr_trace *b) {
  int *map = malloc((b->n_domains ? b->n_domains : 1) * sizeof *map);
  if (!map) return ELDR_ENOMEM;
  for (size_t i = 0; i < b->n_domains; i++) {
    map[i] = eldr_trace_domain_intern(a, b->domains[i]);
    if (map[i] < 0) {
      free(map);
      return ELDR_ENOMEM;
    }
  }
  if (eldr_trace_reserve(a, a->n + b->n - 1)) {
    free(map);
    return ELDR_ENOMEM;
  }
  for (size_t i = 1; i < b->n; i++) {
    eldr_request r = b->req[i];
    if (r.domain >= 0) r.domain = map[r.domain];
    a->req[a->n++] = r;
  }
  b->n = 1; /* the moved requests now belong to a */
  free(map);
  return ELDR_OK;
}

static int parse_buffer(const char *buf, size_t len, const char *src, eldr_trace **out,
                        eldr_diag *d) {
  *out = NULL;
  eldr_trace *t = calloc(1, sizeof(eldr_trace));
  if (!t) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  const char *e = buf + len;
  int rc;
  half_job j = {.buf = buf, .e = e, .src = src};
  if (len >= ELDR_TRACE_SPLIT_MIN) {
    const char *nl = memchr(buf + len / 2, '\n', len - len / 2);
    j.split = nl && nl + 1 < e ? nl + 1 : NULL;
    /* the first request line, which must lie in the first half */
    size_t lineno = 0;
    for (const char *p = buf; j.split && p < j.split;) {
      lineno++;
      const char *le = memchr(p, '\n', (size_t)(j.split - p));
      if (!blank(p, le)) {
        j.first = p;
        j.first_e = le;
        j.first_lineno = lineno;
        break;
      }
      p = le + 1;
    }
  }
  if (j.first && (j.t = calloc(1, sizeof(eldr_trace))) != NULL) {
    halves h = {.j = &j, .t = t, .d = d};
    eldr_parallel_for(2, 2, parse_half, &h);
    rc = h.rc;
    if (rc == ELDR_OK && j.rc != ELDR_OK) {
      rc = j.rc;
      if (d) *d = j.d;
      if (rc == ELDR_ENOMEM && !j.d.msg[0])
        eldr_diag_fail(d, rc, "%s%sout of memory", src ? src : "", src ? ": " : "");
    }
    if (rc == ELDR_OK && (rc = join_halves(t, j.t)) != ELDR_OK)
      eldr_diag_fail(d, rc, "%s%sout of memory", src ? src : "", src ? ": " : "");
    eldr_trace_free(j.t);
  } else {
    rc = parse_range(t, buf, e, 0, src, d);
  }
  if (rc) {
    eldr_trace_free(t);
    return rc;
  }
  if (t->n == 0) {
    eldr_trace_free(t);
    return eldr_diag_fail(d, ELDR_EEMPTY, "%s%sempty trace (no requests)", src ? src : "",
                          src ? ": " : "");
  }
  *out = t;
  return ELDR_OK;
}

int eldr_trace_parse(const char *buf, size_t len, eldr_trace **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "out missing");
  if (!buf && len) {
    *out = NULL;
    return eldr_diag_fail(d, ELDR_EINVAL, "buffer missing");
  }
  return parse_buffer(buf ? buf : "", len, NULL, out, d);
}

int eldr_trace_load(const char *path, eldr_trace **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "out missing");
  *out = NULL;
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "path missing");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return eldr_diag_fail(d, ELDR_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return eldr_diag_fail(d, ELDR_EIO, "%s: cannot stat: %s", path, strerror(err));
  }
  int rc;
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    size_t n = (size_t)st.st_size;
    void *m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      close(fd);
      (void)madvise(m, n, MADV_SEQUENTIAL);
      rc = parse_buffer(m, n, path, out, d);
      munmap(m, n);
      return rc;
    }
  }
  /* not mappable (pipe, empty, special file): read it */
  char *buf;
  size_t n;
  rc = eldr_read_fd(fd, path, SIZE_MAX - 1, NULL, &buf, &n, d);
  close(fd);
  if (rc) return rc;
  rc = parse_buffer(buf, n, path, out, d);
  free(buf);
  return rc;
}

