/* test_worker.c — the emulated engine: KV prefix cache + co-indexed
 * signature cache, the HTTP API over real sockets (in-process worker threads),
 * the PD legs, the step-time model, client disconnects. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "eldr/latency.h"
#include "eldr/loadgen.h"
#include "eldr/routed_experts.h"
#include "eldr/sigcache.h"
#include "eldr/signature.h"
#include "eldr/preset_files.h"
#include "eldr/tracegen.h"
#include "worker/kvcache.h"
#include "worker/wtest.h"

/* ------------------------------------------------------------ KV cache */

static void test_kvcache_prefix_and_eviction(void **state) {
  (void)state;
  eldr_shape sh = {2, 4, 1};
  eldr__kv *kv = eldr__kv_new(6, &sh);
  assert_non_null(kv);
  eldr_sigcache *sc = eldr__kv_sigcache(kv);
  uint64_t A[3] = {101, 102, 103}, B[4] = {201, 202, 203, 204};
  uint32_t rows[3 * 8];
  for (int i = 0; i < 3 * 8; i++) rows[i] = (uint32_t)(i % 5);
  int32_t ids[6];
  assert_int_equal(eldr__kv_match(kv, A, 3), 0);
  assert_int_equal(eldr__kv_alloc(kv, A, 0, 3, ids), 0);
  assert_int_equal(eldr__kv_used(kv), 3);
  eldr__kv_register(kv, ids, A, 0, 3, rows, 8);
  eldr__kv_release(kv, ids, 3);
  assert_int_equal(eldr__kv_used(kv), 0);
  assert_int_equal(eldr__kv_match(kv, A, 3), 3);
  uint32_t counts[8] = {0};
  assert_int_equal(eldr_sigcache_add(sc, 102, counts), 0);
  for (int i = 0; i < 8; i++) assert_int_equal(counts[i], rows[8 + i]);
  /* 4 new blocks: 3 never-used + 1 evicted; the tail of A (103) goes first */
  int32_t idb[4];
  assert_int_equal(eldr__kv_alloc(kv, B, 0, 4, idb), 0);
  assert_int_equal(eldr__kv_evictions(kv), 1);
  assert_int_equal(eldr__kv_match(kv, A, 3), 2);
  assert_int_equal(eldr_sigcache_add(sc, 103, counts), ELDR_ENOTFOUND);
  assert_int_equal(eldr_sigcache_add(sc, 101, counts), 0);
  /* B was never registered: its blocks go back to the free list */
  eldr__kv_release(kv, idb, 4);
  assert_int_equal(eldr__kv_match(kv, B, 4), 0);
  /* A's cached prefix is reused: 2 hits, 1 new block */
  int32_t ida[3];
  assert_int_equal(eldr__kv_alloc(kv, A, 2, 3, ida), 0);
  assert_int_equal(ida[0], ids[0]);
  assert_int_equal(ida[1], ids[1]);
  assert_int_equal(eldr__kv_used(kv), 3);
  /* 4 more do not fit (3 free, the cached ones are in use): nothing changes */
  int32_t idc[4];
  uint64_t C[4] = {301, 302, 303, 304};
  assert_int_equal(eldr__kv_alloc(kv, C, 0, 4, idc), ELDR_EUNAVAIL);
  assert_int_equal(eldr__kv_used(kv), 3);
  assert_int_equal(eldr__kv_free_blocks(kv), 3);
  eldr__kv_register(kv, ida, A, 2, 3, rows + 16, 8);
  eldr__kv_release(kv, ida, 3);
  assert_int_equal(eldr__kv_used(kv), 0);
  assert_int_equal(eldr__kv_match(kv, A, 3), 3);
  assert_int_equal(eldr_sigcache_add(sc, 103, counts), 0);
  /* many allocations cycle every block; the table stays consistent */
  for (uint64_t h = 1000; h < 1200; h++) {
    int32_t one;
    assert_int_equal(eldr__kv_alloc(kv, &h, 0, 1, &one), 0);
    eldr__kv_register(kv, &one, &h, 0, 1, rows, 8);
    eldr__kv_release(kv, &one, 1);
    assert_int_equal(eldr__kv_match(kv, &h, 1), 1);
  }
  eldr_sigcache_stats st;
  eldr_sigcache_stats_get(sc, &st);
  assert_int_equal(st.rows, 6); /* co-indexed: exactly the blocks the KV cache holds */
  assert_int_equal(eldr__kv_match(kv, A, 3), 0);
  eldr__kv_free(kv);
}

/* ------------------------------------------------------------ HTTP helpers */

static json_t *post_json(int port, const char *path, json_t *body, int *status) {
  char *s = json_dumps(body, JSON_COMPACT);
  wt_resp r;
  int rc = wt_http(port, "POST", path, s, 10.0, &r);
  free(s);
  *status = r.status;
  json_t *j = rc == 0 ? json_loads(r.body, 0, NULL) : NULL;
  wt_resp_free(&r);
  return j;
}

static char *words(const char *tag, int n) {
  char *s = malloc((size_t)n * 8 + 1);
  size_t off = 0;
  for (int i = 0; i < n; i++) off += (size_t)sprintf(s + off, "%s%s%d", i ? " " : "", tag, i % 97);
  return s;
}

static void expect_error(int port, const char *path, const char *body, int want, const char *needle) {
  wt_resp r;
  assert_int_equal(wt_http(port, "POST", path, body, 5.0, &r), 0);
  if (r.status != want) fail_msg("%s %s: status %d, want %d: %s", path, body, r.status, want, r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  json_t *m = json_object_get(json_object_get(j, "error"), "message");
  assert_true(json_is_string(m));
  if (needle && !strstr(json_string_value(m), needle))
    fail_msg("error message '%s' lacks '%s'", json_string_value(m), needle);
  json_decref(j);
  wt_resp_free(&r);
}

/* ------------------------------------------------- signature exactness */

/* The router's view: counts = cached blocks' rows from its own signature
 * cache + counts of the routed_experts the prefill returned (computed tokens
 * only); then it stores the rows of the blocks those tokens cover. */
static void router_counts(eldr_sigcache *rsc, const eldr_shape *sh, const char *prompt,
                          json_t *reply, uint32_t *counts, size_t *cached_out) {
  size_t cap = strlen(prompt) + 16;
  uint32_t *ids = malloc(cap * sizeof *ids);
  size_t n = eldr_tokenize(prompt, strlen(prompt), ids, cap);
  uint64_t *h = malloc((n / 16 + 1) * sizeof *h);
  size_t nb = eldr_block_hashes(ids, n, 0, h);
  json_t *det = json_object_get(json_object_get(reply, "usage"), "prompt_tokens_details");
  size_t cached = (size_t)json_integer_value(json_object_get(det, "cached_tokens"));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(reply, "usage"), "prompt_tokens")), n);
  assert_int_equal(cached % 16, 0);
  memset(counts, 0, eldr_shape_cells(sh) * sizeof *counts);
  assert_int_equal(eldr_sigcache_add_blocks(rsc, h, cached / 16, counts), 0);
  json_t *re = json_object_get(json_array_get(json_object_get(reply, "choices"), 0), "routed_experts");
  assert_true(json_is_string(re));
  uint16_t *sel = NULL;
  size_t rows = 0;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_routed_experts_decode(json_string_value(re), json_string_length(re), sh, &sel,
                                              &rows, NULL, &d),
                   0);
  assert_int_equal(rows, n - cached); /* vLLM: only the computed tokens */
  assert_int_equal(eldr_counts_accumulate(sh, sel, ELDR_SEL_U16, rows, counts, NULL), 0);
  uint32_t *scratch = calloc(eldr_shape_cells(sh), sizeof *scratch);
  assert_int_equal(eldr_sigcache_store_blocks(rsc, h, nb, cached, sel, ELDR_SEL_U16, rows, scratch, NULL), 0);
  free(scratch);
  free(sel);
  free(h);
  free(ids);
  *cached_out = cached;
}

static void test_signature_exact_under_prefix_hits(void **state) {
  (void)state;
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.role = ELDR_WORKER_PREFILL;
  cfg.kv_blocks = 10; /* tiny: forces evictions and block reuse */
  cfg.kv_abort_timeout = 0.001; /* nobody pulls: free the held blocks at once */
  cfg.routed_experts_computed_only = 1; /* vLLM before PR #39917 */
  cfg.enable_prompt_tokens_details = 1;
  cfg.time_scale = 0.01;
  wt_worker ww;
  eldr_diag d = {{0}};
  if (wt_worker_start(&ww, &cfg, &d) < 0) fail_msg("worker: %s", d.msg);
  eldr_shape sh;
  assert_int_equal(eldr_tracegen_model_shape(cfg.model, &sh, NULL, 0, NULL), 0);
  const size_t LE = eldr_shape_cells(&sh);
  eldr_sigcache *rsc = eldr_sigcache_new(&sh, 1000);
  /* P: exactly 3 blocks of one-token words (code-like, so its domain is stable) */
  char *P = words("x", 48), *sa = words("a", 12), *sb = words("b", 22), *sc = words("c", 100),
       *sd = words("d", 40), *se = words("e", 17);
  char prompts[5][2048];
  snprintf(prompts[0], sizeof prompts[0], "%s %s", P, sa); /* 60 tokens */
  snprintf(prompts[1], sizeof prompts[1], "%s %s", P, sb); /* 70: full hit on P */
  snprintf(prompts[2], sizeof prompts[2], "%s", sc);       /* 100: evicts B's tail */
  snprintf(prompts[3], sizeof prompts[3], "%s", sd);       /* 40: evicts P's blocks 2, 1 */
  snprintf(prompts[4], sizeof prompts[4], "%s %s", P, se); /* 65: partial hit, block 0 only */
  const size_t want_cached[5] = {0, 48, 0, 0, 16};
  uint32_t *via_cache = malloc(LE * sizeof *via_cache), *truth = calloc(LE, sizeof *truth);
  eldr_sigspec spec = {sh, ELDR_REPR_COUNT, NULL, NULL};
  size_t dim = eldr_signature_dim(&spec);
  float *s1 = malloc(dim * sizeof *s1), *s2 = malloc(dim * sizeof *s2);
  for (int i = 0; i < 5; i++) {
    json_t *body = json_pack("{s:s,s:i,s:b,s:{s:b}}", "prompt", prompts[i], "max_tokens", 1,
                             "stream", 0, "kv_transfer_params", "do_remote_decode", 1);
    int status = 0;
    json_t *rep = post_json(ww.port, "/v1/completions", body, &status);
    json_decref(body);
    assert_int_equal(status, 200);
    /* The expected hits assume each request's blocks were freed (nobody pulls,
     * abort timeout) before the next one allocates: wait for that, do not race it. */
    char held[128];
    snprintf(held, sizeof held, "eldr_worker_kv_held{model_name=\"%s\"}", cfg.model);
    if (wt_wait_metric(ww.port, held, 0, 10) < 0) fail_msg("request %d: its KV blocks were never freed", i);
    size_t cached = 0;
    router_counts(rsc, &sh, prompts[i], rep, via_cache, &cached);
    if (cached != want_cached[i]) fail_msg("request %d: cached %zu, want %zu", i, cached, want_cached[i]);
    /* the same request's selections with no cache at all */
    uint16_t *sel = NULL;
    size_t n = 0;
    assert_int_equal(eldr_worker_prompt_selections(ww.w, prompts[i], strlen(prompts[i]), NULL, &sel, &n, &d), 0);
    memset(truth, 0, LE * sizeof *truth);
    assert_int_equal(eldr_counts_accumulate(&sh, sel, ELDR_SEL_U16, n, truth, NULL), 0);
    free(sel);
    if (memcmp(truth, via_cache, LE * sizeof *truth)) fail_msg("request %d: counts differ", i);
    assert_int_equal(eldr_signature_build(&spec, truth, NULL, s1), 0);
    assert_int_equal(eldr_signature_build(&spec, via_cache, NULL, s2), 0);
    assert_memory_equal(s1, s2, dim * sizeof *s1);
    json_decref(rep);
  }
  free(s1);
  free(s2);
  free(truth);
  free(via_cache);
  free(P), free(sa), free(sb), free(sc), free(sd), free(se);
  eldr_sigcache_free(rsc);
  wt_worker_stop(&ww);
}

/* ----------------------------------------------------------- HTTP API */

static void test_http_api_and_errors(void **state) {
  (void)state;
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.time_scale = 0.01;
  cfg.kv_blocks = 64;
  wt_worker ww;
  eldr_diag d = {{0}};
  if (wt_worker_start(&ww, &cfg, &d) < 0) fail_msg("worker: %s", d.msg);
  int port = ww.port;
  wt_resp r;
  assert_int_equal(wt_http(port, "GET", "/health", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  wt_resp_free(&r);
  assert_int_equal(wt_http(port, "GET", "/v1/models", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"id\":\"qwen3-30b-a3b\""));
  wt_resp_free(&r);

  /* non-streaming completion: max_tokens tokens, finish "length" */
  int status;
  json_t *b = json_pack("{s:s,s:s,s:i}", "model", "qwen3-30b-a3b", "prompt",
                        "def f(x):\n    return x * 2\n", "max_tokens", 7);
  json_t *j = post_json(port, "/v1/completions", b, &status);
  json_decref(b);
  assert_int_equal(status, 200);
  json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "length");
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 7);
  assert_string_equal(json_string_value(json_object_get(c0, "text")),
                      " tok0 tok1 tok2 tok3 tok4 tok5 tok6");
  assert_null(json_object_get(j, "kv_transfer_params"));
  json_decref(j);

  /* streaming completion and chat: well-formed SSE, usage chunk */
  const char *paths[2] = {"/v1/completions", "/v1/chat/completions"};
  for (int chat = 0; chat < 2; chat++) {
    b = chat ? json_pack("{s:[{s:s,s:s}],s:i,s:b,s:{s:b}}", "messages", "role", "user", "content",
                         "Prove that the square root of two is irrational.", "max_tokens", 5,
                         "stream", 1, "stream_options", "include_usage", 1)
             : json_pack("{s:s,s:i,s:b,s:{s:b}}", "prompt", "Once upon a time", "max_tokens", 5,
                         "stream", 1, "stream_options", "include_usage", 1);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    assert_int_equal(wt_http(port, "POST", paths[chat], s, 10, &r), 0);
    free(s);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    assert_non_null(strstr(r.ctype, "text/event-stream"));
    char err[160], eng[48];
    long usage = -1;
    int tok = wt_sse_check(r.body, err, sizeof err, eng, &usage);
    if (tok < 0) fail_msg("SSE: %s", err);
    assert_int_equal(tok, 5);
    assert_int_equal(usage, 5);
    assert_true(strncmp(eng, "eldr-both-", 10) == 0);
    wt_resp_free(&r);
  }

  /* errors: clear JSON, right status */
  expect_error(port, "/v1/completions", "{bad json", 400, "not valid JSON");
  expect_error(port, "/v1/completions", "[1,2]", 400, "JSON object");
  expect_error(port, "/v1/completions", "{\"max_tokens\":3}", 400, "'prompt'");
  expect_error(port, "/v1/completions", "{\"prompt\":[1,2,3]}", 400, "'prompt'");
  expect_error(port, "/v1/completions", "{\"prompt\":\"  \"}", 400, "empty");
  expect_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"model\":\"gpt-9\"}", 404, "gpt-9");
  expect_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "max_tokens");
  expect_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":\"5\"}", 400, "max_tokens");
  expect_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"n\":0}", 400, "'n'");
  expect_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"n\":17}", 400, "'n'");
  expect_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "stream");
  expect_error(port, "/v1/completions",
               "{\"prompt\":\"hi\",\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":true}}",
               400, "both");
  expect_error(port, "/v1/completions",
               "{\"prompt\":\"hi\",\"kv_transfer_params\":{\"do_remote_prefill\":true,\"remote_block_ids\":[-1]}}",
               400, "remote_block_ids");
  expect_error(port, "/v1/chat/completions", "{\"messages\":[]}", 400, "messages");
  expect_error(port, "/v1/chat/completions", "{\"messages\":[{\"content\":\"x\"}]}", 400, "role");
  char *big = words("w", 1100); /* 64 blocks hold 1024 tokens */
  json_t *bb = json_pack("{s:s}", "prompt", big);
  char *bs = json_dumps(bb, JSON_COMPACT);
  expect_error(port, "/v1/completions", bs, 400, "KV cache");
  free(bs);
  json_decref(bb);
  free(big);
  assert_int_equal(wt_http(port, "GET", "/v1/completions", NULL, 5, &r), 0);
  assert_int_equal(r.status, 405);
  wt_resp_free(&r);
  assert_int_equal(wt_http(port, "GET", "/nope", NULL, 5, &r), 0);
  assert_int_equal(r.status, 404);
  wt_resp_free(&r);

  /* metrics with vLLM's names */
  assert_int_equal(wt_http(port, "GET", "/metrics", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  const char *names[] = {"vllm:num_requests_running{", "vllm:num_requests_waiting{",
                         "vllm:gpu_cache_usage_perc{", "vllm:kv_cache_usage_perc{",
                         "vllm:prompt_tokens_total{", "vllm:generation_tokens_total{"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strstr(r.body, names[i])) fail_msg("metric %s missing", names[i]);
  assert_non_null(strstr(r.body, "vllm:generation_tokens_total{engine=\"0\",model_name=\"qwen3-30b-a3b\"} 17"));
  wt_resp_free(&r);
  { /* without --trace, eldr_trace_id is a field the worker does not know: ignored, as vLLM
     * ignores one (so `eldr bench load` works against it on defaults) */
    wt_resp ok;
    assert_int_equal(wt_http(port, "POST", "/v1/completions",
                             "{\"prompt\":\"hi\",\"max_tokens\":2,\"eldr_trace_id\":\"x/1\"}", 5.0, &ok), 0);
    if (ok.status != 200) fail_msg("eldr_trace_id without --trace: %d %s", ok.status, ok.body);
    wt_resp_free(&ok);
  }
  wt_worker_stop(&ww);
}

/* ------------------------------------------- PD legs and step timing */

static void test_pd_legs_replay_trace_and_step_time(void **state) {
  (void)state;
  eldr_shape sh;
  char canon[64];
  assert_int_equal(eldr_tracegen_model_shape("qwen3-30b-a3b", &sh, canon, sizeof canon, NULL), 0);
  eldr_tracegen *g = NULL;
  assert_int_equal(eldr_tracegen_new(&sh, canon, "task", 7, &g, NULL), 0);
  eldr_tracegen_set_lengths(g, 0, 24, 80);
  eldr_trace *t = NULL;
  assert_int_equal(eldr_tracegen_generate(g, 4, &t, NULL), 0);
  eldr_tracegen_free(g);

  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.role = ELDR_WORKER_PREFILL;
  pc.trace = t;
  pc.time_scale = 0.05;
  dc = pc;
  dc.role = ELDR_WORKER_DECODE;
  wt_worker pw, dw;
  eldr_diag d = {{0}};
  if (wt_worker_start(&pw, &pc, &d) < 0) fail_msg("prefill worker: %s", d.msg);
  if (wt_worker_start(&dw, &dc, &d) < 0) fail_msg("decode worker: %s", d.msg);
  eldr_latency_model lm;
  assert_int_equal(eldr_latency_preset("qwen3-30b-a3b", "h200", &lm, NULL), 0);
  const size_t LK = (size_t)sh.num_layers * sh.top_k;
  double want_step_s = 0;
  uint64_t want_steps = 0;
  for (size_t i = 0; i < t->n; i++) {
    const eldr_request *q = &t->req[i];
    char *prompt = eldr_loadgen_prompt(t, i);
    /* prefill leg, as the router sends it */
    json_t *b = json_pack("{s:s,s:i,s:b,s:s,s:{s:b,s:b,s:n,s:n,s:n,s:n}}", "prompt", prompt,
                          "max_tokens", 1, "stream", 0, "eldr_trace_id", q->id,
                          "kv_transfer_params", "do_remote_decode", 1, "do_remote_prefill", 0,
                          "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
    int status;
    json_t *rep = post_json(pw.port, "/v1/completions", b, &status);
    json_decref(b);
    assert_int_equal(status, 200);
    json_t *kv = json_object_get(rep, "kv_transfer_params");
    assert_true(json_is_true(json_object_get(kv, "do_remote_prefill")));
    assert_true(json_is_string(json_object_get(kv, "remote_engine_id")));
    assert_int_equal(json_integer_value(json_object_get(kv, "remote_port")), pw.port);
    assert_int_equal(json_array_size(json_object_get(kv, "remote_block_ids")),
                     (q->n_prefill + 15) / 16);
    /* routed_experts = the record's prefill rows (prompt has n_prefill tokens) */
    json_t *re = json_object_get(json_array_get(json_object_get(rep, "choices"), 0), "routed_experts");
    uint16_t *sel = NULL;
    size_t rows = 0;
    assert_int_equal(eldr_routed_experts_decode(json_string_value(re), json_string_length(re), &sh,
                                                &sel, &rows, NULL, &d),
                     0);
    assert_int_equal(rows, q->n_prefill);
    assert_memory_equal(sel, q->prefill, rows * LK * sizeof *sel);
    free(sel);
    /* decode leg: the client's body + kv_transfer_params, streamed */
    int cap = i == 1 ? 3 : 0; /* one request capped by max_tokens */
    b = json_pack("{s:s,s:b,s:s,s:O}", "prompt", prompt, "stream", 1, "eldr_trace_id", q->id,
                  "kv_transfer_params", kv);
    if (cap) json_object_set_new(b, "max_tokens", json_integer(cap));
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    json_decref(rep);
    wt_resp r;
    assert_int_equal(wt_http(dw.port, "POST", "/v1/completions", s, 20, &r), 0);
    free(s);
    assert_int_equal(r.status, 200);
    char err[160], eng[48];
    int tok = wt_sse_check(r.body, err, sizeof err, eng, NULL);
    if (tok < 0) fail_msg("SSE: %s", err);
    uint32_t n_out = cap ? (uint32_t)cap : q->n_decode;
    assert_int_equal(tok, n_out);
    assert_non_null(strstr(r.body, cap ? "\"finish_reason\":\"length\"" : "\"finish_reason\":\"stop\""));
    wt_resp_free(&r);
    /* alone in the batch: step t's union is the distinct experts of decode row t */
    for (uint32_t st = 0; st < n_out; st++) {
      uint32_t un[64];
      for (uint32_t l = 0; l < sh.num_layers; l++) {
        const uint16_t *row = q->decode + ((size_t)st * sh.num_layers + l) * sh.top_k;
        uint32_t u = 0;
        for (uint32_t k = 0; k < sh.top_k; k++) {
          int dup = 0;
          for (uint32_t k2 = 0; k2 < k; k2++) dup |= row[k2] == row[k];
          u += !dup;
        }
        un[l] = u;
      }
      want_step_s += eldr_latency_step(&lm, 1, un, (double)q->n_prefill + st) * pc.time_scale;
      want_steps++;
    }
    free(prompt);
  }
  eldr_worker_stats st;
  eldr_worker_stats_get(dw.w, &st);
  assert_int_equal(st.steps, want_steps);
  assert_true(fabs(st.step_seconds - want_step_s) <= 1e-9 * want_step_s);
  assert_int_equal(st.requests_done, t->n);
  /* unknown trace id: 404 naming it */
  expect_error(pw.port, "/v1/completions", "{\"prompt\":\"a\",\"eldr_trace_id\":\"nope/1\"}", 404, "nope/1");
  /* a decode worker refuses to produce KV, a prefill worker to pull it */
  expect_error(dw.port, "/v1/completions", "{\"prompt\":\"a\",\"kv_transfer_params\":{\"do_remote_decode\":true}}",
               400, "role decode");
  expect_error(pw.port, "/v1/completions",
               "{\"prompt\":\"a\",\"kv_transfer_params\":{\"do_remote_prefill\":true,\"remote_engine_id\":\"e\","
               "\"remote_block_ids\":[1],\"remote_host\":\"h\",\"remote_port\":1}}",
               400, "role prefill");
  wt_worker_stop(&dw);
  wt_worker_stop(&pw);
  eldr_trace_free(t);
}

/* A model whose shape differs from the trace's is refused at start. */
static void test_trace_shape_mismatch_refused(void **state) {
  (void)state;
  eldr_shape sh = {24, 128, 1};
  eldr_trace *t = eldr_trace_new("llama", &sh, NULL);
  eldr_worker_config c;
  eldr_worker_config_default(&c);
  c.trace = t;
  struct event_base *base = event_base_new();
  eldr_worker *w = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_worker_new(base, &c, &w, &d), ELDR_ESHAPE);
  assert_non_null(strstr(d.msg, "trace shape"));
  c.trace = NULL;
  c.model = "no-such-model";
  assert_true(eldr_worker_new(base, &c, &w, &d) < 0);
  assert_null(w);
  event_base_free(base);
  eldr_trace_free(t);
}

/* A client that goes away mid-stream: the worker drops the request, frees
 * it, and keeps serving. */
static void test_client_disconnect_mid_stream(void **state) {
  (void)state;
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.time_scale = 1;
  wt_worker ww;
  eldr_diag d = {{0}};
  if (wt_worker_start(&ww, &cfg, &d) < 0) fail_msg("worker: %s", d.msg);
  int fd = wt_connect(ww.port);
  assert_true(fd >= 0);
  const char *body = "{\"prompt\":\"tell me a long story\",\"max_tokens\":2000,\"stream\":true}";
  char head[256];
  int hl = snprintf(head, sizeof head,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                    strlen(body), body);
  assert_int_equal(tc_send_all(fd, head, (size_t)hl), 0);
  char buf[512];
  struct pollfd p = {fd, POLLIN, 0};
  assert_int_equal(poll(&p, 1, 5000), 1);
  assert_true(recv(fd, buf, sizeof buf, 0) > 0); /* the stream has started */
  close(fd);
  /* the worker notices on a later write; wait (bounded) for it */
  double deadline = wt_now() + 10;
  int cancelled = 0;
  while (wt_now() < deadline && !cancelled) {
    wt_resp r;
    assert_int_equal(wt_http(ww.port, "GET", "/metrics", NULL, 5, &r), 0);
    cancelled = strstr(r.body, "eldr_worker_requests_cancelled_total{model_name=\"qwen3-30b-a3b\"} 1") != NULL &&
                strstr(r.body, "vllm:num_requests_running{engine=\"0\",model_name=\"qwen3-30b-a3b\"} 0") != NULL;
    wt_resp_free(&r);
    if (!cancelled) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  assert_true(cancelled);
  wt_resp r;
  assert_int_equal(wt_http(ww.port, "GET", "/health", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  wt_resp_free(&r);
  wt_worker_stop(&ww);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kvcache_prefix_and_eviction),
      cmocka_unit_test(test_signature_exact_under_prefix_hits),
      cmocka_unit_test(test_http_api_and_errors),
      cmocka_unit_test(test_pd_legs_replay_trace_and_step_time),
      cmocka_unit_test(test_trace_shape_mismatch_refused),
      cmocka_unit_test(test_client_disconnect_mid_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
