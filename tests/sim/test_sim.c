/* test_sim.c — the discrete-event simulator on tiny hand-made traces with
 * hand-checkable results, invariants on random traces, determinism, and the
 * policy wiring (decisions come from eldr_policy_decode). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/quantile.h"
#include "eldr/rng.h"
#include "eldr/sim.h"
#include "sim/sim_toy.h"

/* decode token t of request: at every layer l, expert (base + t*stride + l) % E */
static void add_req(eldr_trace *t, const char *id, const char *dom, double arrival, uint32_t n_dec,
                    uint32_t base, uint32_t stride) {
  uint32_t L = t->shape.num_layers, E = t->shape.num_experts, K = t->shape.top_k;
  uint16_t pre[64 * 8], dec[256 * 64];
  assert_true(L * K <= 64);
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t k = 0; k < K; k++) pre[l * K + k] = (uint16_t)((base + l + k) % E);
  for (uint32_t tok = 0; tok < n_dec; tok++)
    for (uint32_t l = 0; l < L; l++)
      for (uint32_t k = 0; k < K; k++)
        dec[(tok * L + l) * K + k] = (uint16_t)((base + tok * stride + l + k) % E);
  assert_true(eldr_trace_append(t, id, dom, NULL, arrival, pre, 1, dec, n_dec, NULL) >= 0);
}

static size_t *iota(size_t n) {
  size_t *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = i;
  return v;
}

static void base_cfg(eldr_sim_config *c, size_t P, size_t D) {
  eldr_sim_config_default(c);
  c->n_prefill = P;
  c->n_decode = D;
  c->rate = 0; /* trace timestamps */
}

/* One decoder, one request: TPOT equals the step latency (2 layers x 1
 * expert x 1 s + 0.5 s step overhead = 2.5 s); TTFT = prefill + KV + step. */
static void test_single_request(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 2, 8, 1);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  add_req(t, "a", NULL, 0.0, 5, 1, 0);
  size_t *idx = iota(1);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 1};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  eldr_sim_log log[1];
  c.log = log;
  eldr_sim_result r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), 0);
  double step = eldr_latency_step(&m, 1, (uint32_t[]){1, 1}, 1);
  assert_true(fabs(step - 2.5) < 1e-9);
  assert_int_equal(r.completed, 1);
  assert_true(fabs(r.tpot_p50 - step) < 1e-9);
  double pre = eldr_latency_prefill(&m, 1), kv = eldr_latency_kv_transfer(&m, 1);
  assert_true(fabs(r.ttft_p50 - (pre + kv + step)) < 1e-9);
  assert_true(fabs(log[0].finish - (pre + kv + 5 * step)) < 1e-9);
  assert_int_equal(log[0].tokens, 5);
  assert_int_equal(log[0].completions, 1);
  assert_true(fabs(r.mean_union - 1.0) < 1e-12);
  assert_true(fabs(r.mean_batch - 1.0) < 1e-12);
  free(idx);
  eldr_trace_free(t);
}

/* Two requests on one decoder: batched together with the same experts the
 * step is unchanged (union 1); with disjoint experts it costs 2 per layer;
 * far apart in time each runs alone. */
static void test_two_requests(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 2, 8, 1);
  struct {
    uint32_t base_b;
    double arrival_b;
    double want_tpot;
  } cases[] = {{1, 0.0, 2.5}, {4, 0.0, 4.5}, {4, 100.0, 2.5}};
  for (size_t ci = 0; ci < 3; ci++) {
    eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
    add_req(t, "a", NULL, 0.0, 4, 1, 0);
    add_req(t, "b", NULL, cases[ci].arrival_b, 4, cases[ci].base_b, 0);
    size_t *idx = iota(2);
    eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 2};
    eldr_sim_config c;
    base_cfg(&c, 2, 1);
    c.prefill_guard = 0;
    eldr_sim_result r;
    assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, NULL), 0);
    assert_int_equal(r.completed, 2);
    assert_true(fabs(r.tpot_p50 - cases[ci].want_tpot) < 1e-9);
    assert_true(fabs(r.tpot_p99 - cases[ci].want_tpot) < 1e-9);
    free(idx);
    eldr_trace_free(t);
  }
}

/* 64 experts top-8: the bitset path. Two requests whose 8 experts overlap
 * in 4 batch together: union 12 per layer -> 2 * 12 + 0.5 s per step; the
 * result is the same with each compact form prepared once for the pool. */
static void test_bitset_path(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 2, 64, 8);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  add_req(t, "a", NULL, 0.0, 4, 0, 0);
  add_req(t, "b", NULL, 0.0, 4, 4, 0);
  size_t *idx = iota(2);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 2};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  eldr_sim_result r1, r2;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r1, NULL), 0);
  /* add_req puts layer l's experts at base + l + k: layer 0 {0..7} u {4..11}, layer 1 {1..8} u {5..12} */
  assert_true(fabs(r1.tpot_p50 - 24.5) < 1e-9);
  assert_true(fabs(r1.mean_union - 12.0) < 1e-12);
  /* each compact form, built once and borrowed by the run: the same result */
  static const eldr_sim_tok_form forms[] = {ELDR_SIM_TOK_AUTO, ELDR_SIM_TOK_BITS, ELDR_SIM_TOK_IDS8};
  for (size_t f = 0; f < 3; f++) {
    eldr_sim_tokens *tk = NULL;
    assert_int_equal(eldr_sim_tokens_build(&pool, forms[f], &tk, NULL), 0);
    assert_non_null(tk);
    /* AUTO at 64 experts top-8: bitsets (as few bytes as the ids, cheaper to OR) */
    assert_int_equal(tk->form, f == 2 ? ELDR_SIM_TOK_IDS8 : ELDR_SIM_TOK_BITS);
    pool.tokens = tk;
    c.direct_union = 0;
    assert_int_equal(eldr_sim_run(&pool, &m, &c, &r2, NULL), 0);
    assert_memory_equal(&r1, &r2, sizeof r1);
    c.direct_union = 1; /* the pool's compact tokens ignored: the same result */
    assert_int_equal(eldr_sim_run(&pool, &m, &c, &r2, NULL), 0);
    assert_memory_equal(&r1, &r2, sizeof r1);
    pool.tokens = NULL;
    eldr_sim_tokens_free(tk);
  }
  free(idx);
  eldr_trace_free(t);
}

/* max_batch 1: the second request waits for the first to finish. */
static void test_waiting_queue(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 1, 4, 1);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  add_req(t, "a", NULL, 0.0, 3, 0, 0);
  add_req(t, "b", NULL, 0.0, 3, 0, 0);
  size_t *idx = iota(2);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 2};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  c.max_batch = 1;
  eldr_sim_log log[2];
  c.log = log;
  eldr_sim_result r;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, NULL), 0);
  double step = 1.5;
  assert_true(fabs(log[1].finish - log[0].finish - 3 * step) < 1e-9);
  assert_true(fabs(r.tpot_p50 - step) < 1e-9); /* waiting does not count in TPOT */
  assert_true(r.ttft_p99 > 3 * step);
  free(idx);
  eldr_trace_free(t);
}

/* 20 prompts arriving at the same instant at an idle prefill worker share
 * its first batch (the wake sorts after the instant's arrivals), and reach
 * the idle decoder together: one first decode step for all of them. Before
 * the fix only the first two shared it (each arrival scheduled the next one
 * after the worker's wake). */
static void test_tied_arrivals(void **st) {
  (void)st;
  enum { N = 20 };
  eldr_latency_model m;
  toy_model(&m, 1, 64, 1);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  for (int i = 0; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "r%d", i);
    add_req(t, id, NULL, 3.0, 4, (uint32_t)i, 0); /* all at t = 3: request i uses expert i */
  }
  size_t *idx = iota(N);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = N};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  eldr_sim_log log[N];
  c.log = log;
  eldr_sim_result r;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, NULL), 0);
  const double pre = eldr_latency_prefill(&m, N), kv = eldr_latency_kv_transfer(&m, 1);
  const double step = 0.5 + N; /* 20 distinct experts x 1 s + the step overhead */
  for (int i = 0; i < N; i++) {
    assert_true(fabs(log[i].prefill_done - pre) < 1e-9); /* one batch of 20 prompts */
    assert_true(fabs(log[i].first_token - (pre + kv + step)) < 1e-9); /* one first step */
    assert_true(fabs(log[i].finish - (pre + kv + 4 * step)) < 1e-9);
    assert_int_equal(log[i].completions, 1);
  }
  assert_int_equal(r.steps, 4);
  free(idx);
  eldr_trace_free(t);
}

/* The latencies users feel, by hand on the toy model: one decoder with
 * batch 1, request b waits for a's 3 steps. TTFT, TPOT (from the first
 * token), TPOT from the prefill's end (the wait counts), ITL (pooled
 * gaps), end-to-end. */
static void test_latency_metrics(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 1, 4, 1);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  add_req(t, "a", NULL, 0.0, 3, 0, 0);
  add_req(t, "b", NULL, 0.0, 3, 1, 0);
  size_t *idx = iota(2);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 2};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  c.max_batch = 1;
  eldr_sim_log log[2];
  c.log = log;
  eldr_sim_result r;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, NULL), 0);
  const double step = 1.5, pf = eldr_latency_prefill(&m, 2), kv = eldr_latency_kv_transfer(&m, 1);
  /* a: first token at pf + kv + 1.5, done 3 steps later; b waits 3 steps */
  assert_true(fabs(log[0].finish - (pf + kv + 3 * step)) < 1e-9);
  assert_true(fabs(log[1].finish - (pf + kv + 6 * step)) < 1e-9);
  assert_true(fabs(r.tpot_p50 - step) < 1e-9); /* both: (finish - first) / 2 */
  assert_true(fabs(r.tpot_p99 - step) < 1e-9);
  double pfa = (kv + 3 * step) / 3, pfb = (kv + 6 * step) / 3; /* from the prefill's end */
  assert_true(fabs(r.tpot_pf_p50 - (pfa + pfb) / 2) < 1e-9);
  assert_true(fabs(r.tpot_pf_p99 - (pfa + 0.99 * (pfb - pfa))) < 1e-9);
  assert_true(fabs(r.tpot_pf_mean - (pfa + pfb) / 2) < 1e-9);
  assert_true(fabs(r.itl_p50 - step) < 1e-9 && fabs(r.itl_p99 - step) < 1e-9);
  double ea = pf + kv + 3 * step, eb = pf + kv + 6 * step;
  assert_true(fabs(r.e2e_p50 - (ea + eb) / 2) < 1e-9);
  assert_true(fabs(r.e2e_mean - (ea + eb) / 2) < 1e-9);
  assert_true(fabs(r.ttft_mean - ((pf + kv + step) + (pf + kv + 4 * step)) / 2) < 1e-9);
  /* per request: every step had one member, union 1 */
  assert_true(fabs(log[1].mean_batch - 1) < 1e-12 && fabs(log[1].mean_union - 1) < 1e-12);
  assert_true(isnan(log[0].pred_union)); /* not a footprint run */
  free(idx);
  eldr_trace_free(t);
}

/* ITL pools the gaps of every request, each step counted once per member
 * past its first token: a batch of 2 whose steps differ in length. */
static void test_itl_weights(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 1, 8, 1);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  add_req(t, "a", NULL, 0.0, 5, 1, 0); /* expert 1 throughout */
  add_req(t, "b", NULL, 0.0, 2, 2, 0); /* expert 2: steps with both cost 2.5, alone 1.5 */
  size_t *idx = iota(2);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 2};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  c.prefill_guard = 0;
  eldr_sim_result r;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, NULL), 0);
  /* steps: 2.5 (both first tokens: no gap), 2.5 (gaps of a and b), then
   * three of 1.5 (a alone): gaps 2.5 2.5 1.5 1.5 1.5 -> sorted 1.5 x3, 2.5 x2 */
  assert_true(fabs(r.itl_p50 - 1.5) < 1e-9);
  assert_true(fabs(r.itl_p99 - 2.5) < 1e-9); /* position 0.99 * 4 = 3.96: between 2.5 and 2.5 */
  free(idx);
  eldr_trace_free(t);
}

/* A random trace of nreq requests in ndom domains; decode experts concentrate
 * on a domain's slice of the experts. */
static eldr_trace *random_trace(size_t nreq, uint32_t L, uint32_t E, uint32_t K, size_t ndom,
                                uint64_t seed) {
  eldr_shape s = {L, E, K};
  eldr_trace *t = eldr_trace_new("toy", &s, NULL);
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  uint16_t *pre = malloc((size_t)8 * L * K * sizeof *pre), *dec = malloc((size_t)64 * L * K * sizeof *dec);
  for (size_t i = 0; i < nreq; i++) {
    size_t dom = i % ndom;
    uint32_t np = 1 + (uint32_t)eldr_rng_below(&r, 8), nd = (uint32_t)eldr_rng_below(&r, 64);
    uint32_t slice = E / (uint32_t)ndom;
    /* K distinct experts per token and layer: a random start and stride 1 */
    for (uint32_t x = 0; x < np * L; x++) {
      uint32_t s0 = (uint32_t)eldr_rng_below(&r, slice);
      for (uint32_t k = 0; k < K; k++) pre[x * K + k] = (uint16_t)(dom * slice + (s0 + k) % slice);
    }
    for (uint32_t x = 0; x < nd * L; x++) {
      int in_dom = eldr_rng_below(&r, 4) != 0;
      uint32_t s0 = (uint32_t)eldr_rng_below(&r, in_dom ? slice : E);
      for (uint32_t k = 0; k < K; k++)
        dec[x * K + k] = (uint16_t)(in_dom ? dom * slice + (s0 + k) % slice : (s0 + k) % E);
    }
    char id[32], dn[32];
    snprintf(id, sizeof id, "r%zu", i);
    snprintf(dn, sizeof dn, "d%zu", dom);
    assert_true(eldr_trace_append(t, id, dn, NULL, (double)i * 0.01, pre, np, dec, nd, NULL) >= 0);
  }
  free(pre);
  free(dec);
  return t;
}

/* one-hot-ish signatures: the request's domain; centroids one per domain */
static void domain_sigs(const eldr_trace *t, size_t ndom, float *sigs, float *cents) {
  for (size_t i = 0; i < t->n; i++)
    for (size_t k = 0; k < ndom; k++) sigs[i * ndom + k] = (size_t)t->req[i].domain == k ? 1.0f : 0.0f;
  for (size_t k = 0; k < ndom; k++)
    for (size_t j = 0; j < ndom; j++) cents[k * ndom + j] = j == k ? 1.0f : 0.0f;
}

static void test_invariants(void **st) {
  (void)st;
  const size_t NR = 300, ND = 4;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h100", &m, NULL), 0);
  eldr_trace *t = random_trace(NR, m.shape.num_layers, m.shape.num_experts, m.shape.top_k, ND, 7);
  size_t *idx = iota(NR);
  float *sigs = calloc(NR * ND, sizeof *sigs), cents[16];
  domain_sigs(t, ND, sigs, cents);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = NR, .sigs = sigs, .dim = ND,
                        .centroids = cents, .n_centroids = ND};
  uint32_t u[64];
  for (uint32_t l = 0; l < m.shape.num_layers; l++) u[l] = m.shape.top_k;
  double floor = eldr_latency_step(&m, 1, u, 0);
  const size_t NREQ = 2000;
  eldr_sim_log *log = calloc(NREQ, sizeof *log);
  for (int pk = 0; pk < ELDR_POLICY__COUNT; pk++) {
    for (int perm = 0; perm < 2; perm++) {
      eldr_sim_config c;
      eldr_sim_config_default(&c);
      c.n_prefill = 2;
      c.n_decode = 8;
      c.rate = 200;
      c.n_requests = NREQ;
      c.policy = (eldr_policy_kind)pk;
      c.tau = pk == ELDR_POLICY_ELDR && perm ? 1.0 : 0.1;
      c.decorrelate = perm;
      c.log = log;
      eldr_sim_result r;
      eldr_diag d = {{0}};
      memset(log, 0, NREQ * sizeof *log);
      assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), 0);
      assert_int_equal(r.completed, NREQ);
      uint64_t toks = 0;
      for (size_t i = 0; i < NREQ; i++) {
        assert_int_equal(log[i].completions, 1); /* exactly once */
        const eldr_request *rq = &t->req[idx[log[i].pool_index]];
        assert_int_equal(log[i].tokens, rq->n_decode);
        toks += rq->n_decode;
        assert_true(log[i].decoder >= 0 && log[i].decoder < 8);
        assert_true(log[i].finish >= log[i].first_token && log[i].first_token >= log[i].prefill_done);
        assert_true(log[i].prefill_done > log[i].arrival);
        if (rq->n_decode >= 2) /* no TPOT below the model's floor */
          assert_true((log[i].finish - log[i].first_token) / (rq->n_decode - 1) >= floor * (1 - 1e-9));
        if (pk == ELDR_POLICY_DOMAIN) { /* never outside the domain's group */
          size_t dom = (size_t)rq->domain, lo = dom * 8 / ND, hi = (dom + 1) * 8 / ND;
          assert_true((size_t)log[i].decoder >= lo && (size_t)log[i].decoder < hi);
        }
        if (pk == ELDR_POLICY_ELDR && perm) /* tau = 1: a least-loaded decoder */
          assert_int_equal(log[i].chosen_load, log[i].min_load);
        if (pk == ELDR_POLICY_JSQ) assert_int_equal(log[i].chosen_load, log[i].min_load);
      }
      assert_int_equal(r.token_steps, toks);
      assert_true(r.tpot_min >= floor * (1 - 1e-9));
      assert_true(r.tpot_p99 >= r.tpot_p50);
    }
  }
  free(log);
  free(sigs);
  free(idx);
  eldr_trace_free(t);
}

/* ELDR with tau = 0 and one-hot signatures at light load sends every request
 * to its domain's decoder(s) (decoder i uses centroid i % n_centroids), and
 * gets a smaller expert union than round-robin; the permuted control does not. */
static void test_policy_wiring(void **st) {
  (void)st;
  const size_t NR = 200, ND = 4;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "h100", &m, NULL), 0);
  eldr_trace *t = random_trace(NR, m.shape.num_layers, m.shape.num_experts, m.shape.top_k, ND, 11);
  size_t *idx = iota(NR);
  float *sigs = calloc(NR * ND, sizeof *sigs), cents[16];
  domain_sigs(t, ND, sigs, cents);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = NR, .sigs = sigs, .dim = ND,
                        .centroids = cents, .n_centroids = ND};
  eldr_sim_log *log = calloc(1000, sizeof *log);
  eldr_sim_config c;
  eldr_sim_config_default(&c);
  c.n_prefill = 2;
  c.n_decode = 8;
  c.rate = 1500;
  c.n_requests = 1000;
  c.policy = ELDR_POLICY_ELDR;
  c.tau = 0;
  c.log = log;
  eldr_sim_result re, rr, rp;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &re, NULL), 0);
  for (size_t i = 0; i < 1000; i++) {
    assert_int_equal(log[i].fallback, 0);
    assert_int_equal((size_t)log[i].decoder % ND, (size_t)t->req[log[i].pool_index].domain);
  }
  c.permute_signatures = 1;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rp, NULL), 0);
  size_t mismatch = 0;
  for (size_t i = 0; i < 1000; i++)
    mismatch += (size_t)log[i].decoder % ND != (size_t)t->req[log[i].pool_index].domain;
  assert_true(mismatch > 500);
  c.permute_signatures = 0;
  c.policy = ELDR_POLICY_RR;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &rr, NULL), 0);
  assert_true(re.mean_union < rr.mean_union);
  assert_true(rp.mean_union > re.mean_union);
  /* RR: decoders in order of decision */
  /* ELDR without centroids falls back (counted) */
  pool.centroids = NULL;
  c.policy = ELDR_POLICY_ELDR;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &re, NULL), 0);
  assert_int_equal(re.fallbacks, 1000);
  free(log);
  free(sigs);
  free(idx);
  eldr_trace_free(t);
}

static void test_determinism_and_replay(void **st) {
  (void)st;
  const size_t NR = 50;
  eldr_latency_model m;
  assert_int_equal(eldr_latency_preset("olmoe-1b-7b", "mi300x", &m, NULL), 0);
  eldr_trace *t = random_trace(NR, m.shape.num_layers, m.shape.num_experts, m.shape.top_k, 2, 3);
  size_t *idx = iota(NR);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = NR};
  eldr_sim_config c;
  eldr_sim_config_default(&c);
  c.n_prefill = 2;
  c.n_decode = 4;
  c.rate = 300;
  c.n_requests = 1500;
  c.policy = ELDR_POLICY_P2C;
  eldr_sim_result a, b, x;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &a, NULL), 0);
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &b, NULL), 0);
  assert_memory_equal(&a, &b, sizeof a);
  c.seed = 2;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &x, NULL), 0);
  assert_true(x.tpot_p50 != a.tpot_p50 || x.makespan_s != a.makespan_s);
  /* a pool of 50 replayed 1500 times at high load: copies are in flight together */
  assert_int_equal(a.pool_size, NR);
  assert_true(a.copies_in_flight > 0.2);
  assert_true(a.batch_dup_frac > 0.01);
  c.seed = 1;
  c.decorrelate = 1;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &x, NULL), 0);
  assert_int_equal(x.completed, 1500);
  assert_true(x.mean_union != a.mean_union);
  free(idx);
  eldr_trace_free(t);
}

static void test_errors(void **st) {
  (void)st;
  eldr_latency_model m;
  toy_model(&m, 2, 8, 1);
  eldr_trace *t = eldr_trace_new("toy", &m.shape, NULL);
  add_req(t, "a", NULL, -1.0, 3, 0, 0); /* no arrival */
  size_t *idx = iota(1);
  eldr_sim_pool pool = {.trace = t, .idx = idx, .n = 1};
  eldr_sim_config c;
  base_cfg(&c, 1, 1);
  eldr_sim_result r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "arrival"));
  c.rate = 5;
  c.n_decode = 0;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), ELDR_EINVAL);
  c.n_decode = 1;
  c.max_batch = 0;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), ELDR_EINVAL);
  c.max_batch = 4;
  eldr_latency_model m2;
  toy_model(&m2, 3, 8, 1);
  assert_int_equal(eldr_sim_run(&pool, &m2, &c, &r, &d), ELDR_ESHAPE);
  assert_non_null(strstr(d.msg, "shape"));
  pool.n = 0;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), ELDR_EINVAL);
  pool.n = 1;
  c.n_requests = 10;
  assert_int_equal(eldr_sim_run(&pool, &m, &c, &r, &d), 0);
  assert_int_equal(r.completed, 10);
  assert_true(eldr_sim_capacity(&pool, &m, &c) > 0);
  double v[] = {3, 1, 2, 4};
  assert_true(fabs(eldr_quantile(v, 4, 0.5) - 2.5) < 1e-12);
  free(idx);
  eldr_trace_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_single_request),  cmocka_unit_test(test_two_requests),
      cmocka_unit_test(test_waiting_queue),   cmocka_unit_test(test_bitset_path),
      cmocka_unit_test(test_invariants),
      cmocka_unit_test(test_policy_wiring),   cmocka_unit_test(test_determinism_and_replay),
      cmocka_unit_test(test_errors),          cmocka_unit_test(test_tied_arrivals),
      cmocka_unit_test(test_latency_metrics), cmocka_unit_test(test_itl_weights),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
