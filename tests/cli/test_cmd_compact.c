/* test_cmd_compact.c — the counts form from the command line: `eldr trace
 * compact` equals `trace gen --form counts`, commands that need counts only
 * (fit, rho, trace stats (a)) give the same results on either form, several
 * inputs (directory, glob, repeated --trace) read as one trace, a torn last
 * line is a note, and commands that need per-token rows fail naming the
 * request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/proc.h"

static char g_dir[256];
static char g_out[512], g_err[512];

/* Run eldr with args (NULL-terminated); stdout/stderr go to g_out/g_err.
 * Returns the exit status (or 128 + signal). */
#define run(...) eldr_test_eldr(g_out, g_err, __VA_ARGS__)

static const char *in_dir(const char *name) {
  static char buf[8][512];
  static int i;
  char *p = buf[i++ & 7];
  snprintf(p, 512, "%s/%s", g_dir, name);
  return p;
}

static char *out_text(void) { return eldr_test_slurp(g_out, NULL); }
static char *err_text(void) { return eldr_test_slurp(g_err, NULL); }

static void expect_ok(int rc, const char *what) {
  if (rc != 0) {
    char *e = err_text();
    fail_msg("%s: exit %d, stderr: %s", what, rc, e);
  }
}

/* Exit want, and stderr mentions needle. */
static void expect_fail(int rc, int want, const char *needle) {
  char *e = err_text();
  if (rc != want || !strstr(e, needle))
    fail_msg("exit %d (want %d), stderr '%s' lacks '%s'", rc, want, e, needle);
  free(e);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr_test_compact_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_out, sizeof g_out, "%s/stdout.txt", g_dir);
  snprintf(g_err, sizeof g_err, "%s/stderr.txt", g_dir);
  /* a small model so that the whole file runs in well under a second */
  if (run("trace", "gen", "-m", "custom:6,32,4", "-n", "120", "-q", "--max-prompt-tokens", "64",
          "--max-decode-tokens", "32", "-o", in_dir("tok.jsonl"), NULL))
    return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(g_dir);
}

static void test_compact_equals_gen_counts(void **state) {
  (void)state;
  expect_ok(run("trace", "compact", in_dir("tok.jsonl"), "-o", in_dir("cnt.jsonl"), NULL), "compact");
  char *e = err_text();
  assert_non_null(strstr(e, "120 requests from 1 file"));
  assert_non_null(strstr(e, "smaller"));
  free(e);
  expect_ok(run("trace", "gen", "-m", "custom:6,32,4", "-n", "120", "-q", "--max-prompt-tokens",
                "64", "--max-decode-tokens", "32", "--form", "counts", "-o", in_dir("gen.jsonl"),
                NULL),
            "gen --form counts");
  size_t n1, n2, n3;
  char *a = eldr_test_slurp(in_dir("cnt.jsonl"), &n1), *b = eldr_test_slurp(in_dir("gen.jsonl"), &n2);
  char *t = eldr_test_slurp(in_dir("tok.jsonl"), &n3);
  assert_int_equal(n1, n2);
  assert_memory_equal(a, b, n1);
  assert_true(n1 < n3);
  assert_non_null(strstr(a, "\"form\":\"counts\""));
  free(a);
  free(b);
  free(t);
  /* compacting a compacted trace changes nothing */
  expect_ok(run("trace", "compact", "-q", in_dir("cnt.jsonl"), "-o", in_dir("cnt2.jsonl"), NULL),
            "compact twice");
  a = eldr_test_slurp(in_dir("cnt.jsonl"), &n1);
  b = eldr_test_slurp(in_dir("cnt2.jsonl"), &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(a, b, n1);
  free(a);
  free(b);
  /* refusing to overwrite an input */
  expect_fail(run("trace", "compact", in_dir("cnt.jsonl"), "-o", in_dir("cnt.jsonl"), NULL), 2,
              "refusing to write over the input");
}

/* fit and rho need counts only: the same numbers from either form */
static void test_counts_only_commands_agree(void **state) {
  (void)state;
  expect_ok(run("trace", "compact", "-q", in_dir("tok.jsonl"), "-o", in_dir("c.jsonl"), NULL), "compact");
  char *r[2];
  const char *src[2] = {in_dir("tok.jsonl"), in_dir("c.jsonl")};
  for (int i = 0; i < 2; i++) {
    expect_ok(run("fit", "-t", src[i], "-k", "3", "-q", "--json", "--created",
                  "2026-01-01T00:00:00Z", "-o", in_dir(i ? "a1.json" : "a0.json"), NULL),
              "fit");
    expect_ok(run("rho", "-t", src[i], "--json", NULL), "rho");
    r[i] = out_text();
    char *q = strstr(r[i], "\"representation\""); /* drop the trace name */
    assert_non_null(q);
    memmove(r[i], q, strlen(q) + 1);
  }
  assert_string_equal(r[0], r[1]);
  free(r[0]);
  free(r[1]);
  /* the artifacts differ only in the trace they name */
  char *a = eldr_test_slurp(in_dir("a0.json"), NULL), *b = eldr_test_slurp(in_dir("a1.json"), NULL);
  char *pa = strstr(a, "tok.jsonl"), *pb = strstr(b, "c.jsonl");
  assert_non_null(pa);
  assert_non_null(pb);
  memmove(pa, pa + 3, strlen(pa + 3) + 1); /* "tok.jsonl" -> ".jsonl" */
  memmove(pb, pb + 1, strlen(pb + 1) + 1); /* "c.jsonl" -> ".jsonl" */
  assert_string_equal(a, b);
  free(a);
  free(b);
  /* trace stats: (a) agrees, (b) says why it is missing */
  expect_ok(run("trace", "stats", in_dir("c.jsonl"), NULL), "stats");
  char *o = out_text();
  assert_non_null(strstr(o, "(b) distinct experts per layer per decode step: not available"));
  char *corr = strstr(o, "(a) prefill->decode");
  assert_non_null(corr);
  char line_c[160];
  snprintf(line_c, sizeof line_c, "%.*s", (int)strcspn(corr, "\n"), corr);
  free(o);
  expect_ok(run("trace", "stats", in_dir("tok.jsonl"), NULL), "stats tokens");
  o = out_text();
  assert_non_null(strstr(o, line_c));
  free(o);
  expect_fail(run("trace", "stats", in_dir("c.jsonl"), "--plot", in_dir("p.svg"), NULL), 1,
              "--plot draws (b)");
}

/* commands that replay tokens say so, naming the request */
static void test_token_commands_refuse(void **state) {
  (void)state;
  expect_ok(run("trace", "compact", "-q", in_dir("tok.jsonl"), "-o", in_dir("c.jsonl"), NULL), "compact");
  expect_fail(run("sim", "-t", in_dir("c.jsonl"), "-q", NULL), 1,
              "is in the counts form (per-layer expert counts, no per-token rows); sim replays");
  expect_fail(run("fit", "-t", in_dir("c.jsonl"), "-k", "2", "-q", "--representation", "gate", "-o",
                  in_dir("g.json"), NULL),
              1, "--representation gate needs per-token prefill_gates");
  expect_fail(run("rho", "-t", in_dir("c.jsonl"), "--representation", "logit", NULL), 1,
              "representation logit needs the per-token form");
  expect_fail(run("sim", "-t", in_dir("tok.jsonl"), "--serve-trace", in_dir("c.jsonl"), "-q", NULL),
              1, "c.jsonl: request");
}

/* several inputs: a directory, a glob and repeated --trace read as one trace */
static void test_inputs(void **state) {
  (void)state;
  mkdir(in_dir("rec"), 0755);
  /* split the counts trace into three files; the last one ends in a torn line */
  expect_ok(run("trace", "compact", "-q", in_dir("tok.jsonl"), "-o", in_dir("all.jsonl"), NULL), "compact");
  size_t n;
  char *all = eldr_test_slurp(in_dir("all.jsonl"), &n);
  const char *names[3] = {"rec/part-1.jsonl", "rec/part-2.jsonl", "rec/part-3.jsonl"};
  char *p = all;
  for (int f = 0; f < 3; f++) {
    FILE *o = fopen(in_dir(names[f]), "wb");
    assert_non_null(o);
    for (int l = 0; l < 40; l++) {
      char *nl = strchr(p, '\n');
      fwrite(p, 1, (size_t)(nl - p + 1), o);
      p = nl + 1;
    }
    if (f == 2) fputs("{\"id\":\"torn\",\"model\":\"cus", o); /* kill -9 mid-write */
    fclose(o);
  }
  free(all);
  expect_ok(run("rho", "-t", in_dir("all.jsonl"), "--json", NULL), "rho one file");
  char *one = out_text();
  expect_ok(run("rho", "-t", in_dir("rec"), "--json", NULL), "rho dir");
  char *dir = out_text();
  char *e = err_text();
  assert_non_null(strstr(e, "part-3.jsonl:41: last line"));
  assert_non_null(strstr(e, "note"));
  free(e);
  char glob[600];
  snprintf(glob, sizeof glob, "%s/rec/part-*.jsonl", g_dir);
  expect_ok(run("rho", "-t", in_dir("rec/part-1.jsonl"), "-t", glob, "--json", NULL), "rho glob");
  char *twice = out_text();
  /* the same rho from one file and from its three parts */
  const char *r1 = strstr(one, "\"rho\""), *r2 = strstr(dir, "\"rho\"");
  assert_non_null(r1);
  assert_non_null(r2);
  assert_string_equal(r1, r2);
  assert_non_null(strstr(twice, "\"requests\": 160")); /* part 1 counted twice */
  assert_non_null(strstr(dir, "\"requests\": 120"));
  free(one);
  free(dir);
  free(twice);
  expect_ok(run("fit", "-t", in_dir("rec"), "-k", "2", "-q", "-o", in_dir("d.json"), NULL), "fit dir");
  char *o = out_text();
  assert_non_null(strstr(o, "rec (3 files): 120 requests"));
  free(o);
  /* bad inputs are usage errors naming them */
  expect_fail(run("fit", "-t", in_dir("nope.jsonl"), "-k", "2", "-o", in_dir("x.json"), NULL), 1,
              "nope.jsonl: no such file");
  snprintf(glob, sizeof glob, "%s/rec/*.nothing", g_dir);
  expect_fail(run("rho", "-t", glob, NULL), 1, "no file matches");
  mkdir(in_dir("empty"), 0755);
  expect_fail(run("trace", "stats", in_dir("empty"), NULL), 1, "holds no *.jsonl");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_compact_equals_gen_counts),
      cmocka_unit_test(test_counts_only_commands_agree),
      cmocka_unit_test(test_token_commands_refuse),
      cmocka_unit_test(test_inputs),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
