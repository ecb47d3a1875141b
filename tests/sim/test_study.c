/* test_study.c — the study library on a small generated trace: table
 * shapes, headlines, and relations that must hold (a request's own prefill
 * predicts its decode better than a random other request's; the fitted
 * per-layer overhead dilutes the expert-union effect; table2 fits one
 * artifact per pool size and serves only held-out requests). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "eldr/preset_files.h"
#include "eldr/study.h"
#include "eldr/tracegen.h"

static eldr_trace *g_t;
static eldr_study_opts g_o;
static const uint64_t g_seeds[] = {1, 2};

static int setup(void **state) {
  (void)state;
  eldr_shape s;
  char canon[64];
  if (eldr_tracegen_model_shape("olmoe-1b-7b", &s, canon, sizeof canon, NULL)) return -1;
  eldr_tracegen *g = NULL;
  if (eldr_tracegen_new(&s, canon, "realistic", 1, &g, NULL)) return -1;
  eldr_tracegen_set_lengths(g, 0, 16, 16);
  int rc = eldr_tracegen_generate(g, 120, &g_t, NULL);
  eldr_tracegen_free(g);
  if (rc) return -1;
  eldr_study_opts_default(&g_o);
  g_o.trace = g_t;
  if (eldr_latency_preset("olmoe-1b-7b", "mi300x", &g_o.lm, NULL)) return -1;
  g_o.n_prefill = 2;
  g_o.n_decode = 4;
  g_o.n_requests = 200;
  g_o.restarts = 1;
  g_o.seeds = g_seeds;
  g_o.n_seeds = 2;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  eldr_trace_free(g_t);
  return 0;
}

static double cell(json_t *res, size_t row, size_t col) {
  return json_number_value(json_array_get(json_array_get(json_object_get(res, "rows"), row), col));
}

static void test_fig2_fig3(void **st) {
  (void)st;
  json_t *r = NULL;
  assert_int_equal(eldr_study_run("fig3", &g_o, &r, NULL), 0);
  assert_int_equal(json_array_size(json_object_get(r, "rows")), 3);
  double own = cell(r, 0, 1), rnd = cell(r, 1, 1), dom = cell(r, 2, 1);
  assert_true(own > dom && dom > rnd);
  assert_true(fabs(json_number_value(json_object_get(json_object_get(r, "headline"), "value")) - own) < 1e-12);
  assert_non_null(json_object_get(r, "config"));
  json_decref(r);
  assert_int_equal(eldr_study_run("fig2", &g_o, &r, NULL), 0);
  /* the same distinct count costs more with the overhead than without */
  json_t *rows = json_object_get(r, "rows");
  size_t n = json_array_size(rows);
  assert_true(n > 6 && n % 2 == 0);
  for (size_t i = 0; i < n / 2; i++) assert_true(cell(r, i, 3) > cell(r, i + n / 2, 3));
  json_decref(r);
}

static void test_fig4_table2(void **st) {
  (void)st;
  json_t *r = NULL;
  assert_int_equal(eldr_study_run("fig4", &g_o, &r, NULL), 0);
  assert_int_equal(json_array_size(json_object_get(r, "rows")), 4 * 3);
  /* batch 8: domain batches touch fewer experts than random ones */
  assert_true(cell(r, 1, 2) < cell(r, 0, 2));
  json_decref(r);
  assert_int_equal(eldr_study_run("table2", &g_o, &r, NULL), 0);
  assert_int_equal(json_array_size(json_object_get(r, "rows")), 3);
  for (size_t i = 0; i < 3; i++) {
    assert_true(isfinite(cell(r, i, 1)) && isfinite(cell(r, i, 5)));
    /* net = gain - control */
    assert_true(fabs(cell(r, i, 5) - (cell(r, i, 1) - cell(r, i, 3))) < 1e-9);
  }
  json_decref(r);
}

static void test_errors(void **st) {
  (void)st;
  json_t *r = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_study_run("fig99", &g_o, &r, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "fig99"));
  eldr_study_opts o = g_o;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &o.lm, NULL), 0);
  assert_int_equal(eldr_study_run("fig3", &o, &r, &d), ELDR_ESHAPE);
  o = g_o;
  o.fit_fraction = 0.001;
  assert_int_equal(eldr_study_run("fig4", &o, &r, &d), ELDR_EINVAL);
  assert_null(r);
}

/* The crossover: a row per preset, hardware and batch; the gain is 0 for a
 * single request (one token touches K experts either way), positive at
 * batch 16, and back under 1 % at 4096 for the top-8 presets (their union
 * saturates: every expert is touched either way); the roofline's tokens per
 * expert is expert_bytes x peak / (bandwidth x expert FLOPs). The CPU check
 * on points that follow a roofline exactly recovers its bandwidth, peak and
 * knees. No trace needed. */
static void test_crossover(void **st) {
  (void)st;
  eldr_study_opts o;
  eldr_study_opts_default(&o);
  double ex[12], bt[12], ms[12];
  size_t n = 0;
  const double w = 3.0 * 64 * 32 * 4, f = 2.0 * 3 * 64 * 32, bw = 2e9, peak = 1e10;
  const double exps[] = {8, 32}, bats[] = {1, 4, 16, 64, 256, 1024};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 6; j++) {
      ex[n] = exps[i], bt[n] = bats[j];
      ms[n++] = 1e3 * fmax(exps[i] * w / bw, bats[j] * 4 * f / peak);
    }
  eldr_study_cpu cpu = {64, 32, 4, n, ex, bt, ms};
  o.cpu = &cpu;
  json_t *res = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_study_run("crossover", &o, &res, &d), 0);
  json_t *rows = json_object_get(res, "rows"), *table = json_object_get(res, "crossover");
  assert_int_equal(json_array_size(table), 6 * 3);
  assert_int_equal(json_array_size(rows), 6 * 3 * 13);
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *r = json_array_get(rows, i);
    double b = json_number_value(json_array_get(r, 2)), g = json_number_value(json_array_get(r, 8));
    double ur = json_number_value(json_array_get(r, 3)), ul = json_number_value(json_array_get(r, 4));
    assert_true(ul <= ur + 1e-9); /* a domain's batch never touches more experts */
    if (b == 1) assert_true(fabs(g) < 1e-9);
    if (b == 16) assert_true(g > 0);
    const char *model = json_string_value(json_array_get(r, 0));
    if (b == 4096 && strcmp(model, "llama4-maverick")) assert_true(g < 1.0);
  }
  for (size_t i = 0; i < json_array_size(table); i++) {
    json_t *r = json_array_get(table, i);
    const char *model = json_string_value(json_object_get(r, "model"));
    if (!strcmp(model, "qwen3-30b-a3b") &&
        !strcmp(json_string_value(json_object_get(r, "hardware")), "mi300x")) {
      eldr_latency_model m;
      assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
      double want = m.expert_bytes * m.peak_flops / (m.hbm_bw * m.expert_flops_per_token);
      assert_true(fabs(json_number_value(json_object_get(r, "roofline_tokens_per_expert")) - want) < 1e-6 * want);
      assert_true(json_is_number(json_object_get(r, "crossover_batch")));
    }
  }
  json_t *cc = json_object_get(res, "cpu_check");
  assert_non_null(cc);
  assert_true(fabs(json_number_value(json_object_get(cc, "fitted_weight_gb_s")) - bw / 1e9) < 1e-9);
  assert_true(fabs(json_number_value(json_object_get(cc, "fitted_gflop_s")) - peak / 1e9) < 1e-9);
  json_t *k = json_object_get(cc, "batch_at_plus_25_pct");
  for (size_t i = 0; i < json_array_size(k); i++) { /* measured knee = the roofline's (log-interpolated) */
    double m = json_number_value(json_object_get(json_array_get(k, i), "batch_measured"));
    double r = json_number_value(json_object_get(json_array_get(k, i), "batch_roofline"));
    assert_true(m > 0 && r > 0 && fabs(log(m / r)) < log(1.6));
  }
  json_decref(res);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fig2_fig3),
      cmocka_unit_test(test_fig4_table2),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_crossover),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
