/* test_record_faults.c — `--record DIR` when the disk goes wrong under it
 * (issue 26, item 4), the recorder behind the real router:
 *
 *   directory removed: every record after the removal is in DIR, made again
 *     by the recorder (none lost into an unlinked file, none counted as
 *     written that is not on disk); a DIR made again by hand (mkdir), and a
 *     DIR renamed away (mv DIR DIR.old), are written too, never the old one.
 *   disk full: `eldr serve --record DIR` with DIR a 64 KiB tmpfs, in its own
 *     user and mount namespace (unshare -rm: no root needed, nothing mounted
 *     outside it; skipped where user namespaces are off). A flood of
 *     requests fills it: every request is answered 200, no empty file is
 *     left, every file holds whole lines, a handful of files and log lines
 *     (the issue saw 587 files and 550 lines in 14 s), and each sampled
 *     request is either written or counted as dropped. Freeing space brings
 *     recording back after the backoff. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/engines.h"
#include "support/fixture.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

/* Lines of every record file in dir, each checked to be a whole JSON
 * record; *files the files, *empty the empty ones. */
static size_t count_lines(const char *dir, int *files, int *empty) {
  *files = *empty = 0;
  DIR *dd = opendir(dir);
  if (!dd) return 0;
  size_t lines = 0;
  struct dirent *de;
  while ((de = readdir(dd))) {
    if (!strstr(de->d_name, ".jsonl")) continue;
    char path[768];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    size_t len = 0;
    char *text = eldr_test_slurp(path, &len);
    if (!text) fail_msg("cannot read %s", path);
    (*files)++;
    if (!len) (*empty)++;
    for (char *s = text, *e; *s; s = e + 1) {
      if (!(e = strchr(s, '\n'))) fail_msg("%s: a torn last line", path);
      json_t *j = json_loadb(s, (size_t)(e - s), 0, NULL);
      const char *form = j ? json_string_value(json_object_get(j, "form")) : NULL;
      if (!form || strcmp(form, "counts"))
        fail_msg("%s: a line that is not a record", path);
      json_decref(j);
      lines++;
    }
    free(text);
  }
  closedir(dd);
  return lines;
}

static void post_some(int port, int n, int from) {
  for (int i = 0; i < n; i++) {
    char body[96];
    snprintf(body, sizeof body, "{\"prompt\":\"record me %d please\",\"max_tokens\":2}", from + i);
    tc_resp r;
    assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &r), 0);
    if (r.status != 200) fail_msg("request %d: %d %s", from + i, r.status, r.body);
    tc_free(&r);
  }
}

/* Wait until the router wrote (or dropped) n records. */
static void wait_records(int port, double n) {
  for (double t0 = fx_now();; usleep(5000)) {
    double w = rt_metric(port, "eldr_record_written_total");
    double d = rt_metric(port, "eldr_record_dropped_total{reason=\"write_error\"}");
    if (w + d >= n) return;
    if (fx_now() - t0 > 10) fail_msg("%g written + %g dropped, not %g", w, d, n);
  }
}

static void test_directory_removed(void **st) {
  (void)st;
  char dir[128], old[160];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_recfault_%d", (int)getpid());
  snprintf(old, sizeof old, "%s.old", dir);
  eldr_test_rmtree(dir);
  eldr_test_rmtree(old);
  eldr_worker_config wc;
  eldr_worker_config_default(&wc);
  wc.time_scale = 0.01;
  sf_rig g;
  sf_start_engines(&g, 1, &wc, 1, &wc);
  g.c.threads = 1;
  g.c.record_dir = strdup(dir);
  g.c.record_experts = 128;
  sf_run(&g);
  int files, empty;
  post_some(g.r.port, 3, 0);
  wait_records(g.r.port, 3);
  assert_int_equal(count_lines(dir, &files, &empty), 3);
  /* removed: the next records are in DIR again */
  assert_int_equal(eldr_test_rmtree(dir), 0);
  post_some(g.r.port, 4, 3);
  wait_records(g.r.port, 7);
  size_t after_rm = count_lines(dir, &files, &empty);
  /* removed and made again by hand: written into the new one */
  assert_int_equal(eldr_test_rmtree(dir), 0);
  assert_int_equal(mkdir(dir, 0755), 0);
  post_some(g.r.port, 2, 7);
  wait_records(g.r.port, 9);
  size_t after_mkdir = count_lines(dir, &files, &empty);
  /* renamed away: DIR is made again, DIR.old gets nothing more */
  assert_int_equal(rename(dir, old), 0);
  post_some(g.r.port, 2, 9);
  wait_records(g.r.port, 11);
  int of, oe;
  size_t in_old = count_lines(old, &of, &oe), after_mv = count_lines(dir, &files, &empty);
  /* the writer thread cannot log: the loop logs what it met at the next
   * record it submits, so one more request, once the 11 are written */
  post_some(g.r.port, 1, 11);
  wait_records(g.r.port, 12);
  double written = rt_metric(g.r.port, "eldr_record_written_total");
  const char *log = rt_log_text(&g.r);
  int notices = 0;
  for (const char *p = log; (p = strstr(p, "was removed or replaced")) != NULL; p++) notices++;
  print_message("--record DIR removed under the router: 4 of 4 later records in DIR made again; made again by hand: "
                "2 of 2; renamed away: 2 of 2 in the new DIR, %zu in DIR.old (its own); written_total %g; %d log "
                "notices\n", in_old, written, notices);
  assert_int_equal(after_rm, 4);
  assert_int_equal(after_mkdir, 2);
  assert_int_equal(after_mv, 2);
  assert_int_equal(in_old, 2); /* what it held before the rename */
  assert_int_equal(written, 12);
  assert_int_equal(rt_metric(g.r.port, "eldr_record_dropped_total{reason=\"write_error\"}"), 0);
  assert_int_equal(notices, 3);
  sf_free(&g);
  eldr_test_rmtree(dir);
  eldr_test_rmtree(old);
}

/* ---- a full disk ---------------------------------------------------------------- */

static pid_t router_pid;

static int kill_all(void **st) {
  (void)st;
  if (router_pid > 0) {
    kill(router_pid, SIGKILL);
    waitpid(router_pid, NULL, 0);
    router_pid = 0;
  }
  eng_stop_all();
  return 0;
}

/* `eldr serve args...` in a new user and mount namespace with a tmpfs of
 * size on dir; its port, or -1 when the namespace cannot be made here. */
static int start_in_namespace(const char *dir, const char *size, const char *logpath, const char *const *args) {
  const char *argv[40] = {"unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=$1 eldr-test-full \"$2\" || exit 99; "
                          "shift 2; exec \"$@\"", "sh", size, dir, eldr_test_binary(), "serve"};
  int n = 10;
  for (int i = 0; args[i]; i++) argv[n++] = args[i];
  argv[n] = NULL;
  int pfd[2];
  if (pipe(pfd)) fail_msg("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    int e = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(pfd[1], 1);
    if (e >= 0) dup2(e, 2);
    close(pfd[0]);
    close(pfd[1]);
    execvp("unshare", (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]);
  router_pid = pid;
  char buf[512] = "";
  size_t bl = 0;
  int port = -1;
  for (double deadline = fx_now() + 20; port < 0 && fx_now() < deadline && bl < sizeof buf - 1;) {
    struct pollfd p = {pfd[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t k = read(pfd[0], buf + bl, sizeof buf - 1 - bl);
    if (k <= 0) break;
    bl += (size_t)k;
    buf[bl] = 0;
    const char *l = strstr(buf, "listening on ");
    const char *colon = l ? strchr(l + 13, '\n') : NULL;
    if (colon) {
      while (colon > l && colon[-1] != ':') colon--;
      port = atoi(colon);
    }
  }
  close(pfd[0]);
  if (port < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    router_pid = 0;
  }
  return port;
}

static int log_count(const char *logpath, const char *word) {
  char *t = eldr_test_slurp(logpath, NULL);
  int n = 0;
  for (const char *p = t; p && (p = strstr(p, word)) != NULL; p++) n++;
  free(t);
  return n;
}

static void test_full_disk(void **st) {
  (void)st;
  char dir[128], logpath[160], seen[192];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_recfull_%d", (int)getpid());
  snprintf(logpath, sizeof logpath, "%s.log", dir);
  eldr_test_rmtree(dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  pid_t pp, dp;
  char purl[48], durl[48];
  eng_url(eng_start("prefill", "0.01", "256", &pp), purl, sizeof purl);
  eng_url(eng_start("decode", "0.01", "256", &dp), durl, sizeof durl);
  const char *args[] = {"--port", "0", "--prefill", purl, "--decode", durl, "--threads", "1", "--record", dir,
                        "--record-experts", "128", NULL};
  int port = start_in_namespace(dir, "64k", logpath, args);
  if (port < 0) {
    char *why = eldr_test_slurp(logpath, NULL);
    if (why && strstr(why, "eldr serve")) fail_msg("the router did not start: %s", why); /* not the namespace */
    print_message("skipped: cannot mount a tmpfs in a user namespace here (unshare -rm): %s\n", why ? why : "");
    free(why);
    unlink(logpath);
    rmdir(dir);
    skip();
  }
  /* the router's view of DIR (its mount namespace) */
  snprintf(seen, sizeof seen, "/proc/%d/root%s", (int)router_pid, dir);
  /* requests for 5 s: the disk fills within the first few, then stays full
   * through several backoff steps (1, 2 s) */
  int N = 0;
  double t0 = fx_now();
  while (fx_now() - t0 < 5) post_some(port, 10, N), N += 10;
  wait_records(port, N);
  double flood_s = fx_now() - t0;
  int files, empty;
  size_t lines = count_lines(seen, &files, &empty);
  double written = rt_metric(port, "eldr_record_written_total");
  double dropped = rt_metric(port, "eldr_record_dropped_total{reason=\"write_error\"}");
  double errors = rt_metric(port, "eldr_record_write_errors_total");
  double paused = rt_metric(port, "eldr_record_paused");
  int loglines = log_count(logpath, "record:");
  print_message("--record DIR on a full 64 KiB tmpfs, %d requests in %.1f s: all 200; %g records written (%zu lines "
                "on disk, in %d files, %d empty), %g dropped as write_error, %g write errors, %d log lines about "
                "it, paused %g\n", N, flood_s, written, lines, files, empty, dropped, errors, loglines, paused);
  assert_true(written >= 1);
  assert_int_equal(lines, (size_t)written); /* counted as written = on disk */
  assert_int_equal(written + dropped, N);
  assert_int_equal(empty, 0);
  assert_true(files <= 3);
  assert_true(errors >= 2);   /* it tried again after its first backoff */
  assert_true(errors <= 8);   /* one attempt per backoff step, not one per record */
  assert_true(loglines <= 2); /* the first error, and at most one more report */
  /* space again: after its backoff the recorder writes again */
  DIR *dd = opendir(seen);
  assert_non_null(dd);
  struct dirent *de;
  while ((de = readdir(dd)))
    if (strstr(de->d_name, ".jsonl")) {
      char path[512];
      snprintf(path, sizeof path, "%s/%s", seen, de->d_name);
      unlink(path);
    }
  closedir(dd);
  double t1 = fx_now();
  for (int i = N;; i++) {
    post_some(port, 1, i);
    if (rt_metric(port, "eldr_record_written_total") > written) break;
    if (fx_now() - t1 > 70) fail_msg("recording did not come back after space was freed");
    usleep(100 * 1000); /* the request rate while waiting for the backoff to end */
  }
  double back = fx_now() - t1;
  post_some(port, 1, 0); /* the loop logs the writer's notice when a record is handed over */
  for (double t2 = fx_now(); !log_count(logpath, "writing to"); usleep(5000))
    if (fx_now() - t2 > 10) fail_msg("no notice that recording came back");
  print_message("space freed: writing again %.1f s later (the backoff), with the log line \"record: writing to DIR "
                "again (N sampled records dropped while it failed)\"\n", back);
  kill(router_pid, SIGTERM);
  int st2;
  waitpid(router_pid, &st2, 0);
  router_pid = 0;
  assert_true(WIFEXITED(st2) && WEXITSTATUS(st2) == 0);
  unlink(logpath);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_directory_removed),
      cmocka_unit_test_teardown(test_full_disk, kill_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
