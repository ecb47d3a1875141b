/* test_cmd_trace.c — `eldr trace gen` and `eldr trace stats` as a user runs
 * them: exit codes, one-line errors, byte-identical output for a seed,
 * the stats table/JSON/plot, and the presets inside their bands. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
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

static int lines_of(const char *path) {
  char *b = eldr_test_slurp(path, NULL);
  int n = 0;
  for (char *p = b; p && *p; p++) n += *p == '\n';
  free(b);
  return n;
}

/* Expect a failure with exactly one line on stderr containing needle. */
static void expect_error(int rc, int want, const char *needle) {
  char *e = eldr_test_slurp(g_err, NULL);
  if (rc != want || lines_of(g_err) != 1 || !strstr(e, needle))
    fail_msg("exit %d (want %d), stderr: '%s' (want one line with '%s')", rc, want, e, needle);
  free(e);
}

static void path_in(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "%s/%s", g_dir, name);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr_test_trace_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  path_in(g_out, sizeof g_out, "stdout.txt");
  path_in(g_err, sizeof g_err, "stderr.txt");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(g_dir);
}

static void test_help(void **state) {
  (void)state;
  assert_int_equal(run("trace", "--help", NULL), 0);
  assert_int_equal(run("trace", "gen", "--help", NULL), 0);
  char *o = eldr_test_slurp(g_out, NULL);
  assert_non_null(strstr(o, "--workload"));
  free(o);
  assert_int_equal(run("trace", "stats", "--help", NULL), 0);
  expect_error(run("trace", "frobnicate", NULL), 2, "unknown subcommand");
}

static void test_gen_errors(void **state) {
  (void)state;
  char t[512];
  path_in(t, sizeof t, "e.jsonl");
  expect_error(run("trace", "gen", "--model", "gpt-5", "--requests", "3", "-o", t, NULL), 2,
               "unknown model");
  expect_error(run("trace", "gen", "--model", "custom:4,8,9", "--requests", "3", "-o", t, NULL),
               2, "top_k");
  expect_error(run("trace", "gen", "--workload", "chat", "--requests", "3", "-o", t, NULL), 2,
               "unknown workload");
  expect_error(run("trace", "gen", "--jobs", "0", "--requests", "3", "-o", t, NULL), 2, "--jobs");
  expect_error(run("trace", "gen", "--workload", "custom:/nonexistent/w.json", "--requests", "3",
                   "-o", t, NULL),
               2, "cannot open");
  expect_error(run("trace", "gen", "--requests", "0", "-o", t, NULL), 2, "--requests");
  expect_error(run("trace", "gen", "--requests", "x", "-o", t, NULL), 2, "--requests");
  expect_error(run("trace", "gen", "-o", t, NULL), 2, "--requests is required");
  expect_error(run("trace", "gen", "--requests", "3", NULL), 2, "--output is required");
  expect_error(run("trace", "gen", "--requests", "3", "-o", t, "--bogus", NULL), 2, "--bogus");
  expect_error(run("trace", "gen", "--requests", "3", "-o", t, "--decode-tokens", NULL), 2,
               "needs a value");
  expect_error(run("trace", "gen", "--requests", "3", "-o", "/nonexistent/dir/t.jsonl", NULL), 1,
               "cannot write");
  struct stat sb;
  assert_true(stat(t, &sb) != 0); /* nothing written on errors */
  /* a custom workload file with a typo names the field */
  char w[512];
  path_in(w, sizeof w, "w.json");
  FILE *f = fopen(w, "w");
  fputs("{\"domian_sd\": 1}", f);
  fclose(f);
  char arg[600];
  snprintf(arg, sizeof arg, "custom:%s", w);
  expect_error(run("trace", "gen", "--workload", arg, "--requests", "3", "-o", t, NULL), 2,
               "domian_sd");
}

/* An output that is not a regular file (a FIFO here; /dev/null in
 * practice) is written in place: the temporary file + rename of a regular
 * output would replace the device with a file. The test holds the FIFO open
 * read-write (non-blocking), so nothing waits for a reader; the small trace
 * fits the pipe's buffer. */
static void test_gen_to_fifo(void **state) {
  (void)state;
  char fifo[512];
  path_in(fifo, sizeof fifo, "fifo");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  int fd = open(fifo, O_RDWR | O_NONBLOCK);
  assert_true(fd >= 0);
  const int rc = run("trace", "gen", "--requests", "1", "--max-prompt-tokens", "4",
                     "--max-decode-tokens", "2", "-q", "-o", fifo, NULL);
  char buf[65536];
  ssize_t got = read(fd, buf, sizeof buf);
  close(fd);
  assert_int_equal(rc, 0);
  assert_true(got > 100);
  struct stat st;
  assert_int_equal(stat(fifo, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
}

static void test_gen_deterministic(void **state) {
  (void)state;
  char a[512], b[512], c[512];
  path_in(a, sizeof a, "a.jsonl");
  path_in(b, sizeof b, "b.jsonl");
  path_in(c, sizeof c, "c.jsonl");
  assert_int_equal(run("trace", "gen", "--model", "olmoe-1b-7b", "--requests", "12",
                       "--max-decode-tokens", "8", "--max-prompt-tokens", "16", "--seed", "5",
                       "-q", "-o", a, NULL),
                   0);
  /* three generator threads: the same bytes as one */
  assert_int_equal(run("trace", "gen", "--model", "olmoe-1b-7b", "--requests", "12",
                       "--max-decode-tokens", "8", "--max-prompt-tokens", "16", "--seed", "5",
                       "-q", "-j", "3", "-o", b, NULL),
                   0);
  assert_int_equal(run("trace", "gen", "--model", "olmoe-1b-7b", "--requests", "12",
                       "--max-decode-tokens", "8", "--max-prompt-tokens", "16", "--seed", "6",
                       "-q", "-o", c, NULL),
                   0);
  size_t la, lb, lc;
  char *xa = eldr_test_slurp(a, &la), *xb = eldr_test_slurp(b, &lb), *xc = eldr_test_slurp(c, &lc);
  assert_non_null(xa);
  assert_true(la > 0 && la == lb);
  assert_memory_equal(xa, xb, la);
  assert_true(la != lc || memcmp(xa, xc, la));
  /* 12 JSONL lines in the trace format */
  int lines = 0;
  for (size_t i = 0; i < la; i++) lines += xa[i] == '\n';
  assert_int_equal(lines, 12);
  json_t *first = json_loadb(xa, (size_t)(strchr(xa, '\n') - xa), 0, NULL);
  assert_non_null(first);
  assert_string_equal(json_string_value(json_object_get(first, "model")), "OLMoE-1B-7B-0924");
  assert_int_equal(json_integer_value(json_object_get(first, "num_experts")), 64);
  assert_int_equal(json_integer_value(json_object_get(first, "top_k")), 8);
  assert_int_equal(json_array_size(json_object_get(first, "layers")), 16);
  assert_non_null(json_object_get(first, "domain"));
  json_decref(first);
  free(xa);
  free(xb);
  free(xc);
  /* stdout output is the same bytes */
  assert_int_equal(run("trace", "gen", "--model", "olmoe-1b-7b", "--requests", "12",
                       "--max-decode-tokens", "8", "--max-prompt-tokens", "16", "--seed", "5",
                       "-q", "-j", "1", "-o", "-", NULL),
                   0);
  size_t lo;
  char *xo = eldr_test_slurp(g_out, &lo);
  xa = eldr_test_slurp(a, &la);
  assert_int_equal(lo, la);
  assert_memory_equal(xo, xa, la);
  free(xo);
  free(xa);
}

/* Parse the stats JSON printed by the last run. */
static json_t *stats_json(void) {
  char *o = eldr_test_slurp(g_out, NULL);
  json_error_t je;
  json_t *r = json_loads(o, 0, &je);
  if (!r) fail_msg("stats JSON: %s: %.200s", je.text, o);
  free(o);
  return r;
}

static double reduction_at(json_t *root, int size) {
  json_t *bs = json_object_get(root, "batches");
  for (size_t i = 0; i < json_array_size(bs); i++) {
    json_t *b = json_array_get(bs, i);
    if (json_integer_value(json_object_get(b, "size")) == size)
      return json_real_value(json_object_get(json_object_get(b, "domain"), "reduction"));
  }
  return NAN;
}

/* Each preset, generated and measured with the commands, is inside its band. */
static void test_presets_in_band(void **state) {
  (void)state;
  const struct {
    const char *wl;
    double lo, hi;
  } cases[] = {{"task", 0.17, 0.21}, {"language", 0.03, 0.10}};
  for (int i = 0; i < 2; i++) {
    char t[512];
    path_in(t, sizeof t, "band.jsonl");
    assert_int_equal(run("trace", "gen", "--workload", cases[i].wl, "--requests", "300",
                         "--decode-tokens", "32", "--seed", "3", "-q", "-o", t, NULL),
                     0);
    assert_int_equal(run("trace", "stats", t, "--batch", "16,32", "--json", "--seed", "3", NULL),
                     0);
    json_t *r = stats_json();
    double corr = json_real_value(json_object_get(json_object_get(r, "correlation"), "median"));
    double r16 = reduction_at(r, 16), r32 = reduction_at(r, 32);
    print_message("%s: corr %.3f, reduction %.1f%% @16, %.1f%% @32\n", cases[i].wl, corr,
                  100 * r16, 100 * r32);
    assert_true(corr >= 0.70 && corr <= 0.92);
    assert_true(r16 >= cases[i].lo && r16 <= cases[i].hi);
    assert_true(r32 >= cases[i].lo && r32 <= cases[i].hi);
    json_t *dom = json_object_get(r, "domains");
    if (i == 1) {
      double top2 = json_real_value(json_object_get(dom, "top2_share"));
      assert_true(top2 > 0.65 && top2 < 0.85);
    } else {
      assert_true(json_array_size(json_object_get(dom, "mix")) >= 6);
    }
    json_decref(r);
  }
}

static void test_stats_table_plot_errors(void **state) {
  (void)state;
  char t[512];
  path_in(t, sizeof t, "s.jsonl");
  assert_int_equal(run("trace", "gen", "--requests", "40", "--decode-tokens", "8",
                       "--max-prompt-tokens", "32", "-q", "-o", t, NULL),
                   0);
  assert_int_equal(run("trace", "stats", t, "--batch", "4,8", "--batches", "8", NULL), 0);
  char *o = eldr_test_slurp(g_out, NULL);
  assert_non_null(strstr(o, "(a) prefill->decode"));
  assert_non_null(strstr(o, "(b) distinct experts"));
  assert_non_null(strstr(o, "(c) domains"));
  free(o);
  expect_error(run("trace", "stats", NULL), 2, "trace file is required");
  expect_error(run("trace", "stats", t, "--batch", "4,0", NULL), 2, "--batch");
  expect_error(run("trace", "stats", t, "--plot", "x.pdf", NULL), 2, "--plot");
  char missing[512];
  path_in(missing, sizeof missing, "missing.jsonl");
  assert_int_equal(run("trace", "stats", missing, NULL), 1);
  assert_int_equal(lines_of(g_err), 1);
  char bad[512];
  path_in(bad, sizeof bad, "bad.jsonl");
  FILE *f = fopen(bad, "w");
  fputs("{\"id\": \"x\"\n", f);
  fclose(f);
  assert_int_equal(run("trace", "stats", bad, NULL), 1);
  assert_int_equal(lines_of(g_err), 1);
  char refbad[512];
  path_in(refbad, sizeof refbad, "ref.json");
  f = fopen(refbad, "w");
  fputs("{\"m\": 3}", f);
  fclose(f);
  expect_error(run("trace", "stats", t, "--olmoe-counts", refbad, NULL), 1, "--olmoe-counts");
  /* without gnuplot on PATH: a clear one-line error */
  {
    char png[512];
    path_in(png, sizeof png, "p.png");
    const char *old_path = getenv("PATH");
    char *saved = old_path ? strdup(old_path) : NULL;
    setenv("PATH", g_dir, 1);
    int rc = run("trace", "stats", t, "--batch", "4", "--batches", "2", "--plot", png, NULL);
    if (saved) {
      setenv("PATH", saved, 1);
      free(saved);
    } else {
      unsetenv("PATH");
    }
    char *e = eldr_test_slurp(g_err, NULL);
    if (rc != 1 || lines_of(g_err) != 1 || !strstr(e, "gnuplot not found"))
      fail_msg("exit %d, stderr '%s'", rc, e);
    free(e);
  }
  if (access("/usr/bin/gnuplot", X_OK) == 0 || access("/usr/local/bin/gnuplot", X_OK) == 0) {
    char svg[512];
    path_in(svg, sizeof svg, "p.svg");
    assert_int_equal(run("trace", "stats", t, "--batch", "4,8", "--batches", "4", "--plot", svg,
                         NULL),
                     0);
    char *s = eldr_test_slurp(svg, NULL);
    assert_non_null(s);
    assert_non_null(strstr(s, "<svg"));
    free(s);
  }
}

/* --artifact: clusters from an artifact fitted by `eldr fit` (when built). */
static void test_stats_artifact(void **state) {
  (void)state;
  char t[512], a[512];
  path_in(t, sizeof t, "art.jsonl");
  path_in(a, sizeof a, "art.json");
  assert_int_equal(run("trace", "gen", "--requests", "120", "--decode-tokens", "8",
                       "--max-prompt-tokens", "48", "--seed", "2", "-q", "-o", t, NULL),
                   0);
  int rc = run("fit", "--trace", t, "--decoders", "4", "-o", a, "--layers", "all", "--restarts",
               "1", "-q", NULL);
  if (rc != 0) {
    char *e = eldr_test_slurp(g_err, NULL);
    print_message("eldr fit unavailable (%d): %s\n", rc, e);
    free(e);
    skip();
  }
  assert_int_equal(run("trace", "stats", t, "--artifact", a, "--batch", "8,16", "--json", NULL),
                   0);
  json_t *r = stats_json();
  assert_int_equal(json_integer_value(json_object_get(r, "clusters")), 4);
  json_t *b = json_array_get(json_object_get(r, "batches"), 0);
  json_t *cl = json_object_get(b, "cluster");
  double dc = json_real_value(json_object_get(cl, "distinct"));
  double dr = json_real_value(json_object_get(json_object_get(b, "random"), "distinct"));
  print_message("cluster %.2f vs random %.2f distinct experts at batch 8\n", dc, dr);
  assert_true(dc > 0 && dc < dr);
  json_decref(r);
  /* an artifact of another shape is refused */
  char t2[512];
  path_in(t2, sizeof t2, "other.jsonl");
  assert_int_equal(run("trace", "gen", "--model", "olmoe-1b-7b", "--requests", "10",
                       "--decode-tokens", "4", "--max-prompt-tokens", "8", "-q", "-o", t2, NULL),
                   0);
  expect_error(run("trace", "stats", t2, "--artifact", a, NULL), 1, "does not match");
}

/* The real Llama 4 trace, when present. */
static void test_stats_real_trace(void **state) {
  (void)state;
  char p[1024];
  snprintf(p, sizeof p, "%s/traces/llama4-mmlu-dev.jsonl", ELDR_SHARED_DIR);
  if (access(p, R_OK) != 0) skip();
  assert_int_equal(run("trace", "stats", p, "--json", "--batches", "32", NULL), 0);
  json_t *r = stats_json();
  assert_int_equal(json_integer_value(json_object_get(r, "requests")), 259);
  double corr = json_real_value(json_object_get(json_object_get(r, "correlation"), "median"));
  assert_true(corr > 0 && corr <= 1);
  assert_true(reduction_at(r, 16) > 0);
  json_decref(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_gen_errors),
      cmocka_unit_test(test_gen_deterministic),
      cmocka_unit_test(test_gen_to_fifo),
      cmocka_unit_test(test_presets_in_band),
      cmocka_unit_test(test_stats_table_plot_errors),
      cmocka_unit_test(test_stats_artifact),
      cmocka_unit_test(test_stats_real_trace),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
