/* test_placement.c — EP placements: every expert placed (per its copies),
 * equal slots per rank, the greedy's rank loads on hand-made cases,
 * determinism, activation per cluster, the EP tally and the EP latency
 * model, and the SGLang JSON shape. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/latency.h"
#include "eldr/placement.h"
#include "eldr/placement_io.h"
#include "eldr/rng.h"

/* Every logical expert has ncopies slots, slots per rank equal, copies of one
 * expert on distinct ranks (when P <= E * R). */
static void check_valid(const eldr_placement *p) {
  const uint32_t L = p->num_layers, E = p->num_experts, P = p->num_physical, R = p->ep_size;
  const uint32_t per = P / R;
  assert_int_equal(per * R, P);
  for (uint32_t l = 0; l < L; l++) {
    uint32_t *cnt = calloc(E, sizeof *cnt);
    uint8_t *seen = calloc((size_t)R * E, 1);
    for (uint32_t s = 0; s < P; s++) {
      uint16_t e = p->phys[(size_t)l * P + s];
      assert_true(e < E);
      cnt[e]++;
      assert_false(seen[(s / per) * E + e]); /* no expert twice on one rank */
      seen[(s / per) * E + e] = 1;
    }
    uint32_t total = 0;
    for (uint32_t e = 0; e < E; e++) {
      assert_true(cnt[e] >= 1);
      assert_int_equal(cnt[e], p->ncopies[(size_t)l * E + e]);
      total += cnt[e];
    }
    assert_int_equal(total, P);
    free(cnt);
    free(seen);
  }
}

static void test_linear(void **st) {
  (void)st;
  eldr_placement *p = NULL;
  assert_int_equal(eldr_placement_linear(3, 128, 4, 0, &p, NULL), 0);
  check_valid(p);
  for (uint32_t s = 0; s < 128; s++) assert_int_equal(p->phys[128 + s], s); /* contiguous */
  assert_int_equal(eldr_placement_per_rank(p), 32);
  eldr_placement_free(p);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_placement_linear(3, 128, 3, 0, &p, &d), ELDR_ERANGE);
  assert_null(p);
  assert_non_null(strstr(d.msg, "multiple of the EP size 3"));
  assert_int_equal(eldr_placement_linear(3, 128, 0, 0, &p, &d), ELDR_ERANGE);
}

/* Hand-made: 8 experts with activations 8..1 on 2 ranks. Greedy: 8->r0,
 * 7->r1, 6->r1, 5->r0 (tie: lower rank), 4->r0, 3->r1, 2->r1, 1->r0: loads
 * 18/18 (share 0.5); linear puts 8+7+6+5 = 26 of 36 on rank 0. */
static void test_greedy_hand_made(void **st) {
  (void)st;
  const double act[8] = {8, 7, 6, 5, 4, 3, 2, 1};
  eldr_placement *g = NULL, *lin = NULL;
  assert_int_equal(eldr_placement_greedy(act, 1, 8, 2, 0, &g, NULL), 0);
  assert_int_equal(eldr_placement_linear(1, 8, 2, 0, &lin, NULL), 0);
  check_valid(g);
  double loads[2];
  eldr_placement_rank_loads(g, act, 0, loads);
  assert_true(loads[0] == 18 && loads[1] == 18);
  const uint16_t want[8] = {0, 3, 4, 7, 1, 2, 5, 6}; /* slots sorted by id within a rank */
  assert_memory_equal(g->phys, want, sizeof want);
  assert_true(fabs(eldr_placement_busiest_share(g, act) - 0.5) < 1e-12);
  assert_true(fabs(eldr_placement_busiest_share(lin, act) - 26.0 / 36) < 1e-12);
  eldr_placement_free(g);
  eldr_placement_free(lin);

  /* one dominant expert cannot be split without copies: {10,1,1,1} on 2 ranks
   * -> rank 0 holds 10 + 1 (share 11/13) */
  const double hot[4] = {10, 1, 1, 1};
  assert_int_equal(eldr_placement_greedy(hot, 1, 4, 2, 0, &g, NULL), 0);
  check_valid(g);
  assert_true(fabs(eldr_placement_busiest_share(g, hot) - 11.0 / 13) < 1e-12);
  eldr_placement_free(g);
  /* with 2 redundant slots the hot expert gets a copy on each rank (the
   * third copy would have no rank left) and expert 1 gets the other: loads
   * 5 + 1 + 0.5 on each rank */
  assert_int_equal(eldr_placement_greedy(hot, 1, 4, 2, 2, &g, NULL), 0);
  check_valid(g);
  assert_int_equal(g->num_physical, 6);
  assert_int_equal(g->ncopies[0], 2);
  assert_int_equal(g->ncopies[1], 2);
  eldr_placement_rank_loads(g, hot, 0, loads);
  assert_true(loads[0] == 6.5 && loads[1] == 6.5);
  eldr_placement_free(g);
}

static void test_greedy_random_valid_deterministic(void **st) {
  (void)st;
  const uint32_t L = 5, E = 64, R = 4;
  double *act = malloc((size_t)L * E * sizeof *act);
  eldr_rng r;
  eldr_rng_seed(&r, 7);
  for (size_t i = 0; i < (size_t)L * E; i++) act[i] = floor(eldr_rng_uniform(&r) * 100); /* ties */
  for (uint32_t N = 0; N <= 8; N += 4) {
    eldr_placement *a = NULL, *b = NULL, *lin = NULL;
    assert_int_equal(eldr_placement_greedy(act, L, E, R, N, &a, NULL), 0);
    assert_int_equal(eldr_placement_greedy(act, L, E, R, N, &b, NULL), 0);
    assert_int_equal(eldr_placement_linear(L, E, R, N, &lin, NULL), 0);
    check_valid(a);
    check_valid(lin);
    assert_memory_equal(a->phys, b->phys, (size_t)L * a->num_physical * sizeof *a->phys);
    double sg = eldr_placement_busiest_share(a, act), sl = eldr_placement_busiest_share(lin, act);
    assert_true(sg >= 1.0 / R - 1e-12);
    assert_true(sg <= sl + 1e-12);
    assert_true(sg < 0.26); /* near-even for 64 experts over 4 ranks */
    eldr_placement_free(a);
    eldr_placement_free(b);
    eldr_placement_free(lin);
  }
  act[3] = NAN;
  eldr_placement *p = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_placement_greedy(act, L, E, R, 0, &p, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "layer 0 expert 3"));
  free(act);
}

/* Two clusters of requests with disjoint hot experts: each cluster's
 * activation holds only its own requests, the global block both. */
static void test_activation(void **st) {
  (void)st;
  const eldr_shape s = {2, 8, 2};
  eldr_trace *t = eldr_trace_new("m", &s, NULL);
  uint16_t pre[2 * 2 * 2], dec[2 * 2];
  for (int i = 0; i < 6; i++) {
    uint16_t base = i % 2 ? 4 : 0;
    for (int q = 0; q < 8; q++) pre[q] = (uint16_t)(base + q % 2);
    for (int q = 0; q < 4; q++) dec[q] = (uint16_t)(base + 2 + q % 2);
    char id[8];
    snprintf(id, sizeof id, "r%d", i);
    assert_true(eldr_trace_append(t, id, NULL, NULL, -1, pre, 2, dec, i == 5 ? 0 : 1, NULL) >= 0);
  }
  eldr_artifact *a = eldr_artifact_new("m", &s, NULL, ELDR_REPR_BINARY, 0, NULL, 2);
  assert_non_null(a);
  memset(a->centroids, 0, a->k * a->dim * sizeof *a->centroids);
  /* centroid 0 on experts 0,1 of both layers; centroid 1 on experts 4,5 */
  for (int l = 0; l < 2; l++)
    for (int e = 0; e < 2; e++) {
      a->centroids[l * 8 + e] = 0.5f;
      a->centroids[a->dim + l * 8 + 4 + e] = 0.5f;
    }
  size_t idx[6] = {0, 1, 2, 3, 4, 5};
  double *act = calloc(3 * 16, sizeof *act);
  assert_int_equal(eldr_placement_activation(t, idx, 6, a, act, NULL), 0);
  /* cluster 0 (requests 0, 2, 4): decode experts 2, 3 once per layer each */
  assert_true(act[0 * 16 + 2] == 3 && act[0 * 16 + 3] == 3 && act[0 * 16 + 6] == 0);
  /* cluster 1 (1, 3 decode; 5 has no decode: its prefill experts 4, 5 twice) */
  assert_true(act[1 * 16 + 6] == 2 && act[1 * 16 + 7] == 2);
  assert_true(act[1 * 16 + 4] == 2 && act[1 * 16 + 5] == 2);
  for (int q = 0; q < 16; q++) assert_true(act[2 * 16 + q] == act[q] + act[16 + q]);
  free(act);
  eldr_artifact_free(a);
  eldr_trace_free(t);
}

/* The tally on a linear placement of 8 experts over 2 ranks (one layer,
 * top-2): member 0 picks {0,1} (rank 0), member 1 {1,5}: rank 0 sees 2
 * distinct experts and 3 tokens, rank 1 one expert and 1 token. */
static void test_tally_and_latency(void **st) {
  (void)st;
  eldr_placement *p = NULL;
  assert_int_equal(eldr_placement_linear(1, 8, 2, 0, &p, NULL), 0);
  eldr_ep_tally t;
  assert_int_equal(eldr_ep_tally_init(&t, 1, 2, 2, 8, NULL), 0);
  eldr_ep_tally_begin(&t);
  const uint16_t s0[2] = {0, 1}, s1[2] = {1, 5};
  eldr_ep_tally_add(&t, p, s0, 0);
  eldr_ep_tally_add(&t, p, s1, 1);
  eldr_ep_tally_end(&t);
  assert_int_equal(t.rank_experts[0], 2);
  assert_int_equal(t.rank_experts[1], 1);
  assert_int_equal(t.rank_tokens[0], 3);
  assert_int_equal(t.rank_tokens[1], 1);
  assert_true(t.busiest_tokens == 3 && t.all_tokens == 4);
  eldr_ep_tally_begin(&t); /* counters restart */
  eldr_ep_tally_add(&t, p, s0, 0);
  assert_int_equal(t.rank_experts[0], 2);
  assert_int_equal(t.rank_tokens[1], 0);
  eldr_ep_tally_free(&t);
  eldr_placement_free(p);

  /* EP latency: the slowest rank sets the pace; a2a is zero on one rank */
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset_ep("qwen3-235b-a22b", "h200", 4, 4, &m, NULL), 0);
  assert_int_equal(eldr_latency_validate(&m, NULL), 0);
  assert_true(m.gpus_per_worker == 4 && m.ep == 4 && m.tp == 4);
  uint32_t even_x[4] = {8, 8, 8, 8}, even_t[4] = {16, 16, 16, 16};
  uint32_t skew_x[4] = {20, 4, 4, 4}, skew_t[4] = {40, 8, 8, 8};
  double te = eldr_latency_moe_layer_ep(&m, 8, even_x, even_t, 4, 0);
  double ts = eldr_latency_moe_layer_ep(&m, 8, skew_x, skew_t, 4, 0);
  assert_true(ts > te);
  /* the difference is exactly the slowest rank's extra 12 experts and 24 tokens */
  double want = 12 * m.expert_bytes / m.rank_hbm_bw + 24 * m.expert_flops_per_token / m.rank_flops;
  assert_true(fabs((ts - te) - want) < 1e-12);
  assert_true(eldr_latency_a2a(&m, 64, 1) == 0);
  assert_true(eldr_latency_a2a(&m, 64, 4) > 2 * m.a2a_latency_s);
  assert_true(eldr_latency_a2a(&m, 128, 4) > eldr_latency_a2a(&m, 64, 4));
  eldr_diag d = {{0}};
  assert_int_equal(eldr_latency_preset_ep("qwen3-235b-a22b", "h200", 4, 3, &m, &d), ELDR_ERANGE);
  assert_int_equal(eldr_latency_preset_ep("deepseek-v3", "h200", 8, 8, &m, NULL), 0);
  assert_int_equal(m.shape.num_experts, 256);
  assert_int_equal(m.shape.num_layers, 58);
  /* DeepSeek-V3 is ~671 B parameters, FP8: ~0.67-0.70 TB of weights */
  double total = 58 * (256 * m.expert_bytes + m.dense_bytes_per_layer) + m.other_layer_bytes;
  assert_true(total > 640e9 && total < 700e9);
}

/* The file SGLang loads: one key, rows = model layers, P ids per row; the
 * MoE rows carry the placement, the others the trivial map; round trip. */
static void test_sglang_json(void **st) {
  (void)st;
  const double act[2 * 8] = {8, 7, 6, 5, 4, 3, 2, 1, 1, 2, 3, 4, 5, 6, 7, 8};
  eldr_placement *p = NULL, *q = NULL;
  assert_int_equal(eldr_placement_greedy(act, 2, 8, 2, 2, &p, NULL), 0);
  const uint32_t ids[2] = {3, 4};
  char *s = eldr_placement_dump(p, ids, 5);
  assert_non_null(s);
  json_error_t err;
  json_t *root = json_loads(s, 0, &err);
  assert_non_null(root);
  assert_int_equal(json_object_size(root), 1);
  json_t *map = json_object_get(root, "physical_to_logical_map");
  assert_true(json_is_array(map));
  assert_int_equal(json_array_size(map), 5);
  for (size_t r = 0; r < 5; r++) {
    json_t *row = json_array_get(map, r);
    assert_int_equal(json_array_size(row), 10);
    for (size_t c = 0; c < 10; c++) {
      json_int_t v = json_integer_value(json_array_get(row, c));
      if (r < 3) assert_int_equal(v, (json_int_t)(c % 8));
      else assert_int_equal(v, p->phys[(r - 3) * 10 + c]);
    }
  }
  json_decref(root);
  assert_int_equal(eldr_placement_parse(s, strlen(s), 8, 2, ids, 2, &q, NULL), 0);
  assert_memory_equal(p->phys, q->phys, 20 * sizeof *p->phys);
  eldr_placement_free(q);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_placement_parse(s, strlen(s), 8, 4, ids, 2, &q, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "multiple of the EP size 4"));
  const uint32_t far[2] = {3, 9};
  assert_int_equal(eldr_placement_parse(s, strlen(s), 8, 2, far, 2, &q, &d), ELDR_ESHAPE);
  assert_non_null(strstr(d.msg, "layer 9"));
  /* file round trip */
  char path[] = "/tmp/eldr-placement-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(eldr_placement_save(path, p, ids, 5, NULL), 0);
  assert_int_equal(eldr_placement_load(path, 8, 2, ids, 2, &q, NULL), 0);
  assert_memory_equal(p->phys, q->phys, 20 * sizeof *p->phys);
  eldr_placement_free(q);
  unlink(path);
  assert_int_equal(eldr_placement_load(path, 8, 2, ids, 2, &q, &d), ELDR_EIO);
  free(s);
  eldr_placement_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_greedy_hand_made),
      cmocka_unit_test(test_greedy_random_valid_deterministic),
      cmocka_unit_test(test_activation),
      cmocka_unit_test(test_tally_and_latency),
      cmocka_unit_test(test_sglang_json),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
