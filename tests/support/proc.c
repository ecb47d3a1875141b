#define _XOPEN_SOURCE 700 /* nftw */
#include "support/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int open_out(const char *path) {
  return open(path ? path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
}

int eldr_test_run(const char *const *argv, const char *out_path, const char *err_path) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int o = open_out(out_path), e = open_out(err_path);
    if (o < 0 || e < 0) _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  assert_true(waitpid(pid, &st, 0) == pid);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WEXITSTATUS(st);
}

int eldr_test_run_args(const char *binary, const char *const *args, const char *out_path,
                       const char *err_path) {
  const char *argv[64];
  size_t n = 0;
  argv[n++] = binary;
  while (args[n - 1]) {
    assert_true(n < 63);
    argv[n] = args[n - 1];
    n++;
  }
  argv[n] = NULL;
  return eldr_test_run(argv, out_path, err_path);
}

const char *eldr_test_binary(void) {
  const char *b = getenv("ELDR_BINARY");
  return b && *b ? b : ELDR_BINARY;
}

int eldr_test_eldr(const char *out_path, const char *err_path, const char *first, ...) {
  const char *argv[64];
  int n = 0;
  argv[n++] = eldr_test_binary();
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a; a = va_arg(ap, const char *)) {
    assert_true(n < 63);
    argv[n++] = a;
  }
  va_end(ap);
  argv[n] = NULL;
  return eldr_test_run(argv, out_path, err_path);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int eldr_test_rmtree(const char *path) {
  if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0) return 0;
  return errno == ENOENT ? 0 : -1;
}

void eldr_test_write(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) fail_msg("cannot write %s", path);
  int bad = fputs(text, f) < 0;
  if (fclose(f) || bad) fail_msg("cannot write %s", path);
}

char *eldr_test_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    if (n + 1 >= cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    size_t k = fread(buf + n, 1, cap - 1 - n, f);
    if (!k) break;
    n += k;
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

void eldr_test_read_into(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t k = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[k] = '\0';
  if (f) fclose(f);
}

int eldr_test_run_captured(const char *binary, const char *dir, const char *const *args, char *out, size_t out_cap,
                           char *err, size_t err_cap) {
  char ofile[1024], efile[1024];
  snprintf(ofile, sizeof ofile, "%s/stdout", dir);
  snprintf(efile, sizeof efile, "%s/stderr", dir);
  int rc = eldr_test_run_args(binary, args, ofile, efile);
  eldr_test_read_into(ofile, out, out_cap);
  eldr_test_read_into(efile, err, err_cap);
  return rc;
}

char *eldr_test_vllm_fixture(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/fixtures/vllm/%s", ELDR_SOURCE_DIR, name);
  char *s = eldr_test_slurp(path, NULL);
  if (!s) fail_msg("cannot read %s", path);
  return s;
}
