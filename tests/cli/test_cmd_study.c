/* test_cmd_study.c — `eldr study` end to end on a tiny generated workload
 * (every output file, the held-out and control columns), its errors, the
 * library's Spearman and provenance helpers, and the realistic preset's
 * calibration bands on a small sample. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/preset_files.h"
#include "eldr/provenance.h"
#include "eldr/study.h"
#include "eldr/tracegen.h"
#include "eldr/tracestats.h"
#include "support/proc.h"

static char g_dir[256];
static char g_out[1 << 16], g_err[1 << 16];

static int run(const char *const *args) {
  char ofile[512], efile[512];
  snprintf(ofile, sizeof ofile, "%s/stdout", g_dir);
  snprintf(efile, sizeof efile, "%s/stderr", g_dir);
  int rc = eldr_test_run_args(ELDR_BINARY, args, ofile, efile);
  eldr_test_read_into(ofile, g_out, sizeof g_out);
  eldr_test_read_into(efile, g_err, sizeof g_err);
  return rc;
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr-test-study-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(g_dir);
}

static void test_errors(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"study", "--help", NULL}), 0);
  assert_non_null(strstr(g_out, "rho-gain"));
  assert_int_equal(run((const char *[]){"study", "-o", g_dir, NULL}), 2);
  assert_non_null(strstr(g_err, "NAME"));
  assert_int_equal(run((const char *[]){"study", "fig99", "-o", g_dir, NULL}), 2);
  assert_non_null(strstr(g_err, "fig99"));
  assert_int_equal(run((const char *[]){"study", "fig3", NULL}), 2);
  assert_non_null(strstr(g_err, "--out"));
  assert_int_equal(run((const char *[]){"study", "fig3", "-o", g_dir, "--seeds", "1,,2", NULL}), 2);
  assert_int_equal(run((const char *[]){"study", "fig3", "-o", g_dir, "--serve-trace", "x", NULL}), 2);
  assert_int_equal(run((const char *[]){"study", "fig3", "-o", g_dir, "-t", "/nonexistent.jsonl", NULL}), 1);
}

/* fig11 on 80 generated OLMoE-shaped requests: held-out split, six policies
 * at five loads, one seed; CSV/JSON/MD (and PNG when gnuplot exists). */
static void test_fig11_end_to_end(void **st) {
  (void)st;
  const char *args[] = {"study", "fig11", "-o", g_dir, "-m", "olmoe-1b-7b", "--gen-requests", "80",
                        "--max-decode-tokens", "12", "--prefill", "2", "--decode", "4",
                        "--requests", "150", "--seeds", "1", "--restarts", "1", "-q", NULL};
  assert_int_equal(run(args), 0);
  assert_non_null(strstr(g_out, "net of the replay control"));
  char path[600];
  snprintf(path, sizeof path, "%s/fig11.json", g_dir);
  json_error_t e;
  json_t *j = json_load_file(path, 0, &e);
  assert_non_null(j);
  json_t *rows = json_object_get(j, "rows");
  assert_int_equal(json_array_size(rows), 5 * 6);
  json_t *cfg = json_object_get(j, "config");
  assert_string_equal(json_string_value(json_object_get(cfg, "generator")),
                      "eldr-tracegen workload=realistic seed=1");
  assert_non_null(strstr(json_string_value(json_object_get(j, "command")), "eldr study fig11 -o "));
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *r = json_array_get(rows, i);
    double tpot = json_number_value(json_array_get(r, 3));
    assert_true(tpot > 0 && isfinite(tpot));
    /* the latencies users feel: from prefill end at least TPOT's, ITL p99 and
     * end-to-end and TTFT positive */
    double pf = json_number_value(json_array_get(r, 7)), ttft = json_number_value(json_array_get(r, 9));
    double itl = json_number_value(json_array_get(r, 10)), e2e = json_number_value(json_array_get(r, 11));
    assert_true(pf >= tpot * 0.99 && ttft > 0 && itl > 0 && e2e > ttft);
  }
  json_decref(j);
  snprintf(path, sizeof path, "%s/fig11.csv", g_dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[256];
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "load,policy,rate,tpot_ms,tpot_sd_ms,gain_vs_best_pct,gain_sd_pct,"
                            "tpot_pf_ms,gain_pf_vs_best_pct,ttft_ms,itl_p99_ms,e2e_ms\n");
  int n = 0;
  while (fgets(line, sizeof line, f)) n++;
  fclose(f);
  assert_int_equal(n, 30);
  snprintf(path, sizeof path, "%s/fig11.md", g_dir);
  assert_int_equal(access(path, R_OK), 0);
  if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
    struct stat sb;
    snprintf(path, sizeof path, "%s/fig11.png", g_dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size > 1000);
  }
}

/* The figures say what they show: fig2's lines are one per (overhead,
 * batch) with both in the legend and the overhead as the dash; a title
 * with words, not the bare name; legends name series, not CSV columns,
 * and sit under the plot. */
static void test_plot_labels(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"study", "fig2", "-o", g_dir, "-q", NULL}), 0);
  char path[512], gp[1 << 14];
  snprintf(path, sizeof path, "%s/fig2.gp", g_dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(gp, 1, sizeof gp - 1, f);
  fclose(f);
  gp[n] = 0;
  assert_non_null(strstr(gp, "set title 'fig2: decode step time vs distinct experts per layer"));
  assert_non_null(strstr(gp, "title 'per-layer overhead: preset, batch 16'"));
  assert_non_null(strstr(gp, "title 'per-layer overhead: zero, batch 16'"));
  assert_non_null(strstr(gp, "lt 2 dt 2 title 'per-layer overhead: zero, batch 16'"));
  assert_non_null(strstr(gp, "set key below"));
  /* six lines: no series mixes the two overheads */
  int series = 0;
  for (const char *p = gp; (p = strstr(p, " with linespoints")); p++) series++;
  assert_int_equal(series, 6);
}

static void test_spearman_and_provenance(void **st) {
  (void)st;
  double x[] = {1, 2, 3, 4}, y[] = {10, 20, 30, 40}, z[] = {4, 3, 2, 1}, c[] = {5, 5, 5, 5};
  assert_true(fabs(eldr_study_spearman(x, y, 4) - 1) < 1e-12);
  assert_true(fabs(eldr_study_spearman(x, z, 4) + 1) < 1e-12);
  assert_true(isnan(eldr_study_spearman(x, c, 4)));
  char why[256], w[32];
  unsigned long long s = 0;
  assert_int_equal(eldr_provenance_parse("eldr-tracegen workload=task seed=7", w, sizeof w, &s), 0);
  assert_string_equal(w, "task");
  assert_true(s == 7);
  assert_int_equal(eldr_provenance_parse("eldr-tracegen seed=x workload=a", w, sizeof w, &s), -1);
  assert_int_equal(eldr_provenance_mismatch("M", NULL, "M", NULL, why, sizeof why), 0);
  assert_int_equal(eldr_provenance_mismatch("M", "eldr-tracegen workload=a seed=1", "M",
                                            "eldr-tracegen workload=a seed=1", why, sizeof why),
                   0);
  assert_int_equal(eldr_provenance_mismatch("M", "eldr-tracegen workload=a seed=1", "M",
                                            "eldr-tracegen workload=a seed=2", why, sizeof why),
                   1);
  assert_non_null(strstr(why, "seed differs"));
  assert_int_equal(eldr_provenance_mismatch("M", "eldr-tracegen workload=a seed=1", "M",
                                            "eldr-tracegen workload=b seed=1", why, sizeof why),
                   1);
  assert_non_null(strstr(why, "workload differs"));
  assert_int_equal(eldr_provenance_mismatch("M", NULL, "N", NULL, why, sizeof why), 1);
  assert_non_null(strstr(why, "model differs"));
  assert_int_equal(eldr_provenance_mismatch("M", NULL, "M", "eldr-tracegen workload=a seed=1", why,
                                            sizeof why),
                   1);
  assert_non_null(strstr(why, "real"));
}

/* The realistic preset stays in its calibration bands (docs/trace.md) on a
 * small OLMoE-shaped sample: correlation well below the paper-shaped task
 * preset's, same-domain reduction in the measured range. */
static void test_realistic_bands(void **st) {
  (void)st;
  eldr_shape s;
  char canon[64];
  assert_int_equal(eldr_tracegen_model_shape("olmoe-1b-7b", &s, canon, sizeof canon, NULL), 0);
  double corr[2], red16[2];
  const char *w[] = {"realistic", "task"};
  for (int i = 0; i < 2; i++) {
    eldr_tracegen *g = NULL;
    assert_int_equal(eldr_tracegen_new(&s, canon, w[i], 1, &g, NULL), 0);
    eldr_tracegen_set_lengths(g, 0, 48, 0);
    eldr_trace *t = NULL;
    assert_int_equal(eldr_tracegen_generate(g, 200, &t, NULL), 0);
    eldr_tracegen_free(g);
    static const size_t bs[] = {16};
    eldr_tracestats_opts o;
    eldr_tracestats_opts_default(&o);
    o.batch_sizes = bs;
    o.n_batch_sizes = 1;
    o.batches = 24;
    eldr_tracestats ts;
    assert_int_equal(eldr_tracestats_compute(t, &o, &ts, NULL), 0);
    corr[i] = ts.corr_median;
    red16[i] = ts.batch[0].reduction[ELDR_BATCH_DOMAIN];
    eldr_tracestats_free(&ts);
    eldr_trace_free(t);
  }
  assert_true(corr[0] > 0.50 && corr[0] < 0.75);
  assert_true(corr[1] > corr[0] + 0.1);
  assert_true(red16[0] > 0.05 && red16[0] < 0.14);
  assert_true(red16[1] > red16[0]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_fig11_end_to_end),
      cmocka_unit_test(test_spearman_and_provenance), cmocka_unit_test(test_plot_labels),
      cmocka_unit_test(test_realistic_bands),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
