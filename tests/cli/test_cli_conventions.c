/* test_cli_conventions.c — the conventions every `eldr` command keeps, run
 * as a user runs them: -h and --help print the usage on stdout and exit 0;
 * an unknown flag, a missing value or a bad value exits 2 with one line on
 * stderr naming it, before anything starts (no banner, no process, no
 * file); the top-level help lists every command and subcommand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "support/proc.h"

static char g_dir[64];
static char g_out[1 << 16], g_err[1 << 16];

static int run(const char *const *args) {
  return eldr_test_run_captured(ELDR_BINARY, g_dir, args, g_out, sizeof g_out, g_err, sizeof g_err);
}

static size_t lines(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static int setup(void **st) {
  (void)st;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr-test-cli-XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **st) {
  (void)st;
  char p[128];
  snprintf(p, sizeof p, "%s/stdout", g_dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/stderr", g_dir);
  unlink(p);
  return rmdir(g_dir);
}

/* every command, as argv after the binary */
#define MAXA 8
static const char *const k_commands[][MAXA] = {
    {"fit"},          {"rho"},         {"trace"},       {"trace", "gen"}, {"trace", "stats"},
    {"trace", "compact"},
    {"sim"},          {"serve"},       {"worker"},      {"demo"},         {"bench"},
    {"bench", "moe-layer"}, {"bench", "load"}, {"bench", "route"},
};

static void test_help_on_every_command(void **st) {
  (void)st;
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++) {
    for (int lng = 0; lng < 2; lng++) {
      const char *args[MAXA + 2] = {0};
      size_t n = 0;
      while (k_commands[i][n]) args[n] = k_commands[i][n], n++;
      args[n] = lng ? "--help" : "-h";
      int rc = run(args);
      if (rc != 0 || !strstr(g_out, "usage: eldr") || g_err[0])
        fail_msg("eldr %s %s %s: exit %d, stdout '%.80s', stderr '%.200s'", k_commands[i][0],
                 k_commands[i][1] ? k_commands[i][1] : "", args[n], rc, g_out, g_err);
    }
  }
}

static void test_bad_flags_and_values_exit_2(void **st) {
  (void)st;
  static const struct {
    const char *args[MAXA];
    const char *needle; /* in the one stderr line */
  } cases[] = {
      {{"frob"}, "frob"},
      {{"fit", "--bogus"}, "--bogus"},
      {{"fit", "--decoders", "abc"}, "--decoders"},
      {{"rho", "--bogus"}, "--bogus"},
      {{"rho", "--trace"}, "--trace"},
      {{"trace", "frob"}, "frob"},
      {{"trace", "gen", "--bogus"}, "--bogus"},
      {{"trace", "gen", "--requests", "abc"}, "--requests"},
      {{"trace", "stats", "--bogus"}, "--bogus"},
      {{"trace", "compact", "--bogus"}, "--bogus"},
      {{"trace", "compact", "t.jsonl"}, "--output"},
      {{"trace", "gen", "--requests", "3", "-o", "x", "--form", "rows"}, "--form"},
      {{"trace", "stats", "t.jsonl", "--batch", "0"}, "--batch"},
      {{"sim", "--bogus"}, "--bogus"},
      {{"sim", "-x"}, "-x"},
      {{"sim", "--generate", "task", "--prefill", "0"}, "--prefill"},
      {{"sim", "--generate", "task", "--policies", "fastest"}, "fastest"},
      {{"serve", "--bogus"}, "--bogus"},
      {{"serve", "--prefill"}, "--prefill"},
      {{"serve", "--port", "99999"}, "--port"},
      {{"serve", "--policy", "bogus"}, "--policy"},
      {{"serve", "extra"}, "extra"},
      {{"worker", "--bogus"}, "--bogus"},
      {{"worker", "--port", "99999"}, "--port"},
      {{"worker", "--model", "gpt-9"}, "gpt-9"},
      {{"worker", "--hardware", "tpu"}, "tpu"},
      {{"worker", "--role", "middle"}, "--role"},
      {{"worker", "--routed-experts-layout", "bogus"}, "--routed-experts-layout"},
      {{"worker", "--routed-experts-prompt", "some"}, "--routed-experts-prompt"},
      {{"worker", "--corpus", "/nonexistent/dir"}, "/nonexistent/dir"},
      {{"worker", "--kv-abort-timeout", "-1"}, "--kv-abort-timeout"},
      {{"demo", "--bogus"}, "--bogus"},
      {{"demo", "--rate", "abc"}, "--rate"},
      {{"demo", "--model", "gpt-9"}, "gpt-9"},
      {{"demo", "--hardware", "tpu"}, "tpu"},
      {{"demo", "--workload", "magic"}, "magic"},
      {{"demo", "--plot", "chart.pdf"}, "--plot"},
      {{"demo", "--drift", "--trace", ELDR_SOURCE_DIR "/README.md"}, "--drift"},
      {{"bench", "frob"}, "frob"},
      {{"bench", "moe-layer", "--bogus"}, "--bogus"},
      {{"bench", "moe-layer", "--experts", "abc"}, "--experts"},
      {{"bench", "load", "--bogus"}, "--bogus"},
      {{"bench", "load", "--rate", "-1"}, "--rate"},
      {{"bench", "load", "--target", "ftp://x", "--trace", "t.jsonl"}, "--target"},
      {{"bench", "route", "--bogus"}, "--bogus"},
      {{"bench", "route", "--iters", "0"}, "--iters"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run(cases[i].args);
    if (rc != 2 || lines(g_err) != 1 || !strstr(g_err, cases[i].needle) || g_out[0])
      fail_msg("eldr %s %s %s: exit %d (want 2), stderr '%.300s', stdout '%.80s'", cases[i].args[0],
               cases[i].args[1] ? cases[i].args[1] : "", cases[i].args[2] ? cases[i].args[2] : "", rc,
               g_err, g_out);
  }
}

/* every command that prints a table offers --json instead */
static void test_json_on_every_table(void **st) {
  (void)st;
  static const char *const tables[][3] = {{"fit"},  {"rho"},         {"trace", "stats"},
                                          {"sim"},  {"demo"},        {"bench", "moe-layer"},
                                          {"bench", "load"}, {"bench", "route"}};
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
    const char *args[4] = {tables[i][0], tables[i][1] ? tables[i][1] : "--help",
                           tables[i][1] ? "--help" : NULL, NULL};
    if (run(args) != 0 || !strstr(g_out, "--json"))
      fail_msg("eldr %s %s: no --json in its help", tables[i][0], tables[i][1] ? tables[i][1] : "");
  }
  const char *route[] = {"bench", "route", "--json", "--iters", "3", "--tokens", "16", NULL};
  assert_int_equal(run(route), 0);
  json_error_t e;
  json_t *j = json_loads(g_out, 0, &e);
  if (!j) fail_msg("bench route --json: %s in '%.200s'", e.text, g_out);
  /* 13 stages (the A/B rows: parse+signature by scanner and by tree, the
   * per-id kernels; the memcpy of the blob last), the ratio
   * signature+decision / memcpy, and the signature cache's three ratios */
  assert_int_equal(json_array_size(json_object_get(j, "rows")), 17);
  assert_true(json_is_number(json_object_get(json_array_get(json_object_get(j, "rows"), 0), "p50_us")));
  for (size_t q = 13; q < 17; q++)
    assert_true(json_is_number(json_object_get(json_array_get(json_object_get(j, "rows"), q), "p50_ratio")));
  json_decref(j);
}

static void test_top_level_help_lists_everything(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"--help", NULL}), 0);
  const char *names[] = {"fit", "rho", "trace", "trace gen", "trace stats", "trace compact", "sim", "serve",
                         "worker", "demo", "bench", "bench moe-layer", "bench load",
                         "bench route"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char want[64];
    snprintf(want, sizeof want, "  %s ", names[i]);
    if (!strstr(g_out, want)) fail_msg("eldr --help does not list '%s':\n%s", names[i], g_out);
  }
  /* no command: the same list on stderr, exit 2 */
  assert_int_equal(run((const char *[]){NULL}), 2);
  assert_non_null(strstr(g_err, "bench route"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_on_every_command),
      cmocka_unit_test(test_bad_flags_and_values_exit_2),
      cmocka_unit_test(test_top_level_help_lists_everything),
      cmocka_unit_test(test_json_on_every_table),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
