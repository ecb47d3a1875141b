/* trace_load.c — loading a whole trace (see eldr/trace.h): the file is
 * mapped (or read, when it cannot be mapped) once and parsed line by line by
 * the line parser in trace.c; inputs of 64 MiB and more are parsed in two
 * halves on two threads and joined into the trace a sequential parse gives.
 * Errors name the file and line. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
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

/* Append b's requests from index `from` on to a (domains re-interned). */
static int join_traces(eldr_trace *a, eldr_trace *b, size_t from) {
  int *map = malloc((b->n_domains ? b->n_domains : 1) * sizeof *map);
  if (!map) return ELDR_ENOMEM;
  for (size_t i = 0; i < b->n_domains; i++) {
    map[i] = eldr_trace_domain_intern(a, b->domains[i]);
    if (map[i] < 0) {
      free(map);
      return ELDR_ENOMEM;
    }
  }
  if (eldr_trace_reserve(a, a->n + b->n - from)) {
    free(map);
    return ELDR_ENOMEM;
  }
  for (size_t i = from; i < b->n; i++) {
    eldr_request r = b->req[i];
    if (r.domain >= 0) r.domain = map[r.domain];
    a->req[a->n++] = r;
  }
  b->n = from; /* the moved requests now belong to a */
  free(map);
  return ELDR_OK;
}

/* A torn last line (see eldr/trace.h): [*len, end) is the last line when
 * it has no newline and is not blank; *len is cut before it. Returns
 * whether there is one. */
static int cut_last_line(const char *buf, size_t *len) {
  size_t n = *len;
  if (n == 0 || buf[n - 1] == '\n') return 0;
  size_t s = n;
  while (s > 0 && buf[s - 1] != '\n') s--;
  if (blank(buf + s, buf + n)) return 0;
  *len = s;
  return 1;
}

/* Lines in [p, e) (newlines counted). */
static size_t count_lines(const char *p, const char *e) {
  size_t n = 0;
  while ((p = memchr(p, '\n', (size_t)(e - p))) != NULL) {
    n++;
    p++;
  }
  return n;
}

/* Parse a file's last line without a newline into t; a line that is not
 * one complete JSON object is skipped with a note in info (a torn write),
 * any other error fails as usual. */
int eldr__trace_parse_last_line(eldr_trace *t, const char *line, size_t len, size_t lineno,
                                const char *src, eldr_trace_read_info *info, eldr_diag *d) {
  if (text_is_json_object(line, len)) {
    int rc = eldr__trace_parse_line_src(t, line, len, lineno, src, d);
    if (rc == ELDR_ENOMEM)
      eldr_diag_fail(d, rc, "%s: line %zu: out of memory", src ? src : "input", lineno);
    return rc;
  }
  if (info && info->torn++ == 0)
    snprintf(info->note, sizeof info->note,
             "%s:%zu: last line (%zu bytes) has no newline and is not complete JSON (a torn "
             "write?): skipped",
             src ? src : "input", lineno, len);
  return ELDR_OK;
}

/* info NULL: strict (eldr_trace_load); else torn last lines are skipped. */
static int parse_buffer(const char *buf, size_t len, const char *src, eldr_trace_read_info *info,
                        eldr_trace **out, eldr_diag *d) {
  *out = NULL;
  const size_t full = len;
  const int torn = info && cut_last_line(buf, &len);
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
    /* the second half's first request is the repeated first line */
    if (rc == ELDR_OK && (rc = join_traces(t, j.t, 1)) != ELDR_OK)
      eldr_diag_fail(d, rc, "%s%sout of memory", src ? src : "", src ? ": " : "");
    eldr_trace_free(j.t);
  } else {
    rc = parse_range(t, buf, e, 0, src, d);
  }
  if (rc == ELDR_OK && torn)
    rc = eldr__trace_parse_last_line(t, buf + len, full - len, count_lines(buf, e) + 1, src, info,
                                     d);
  if (rc) {
    eldr_trace_free(t);
    return rc;
  }
  if (t->n == 0 && !info) {
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
  return parse_buffer(buf ? buf : "", len, NULL, NULL, out, d);
}

/* One file, strict (info NULL) or torn-tolerant. */
static int load_file(const char *path, eldr_trace_read_info *info, eldr_trace **out,
                     eldr_diag *d) {
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
      rc = parse_buffer(m, n, path, info, out, d);
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
  rc = parse_buffer(buf, n, path, info, out, d);
  free(buf);
  return rc;
}

int eldr_trace_load(const char *path, eldr_trace **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "out missing");
  *out = NULL;
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "path missing");
  return load_file(path, NULL, out, d);
}

/* b (read from src) agrees with a on everything a line is checked against. */
static int same_header(const eldr_trace *a, const eldr_trace *b, const char *src, eldr_diag *d) {
  if (a->model && a->model[0] && strcmp(a->model, b->model))
    return eldr_diag_fail(d, ELDR_ESHAPE, "%s: model '%.60s' disagrees with the first input's '%.60s'",
                          src, b->model, a->model);
  const eldr_shape *x = &a->shape, *y = &b->shape;
  if (x->num_layers != y->num_layers || x->num_experts != y->num_experts || x->top_k != y->top_k ||
      memcmp(a->layer_ids, b->layer_ids, x->num_layers * sizeof *a->layer_ids))
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "%s: shape (%u layers, %u experts, top_k %u, layer ids) disagrees with "
                          "the first input's (%u, %u, %u)",
                          src, y->num_layers, y->num_experts, y->top_k, x->num_layers,
                          x->num_experts, x->top_k);
  if (b->generator && (!a->generator || strcmp(a->generator, b->generator)))
    return eldr_diag_fail(d, ELDR_ESHAPE, "%s: generator '%.80s' disagrees with the first input's %.80s",
                          src, b->generator, a->generator ? a->generator : "(none)");
  return ELDR_OK;
}

int eldr_trace_load_inputs(char *const *paths, size_t n, eldr_trace **out,
                           eldr_trace_read_info *info, eldr_diag *d) {
  eldr_trace_read_info scratch;
  if (!info) info = &scratch;
  memset(info, 0, sizeof *info);
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "out missing");
  *out = NULL;
  if (!paths || n == 0) return eldr_diag_fail(d, ELDR_EINVAL, "no trace inputs");
  eldr_trace *all = NULL;
  int rc = ELDR_OK;
  for (size_t i = 0; i < n && rc == ELDR_OK; i++) {
    eldr_trace *t = NULL;
    if ((rc = load_file(paths[i], info, &t, d))) break;
    info->files++;
    if (t->n == 0) {
      eldr_trace_free(t);
    } else if (!all) {
      all = t;
    } else {
      if ((rc = same_header(all, t, paths[i], d)) == ELDR_OK && (rc = join_traces(all, t, 0)))
        eldr_diag_fail(d, rc, "%s: out of memory", paths[i]);
      eldr_trace_free(t);
    }
  }
  if (rc == ELDR_OK && !all)
    rc = eldr_diag_fail(d, ELDR_EEMPTY, "%s%s: empty trace (no requests)", paths[0],
                        n > 1 ? " and the other inputs" : "");
  if (rc) {
    eldr_trace_free(all);
    return rc;
  }
  info->requests = all->n;
  *out = all;
  return ELDR_OK;
}

