/* test_cmd_fit.c — `eldr fit` / `eldr rho` as a user runs them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/artifact.h"
#include "eldr/placement_io.h"
#include "eldr/latency.h"
#include "eldr/rng.h"
#include "eldr/trace.h"
#include "support/proc.h"

static char g_dir[256];
static char g_trace[512];
static char g_x[600]; /* an output path in g_dir (nothing outside it) */

/* Run the eldr binary with args (NULL-terminated); capture stdout/stderr. */
static int run(char *out, size_t outcap, char *err, size_t errcap, const char *const *args) {
  return eldr_test_run_captured(eldr_test_binary(), g_dir, args, out, outcap, err, errcap);
}

static size_t lines(const char *s) {
  size_t n = 0;
  for (; *s; s++) n += *s == '\n';
  return n;
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr-test-cmd-fit-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  snprintf(g_trace, sizeof g_trace, "%s/t.jsonl", g_dir);
  snprintf(g_x, sizeof g_x, "%s/x.json", g_dir);
  eldr_shape s = {.num_layers = 3, .num_experts = 16, .top_k = 2};
  eldr_trace *t = eldr_trace_new("m", &s, NULL);
  eldr_rng r;
  eldr_rng_seed(&r, 3);
  uint16_t pre[8 * 3 * 2], dec[10 * 3 * 2];
  for (size_t i = 0; i < 24; i++) {
    size_t dom = i % 3;
    for (size_t x = 0; x < 8 * 3 * 2; x++) pre[x] = (uint16_t)((dom * 5 + eldr_rng_below(&r, 5)) % 16);
    for (size_t x = 0; x < 10 * 3 * 2; x++) dec[x] = (uint16_t)((dom * 5 + eldr_rng_below(&r, 5)) % 16);
    char id[32];
    snprintf(id, sizeof id, "q%zu", i);
    assert_true(eldr_trace_append(t, id, dom ? "b" : "a", NULL, -1, pre, 8, dec, 10, NULL) >= 0);
  }
  eldr_diag d = {{0}};
  assert_int_equal(eldr_trace_save(g_trace, t, &d), 0);
  eldr_trace_free(t);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(g_dir);
}

static void test_fit_writes_valid_artifact(void **state) {
  (void)state;
  static char out[65536], err[65536];
  char art[512];
  snprintf(art, sizeof art, "%s/a.json", g_dir);
  const char *args[] = {"fit", "--trace", g_trace, "--decoders", "3", "-o", art, "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, args), 0);
  assert_non_null(strstr(out, "count-idf"));
  assert_non_null(strstr(out, "binary-idf"));
  assert_non_null(strstr(out, "<- chosen"));
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_load(art, &a, &d), 0);
  assert_int_equal(a->k, 3);
  for (size_t c = 0; c < 3; c++) assert_true(a->cluster_sizes[c] <= 8);
  eldr_artifact_free(a);

  const char *rargs[] = {"rho", "--trace", g_trace, "--artifact", art, "--json", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, rargs), 0);
  assert_non_null(strstr(out, "\"rho\""));
}

/* --latency FILE alone: a complete model, stored bit-identical in the
 * artifact's latency section (the footprint policy's coefficients). */
static void test_fit_latency_section(void **state) {
  (void)state;
  static char out[65536], err[65536];
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h100", &m, NULL), 0);
  m.shape = (eldr_shape){3, 16, 2};
  char lat[512], art[512];
  snprintf(lat, sizeof lat, "%s/lat.json", g_dir);
  snprintf(art, sizeof art, "%s/al.json", g_dir);
  char *txt = eldr_latency_dump(&m);
  assert_non_null(txt);
  FILE *f = fopen(lat, "w");
  assert_non_null(f);
  fputs(txt, f);
  fclose(f);
  free(txt);
  const char *args[] = {"fit", "--trace", g_trace, "--decoders", "3", "-o", art, "--latency", lat, "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, args), 0);
  eldr_artifact *a = NULL;
  assert_int_equal(eldr_artifact_load(art, &a, NULL), 0);
  assert_non_null(a->latency);
  assert_memory_equal(a->latency, &m, sizeof m);
  eldr_artifact_free(a);
  /* an incomplete file is refused, naming the file */
  f = fopen(lat, "w");
  assert_non_null(f);
  fputs("{\"hbm_bw\": 1e12}", f);
  fclose(f);
  assert_int_equal(run(out, sizeof out, err, sizeof err, args), 1);
  assert_non_null(strstr(err, "lat.json"));
}

static void test_bad_flags_one_line(void **state) {
  (void)state;
  static char out[8192], err[8192];
  const char *cases[][10] = {
      {"fit", "--trace", g_trace, "--decoders", "0", "-o", g_x, NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--bogus", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--idf", "maybe", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--tau", "abc", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--layers", "7", NULL},
      {"rho", "--trace", g_trace, "--representation", "weird", NULL},
      {"rho", NULL},
      {"fit", "--trace", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--hardware", "h200", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--model", "qwen3-30b-a3b", NULL},
      {"fit", "--trace", g_trace, "--decoders", "3", "-o", g_x, "--model", "gpt-9", NULL},
  };
  const char *expect[] = {"--decoders", "--bogus", "--idf", "--tau", "--output",
                          "--layers",   "--representation", "--trace", "--trace",
                          "--hardware", "--model", "gpt-9"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run(out, sizeof out, err, sizeof err, cases[i]);
    if (rc != 2 || lines(err) != 1 || !strstr(err, expect[i]))
      fail_msg("case %zu: rc=%d stderr='%s'", i, rc, err);
  }
}

static void test_missing_trace_fails(void **state) {
  (void)state;
  static char out[8192], err[8192];
  const char *args[] = {"fit", "--trace", "/nonexistent/t.jsonl", "--decoders", "2", "-o", g_x, NULL};
  int rc = run(out, sizeof out, err, sizeof err, args);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(err, "/nonexistent/t.jsonl"));
}

static void test_help(void **state) {
  (void)state;
  static char out[8192], err[8192];
  const char *a1[] = {"fit", "--help", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a1), 0);
  assert_non_null(strstr(out, "usage: eldr fit"));
  const char *a2[] = {"rho", "--help", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a2), 0);
  assert_non_null(strstr(out, "usage: eldr rho"));
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return strdup(buf);
}

/* --ep-size: one SGLang placement per decoder + a global one, named by the
 * artifact, loadable, identical for the same seed; bad values exit 2. */
static void test_fit_ep_placements(void **state) {
  (void)state;
  static char out[65536], err[65536];
  char art1[512], art2[512], p1[600], p2[600];
  snprintf(art1, sizeof art1, "%s/ep1.json", g_dir);
  snprintf(art2, sizeof art2, "%s/ep2.json", g_dir);
  for (int i = 0; i < 2; i++) {
    const char *args[] = {"fit", "--trace", g_trace, "--decoders", "3", "-o", i ? art2 : art1,
                          "--ep-size", "4", "--redundant-experts", "4", "--seed", "5", "-q", NULL};
    assert_int_equal(run(out, sizeof out, err, sizeof err, args), 0);
  }
  assert_non_null(strstr(out, "placement  EP 4, 4 redundant"));
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_load(art1, &a, &d), 0);
  assert_non_null(a->placement);
  assert_int_equal(a->placement->ep_size, 4);
  assert_int_equal(a->placement->redundant, 4);
  assert_string_equal(a->placement->global, "ep1.placement.global.json");
  for (size_t i = 0; i <= a->k; i++) {
    const char *name = i < a->k ? a->placement->decoders[i] : a->placement->global;
    snprintf(p1, sizeof p1, "%s/%s", g_dir, name);
    snprintf(p2, sizeof p2, "%s/ep2%s", g_dir, name + 3);
    eldr_placement *p = NULL;
    assert_int_equal(eldr_placement_load(p1, 16, 4, a->layer_ids, 3, &p, &d), 0);
    assert_int_equal(p->num_physical, 20);
    eldr_placement_free(p);
    char *x = slurp(p1), *y = slurp(p2);
    assert_string_equal(x, y); /* same seed, same placement */
    free(x);
    free(y);
  }
  eldr_artifact_free(a);
  const char *bad[] = {"fit", "--trace", g_trace, "--decoders", "3", "-o", art1, "--ep-size", "3",
                       "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, bad), 2);
  assert_non_null(strstr(err, "multiple of the EP size 3"));
  const char *bad2[] = {"fit", "--trace", g_trace, "--decoders", "3", "-o", art1,
                        "--redundant-experts", "4", "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, bad2), 2);
  assert_non_null(strstr(err, "--ep-size"));
}

static int read_all(const char *path, char *buf, size_t cap, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  *len = fread(buf, 1, cap, f);
  fclose(f);
  return 0;
}

/* -o is checked before the trace is even read: a directory, a missing
 * directory, an unwritable directory (exit 1: the file system's answer) and
 * the input trace itself (exit 2: the command line names one file twice)
 * all fail naming -o, and nothing is fitted or written. */
static void test_output_checked_first(void **state) {
  (void)state;
  static char out[8192], err[8192], before[65536], after[65536];
  size_t nb = 0, na = 0;
  assert_int_equal(read_all(g_trace, before, sizeof before, &nb), 0);
  char ro[512], ro_file[600];
  snprintf(ro, sizeof ro, "%s/ro", g_dir);
  snprintf(ro_file, sizeof ro_file, "%s/a.json", ro);
  assert_int_equal(mkdir(ro, 0500), 0);
  const char *targets[] = {g_dir, "/nonexistent-dir/a.json", g_trace, ro_file};
  const char *why[] = {"is a directory", "No such file", "refusing to write over", "Permission denied"};
  for (size_t i = 0; i < 4; i++) {
    if (i == 3 && geteuid() == 0) continue; /* root writes anywhere */
    const char *args[] = {"fit", "--trace", g_trace, "--decoders", "3", "-o", targets[i], NULL};
    int rc = run(out, sizeof out, err, sizeof err, args);
    if (rc != (i == 2 ? 2 : 1) || lines(err) != 1 || !strstr(err, "-o") || !strstr(err, why[i]) || out[0])
      fail_msg("case %zu (%s): rc=%d stdout='%s' stderr='%s'", i, targets[i], rc, out, err);
  }
  assert_int_equal(read_all(g_trace, after, sizeof after, &na), 0);
  assert_int_equal(na, nb);
  assert_memory_equal(before, after, nb);
  rmdir(ro);
}

/* fit.md's promise: the same trace, seed and --created give the same bytes. */
/* --previous: a refit against its own artifact moves nothing; a previous
 * artifact with another k is refused; the sampled, mini-batch path reports
 * its mode and the rho interval. */
static void test_fit_previous_and_scale(void **state) {
  (void)state;
  static char out[65536], err[65536];
  char old[512], nw[512];
  snprintf(old, sizeof old, "%s/old.json", g_dir);
  snprintf(nw, sizeof nw, "%s/new.json", g_dir);
  const char *a1[] = {"fit", "--trace", g_trace, "-k", "3", "-o", old, "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a1), 0);
  const char *a2[] = {"fit", "--trace", g_trace, "-k", "3", "--previous", old, "-o", nw, "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a2), 0);
  assert_non_null(strstr(out, "0.00% of the calibration requests change decoder"));
  assert_null(strstr(out, "rho 95%")); /* 24 requests: too few for 20 jackknife groups */
  const char *a3[] = {"fit", "--trace", g_trace, "-k", "2", "--previous", old, "-o", nw, "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a3), 1);
  assert_non_null(strstr(err, "same number"));
  const char *a4[] = {"fit", "--trace", g_trace, "-k", "3", "--rho-sample", "10", "--exact-limit", "5",
                      "--batch", "8", "--previous", old, "--json", "-o", nw, "-q", NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a4), 0);
  assert_non_null(strstr(out, "\"kmeans_mode\": \"mini-batch\""));
  assert_non_null(strstr(out, "\"moved\":"));
  assert_non_null(strstr(out, "\"sample\": 10"));
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_load(nw, &a, &d), 0);
  size_t sum = 0;
  for (size_t i = 0; i < a->k; i++) {
    assert_true(a->cluster_sizes[i] <= 8); /* ceil(24 / 3) */
    sum += a->cluster_sizes[i];
  }
  assert_int_equal(sum, 24);
  eldr_artifact_free(a);
  const char *a5[] = {"fit", "--trace", g_trace, "-k", "3", "--previous", "/nonexistent.json", "-o", nw, NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a5), 1);
  assert_non_null(strstr(err, "--previous"));
}

static void test_same_seed_same_bytes(void **state) {
  (void)state;
  static char out[65536], err[65536], b1[1 << 16], b2[1 << 16];
  char p1[512], p2[512];
  snprintf(p1, sizeof p1, "%s/one.json", g_dir);
  snprintf(p2, sizeof p2, "%s/two.json", g_dir);
  const char *a1[] = {"fit", "--trace", g_trace, "--decoders", "3", "--seed", "7", "-q",
                      "--created", "2026-01-02T03:04:05Z", "-o", p1, NULL};
  const char *a2[] = {"fit", "--trace", g_trace, "--decoders", "3", "--seed", "7", "-q",
                      "--created", "2026-01-02T03:04:05Z", "-o", p2, NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, a1), 0);
  assert_int_equal(run(out, sizeof out, err, sizeof err, a2), 0);
  size_t n1 = 0, n2 = 0;
  assert_int_equal(read_all(p1, b1, sizeof b1, &n1), 0);
  assert_int_equal(read_all(p2, b2, sizeof b2, &n2), 0);
  assert_true(n1 > 0 && n1 < sizeof b1);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  b1[n1] = 0;
  assert_non_null(strstr(b1, "2026-01-02T03:04:05Z"));
  const char *bad[] = {"fit", "--trace", g_trace, "--decoders", "3", "--created", "yesterday",
                       "-o", p1, NULL};
  assert_int_equal(run(out, sizeof out, err, sizeof err, bad), 2);
  assert_non_null(strstr(err, "--created"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit_ep_placements),
      cmocka_unit_test(test_fit_writes_valid_artifact),
      cmocka_unit_test(test_bad_flags_one_line),
      cmocka_unit_test(test_fit_latency_section),
      cmocka_unit_test(test_missing_trace_fails),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_output_checked_first),
      cmocka_unit_test(test_same_seed_same_bytes),
      cmocka_unit_test(test_fit_previous_and_scale),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
