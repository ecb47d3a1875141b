/* test_demo_cli.c — the `eldr worker`, `eldr bench load` and `eldr demo`
 * commands as processes: usage errors, a small demo run end to end (table,
 * exit 0, no process left behind), and Ctrl-C (SIGINT) in the middle of a
 * demo stops every process it started. */
#include <dirent.h>
#include <sys/stat.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "worker/wtest.h"
#include "support/proc.h"

/* Run argv, capture stdout+stderr (up to cap), bounded by timeout_s.
 * Returns the exit status, 128+sig when killed, -1 on timeout. */
static int run_capture(char *const argv[], char *out, size_t cap, double timeout_s) {
  int pfd[2];
  if (pipe(pfd) < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    execv(argv[0], argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  double deadline = wt_now() + timeout_s;
  for (;;) {
    double left = deadline - wt_now();
    if (left <= 0) break;
    struct pollfd p = {pfd[0], POLLIN, 0};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
    char buf[4096];
    ssize_t k = read(pfd[0], buf, sizeof buf);
    if (k <= 0) break;
    size_t c = (size_t)k < cap - 1 - n ? (size_t)k : cap - 1 - n;
    memcpy(out + n, buf, c);
    n += c;
  }
  out[n] = 0;
  close(pfd[0]);
  int st = 0;
  if (wt_now() >= deadline) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
  }
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_usage_errors(void **state) {
  (void)state;
  static char out[1 << 16];
  struct {
    const char *args[6];
    int want;
    const char *needle;
  } cases[] = {
      {{"worker", "--role", "middle", NULL}, 2, "--role"},
      {{"worker", "--time-scale", "0", NULL}, 2, "--time-scale"},
      {{"worker", "--model", "gpt-9", "--port", "0", NULL}, 2, "gpt-9"},
      {{"worker", "--trace", "/nonexistent.jsonl", NULL}, 1, "--trace"},
      {{"worker", "--help", NULL}, 0, "--role"},
      {{"bench", "load", "--trace", "x.jsonl", NULL}, 2, "--target"},
      {{"bench", "load", "--target", "http://127.0.0.1:1", NULL}, 2, "--trace"},
      {{"bench", "load", "--rate", "-1", NULL}, 2, "--rate"},
      {{"demo", "--policies", "eldr,magic", NULL}, 2, "magic"},
      {{"demo", "--rate", "abc", NULL}, 2, "--rate"},
      {{"demo", "--help", NULL}, 0, "Ctrl-C"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[8] = {(char *)eldr_test_binary()};
    for (int k = 0; cases[i].args[k]; k++) argv[k + 1] = (char *)cases[i].args[k];
    int st = run_capture(argv, out, sizeof out, 20);
    if (st != cases[i].want || !strstr(out, cases[i].needle))
      fail_msg("eldr %s %s: exit %d (want %d), output: %.300s", cases[i].args[0],
               cases[i].args[1] ? cases[i].args[1] : "", st, cases[i].want, out);
  }
}

/* Direct children of pid (from /proc). */
static size_t children_of(pid_t pid, pid_t *out, size_t cap) {
  size_t n = 0;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d)) && n < cap) {
    pid_t p = (pid_t)atoi(e->d_name);
    if (p <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    const char *rp = strrchr(buf, ')');
    char stt;
    int ppid;
    if (rp && sscanf(rp + 2, "%c %d", &stt, &ppid) == 2 && ppid == pid) out[n++] = p;
  }
  if (d) closedir(d);
  return n;
}

/* Gone or a zombie (not reaped by a container init): not running. */
static int alive(pid_t p) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[k] = 0;
  const char *rp = strrchr(buf, ')');
  return rp && rp[2] != 'Z' && rp[2] != 'X';
}

static void test_small_demo_runs_and_cleans_up(void **state) {
  (void)state;
  static char out[1 << 16];
  char *argv[] = {(char *)eldr_test_binary(), "demo", "--model", "olmoe-1b-7b", "--fit-requests", "60",
                  "--eval-requests", "24", "--max-decode", "12", "--rate", "40", "--time-scale",
                  "1", "--duration", "1.5", "--policies", "eldr,jsq", "--seed", "3", "--plot",
                  NULL, NULL};
  /* the figure goes outside the work directory (which is removed) */
  char fig[64];
  snprintf(fig, sizeof fig, "/tmp/eldr-test-demo-%d.svg", (int)getpid());
  argv[21] = fig;
  int st = run_capture(argv, out, sizeof out, 120);
  if (st != 0) fail_msg("demo exit %d: %s", st, out);
  if (access("/usr/bin/gnuplot", X_OK) == 0 || access("/usr/local/bin/gnuplot", X_OK) == 0) {
    FILE *ff = fopen(fig, "r");
    char head[4096] = "";
    size_t k = ff ? fread(head, 1, sizeof head - 1, ff) : 0;
    head[k] = 0;
    if (ff) fclose(ff);
    unlink(fig);
    if (!strstr(head, "<svg")) fail_msg("demo --plot %s: no SVG (%s)", fig, out);
  } else {
    assert_non_null(strstr(out, "gnuplot not found"));
  }
  assert_non_null(strstr(out, "ELDR vs the best load balancer: TPOT p50"));
  assert_non_null(strstr(out, "eldr sim, same configuration:"));
  assert_non_null(strstr(out, "\neldr    ")); /* the table rows, not "eldr demo:" lines */
  assert_non_null(strstr(out, "\njsq     "));
  assert_non_null(strstr(out, "model time"));
  /* every request completed: "N/N" for both rows */
  const char *row = strstr(out, "\neldr    ");
  int ok = 0, sent = -1;
  assert_int_equal(sscanf(row + 9, " %d/%d", &ok, &sent), 2);
  assert_true(sent > 0);
  assert_int_equal(ok, sent);
  /* the work directory was removed */
  const char *wd = strstr(out, "work directory ");
  assert_non_null(wd);
  char dir[256];
  assert_int_equal(sscanf(wd + 15, "%255s", dir), 1);
  struct stat sb;
  assert_int_not_equal(stat(dir, &sb), 0);
}

static void test_sigint_stops_every_process(void **state) {
  (void)state;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 2);
    int dn = open("/dev/null", O_WRONLY);
    dup2(dn, 1);
    close(pfd[0]);
    close(pfd[1]);
    execl(eldr_test_binary(), eldr_test_binary(), "demo", "--model", "olmoe-1b-7b", "--fit-requests", "60", "--eval-requests",
          "24", "--max-decode", "12", "--rate", "20", "--time-scale", "1", "--duration", "30",
          "--no-sim", (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  /* wait until the cluster is up and the load runs ("[3/4]" on stderr) */
  char buf[8192];
  size_t n = 0;
  int up = 0;
  double deadline = wt_now() + 60;
  while (!up && wt_now() < deadline) {
    struct pollfd p = {pfd[0], POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) continue;
    ssize_t k = read(pfd[0], buf + n, sizeof buf - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    buf[n] = 0;
    up = strstr(buf, "[3/4]") != NULL;
  }
  assert_true(up);
  /* its workers and router: wait (bounded) until all 7 are running */
  pid_t kids[64];
  size_t nk = 0;
  deadline = wt_now() + 30;
  while ((nk = children_of(pid, kids, 64)) < 7 && wt_now() < deadline) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(nk, 7);
  kill(pid, SIGINT);
  int st = 0;
  deadline = wt_now() + 20;
  pid_t r = 0;
  while ((r = waitpid(pid, &st, WNOHANG)) == 0 && wt_now() < deadline) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (r != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    fail_msg("the demo did not exit within 20 s of SIGINT");
  }
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 128 + SIGINT);
  for (size_t i = 0; i < nk; i++)
    if (alive(kids[i])) fail_msg("child %d still running after the demo exited", (int)kids[i]);
  close(pfd[0]);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_usage_errors),
      cmocka_unit_test(test_small_demo_runs_and_cleans_up),
      cmocka_unit_test(test_sigint_stops_every_process),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
