/* test_sim_pd.c — when the simulator chooses the decoder (eldr_sim_pd):
 * the timing of each mode on a toy model with hand-checkable times, the
 * predicted signature from a Mooncake pool's blocks held by the run's
 * signature cache (filled by prefills as they end), the first-f-known
 * prediction (f = 1 decides exactly as the true signature, f = 0 never
 * predicts), and the argument checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/mooncake_io.h"
#include "eldr/predict.h"
#include "eldr/preset_files.h"
#include "eldr/rng.h"
#include "eldr/sim.h"
#include "sim/sim_toy.h"

/* |a - b| <= eps (cmocka 1.1 has no double assertion) */
#define assert_double_equal(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static size_t *iota(size_t n) {
  size_t *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = i;
  return v;
}

/* One request, one decoder, 2 layers x top-1 on the same expert every
 * token: a step is 2 x 1 + 0.5 = 2.5 s. TTFT = prefill + KV + step where
 * the decode worker registered at
 * arrival (sglang), plus the registration where it is sent after the
 * prefill (vllm, sglang-exact). */
static void test_pd_timing(void **st) {
  (void)st;
  eldr_shape s = {2, 8, 1};
  eldr_latency_model m;
  toy_model(&m, s.num_layers, s.num_experts, s.top_k);
  eldr_trace *t = eldr_trace_new("toy", &s, NULL);
  uint16_t pre[2] = {1, 1}, dec[3 * 2] = {1, 1, 1, 1, 1, 1};
  assert_true(eldr_trace_append(t, "a", NULL, NULL, 0.0, pre, 1, dec, 3, NULL) >= 0);
  size_t *idx = iota(1);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 1};
  const double step = eldr_latency_step(&m, 1, (uint32_t[]){1, 1}, 1);
  assert_double_equal(step, 2.5, 1e-9);
  const double base = eldr_latency_prefill(&m, 1) + eldr_latency_kv_transfer(&m, 1) + step;
  const double want[3] = {base + 1, base, base + 1};
  for (int pd = 0; pd < 3; pd++) {
    eldr_sim_config c;
    eldr_sim_config_default(&c);
    c.n_prefill = 1;
    c.n_decode = 1;
    c.rate = 0;
    c.pd = (eldr_sim_pd)pd;
    c.register_s = 1.0;
    eldr_sim_log log[1];
    c.log = log;
    eldr_sim_result r;
    eldr_diag d = {{0}};
    assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), 0);
    assert_double_equal(log[0].first_token - log[0].arrival, want[pd], 1e-9);
    assert_double_equal(r.ttft_p50, want[pd], 1e-9);
    assert_int_equal(r.decisions, 1);
    assert_int_equal(r.predicted, 0);
    /* sglang predicts (nothing known: confidence 0), the others do not */
    assert_double_equal(log[0].confidence, pd == ELDR_SIM_PD_SGLANG ? 0.0 : -1.0, 0);
  }
  free(idx);
  eldr_trace_free(t);
}

/* Three Mooncake records: r0 at 0 s with blocks 10,11,12 (1536 tokens);
 * r1 at 0.001 s sharing 10,11 (its prefill starts before r0's ends);
 * r2 at 100 s with r0's three blocks and a 100-token tail. */
static const char MC[] =
    "{\"timestamp\": 0, \"input_length\": 1536, \"output_length\": 4, \"hash_ids\": [10, 11, 12]}\n"
    "\n"
    "{\"timestamp\": 1, \"input_length\": 1536, \"output_length\": 3, \"hash_ids\": [10, 11, 13]}\n"
    "{\"timestamp\": 100000, \"input_length\": 1636, \"output_length\": 5, \"hash_ids\": [10, 11, 12, 14], "
    "\"extra\": \"ignored\"}\n";

static void build_mc(eldr_trace **t, eldr_block_table *bt, const eldr_shape *s) {
  eldr_mooncake mc;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_mooncake_parse(MC, sizeof MC - 1, "mc", 0, &mc, &d), 0);
  assert_int_equal(mc.n, 3);
  eldr_tracegen *g = NULL;
  assert_int_equal(eldr_tracegen_new(s, "toy", "realistic", 7, &g, &d), 0);
  assert_int_equal(eldr_mooncake_build(g, &mc, 0, 0, t, bt, NULL, NULL, &d), 0);
  eldr_tracegen_free(g);
  eldr_mooncake_free(&mc);
}

/* Shared blocks share their rows exactly; counts are the blocks' plus the
 * tail's; lengths and arrivals are the records'. */
static void test_mooncake_build(void **st) {
  (void)st;
  eldr_shape s = {3, 16, 2};
  eldr_trace *t = NULL;
  eldr_block_table bt;
  build_mc(&t, &bt, &s);
  assert_int_equal(t->n, 3);
  assert_int_equal(bt.n_blocks, 4); /* 10 11 12 13; 14 is r2's partial block */
  assert_int_equal(bt.off[1] - bt.off[0], 3);
  assert_int_equal(bt.off[3] - bt.off[2], 3);
  assert_int_equal(bt.ids[bt.off[1]], bt.ids[bt.off[0]]);
  assert_int_equal(bt.ids[bt.off[1] + 1], bt.ids[bt.off[0] + 1]);
  assert_int_not_equal(bt.ids[bt.off[1] + 2], bt.ids[bt.off[0] + 2]);
  for (int p = 0; p < 3; p++) assert_int_equal(bt.ids[bt.off[2] + p], bt.ids[bt.off[0] + p]);
  assert_int_equal(t->req[0].n_prefill, 1536);
  assert_int_equal(t->req[2].n_prefill, 1636);
  assert_int_equal(t->req[1].n_decode, 3);
  assert_double_equal(t->req[2].arrival, 100.0, 1e-12);
  assert_non_null(t->req[2].decode);
  const size_t cells = bt.cells;
  /* each block's layer rows hold 512 tokens x top-2 */
  for (size_t b = 0; b < bt.n_blocks; b++) {
    uint32_t sum = 0;
    for (uint32_t e = 0; e < s.num_experts; e++) sum += bt.counts[b * cells + e];
    assert_int_equal(sum, 512 * 2);
  }
  /* r2 = r0's three blocks + a 100-token tail: per layer 100 x 2 more, never less */
  for (uint32_t l = 0; l < s.num_layers; l++) {
    int64_t diff = 0;
    for (uint32_t e = 0; e < s.num_experts; e++) {
      size_t c = (size_t)l * s.num_experts + e;
      assert_true(t->req[2].prefill_counts[c] >= t->req[0].prefill_counts[c]);
      diff += (int64_t)t->req[2].prefill_counts[c] - t->req[0].prefill_counts[c];
    }
    assert_int_equal(diff, 200);
  }
  /* not the same draws as the first requests of a trace of the same generator */
  eldr_tracegen *g = NULL;
  assert_int_equal(eldr_tracegen_new(&s, "toy", "realistic", 7, &g, NULL), 0);
  eldr_trace *plain = NULL;
  assert_int_equal(eldr_tracegen_generate(g, 1, &plain, NULL), 0);
  eldr_tracegen_free(g);
  assert_int_equal(strcmp(plain->generator, t->generator) == 0, 0);
  eldr_trace_free(plain);
  eldr_block_table_free(&bt);
  eldr_trace_free(t);
}

/* SGLANG on the Mooncake pool: r0 knows nothing; r1 arrives before r0's
 * prefill ended, so the cache holds nothing yet; r2 arrives after it and
 * predicts from r0's three blocks, at confidence 1536 / 1636. With the
 * threshold above that, r2 is decided by load. */
static void test_sglang_prediction(void **st) {
  (void)st;
  eldr_shape s = {3, 16, 2};
  eldr_trace *t = NULL;
  eldr_block_table bt;
  build_mc(&t, &bt, &s);
  eldr_latency_model m;
  toy_model(&m, s.num_layers, s.num_experts, s.top_k);
  size_t *idx = iota(3);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 3, .blocks = &bt};
  for (int pass = 0; pass < 2; pass++) {
    eldr_sim_config c;
    eldr_sim_config_default(&c);
    c.n_prefill = 2; /* r0 and r1 prefill at once */
    c.n_decode = 2;
    c.rate = 0;
    c.pd = ELDR_SIM_PD_SGLANG;
    c.predict_threshold = pass ? 0.95 : 0.5;
    eldr_sim_log log[3];
    c.log = log;
    eldr_sim_result r;
    eldr_diag d = {{0}};
    assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), 0);
    assert_int_equal(r.completed, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(log[i].pool_index, (uint32_t)i);
    assert_double_equal(log[0].confidence, 0, 0);
    assert_double_equal(log[1].confidence, 0, 0);
    assert_double_equal(log[2].confidence, 1536.0 / 1636.0, 1e-12);
    assert_int_equal(log[2].predicted, !pass);
    assert_int_equal(r.predicted, pass ? 0 : 1);
    assert_double_equal(r.confidence_mean, 1536.0 / 1636.0 / 3, 1e-12);
  }
  /* VLLM on the same pool never predicts */
  eldr_sim_config c;
  eldr_sim_config_default(&c);
  c.rate = 0;
  eldr_sim_result r;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, NULL), 0);
  assert_int_equal(r.predicted, 0);
  assert_true(isnan(r.confidence_mean));
  /* a known fraction needs token rows: the pool is in counts form */
  c.known_fraction = 0.5;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "counts form"));
  /* a block table of another trace */
  c.known_fraction = -1;
  eldr_block_table bad = bt;
  bad.n_req = 2;
  pool.blocks = &bad;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), ELDR_ESHAPE);
  free(idx);
  eldr_block_table_free(&bt);
  eldr_trace_free(t);
}

/* Token-form requests in two domains (experts 0-7 / 8-15), ELDR on COUNT
 * signatures with one centroid per domain. known_fraction 1 at threshold 0
 * decides exactly as the true signature; known_fraction 0 never predicts
 * and every decision falls back. */
static void test_known_fraction(void **st) {
  (void)st;
  eldr_shape s = {2, 16, 2};
  eldr_latency_model m;
  toy_model(&m, s.num_layers, s.num_experts, s.top_k);
  eldr_trace *t = eldr_trace_new("toy", &s, NULL);
  eldr_rng rng;
  eldr_rng_seed(&rng, 3);
  const size_t N = 60;
  uint16_t pre[6 * 2 * 2], dec[20 * 2 * 2];
  for (size_t i = 0; i < N; i++) {
    uint32_t base = (i % 2) * 8;
    for (size_t x = 0; x < 6 * 2; x++) {
      uint32_t e = (uint32_t)eldr_rng_below(&rng, 7);
      pre[x * 2] = (uint16_t)(base + e);
      pre[x * 2 + 1] = (uint16_t)(base + e + 1);
    }
    for (size_t x = 0; x < 20 * 2; x++) {
      uint32_t e = (uint32_t)eldr_rng_below(&rng, 7);
      dec[x * 2] = (uint16_t)(base + e);
      dec[x * 2 + 1] = (uint16_t)(base + e + 1);
    }
    char id[16];
    snprintf(id, sizeof id, "r%zu", i);
    assert_true(eldr_trace_append(t, id, NULL, NULL, 0.05 * (double)i, pre, 6, dec, 20, NULL) >= 0);
  }
  eldr_sigspec spec = {s, ELDR_REPR_COUNT, NULL, NULL};
  const size_t dim = eldr_signature_dim(&spec);
  float *sigs = calloc(N * dim, sizeof *sigs), cents[2 * 32];
  uint32_t counts[32];
  for (size_t i = 0; i < N; i++) {
    eldr_trace_request_counts(t, &t->req[i], 0, counts);
    assert_int_equal(eldr_signature_build(&spec, counts, NULL, sigs + i * dim), 0);
  }
  memcpy(cents, sigs, 2 * dim * sizeof *sigs); /* r0 (domain 0), r1 (domain 1) */
  size_t *idx = iota(N);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = N, .sigs = sigs, .dim = dim, .centroids = cents,
                        .n_centroids = 2, .spec = &spec};
  eldr_sim_log base[60], part[60];
  eldr_sim_result rb, rp;
  eldr_sim_config c;
  eldr_sim_config_default(&c);
  c.n_prefill = 2;
  c.n_decode = 4;
  c.rate = 0;
  c.policy = ELDR_POLICY_ELDR;
  c.tau = 0;
  c.log = base;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rb, NULL), 0);
  c.known_fraction = 1;
  c.predict_threshold = 0;
  c.log = part;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rp, NULL), 0);
  assert_int_equal(rp.predicted, N);
  size_t dom_match = 0;
  for (size_t i = 0; i < N; i++) {
    assert_int_equal(part[i].decoder, base[i].decoder);
    assert_double_equal(part[i].confidence, 1, 0);
    dom_match += (size_t)(base[i].decoder % 2) == (size_t)(base[i].pool_index % 2);
  }
  assert_int_equal(dom_match, N); /* tau 0: each decoder serves its centroid's domain */
  assert_double_equal(rp.tpot_p50, rb.tpot_p50, 0);
  c.known_fraction = 0;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rp, NULL), 0);
  assert_int_equal(rp.predicted, 0);
  assert_int_equal(rp.fallbacks, N);
  /* half the prompt (3 of 6 tokens) is still usable at threshold 0.5 */
  c.known_fraction = 0.5;
  c.predict_threshold = 0.5;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rp, NULL), 0);
  assert_int_equal(rp.predicted, N);
  c.known_fraction = 1.5;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rp, &d), ELDR_EINVAL);
  c.known_fraction = -1;
  c.pd = (eldr_sim_pd)7;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rp, &d), ELDR_EINVAL);
  free(idx);
  free(sigs);
  eldr_trace_free(t);
}

static void test_pd_names(void **st) {
  (void)st;
  eldr_sim_pd pd;
  assert_int_equal(eldr_sim_pd_parse("sglang-exact", &pd), 0);
  assert_int_equal(pd, ELDR_SIM_PD_SGLANG_EXACT);
  assert_string_equal(eldr_sim_pd_name(ELDR_SIM_PD_SGLANG), "sglang");
  assert_int_equal(eldr_sim_pd_parse("sglang-fast", &pd), ELDR_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pd_timing),        cmocka_unit_test(test_mooncake_build),
      cmocka_unit_test(test_sglang_prediction), cmocka_unit_test(test_known_fraction),
      cmocka_unit_test(test_pd_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
