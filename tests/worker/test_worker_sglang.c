/* test_worker_sglang.c — `eldr worker --engine sglang` (src/worker/sgl.h)
 * over real sockets, against what SGLang's source does (docs/sglang.md):
 * both legs of a request with one bootstrap room; the prefill holding its
 * answer until the decode has taken the KV (and failing after the
 * bootstrap timeout when no decode comes); its routed_experts in SGLang's
 * raw int32 form over the model's hidden layers; batches and n > 1 with
 * the rooms SGLang's normaliser gives; a decode that leaves failing its
 * prefill; a prefill that is gone failing its decode; --exact's counts at
 * the forward's end; and the request checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "eldr/reply_compact.h"
#include "eldr/reply_sglang.h"
#include "eldr/tracegen.h"
#include "worker/wtest.h"

typedef struct pair {
  wt_worker p, d;
  int bport;
} pair;

static void pair_start_s(pair *x, const char *model, int exact, double boot_timeout, double scale) {
  eldr_worker_config c;
  eldr_worker_config_default(&c);
  c.engine = ELDR_WORKER_ENGINE_SGLANG;
  c.model = model;
  c.time_scale = scale;
  c.port = 0;
  c.bootstrap_port = 0;
  c.bootstrap_timeout = boot_timeout;
  c.waiting_timeout = 5;
  c.role = ELDR_WORKER_PREFILL;
  c.sglang_exact = exact;
  eldr_diag d = {{0}};
  if (wt_worker_start(&x->p, &c, &d)) fail_msg("prefill: %s", d.msg);
  x->bport = eldr_worker_bootstrap_port(x->p.w);
  assert_true(x->bport > 0);
  c.role = ELDR_WORKER_DECODE;
  c.sglang_exact = 0;
  c.bootstrap_port = 0;
  if (wt_worker_start(&x->d, &c, &d)) fail_msg("decode: %s", d.msg);
}

static void pair_start(pair *x, const char *model, int exact, double boot_timeout) {
  pair_start_s(x, model, exact, boot_timeout, 0.02);
}

static void pair_stop(pair *x) {
  wt_worker_stop(&x->d);
  wt_worker_stop(&x->p);
}

/* A request on its own thread, timed. */
typedef struct call {
  int port;
  const char *path, *method;
  char *body;
  double timeout;
  wt_resp r;
  double t_done;
  pthread_t th;
} call;

static void *call_main(void *arg) {
  call *c = arg;
  wt_http(c->port, c->method ? c->method : "POST", c->path, c->body, c->timeout, &c->r);
  c->t_done = wt_now();
  return NULL;
}

static void call_start_m(call *c, const char *method, int port, const char *path, const char *body, double timeout) {
  memset(c, 0, sizeof *c);
  c->method = method;
  c->port = port;
  c->path = path;
  c->body = body ? strdup(body) : NULL;
  c->timeout = timeout;
  pthread_create(&c->th, NULL, call_main, c);
}

static void call_start(call *c, int port, const char *path, const char *body, double timeout) {
  call_start_m(c, "POST", port, path, body, timeout);
}

static void call_join(call *c) {
  pthread_join(c->th, NULL);
  free(c->body);
  c->body = NULL;
}

static char *body_of(const char *prompt_json, int bport, const char *room_json, const char *extra) {
  char *s = malloc(strlen(prompt_json) + strlen(room_json) + strlen(extra) + 256);
  sprintf(s, "{\"prompt\":%s,\"max_tokens\":6,\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,"
             "\"bootstrap_room\":%s%s}",
          prompt_json, bport, room_json, extra);
  return s;
}

static const char *PROMPT = "\"The mixture of experts routes every token to a few experts per layer, "
                            "and a decode step loads the union of what its batch selects.\"";

/* The prefill's sglext rows are the worker's prompt selections, at the MoE
 * layers of the model's hidden layers (Llama-4 Maverick: 24 of 48). */
static void test_both_legs_and_rows(void **st) {
  (void)st;
  pair x;
  pair_start(&x, "llama4-maverick", 0, 5);
  char *b = body_of(PROMPT, x.bport, "4242", ",\"return_routed_experts\":true");
  call p, d;
  call_start(&p, x.p.port, "/v1/completions", b, 20);
  call_start(&d, x.d.port, "/v1/completions", b, 20);
  call_join(&p);
  call_join(&d);
  if (p.r.status != 200) fail_msg("prefill %d: %s", p.r.status, p.r.body);
  if (d.r.status != 200) fail_msg("decode %d: %s", d.r.status, d.r.body);
  json_t *pj = json_loads(p.r.body, 0, NULL), *dj = json_loads(d.r.body, 0, NULL);
  json_t *pc = json_array_get(json_object_get(pj, "choices"), 0), *dc = json_array_get(json_object_get(dj, "choices"), 0);
  assert_string_equal(json_string_value(json_object_get(pc, "finish_reason")), "length");
  assert_true(json_is_null(json_object_get(pc, "matched_stop")));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(pj, "usage"), "completion_tokens")), 1);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(dj, "usage"), "completion_tokens")), 6);
  /* the decode's first token is the prefill's */
  const char *pt = json_string_value(json_object_get(pc, "text")), *dt = json_string_value(json_object_get(dc, "text"));
  assert_non_null(pt);
  assert_non_null(dt);
  assert_memory_equal(dt, pt, strlen(pt));
  /* rows: (prompt tokens, 48, 1) int32, the MoE layers' ids the worker's */
  const char *re = json_string_value(json_object_get(json_object_get(pj, "sglext"), "routed_experts"));
  assert_non_null(re);
  int64_t P = json_integer_value(json_object_get(json_object_get(pj, "usage"), "prompt_tokens"));
  eldr_shape sh;
  uint32_t ids[ELDR_MAX_LAYERS], hidden;
  assert_int_equal(eldr_tracegen_served_layers("llama4-maverick", &sh, ids, &hidden), 0);
  assert_int_equal(hidden, 48);
  eldr_sglang_opts o = {(size_t)P, sh.num_layers, ids, sh.top_k, sh.num_experts, NULL};
  uint8_t *buf = NULL;
  size_t cap = 0;
  uint32_t H = 0;
  eldr_re_reason why;
  eldr_diag dg = {{0}};
  assert_int_equal(eldr_sglang_experts_read(re, strlen(re), &o, &buf, &cap, &H, NULL, &why, &dg), 0);
  assert_int_equal(H, 48);
  uint16_t *sel = NULL;
  size_t n = 0;
  json_t *pv = json_loads(PROMPT, JSON_DECODE_ANY, NULL);
  const char *text = json_string_value(pv);
  assert_int_equal(eldr_worker_prompt_selections(x.p.w, text, strlen(text), NULL, &sel, &n, &dg), 0);
  assert_int_equal((int64_t)n, P);
  for (size_t i = 0; i < n * sh.num_layers * sh.top_k; i++) {
    const uint8_t *q = buf + 4 * i;
    assert_int_equal((uint32_t)q[0] | (uint32_t)q[1] << 8, sel[i]);
  }
  /* the decode's rows: the prompt's are 0 (it never ran the prompt), then
   * its forwarded output tokens' (P + 6 - 1 rows) */
  const char *dre = json_string_value(json_object_get(json_object_get(dj, "sglext"), "routed_experts"));
  assert_non_null(dre);
  eldr_sglang_opts od = {(size_t)P + 5, sh.num_layers, ids, sh.top_k, sh.num_experts, NULL};
  assert_int_equal(eldr_sglang_experts_read(dre, strlen(dre), &od, &buf, &cap, &H, NULL, &why, &dg), 0);
  for (size_t i = 0; i < n * sh.num_layers * sh.top_k; i++) assert_int_equal(buf[4 * i], 0);
  free(sel);
  free(buf);
  json_decref(pv);
  json_decref(pj);
  json_decref(dj);
  wt_resp_free(&p.r);
  wt_resp_free(&d.r);
  free(b);
  pair_stop(&x);
}

/* Without a decode the prefill does not answer: after the bootstrap
 * timeout it fails; with a decode arriving late it answers only after the
 * decode came (its KV taken). */
static void test_prefill_holds(void **st) {
  (void)st;
  pair x;
  pair_start(&x, "qwen3-30b-a3b", 0, 1.0);
  char *b = body_of(PROMPT, x.bport, "7", "");
  double t0 = wt_now();
  call p;
  call_start(&p, x.p.port, "/v1/completions", b, 10);
  call_join(&p);
  double waited = p.t_done - t0;
  if (p.r.status != 500 || !strstr(p.r.body, "Prefill bootstrap failed"))
    fail_msg("alone: %d %s", p.r.status, p.r.body);
  assert_true(waited >= 0.9 && waited < 4.0);
  assert_non_null(strstr(p.r.body, "\"object\":\"error\""));
  wt_resp_free(&p.r);
  /* the decode comes 0.4 s after the prefill leg */
  char *b2 = body_of(PROMPT, x.bport, "8", "");
  call_start(&p, x.p.port, "/v1/completions", b2, 10);
  struct timespec ts = {0, 400 * 1000 * 1000};
  nanosleep(&ts, NULL);
  double t_dec = wt_now();
  call d;
  call_start(&d, x.d.port, "/v1/completions", b2, 10);
  call_join(&p);
  call_join(&d);
  assert_int_equal(p.r.status, 200);
  assert_int_equal(d.r.status, 200);
  assert_true(p.t_done > t_dec); /* held until the decode registered and took the KV */
  wt_resp_free(&p.r);
  wt_resp_free(&d.r);
  free(b);
  free(b2);
  pair_stop(&x);
}

/* A batch of 2 prompts with n = 2: 4 items, rooms r..r+3 from a scalar
 * (GenerateReqInput._normalize_bootstrap_params), streamed on the decode. */
static void test_batch_and_n(void **st) {
  (void)st;
  pair x;
  pair_start(&x, "qwen3-30b-a3b", 0, 5);
  char *b = body_of("[\"alpha beta gamma delta\",\"epsilon zeta eta theta iota kappa\"]", x.bport, "100",
                    ",\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}");
  call p, d;
  call_start(&p, x.p.port, "/v1/completions", b, 20);
  call_start(&d, x.d.port, "/v1/completions", b, 20);
  call_join(&p);
  call_join(&d);
  assert_int_equal(p.r.status, 200);
  if (d.r.status != 200) fail_msg("decode %d: %s", d.r.status, d.r.body);
  char err[200];
  int tok = wt_sse_check(d.r.body, err, sizeof err, NULL, NULL);
  if (tok < 0) fail_msg("decode stream: %s", err);
  assert_int_equal(tok, 4 * 6);
  int seen[4] = {0};
  for (const char *q = d.r.body; (q = strstr(q, "\"index\":")); q += 8) {
    int i = atoi(q + 8);
    assert_true(i >= 0 && i < 4);
    seen[i]++;
  }
  for (int i = 0; i < 4; i++) assert_int_equal(seen[i], 6);
  assert_non_null(strstr(d.r.body, "\"completion_tokens\":24"));
  wt_resp_free(&p.r);
  wt_resp_free(&d.r);
  free(b);
  /* explicit rooms: 4 distinct ones, one per item */
  b = body_of("[\"alpha beta gamma delta\",\"epsilon zeta\"]", x.bport, "[201,202,203,204]", ",\"n\":2");
  call_start(&p, x.p.port, "/v1/completions", b, 20);
  call_start(&d, x.d.port, "/v1/completions", b, 20);
  call_join(&p);
  call_join(&d);
  assert_int_equal(p.r.status, 200);
  assert_int_equal(d.r.status, 200);
  json_t *dj = json_loads(d.r.body, 0, NULL);
  assert_int_equal(json_array_size(json_object_get(dj, "choices")), 4);
  json_decref(dj);
  wt_resp_free(&p.r);
  wt_resp_free(&d.r);
  free(b);
  pair_stop(&x);
}

static void expect_sgl_error(int port, const char *body, int want, const char *needle) {
  wt_resp r;
  assert_int_equal(wt_http(port, "POST", "/v1/completions", body, 5.0, &r), 0);
  if (r.status != want || !strstr(r.body, needle)) fail_msg("%s: %d %s (want %d, '%s')", body, r.status, r.body, want, needle);
  json_t *j = json_loads(r.body, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(j, "object")), "error");
  assert_int_equal(json_integer_value(json_object_get(j, "code")), want);
  json_decref(j);
  wt_resp_free(&r);
}

static void test_checks(void **st) {
  (void)st;
  pair x;
  pair_start(&x, "qwen3-30b-a3b", 0, 5);
  expect_sgl_error(x.p.port, "{\"prompt\":\"a b c\"}", 400, "bootstrap_room should not be None");
  expect_sgl_error(x.d.port, "{\"prompt\":\"a b c\"}", 400, "needs bootstrap_host");
  /* a list of 1 room repeated for n = 2: both items in one room */
  char s[300];
  snprintf(s, sizeof s, "{\"prompt\":\"a b c\",\"n\":2,\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,"
                        "\"bootstrap_room\":[5]}", x.bport);
  expect_sgl_error(x.p.port, s, 400, "share bootstrap_room 5");
  snprintf(s, sizeof s, "{\"prompt\":\"a b c\",\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,"
                        "\"bootstrap_room\":-1}", x.bport);
  expect_sgl_error(x.p.port, s, 400, "0..2^63-1");
  snprintf(s, sizeof s, "{\"prompt\":[\"a\",\"b\",\"c\"],\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,"
                        "\"bootstrap_room\":[1,2]}", x.bport);
  expect_sgl_error(x.p.port, s, 400, "has 2 entries");
  /* the bootstrap server: health, route, bad registrations */
  wt_resp r;
  assert_int_equal(wt_http(x.bport, "GET", "/health", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  wt_resp_free(&r);
  assert_int_equal(wt_http(x.bport, "GET", "/route", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "rank_port"));
  wt_resp_free(&r);
  assert_int_equal(wt_http(x.bport, "POST", "/eldr/kv/register", "{\"room\":\"x\"}", 5, &r), 0);
  assert_int_equal(r.status, 400);
  wt_resp_free(&r);
  assert_int_equal(wt_http(x.bport, "GET", "/eldr/expert_counts?room=3", NULL, 5, &r), 0);
  assert_int_equal(r.status, 404); /* not an --exact prefill */
  wt_resp_free(&r);
  pair_stop(&x);
}

/* A decode that leaves (its client closed) aborts its room: the prefill
 * fails at once, not after the bootstrap timeout. */
static void test_decode_leaves(void **st) {
  (void)st;
  pair x;
  /* a slow prefill (a long prompt at 20x model time): it is mid-forward
   * when the decode's client leaves */
  pair_start_s(&x, "qwen3-235b-a22b", 0, 30, 20);
  char *words = malloc(30000);
  size_t o = 0;
  o += (size_t)sprintf(words + o, "\"");
  for (int i = 0; i < 3000; i++) o += (size_t)sprintf(words + o, "w%d ", i % 997);
  sprintf(words + o, "\"");
  char *b = body_of(words, x.bport, "99", "");
  free(words);
  int fd = wt_connect(x.d.port);
  assert_true(fd >= 0);
  char head[256];
  int hl = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                       "Content-Length: %zu\r\n\r\n", strlen(b));
  assert_int_equal(tc_send_all(fd, head, (size_t)hl), 0);
  assert_int_equal(tc_send_all(fd, b, strlen(b)), 0);
  call p;
  double t0 = wt_now();
  call_start(&p, x.p.port, "/v1/completions", b, 30);
  /* registered: the prefill's item left the bootstrap queue for the
   * forward's (it counts as waiting only then); no sleep that passes by luck */
  assert_int_equal(wt_wait_metric(x.p.port, "vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen3-235b-a22b\"}",
                                  1, 20), 0);
  assert_true(p.t_done == 0);
  close(fd);
  call_join(&p);
  /* the room is aborted: the prefill fails at its forward's end, long before
   * the 30 s bootstrap timeout */
  if (p.r.status != 500 || !strstr(p.r.body, "the decode aborted")) fail_msg("%d %s", p.r.status, p.r.body);
  assert_true(p.t_done - t0 < 15);
  wt_resp_free(&p.r);
  free(b);
  pair_stop(&x);
}

/* A prefill that is gone: the decode's handshake fails, the request 500s. */
static void test_prefill_gone(void **st) {
  (void)st;
  pair x;
  pair_start(&x, "qwen3-30b-a3b", 0, 5);
  int bport = x.bport;
  wt_worker_stop(&x.p);
  char *b = body_of(PROMPT, bport, "11", "");
  wt_resp r;
  assert_int_equal(wt_http(x.d.port, "POST", "/v1/completions", b, 10, &r), 0);
  if (r.status != 500 || !strstr(r.body, "KV transfer failed")) fail_msg("%d %s", r.status, r.body);
  wt_resp_free(&r);
  free(b);
  wt_worker_stop(&x.d);
}

/* --exact: the counts are published at the forward's end, before any
 * decode registered; the prefill still answers only after its KV went. */
static void test_exact_counts(void **st) {
  (void)st;
  pair x;
  pair_start(&x, "deepseek-v3", 1, 10);
  char *b = body_of(PROMPT, x.bport, "555", "");
  call cnt, p, d;
  call_start_m(&cnt, "GET", x.bport, "/eldr/expert_counts?room=555", NULL, 20);
  call_start(&p, x.p.port, "/v1/completions", b, 20);
  call_join(&cnt);
  if (cnt.r.status != 200) fail_msg("counts %d: %s", cnt.r.status, cnt.r.body);
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  assert_true(p.t_done == 0); /* no decode yet: the prefill holds its KV and its answer */
  /* the counts are the prompt's, at DeepSeek-V3's 58 MoE layers (ids 3..60) */
  json_t *cj = json_loads(cnt.r.body, 0, NULL);
  assert_int_equal(json_integer_value(json_object_get(cj, "room")), 555);
  json_decref(cj);
  eldr_shape sh;
  uint32_t ids[ELDR_MAX_LAYERS], hidden;
  assert_int_equal(eldr_tracegen_served_layers("deepseek-v3", &sh, ids, &hidden), 0);
  eldr_js_path path = {{ELDR_COMPACT_KEY, NULL}};
  eldr_js_span v;
  eldr_diag dg0 = {{0}};
  assert_int_equal(eldr_js_scan(cnt.r.body, strlen(cnt.r.body), &path, 1, &v, NULL, &dg0), 0);
  assert_int_equal(v.type, ELDR_JS_OBJECT);
  uint32_t *got = calloc((size_t)sh.num_layers * sh.num_experts, sizeof *got);
  uint32_t *want = calloc((size_t)sh.num_layers * sh.num_experts, sizeof *want);
  eldr_compact_opts co = {sh.num_layers, ids, sh.num_experts, sh.top_k, NULL};
  eldr_compact_info info;
  eldr_re_reason why;
  eldr_diag dg = {{0}};
  assert_int_equal(eldr_compact_read(cnt.r.body, v, &co, got, NULL, &info, &why, &dg), 0);
  json_t *pv = json_loads(PROMPT, JSON_DECODE_ANY, NULL);
  const char *text = json_string_value(pv);
  uint16_t *sel = NULL;
  size_t n = 0;
  assert_int_equal(eldr_worker_prompt_selections(x.p.w, text, strlen(text), NULL, &sel, &n, &dg), 0);
  assert_int_equal(info.tokens, n);
  assert_int_equal(eldr_counts_accumulate(&sh, sel, ELDR_SEL_U16, n, want, NULL), 0);
  assert_memory_equal(got, want, (size_t)sh.num_layers * sh.num_experts * sizeof *got);
  free(got);
  free(want);
  free(sel);
  json_decref(pv);
  /* the decode registers now: the KV goes, both answer */
  call_start(&d, x.d.port, "/v1/completions", b, 20);
  call_join(&p);
  call_join(&d);
  assert_int_equal(p.r.status, 200);
  assert_int_equal(d.r.status, 200);
  /* a later poll of the same room gets the counts at once */
  wt_resp r;
  assert_int_equal(wt_http(x.bport, "GET", "/eldr/expert_counts?room=abc", NULL, 5, &r), 0);
  assert_int_equal(r.status, 400);
  wt_resp_free(&r);
  wt_resp_free(&cnt.r);
  wt_resp_free(&p.r);
  wt_resp_free(&d.r);
  free(b);
  pair_stop(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_both_legs_and_rows), cmocka_unit_test(test_prefill_holds),
      cmocka_unit_test(test_batch_and_n),        cmocka_unit_test(test_checks),
      cmocka_unit_test(test_decode_leaves),      cmocka_unit_test(test_prefill_gone),
      cmocka_unit_test(test_exact_counts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
