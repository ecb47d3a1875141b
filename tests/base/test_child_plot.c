/* test_child_plot.c — the child-process helper (exit codes, stdin pipe,
 * stdout file, timeout) and the gnuplot launcher (quoting, a missing
 * gnuplot, a real figure when gnuplot is installed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/child.h"
#include "eldr/plot.h"
#include "support/proc.h"

static void test_exit_codes_and_not_found(void **st) {
  (void)st;
  eldr_child_opts o;
  eldr_child_opts_default(&o);
  pid_t pid;
  int code = -1;
  char *ok[] = {"/bin/sh", "-c", "exit 7", NULL};
  assert_int_equal(eldr_child_spawn(ok, &o, &pid, NULL, NULL), 0);
  assert_int_equal(eldr_child_wait(pid, -1, &code), 0);
  assert_int_equal(code, 7);
  char *missing[] = {"eldr-no-such-program-here", NULL};
  assert_int_equal(eldr_child_spawn(missing, &o, &pid, NULL, NULL), 0);
  assert_int_equal(eldr_child_wait(pid, 5, &code), 0);
  assert_int_equal(code, 127);
  /* a bounded wait on a child that does not end, then stop it */
  char *sleeper[] = {"/bin/sleep", "30", NULL};
  assert_int_equal(eldr_child_spawn(sleeper, &o, &pid, NULL, NULL), 0);
  assert_int_equal(eldr_child_wait(pid, 0.05, &code), ELDR_ETIMEOUT);
  eldr_child_stop(pid, 2);
  assert_int_equal(kill(pid, 0), -1); /* reaped */
  char *none[] = {NULL};
  eldr_diag d = {{0}};
  assert_int_equal(eldr_child_spawn(none, &o, &pid, NULL, &d), ELDR_EINVAL);
}

static void test_stdin_pipe_to_stdout_file(void **st) {
  (void)st;
  char dir[] = "/tmp/eldr-test-child-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char out[128];
  snprintf(out, sizeof out, "%s/out", dir);
  eldr_child_opts o;
  eldr_child_opts_default(&o);
  o.stdin_pipe = 1;
  o.stdout_path = out;
  char *cat[] = {"cat", NULL};
  pid_t pid;
  int fd = -1, code = -1;
  assert_int_equal(eldr_child_spawn(cat, &o, &pid, &fd, NULL), 0);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "hello\n", 6), 6);
  close(fd);
  assert_int_equal(eldr_child_wait(pid, 10, &code), 0);
  assert_int_equal(code, 0);
  char *s = eldr_test_slurp(out, NULL);
  assert_string_equal(s, "hello\n");
  free(s);
  unlink(out);
  rmdir(dir);
}

static void test_quote_and_header(void **st) {
  (void)st;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  eldr_plot_quote(f, "it's a\nb");
  fclose(f);
  assert_string_equal(buf, "'it''s a b'");
  free(buf);
  f = open_memstream(&buf, &len);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_plot_header(f, "x.pdf", NULL, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, ".png or .svg"));
  assert_int_equal(eldr_plot_header(f, "/tmp/a'b.svg", "t", &d), 0);
  fclose(f);
  assert_non_null(strstr(buf, "set terminal svg"));
  assert_non_null(strstr(buf, "set output '/tmp/a''b.svg'"));
  free(buf);
  assert_null(eldr_plot_terminal("noext"));
}

static void test_missing_gnuplot_is_an_error(void **st) {
  (void)st;
  const char *old = getenv("PATH");
  char *saved = old ? strdup(old) : NULL;
  setenv("PATH", "/nonexistent-dir", 1);
  eldr_diag d = {{0}};
  /* a script longer than a pipe buffer: the write must fail cleanly, not kill us */
  size_t n = 1 << 20;
  char *script = malloc(n);
  memset(script, '#', n);
  int rc = eldr_plot_run(script, n, &d);
  free(script);
  if (saved) {
    setenv("PATH", saved, 1);
    free(saved);
  }
  assert_int_equal(rc, ELDR_ENOTFOUND);
  assert_non_null(strstr(d.msg, "gnuplot not found"));
}

static void test_real_figure(void **st) {
  (void)st;
  if (access("/usr/bin/gnuplot", X_OK) != 0 && access("/usr/local/bin/gnuplot", X_OK) != 0) skip();
  char dir[] = "/tmp/eldr-test-plot-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char out[128];
  snprintf(out, sizeof out, "%s/it's.svg", dir);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_int_equal(eldr_plot_header(f, out, "a title with 'quotes'", NULL), 0);
  fputs("plot x title 'x'\n", f);
  fclose(f);
  eldr_diag d = {{0}};
  int rc = eldr_plot_run(buf, len, &d);
  free(buf);
  if (rc) fail_msg("%s", d.msg);
  char *s = eldr_test_slurp(out, NULL);
  assert_non_null(s);
  assert_non_null(strstr(s, "<svg"));
  free(s);
  /* a script gnuplot rejects */
  assert_int_equal(eldr_plot_run("plot nosuchfunction(x)\n", 23, &d), ELDR_EIO);
  unlink(out);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exit_codes_and_not_found),
      cmocka_unit_test(test_stdin_pipe_to_stdout_file),
      cmocka_unit_test(test_quote_and_header),
      cmocka_unit_test(test_missing_gnuplot_is_an_error),
      cmocka_unit_test(test_real_figure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
