/* test_tracestats.c — trace statistics on hand-built traces with known
 * answers: Pearson, top-share, distinct experts per batching rule
 * (including continuous-batching refill), domain mix, lengths, JSON, the
 * per-domain counts reference parser. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/trace.h"
#include "eldr/tracestats.h"

static void test_pearson(void **state) {
  (void)state;
  const uint32_t a[] = {1, 2, 3, 4}, b[] = {2, 4, 6, 8}, c[] = {4, 3, 2, 1}, k[] = {5, 5, 5, 5};
  assert_true(fabs(eldr_tracestats_pearson(a, b, 4) - 1.0) < 1e-12);
  assert_true(fabs(eldr_tracestats_pearson(a, c, 4) + 1.0) < 1e-12);
  assert_true(isnan(eldr_tracestats_pearson(a, k, 4)));
  assert_true(isnan(eldr_tracestats_pearson(a, b, 1)));
  const uint32_t x[] = {1, 0, 0}, y[] = {0, 1, 0};
  /* means 1/3: cov = -1/3*... ; r = -0.5 */
  assert_true(fabs(eldr_tracestats_pearson(x, y, 3) + 0.5) < 1e-12);
}

static void test_top_share(void **state) {
  (void)state;
  double v[20];
  for (int i = 0; i < 20; i++) v[i] = 1;
  /* uniform: top 10% (2 of 20) take 10% */
  assert_true(fabs(eldr_tracestats_top_share(v, 20, 0.1) - 0.1) < 1e-12);
  v[7] = 81; /* total 100, top-2 = 81 + 1 */
  assert_true(fabs(eldr_tracestats_top_share(v, 20, 0.1) - 0.82) < 1e-12);
  /* ceil: 64 experts -> 7 */
  double w[64] = {0};
  for (int i = 0; i < 7; i++) w[i] = 1;
  w[63] = 1;
  assert_true(fabs(eldr_tracestats_top_share(w, 64, 0.1) - 7.0 / 8.0) < 1e-12);
  double z[4] = {0};
  assert_true(isnan(eldr_tracestats_top_share(z, 4, 0.1)));
}

/* A trace with L=1, E=8, K=2. Domain "a" always decodes {0,1}, domain "b"
 * always {2,3}; prefill equals decode. */
static eldr_trace *two_domain_trace(size_t per_domain, uint32_t dec_a, uint32_t dec_b) {
  eldr_shape s = {1, 8, 2};
  eldr_trace *t = eldr_trace_new("toy", &s, NULL);
  assert_non_null(t);
  uint16_t a[2 * 64], b[2 * 64];
  for (int i = 0; i < 64; i++) {
    a[2 * i] = (uint16_t)(i % 2);
    a[2 * i + 1] = (uint16_t)(1 - i % 2);
    b[2 * i] = 2;
    b[2 * i + 1] = 3;
  }
  char id[32];
  for (size_t i = 0; i < per_domain; i++) {
    snprintf(id, sizeof id, "a/%zu", i);
    assert_true(eldr_trace_append(t, id, "a", NULL, -1, a, 3, a, dec_a, NULL) >= 0);
    snprintf(id, sizeof id, "b/%zu", i);
    assert_true(eldr_trace_append(t, id, "b", NULL, -1, b, 5, b, dec_b, NULL) >= 0);
  }
  return t;
}

static void test_distinct_rules(void **state) {
  (void)state;
  eldr_trace *t = two_domain_trace(40, 6, 6);
  int *cl = malloc(t->n * sizeof *cl);
  for (size_t i = 0; i < t->n; i++) cl[i] = t->req[i].domain == 0 ? 1 : 0;
  eldr_tracestats_opts o;
  eldr_tracestats_opts_default(&o);
  const size_t sizes[] = {2, 4};
  o.batch_sizes = sizes;
  o.n_batch_sizes = 2;
  o.batches = 3000;
  o.seed = 11;
  o.cluster = cl;
  eldr_tracestats s;
  assert_int_equal(eldr_tracestats_compute(t, &o, &s, NULL), 0);
  assert_int_equal(s.n_requests, 80);
  assert_int_equal(s.steps, 6);
  assert_int_equal(s.n_clusters, 2);
  /* same-domain batches always touch exactly 2 experts */
  assert_true(fabs(s.batch[0].distinct[ELDR_BATCH_DOMAIN] - 2.0) < 1e-12);
  assert_true(fabs(s.batch[1].distinct[ELDR_BATCH_DOMAIN] - 2.0) < 1e-12);
  assert_true(fabs(s.batch[1].distinct[ELDR_BATCH_CLUSTER] - 2.0) < 1e-12);
  /* random pairs: P(same domain) = 39/79 -> E[distinct] = 2 + 2 * 40/79 */
  double expect2 = 2.0 + 2.0 * 40.0 / 79.0;
  assert_true(fabs(s.batch[0].distinct[ELDR_BATCH_RANDOM] - expect2) < 0.06);
  /* random quadruples: 4 unless all four from one domain */
  double p_same4 = 2.0 * (40.0 / 80) * (39.0 / 79) * (38.0 / 78) * (37.0 / 77);
  double expect4 = 4.0 - 2.0 * p_same4;
  assert_true(fabs(s.batch[1].distinct[ELDR_BATCH_RANDOM] - expect4) < 0.06);
  assert_true(fabs(s.batch[0].reduction[ELDR_BATCH_DOMAIN] - (1 - 2.0 / expect2)) < 0.02);
  assert_true(s.batch[0].reduction[ELDR_BATCH_RANDOM] == 0.0);
  assert_int_equal(s.batch[0].drawn[ELDR_BATCH_DOMAIN], 3000);
  /* correlation: prefill == decode pattern -> 1 */
  assert_int_equal(s.n_corr, 80);
  assert_true(fabs(s.corr_median - 1.0) < 1e-12);
  /* domain mix and lengths */
  assert_int_equal(s.n_domains, 2);
  assert_int_equal(s.domain_count[0], 40);
  assert_int_equal(s.domain_count[1], 40);
  assert_true(fabs(s.domain_top2 - 1.0) < 1e-12);
  assert_true(fabs(s.domain_skew - 1.0) < 1e-12);
  assert_true(fabs(s.prompt.mean - 4.0) < 1e-12);
  assert_int_equal(s.prompt.min, 3);
  assert_int_equal(s.prompt.max, 5);
  assert_true(fabs(s.output.median - 6.0) < 1e-12);
  /* popularity: each domain uses 2 of 8 experts equally; top 10% = 1 expert */
  assert_true(fabs(s.top10_share_domain - 0.5) < 1e-12);
  /* whole trace: e2, e3 take 40 * 11 each, e0, e1 40 * 9 each -> 440 / 1600 */
  assert_true(fabs(s.top10_share - 0.275) < 1e-12);

  /* deterministic for a seed */
  eldr_tracestats s2;
  assert_int_equal(eldr_tracestats_compute(t, &o, &s2, NULL), 0);
  assert_true(s2.batch[0].distinct[ELDR_BATCH_RANDOM] == s.batch[0].distinct[ELDR_BATCH_RANDOM]);
  eldr_tracestats_free(&s2);

  /* JSON has the fields */
  char *js = eldr_tracestats_json(&s, t);
  assert_non_null(js);
  json_error_t je;
  json_t *root = json_loads(js, 0, &je);
  assert_non_null(root);
  assert_true(fabs(json_real_value(json_object_get(json_object_get(root, "correlation"),
                                                   "median")) -
                   1.0) < 1e-9);
  json_t *b0 = json_array_get(json_object_get(root, "batches"), 0);
  assert_int_equal(json_integer_value(json_object_get(b0, "size")), 2);
  assert_non_null(json_object_get(json_object_get(b0, "domain"), "reduction"));
  assert_non_null(json_object_get(json_object_get(root, "domains"), "mix"));
  json_decref(root);
  free(js);
  eldr_tracestats_free(&s);
  free(cl);
  eldr_trace_free(t);
}

/* Continuous batching: short requests are replaced, so a batch of one slot
 * always has a request decoding; requests without decode tokens are skipped. */
static void test_refill(void **state) {
  (void)state;
  eldr_trace *t = two_domain_trace(10, 2, 12); /* a: 2 tokens, b: 12 tokens */
  eldr_shape s1 = t->shape;
  (void)s1;
  /* add requests with no decode tokens in domain a */
  uint16_t p[2] = {0, 1};
  for (int i = 0; i < 5; i++)
    assert_true(eldr_trace_append(t, "a/empty", "a", NULL, -1, p, 1, NULL, 0, NULL) >= 0);
  eldr_tracestats_opts o;
  eldr_tracestats_opts_default(&o);
  const size_t sizes[] = {1, 2};
  o.batch_sizes = sizes;
  o.n_batch_sizes = 2;
  o.batches = 500;
  o.steps = 12;
  eldr_tracestats s;
  assert_int_equal(eldr_tracestats_compute(t, &o, &s, NULL), 0);
  assert_int_equal(s.steps, 12);
  /* one slot: always exactly K = 2 experts, whatever the rule */
  assert_true(fabs(s.batch[0].distinct[ELDR_BATCH_RANDOM] - 2.0) < 1e-12);
  assert_true(fabs(s.batch[0].distinct[ELDR_BATCH_DOMAIN] - 2.0) < 1e-12);
  /* two slots of one domain: always 2 (refilled from the same domain) */
  assert_true(fabs(s.batch[1].distinct[ELDR_BATCH_DOMAIN] - 2.0) < 1e-12);
  /* requests without decode tokens give no correlation */
  assert_int_equal(s.n_corr, 20);
  assert_int_equal(s.output.min, 0);
  eldr_tracestats_free(&s);
  eldr_trace_free(t);
}

static void test_rules_unavailable(void **state) {
  (void)state;
  eldr_trace *t = two_domain_trace(3, 4, 4);
  eldr_tracestats_opts o;
  eldr_tracestats_opts_default(&o);
  const size_t sizes[] = {4, 100};
  o.batch_sizes = sizes;
  o.n_batch_sizes = 2;
  eldr_tracestats s;
  assert_int_equal(eldr_tracestats_compute(t, &o, &s, NULL), 0);
  /* batch 4 > 3 requests per domain: no same-domain batch; 100 > 6: none */
  assert_true(isnan(s.batch[0].distinct[ELDR_BATCH_DOMAIN]));
  assert_true(!isnan(s.batch[0].distinct[ELDR_BATCH_RANDOM]));
  assert_true(isnan(s.batch[1].distinct[ELDR_BATCH_RANDOM]));
  assert_true(isnan(s.batch[0].distinct[ELDR_BATCH_CLUSTER]));
  assert_int_equal(s.n_clusters, 0);
  char *js = eldr_tracestats_json(&s, t);
  json_t *root = json_loads(js, 0, NULL);
  assert_non_null(root); /* NaN written as null, still valid JSON */
  json_decref(root);
  free(js);
  eldr_tracestats_free(&s);

  const size_t zero[] = {0};
  o.batch_sizes = zero;
  o.n_batch_sizes = 1;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_tracestats_compute(t, &o, &s, &d), ELDR_EINVAL);
  eldr_trace_free(t);

  eldr_shape sh = {1, 8, 2};
  eldr_trace *e = eldr_trace_new("toy", &sh, NULL);
  assert_int_equal(eldr_tracestats_compute(e, NULL, &s, &d), ELDR_EEMPTY);
  assert_non_null(strstr(d.msg, "no requests"));
  eldr_trace_free(e);
}

static void test_domain_counts_reference(void **state) {
  (void)state;
  const char *js =
      "{\"m2\": {\"model\": \"M2\", \"num_experts\": 10, \"top_k\": 2, \"layers\": [0],"
      " \"domains\": {\"x\": [[1,1,1,1,1,1,1,1,1,1]]}},"
      " \"m8\": {\"model\": \"M8\", \"num_experts\": 10, \"top_k\": 8, \"layers\": [0, 1],"
      " \"domains\": {\"x\": [[91,1,1,1,1,1,1,1,1,1], [1,1,1,1,1,1,1,1,1,1]],"
      "               \"y\": [[1,1,1,1,1,1,1,1,1,1], [0,0,0,0,0,0,0,0,0,10]]}}}";
  char model[32], names[4][48];
  double shares[4], mean = 0, overall = 0;
  size_t n = 0;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_tracestats_domain_counts_skew(js, strlen(js), NULL, model, sizeof model,
                                                      names, shares, 4, &n, &mean, &overall, &d),
                   0);
  assert_string_equal(model, "M8"); /* the top-8 entry */
  assert_int_equal(n, 2);
  assert_string_equal(names[0], "x");
  /* x: layer 0 top-1 of 10 = 91/100, layer 1 = 0.1 -> 0.505; y: 0.1, 1.0 -> 0.55 */
  assert_true(fabs(shares[0] - 0.505) < 1e-12);
  assert_true(fabs(shares[1] - 0.55) < 1e-12);
  assert_true(fabs(mean - 0.5275) < 1e-12);
  /* summed: layer 0 = 92/110, layer 1 = 11/20 */
  assert_true(fabs(overall - (92.0 / 110 + 11.0 / 20) / 2) < 1e-12);
  assert_int_equal(eldr_tracestats_domain_counts_skew(js, strlen(js), "m2", model, sizeof model,
                                                      NULL, NULL, 0, &n, &mean, &overall, &d),
                   0);
  assert_string_equal(model, "M2");

  const char *bad[] = {
      "[]",
      "{\"m\": {\"num_experts\": 2, \"domains\": {\"x\": [[1, 2, 3]]}}}",
      "{\"m\": {\"num_experts\": 2, \"domains\": {\"x\": [[1, -2]]}}}",
      "{\"m\": {\"num_experts\": 2, \"domains\": {\"x\": [[1, 2]], \"y\": [[1, 2], [1, 2]]}}}",
      "{\"m\": {\"domains\": {\"x\": [[1, 2]]}}}",
      "{\"m\": {\"num_experts\": 2, \"domains\": {}}}",
      "{\"m\": 1}",
      "{",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&d, 0, sizeof d);
    assert_true(eldr_tracestats_domain_counts_skew(bad[i], strlen(bad[i]), NULL, NULL, 0, NULL,
                                                   NULL, 0, &n, &mean, &overall, &d) < 0);
    assert_true(d.msg[0] != 0);
  }
}

/* The real counts file, when present: OLMoE's per-domain top-10% share. */
static void test_olmoe_reference(void **state) {
  (void)state;
  char path[1024];
  snprintf(path, sizeof path, "%s/traces/olmoe-domain-expert-counts.json", ELDR_SHARED_DIR);
  FILE *f = fopen(path, "rb");
  if (!f) skip();
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char model[64];
  double mean = 0, overall = 0;
  size_t nd = 0;
  assert_int_equal(eldr_tracestats_domain_counts_skew(buf, n, NULL, model, sizeof model, NULL,
                                                      NULL, 0, &nd, &mean, &overall, NULL),
                   0);
  print_message("%s: %zu domains, top-10%% share per domain %.3f, overall %.3f\n", model, nd,
                mean, overall);
  assert_string_equal(model, "OLMoE-1B-7B-0924");
  assert_int_equal(nd, 6);
  assert_true(mean > 0.1 && mean < 0.875);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pearson),
      cmocka_unit_test(test_top_share),
      cmocka_unit_test(test_distinct_rules),
      cmocka_unit_test(test_refill),
      cmocka_unit_test(test_rules_unavailable),
      cmocka_unit_test(test_domain_counts_reference),
      cmocka_unit_test(test_olmoe_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
