/* test_serve.c — eldr serve end to end over real loopback sockets, against
 * fixture workers (tests/support) that speak vLLM's PD protocol and record
 * what they receive: the two-leg flow, streaming, locality and its
 * fallbacks, the signature cache, splicing, retries, the handoff's safety,
 * usage. The edges (headers, chunked bodies, timeouts, dead workers, bad
 * input, reload, the CLI) are in test_serve_edge.c. Waits are on conditions
 * with deadlines. */
#include "serve_e2e.h"

/* ---- the two-leg flow ------------------------------------------------------ */

static void test_two_leg_flow(void **st) {
  (void)st;
  sf_rig g;
  rig(&g, 1, NULL, 1, NULL);
  fx_worker *p = g.p[0], *d = g.d[0];
  sf_run(&g);
  const char *body = "{\"model\":\"m\",\"prompt\":\"Tell me about the moon\",\"max_tokens\":20,\"min_tokens\":3,"
                     "\"stream\":false,\"temperature\":0.5}";
  tc_resp resp;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, "X-Request-Id: req-42\r\nAuthorization: Bearer sekret\r\n", &resp), 0);
  assert_int_equal(resp.status, 200);
  json_t *j = jbody(&resp);
  assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")), "Hello world!");
  json_decref(j);
  char v[128];
  assert_int_equal(tc_header(&resp, "X-Request-Id", v, sizeof v), 0);
  assert_string_equal(v, "req-42");
  tc_free(&resp);
  /* prefill leg: exact rewrite */
  fx_record pr, dr;
  json_t *pj = jrec(p, "/v1/completions", 0, &pr);
  json_t *want = json_loads("{\"model\":\"m\",\"prompt\":\"Tell me about the moon\",\"max_tokens\":1,\"stream\":false,"
                            "\"temperature\":0.5,\"kv_transfer_params\":{\"do_remote_decode\":true,"
                            "\"do_remote_prefill\":false,\"remote_engine_id\":null,\"remote_block_ids\":null,"
                            "\"remote_host\":null,\"remote_port\":null}}", 0, NULL);
  if (!json_equal(pj, want)) fail_msg("prefill body: %s", pr.body);
  /* the engines' id is a random UUID, not the client's X-Request-Id (echoed above) */
  assert_int_equal(strlen(pr.request_id), 36);
  assert_int_equal(pr.request_id[14], '4');
  assert_string_equal(pr.authorization, ""); /* the client's key is not the workers' */
  assert_string_equal(pr.method, "POST");
  /* decode leg: the original body plus the prefill's kv_transfer_params verbatim */
  json_t *dj = jrec(d, "/v1/completions", 0, &dr);
  json_t *orig = json_loads(body, 0, NULL);
  char kv[512];
  snprintf(kv, sizeof kv, "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_engine_id\":\"%s\","
           "\"remote_block_ids\":[3,5,8],\"remote_host\":\"127.0.0.1\",\"remote_port\":%d,\"tp_size\":1}",
           fx_url(p), fx_port(p));
  json_object_set_new(orig, "kv_transfer_params", json_loads(kv, 0, NULL));
  if (!json_equal(dj, orig)) fail_msg("decode body: %s", dr.body);
  assert_string_equal(dr.request_id, pr.request_id);
  assert_string_equal(dr.authorization, "");
  assert_int_equal(fx_count(p, "/v1/completions"), 1);
  assert_int_equal(fx_count(d, "/v1/completions"), 1);
  json_decref(pj);
  json_decref(dj);
  json_decref(want);
  json_decref(orig);
  fx_record_free(&pr);
  fx_record_free(&dr);
  /* chat, max_completion_tokens, generated request id shared by both legs */
  const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":9}";
  assert_int_equal(tc_post(g.r.port, "/v1/chat/completions", chat, NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_int_equal(tc_header(&resp, "X-Request-Id", v, sizeof v), 0);
  assert_int_equal(strlen(v), 36);
  tc_free(&resp);
  pj = jrec(p, "/v1/chat/completions", 0, &pr);
  dj = jrec(d, "/v1/chat/completions", 0, &dr);
  assert_int_equal(json_integer_value(json_object_get(pj, "max_completion_tokens")), 1);
  assert_int_equal(json_integer_value(json_object_get(pj, "max_tokens")), 1);
  assert_int_equal(json_integer_value(json_object_get(dj, "max_completion_tokens")), 9);
  assert_null(json_object_get(dj, "max_tokens"));
  assert_string_equal(pr.request_id, v);
  assert_string_equal(dr.request_id, v);
  assert_string_equal(pr.authorization, "");
  json_decref(pj);
  json_decref(dj);
  fx_record_free(&pr);
  fx_record_free(&dr);
  /* /v1/models passes through; /health is ready */
  assert_int_equal(tc_get(g.r.port, "/v1/models", &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_non_null(strstr(resp.body, "fixture-model"));
  tc_free(&resp);
  assert_int_equal(tc_get(g.r.port, "/health", &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_non_null(strstr(resp.body, "\"status\":\"ok\""));
  tc_free(&resp);
  char series[256];
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"ok\"}"), 2);
  assert_int_equal(rt_metric(g.r.port, SERIES("eldr_worker_requests_total{role=\"decode\",worker=\"%s\"}", fx_url(d))), 3); /* 2 decode legs + /v1/models */
  assert_int_equal(rt_metric(g.r.port, SERIES("eldr_worker_inflight{role=\"decode\",worker=\"%s\"}", fx_url(d))), 0);
  assert_true(rt_metric(g.r.port, "eldr_request_seconds_count") >= 2);
  sf_free(&g);
}

/* ---- streaming ------------------------------------------------------------- */

static void test_streaming_relay(void **st) {
  (void)st;
  static const char *const chunks[] = {"data: {\"a\":", "1}\n\n", "data: {\"b\":\"\xc3\xa9\\n\"}\n\n: comment\n\n", "data: [DONE]\n\n"};
  fx_behaviour db = fx_defaults();
  db.chunks = chunks;
  db.n_chunks = 4;
  sf_rig g;
  rig(&g, 1, NULL, 1, &db);
  fx_worker *p = g.p[0], *d = g.d[0];
  sf_run(&g);
  tc_resp resp;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"x\",\"stream\":true,\"max_tokens\":5}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_true(resp.chunked);
  char v[128];
  assert_int_equal(tc_header(&resp, "Content-Type", v, sizeof v), 0);
  assert_string_equal(v, "text/event-stream");
  char want[512] = "";
  for (int i = 0; i < 4; i++) strcat(want, chunks[i]);
  assert_int_equal(resp.body_len, strlen(want));
  assert_memory_equal(resp.body, want, resp.body_len);
  tc_free(&resp);
  /* the prefill leg was non-streaming; the decode leg kept stream=true */
  fx_record rec;
  json_t *pj = jrec(p, "/v1/completions", 0, &rec);
  assert_true(json_is_false(json_object_get(pj, "stream")));
  json_decref(pj);
  fx_record_free(&rec);
  pj = jrec(d, "/v1/completions", 0, &rec);
  assert_true(json_is_true(json_object_get(pj, "stream")));
  json_decref(pj);
  fx_record_free(&rec);
  /* HTTP/1.0 client: raw stream until close */
  const char *b = "{\"prompt\":\"x\",\"stream\":true}";
  char raw[512];
  int n = snprintf(raw, sizeof raw, "POST /v1/completions HTTP/1.0\r\nContent-Length: %zu\r\n\r\n%s", strlen(b), b);
  assert_int_equal(tc_raw(g.r.port, raw, (size_t)n, 10, &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_false(resp.chunked);
  assert_memory_equal(resp.body, want, strlen(want));
  tc_free(&resp);
  /* mid-stream failure: the stream ends with an SSE error event, then
   * data: [DONE] (as vLLM's completion_stream_generator ends) */
  db.die_after_chunks = 2;
  fx_set(d, &db);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"y\",\"stream\":true}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  assert_true(resp.chunked);
  char part[128];
  snprintf(part, sizeof part, "%s%s", chunks[0], chunks[1]);
  assert_memory_equal(resp.body, part, strlen(part));
  assert_non_null(strstr(resp.body + strlen(part), "data: {\"error\":"));
  {
    const char *done = "}}\n\ndata: [DONE]\n\n";
    assert_true(resp.body_len >= strlen(done));
    assert_memory_equal(resp.body + resp.body_len - strlen(done), done, strlen(done));
  }
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"jsq\",decision=\"load\",outcome=\"stream_aborted\"}"), 1);
  /* the client leaves in the middle of a stream: the decode leg is closed too */
  db.die_after_chunks = 0;
  db.stall_after_chunks = 1;
  fx_set(d, &db);
  int fd = tc_send_raw(g.r.port, "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 28\r\n\r\n{\"prompt\":\"z\",\"stream\":true}");
  assert_true(fd >= 0);
  char buf[1024];
  tc_read_until(fd, buf, sizeof buf, chunks[0]); /* the first relayed chunk */
  assert_non_null(strstr(buf, chunks[0]));
  close(fd);
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_client_disconnects_total", 1, 10), 0);
  char series[256];
  assert_int_equal(rt_wait_metric_le(g.r.port, SERIES("eldr_worker_inflight{role=\"decode\",worker=\"%s\"}", fx_url(d)), 0, 10), 0);
  sf_free(&g);
}

/* ---- decisions and fallbacks ---------------------------------------------- */

/* GET /health: its status, and whether its body contains needle. */
static int health_has(int port, int status, const char *needle) {
  tc_resp resp;
  if (tc_get(port, "/health", &resp)) return 0;
  int ok = resp.status == status && resp.body && strstr(resp.body, needle);
  if (!ok) fprintf(stderr, "/health %d: %s\n", resp.status, resp.body ? resp.body : "");
  tc_free(&resp);
  return ok;
}

static void test_locality_and_fallbacks(void **st) {
  (void)st;
  char *art = make_artifact(&SH, "loc");
  char *lo = routed(5, &SH, 0), *hi = routed(5, &SH, 6);
  eldr_shape other = {5, 8, 2};
  char *wrong = routed(5, &other, 0);
  fx_behaviour pb = fx_defaults();
  pb.routed_experts = hi;
  sf_rig g;
  rig(&g, 1, &pb, 2, NULL);
  fx_worker *p = g.p[0], *d0 = g.d[0], *d1 = g.d[1];
  g.c.threads = 1; /* /health's recent decisions are per loop */
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(art);
  sf_run(&g);
  tc_resp resp;
  /* experts 6,7 -> centroid 1 -> decoder 1, although decoder 0 is the JSQ choice */
  assert_int_equal(sf_post_served_by(g.r.port), fx_port(d1));
  pb.routed_experts = lo;
  fx_set(p, &pb);
  assert_int_equal(sf_post_served_by(g.r.port), fx_port(d0));
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"), 2);
  /* /health: ready (both legs answered, health checks off) and locality on */
  assert_true(health_has(g.r.port, 200, "\"locality\":{\"on\":true,\"reason\":\"\",\"policy\":\"eldr\",\"artifact_loaded\":true,\"shape_match\":true"));
  assert_true(health_has(g.r.port, 200, "\"recent_decisions\":2,\"recent_fallback_fraction\":0.0000"));
  /* fallbacks: each request still served, counted by reason */
  const char *bad_b64 = "!!not base64!!";
  struct {
    const char *re;
    const char *reason;
  } fb[] = {{NULL, "no_routed_experts"}, {bad_b64, "malformed"}, {wrong, "shape_mismatch"}, {"", "malformed"}};
  for (size_t i = 0; i < 4; i++) {
    pb.routed_experts = fb[i].re;
    fx_set(p, &pb);
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
    assert_int_equal(resp.status, 200);
    tc_free(&resp);
  }
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"no_routed_experts\"}"), 1);
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"malformed\"}"), 2);
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"shape_mismatch\"}"), 1);
  assert_int_equal(rt_metric(g.r.port, "eldr_requests_total{policy=\"eldr\",decision=\"load\",outcome=\"ok\"}"), 4);
  assert_true(health_has(g.r.port, 200, "\"recent_decisions\":6,\"recent_fallback_fraction\":0.6667"));
  /* prefill reply without kv_transfer_params: decode leg as the client sent it */
  pb.routed_experts = lo;
  pb.no_kv_params = 1;
  fx_set(p, &pb);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_prefill_without_kv_params_total"), 1);
  /* a prefill reply that is not JSON is an upstream failure (retried, then 502) */
  pb.raw_reply = "not json";
  fx_set(p, &pb);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  expect_error(&resp, 502, "prefill");
  tc_free(&resp);
  sf_stop(&g);
  assert_non_null(strstr(rt_log_text(&g.r), "logged once"));
  /* no artifact: load-only, counted */
  pb = fx_defaults();
  pb.routed_experts = lo;
  fx_set(p, &pb);
  reconfig(&g);
  g.c.policy = ELDR_POLICY_ELDR;
  sf_run(&g);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"no_artifact\"}"), 1);
  assert_int_equal(rt_metric(g.r.port, "eldr_artifact_loaded"), 0);
  assert_true(health_has(g.r.port, 200, "\"locality\":{\"on\":false,\"reason\":\"no artifact\""));
  sf_stop(&g);
  /* artifact that cannot be used: refused at start with a message */
  reconfig(&g);
  g.c.artifact = strdup("/nonexistent/artifact.json");
  eldr_server *s = NULL;
  eldr_diag dg = {{0}};
  assert_true(eldr_server_new(&g.c, &s, &dg) < 0);
  assert_null(s);
  assert_true(dg.msg[0] != 0);
  sf_free(&g);
  unlink(art);
  free(art);
  free(lo);
  free(hi);
  free(wrong);
}

/* The router completes a signature from its block cache when the engine
 * leaves prefix-cached tokens out, and decides exactly as without cache. */
static void test_sigcache_completion(void **st) {
  (void)st;
  char *art = make_artifact(&SH, "cache");
  /* a 48-token prompt: 3 blocks; all 48 rows (the first 32 tokens on experts
   * 6,7, the last 16 on 0,1), and the last block's alone */
  char prompt[1024], *all = NULL, *tail = NULL;
  sf_prefix_prompt(&SH, prompt, sizeof prompt, &all, &tail);
  fx_behaviour pb = fx_defaults();
  pb.routed_experts = all;
  pb.prompt_tokens = 48;
  pb.cached_tokens = 0;
  sf_rig g;
  rig(&g, 1, &pb, 2, NULL);
  fx_worker *p = g.p[0], *d0 = g.d[0], *d1 = g.d[1];
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(art);
  sf_run(&g);
  json_t *b = json_pack("{s:s}", "prompt", prompt);
  char *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  tc_resp resp;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &resp), 0);
  assert_int_equal(sf_served_by(&resp), fx_port(d1)); /* 32 of 48 tokens on experts 6,7 */
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_sigcache_rows"), 3);
  /* second request: the engine cached 32 tokens and returns only the 16 on experts 0,1.
   * Without the cache the router would see only experts 0,1 and pick decoder 0. */
  pb.routed_experts = tail;
  pb.cached_tokens = 32;
  fx_set(p, &pb);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &resp), 0);
  assert_int_equal(sf_served_by(&resp), fx_port(d1));
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_sigcache_hits_total"), 2);
  assert_int_equal(rt_metric(g.r.port, "eldr_signature_blocks_missing_total"), 0);
  sf_stop(&g);
  /* with the cache off the same reply routes by the partial signature (decoder 0) */
  reconfig(&g);
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(art);
  g.c.sigcache_rows = 0;
  sf_run(&g);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &resp), 0);
  assert_int_equal(sf_served_by(&resp), fx_port(d0));
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_signature_blocks_missing_total"), 2);
  sf_free(&g);
  free(body);
  free(all);
  free(tail);
  unlink(art);
  free(art);
}

/* POST body to /v1/completions (200 expected): the reply's
 * choices[0].routed_experts (malloc'd). */
static char *post_routed(int port, const char *body) {
  tc_resp resp;
  assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &resp), 0);
  if (resp.status != 200) fail_msg("status %d: %s", resp.status, resp.body);
  json_t *j = jbody(&resp);
  const char *re = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "routed_experts"));
  if (!re) fail_msg("no routed_experts: %s", resp.body);
  char *out = strdup(re);
  json_decref(j);
  tc_free(&resp);
  return out;
}

static void test_splice(void **st) {
  (void)st;
  uint16_t pre[3 * 8], dec[5 * 8];
  for (int i = 0; i < 24; i++) pre[i] = (uint16_t)(i % 8);
  for (int i = 0; i < 40; i++) dec[i] = 5;
  char *pb64 = NULL, *db64 = NULL;
  size_t len;
  assert_int_equal(eldr_routed_experts_encode(pre, 3, &SH, ELDR_SEL_U8, &pb64, &len), 0);
  assert_int_equal(eldr_routed_experts_encode(dec, 5, &SH, ELDR_SEL_U8, &db64, &len), 0);
  fx_behaviour pb = fx_defaults(), db = fx_defaults();
  pb.routed_experts = pb64;
  pb.prompt_tokens = 3;
  db.decode_routed_experts = db64;
  sf_rig g;
  rig(&g, 1, &pb, 1, &db);
  sf_run(&g);
  char *re = post_routed(g.r.port, "{\"prompt\":\"a b c\",\"return_routed_experts\":true}");
  uint16_t *sel = NULL;
  size_t nt;
  eldr_shape os;
  assert_int_equal(eldr_routed_experts_decode(re, strlen(re), &SH, &sel, &nt, &os, NULL), 0);
  assert_int_equal(nt, 5);
  assert_memory_equal(sel, pre, sizeof pre);
  assert_memory_equal(sel + 24, dec + 24, 16 * sizeof *sel);
  free(sel);
  free(re);
  /* vLLM has no per-request switch: spliced whether or not the body asks */
  re = post_routed(g.r.port, "{\"prompt\":\"a b c\"}");
  assert_string_not_equal(re, db64);
  free(re);
  assert_int_equal(rt_metric(g.r.port, "eldr_routed_experts_spliced_total"), 2);
  sf_stop(&g);
  /* turned off (--no-splice): relayed as the decoder sent it */
  reconfig(&g);
  g.c.splice_routed_experts = 0;
  sf_run(&g);
  re = post_routed(g.r.port, "{\"prompt\":\"a b c\",\"return_routed_experts\":true}");
  assert_string_equal(re, db64);
  free(re);
  assert_int_equal(rt_metric(g.r.port, "eldr_routed_experts_spliced_total"), 0);
  sf_free(&g);
  free(pb64);
  free(db64);
}

/* ---- faults ---------------------------------------------------------------- */

static void test_retries(void **st) {
  (void)st;
  fx_behaviour bad = fx_defaults();
  bad.status = 500;
  fx_behaviour dead = fx_defaults();
  dead.close_without_reply = 1;
  sf_rig g;
  rig(&g, 2, NULL, 2, NULL);
  fx_worker *pa = g.p[0], *pbw = g.p[1], *d0 = g.d[0], *d1 = g.d[1];
  fx_set(pa, &bad);
  fx_stop(d0); /* refuses connections: a failure to connect, retried */
  sf_run(&g);
  tc_resp resp;
  for (int i = 0; i < 8; i++) {
    char b[64];
    snprintf(b, sizeof b, "{\"prompt\":\"prompt number %d\"}", i);
    assert_int_equal(tc_post(g.r.port, "/v1/completions", b, NULL, &resp), 0);
    if (resp.status != 200) fail_msg("%d: %s", resp.status, resp.body);
    assert_int_equal(sf_served_by(&resp), fx_port(d1));
    tc_free(&resp);
  }
  /* every prefill that hit the failing worker was retried on the other */
  size_t fails = fx_count(pa, "/v1/completions");
  assert_int_equal(rt_metric(g.r.port, "eldr_retries_total{leg=\"prefill\"}"), (double)fails);
  assert_int_equal(fx_count(pbw, "/v1/completions"), 8);
  /* JSQ picks decoder 0 first (index tie-break): its connect fails, all 8 retried on decoder 1 */
  assert_int_equal(rt_metric(g.r.port, "eldr_retries_total{leg=\"decode\"}"), 8);
  /* a decoder that fails after the request reached it: not retried on
   * another decoder (it may have pulled the KV blocks already), 502. (The
   * kept-alive connection it failed on is resent once on a fresh one to the
   * same decoder: test_serve_keepalive.c) */
  fx_set(d1, &dead);
  size_t sent_before = fx_count(d1, "/v1/completions");
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"z\"}", NULL, &resp), 0);
  expect_error(&resp, 502, "not retried");
  tc_free(&resp);
  assert_int_equal(fx_count(d0, "/v1/completions"), 0);
  assert_int_equal(fx_count(d1, "/v1/completions"), sent_before + 2);
  if (rt_metric(g.r.port, "eldr_retries_total{leg=\"decode\"}") != 9) fail_msg("%s", rt_log_text(&g.r)); /* d0's refusal only */
  /* a 4xx from the worker is the client's error: relayed, not retried */
  fx_behaviour four = fx_defaults();
  four.status = 400;
  fx_set(pa, &four);
  fx_set(pbw, &four);
  double before = rt_metric(g.r.port, "eldr_retries_total{leg=\"prefill\"}");
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"z\"}", NULL, &resp), 0);
  assert_int_equal(resp.status, 400);
  assert_non_null(strstr(resp.body, "fixture failure"));
  tc_free(&resp);
  assert_int_equal(rt_metric(g.r.port, "eldr_retries_total{leg=\"prefill\"}"), before);
  sf_free(&g);
}

/* ---- safety of the handoff -------------------------------------------------- */

static void test_handoff_safety(void **st) {
  (void)st;
  fx_behaviour nokv = fx_defaults();
  nokv.no_kv_params = 1;
  sf_rig g;
  rig(&g, 1, &nokv, 1, NULL);
  fx_worker *p = g.p[0], *d = g.d[0];
  sf_run(&g);
  rt_router r2;
  assert_int_equal(rt_start(&r2, &g.c), 0); /* a second instance, same seed */
  const char *evil = "{\"prompt\":\"steal\",\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                     "\"remote_host\":\"10.6.6.6\",\"remote_port\":6666,\"remote_block_ids\":[1,2,3],"
                     "\"remote_engine_id\":\"victim\"}}";
  tc_resp resp;
  /* the prefill reply carries no kv_transfer_params: the decoder gets none */
  assert_int_equal(tc_post(g.r.port, "/v1/completions", evil, NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  fx_record pr, dr;
  json_t *pj = jrec(p, "/v1/completions", -1, &pr), *dj = jrec(d, "/v1/completions", -1, &dr);
  assert_null(json_object_get(dj, "kv_transfer_params"));
  assert_null(strstr(dr.body, "10.6.6.6"));
  assert_null(strstr(pr.body, "10.6.6.6"));
  assert_true(json_is_null(json_object_get(json_object_get(pj, "kv_transfer_params"), "remote_host")));
  json_decref(pj);
  json_decref(dj);
  fx_record_free(&pr);
  fx_record_free(&dr);
  /* ... and null ones: the same */
  nokv = fx_defaults();
  nokv.raw_reply = "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\"}],"
                   "\"kv_transfer_params\":null}";
  fx_set(p, &nokv);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", evil, NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  dj = jrec(d, "/v1/completions", -1, &dr);
  assert_null(json_object_get(dj, "kv_transfer_params"));
  json_decref(dj);
  fx_record_free(&dr);
  /* with the prefill's: exactly those, none of the client's */
  fx_behaviour ok = fx_defaults();
  fx_set(p, &ok);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", evil, NULL, &resp), 0);
  tc_free(&resp);
  dj = jrec(d, "/v1/completions", -1, &dr);
  json_t *kv = json_object_get(dj, "kv_transfer_params");
  assert_string_equal(json_string_value(json_object_get(kv, "remote_host")), "127.0.0.1");
  assert_int_equal(json_integer_value(json_object_get(kv, "remote_port")), fx_port(p));
  assert_null(strstr(dr.body, "victim"));
  json_decref(dj);
  fx_record_free(&dr);
  /* two router instances, same seed, same client X-Request-Id: never the same engine id */
  size_t base = fx_count(p, "/v1/completions");
  for (int i = 0; i < 20; i++) {
    assert_int_equal(tc_post(i % 2 ? r2.port : g.r.port, "/v1/completions", "{\"prompt\":\"a\"}",
                             "X-Request-Id: same\r\n", &resp), 0);
    char v[64];
    assert_int_equal(tc_header(&resp, "X-Request-Id", v, sizeof v), 0);
    assert_string_equal(v, "same");
    tc_free(&resp);
  }
  size_t n = fx_count(p, "/v1/completions") - base;
  assert_int_equal(n, 20);
  char ids[20][256];
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(fx_get(p, "/v1/completions", (long)(base + i), &pr), 0);
    snprintf(ids[i], sizeof ids[i], "%s", pr.request_id);
    fx_record_free(&pr);
    assert_int_equal(strlen(ids[i]), 36);
    for (size_t j = 0; j < i; j++) assert_string_not_equal(ids[i], ids[j]);
  }
  /* what the decoder would refuse is refused before the prefill leg */
  static const struct {
    const char *body, *word;
  } refused[] = {
      {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", "stream=True"},
      {"{\"prompt\":\"a\",\"stream\":false,\"stream_options\":{}}", "stream=True"},
      {"{\"prompt\":\"a\",\"max_tokens\":4,\"min_tokens\":5}", "min_tokens"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_completion_tokens\":2,\"min_tokens\":3}", "min_tokens"},
      {"{\"prompt\":\"a\",\"stream\":true,\"prompt_logprobs\":1}", "prompt_logprobs"},
      {"{\"prompt\":\"a\",\"n\":0}", "n must be"},
      {"{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens"},
      {"{\"prompt\":\"a\",\"top_p\":0}", "top_p"},
      {"{\"prompt\":\"a\",\"temperature\":-1}", "temperature"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}", "logprobs"},
  };
  base = fx_count(p, NULL);
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    const char *path = strstr(refused[i].body, "messages") ? "/v1/chat/completions" : "/v1/completions";
    assert_int_equal(tc_post(g.r.port, path, refused[i].body, NULL, &resp), 0);
    expect_error(&resp, 400, refused[i].word);
    tc_free(&resp);
  }
  assert_int_equal(fx_count(p, NULL), base); /* no prefill leg was sent */
  rt_stop(&r2);
  sf_free(&g);
}

/* usage and prompt_logprobs as vLLM's router reports a PD request */
static void test_usage_from_the_right_leg(void **st) {
  (void)st;
  fx_behaviour pb = fx_defaults(), db = fx_defaults();
  pb.raw_reply = "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\","
                 "\"prompt_logprobs\":[null,{\"7\":{\"logprob\":-1.5}}]}],\"usage\":{\"prompt_tokens\":40,"
                 "\"completion_tokens\":1,\"total_tokens\":41,\"prompt_tokens_details\":{\"cached_tokens\":16}},"
                 "\"kv_transfer_params\":{\"remote_block_ids\":[1]}}";
  /* the decoder counts the whole prompt as cached (it received the KV) */
  db.raw_reply = "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"yz\","
                 "\"prompt_logprobs\":null}],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":7,"
                 "\"total_tokens\":47,\"prompt_tokens_details\":{\"cached_tokens\":40}}}";
  sf_rig g;
  rig(&g, 1, &pb, 1, &db);
  fx_worker *d = g.d[0];
  sf_run(&g);
  tc_resp resp;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":7,\"prompt_logprobs\":1}",
                           NULL, &resp), 0);
  assert_int_equal(resp.status, 200);
  json_t *j = jbody(&resp);
  json_t *want = json_loads("{\"prompt_tokens\":40,\"completion_tokens\":7,\"total_tokens\":47,"
                            "\"prompt_tokens_details\":{\"cached_tokens\":16}}", 0, NULL);
  if (!json_equal(json_object_get(j, "usage"), want)) fail_msg("usage: %s", resp.body);
  json_t *plp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "prompt_logprobs");
  assert_true(json_is_array(plp) && json_array_size(plp) == 2);
  json_decref(want);
  json_decref(j);
  tc_free(&resp);
  /* the decode leg does not ask the decoder for prompt logprobs */
  fx_record dr;
  json_t *dj = jrec(d, "/v1/completions", -1, &dr);
  assert_null(json_object_get(dj, "prompt_logprobs"));
  json_decref(dj);
  fx_record_free(&dr);
  /* not asked: the prefill's prompt_logprobs are not added */
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", NULL, &resp), 0);
  j = jbody(&resp);
  assert_true(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "prompt_logprobs")));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 47);
  json_decref(j);
  tc_free(&resp);
  sf_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_leg_flow),
      cmocka_unit_test(test_streaming_relay),
      cmocka_unit_test(test_locality_and_fallbacks),
      cmocka_unit_test(test_sigcache_completion),
      cmocka_unit_test(test_splice),
      cmocka_unit_test(test_retries),
      cmocka_unit_test(test_handoff_safety),
      cmocka_unit_test(test_usage_from_the_right_leg),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
