/* test_cli_status.c — the conventions of test_cli_conventions.c, for what a
 * command does when its work fails and when it runs, as a user meets them:
 * every command exits 1 for an input that is missing, an output that cannot
 * be written and a port in use (2 stays for a wrong command line); `eldr
 * serve --check-config=resolve` fails where the start fails; a message
 * about the process is logged once, whatever --threads, and no prefix is
 * doubled; --threads 0 counts the CPUs the process may run on; the worker
 * finds its corpus wherever it is started; `eldr bench load` works against
 * a worker on defaults; bench_sim -h prints its usage. Real processes, real
 * sockets, deadlines on every wait. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/proc.h"

static char g_dir[128], g_trace[256], g_art[256], g_mal[256];
static char g_out[1 << 16], g_err[1 << 16];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run eldr under timeout(1) (a start that wrongly succeeds must not hang
 * the suite: it is stopped after 120 s, room for a fit under a sanitizer on a loaded machine, and reads as 124). */
static int run(const char *const *args) {
  const char *argv[48] = {"/usr/bin/timeout", "120", ELDR_BINARY};
  size_t n = 3;
  for (size_t i = 0; args[i] && n < 47; i++) argv[n++] = args[i];
  argv[n] = NULL;
  char ofile[256], efile[256];
  snprintf(ofile, sizeof ofile, "%s/stdout", g_dir);
  snprintf(efile, sizeof efile, "%s/stderr", g_dir);
  int rc = eldr_test_run(argv, ofile, efile);
  eldr_test_read_into(ofile, g_out, sizeof g_out);
  eldr_test_read_into(efile, g_err, sizeof g_err);
  return rc;
}

static size_t count(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* ---- a long-running eldr: stdout through a pipe, stderr to a file -------- */

typedef struct child {
  pid_t pid;
  int out;           /* read end of its stdout */
  char errpath[256]; /* its stderr */
} child;

static void spawn(child *c, const char *cwd, const char *const *args) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  snprintf(c->errpath, sizeof c->errpath, "%s/child-%d.err", g_dir, (int)getpid());
  c->pid = fork();
  assert_true(c->pid >= 0);
  if (c->pid == 0) {
    int e = open(c->errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (e < 0 || (cwd && chdir(cwd))) _exit(126);
    dup2(p[1], 1);
    dup2(e, 2);
    close(p[0]);
    close(p[1]);
    const char *argv[48] = {ELDR_BINARY};
    size_t n = 1;
    for (size_t i = 0; args[i] && n < 47; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(ELDR_BINARY, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  c->out = p[0];
}

/* Its first stdout line within timeout_s; fails the test otherwise. */
static void first_line(child *c, char *line, size_t cap, double timeout_s) {
  size_t n = 0;
  const double end = now() + timeout_s;
  while (n + 1 < cap) {
    struct pollfd pf = {c->out, POLLIN, 0};
    int left = (int)((end - now()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) <= 0) break;
    ssize_t r = read(c->out, line + n, 1);
    if (r <= 0 || line[n] == '\n') break;
    n++;
  }
  line[n] = 0;
  if (!n) {
    eldr_test_read_into(c->errpath, g_err, sizeof g_err);
    fail_msg("no stdout line within %g s; stderr: %s", timeout_s, g_err);
  }
}

/* Wait until its stderr holds needle n times (timeout_s); its stderr into g_err. */
static int wait_err(child *c, const char *needle, size_t n, double timeout_s) {
  const double end = now() + timeout_s;
  for (;;) {
    eldr_test_read_into(c->errpath, g_err, sizeof g_err);
    if (count(g_err, needle) >= n) return 0;
    if (now() > end) return -1;
    usleep(20000);
  }
}

/* Stop it (SIGTERM) and reap: its exit status; its stderr into g_err. */
static int stop(child *c) {
  kill(c->pid, SIGTERM);
  int st = 0;
  const double end = now() + 20;
  while (waitpid(c->pid, &st, WNOHANG) == 0) {
    if (now() > end) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &st, 0);
      break;
    }
    usleep(10000);
  }
  close(c->out);
  eldr_test_read_into(c->errpath, g_err, sizeof g_err);
  unlink(c->errpath);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A TCP socket listening on 127.0.0.1; *port = its port. */
static int listening(unsigned *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 4), 0);
  socklen_t l = sizeof a;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

static int setup(void **st) {
  (void)st;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr-test-status-XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_trace, sizeof g_trace, "%s/t.jsonl", g_dir);
  snprintf(g_art, sizeof g_art, "%s/a.json", g_dir);
  snprintf(g_mal, sizeof g_mal, "%s/mal.jsonl", g_dir);
  if (run((const char *[]){"trace", "gen", "-n", "40", "--max-decode-tokens", "8", "-q", "-o", g_trace, NULL}) ||
      run((const char *[]){"fit", "--trace", g_trace, "--decoders", "2", "-q", "-o", g_art, NULL}))
    return -1;
  /* 20 good lines, then one that is not JSON */
  char *t = eldr_test_slurp(g_trace, NULL);
  if (!t) return -1;
  FILE *f = fopen(g_mal, "w");
  const char *p = t;
  for (int i = 0; i < 20 && p; i++) p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
  if (!f || !p) return -1;
  fwrite(t, 1, (size_t)(p - t), f);
  fputs("{\"id\": 5, bad}\n", f);
  fclose(f);
  free(t);
  return 0;
}

static int teardown(void **st) {
  (void)st;
  return eldr_test_rmtree(g_dir);
}

/* ---- exit status -------------------------------------------------------------- */

/* An input that is not there: 1 in every command, the message naming it. */
static void test_missing_input_is_1(void **st) {
  (void)st;
  char out[256], sub[256];
  snprintf(out, sizeof out, "%s/x.json", g_dir);
  snprintf(sub, sizeof sub, "%s/st", g_dir);
  const char *const cases[][16] = {
      {"fit", "--trace", "/nope/t.jsonl", "--decoders", "2", "-o", out},
      {"rho", "--trace", "/nope/t.jsonl"},
      {"trace", "stats", "/nope/t.jsonl"},
      {"trace", "compact", "/nope/t.jsonl", "-o", out},
      {"sim", "-q", "--trace", "/nope/t.jsonl"},
      {"sim", "-q", "--trace", g_trace, "--artifact", "/nope/a.json"},
      {"study", "fig3", "-q", "--trace", "/nope/t.jsonl", "--out", sub},
      {"worker", "--port", "0", "--trace", "/nope/t.jsonl"},
      {"worker", "--port", "0", "--corpus", "/nope/dir"},
      {"bench", "load", "--target", "http://127.0.0.1:1", "--trace", "/nope/t.jsonl"},
      {"demo", "--trace", "/nope/t.jsonl"},
      {"serve", "--config", "/nope/c.json"},
      {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port", "0", "--artifact",
       "/nope/a.json"},
      {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--artifact", "/nope/a.json",
       "--check-config"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run(cases[i]);
    if (rc != 1 || !strstr(g_err, "/nope/"))
      fail_msg("eldr %s %s ... (case %zu): exit %d, want 1; stderr '%.300s'", cases[i][0], cases[i][1], i, rc, g_err);
  }
}

/* An output that cannot be written: 1, before the work. */
static void test_unwritable_output_is_1(void **st) {
  (void)st;
  const char *const cases[][16] = {
      {"fit", "--trace", g_trace, "--decoders", "2", "-o", "/nonexistent/x.json"},
      {"trace", "gen", "-n", "3", "-o", "/nonexistent/x.jsonl"},
      {"trace", "compact", g_trace, "-o", "/nonexistent/x.jsonl"},
      {"trace", "stats", g_trace, "--plot", "/nonexistent/x.png"},
      {"sim", "-q", "--trace", g_trace, "--csv", "/nonexistent/x.csv"},
      {"sim", "-q", "--trace", g_trace, "--plot", "/nonexistent/d/e"},
      {"study", "fig2", "-q", "--out", "/nonexistent/d/e"},
      {"demo", "--plot", "/nonexistent/x.png"},
      {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port", "0", "--access-log",
       "/nonexistent/x.log"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const double t0 = now();
    int rc = run(cases[i]);
    if (rc != 1 || !strstr(g_err, "/nonexistent/"))
      fail_msg("eldr %s %s ... (case %zu): exit %d, want 1; stderr '%.300s'", cases[i][0], cases[i][1], i, rc, g_err);
    if (now() - t0 > 10) fail_msg("eldr %s %s: the output was found unwritable only after the work", cases[i][0], cases[i][1]);
  }
  /* the command line naming an input as the output is a usage error */
  assert_int_equal(run((const char *[]){"trace", "compact", g_trace, "-o", g_trace, NULL}), 2);
}

/* A port in use: 1 for the router and the worker, naming it. */
static void test_port_in_use_is_1(void **st) {
  (void)st;
  unsigned port;
  int fd = listening(&port);
  char p[16];
  snprintf(p, sizeof p, "%u", port);
  int rs = run((const char *[]){"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port", p,
                                "--quiet", NULL});
  char es[4096];
  snprintf(es, sizeof es, "%.4000s", g_err);
  int rw = run((const char *[]){"worker", "--port", p, NULL});
  close(fd);
  if (rs != 1 || !strstr(es, "Address already in use")) fail_msg("serve: exit %d, stderr '%s'", rs, es);
  if (rw != 1 || !strstr(g_err, "Address already in use")) fail_msg("worker: exit %d, stderr '%s'", rw, g_err);
  /* "eldr worker: worker: ...": the library's module name is not a second prefix */
  if (strstr(g_err, "worker: worker:")) fail_msg("prefix doubled: '%s'", g_err);
}

/* --check-config=resolve fails exactly where the start fails, with the
 * same status: a record directory that cannot be made, an access log that
 * cannot be written, a port in use, a missing artifact; and passes where
 * the start comes up. */
static void test_check_config_as_start(void **st) {
  (void)st;
  unsigned port;
  int fd = listening(&port);
  char p[16];
  snprintf(p, sizeof p, "%u", port);
  const char *const extra[][4] = {
      {"--record", "/proc/nope", "--record-experts", "8"},
      {"--access-log", "/nonexistent/x.log"},
      {"--port", p},
      {"--artifact", "/nope/a.json"},
  };
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    const char *args[16] = {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--quiet"};
    size_t n = 6;
    for (size_t k = 0; k < 4 && extra[i][k]; k++) args[n++] = extra[i][k];
    if (strcmp(extra[i][0], "--port")) args[n++] = "--port", args[n++] = "0";
    args[n] = "--check-config=resolve";
    int check = run(args);
    char ce[2048];
    snprintf(ce, sizeof ce, "%.2000s", g_err);
    args[n] = NULL;
    int start = run(args);
    if (check != 1 || start != 1)
      fail_msg("%s %s: check exit %d ('%s'), start exit %d ('%s'); both must be 1", extra[i][0], extra[i][1], check, ce,
               start, g_err);
  }
  close(fd);
  /* where the start comes up, the check passes */
  char rec[256];
  snprintf(rec, sizeof rec, "%s/rec", g_dir);
  const char *ok[] = {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port", "0",
                      "--record", rec, "--artifact", g_art, "--check-config=resolve", NULL};
  assert_int_equal(run(ok), 0);
  struct stat sb;
  assert_int_not_equal(stat(rec, &sb), 0); /* the check made nothing */
  child c;
  spawn(&c, NULL, (const char *[]){"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port",
                                   "0", "--record", rec, "--artifact", g_art, "--health-interval", "0", NULL});
  char line[256];
  first_line(&c, line, sizeof line, 20);
  assert_non_null(strstr(line, "listening on"));
  assert_int_equal(stop(&c), 0);
}

/* ---- the router's log ------------------------------------------------------- */

/* A message about the whole process is logged once, not once per event
 * loop (at start and at each reload), and "eldr serve:" is not doubled. */
static void test_process_messages_once(void **st) {
  (void)st;
  child c;
  spawn(&c, NULL, (const char *[]){"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--decode",
                                   "http://127.0.0.1:3", "--decode", "http://127.0.0.1:4", "--port", "0", "--threads", "3",
                                   "--policy", "footprint", "--artifact", g_art, "--health-interval", "0", NULL});
  char line[256];
  first_line(&c, line, sizeof line, 20);
  if (wait_err(&c, "event loops models only", 1, 20)) fail_msg("no start lines: '%s'", g_err);
  kill(c.pid, SIGHUP);
  if (wait_err(&c, "reloaded:", 1, 20)) fail_msg("no reload: '%s'", g_err);
  usleep(300000); /* the other loops follow within a turn: their lines, were they logged, are in */
  assert_int_equal(stop(&c), 0);
  /* the artifact has no latency coefficients: footprint runs as JSQ, and
   * it has 2 centroids for 3 decoders: each said once at start and once at
   * the reload, not once per loop */
  if (count(g_err, "it runs as JSQ") != 2) fail_msg("'it runs as JSQ' %zu times:\n%s", count(g_err, "it runs as JSQ"), g_err);
  if (count(g_err, "centroids for 3 decode workers") != 2)
    fail_msg("'centroids for 3 decode workers' %zu times:\n%s", count(g_err, "centroids for 3 decode workers"), g_err);
  assert_int_equal(count(g_err, "event loops models only"), 1);
  assert_int_equal(count(g_err, ": listening on 127.0.0.1:"), 1);
  assert_int_equal(count(g_err, "eldr serve: eldr serve"), 0);
}

/* --threads 0: the CPUs the process may run on (pinned to one: one loop). */
static void test_threads_zero_follows_affinity(void **st) {
  (void)st;
  cpu_set_t all, one;
  assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &all)) {
      CPU_SET(i, &one);
      break;
    }
  assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0); /* the child inherits it */
  child c;
  spawn(&c, NULL, (const char *[]){"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--port",
                                   "0", "--threads", "0", "--health-interval", "0", NULL});
  assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
  char line[256];
  first_line(&c, line, sizeof line, 20);
  int rc = wait_err(&c, "event loop", 1, 20);
  assert_int_equal(stop(&c), 0);
  if (rc || !strstr(g_err, "1 event loop)")) fail_msg("pinned to one CPU, --threads 0 ran: '%s'", g_err);
}

/* A reader's "FILE:LINE: ..." is not prefixed with the file again. */
static void test_file_named_once(void **st) {
  (void)st;
  char out[256];
  snprintf(out, sizeof out, "%s/x.json", g_dir);
  assert_int_equal(run((const char *[]){"fit", "--trace", g_mal, "--decoders", "2", "-q", "-o", out, NULL}), 1);
  if (count(g_err, "mal.jsonl") != 1 || !strstr(g_err, "mal.jsonl:21:")) fail_msg("stderr: '%s'", g_err);
}

/* ---- the worker --------------------------------------------------------------- */

/* The corpus does not depend on where the worker is started: the one
 * installed beside the program or the build's, never ./../shared. */
static void test_worker_corpus_from_any_cwd(void **st) {
  (void)st;
  char seen[2][512];
  const char *cwds[2] = {g_dir, "/"};
  for (int i = 0; i < 2; i++) {
    child c;
    spawn(&c, cwds[i], (const char *[]){"worker", "--port", "0", "--time-scale", "0.01", NULL});
    char line[512];
    first_line(&c, line, sizeof line, 20);
    stop(&c);
    const char *k = strstr(line, " corpus=");
    if (!k) fail_msg("no corpus= in '%s'", line);
    snprintf(seen[i], sizeof seen[i], "%s", k + 8);
    if (strcmp(seen[i], "none") && seen[i][0] != '/') fail_msg("corpus '%s' is relative to the cwd", seen[i]);
  }
  assert_string_equal(seen[0], seen[1]);
  struct stat sb;
  if (stat(ELDR_SHARED_DIR "/corpus", &sb) == 0 && S_ISDIR(sb.st_mode))
    assert_string_equal(seen[0], ELDR_SHARED_DIR "/corpus");
}

/* `eldr bench load` on its defaults (it sends eldr_trace_id) against a
 * worker started without a trace: every request served. */
static void test_bench_load_on_defaults(void **st) {
  (void)st;
  child c;
  spawn(&c, NULL, (const char *[]){"worker", "--port", "0", "--time-scale", "0.01", NULL});
  char line[512];
  first_line(&c, line, sizeof line, 20);
  const char *p = strstr(line, "127.0.0.1:");
  assert_non_null(p);
  char target[64];
  snprintf(target, sizeof target, "http://127.0.0.1:%d", atoi(p + 10));
  int rc = run((const char *[]){"bench", "load", "--target", target, "--trace", g_trace, "--rate", "50", "--requests",
                                "5", "--json", NULL});
  stop(&c);
  if (rc != 0) fail_msg("bench load: exit %d, stderr '%s'", rc, g_err);
  json_t *j = json_loads(g_out, 0, NULL);
  if (!j) fail_msg("bench load --json: '%s'", g_out);
  json_t *ok = json_object_get(j, "ok"), *err = json_object_get(j, "errors");
  if (!json_is_integer(ok) || json_integer_value(ok) != 5 || json_array_size(err) != 0)
    fail_msg("bench load: %s", g_out);
  json_decref(j);
}

/* ---- bench_sim -------------------------------------------------------------- */

static void test_bench_sim_usage(void **st) {
  (void)st;
  char bin[512], dir[512];
  snprintf(dir, sizeof dir, "%s", ELDR_BINARY);
  snprintf(bin, sizeof bin, "%s/bench_sim", dirname(dir));
  if (access(bin, X_OK)) skip();
  char ofile[256], efile[256];
  snprintf(ofile, sizeof ofile, "%s/stdout", g_dir);
  snprintf(efile, sizeof efile, "%s/stderr", g_dir);
  const char *h[] = {"/usr/bin/timeout", "20", bin, "-h", NULL};
  assert_int_equal(eldr_test_run(h, ofile, efile), 0); /* not the 35 s benchmark */
  eldr_test_read_into(ofile, g_out, sizeof g_out);
  assert_non_null(strstr(g_out, "usage: bench_sim"));
  const char *lone[] = {"/usr/bin/timeout", "20", bin, "--requests", "10", "--seed", NULL};
  assert_int_equal(eldr_test_run(lone, ofile, efile), 2); /* not dropped and run */
  eldr_test_read_into(efile, g_err, sizeof g_err);
  assert_non_null(strstr(g_err, "--seed needs a value"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_input_is_1),
      cmocka_unit_test(test_unwritable_output_is_1),
      cmocka_unit_test(test_port_in_use_is_1),
      cmocka_unit_test(test_check_config_as_start),
      cmocka_unit_test(test_process_messages_once),
      cmocka_unit_test(test_threads_zero_follows_affinity),
      cmocka_unit_test(test_file_named_once),
      cmocka_unit_test(test_worker_corpus_from_any_cwd),
      cmocka_unit_test(test_bench_load_on_defaults),
      cmocka_unit_test(test_bench_sim_usage),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
