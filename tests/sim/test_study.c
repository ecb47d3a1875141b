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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fig2_fig3),
      cmocka_unit_test(test_fig4_table2),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
