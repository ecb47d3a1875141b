/* test_cli_conventions.c — the conventions every `eldr` command keeps, run
 * as a user runs them: -h and --help print the usage on stdout and exit 0;
 * an unknown flag, a missing value or a bad value exits 2 with one line on
 * stderr naming it, before anything starts (no banner, no process, no
 * file); the top-level help lists every command and subcommand, --version
 * and the exit-status rule; every help has one layout, every flag that
 * takes a value its default (or "(required)") and its unit; a short flag
 * means one thing in every command (-j is --jobs); --hardware has one
 * default; serve lists every policy it routes by; every key of the router's
 * config file is a flag (or the help says why not) and may be spelled as
 * the flag. What the commands do when the work fails (exit 1) is
 * test_cli_status.c's. */
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
    {"sim"},          {"study"},       {"serve"},       {"worker"},       {"demo"},
    {"bench"},        {"bench", "moe-layer"}, {"bench", "load"}, {"bench", "route"},
};
#define NCOMMANDS (sizeof k_commands / sizeof k_commands[0])

/* The help of command i into g_out (exit 0 checked). */
static void help_of(size_t i) {
  const char *args[MAXA + 2] = {0};
  size_t n = 0;
  while (k_commands[i][n]) args[n] = k_commands[i][n], n++;
  args[n] = "--help";
  if (run(args) != 0) fail_msg("eldr %s %s --help: not 0", k_commands[i][0], k_commands[i][1] ? k_commands[i][1] : "");
}

static const char *name_of(size_t i, char *buf, size_t cap) {
  snprintf(buf, cap, "%s%s%s", k_commands[i][0], k_commands[i][1] ? " " : "", k_commands[i][1] ? k_commands[i][1] : "");
  return buf;
}

/* One option of a help text: the line that names it and the lines that
 * continue its description. */
typedef struct opt_block {
  char shortc;       /* 0 when none */
  char flag[64];     /* "--name" */
  char value[32];    /* its placeholder ("N", "FILE"), "" when it takes none */
  char text[1024];   /* the whole block */
} opt_block;

/* An option line: "  -x, --name ..." (a short form) or "      --name ..."
 * (none); anything else that starts with spaces and a dash is a layout of
 * its own. Returns the number of options found, or -1 naming a bad line in
 * bad. */
static int options_of(const char *help, opt_block *o, int max, char *bad, size_t badcap) {
  int n = 0;
  const char *p = help;
  opt_block *cur = NULL;
  while (*p) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
    p += len + (eol != NULL);
    size_t sp = strspn(line, " ");
    if (line[sp] == '-' && (sp == 2 || sp == 6)) {
      const char *f = line + sp;
      if (n == max) return n;
      cur = &o[n++];
      memset(cur, 0, sizeof *cur);
      if (sp == 2) { /* "-x, --name" */
        if (f[0] != '-' || !f[1] || strncmp(f + 2, ", --", 4)) {
          snprintf(bad, badcap, "%s", line);
          return -1;
        }
        cur->shortc = f[1];
        f += 4;
      } else if (strncmp(f, "--", 2)) {
        snprintf(bad, badcap, "%s", line);
        return -1;
      }
      size_t fl = strcspn(f, " [=");
      snprintf(cur->flag, sizeof cur->flag, "%.*s", (int)fl, f);
      const char *v = f + fl;
      if (*v == ' ' && v[1] && v[1] != ' ' && (v[1] == '[' || (v[1] >= 'A' && v[1] <= 'Z')))
        snprintf(cur->value, sizeof cur->value, "%.*s", (int)strcspn(v + 1, " "), v + 1);
      snprintf(cur->text, sizeof cur->text, "%s", line);
    } else if (sp > 0 && line[sp] == '-') {
      snprintf(bad, badcap, "%s", line); /* a flag at another column */
      return -1;
    } else if (cur && sp >= 10) {
      size_t tl = strlen(cur->text);
      snprintf(cur->text + tl, sizeof cur->text - tl, " %s", line + sp);
    } else {
      cur = NULL;
    }
  }
  return n;
}

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

/* One layout: every flag at column 2 ("-x, --name") or 6 ("--name"), -h /
 * --help in every help; every flag that takes a value says its default in
 * [brackets] or that it is (required); a value in seconds (S) says
 * "second", one in bytes (BYTES) says "byte". */
static void test_help_layout_defaults_units(void **st) {
  (void)st;
  static opt_block o[96];
  char bad[512], nm[64];
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if (!k_commands[i][1] && (!strcmp(k_commands[i][0], "trace") || !strcmp(k_commands[i][0], "bench")))
      continue; /* the lists of subcommands */
    help_of(i);
    name_of(i, nm, sizeof nm);
    int n = options_of(g_out, o, 96, bad, sizeof bad);
    if (n < 0) fail_msg("eldr %s --help: a line in another layout: '%s'", nm, bad);
    int help = 0;
    for (int k = 0; k < n; k++) {
      if (!strcmp(o[k].flag, "--help")) help = o[k].shortc == 'h';
      if (!o[k].value[0]) continue;
      if (!strchr(o[k].text, '[') && !strstr(o[k].text, "(required"))
        fail_msg("eldr %s: %s %s has no [default] and is not (required): '%s'", nm, o[k].flag, o[k].value, o[k].text);
      if (!strcmp(o[k].value, "S") && !strstr(o[k].text, "second"))
        fail_msg("eldr %s: %s S does not say its unit (seconds): '%s'", nm, o[k].flag, o[k].text);
      if (!strcmp(o[k].value, "BYTES") && !strstr(o[k].text, "byte"))
        fail_msg("eldr %s: %s BYTES does not say bytes: '%s'", nm, o[k].flag, o[k].text);
    }
    if (!help) fail_msg("eldr %s --help lists no '-h, --help'", nm);
  }
}

/* A short flag means one thing in every command: -j is --jobs everywhere
 * (trace stats has no -j; --json is spelled out), -q --quiet, -s --seed,
 * -m --model, -t --trace; -o is the output (a file, or study's directory). */
static void test_short_flags_mean_one_thing(void **st) {
  (void)st;
  static opt_block o[96];
  char seen[128][64];
  memset(seen, 0, sizeof seen);
  char bad[512], nm[64];
  for (size_t i = 0; i < NCOMMANDS; i++) {
    help_of(i);
    name_of(i, nm, sizeof nm);
    int n = options_of(g_out, o, 96, bad, sizeof bad);
    for (int k = 0; k < n; k++) {
      unsigned char c = (unsigned char)o[k].shortc;
      if (!c) continue;
      const char *f = o[k].flag;
      if (c == 'o' && (!strcmp(f, "--output") || !strcmp(f, "--out"))) f = "--output";
      if (!seen[c][0]) snprintf(seen[c], sizeof seen[c], "%s", f);
      else if (strcmp(seen[c], f)) fail_msg("-%c is %s in eldr %s but %s elsewhere", c, f, nm, seen[c]);
    }
  }
  assert_string_equal(seen['j'], "--jobs");
  assert_string_equal(seen['q'], "--quiet");
  assert_string_equal(seen['s'], "--seed");
  /* -j in trace stats is no longer --json: a usage error */
  assert_int_equal(run((const char *[]){"trace", "stats", "t.jsonl", "-j", NULL}), 2);
  /* sim takes -j as --jobs (a bad value names it) */
  assert_int_equal(run((const char *[]){"sim", "--generate", "task", "-j", "0", NULL}), 2);
  assert_non_null(strstr(g_err, "--jobs"));
}

/* --hardware: one default, the same words, in every command that has it. */
static void test_hardware_one_default(void **st) {
  (void)st;
  char nm[64];
  int with = 0;
  for (size_t i = 0; i < NCOMMANDS; i++) {
    help_of(i);
    const char *h = strstr(g_out, "--hardware H");
    if (!h) continue;
    with++;
    const char *eol = strstr(h, "]");
    if (!eol || !strstr(h, "[mi300x; h200 for llama4-maverick]") ||
        strstr(h, "[mi300x; h200 for llama4-maverick]") > eol)
      fail_msg("eldr %s: --hardware's default is not '[mi300x; h200 for llama4-maverick]'", name_of(i, nm, sizeof nm));
  }
  assert_int_equal(with, 5); /* fit, sim, study, worker, demo */
}

/* serve lists every policy it routes by, in its help and in the error for
 * a policy it does not know; demo lists every one it runs. */
static void test_policies_listed(void **st) {
  (void)st;
  static const char *const pols[] = {"eldr", "footprint", "jsq", "p2c", "rr", "random"};
  assert_int_equal(run((const char *[]){"serve", "--help", NULL}), 0);
  const char *pl = strstr(g_out, "--policy NAME");
  assert_non_null(pl);
  char line[256];
  snprintf(line, sizeof line, "%.*s", (int)strcspn(pl, "["), pl);
  for (size_t i = 0; i < 6; i++)
    if (!strstr(line, pols[i])) fail_msg("serve --help: --policy does not list %s: '%s'", pols[i], line);
  assert_int_equal(run((const char *[]){"serve", "--policy", "fastest", NULL}), 2);
  for (size_t i = 0; i < 6; i++)
    if (!strstr(g_err, pols[i])) fail_msg("serve --policy fastest: '%s' does not list %s", g_err, pols[i]);
  assert_int_equal(run((const char *[]){"demo", "--policies", "fastest", NULL}), 2);
  for (size_t i = 0; i < 6; i++)
    if (!strstr(g_err, pols[i])) fail_msg("demo --policies fastest: '%s' does not list %s", g_err, pols[i]);
}

/* Every key the router's config file takes (src/serve/config.c) is a flag of
 * `eldr serve` spelled with dashes, or the help names the key and says why
 * it has none; and the file takes a key spelled as its flag. */
static void test_config_keys_are_flags(void **st) {
  (void)st;
  char *src = eldr_test_slurp(ELDR_SOURCE_DIR "/src/serve/config.c", NULL);
  assert_non_null(src);
  assert_int_equal(run((const char *[]){"serve", "--help", NULL}), 0);
  int keys = 0;
  for (const char *p = strstr(src, "strcmp(key, \""); p; p = strstr(p + 1, "strcmp(key, \"")) {
    char key[64], flag[72];
    const char *k = p + strlen("strcmp(key, \"");
    snprintf(key, sizeof key, "%.*s", (int)strcspn(k, "\""), k);
    snprintf(flag, sizeof flag, "--%s", key);
    for (char *c = flag; *c; c++)
      if (*c == '_') *c = '-';
    char with_space[80];
    snprintf(with_space, sizeof with_space, "%s ", flag);
    if (!strstr(g_out, with_space) && !strstr(g_out, key))
      fail_msg("config key '%s': no %s in serve --help, and the help does not say why", key, flag);
    keys++;
  }
  free(src);
  assert_true(keys >= 40);
  /* spelled as the flag, or in snake_case: the same key */
  char cfg[128];
  snprintf(cfg, sizeof cfg, "%s/c.json", g_dir);
  FILE *f = fopen(cfg, "w");
  assert_non_null(f);
  fputs("{\"prefill\":[\"http://127.0.0.1:1\"],\"decode\":[\"http://127.0.0.1:2\"],\"prefill-timeout\":5,"
        "\"decode_timeout\":9,\"max-connections\":7,\"record-sample\":0.5}",
        f);
  fclose(f);
  assert_int_equal(run((const char *[]){"serve", "--config", cfg, "--check-config", NULL}), 0);
  f = fopen(cfg, "w");
  assert_non_null(f);
  fputs("{\"prefill\":[\"http://127.0.0.1:1\"],\"decode\":[\"http://127.0.0.1:2\"],\"prefill-timeout\":0}", f);
  fclose(f);
  assert_int_equal(run((const char *[]){"serve", "--config", cfg, "--check-config", NULL}), 2);
  assert_non_null(strstr(g_err, "prefill_timeout"));
  f = fopen(cfg, "w");
  assert_non_null(f);
  fputs("{\"prefill\":[\"http://127.0.0.1:1\"],\"decode\":[\"http://127.0.0.1:2\"],\"prefill-timeot\":1}", f);
  fclose(f);
  assert_int_equal(run((const char *[]){"serve", "--config", cfg, "--check-config", NULL}), 2);
  assert_non_null(strstr(g_err, "unknown key 'prefill-timeot'"));
  unlink(cfg);
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
  /* 20 stages (the A/B rows: parse+signature by scanner and by tree, the
   * per-id kernels; the warm, the cold and the hot memcpy of the blob; the
   * signature cache's stores and cached paths; the compact form's two; the
   * signature at the levels below; a new prompt with the cache), the ratio
   * signature+decision / memcpy, the three levels over the warm, cold and
   * hot memcpy, the signature cache's four ratios, and the two forms'
   * reply bytes */
  json_t *rows = json_object_get(j, "rows");
  assert_int_equal(json_array_size(rows), 29);
  for (size_t q = 0; q < 20; q++) assert_true(json_is_number(json_object_get(json_array_get(rows, q), "p50_us")));
  assert_true(json_is_number(json_object_get(json_array_get(rows, 20), "p50_ratio")));
  for (size_t q = 21; q < 24; q++) {
    assert_true(json_is_number(json_object_get(json_array_get(rows, q), "p50_ratio_warm")));
    assert_true(json_is_number(json_object_get(json_array_get(rows, q), "p50_ratio_cold")));
    assert_true(json_is_number(json_object_get(json_array_get(rows, q), "p50_ratio_hot")));
  }
  for (size_t q = 24; q < 28; q++) assert_true(json_is_number(json_object_get(json_array_get(rows, q), "p50_ratio")));
  assert_true(json_integer_value(json_object_get(json_array_get(rows, 28), "npy_bytes")) > 0);
  assert_true(json_integer_value(json_object_get(json_array_get(rows, 28), "compact_bytes")) > 0);
  json_decref(j);
}

static void test_top_level_help_lists_everything(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"--help", NULL}), 0);
  /* --version and the exit-status rule are in it */
  assert_non_null(strstr(g_out, "eldr --version"));
  assert_non_null(strstr(g_out, "exit status"));
  for (const char *const *l = (const char *const[]){"  0  done", "  1  the work failed", "  2  the command line is wrong", NULL}; *l; l++)
    if (!strstr(g_out, *l)) fail_msg("eldr --help lacks '%s'", *l);

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
  assert_int_equal(run((const char *[]){"--version", NULL}), 0);
  assert_non_null(strstr(g_out, "simd: "));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_on_every_command),
      cmocka_unit_test(test_help_layout_defaults_units),
      cmocka_unit_test(test_short_flags_mean_one_thing),
      cmocka_unit_test(test_hardware_one_default),
      cmocka_unit_test(test_policies_listed),
      cmocka_unit_test(test_config_keys_are_flags),
      cmocka_unit_test(test_bad_flags_and_values_exit_2),
      cmocka_unit_test(test_top_level_help_lists_everything),
      cmocka_unit_test(test_json_on_every_table),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
