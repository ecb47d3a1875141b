/* test_latency.c — the step-latency model: presets, monotonicity, the
 * calibration ratio of the paper's Fig. 2, overrides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/latency.h"
#include "eldr/preset_files.h"

static void fill(uint32_t *u, size_t L, uint32_t v) {
  for (size_t l = 0; l < L; l++) u[l] = v;
}

static void test_presets_all(void **st) {
  (void)st;
  for (size_t i = 0; eldr_latency_model_name(i); i++)
    for (size_t j = 0; eldr_latency_hardware_name(j); j++) {
      eldr_latency_model m;
      eldr_diag d = {{0}};
      assert_int_equal(eldr_latency_preset(eldr_latency_model_name(i), eldr_latency_hardware_name(j), &m, &d), 0);
      assert_int_equal(eldr_latency_validate(&m, &d), 0);
      assert_true(m.expert_bytes > 0);
      assert_true(m.hbm_bw > 0);
    }
  eldr_latency_model m;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_latency_preset("qwen3-31b", "mi300x", &m, &d), ELDR_ENOTFOUND);
  assert_non_null(strstr(d.msg, "qwen3-31b"));
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "tpu", &m, &d), ELDR_ENOTFOUND);
  assert_non_null(strstr(d.msg, "tpu"));
}

/* Public-spec arithmetic: Qwen3-30B-A3B's routed experts are 3*2048*768 bf16
 * params; the whole model (48 layers x 128 experts + attention + head) ~ 61 GB. */
static void test_qwen_bytes(void **st) {
  (void)st;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  assert_int_equal(m.shape.num_layers, 48);
  assert_int_equal(m.shape.num_experts, 128);
  assert_int_equal(m.shape.top_k, 8);
  assert_true(m.expert_bytes == 3.0 * 2048 * 768 * 2);
  double total = 48 * (128 * m.expert_bytes + m.dense_bytes_per_layer) + m.other_layer_bytes;
  assert_true(total > 58e9 && total < 63e9);
  /* Llama-4-Maverick FP8: routed experts FP8 (386 GB), the rest bf16
   * (attention, shared expert, router, dense layers, head: ~28 GB) */
  assert_int_equal(eldr_latency_preset("llama4-maverick", "h200", &m, NULL), 0);
  assert_true(m.expert_bytes == 3.0 * 5120 * 8192 * 1);
  double attn = 2.0 * 5120 * 40 * 128 + 2.0 * 5120 * 8 * 128, shared = 3.0 * 5120 * 8192;
  assert_true(m.dense_bytes_per_layer == (attn + shared + 5120.0 * 128) * 2);
  total = 24 * (128 * m.expert_bytes + m.dense_bytes_per_layer) + m.other_layer_bytes;
  assert_true(total > 405e9 && total < 425e9);
  assert_true(m.gpus_per_worker == 8);
  assert_true(total < 4 * 141e9); /* fits four H200s (KV space aside) */
}

/* gpt-oss: half the layers attend a 128-token window; a long context costs
 * those layers no more KV reads than batch * 128 tokens. */
static void test_sliding_window(void **st) {
  (void)st;
  eldr_latency_model m, full;
  assert_int_equal(eldr_latency_preset("gpt-oss-120b", "mi300x", &m, NULL), 0);
  assert_true(m.sliding_window == 128 && m.sliding_layer_fraction == 0.5);
  full = m;
  full.sliding_layer_fraction = 0;
  uint32_t un[36];
  for (int l = 0; l < 36; l++) un[l] = 40;
  /* short contexts: nothing to cut */
  assert_true(eldr_latency_step(&m, 32, un, 32 * 100.0) == eldr_latency_step(&full, 32, un, 32 * 100.0));
  /* long contexts: 18 layers read 32 * 128 tokens instead of 32 * 8000 */
  double a = eldr_latency_step(&m, 32, un, 32 * 8000.0), b = eldr_latency_step(&full, 32, un, 32 * 8000.0);
  double saved = 18 * (32 * 8000.0 - 32 * 128.0) * m.kv_bytes_per_token / m.hbm_bw;
  assert_true(a < b);
  assert_true(fabs((b - a) - saved) < 0.05 * saved);
  /* the EP per-rank path saves the same KV reads (one latency model) */
  eldr_latency_model me, mfull;
  assert_int_equal(eldr_latency_preset_ep("gpt-oss-120b", "mi300x", 1, 4, &me, NULL), 0);
  assert_true(me.sliding_window == 128 && me.sliding_layer_fraction == 0.5);
  mfull = me;
  mfull.sliding_layer_fraction = 0;
  uint32_t rex[36 * 4], rtk[36 * 4];
  for (int i = 0; i < 36 * 4; i++) rex[i] = 10, rtk[i] = 32;
  double ea = eldr_latency_step_ep(&me, 32, rex, rtk, 4, 32 * 8000.0);
  double eb = eldr_latency_step_ep(&mfull, 32, rex, rtk, 4, 32 * 8000.0);
  assert_true(ea < eb);
  assert_true(fabs((eb - ea) - saved * m.hbm_bw / me.hbm_bw) < 0.05 * saved * m.hbm_bw / me.hbm_bw);
  full.sliding_layer_fraction = 1.5;
  assert_int_not_equal(eldr_latency_validate(&full, NULL), 0);
  /* Llama-4 FP8: only routed experts are FP8; attention/shared/router stay
   * bf16 in the aggregate and the EP presets alike */
  eldr_latency_model la, le;
  assert_int_equal(eldr_latency_preset("llama4-maverick", "h200", &la, NULL), 0);
  assert_int_equal(eldr_latency_preset_ep("llama4-maverick", "h200", 8, 8, &le, NULL), 0);
  assert_true(la.expert_bytes == 3.0 * 5120 * 8192);
  assert_true(la.dense_bytes_per_layer == le.dense_bytes_per_layer);
  assert_true(la.expert_bytes == le.expert_bytes);
  double attn = 2.0 * 5120 * 40 * 128 + 2.0 * 5120 * 8 * 128, shared = 3.0 * 5120 * 8192;
  assert_true(la.dense_bytes_per_layer == 2.0 * (attn + shared + 5120.0 * 128));
}

/* The paper's Fig. 2: Qwen3-30B-A3B on MI300X, one MoE layer at batch 64:
 * 128 active experts ~4.7x slower than 16; batch at fixed experts barely matters. */
static void test_calibration(void **st) {
  (void)st;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  double t16 = eldr_latency_moe_layer(&m, 64, 16, 0);
  double t128 = eldr_latency_moe_layer(&m, 64, 128, 0);
  double ratio = t128 / t16;
  assert_true(ratio > 4.4 && ratio < 5.0);
  double b8 = eldr_latency_moe_layer(&m, 8, 16, 0), b64 = eldr_latency_moe_layer(&m, 64, 16, 0);
  assert_true(b64 / b8 < 1.05);
  b8 = eldr_latency_moe_layer(&m, 8, 128, 0);
  b64 = eldr_latency_moe_layer(&m, 64, 128, 0);
  assert_true(b64 / b8 < 1.05);
  /* compute does take over eventually: a huge batch at few experts */
  double big = eldr_latency_moe_layer(&m, 1 << 16, 128, 0);
  assert_true(big > 2 * t128);
}

static void test_step_properties(void **st) {
  (void)st;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "h200", &m, NULL), 0);
  uint32_t u[48];
  double prev = 0;
  for (uint32_t e = 8; e <= 128; e += 8) { /* strictly increasing in the union */
    fill(u, 48, e);
    double t = eldr_latency_step(&m, 16, u, 16 * 500.0);
    assert_true(t > prev);
    prev = t;
  }
  fill(u, 48, 64);
  double a = eldr_latency_step(&m, 16, u, 1000), b = eldr_latency_step(&m, 16, u, 100000);
  assert_true(b > a); /* KV reads cost */
  /* floor: one token alone is at least the step overhead + weights of 8 experts/layer */
  fill(u, 48, 8);
  double floor = eldr_latency_step(&m, 1, u, 0);
  assert_true(floor > m.step_overhead_s + 48 * 8 * m.expert_bytes / m.hbm_bw);
  /* one layer raised changes the sum by that layer's delta only */
  fill(u, 48, 32);
  double base = eldr_latency_step(&m, 4, u, 0);
  u[7] = 33;
  double one = eldr_latency_step(&m, 4, u, 0);
  assert_true(one - base > 0.99 * m.expert_bytes / m.hbm_bw && one - base < 1.01 * m.expert_bytes / m.hbm_bw);
  /* expected union */
  assert_true(eldr_latency_expected_union(&m.shape, 1) > 7.99 && eldr_latency_expected_union(&m.shape, 1) < 8.01);
  assert_true(eldr_latency_expected_union(&m.shape, 1000) < 128.0001);
  /* one step model: EP size 1 is the aggregate step (and its float form) */
  eldr_latency_model me;
  assert_int_equal(eldr_latency_preset_ep("qwen3-30b-a3b", "h200", 1, 1, &me, NULL), 0);
  uint32_t tk[48];
  double uf[48];
  for (uint32_t l = 0; l < 48; l++) {
    u[l] = 20 + l % 7;
    uf[l] = u[l];
    tk[l] = 16 * 8;
  }
  double agg = eldr_latency_step(&me, 16, u, 8000);
  assert_true(eldr_latency_step_ep(&me, 16, u, tk, 1, 8000) == agg);
  assert_true(eldr_latency_step_f(&me, 16, uf, 8000) == agg);
}

static void test_prefill_transfer(void **st) {
  (void)st;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  double p1 = eldr_latency_prefill(&m, 1000), p2 = eldr_latency_prefill(&m, 8000);
  assert_true(p2 > 4 * p1); /* compute bound at long prompts */
  assert_true(p1 > 0.001 && p1 < 0.1);
  double k1 = eldr_latency_kv_transfer(&m, 1000), k2 = eldr_latency_kv_transfer(&m, 2000);
  assert_true(k2 > k1 && k1 > m.kv_transfer_latency_s);
  double per_tok = (k2 - k1) / 1000;
  assert_true(per_tok > 0.99 * m.kv_bytes_per_token_total / m.kv_transfer_bw);
}

static void test_overrides(void **st) {
  (void)st;
  eldr_latency_model m, m0;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "mi300x", &m, NULL), 0);
  m0 = m;
  eldr_diag d = {{0}};
  const char *ok = "{\"hbm_bw\": 1e12, \"step_overhead_s\": 0, \"hardware\": \"mygpu\", \"top_k\": 4}";
  assert_int_equal(eldr_latency_parse_overrides(ok, strlen(ok), &m, &d), 0);
  assert_true(m.hbm_bw == 1e12);
  assert_true(m.step_overhead_s == 0);
  assert_string_equal(m.hardware, "mygpu");
  assert_int_equal(m.shape.top_k, 4);
  m = m0;
  const char *bad[] = {"{\"hbm_bw\": -1}", "{\"nope\": 1}", "{\"hbm_bw\": \"x\"}", "[1]", "{",
                       "{\"hbm_bw\": 0}", "{\"top_k\": 1.5}", "{\"top_k\": 1000}",
                       "{\"kv_bytes_per_token_total\": 1e300}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memset(&d, 0, sizeof d);
    assert_true(eldr_latency_parse_overrides(bad[i], strlen(bad[i]), &m, &d) < 0);
    assert_true(d.msg[0] != 0);
    assert_memory_equal(&m, &m0, sizeof m); /* unchanged on error */
  }
  memset(&d, 0, sizeof d);
  assert_int_equal(eldr_latency_load_overrides("/nonexistent/x.json", &m, &d), ELDR_EIO);
  assert_non_null(strstr(d.msg, "/nonexistent/x.json"));
  /* the shipped example override file loads */
  assert_int_equal(eldr_latency_load_overrides(ELDR_SOURCE_DIR "/presets/mi300x-measured.json", &m, &d), 0);
}

/* docs/sim.md's step formula by hand (two kernels per MoE layer, each on
 * its roofline; ctx_other = ctx * kv_other / kv_bytes_per_token, the
 * non-MoE attention layers' context) against the code: Llama-4 (24 dense
 * attention layers) at a context long enough that the attention FLOPs
 * matter, at a memory-bound batch, at one where the experts' GEMM is
 * compute-bound, and with the FLOPs made dear; and a model without
 * expert FLOPs keeps the single roofline of the whole layer. */
static void test_doc_formula(void **st) {
  (void)st;
  for (int c = 0; c < 4; c++) {
    eldr_latency_model m;
    assert_int_equal(eldr_latency_preset("llama4-maverick", "h200", &m, NULL), 0);
    if (c == 2) m.peak_flops /= 200;
    if (c == 3) m.expert_flops_per_token = 0;
    const uint32_t L = m.shape.num_layers;
    double u[64];
    for (uint32_t l = 0; l < L; l++) u[l] = 3 + l % 5;
    const size_t batch = c == 1 ? 4096 : 48;
    const double ctx = (double)batch * 3000.0;
    const double ef = (double)batch * m.shape.top_k * m.expert_flops_per_token;
    double t = m.step_overhead_s;
    int compute_bound = 0;
    for (uint32_t l = 0; l < L; l++) {
      double flops = batch * m.flops_per_token_per_layer + ctx * m.attn_flops_per_ctx_token;
      if (c == 3) {
        double bytes = u[l] * m.expert_bytes + m.dense_bytes_per_layer + ctx * m.kv_bytes_per_token;
        t += fmax(bytes / m.hbm_bw, flops / m.peak_flops) + m.layer_overhead_s;
        continue;
      }
      double experts = fmax(u[l] * m.expert_bytes / m.hbm_bw, ef / m.peak_flops);
      double rest = fmax((m.dense_bytes_per_layer + ctx * m.kv_bytes_per_token) / m.hbm_bw,
                         (flops - ef) / m.peak_flops);
      compute_bound |= ef / m.peak_flops > u[l] * m.expert_bytes / m.hbm_bw;
      t += experts + rest + m.layer_overhead_s;
    }
    if (c == 1) assert_true(compute_bound); /* 4096 tokens on 3-7 experts */
    if (c == 0) assert_false(compute_bound);
    double kv_other = m.kv_bytes_per_token_total - L * m.kv_bytes_per_token;
    double ctx_other = ctx * kv_other / m.kv_bytes_per_token;
    assert_true(fabs(ctx_other - ctx * 24) < 1e-6 * ctx); /* Llama-4: 24 non-MoE attention layers */
    t += fmax((m.other_layer_bytes + ctx * kv_other) / m.hbm_bw,
              (batch * m.other_flops_per_token + ctx_other * m.attn_flops_per_ctx_token) / m.peak_flops) +
         m.n_dense_layers * m.layer_overhead_s;
    double code = eldr_latency_step_f(&m, batch, u, ctx);
    assert_true(fabs(code - t) < 1e-12 * t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets_all),     cmocka_unit_test(test_qwen_bytes),
      cmocka_unit_test(test_calibration),     cmocka_unit_test(test_step_properties),
      cmocka_unit_test(test_prefill_transfer), cmocka_unit_test(test_overrides),
      cmocka_unit_test(test_sliding_window),  cmocka_unit_test(test_doc_formula),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
