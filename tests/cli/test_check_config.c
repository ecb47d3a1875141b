/* test_check_config.c — `eldr serve --check-config` as CI and the systemd
 * unit run it: the repository's example config (deploy/eldr.json) with an
 * artifact passes without resolving its (cluster-internal) names and fails
 * with =resolve naming the first name (exit 1, as the start); a bad key, a
 * bad value and a bad DNS name each exit 2 naming what is wrong, a missing
 * or unservable artifact 1 (an input). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eldr/artifact.h"
#include "support/proc.h"

static char g_dir[64], g_art[128], g_gate[128], g_cfg[128];
static char g_out[1 << 14], g_err[1 << 14];

static int run(const char *const *args) {
  return eldr_test_run_captured(ELDR_BINARY, g_dir, args, g_out, sizeof g_out, g_err, sizeof g_err);
}

static void save_artifact(const char *path, eldr_repr repr) {
  eldr_shape s = {.num_layers = 2, .num_experts = 8, .top_k = 2};
  eldr_artifact *a = eldr_artifact_new("fixture", &s, NULL, repr, 0, NULL, 2);
  assert_non_null(a);
  for (size_t c = 0; c < 2; c++) { /* unit centroids: odd and even experts */
    for (size_t j = 0; j < a->dim; j++) a->centroids[c * a->dim + j] = (j % 2 == c) ? 0.35355339f : 0.0f; /* 8 of 16 */
    a->cluster_sizes[c] = 1;
  }
  a->tau = 0.1;
  eldr_diag d = {{0}};
  int rc = eldr_artifact_save(path, a, &d);
  if (rc) fail_msg("%s", eldr_diag_msg(&d, rc));
  eldr_artifact_free(a);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr_checkcfg_XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  snprintf(g_art, sizeof g_art, "%s/routing.json", g_dir);
  snprintf(g_gate, sizeof g_gate, "%s/gate.json", g_dir);
  snprintf(g_cfg, sizeof g_cfg, "%s/eldr.json", g_dir);
  save_artifact(g_art, ELDR_REPR_COUNT);
  save_artifact(g_gate, ELDR_REPR_GATE);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  const char *files[] = {"routing.json", "gate.json", "eldr.json", "stdout", "stderr"};
  char p[256];
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(p, sizeof p, "%s/%s", g_dir, files[i]);
    unlink(p);
  }
  rmdir(g_dir);
  return 0;
}

/* The example config CI checks: syntax and values, no resolution. */
static void test_example_config_passes(void **state) {
  (void)state;
  const char *args[] = {"serve", "--config", ELDR_SOURCE_DIR "/deploy/eldr.json", "--artifact", g_art,
                        "--check-config", NULL};
  assert_int_equal(run(args), 0);
  assert_non_null(strstr(g_out, "config ok: 2 prefill, 4 decode worker URLs"));
  assert_string_equal(g_err, "");
  const char *dns[] = {"serve", "--config", ELDR_SOURCE_DIR "/deploy/eldr-dns.json", "--artifact", g_art,
                       "--check-config", NULL};
  assert_int_equal(run(dns), 0);
  assert_non_null(strstr(g_out, "0 prefill, 0 decode worker URLs; 1 prefill, 1 decode DNS names"));
}

/* =resolve: the example's StatefulSet names do not resolve outside the
 * cluster: this machine's, not a wrong value (exit 1, as the start would). */
static void test_resolve_names_the_host(void **state) {
  (void)state;
  const char *args[] = {"serve", "--config", ELDR_SOURCE_DIR "/deploy/eldr.json", "--artifact", g_art,
                        "--check-config=resolve", NULL};
  assert_int_equal(run(args), 1);
  assert_non_null(strstr(g_err, "cannot resolve 'vllm-prefill-0.vllm-prefill'"));
  const char *ok[] = {"serve", "--prefill", "http://127.0.0.1:8100", "--decode-dns", "localhost:8200",
                      "--check-config=resolve", NULL};
  assert_int_equal(run(ok), 0);
  assert_non_null(strstr(g_out, "1 decode DNS names (all resolve)"));
  const char *bad[] = {"serve", "--check-config=maybe", NULL};
  assert_int_equal(run(bad), 2);
  assert_non_null(strstr(g_err, "--check-config: 'maybe'"));
}

/* status: 2 for a wrong value of the file, 1 for an artifact that cannot be
 * loaded or served (an input, as in every command) */
static void expect_check_error(const char *json, const char *needle, int status) {
  eldr_test_write(g_cfg, json);
  const char *args[] = {"serve", "--config", g_cfg, "--check-config", NULL};
  assert_int_equal(run(args), status);
  if (!strstr(g_err, needle)) fail_msg("expected '%s' in: %s", needle, g_err);
}

static void expect_config_error(const char *json, const char *needle) { expect_check_error(json, needle, 2); }

static void test_bad_configs_name_the_problem(void **state) {
  (void)state;
  expect_config_error("{\"prefill\": [\"http://a:1\"], \"decode\": [\"http://b:2\"], \"colour\": 1}",
                      "unknown key 'colour'");
  expect_config_error("{\"prefill\": [\"http://a:1\"], \"decode\": [\"http://b:2\"], \"retries\": 99}",
                      "'retries' = 99 out of range");
  expect_config_error("{\"prefill\": [\"http://a:1\"], \"decode\": [\"ftp://b:2\"]}", "'decode[0]'");
  expect_config_error("{\"prefill\": [\"http://a:1\"], \"decode_dns\": [\"svc\"]}", "'svc' must be NAME:PORT");
  expect_config_error("{\"prefill\": [\"http://a:1\"]}", "no decode worker");
  expect_check_error("{\"prefill\": [\"http://a:1\"], \"decode\": [\"http://b:2\"], \"artifact\": "
                     "\"/nonexistent/routing.json\"}",
                     "/nonexistent/routing.json", 1);
  expect_config_error("{\"prefill\": [\"http://a:1\"], \"decode\": [\"http://b:2\"], \"dns_server\": \"x\"}",
                      "dns_server 'x'");
  expect_config_error("{\"prefill\": [\"http://a:1\"", "invalid JSON at line 1");
  char json[512];
  snprintf(json, sizeof json, "{\"prefill\": [\"http://a:1\"], \"decode\": [\"http://b:2\"], \"artifact\": \"%s\"}",
           g_gate);
  expect_check_error(json, "needs gate scores", 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_example_config_passes),
      cmocka_unit_test(test_resolve_names_the_host),
      cmocka_unit_test(test_bad_configs_name_the_problem),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
