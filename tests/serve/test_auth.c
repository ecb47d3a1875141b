/* test_auth.c — client authentication and the request-head defects of
 * issue 26, against the real router over real sockets (fixture workers):
 *   - --api-key (cfg.api_keys): every /v1 path needs "Authorization: Bearer
 *     <key>"; a missing, wrong or non-Bearer one gets vLLM's answer, 401
 *     with the body {"error":"Unauthorized"} and the reason phrase
 *     "Unauthorized" (vllm/entrypoints/openai/server_utils.py,
 *     AuthenticationMiddleware); any of several keys admits; /health and
 *     /metrics stay open; an OPTIONS preflight is not checked; nothing
 *     reaches a worker without the key; the credentials are checked before
 *     411 / 413 / 404;
 *   - POST /admin/reload without a body and without the token: 401, not 411;
 *   - two Authorization headers: 400 (never "the last one wins");
 *   - HTTP/1.1 without Host, or with two: 400 (RFC 9112 3.2); HTTP/1.0
 *     without Host: served; Transfer-Encoding in HTTP/1.0: 400 (RFC 9112
 *     6.1), the body is not decoded;
 *   - 200 refused requests: every one counted
 *     (eldr_bad_requests_total{reason="unauthorized"}), one log line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/serve.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

#define KEY1 "sk-eldr-test-key-one"
#define KEY2 "sk-eldr-test-key-two"
#define ADMIN "admin-token-0123456789abcdef"

static void start(sf_rig *g) {
  sf_start(g, 1, NULL, 1, NULL);
  g->c.threads = 1;
  assert_int_equal(eldr_serve_config_add_api_key(&g->c, KEY1, NULL), 0);
  assert_int_equal(eldr_serve_config_add_api_key(&g->c, KEY2, NULL), 0);
  g->c.admin_token = strdup(ADMIN);
  g->c.cors_origin = strdup("*");
  sf_run(g);
}

/* Send raw bytes, read one response; fails the test when none comes. */
static void raw(int port, const char *req, tc_resp *r) {
  if (tc_raw(port, req, strlen(req), 10, r) != 0) fail_msg("no response to: %s", req);
}

static void expect_vllm_401(const tc_resp *r, const char *what) {
  if (r->status != 401) fail_msg("%s: status %d, body %s", what, r->status, r->body);
  if (strncmp(r->head, "HTTP/1.1 401 Unauthorized\r\n", 27)) fail_msg("%s: status line %.40s", what, r->head);
  if (strcmp(r->body, "{\"error\":\"Unauthorized\"}")) fail_msg("%s: body %s", what, r->body);
}

static void test_api_key(void **st) {
  (void)st;
  sf_rig g;
  start(&g);
  int port = g.r.port;
  tc_resp r;
  const char *body = "{\"prompt\":\"a b c\",\"max_tokens\":2}";
  /* no key, a wrong one, a prefix, a longer one, another scheme, a bare key */
  const char *bad[] = {NULL,
                       "Authorization: Bearer sk-eldr-test-key-on\r\n",
                       "Authorization: Bearer sk-eldr-test-key-onex\r\n",
                       "Authorization: Basic " KEY1 "\r\n",
                       "Authorization: " KEY1 "\r\n",
                       "Authorization: Bearer\r\n"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(tc_post(port, "/v1/completions", body, bad[i], &r), 0);
    expect_vllm_401(&r, bad[i] ? bad[i] : "no Authorization");
    tc_free(&r);
  }
  assert_int_equal(fx_count(g.p[0], NULL), 0); /* nothing reached a worker */
  /* every /v1 path, known or not, any method: credentials first */
  const char *paths[] = {"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
                         "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}",
                         "GET /v1/nope HTTP/1.1\r\nHost: t\r\n\r\n",
                         "DELETE /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n",
                         "POST /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n",                      /* not 411 */
                         "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 999999999\r\n\r\n", /* not 413 */
                         "POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    raw(port, paths[i], &r);
    expect_vllm_401(&r, paths[i]);
    tc_free(&r);
  }
  /* either key admits; the key never reaches the workers (no forwarding) */
  assert_int_equal(tc_post(port, "/v1/completions", body, "Authorization: Bearer " KEY1 "\r\n", &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  assert_int_equal(tc_post(port, "/v1/completions", body, "authorization: bearer " KEY2 "\r\n", &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  fx_record rec;
  assert_int_equal(fx_get(g.d[0], "/v1/completions", -1, &rec), 0);
  assert_string_equal(rec.authorization, "");
  fx_record_free(&rec);
  raw(port, "GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " KEY2 "\r\n\r\n", &r);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  /* a known /v1 path with the key and a wrong method: 405 (after auth) */
  raw(port, "DELETE /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " KEY1 "\r\n\r\n", &r);
  assert_int_equal(r.status, 405);
  tc_free(&r);
  /* open paths, and the CORS preflight */
  assert_int_equal(tc_get(port, "/health", &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  assert_int_equal(tc_get(port, "/metrics", &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  raw(port, "OPTIONS /v1/completions HTTP/1.1\r\nHost: t\r\nOrigin: https://a.example\r\n\r\n", &r);
  assert_int_equal(r.status, 204);
  tc_free(&r);
  /* two Authorization headers: neither is taken */
  raw(port, "GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer x\r\nAuthorization: Bearer " KEY1 "\r\n\r\n", &r);
  assert_int_equal(r.status, 400);
  assert_non_null(strstr(r.body, "more than one Authorization header"));
  tc_free(&r);
  raw(port, "GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " KEY1 "\r\nAuthorization: Bearer x\r\n\r\n", &r);
  assert_int_equal(r.status, 400);
  tc_free(&r);
  sf_free(&g);
}

static void test_admin_before_411(void **st) {
  (void)st;
  sf_rig g;
  start(&g);
  tc_resp r;
  /* no body, no token: 401 (with WWW-Authenticate), not 411 */
  raw(g.r.port, "POST /admin/reload HTTP/1.1\r\nHost: t\r\n\r\n", &r);
  assert_int_equal(r.status, 401);
  assert_non_null(strstr(r.head, "HTTP/1.1 401 Unauthorized\r\n"));
  char h[64];
  assert_int_equal(tc_header(&r, "WWW-Authenticate", h, sizeof h), 0);
  assert_string_equal(h, "Bearer");
  tc_free(&r);
  /* with the token and no body: 411, as any POST without a length */
  raw(g.r.port, "POST /admin/reload HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " ADMIN "\r\n\r\n", &r);
  assert_int_equal(r.status, 411);
  tc_free(&r);
  /* the admin token is not an API key, nor the reverse */
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\"}", "Authorization: Bearer " ADMIN "\r\n", &r), 0);
  assert_int_equal(r.status, 401);
  tc_free(&r);
  assert_int_equal(tc_post(g.r.port, "/admin/reload", "", "Authorization: Bearer " KEY1 "\r\n", &r), 0);
  assert_int_equal(r.status, 401);
  tc_free(&r);
  assert_int_equal(tc_post(g.r.port, "/admin/reload", "", "Authorization: Bearer " ADMIN "\r\n", &r), 0);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  sf_free(&g);
}

static void test_host_and_framing(void **st) {
  (void)st;
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  g.c.threads = 1;
  sf_run(&g);
  int port = g.r.port;
  tc_resp r;
  struct {
    const char *req;
    int status;
    const char *word;
  } cases[] = {
      {"GET /health HTTP/1.1\r\n\r\n", 400, "without a Host"},
      {"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host"},
      {"GET /health HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "invalid Host"},
      {"POST /v1/completions HTTP/1.1\r\nContent-Length: 14\r\n\r\n{\"prompt\":\"a\"}", 400, "without a Host"},
      {"POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\ne\r\n{\"prompt\":\"a\"}\r\n0\r\n\r\n", 400,
       "Transfer-Encoding in an HTTP/1.0 request"},
      {"GET /metrics HTTP/1.0\r\n\r\n", 200, NULL},
      {"GET /metrics HTTP/1.1\r\nHost:\r\n\r\n", 200, NULL},
      {"GET /metrics HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", 200, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    raw(port, cases[i].req, &r);
    if (r.status != cases[i].status || (cases[i].word && !strstr(r.body, cases[i].word)))
      fail_msg("case %zu: %d %s", i, r.status, r.body);
    if (r.status == 400 && !r.closed) fail_msg("case %zu: a 400 must close the connection", i);
    tc_free(&r);
  }
  assert_int_equal(fx_count(g.p[0], NULL), 0); /* the HTTP/1.0 chunked body never became a request */
  /* an HTTP/1.0 completion with a Content-Length is served */
  raw(port, "POST /v1/completions HTTP/1.0\r\nContent-Length: 14\r\n\r\n{\"prompt\":\"a\"}", &r);
  assert_int_equal(r.status, 200);
  tc_free(&r);
  sf_free(&g);
}

/* The router's log lines containing word. */
static int log_lines(sf_rig *g, const char *word) {
  const char *t = rt_log_text(&g->r);
  int n = 0;
  for (const char *p = t; (p = strstr(p, word)) != NULL; p += strlen(word)) n++;
  return n;
}

static void test_refusals_logged_at_bounded_rate(void **st) {
  (void)st;
  sf_rig g;
  start(&g);
  tc_resp r;
  enum { N = 200 };
  for (int i = 0; i < N; i++) {
    const char *req = i % 2 ? "GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\n\r\n"
                            : "POST /admin/reload HTTP/1.1\r\nHost: t\r\n\r\n";
    raw(g.r.port, req, &r);
    assert_int_equal(r.status, 401);
    tc_free(&r);
  }
  assert_int_equal(rt_metric(g.r.port, "eldr_bad_requests_total{reason=\"unauthorized\"}"), N);
  /* one line at once, then at most one per 10 s: the loop above takes far
   * less than 10 s on any machine that runs it, yet allow a second line */
  int lines = log_lines(&g, "refused (401)");
  print_message("%d unauthenticated requests: %d log line%s\n", N, lines, lines == 1 ? "" : "s");
  if (lines < 1 || lines > 2) fail_msg("%d log lines for %d refusals:\n%s", lines, N, rt_log_text(&g.r));
  sf_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_api_key),
      cmocka_unit_test(test_admin_before_411),
      cmocka_unit_test(test_host_and_framing),
      cmocka_unit_test(test_refusals_logged_at_bounded_rate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
