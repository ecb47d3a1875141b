/* test_fit.c — eldr_fit on crafted traces and (when present) the real one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/artifact.h"
#include "eldr/fit.h"
#include "eldr/trace.h"
#include "eldr/rng.h"

/* A trace with `domains` groups: each domain's requests draw their prefill and
 * decode experts mostly from a domain-specific quarter of the experts. */
static eldr_trace *make_trace(size_t n, size_t domains, uint64_t seed) {
  eldr_shape s = {.num_layers = 4, .num_experts = 32, .top_k = 2};
  eldr_trace *t = eldr_trace_new("test-model", &s, NULL);
  assert_non_null(t);
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  const size_t L = s.num_layers, K = s.top_k, E = s.num_experts;
  uint16_t pre[12 * 4 * 2], dec[20 * 4 * 2];
  for (size_t i = 0; i < n; i++) {
    size_t dom = i % domains;
    size_t np = 4 + eldr_rng_below(&r, 8), nd = 20;
    for (size_t x = 0; x < np * L * K; x++) {
      uint64_t e = eldr_rng_uniform(&r) < 0.85 ? (dom * 8 + eldr_rng_below(&r, 8)) % E : eldr_rng_below(&r, E);
      pre[x] = (uint16_t)e;
    }
    for (size_t x = 0; x < nd * L * K; x++) {
      uint64_t e = eldr_rng_uniform(&r) < 0.85 ? (dom * 8 + eldr_rng_below(&r, 8)) % E : eldr_rng_below(&r, E);
      dec[x] = (uint16_t)e;
    }
    char id[32], dn[32];
    snprintf(id, sizeof id, "r%zu", i);
    snprintf(dn, sizeof dn, "d%zu", dom);
    assert_true(eldr_trace_append(t, id, dn, NULL, -1.0, pre, (uint32_t)np, dec, (uint32_t)nd, NULL) >= 0);
  }
  return t;
}

static void test_fit_balanced_capacity_and_report(void **state) {
  (void)state;
  eldr_trace *t = make_trace(50, 4, 1);
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = 4;
  o.seed = 7;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  eldr_diag d = {{0}};
  int rc = eldr_fit(t, &o, &a, &rep, &d);
  assert_int_equal(rc, 0);
  assert_non_null(a);
  /* count, binary x idf off/on */
  assert_int_equal(rep.n_cand, 4);
  assert_int_equal(rep.n, 50);
  assert_int_equal(rep.capacity, 13);
  size_t total = 0;
  for (size_t c = 0; c < a->k; c++) {
    assert_true(a->cluster_sizes[c] <= 13);
    total += a->cluster_sizes[c];
  }
  assert_int_equal(total, 50);
  /* the data has strong domain structure: rho must be clearly positive */
  assert_true(a->fit_rho > 0.3);
  assert_int_equal(eldr_artifact_validate(a, &d), 0);
  /* the chosen candidate is the best by greedy-mask rho */
  for (size_t i = 0; i < rep.n_cand; i++) assert_true(rep.cand[i].rho_mask <= rep.cand[rep.chosen].rho_mask + 1e-12);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  eldr_trace_free(t);
}

static void test_fit_deterministic(void **state) {
  (void)state;
  eldr_trace *t = make_trace(40, 4, 2);
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = 4;
  o.seed = 11;
  eldr_artifact *a = NULL, *b = NULL;
  eldr_fit_report r1, r2;
  assert_int_equal(eldr_fit(t, &o, &a, &r1, NULL), 0);
  assert_int_equal(eldr_fit(t, &o, &b, &r2, NULL), 0);
  assert_int_equal(a->dim, b->dim);
  assert_memory_equal(a->centroids, b->centroids, a->k * a->dim * sizeof(float));
  assert_memory_equal(a->mask, b->mask, t->shape.num_layers);
  char *ja = eldr_artifact_dump(a), *jb = eldr_artifact_dump(b);
  assert_string_equal(ja, jb);
  free(ja);
  free(jb);
  eldr_fit_report_free(&r1);
  eldr_fit_report_free(&r2);
  eldr_artifact_free(a);
  eldr_artifact_free(b);
  eldr_trace_free(t);
}

static void test_fit_forced_choices(void **state) {
  (void)state;
  eldr_trace *t = make_trace(30, 3, 3);
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = 3;
  o.repr = ELDR_REPR_BINARY;
  o.idf = ELDR_FIT_OFF;
  o.layers = ELDR_FIT_LAYERS_ALL;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  assert_int_equal(eldr_fit(t, &o, &a, &rep, NULL), 0);
  assert_int_equal(rep.n_cand, 1);
  assert_int_equal(a->repr, ELDR_REPR_BINARY);
  assert_int_equal(a->idf_enabled, 0);
  assert_null(a->idf);
  for (size_t l = 0; l < t->shape.num_layers; l++) assert_true(a->mask[l]);
  assert_int_equal(a->dim, t->shape.num_layers * t->shape.num_experts);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);

  uint8_t list[4] = {0, 1, 0, 1};
  o.layers = ELDR_FIT_LAYERS_LIST;
  o.layer_list_mask = list;
  assert_int_equal(eldr_fit(t, &o, &a, &rep, NULL), 0);
  assert_memory_equal(a->mask, list, 4);
  assert_int_equal(a->dim, 2 * t->shape.num_experts);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  eldr_trace_free(t);
}

static void test_fit_errors(void **state) {
  (void)state;
  eldr_trace *t = make_trace(5, 2, 4);
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  eldr_diag d = {{0}};
  o.k = 6; /* more decoders than requests */
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), ELDR_EEMPTY);
  assert_null(a);
  assert_non_null(strstr(d.msg, "decoders"));
  o.k = 2;
  o.repr = ELDR_REPR_GATE; /* no gates in this trace */
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), ELDR_EUNSUPPORTED);
  assert_non_null(strstr(d.msg, "prefill_gates"));
  o.repr = -1;
  o.tau = -0.5;
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), ELDR_ERANGE);
  eldr_trace_free(t);
}

static void test_fit_subset(void **state) {
  (void)state;
  eldr_trace *t = make_trace(40, 4, 5);
  size_t sub[20];
  for (size_t i = 0; i < 20; i++) sub[i] = 2 * i;
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = 4;
  o.subset = sub;
  o.n_subset = 20;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  assert_int_equal(eldr_fit(t, &o, &a, &rep, NULL), 0);
  assert_int_equal(rep.n, 20);
  assert_int_equal(a->fit_n, 20);
  for (size_t c = 0; c < 4; c++) assert_true(a->cluster_sizes[c] <= 5);
  /* every trace request gets a unit signature under the artifact */
  uint32_t *counts = calloc(eldr_shape_cells(&t->shape), sizeof *counts);
  float *sig = calloc(a->dim, sizeof *sig);
  assert_int_equal(eldr_fit_request_signature(a, t, &t->req[1], counts, NULL, sig), 0);
  double norm = 0;
  for (size_t i = 0; i < a->dim; i++) norm += (double)sig[i] * sig[i];
  assert_true(fabs(norm - 1.0) < 1e-5);
  free(sig);
  free(counts);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  eldr_trace_free(t);
}

/* No decode selections: rho cannot be measured, so the fit refuses to
 * choose (ELDR_EEMPTY, saying why) unless the caller accepts a prefill-only
 * fit or names representation and layers; the artifact says which. */
static void test_fit_without_decode(void **state) {
  (void)state;
  eldr_shape s = {.num_layers = 2, .num_experts = 8, .top_k = 1};
  eldr_trace *t = eldr_trace_new("m", &s, NULL);
  uint16_t pre[4 * 2];
  for (size_t i = 0; i < 12; i++) {
    for (size_t x = 0; x < 8; x++) pre[x] = (uint16_t)((i % 3) * 2 + x % 2);
    char id[32];
    snprintf(id, sizeof id, "r%zu", i);
    assert_true(eldr_trace_append(t, id, NULL, NULL, -1, pre, 4, NULL, 0, NULL) >= 0);
  }
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = 3;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), ELDR_EEMPTY);
  assert_null(a);
  assert_non_null(strstr(d.msg, "none of the 12 requests carries decode selections"));
  assert_non_null(strstr(d.msg, "--prefill-only"));
  eldr_fit_report_free(&rep);
  o.repr = ELDR_REPR_BINARY; /* named, with the layers still auto: refused too */
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), ELDR_EEMPTY);
  eldr_fit_report_free(&rep);
  o.layers = ELDR_FIT_LAYERS_ALL; /* both named: their choice */
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), 0);
  assert_int_equal(a->repr, ELDR_REPR_BINARY);
  assert_int_equal(a->fit_chosen_by, ELDR_FIT_BY_NAMED);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  eldr_fit_opts_default(&o);
  o.k = 3;
  o.prefill_only = 1;
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), 0);
  assert_int_equal(a->fit_chosen_by, ELDR_FIT_BY_PREFILL_ONLY);
  assert_int_equal(a->fit_decode_n, 0);
  assert_int_equal(rep.with_decode, 0);
  assert_int_equal(rep.rho_undefined, rep.n_cand);
  assert_true(isnan(a->fit_rho));
  assert_int_equal(a->repr, ELDR_REPR_COUNT);
  assert_int_equal(a->idf_enabled, 1);
  for (size_t c = 0; c < 3; c++) assert_true(a->cluster_sizes[c] <= 4);
  /* the artifact survives a save/load round trip (rho written as null) */
  char *js = eldr_artifact_dump(a);
  assert_non_null(js);
  eldr_artifact *b = NULL;
  assert_int_equal(eldr_artifact_parse(js, strlen(js), &b, &d), 0);
  assert_true(isnan(b->fit_rho));
  assert_int_equal(b->fit_chosen_by, ELDR_FIT_BY_PREFILL_ONLY);
  assert_int_equal(b->fit_decode_n, 0);
  eldr_artifact_free(b);
  free(js);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  eldr_trace_free(t);
}

/* The split is a seeded permutation. */
static void test_fit_shuffle(void **state) {
  (void)state;
  size_t a[50], b[50], seen[50] = {0};
  eldr_fit_shuffle(a, 50, 9);
  eldr_fit_shuffle(b, 50, 9);
  assert_memory_equal(a, b, sizeof a);
  for (size_t i = 0; i < 50; i++) seen[a[i]]++;
  for (size_t i = 0; i < 50; i++) assert_int_equal(seen[i], 1);
  eldr_fit_shuffle(b, 50, 10);
  assert_memory_not_equal(a, b, sizeof a);
}

/* Acceptance on the real Llama-4 trace: K = 16, no cluster above ceil(N/K). */
static void test_fit_real_llama4(void **state) {
  (void)state;
  char path[1024];
  snprintf(path, sizeof path, "%s/traces/llama4-mmlu-dev.jsonl", ELDR_SHARED_DIR);
  FILE *f = fopen(path, "r");
  if (!f) skip();
  fclose(f);
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_trace_load(path, &t, &d), 0);
  eldr_fit_opts o;
  eldr_fit_opts_default(&o);
  o.k = 16;
  o.restarts = 2;
  eldr_artifact *a = NULL;
  eldr_fit_report rep;
  assert_int_equal(eldr_fit(t, &o, &a, &rep, &d), 0);
  size_t cap = (rep.n + 15) / 16;
  for (size_t c = 0; c < 16; c++) assert_true(a->cluster_sizes[c] <= cap);
  assert_true(a->fit_rho > 0.0);
  eldr_fit_report_free(&rep);
  eldr_artifact_free(a);
  eldr_trace_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit_balanced_capacity_and_report),
      cmocka_unit_test(test_fit_deterministic),
      cmocka_unit_test(test_fit_forced_choices),
      cmocka_unit_test(test_fit_errors),
      cmocka_unit_test(test_fit_subset),
      cmocka_unit_test(test_fit_without_decode),
      cmocka_unit_test(test_fit_shuffle),
      cmocka_unit_test(test_fit_real_llama4),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
