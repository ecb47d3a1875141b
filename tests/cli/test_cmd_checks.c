/* test_cmd_checks.c — commands check their inputs and outputs before the
 * work starts, and report failures of the work with a non-zero exit naming
 * the cause: `eldr worker` on a port in use, `eldr demo` with a missing trace
 * or an unwritable --plot, --no-sim tables, `eldr bench load` when every
 * request fails. Real processes, real sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "support/proc.h"

static char g_dir[256];
static char g_trace[512];
static char g_out[65536], g_err[65536];

/* Run eldr under timeout(1) (a check that fails must not hang the suite). */
static int run(const char *const *args) {
  const char *argv[40] = {"/usr/bin/timeout", "120", ELDR_BINARY};
  size_t n = 3;
  for (size_t i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
  argv[n] = NULL;
  char ofile[512], efile[512];
  snprintf(ofile, sizeof ofile, "%s/stdout", g_dir);
  snprintf(efile, sizeof efile, "%s/stderr", g_dir);
  int rc = eldr_test_run(argv, ofile, efile);
  eldr_test_read_into(ofile, g_out, sizeof g_out);
  eldr_test_read_into(efile, g_err, sizeof g_err);
  return rc;
}

/* A TCP socket bound on 127.0.0.1 (listening or not); *port = its port. */
static int bound_socket(int do_listen, unsigned *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  if (do_listen) assert_int_equal(listen(fd, 4), 0);
  socklen_t l = sizeof a;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

static size_t entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr-test-cmd-checks-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  snprintf(g_trace, sizeof g_trace, "%s/t.jsonl", g_dir);
  const char *args[] = {"trace", "gen", "--requests", "40", "--seed", "1", "-q", "-o", g_trace, NULL};
  assert_int_equal(run(args), 0);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(g_dir);
}

/* A port in use: the errno's message, as `eldr serve` gives it. */
static void test_worker_port_in_use(void **state) {
  (void)state;
  unsigned port = 0;
  int fd = bound_socket(1, &port);
  char p[16];
  snprintf(p, sizeof p, "%u", port);
  const char *args[] = {"worker", "--port", p, NULL};
  int rc = run(args);
  close(fd);
  if (rc == 0 || rc == 124 || !strstr(g_err, "Address already in use"))
    fail_msg("rc=%d stderr='%s'", rc, g_err);
}

/* --trace that does not exist: exit 1 (an input, as every command) naming it, no work directory left. */
static void test_demo_missing_trace_leaves_nothing(void **state) {
  (void)state;
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s/tmpdir", g_dir);
  assert_int_equal(mkdir(tmp, 0700), 0);
  assert_int_equal(setenv("TMPDIR", tmp, 1), 0);
  const char *args[] = {"demo", "--trace", "/nonexistent/t.jsonl", NULL};
  int rc = run(args);
  unsetenv("TMPDIR");
  if (rc != 1 || !strstr(g_err, "/nonexistent/t.jsonl") || !strstr(g_err, "No such file"))
    fail_msg("rc=%d stderr='%s'", rc, g_err);
  assert_int_equal(entries(tmp), 0);
}

/* --plot into a missing directory or onto a directory: refused at start. */
static void test_demo_plot_checked_first(void **state) {
  (void)state;
  const char *targets[] = {"/nonexistent-dir/demo.png", g_dir};
  char dir_png[600];
  snprintf(dir_png, sizeof dir_png, "%s/sub.png", g_dir);
  assert_int_equal(mkdir(dir_png, 0700), 0);
  targets[1] = dir_png;
  for (size_t i = 0; i < 2; i++) {
    const char *args[] = {"demo", "--plot", targets[i], NULL};
    int rc = run(args);
    if (rc != 1 || !strstr(g_err, "--plot") || strstr(g_err, "work directory"))
      fail_msg("case %zu: rc=%d stderr='%s'", i, rc, g_err);
  }
  rmdir(dir_png);
}

/* A short demo with --no-sim: no simulator columns, no nan; a plot that
 * cannot be drawn (gnuplot missing from PATH) is exit 1 naming the cause. */
static void test_demo_no_sim_and_failed_plot(void **state) {
  (void)state;
  char png[512], empty[512], path[1200];
  snprintf(png, sizeof png, "%s/demo.png", g_dir);
  snprintf(empty, sizeof empty, "%s/empty-path", g_dir);
  assert_int_equal(mkdir(empty, 0700), 0);
  const char *old = getenv("PATH");
  snprintf(path, sizeof path, "%s", old ? old : "/usr/bin:/bin");
  /* timeout(1) is found through the old PATH before it changes */
  const char *argv[] = {"/usr/bin/timeout", "120", ELDR_BINARY, "demo", "--no-sim",
                        "--policies", "eldr,rr", "--fit-requests", "40", "--eval-requests", "20",
                        "--duration", "1", "--plot", png, NULL};
  char ofile[512], efile[512];
  snprintf(ofile, sizeof ofile, "%s/stdout", g_dir);
  snprintf(efile, sizeof efile, "%s/stderr", g_dir);
  assert_int_equal(setenv("PATH", empty, 1), 0);
  int rc = eldr_test_run(argv, ofile, efile);
  assert_int_equal(setenv("PATH", path, 1), 0);
  eldr_test_read_into(ofile, g_out, sizeof g_out);
  eldr_test_read_into(efile, g_err, sizeof g_err);
  if (rc != 1 || !strstr(g_err, "--plot") || !strstr(g_err, "gnuplot"))
    fail_msg("rc=%d stderr='%s'", rc, g_err);
  if (!strstr(g_out, "TPOT p50") || strstr(g_out, "nan") || strstr(g_out, "sim") ||
      strchr(g_out, '|'))
    fail_msg("stdout='%s'", g_out);
}

/* demo --json: one JSON object, a row per policy, "sim" null with --no-sim. */
static void test_demo_json(void **state) {
  (void)state;
  const char *args[] = {"demo", "--json", "--no-sim", "--policies", "eldr", "--fit-requests", "20",
                        "--eval-requests", "10", "--duration", "0.5", NULL};
  int rc = run(args);
  if (rc != 0) fail_msg("rc=%d stderr='%s'", rc, g_err);
  json_error_t e;
  json_t *j = json_loads(g_out, 0, &e);
  if (!j) fail_msg("%s in '%.300s'", e.text, g_out);
  json_t *rows = json_object_get(j, "rows");
  assert_int_equal(json_array_size(rows), 1);
  json_t *r = json_array_get(rows, 0);
  assert_string_equal(json_string_value(json_object_get(r, "policy")), "eldr");
  assert_true(json_is_null(json_object_get(r, "sim")));
  assert_true(json_integer_value(json_object_get(r, "ok")) > 0);
  assert_true(json_is_number(json_object_get(r, "tpot_p50_ms")));
  json_decref(j);
}

/* Every request fails (nothing listens): exit 1, a dash instead of nan. */
static void test_bench_load_all_failed(void **state) {
  (void)state;
  unsigned port = 0;
  int fd = bound_socket(0, &port); /* bound, not listening: connections are refused */
  char target[64];
  snprintf(target, sizeof target, "http://127.0.0.1:%u", port);
  const char *args[] = {"bench", "load", "--target", target, "--trace", g_trace, "--rate", "20",
                        "--duration", "1.5", "--timeout", "2", "--drain", "2", NULL};
  int rc = run(args);
  close(fd);
  if (rc != 1 || strstr(g_out, "nan") || !strstr(g_out, "ok 0") || !strstr(g_out, " -"))
    fail_msg("rc=%d stdout='%s' stderr='%s'", rc, g_out, g_err);
  /* off a terminal, progress comes as whole lines */
  if (!strstr(g_err, "eldr bench load: 1 s: ") || !strstr(g_err, " sent, "))
    fail_msg("no progress line: stderr='%s'", g_err);
  const char *bad[] = {"bench", "load", "--target", "ftp://x", "--trace", g_trace, NULL};
  rc = run(bad);
  if (rc != 2 || strstr(g_err, "req/s")) fail_msg("rc=%d stderr='%s'", rc, g_err);
}

/* Against a live emulated worker: every cell of the table filled (E2E p90 and
 * mean too), no dash, no nan. */
static void test_bench_load_table_filled(void **state) {
  (void)state;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(pfd[1], 1);
    close(pfd[0]);
    close(pfd[1]);
    execl(ELDR_BINARY, ELDR_BINARY, "worker", "--role", "both", "--port", "0", "--time-scale", "0.01",
          "--trace", g_trace, (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  FILE *f = fdopen(pfd[0], "r");
  char line[512] = "";
  unsigned port = 0;
  if (f && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "127.0.0.1:");
    if (p) port = (unsigned)atoi(p + 10);
  }
  char target[64];
  snprintf(target, sizeof target, "http://127.0.0.1:%u", port);
  const char *args[] = {"bench", "load", "--target", target, "--trace", g_trace, "--rate", "50",
                        "--requests", "12", NULL};
  int rc = port ? run(args) : -1;
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  if (f) fclose(f);
  if (!port) fail_msg("worker gave no port: '%s'", line);
  if (rc != 0 || strstr(g_out, "nan") || strstr(g_out, " -"))
    fail_msg("rc=%d stdout='%s' stderr='%s'", rc, g_out, g_err);
  const char *e2e = strstr(g_out, "E2E");
  assert_non_null(e2e);
  double v[4];
  if (sscanf(e2e, "E2E %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3]) != 4)
    fail_msg("E2E row not filled: '%s'", g_out);
  assert_true(v[0] > 0 && v[1] >= v[0] && v[2] >= v[1] && v[3] > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worker_port_in_use),
      cmocka_unit_test(test_demo_missing_trace_leaves_nothing),
      cmocka_unit_test(test_demo_plot_checked_first),
      cmocka_unit_test(test_demo_no_sim_and_failed_plot),
      cmocka_unit_test(test_bench_load_all_failed),
      cmocka_unit_test(test_demo_json),
      cmocka_unit_test(test_bench_load_table_filled),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
