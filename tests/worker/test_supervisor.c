/* test_supervisor.c — the local-cluster supervisor (eldr/cluster.h) on real
 * processes: a worker started from ELDR_BINARY is ready when it prints its
 * line, its /metrics is read with the router's HTTP client, a child that
 * never becomes ready is stopped within the bound, one-shot children give
 * their exit status, and nothing is left running. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eldr/cluster.h"
#include "support/proc.h"

static void test_worker_ready_and_scraped(void **st) {
  (void)st;
  eldr_cluster *c = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_cluster_new(eldr_test_binary(), NULL, NULL, &c, &d), 0);
  char *args[] = {"worker", "--role", "decode", "--model", "olmoe-1b-7b", "--port", "0", NULL};
  char line[512];
  int rc = eldr_cluster_spawn(c, args, 30, line, sizeof line, &d);
  if (rc) fail_msg("%s", d.msg);
  const char *u = strstr(line, "http://");
  assert_non_null(u);
  char url[64];
  snprintf(url, sizeof url, "%.*s", (int)strcspn(u, " "), u);
  eldr_decode_counters acc = {0};
  rc = eldr_cluster_scrape(url, 5, &acc, &d);
  if (rc) fail_msg("%s", d.msg);
  assert_true(acc.steps == 0 && acc.batch_sum == 0); /* no load yet, but every counter is there */
  /* a bad URL and a port nobody listens on: clear errors, bounded */
  assert_int_equal(eldr_cluster_scrape("ftp://x", 1, &acc, &d), ELDR_EINVAL);
  assert_int_not_equal(eldr_cluster_scrape("http://127.0.0.1:1", 2, &acc, &d), 0);
  assert_non_null(strstr(d.msg, "127.0.0.1:1"));
  eldr_cluster_free(c);
  /* the worker is gone (its port refuses) */
  assert_int_not_equal(eldr_cluster_scrape(url, 2, &acc, &d), 0);
}

static void test_not_ready_and_one_shot(void **st) {
  (void)st;
  eldr_cluster *c = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_cluster_new(eldr_test_binary(), NULL, NULL, &c, &d), 0);
  /* `eldr trace --help` exits at once without the line */
  char *quick[] = {"trace", "--help", NULL};
  char line[256];
  assert_int_equal(eldr_cluster_spawn(c, quick, 10, line, sizeof line, &d), ELDR_EIO);
  assert_non_null(strstr(d.msg, "did not start"));
  int code = -1;
  char *bad[] = {"sim", "--no-such-flag", NULL};
  assert_int_equal(eldr_cluster_run(c, bad, NULL, &code, &d), 0);
  assert_int_equal(code, 2);
  char *ok[] = {"--version", NULL};
  assert_int_equal(eldr_cluster_run(c, ok, NULL, &code, &d), 0);
  assert_int_equal(code, 0);
  eldr_cluster_free(c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worker_ready_and_scraped),
      cmocka_unit_test(test_not_ready_and_one_shot),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
