/* test_worker_vllm.c — the emulated worker behaves like vLLM, over real HTTP:
 * full prompt rows under a prefix hit (and computed-only on request),
 * kv_transfer_params as NixlConnector sends them, the prefill holding its
 * blocks until the decode worker pulls them over the side channel (and
 * freeing them after the abort timeout), a prefill gone between the legs
 * failing the decode leg (a streamed one after its head, which comes at once),
 * the side channel refusing hostile pulls, duplicate
 * request ids refused, n > 1, prompt_tokens_details only when enabled, text
 * drawn from a corpus, and vLLM's metric names / labels / histograms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "eldr/reply_experts.h"
#include "eldr/tracegen.h"
#include "worker/wtest.h"

static json_t *post(int port, const char *path, json_t *body, int *status) {
  char *s = json_dumps(body, JSON_COMPACT);
  wt_resp r;
  int rc = wt_http(port, "POST", path, s, 10.0, &r);
  free(s);
  assert_int_equal(rc, 0);
  *status = r.status;
  json_t *j = json_loads(r.body, 0, NULL);
  if (!j) fail_msg("not JSON (status %d): %.200s", r.status, r.body);
  wt_resp_free(&r);
  return j;
}

static const char *errmsg(json_t *j) {
  const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
  return m ? m : "";
}

/* A metric sample's value (the line starting with series), or -1. */
static char *words(const char *tag, int n) {
  char *s = malloc((size_t)n * 16 + 1);
  size_t off = 0;
  s[0] = 0;
  for (int i = 0; i < n; i++) off += (size_t)sprintf(s + off, "%s%s%d", i ? " " : "", tag, i);
  return s;
}

static json_t *prefill_body(const char *prompt) {
  return json_pack("{s:s,s:i,s:b,s:{s:b}}", "prompt", prompt, "max_tokens", 1, "stream", 0,
                   "kv_transfer_params", "do_remote_decode", 1);
}

static json_t *decode_body(const char *prompt, json_t *kvp, int max_tokens) {
  return json_pack("{s:s,s:i,s:b,s:O}", "prompt", prompt, "max_tokens", max_tokens, "stream", 0,
                   "kv_transfer_params", kvp);
}

static void start(wt_worker *ww, eldr_worker_config *cfg) {
  eldr_diag d = {{0}};
  if (wt_worker_start(ww, cfg, &d) < 0) fail_msg("worker: %s", d.msg);
}

/* Prefix hit: every prompt row comes back (vLLM since PR #39917), equal to
 * the selections a cold engine computes; "computed" returns the tail only.
 * prompt_tokens_details is null unless enabled. */
static void test_full_prompt_rows_and_details(void **state) {
  (void)state;
  eldr_shape sh;
  assert_int_equal(eldr_tracegen_model_shape("qwen3-30b-a3b", &sh, NULL, 0, NULL), 0);
  char *P = words("x", 48), *A = words("a", 10), *B = words("b", 12);
  char pa[1024], pb[1024];
  snprintf(pa, sizeof pa, "%s %s", P, A);
  snprintf(pb, sizeof pb, "%s %s", P, B); /* 60 tokens, 48 cached after pa */
  for (int mode = 0; mode < 2; mode++) {
    eldr_worker_config cfg;
    eldr_worker_config_default(&cfg);
    cfg.role = ELDR_WORKER_PREFILL;
    cfg.time_scale = 0.01;
    cfg.kv_abort_timeout = 0.001;
    cfg.routed_experts_computed_only = mode;
    cfg.enable_prompt_tokens_details = mode;
    wt_worker ww;
    start(&ww, &cfg);
    int st;
    json_t *b = prefill_body(pa);
    json_decref(post(ww.port, "/v1/completions", b, &st));
    json_decref(b);
    assert_int_equal(st, 200);
    b = prefill_body(pb);
    json_t *rep = post(ww.port, "/v1/completions", b, &st);
    json_decref(b);
    assert_int_equal(st, 200);
    json_t *det = json_object_get(json_object_get(rep, "usage"), "prompt_tokens_details");
    if (mode) assert_int_equal(json_integer_value(json_object_get(det, "cached_tokens")), 48);
    else assert_true(json_is_null(det));
    char *s = json_dumps(rep, JSON_COMPACT);
    eldr_re_opts o = {ELDR_RE_COMPLETIONS, sh.num_layers, sh.top_k, sh.num_experts, NULL, NULL, NULL, NULL, 0, NULL};
    eldr_reply_experts r;
    eldr_re_reason why;
    eldr_diag d = {{0}};
    if (eldr_reply_experts_read(s, strlen(s), &o, &r, &why, &d)) fail_msg("read: %s", d.msg);
    uint16_t *truth = NULL;
    size_t n = 0;
    assert_int_equal(eldr_worker_prompt_selections(ww.w, pb, strlen(pb), NULL, &truth, &n, &d), 0);
    assert_int_equal(n, 60);
    size_t want = mode ? 12 : 60, LK = (size_t)sh.num_layers * sh.top_k;
    const eldr_re_view *v = &r.choices[0].prompt;
    assert_int_equal(v->rows, want);
    assert_int_equal(v->first_token, n - want);
    assert_int_equal(eldr_sel_dtype_size(v->dtype), 1); /* npy |u1: 128 experts */
    for (size_t i = 0; i < want * LK; i++)
      if (((const uint8_t *)v->data)[i] != truth[(n - want) * LK + i])
        fail_msg("mode %d: element %zu differs from the cold selections", mode, i);
    eldr_reply_experts_free(&r);
    free(truth);
    free(s);
    json_decref(rep);
    wt_worker_stop(&ww);
  }
  free(P);
  free(A);
  free(B);
}

/* The PD handoff over the side channel. */
static void test_pd_pull_holds_and_frees(void **state) {
  (void)state;
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.role = ELDR_WORKER_PREFILL;
  pc.time_scale = 0.01;
  eldr_worker_config_default(&dc);
  dc.role = ELDR_WORKER_DECODE;
  dc.time_scale = 0.01;
  wt_worker P, D;
  start(&P, &pc);
  start(&D, &dc);
  const char *prompt = "one two three four five six seven eight nine ten eleven twelve thirteen "
                       "fourteen fifteen sixteen seventeen eighteen";
  int st;
  json_t *b = prefill_body(prompt);
  json_t *rep = post(P.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 200);
  json_t *kvp = json_object_get(rep, "kv_transfer_params");
  const char *keys[] = {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                        "remote_request_id", "remote_host",      "remote_port",      "tp_size"};
  for (size_t i = 0; i < 8; i++)
    if (!json_object_get(kvp, keys[i])) fail_msg("kv_transfer_params lacks %s", keys[i]);
  assert_string_equal(json_string_value(json_object_get(kvp, "remote_request_id")),
                      json_string_value(json_object_get(rep, "id")));
  assert_int_equal(json_integer_value(json_object_get(kvp, "remote_port")), P.port);
  size_t nblk = json_array_size(json_object_get(kvp, "remote_block_ids"));
  assert_int_equal(nblk, 2);
  char held[128], served[128];
  snprintf(held, sizeof held, "eldr_worker_kv_held{model_name=\"qwen3-30b-a3b\"}");
  snprintf(served, sizeof served, "eldr_worker_kv_pulls_served_total{model_name=\"qwen3-30b-a3b\"}");
  assert_true(wt_metric(P.port, held) == 1); /* held until pulled */

  /* hostile pulls are refused and release nothing */
  struct {
    const char *body;
    int status;
  } bad[] = {
      {"{", 400},
      {"[]", 400},
      {"{\"remote_request_id\":\"nope\",\"remote_engine_id\":\"x\",\"remote_block_ids\":[]}", 404},
      {"{\"remote_request_id\":\"cmpl-eldr-prefill-0-1\",\"remote_engine_id\":\"x\",\"remote_block_ids\":[]}", 404},
      {"{\"remote_request_id\":\"nope\",\"remote_engine_id\":\"x\",\"remote_block_ids\":[-1]}", 400},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    wt_resp r;
    assert_int_equal(wt_http(P.port, "POST", "/eldr/nixl/pull", bad[i].body, 5, &r), 0);
    if (r.status != bad[i].status) fail_msg("pull %s: %d, want %d", bad[i].body, r.status, bad[i].status);
    wt_resp_free(&r);
  }
  /* right id and engine, foreign block ids: 409 */
  json_t *pb = json_pack("{s:O,s:O,s:[i]}", "remote_request_id", json_object_get(kvp, "remote_request_id"),
                         "remote_engine_id", json_object_get(kvp, "remote_engine_id"), "remote_block_ids",
                         4000);
  char *pbs = json_dumps(pb, JSON_COMPACT);
  wt_resp r;
  assert_int_equal(wt_http(P.port, "POST", "/eldr/nixl/pull", pbs, 5, &r), 0);
  assert_int_equal(r.status, 409);
  wt_resp_free(&r);
  free(pbs);
  json_decref(pb);
  /* a body over the bound: 413 */
  char *huge = malloc(70000);
  memset(huge, ' ', 69999);
  huge[69999] = 0;
  assert_int_equal(wt_http(P.port, "POST", "/eldr/nixl/pull", huge, 5, &r), 0);
  assert_int_equal(r.status, 413);
  wt_resp_free(&r);
  free(huge);
  assert_true(wt_metric(P.port, held) == 1);

  /* the decode leg pulls: the prefill frees the blocks */
  b = decode_body(prompt, kvp, 4);
  json_t *drep = post(D.port, "/v1/completions", b, &st);
  json_decref(b);
  if (st != 200) fail_msg("decode leg: %d %s", st, errmsg(drep));
  assert_int_equal(json_integer_value(json_object_get(json_object_get(drep, "usage"), "completion_tokens")), 4);
  json_decref(drep);
  assert_true(wt_metric(P.port, held) == 0);
  assert_true(wt_metric(P.port, served) == 1);
  /* the same handoff again: the blocks are gone, the decode leg fails */
  b = decode_body(prompt, kvp, 4);
  drep = post(D.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 500);
  assert_non_null(strstr(errmsg(drep), "KV transfer failed"));
  assert_non_null(strstr(errmsg(drep), "404"));
  json_decref(drep);
  assert_true(wt_metric(D.port, "eldr_worker_kv_pulls_failed_total{model_name=\"qwen3-30b-a3b\"}") == 1);
  assert_true(wt_metric(D.port, "vllm:request_success_total{engine=\"0\",finished_reason=\"error\",model_name=\"qwen3-30b-a3b\"}") == 1);
  json_decref(rep);
  wt_worker_stop(&D);
  wt_worker_stop(&P);
}

/* The prefill frees unpulled blocks after the abort timeout; a prefill that
 * is gone between the legs fails the decode leg (connection refused). */
static void test_abort_timeout_and_dead_prefill(void **state) {
  (void)state;
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.role = ELDR_WORKER_PREFILL;
  pc.time_scale = 0.01;
  pc.kv_abort_timeout = 0.2;
  eldr_worker_config_default(&dc);
  dc.role = ELDR_WORKER_DECODE;
  dc.time_scale = 0.01;
  dc.kv_pull_timeout = 2;
  wt_worker P, D;
  start(&P, &pc);
  start(&D, &dc);
  const char *prompt = "alpha beta gamma delta";
  int st;
  json_t *b = prefill_body(prompt);
  json_t *rep = post(P.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 200);
  const char *exp = "eldr_worker_kv_held_expired_total{model_name=\"qwen3-30b-a3b\"}";
  double deadline = wt_now() + 5;
  while (wt_metric(P.port, exp) < 1 && wt_now() < deadline) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  assert_true(wt_metric(P.port, exp) == 1);
  assert_true(wt_metric(P.port, "eldr_worker_kv_held{model_name=\"qwen3-30b-a3b\"}") == 0);
  json_t *kvp = json_object_get(rep, "kv_transfer_params");
  b = decode_body(prompt, kvp, 2);
  json_t *drep = post(D.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 500);
  assert_non_null(strstr(errmsg(drep), "answered 404"));
  json_decref(drep);
  json_decref(rep);

  /* a fresh handoff, then the prefill dies before the decode leg */
  b = prefill_body(prompt);
  rep = post(P.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 200);
  wt_worker_stop(&P);
  kvp = json_object_get(rep, "kv_transfer_params");
  b = decode_body(prompt, kvp, 2);
  double t0 = wt_now();
  drep = post(D.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 500);
  assert_non_null(strstr(errmsg(drep), "did not answer"));
  assert_true(wt_now() - t0 < 3); /* bounded by the pull timeout */
  json_decref(drep);
  json_decref(rep);
  /* the decode worker still serves */
  wt_resp r;
  assert_int_equal(wt_http(D.port, "GET", "/health", NULL, 5, &r), 0);
  assert_int_equal(r.status, 200);
  wt_resp_free(&r);
  wt_worker_stop(&D);
}

/* Read fd until buf holds `until` or the deadline; the bytes read. */
static size_t read_until(int fd, char *buf, size_t cap, const char *until, double timeout_s) {
  size_t n = 0;
  buf[0] = 0;
  for (double dl = wt_now() + timeout_s; !strstr(buf, until) && n + 1 < cap;) {
    double left = dl - wt_now();
    struct pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
    ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
    if (k <= 0) break;
    n += (size_t)k;
    buf[n] = 0;
  }
  return n;
}

static int stream_conn(int port, const char *body) {
  int fd = wt_connect(port);
  assert_true(fd >= 0);
  char head[1024];
  int hl = snprintf(head, sizeof head,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n%s",
                    strlen(body), body);
  assert_int_equal(tc_send_all(fd, head, (size_t)hl), 0);
  return fd;
}

/* A stream's HTTP head comes as soon as the request is accepted, as vLLM's
 * does (its StreamingResponse is returned before the engine made a token):
 * a streamed decode leg whose KV pull gets no answer (a prefill side that
 * accepts nothing) has its 200 head while the pull is pending, and no event;
 * when the pull then fails (the listener closed), an error event and
 * [DONE] follow (vLLM's stream generators on an exception), not a 500. */
static void test_stream_head_at_once(void **state) {
  (void)state;
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.role = ELDR_WORKER_PREFILL;
  pc.time_scale = 0.01;
  eldr_worker_config_default(&dc);
  dc.role = ELDR_WORKER_DECODE;
  dc.time_scale = 0.01;
  dc.kv_pull_timeout = 30; /* a bound only: the test ends the pull */
  wt_worker P, D;
  start(&P, &pc);
  start(&D, &dc);
  int st;
  json_t *pb = prefill_body("alpha beta gamma delta");
  json_t *rep = post(P.port, "/v1/completions", pb, &st);
  json_decref(pb);
  assert_int_equal(st, 200);
  /* the handoff points at a listener that never accepts: the pull waits */
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(lfd, 4), 0);
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
  json_t *kvp = json_deep_copy(json_object_get(rep, "kv_transfer_params"));
  json_object_set_new(kvp, "remote_port", json_integer(ntohs(sa.sin_port)));
  json_t *db = json_pack("{s:s,s:i,s:b,s:o}", "prompt", "alpha beta gamma delta", "max_tokens", 2, "stream", 1,
                         "kv_transfer_params", kvp);
  char *body = json_dumps(db, JSON_COMPACT);
  const char *failed = "eldr_worker_kv_pulls_failed_total{model_name=\"qwen3-30b-a3b\"}";
  int fd = stream_conn(D.port, body);
  char buf[8192];
  double t0 = wt_now();
  size_t n = read_until(fd, buf, sizeof buf, "\r\n\r\n", 10);
  double t_head = wt_now() - t0;
  char *sep = strstr(buf, "\r\n\r\n");
  if (!sep) fail_msg("no head within 10 s while the pull was pending (%zu bytes: %.80s)", n, buf);
  if (strncmp(buf, "HTTP/1.1 200", 12)) fail_msg("the head before the pull ended: %.80s", buf);
  for (char *p = buf; p < sep; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
  assert_non_null(strstr(buf, "content-type: text/event-stream"));
  assert_null(strstr(sep, "data: "));        /* no event: no token yet */
  assert_true(wt_metric(D.port, failed) == 0); /* the pull is still pending */
  print_message("a streamed decode leg whose pull is pending: its 200 head after %.3f s, no event\n", t_head);
  close(lfd); /* the pending pull's connection is reset: the pull fails */
  size_t h = (size_t)(sep - buf) + 4;
  memmove(buf, buf + h, n - h + 1);
  n = read_until(fd, buf, sizeof buf, "data: [DONE]", 10);
  close(fd);
  print_message("then the pull failed: %.200s\n", buf);
  const char *e = strstr(buf, "data: {\"error\":");
  assert_non_null(e);
  assert_non_null(strstr(e, "KV transfer failed"));
  assert_non_null(strstr(e, "\"code\":500"));
  assert_non_null(strstr(e, "data: [DONE]"));
  assert_true(wt_metric(D.port, failed) == 1);
  free(body);
  json_decref(db);
  json_decref(rep);
  wt_worker_stop(&D);
  wt_worker_stop(&P);
}

/* Send a completion with an X-Request-Id header; returns the open fd. */
static int send_with_id(int port, const char *id, const char *body) {
  int fd = wt_connect(port);
  assert_true(fd >= 0);
  char head[1024];
  int hl = snprintf(head, sizeof head,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: %s\r\nContent-Type: "
                    "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                    id, strlen(body), body);
  assert_int_equal(tc_send_all(fd, head, (size_t)hl), 0);
  return fd;
}

/* Read until EOF (bounded); returns the status and the tail in buf. */
static int read_reply(int fd, char *buf, size_t cap) {
  size_t n = 0;
  double deadline = wt_now() + 10;
  while (n + 1 < cap && wt_now() < deadline) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  buf[n] = 0;
  int status = 0;
  sscanf(buf, "HTTP/1.1 %d", &status);
  return status;
}

/* Held blocks count against the pool: a prompt that needs them waits until
 * the decode side pulls them, then runs. */
static void test_held_blocks_gate_the_next_prefill(void **state) {
  (void)state;
  eldr_worker_config pc;
  eldr_worker_config_default(&pc);
  pc.role = ELDR_WORKER_PREFILL;
  pc.time_scale = 0.01;
  pc.kv_blocks = 2;
  wt_worker P;
  start(&P, &pc);
  char *A = words("a", 20), *B = words("b", 20); /* 2 blocks each */
  int st;
  json_t *b = prefill_body(A);
  json_t *rep = post(P.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 200);
  json_t *kvp = json_object_get(rep, "kv_transfer_params");
  /* B cannot start while A's blocks are held: send it, see it wait */
  json_t *bj = prefill_body(B);
  char *bb = json_dumps(bj, JSON_COMPACT);
  json_decref(bj);
  int fd = wt_connect(P.port);
  char head[512];
  int hl = snprintf(head, sizeof head,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                    strlen(bb));
  assert_int_equal(tc_send_all(fd, head, (size_t)hl), 0);
  assert_int_equal(tc_send_all(fd, bb, strlen(bb)), 0);
  struct pollfd p = {fd, POLLIN, 0};
  assert_int_equal(poll(&p, 1, 300), 0); /* no reply: waiting for blocks */
  assert_true(wt_metric(P.port, "vllm:num_requests_waiting{engine=\"0\",model_name=\"qwen3-30b-a3b\"}") == 1);
  /* the decode side pulls A: B runs */
  json_t *pb = json_pack("{s:O,s:O,s:O}", "remote_request_id", json_object_get(kvp, "remote_request_id"),
                         "remote_engine_id", json_object_get(kvp, "remote_engine_id"), "remote_block_ids",
                         json_object_get(kvp, "remote_block_ids"));
  char *pbs = json_dumps(pb, JSON_COMPACT);
  wt_resp r;
  assert_int_equal(wt_http(P.port, "POST", "/eldr/nixl/pull", pbs, 5, &r), 0);
  assert_int_equal(r.status, 200);
  wt_resp_free(&r);
  char buf[65536];
  assert_int_equal(read_reply(fd, buf, sizeof buf), 200);
  close(fd);
  free(pbs);
  json_decref(pb);
  free(bb);
  json_decref(rep);
  free(A);
  free(B);
  wt_worker_stop(&P);
}

static void test_duplicate_request_id(void **state) {
  (void)state;
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.time_scale = 1; /* the first request runs for a while */
  wt_worker ww;
  start(&ww, &cfg);
  const char *longb = "{\"prompt\":\"a long one\",\"max_tokens\":2000,\"stream\":true}";
  int fd1 = send_with_id(ww.port, "dup-1", longb);
  char buf[4096];
  struct pollfd p = {fd1, POLLIN, 0};
  assert_int_equal(poll(&p, 1, 5000), 1); /* running: the stream has started */
  int fd2 = send_with_id(ww.port, "dup-1", "{\"prompt\":\"hi\",\"max_tokens\":2}");
  assert_int_equal(read_reply(fd2, buf, sizeof buf), 400);
  assert_non_null(strstr(buf, "Request id cmpl-dup-1 already running."));
  close(fd2);
  int fd3 = send_with_id(ww.port, "dup-2", "{\"prompt\":\"hi\",\"max_tokens\":2}");
  assert_int_equal(read_reply(fd3, buf, sizeof buf), 200);
  assert_non_null(strstr(buf, "\"id\":\"cmpl-dup-2\""));
  close(fd3);
  close(fd1);
  wt_worker_stop(&ww);
}

/* n > 1, streamed and not, with words from a corpus directory. */
static void test_n_choices_and_corpus_text(void **state) {
  (void)state;
  char dir[] = "/tmp/eldr_corpus_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/t.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("Der \"Kuckuck\" ruft\\laut im Wald, und die Eule schweigt.\n\x01ctl bad\xff word", f);
  fclose(f);
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.time_scale = 0.01;
  cfg.corpus_dir = dir;
  wt_worker ww;
  start(&ww, &cfg);
  int st;
  json_t *b = json_pack("{s:s,s:i,s:i}", "prompt", "hello there", "max_tokens", 5, "n", 3);
  json_t *rep = post(ww.port, "/v1/completions", b, &st);
  json_decref(b);
  assert_int_equal(st, 200);
  json_t *ch = json_object_get(rep, "choices");
  assert_int_equal(json_array_size(ch), 3);
  const char *vocab[] = {"Der", "\"Kuckuck\"", "ruft\\laut", "im", "Wald,", "und", "die", "Eule", "schweigt.",
                         "word"};
  for (size_t c = 0; c < 3; c++) {
    json_t *o = json_array_get(ch, c);
    assert_int_equal(json_integer_value(json_object_get(o, "index")), (json_int_t)c);
    char *t = strdup(json_string_value(json_object_get(o, "text")));
    int nw = 0;
    for (char *sv = NULL, *w = strtok_r(t, " ", &sv); w; w = strtok_r(NULL, " ", &sv), nw++) {
      int known = 0;
      for (size_t v = 0; v < sizeof vocab / sizeof vocab[0]; v++) known |= !strcmp(w, vocab[v]);
      if (!known) fail_msg("choice %zu word '%s' is not from the corpus", c, w);
    }
    assert_int_equal(nw, 5);
    free(t);
  }
  assert_int_equal(json_integer_value(json_object_get(json_object_get(rep, "usage"), "completion_tokens")), 15);
  json_decref(rep);
  /* streamed: every chunk parses (quotes and backslashes escaped), each index gets its tokens */
  wt_resp r;
  assert_int_equal(wt_http(ww.port, "POST", "/v1/chat/completions",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4,\"n\":2,"
                           "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                           10, &r),
                   0);
  assert_int_equal(r.status, 200);
  char err[200];
  long usage = -1;
  if (wt_sse_check(r.body, err, sizeof err, NULL, &usage) < 0) fail_msg("sse: %s", err);
  assert_int_equal(usage, 8);
  int per[2] = {0, 0};
  for (const char *p = r.body; (p = strstr(p, "data: {")); p++) {
    json_t *j = json_loads(p + 6, JSON_DISABLE_EOF_CHECK, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *content = json_object_get(json_object_get(c0, "delta"), "content");
    json_int_t idx = json_integer_value(json_object_get(c0, "index"));
    if (json_is_string(content) && json_string_length(content) && idx >= 0 && idx < 2) per[idx]++;
    json_decref(j);
  }
  assert_int_equal(per[0], 4);
  assert_int_equal(per[1], 4);
  wt_resp_free(&r);
  wt_worker_stop(&ww);
  unlink(path);
  rmdir(dir);
  /* an unreadable corpus is an error naming it */
  eldr_worker_config bad;
  eldr_worker_config_default(&bad);
  bad.corpus_dir = "/nonexistent/corpus";
  struct event_base *base = event_base_new();
  eldr_worker *w = NULL;
  eldr_diag d = {{0}};
  assert_true(eldr_worker_new(base, &bad, &w, &d) < 0);
  assert_non_null(strstr(d.msg, "/nonexistent/corpus"));
  event_base_free(base);
}

/* vLLM's metric names, labels, types and histograms. */
static void test_vllm_metrics(void **state) {
  (void)state;
  eldr_worker_config cfg;
  eldr_worker_config_default(&cfg);
  cfg.time_scale = 0.01;
  wt_worker ww;
  start(&ww, &cfg);
  for (int i = 0; i < 3; i++) {
    wt_resp r;
    assert_int_equal(wt_http(ww.port, "POST", "/v1/completions", i < 2 ? "{\"prompt\":\"a b\",\"max_tokens\":3}"
                                                                        : "{\"prompt\":\"a b\"}",
                             10, &r),
                     0);
    assert_int_equal(r.status, 200);
    wt_resp_free(&r);
  }
  const char *M = "model_name=\"qwen3-30b-a3b\"";
  char s[256];
  snprintf(s, sizeof s, "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 2);
  snprintf(s, sizeof s, "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 1);
  snprintf(s, sizeof s, "vllm:time_to_first_token_seconds_count{engine=\"0\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 3);
  snprintf(s, sizeof s, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 3);
  snprintf(s, sizeof s, "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"2560\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 3);
  snprintf(s, sizeof s, "vllm:time_per_output_token_seconds_count{engine=\"0\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 3);
  snprintf(s, sizeof s, "vllm:num_requests_running{engine=\"0\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 0);
  snprintf(s, sizeof s, "vllm:num_requests_waiting{engine=\"0\",%s}", M);
  assert_true(wt_metric(ww.port, s) == 0);
  snprintf(s, sizeof s, "vllm:kv_cache_usage_perc{engine=\"0\",%s}", M);
  assert_true(wt_metric(ww.port, s) >= 0);
  wt_resp r;
  assert_int_equal(wt_http(ww.port, "GET", "/metrics", NULL, 5, &r), 0);
  assert_non_null(strstr(r.body, "# TYPE vllm:time_to_first_token_seconds histogram\n"));
  assert_non_null(strstr(r.body, "# TYPE vllm:request_success counter\n"));
  /* every sample's family has HELP and TYPE */
  for (const char *p = r.body; *p;) {
    const char *e = strchr(p, '\n');
    if (!e) break;
    if (*p != '#') {
      char fam[128];
      size_t l = strcspn(p, "{ ");
      snprintf(fam, sizeof fam, "%.*s", (int)l, p);
      const char *suf[] = {"_bucket", "_count", "_sum", "_total"};
      char want[200];
      int found = 0;
      snprintf(want, sizeof want, "# TYPE %s ", fam);
      found = strstr(r.body, want) != NULL;
      for (size_t k = 0; !found && k < 4; k++) {
        size_t fl = strlen(fam), sl = strlen(suf[k]);
        if (fl > sl && !strcmp(fam + fl - sl, suf[k])) {
          snprintf(want, sizeof want, "# TYPE %.*s ", (int)(fl - sl), fam);
          found = strstr(r.body, want) != NULL;
        }
      }
      if (!found) fail_msg("no TYPE for %s", fam);
    }
    p = e + 1;
  }
  wt_resp_free(&r);
  wt_worker_stop(&ww);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_prompt_rows_and_details),
      cmocka_unit_test(test_pd_pull_holds_and_frees),
      cmocka_unit_test(test_abort_timeout_and_dead_prefill),
      cmocka_unit_test(test_stream_head_at_once),
      cmocka_unit_test(test_duplicate_request_id),
      cmocka_unit_test(test_held_blocks_gate_the_next_prefill),
      cmocka_unit_test(test_n_choices_and_corpus_text),
      cmocka_unit_test(test_vllm_metrics),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
