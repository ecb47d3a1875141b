/* test_cmd_sim.c — `eldr sim` and `eldr bench moe-layer` as a user runs
 * them: errors, a small generated run (JSON, CSV), determinism, trace
 * arrivals on a hand-made trace file. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "eldr/latency.h"
#include "eldr/rng.h"
#include "eldr/trace.h"
#include "support/proc.h"

static char g_dir[256];
static char g_trace[512];
static char g_out[1 << 20], g_err[1 << 16];

static int run(const char *const *args) {
  return eldr_test_run_captured(ELDR_BINARY, g_dir, args, g_out, sizeof g_out, g_err, sizeof g_err);
}

/* OLMoE-shaped (16 layers, 64 experts, top-8) trace: 2 domains, arrivals 10 ms apart. */
static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/eldr-test-cmd-sim-XXXXXX");
  assert_non_null(mkdtemp(g_dir));
  snprintf(g_trace, sizeof g_trace, "%s/t.jsonl", g_dir);
  eldr_shape s = {16, 64, 8};
  eldr_trace *t = eldr_trace_new("OLMoE-1B-7B-0924", &s, NULL);
  assert_non_null(t);
  eldr_rng r;
  eldr_rng_seed(&r, 5);
  uint16_t pre[4 * 16 * 8], dec[20 * 16 * 8];
  for (int i = 0; i < 80; i++) {
    int dom = i % 2;
    for (size_t x = 0; x < 4 * 16; x++) {
      uint32_t s0 = (uint32_t)eldr_rng_below(&r, 32);
      for (int k = 0; k < 8; k++) pre[x * 8 + k] = (uint16_t)(dom * 32 + (s0 + k) % 32);
    }
    for (size_t x = 0; x < 20 * 16; x++) {
      uint32_t s0 = (uint32_t)eldr_rng_below(&r, 32);
      for (int k = 0; k < 8; k++) dec[x * 8 + k] = (uint16_t)(dom * 32 + (s0 + k) % 32);
    }
    char id[32];
    snprintf(id, sizeof id, "q%d", i);
    assert_true(eldr_trace_append(t, id, dom ? "b" : "a", NULL, 0.01 * i, pre, 4, dec, 5 + (uint32_t)(i % 15), NULL) >= 0);
  }
  assert_int_equal(eldr_trace_save(g_trace, t, NULL), 0);
  eldr_trace_free(t);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(g_dir);
}

static void test_help_and_errors(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"sim", "--help", NULL}), 0);
  assert_non_null(strstr(g_out, "--rates"));
  assert_int_equal(run((const char *[]){"sim", NULL}), 2);
  assert_non_null(strstr(g_err, "--trace"));
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--policies", "fastest", NULL}), 2);
  assert_non_null(strstr(g_err, "fastest"));
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--rates", "10,x", NULL}), 2);
  assert_non_null(strstr(g_err, "--rates"));
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--decode", "0", NULL}), 2);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--bogus", NULL}), 2);
  assert_int_equal(run((const char *[]){"sim", "--trace", "/nonexistent/t.jsonl", NULL}), 1);
  assert_non_null(strstr(g_err, "/nonexistent/t.jsonl"));
  /* a latency preset of another shape */
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--model", "qwen3-30b-a3b", NULL}), 2);
  assert_non_null(strstr(g_err, "layers"));
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--hardware", "tpu", NULL}), 2);
  assert_non_null(strstr(g_err, "tpu"));
  char bad[600];
  snprintf(bad, sizeof bad, "%s/bad.json", g_dir);
  FILE *f = fopen(bad, "w");
  fputs("{\"hbm_bw\": -3}", f);
  fclose(f);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--latency", bad, NULL}), 1);
  assert_non_null(strstr(g_err, "hbm_bw"));
  assert_int_equal(run((const char *[]){"bench", "moe-layer", "--experts", "4", NULL}), 2);
  assert_int_equal(run((const char *[]){"bench", "moe-layer", "--help", NULL}), 0);
}

/* --print-latency: the preset as JSON, overrides and --ep-size applied, no trace */
static void test_print_latency(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"sim", "--print-latency", NULL}), 2);
  assert_non_null(strstr(g_err, "--model"));
  assert_int_equal(run((const char *[]){"sim", "--print-latency", "--model", "gpt-5", NULL}), 2);
  assert_non_null(strstr(g_err, "gpt-5"));
  assert_int_equal(run((const char *[]){"sim", "--print-latency", "--model", "olmoe-1b-7b", "--hardware", "h200",
                                        NULL}),
                   0);
  json_error_t e;
  json_t *m = json_loads(g_out, 0, &e);
  assert_non_null(m);
  assert_string_equal(json_string_value(json_object_get(m, "model")), "olmoe-1b-7b");
  assert_string_equal(json_string_value(json_object_get(m, "hardware")), "h200");
  assert_int_equal(json_integer_value(json_object_get(m, "num_layers")), 16);
  /* OLMoE's SwiGLU expert: 3 x 2048 x 1024 bf16 */
  assert_true(json_real_value(json_object_get(m, "expert_bytes")) == 3.0 * 2048 * 1024 * 2);
  json_decref(m);
  char over[600];
  snprintf(over, sizeof over, "%s/over.json", g_dir);
  FILE *f = fopen(over, "w");
  fputs("{\"hbm_bw\": 1e12}", f);
  fclose(f);
  assert_int_equal(run((const char *[]){"sim", "--print-latency", "--model", "qwen3-235b-a22b", "--latency", over,
                                        "--ep-size", "4", NULL}),
                   0);
  m = json_loads(g_out, 0, &e);
  assert_non_null(m);
  assert_true(json_real_value(json_object_get(m, "hbm_bw")) == 1e12);
  assert_true(json_real_value(json_object_get(m, "ep")) == 4);
  json_decref(m);
}

static json_t *rows_of(const char *out) {
  json_error_t e;
  json_t *root = json_loads(out, 0, &e);
  assert_non_null(root);
  return root;
}

static void test_run_json_csv_deterministic(void **st) {
  (void)st;
  char csv[600];
  snprintf(csv, sizeof csv, "%s/out.csv", g_dir);
  const char *args[] = {"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4", "--rates", "40,400",
                        "--requests", "400", "--policies", "all", "--json", "--csv", csv, "-q", NULL};
  assert_int_equal(run(args), 0);
  json_t *a = rows_of(g_out);
  json_t *rows = json_object_get(a, "rows");
  assert_int_equal(json_array_size(rows), 2 * 8); /* 4 baselines, domain, eldr, eldr-permuted, footprint */
  json_t *cfg = json_object_get(a, "config");
  assert_int_equal(json_integer_value(json_object_get(cfg, "fit_requests")) +
                       json_integer_value(json_object_get(cfg, "pool_size")),
                   80);
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *r = json_array_get(rows, i);
    assert_int_equal(json_integer_value(json_object_get(r, "completed")), 400);
    assert_true(json_real_value(json_object_get(r, "tpot_p50_ms")) > 0);
    assert_true(json_real_value(json_object_get(r, "tpot_p99_ms")) >=
                json_real_value(json_object_get(r, "tpot_p50_ms")));
  }
  assert_int_equal(json_array_size(json_object_get(a, "eldr_vs_best_baseline")), 2);
  /* same seed, same rows */
  char first[1 << 16];
  char *s1 = json_dumps(rows, JSON_SORT_KEYS);
  snprintf(first, sizeof first, "%s", s1);
  free(s1);
  json_decref(a);
  assert_int_equal(run(args), 0);
  a = rows_of(g_out);
  char *s2 = json_dumps(json_object_get(a, "rows"), JSON_SORT_KEYS);
  assert_string_equal(first, s2);
  free(s2);
  json_decref(a);
  /* parallel runs give the very same rows */
  const char *argsj[] = {"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4", "--rates", "40,400",
                         "--requests", "400", "--policies", "all", "--json", "-q", "--jobs", "3", NULL};
  assert_int_equal(run(argsj), 0);
  a = rows_of(g_out);
  s2 = json_dumps(json_object_get(a, "rows"), JSON_SORT_KEYS);
  assert_string_equal(first, s2);
  free(s2);
  json_decref(a);
  /* CSV: header + one line per row */
  FILE *f = fopen(csv, "r");
  assert_non_null(f);
  char line[1024];
  size_t n = 0;
  while (fgets(line, sizeof line, f)) n++;
  fclose(f);
  assert_int_equal(n, 1 + 16);
  /* another seed, another result */
  const char *args2[] = {"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4", "--rates", "400",
                         "--requests", "400", "--policies", "p2c", "--json", "-q", "--seed", "9", NULL};
  assert_int_equal(run(args2), 0);
  a = rows_of(g_out);
  char *s3 = json_dumps(json_object_get(a, "rows"), JSON_SORT_KEYS);
  assert_true(strstr(first, s3) == NULL);
  free(s3);
  json_decref(a);
}

/* Issue 28's defects, as a user meets them: replay that dominates is
 * warned about and the control is printed beside the headline; an artifact
 * evaluated on the requests it was fitted on is warned about, not when its
 * held-out half is served; a model outside the presets runs from a
 * complete --latency file; --loads and --log. */
static void test_warnings_custom_loads_log(void **st) {
  (void)st;
  /* 40 served requests as 600 arrivals at a high load: copies everywhere */
  const char *rep[] = {"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4", "--loads", "0.9",
                       "--requests", "600", "--policies", "jsq,eldr,eldr-permuted", "-q", NULL};
  assert_int_equal(run(rep), 0);
  assert_non_null(strstr(g_err, "warning: replay dominates: eldr's batches hold another copy"));
  assert_non_null(strstr(g_out, "replay control eldr-permuted alone: TPOT p50"));
  assert_non_null(strstr(g_out, "from prefill end p50"));
  /* a light run: no replay warning */
  const char *light[] = {"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4", "--rates", "5",
                         "--requests", "60", "--policies", "jsq,eldr", "-q", NULL};
  assert_int_equal(run(light), 0);
  assert_null(strstr(g_err, "replay dominates"));
  /* an artifact fitted on the whole trace, evaluated on it */
  char art[600], half[600];
  snprintf(art, sizeof art, "%s/all.json", g_dir);
  snprintf(half, sizeof half, "%s/half.json", g_dir);
  assert_int_equal(run((const char *[]){"fit", "--trace", g_trace, "--decoders", "4", "-q", "-o", art, NULL}), 0);
  assert_int_equal(run((const char *[]){"fit", "--trace", g_trace, "--decoders", "4", "--fit-fraction", "0.5",
                                        "-q", "-o", half, NULL}), 0);
  const char *ev[] = {"sim", "--trace", g_trace, "--artifact", art, "--prefill", "2", "--decode", "4",
                      "--rates", "5", "--requests", "60", "--policies", "jsq,eldr", "-q", NULL};
  assert_int_equal(run(ev), 0);
  assert_non_null(strstr(g_err, "--artifact was fitted on this trace"));
  const char *ev2[] = {"sim", "--trace", g_trace, "--artifact", art, "--fit-fraction", "0.5", "--prefill", "2",
                       "--decode", "4", "--rates", "5", "--requests", "60", "--policies", "jsq,eldr", "-q", NULL};
  assert_int_equal(run(ev2), 0);
  assert_non_null(strstr(g_err, "fitted on all 80 requests of this trace"));
  const char *ok[] = {"sim", "--trace", g_trace, "--artifact", half, "--fit-fraction", "0.5", "--prefill", "2",
                      "--decode", "4", "--rates", "5", "--requests", "60", "--policies", "jsq,eldr", "-q", NULL};
  assert_int_equal(run(ok), 0);
  assert_null(strstr(g_err, "was fitted on"));
  /* a model outside the presets: the trace's own shape, a complete --latency */
  char custom[600], lat[600];
  snprintf(custom, sizeof custom, "%s/custom.jsonl", g_dir);
  snprintf(lat, sizeof lat, "%s/lat.json", g_dir);
  assert_int_equal(run((const char *[]){"trace", "gen", "-m", "custom:4,32,2", "-n", "60", "--max-decode-tokens",
                                        "8", "-q", "-o", custom, NULL}), 0);
  assert_int_equal(run((const char *[]){"sim", "--trace", custom, "--requests", "50", "--rates", "5", "-q", NULL}), 2);
  assert_non_null(strstr(g_err, "complete model with --latency"));
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h100", &m, NULL), 0);
  m.shape = (eldr_shape){4, 32, 2};
  snprintf(m.model, sizeof m.model, "custom-4-32-2");
  char *js = eldr_latency_dump(&m);
  FILE *f = fopen(lat, "w");
  assert_non_null(f);
  fputs(js, f);
  fclose(f);
  free(js);
  const char *cu[] = {"sim", "--trace", custom, "--latency", lat, "--requests", "50", "--rates", "5",
                      "--policies", "jsq,eldr,footprint", "--json", "-q", NULL};
  assert_int_equal(run(cu), 0);
  json_t *j = rows_of(g_out);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "config"), "model")), "custom-4-32-2");
  json_decref(j);
  /* an incomplete file without --model names what is missing */
  f = fopen(lat, "w");
  fputs("{\"hbm_bw\": 1e12}", f);
  fclose(f);
  assert_int_equal(run(cu), 2);
  assert_non_null(strstr(g_err, "complete model"));
  /* --loads: rates as shares of the capacity; --log: a line per request and run */
  char log[600];
  snprintf(log, sizeof log, "%s/req.csv", g_dir);
  const char *lo[] = {"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4", "--loads", "0.2,0.5",
                      "--requests", "100", "--policies", "jsq,footprint", "--json", "--log", log, "-q", NULL};
  assert_int_equal(run(lo), 0);
  j = rows_of(g_out);
  double cap = json_real_value(json_object_get(json_object_get(j, "config"), "capacity_estimate_rps"));
  double r0 = json_real_value(json_object_get(json_array_get(json_object_get(j, "rows"), 0), "rate"));
  assert_true(fabs(r0 - round(0.2 * cap * 10) / 10) < 1e-9);
  json_decref(j);
  f = fopen(log, "r");
  assert_non_null(f);
  char line[1024];
  size_t n = 0;
  assert_non_null(fgets(line, sizeof line, f));
  assert_non_null(strstr(line, "pred_union,mean_union,mean_batch"));
  while (fgets(line, sizeof line, f)) n++;
  fclose(f);
  assert_int_equal(n, 2 * 2 * 100);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--loads", "0.5", "--rates", "3", NULL}), 2);
}

static void test_table_ablation_trace_arrivals(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4",
                                        "--arrivals", "trace", "--policies", "jsq,eldr", "--ablation",
                                        "--decorrelated-rows", "-q", NULL}),
                   0);
  assert_non_null(strstr(g_out, "eldr(tau=0.05)"));
  assert_non_null(strstr(g_out, "eldr-vanilla"));
  assert_non_null(strstr(g_out, "jsq+decor"));
  assert_non_null(strstr(g_out, "trace arrivals"));
  /* units in the header, and the rate column names the trace's arrivals (not "0") */
  assert_non_null(strstr(g_out, "req/s"));
  assert_non_null(strstr(g_out, "ms"));
  assert_null(strstr(g_out, "  0 "));
  assert_null(strstr(g_out, " 0/s"));
  assert_non_null(strstr(g_out, "   trace "));
  /* the default sweep: five rates from the capacity estimate */
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4",
                                        "--requests", "100", "--policies", "rr", "--json", "-q", NULL}),
                   0);
  json_t *a = rows_of(g_out);
  assert_int_equal(json_array_size(json_object_get(a, "rows")), 5);
  json_decref(a);
}

/* an artifact fitted by `eldr fit`, and a separate serve trace */
static void test_artifact_and_serve_trace(void **st) {
  (void)st;
  char art[600];
  snprintf(art, sizeof art, "%s/art.json", g_dir);
  assert_int_equal(run((const char *[]){"fit", "--trace", g_trace, "-k", "4", "-o", art, "-q", NULL}), 0);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--artifact", art, "--fit-fraction", "0.5",
                                        "--prefill", "2", "--decode", "4", "--rates", "100", "--requests",
                                        "200", "--policies", "eldr", "--json", "-q", NULL}),
                   0);
  json_t *a = rows_of(g_out);
  json_t *cfg = json_object_get(a, "config");
  assert_int_equal(json_integer_value(json_object_get(cfg, "pool_size")), 40);
  json_t *r0 = json_array_get(json_object_get(a, "rows"), 0);
  assert_int_equal(json_integer_value(json_object_get(r0, "fallbacks")), 0);
  assert_int_equal(json_integer_value(json_object_get(r0, "completed")), 200);
  json_decref(a);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--serve-trace", g_trace, "--prefill", "2",
                                        "--decode", "4", "--rates", "100", "--requests", "200", "--policies",
                                        "eldr", "--json", "-q", NULL}),
                   0);
  a = rows_of(g_out);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "config"), "pool_size")), 80);
  json_decref(a);
  /* --vanilla needs an in-process fit */
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--artifact", art, "--vanilla", NULL}), 2);
  /* a shape-mismatched artifact */
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--artifact", g_trace, NULL}), 1);
}

/* One seed default: eldr fit --fit-fraction and eldr sim --fit-fraction
 * split alike unless told otherwise; a served trace from another generator
 * seed (or real vs generated) is flagged on stderr. */
static void test_seed_default_and_provenance(void **st) {
  (void)st;
  char a1[600], a2[600], art[600], art3[600];
  snprintf(a1, sizeof a1, "%s/g1.jsonl", g_dir);
  snprintf(a2, sizeof a2, "%s/g2.jsonl", g_dir);
  snprintf(art, sizeof art, "%s/half.json", g_dir);
  snprintf(art3, sizeof art3, "%s/half3.json", g_dir);
  const char *gen1[] = {"trace", "gen", "-m", "olmoe-1b-7b", "-n", "40", "--decode-tokens", "8",
                        "--max-prompt-tokens", "8", "-o", a1, "-q", NULL};
  assert_int_equal(run(gen1), 0);
  const char *gen2[] = {"trace", "gen", "-m", "olmoe-1b-7b", "-n", "40", "--decode-tokens", "8",
                        "--max-prompt-tokens", "8", "-s", "2", "-o", a2, "-q", NULL};
  assert_int_equal(run(gen2), 0);
  /* the default seed is written into the trace */
  FILE *f = fopen(a1, "r");
  assert_non_null(f);
  char line[512];
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  assert_non_null(strstr(line, " seed=1\""));
  const char *sim_base[] = {"sim", "--trace", a1, "--serve-trace", a2, "--prefill", "1", "--decode",
                            "2", "--rates", "50", "--requests", "40", "--policies", "eldr", "-q", NULL};
  assert_int_equal(run(sim_base), 0);
  assert_non_null(strstr(g_err, "generator seed differs: fitted 1, served 2"));
  const char *sim_same[] = {"sim", "--trace", a1, "--serve-trace", a1, "--prefill", "1", "--decode",
                            "2", "--rates", "50", "--requests", "40", "--policies", "eldr", "-q", NULL};
  assert_int_equal(run(sim_same), 0);
  assert_null(strstr(g_err, "warning"));
  const char *sim_real[] = {"sim", "--trace", a1, "--serve-trace", g_trace, "--model", "olmoe-1b-7b",
                            "--prefill", "1", "--decode", "2", "--rates", "50", "--requests", "40",
                            "--policies", "eldr", "-q", NULL};
  assert_int_equal(run(sim_real), 0);
  assert_non_null(strstr(g_err, "warning"));
  /* fit and sim split alike by default: no warning; another fit seed: warned */
  assert_int_equal(run((const char *[]){"fit", "--trace", a1, "-k", "2", "--fit-fraction", "0.5", "-o",
                                        art, "-q", NULL}),
                   0);
  const char *sim_art[] = {"sim", "--trace", a1, "--artifact", art, "--fit-fraction", "0.5",
                           "--prefill", "1", "--decode", "2", "--rates", "50", "--requests", "40",
                           "--policies", "eldr", "-q", NULL};
  assert_int_equal(run(sim_art), 0);
  assert_null(strstr(g_err, "warning"));
  assert_int_equal(run((const char *[]){"fit", "--trace", a1, "-k", "2", "--fit-fraction", "0.5",
                                        "--seed", "3", "-o", art3, "-q", NULL}),
                   0);
  sim_art[4] = art3;
  assert_int_equal(run(sim_art), 0);
  assert_non_null(strstr(g_err, "fitted with seed 3, --seed is 1"));
  /* the artifact remembers the fitted trace's generator */
  sim_art[2] = a2;
  sim_art[4] = art;
  assert_int_equal(run(sim_art), 0);
  assert_non_null(strstr(g_err, "generator seed differs"));
}

static void test_plot(void **st) {
  (void)st;
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) skip();
  char dir[600], png[700];
  snprintf(dir, sizeof dir, "%s/plots", g_dir);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4",
                                        "--rates", "50,200", "--requests", "200", "--taus", "0,1",
                                        "--vanilla", "--plot", dir, "-q", NULL}),
                   0);
  struct stat sb;
  const char *files[] = {"tpot_p50_vs_rate.png", "tpot_p99_vs_rate.png", "tau_sweep.png",
                         "balanced_vs_vanilla.png"};
  for (size_t i = 0; i < 4; i++) {
    snprintf(png, sizeof png, "%s/%s", dir, files[i]);
    assert_int_equal(stat(png, &sb), 0);
    assert_true(sb.st_size > 1000);
  }
  /* every figure has a title naming the workload and cluster; one palette */
  snprintf(png, sizeof png, "%s/plot.gp", dir);
  char *gp = eldr_test_slurp(png, NULL);
  assert_non_null(gp);
  size_t titles = 0;
  for (char *p = gp; (p = strstr(p, "set title ")); p++) {
    char *eol = strchr(p, '\n');
    if (eol) *eol = 0;
    if (!strstr(p, "2P4D")) fail_msg("title without the cluster: %s", p);
    if (eol) *eol = '\n';
    titles++;
  }
  assert_int_equal(titles, 4);
  assert_non_null(strstr(gp, "set linetype 1 linecolor rgb '#0072b2'"));
  free(gp);
}

/* --plot into a directory whose name holds a quote and a space: the script
 * goes to gnuplot through a pipe, every path quoted (was system() with the
 * path pasted into a shell command) */
static void test_plot_odd_directory_name(void **st) {
  (void)st;
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) skip();
  char dir[600], png[700];
  snprintf(dir, sizeof dir, "%s/it's a dir", g_dir);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--prefill", "2", "--decode", "4",
                                        "--rates", "50", "--requests", "100", "--policies", "jsq,eldr",
                                        "--plot", dir, "-q", NULL}),
                   0);
  struct stat sb;
  snprintf(png, sizeof png, "%s/tpot_p50_vs_rate.png", dir);
  assert_int_equal(stat(png, &sb), 0);
  assert_true(sb.st_size > 1000);
  snprintf(png, sizeof png, "%s/plot.gp", dir);
  assert_int_equal(stat(png, &sb), 0);
}

static void test_bench_moe_layer(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"bench", "moe-layer", "--hidden", "64", "--inter", "32",
                                        "--experts-max", "16", "--experts", "8,16", "--batches",
                                        "1,4", "--min-time", "0", "--json", NULL}),
                   0);
  json_t *a = rows_of(g_out);
  json_t *pts = json_object_get(a, "points");
  assert_int_equal(json_array_size(pts), 3); /* batch 1 cannot touch 16 experts */
  for (size_t i = 0; i < 3; i++)
    assert_true(json_real_value(json_object_get(json_array_get(pts, i), "ms")) > 0);
  json_decref(a);
}

static double ep_row(json_t *root, const char *policy, const char *key) {
  json_t *rows = json_object_get(root, "rows");
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *r = json_array_get(rows, i);
    if (!strcmp(json_string_value(json_object_get(r, "policy")), policy))
      return json_real_value(json_object_get(r, key));
  }
  fail_msg("no row %s", policy);
  return 0;
}

/* Expert parallelism on the two-domain trace (domain a uses experts 0..31,
 * b 32..63, each token 8 consecutive ones): with the linear layout a decoder
 * that ELDR fills with one domain uses only 2 of its 4 EP ranks and most of a
 * token's experts sit on one of them; per-decoder placement spreads its
 * cluster's experts over all ranks and is faster.
 * The artifact written by `eldr fit --ep-size` gives the same per-decoder
 * run as fitting in-process on the same split. */
static void test_expert_parallel(void **st) {
  (void)st;
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--placement", "global", NULL}), 2);
  assert_non_null(strstr(g_err, "--ep-size"));
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--ep-size", "3", NULL}), 2);
  assert_int_equal(run((const char *[]){"sim", "--trace", g_trace, "--ep-size", "4", "--placement",
                                        "diagonal", NULL}), 2);
  assert_non_null(strstr(g_err, "diagonal"));
  const char *base[] = {"sim", "--trace", g_trace, "--prefill", "1", "--decode", "2", "--rates", "60",
                        "--requests", "300", "--policies", "jsq,eldr", "--ep-size", "4", "--json",
                        "-q", "--placement"};
  const size_t nb = sizeof base / sizeof base[0];
  json_t *res[3];
  const char *kinds[3] = {"linear", "global", "per-decoder"};
  for (int i = 0; i < 3; i++) {
    const char *args[32];
    memcpy(args, base, sizeof base);
    args[nb] = kinds[i];
    args[nb + 1] = NULL;
    assert_int_equal(run(args), 0);
    res[i] = rows_of(g_out);
    json_t *cfg = json_object_get(res[i], "config");
    assert_string_equal(json_string_value(json_object_get(cfg, "placement")), kinds[i]);
    assert_int_equal(json_integer_value(json_object_get(cfg, "ep_size")), 4);
  }
  double lin = ep_row(res[0], "eldr", "ep_busiest_share");
  double per = ep_row(res[2], "eldr", "ep_busiest_share");
  /* a token's 8 consecutive experts mostly share one linear rank */
  if (!(lin > 0.6 && per > 0.25 - 1e-9 && per < lin - 0.2))
    fail_msg("busiest-rank share: linear %g, per-decoder %g", lin, per);
  assert_true(ep_row(res[0], "jsq", "ep_busiest_share") < lin);
  assert_true(ep_row(res[2], "eldr", "tpot_p50_ms") < ep_row(res[0], "eldr", "tpot_p50_ms"));

  /* fit --ep-size on the same split, then sim --artifact loads the files */
  char art[600];
  snprintf(art, sizeof art, "%s/ep.json", g_dir);
  assert_int_equal(run((const char *[]){"fit", "--trace", g_trace, "--decoders", "2", "-o", art,
                                        "--seed", "1", "--fit-fraction", "0.5", "--ep-size", "4",
                                        "-q", NULL}),
                   0);
  const char *args[40];
  memcpy(args, base, sizeof base);
  args[nb] = "per-decoder";
  args[nb + 1] = "--artifact";
  args[nb + 2] = art;
  args[nb + 3] = "--fit-fraction";
  args[nb + 4] = "0.5";
  args[nb + 5] = NULL;
  assert_int_equal(run(args), 0);
  json_t *fromfile = rows_of(g_out);
  assert_true(fabs(ep_row(fromfile, "eldr", "ep_busiest_share") - per) < 0.03);
  json_decref(fromfile);
  args[nb + 5] = "--ep-size";
  args[nb + 6] = "2";
  args[nb + 7] = NULL;
  assert_int_equal(run(args), 2); /* the files are for EP 4 */
  assert_non_null(strstr(g_err, "EP 4"));
  for (int i = 0; i < 3; i++) json_decref(res[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help_and_errors),
      cmocka_unit_test(test_print_latency),
      cmocka_unit_test(test_run_json_csv_deterministic),
      cmocka_unit_test(test_table_ablation_trace_arrivals),
      cmocka_unit_test(test_warnings_custom_loads_log),
      cmocka_unit_test(test_artifact_and_serve_trace),
      cmocka_unit_test(test_seed_default_and_provenance),
      cmocka_unit_test(test_plot),
      cmocka_unit_test(test_plot_odd_directory_name),
      cmocka_unit_test(test_bench_moe_layer),
      cmocka_unit_test(test_expert_parallel),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
