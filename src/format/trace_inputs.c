/* trace_inputs.c — trace inputs to file paths (see eldr/trace.h): a
 * directory gives its *.jsonl files sorted by name (not recursive, hidden
 * files skipped), a pattern with * ? or [ gives its sorted glob(3) matches
 * (directories skipped),
 * anything else must be an existing file. */
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "eldr/grow.h"
#include "eldr/trace.h"

typedef struct plist {
  char **p;
  size_t n, cap;
} plist;

/* dir + '/' + name (dir NULL: a copy of name), malloc'd. */
static char *join_path(const char *dir, const char *name) {
  size_t dn = dir ? strlen(dir) : 0, nn = strlen(name);
  char *s = malloc(dn + 1 + nn + 1);
  if (!s) return NULL;
  if (dn) {
    memcpy(s, dir, dn);
    if (dir[dn - 1] != '/') s[dn++] = '/';
  }
  memcpy(s + dn, name, nn + 1);
  return s;
}

/* Append path s, taking it (freed on failure). */
static int push(plist *l, char *s) {
  if (!s || eldr_grow_array(l->p, l->cap, l->n + 1)) {
    free(s);
    return ELDR_ENOMEM;
  }
  l->p[l->n++] = s;
  return ELDR_OK;
}

static int jsonl_entry(const struct dirent *e) {
  size_t n = strlen(e->d_name);
  return e->d_name[0] != '.' && n > 6 && !strcmp(e->d_name + n - 6, ".jsonl");
}

static int add_dir(plist *l, const char *dir, eldr_diag *d) {
  struct dirent **ents = NULL;
  int n = scandir(dir, &ents, jsonl_entry, alphasort);
  if (n < 0) return eldr_diag_fail(d, ELDR_EIO, "%s: cannot read directory: %s", dir, strerror(errno));
  int rc = ELDR_OK, kept = 0;
  for (int i = 0; i < n; i++) {
    if (rc == ELDR_OK) {
      char *full = join_path(dir, ents[i]->d_name);
      struct stat st;
      if (!full) rc = ELDR_ENOMEM;
      else if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && (rc = push(l, full)) == ELDR_OK)
        kept++;
      else if (rc == ELDR_OK)
        free(full);
    }
    free(ents[i]);
  }
  free(ents);
  if (rc) return eldr_diag_fail(d, rc, "out of memory");
  if (!kept) return eldr_diag_fail(d, ELDR_ENOTFOUND, "%s: directory holds no *.jsonl file", dir);
  return ELDR_OK;
}

static int add_glob(plist *l, const char *pat, eldr_diag *d) {
  glob_t g;
  int r = glob(pat, GLOB_ERR | GLOB_MARK, NULL, &g);
  if (r == GLOB_NOMATCH) {
    globfree(&g);
    return eldr_diag_fail(d, ELDR_ENOTFOUND, "%s: no file matches", pat);
  }
  if (r != 0) {
    globfree(&g);
    return eldr_diag_fail(d, r == GLOB_NOSPACE ? ELDR_ENOMEM : ELDR_EIO, "%s: glob failed", pat);
  }
  int rc = ELDR_OK;
  size_t kept = 0;
  for (size_t i = 0; i < g.gl_pathc && rc == ELDR_OK; i++) {
    const char *m = g.gl_pathv[i];
    if (m[strlen(m) - 1] == '/') continue; /* GLOB_MARK: a directory */
    if ((rc = push(l, join_path(NULL, m))) == ELDR_OK) kept++;
  }
  globfree(&g);
  if (rc) return eldr_diag_fail(d, rc, "out of memory");
  if (!kept) return eldr_diag_fail(d, ELDR_ENOTFOUND, "%s: no file matches (only directories)", pat);
  return ELDR_OK;
}

void eldr_trace_inputs_free(char **paths, size_t n) {
  if (!paths) return;
  for (size_t i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

int eldr_trace_inputs_expand(const char *const *inputs, size_t n_inputs, char ***out, size_t *n,
                             eldr_diag *d) {
  if (!out || !n) return eldr_diag_fail(d, ELDR_EINVAL, "out missing");
  *out = NULL;
  *n = 0;
  if (!inputs || n_inputs == 0) return eldr_diag_fail(d, ELDR_EINVAL, "no trace inputs");
  plist l = {0};
  int rc = ELDR_OK;
  for (size_t i = 0; i < n_inputs && rc == ELDR_OK; i++) {
    const char *in = inputs[i];
    struct stat st;
    if (!in || !*in) {
      rc = eldr_diag_fail(d, ELDR_EINVAL, "empty trace input");
    } else if (stat(in, &st) == 0) {
      if (S_ISDIR(st.st_mode)) rc = add_dir(&l, in, d);
      else if ((rc = push(&l, join_path(NULL, in)))) eldr_diag_fail(d, rc, "out of memory");
    } else if (strpbrk(in, "*?[")) {
      rc = add_glob(&l, in, d);
    } else {
      rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "%s: no such file or directory", in);
    }
  }
  if (rc) {
    eldr_trace_inputs_free(l.p, l.n);
    return rc;
  }
  *out = l.p;
  *n = l.n;
  return ELDR_OK;
}
