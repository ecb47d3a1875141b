/* test_serve_units.c — the router's pure pieces: HTTP head parsing, client
 * request validation, the exact JSON of both legs, routed_experts
 * splicing, configuration, bench route's layer forms. (The signature
 * path's prompt blocks, cache stores and predictions: test_sigpath.c. A
 * prefill reply's reading and a decode reply's counts are
 * format's: tests/format/test_reply.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/routebench.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "serve/serve_internal.h"
#include "serve/sigpath.h"

#include <event2/event.h>

static long parse(const char *s, eldr__http_head *h) {
  return eldr__http_parse_head(s, strlen(s), 4096, h);
}

static void test_http_head(void **st) {
  (void)st;
  eldr__http_head h;
  const char *ok = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
                   "X-Request-Id: abc-1\r\nAuthorization: Bearer tok en\r\n\r\n{\"a\":1}";
  long n = parse(ok, &h);
  assert_int_equal(n, (long)(strstr(ok, "\r\n\r\n") - ok + 4));
  assert_int_equal(h.method, ELDR__M_POST);
  assert_string_equal(h.path, "/v1/completions");
  assert_int_equal(h.content_length, 12);
  assert_string_equal(h.request_id, "abc-1");
  assert_string_equal(h.authorization, "Bearer tok en");
  assert_int_equal(h.keep_alive, 1);
  assert_int_equal(parse("GET /health HTTP/1.0\r\n\r\n", &h) > 0, 1);
  assert_int_equal(h.keep_alive, 0);
  assert_int_equal(h.content_length, -1);
  assert_true(parse("GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &h) > 0 && h.keep_alive);
  assert_true(parse("GET /health HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n", &h) > 0 && !h.keep_alive);
  assert_true(parse("GET http://x:1/metrics HTTP/1.1\nHost: x:1\n\n", &h) > 0);
  assert_string_equal(h.path, "/metrics");
  assert_true(parse("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", &h) > 0);
  assert_true(parse("PUT /x HTTP/1.1\r\nHost: a\r\n\r\n", &h) > 0 && h.method == ELDR__M_OTHER);
  /* incomplete */
  assert_int_equal(parse("GET /health HTTP/1.1\r\nHost: a\r\n", &h), 0);
  assert_int_equal(parse("", &h), 0);
  /* errors with the status to answer */
  struct {
    const char *req;
    int status;
  } bad[] = {
      {"GARBAGE\r\n\r\n", 400},
      {"GET  / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET / HTTP/1.1x\r\n\r\n", 400},
      {"GET noslash HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\n folded\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", 417},
      {"GET / HTTP/1.1\r\nX-Request-Id: a b\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n", 400},
      {"VERYLONGMETHODNAMEXX / HTTP/1.1\r\n\r\n", 501},
      /* RFC 9112 3.2: an HTTP/1.1 request has exactly one Host, with a valid value */
      {"GET / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: %zz\r\n\r\n", 400},
      /* two credentials (or two ids) would leave the router to pick one */
      {"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\r\nAuthorization: Bearer y\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: a\r\nX-Request-Id: b\r\n\r\n", 400},
      /* RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing */
      {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    long r = parse(bad[i].req, &h);
    if (r != -1 || h.status != bad[i].status) fail_msg("case %zu (%s): rc %ld status %d", i, bad[i].req, r, h.status);
    assert_true(h.error[0] != 0);
  }
  assert_true(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", &h) > 0 && h.chunked);
  /* the messages name what is wrong */
  assert_int_equal(parse("GET / HTTP/1.1\r\n\r\n", &h), -1);
  assert_string_equal(h.error, "HTTP/1.1 request without a Host header");
  assert_int_equal(parse("GET / HTTP/1.1\r\nHost: a\r\nauthorization: x\r\nAuthorization: y\r\n\r\n", &h), -1);
  assert_string_equal(h.error, "more than one Authorization header");
  /* valid Host forms; HTTP/1.0 needs none */
  const char *hosts[] = {"", "a", "a:8000", "10.0.0.1:80", "[::1]:8000", "[fe80::1]", "x.example-1.com", "a%41b"};
  for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
    char req[128];
    snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hosts[i]);
    if (parse(req, &h) <= 0) fail_msg("Host '%s' refused: %s", hosts[i], h.error);
  }
  assert_true(parse("GET / HTTP/1.0\r\n\r\n", &h) > 0);
  assert_true(parse("POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", &h) > 0);
  /* too large: no blank line within max_header */
  char big[600];
  memset(big, 'a', sizeof big);
  memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
  assert_int_equal(eldr__http_parse_head(big, sizeof big, 512, &h), -1);
  assert_int_equal(h.status, 431);
  char longpath[3010];
  memset(longpath, 'p', sizeof longpath);
  memcpy(longpath, "GET /", 5);
  memcpy(longpath + 2990, " HTTP/1.1\r\n\r\n", 13);
  assert_int_equal(eldr__http_parse_head(longpath, 3003, 4096, &h), -1);
  assert_int_equal(h.status, 414);
  /* X-Request-Id: at most ELDR__HTTP_REQID_MAX - 1 bytes (what a record keeps whole) */
  char rid[ELDR__HTTP_REQID_MAX + 64];
  int hl = snprintf(rid, sizeof rid, "GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: ");
  memset(rid + hl, 'r', ELDR__HTTP_REQID_MAX - 1);
  memcpy(rid + hl + ELDR__HTTP_REQID_MAX - 1, "\r\n\r\n", 5);
  assert_true(parse(rid, &h) > 0);
  assert_int_equal(strlen(h.request_id), ELDR__HTTP_REQID_MAX - 1);
  memset(rid + hl, 'r', ELDR__HTTP_REQID_MAX);
  memcpy(rid + hl + ELDR__HTTP_REQID_MAX, "\r\n\r\n", 5);
  assert_int_equal(parse(rid, &h), -1);
  assert_int_equal(h.status, 400);
  assert_non_null(strstr(h.error, "X-Request-Id too long"));
}

static json_t *load(const char *s) {
  json_t *j = json_loads(s, 0, NULL);
  assert_non_null(j);
  return j;
}

static void test_req_parse_errors(void **st) {
  (void)st;
  struct {
    eldr__api api;
    const char *body;
    int rc;
    const char *word;
  } cases[] = {
      {ELDR__API_COMPLETIONS, "{", ELDR_EPARSE, "invalid JSON"},
      {ELDR__API_COMPLETIONS, "[1]", ELDR_EINVAL, "object"},
      {ELDR__API_COMPLETIONS, "{\"model\":\"m\"}", ELDR_EINVAL, "prompt"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":5}", ELDR_EINVAL, "prompt"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":[]}", ELDR_EINVAL, "prompt"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":[1,\"a\"]}", ELDR_EINVAL, "prompt"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":\"yes\"}", ELDR_EINVAL, "stream"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":-1}", ELDR_EINVAL, "max_tokens"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":1.5}", ELDR_EINVAL, "max_tokens"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"min_tokens\":\"2\"}", ELDR_EINVAL, "min_tokens"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"model\":3}", ELDR_EINVAL, "model"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"stream_options\":1}", ELDR_EINVAL, "stream_options"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"kv_transfer_params\":[]}", ELDR_EINVAL, "kv_transfer_params"},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"a\",\"return_routed_experts\":1}", ELDR_EINVAL, "return_routed_experts"},
      {ELDR__API_CHAT, "{\"prompt\":\"a\"}", ELDR_EINVAL, "messages"},
      {ELDR__API_CHAT, "{\"messages\":[]}", ELDR_EINVAL, "messages"},
      {ELDR__API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", ELDR_EINVAL, "role"},
      {ELDR__API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", ELDR_EINVAL, "content"},
      {ELDR__API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", ELDR_EINVAL, "type"},
      {ELDR__API_CHAT, "{\"messages\":[\"hi\"]}", ELDR_EINVAL, "messages"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    eldr__req r;
    eldr_diag d = {{0}};
    int rc = eldr__req_parse(cases[i].body, strlen(cases[i].body), cases[i].api, &r, &d);
    if (rc != cases[i].rc || !strstr(d.msg, cases[i].word))
      fail_msg("case %zu (%s): rc %d msg '%s'", i, cases[i].body, rc, d.msg);
    assert_null(r.root);
  }
}

/* The legs' bodies as the router makes them (eldr__prefill_body_buf,
 * eldr__decode_body_buf into a fresh buffer), handed over for the checks
 * (free()); kv: the prefill's kv_transfer_params as a tree (NULL: none),
 * sent as its compact text. */
static char *prefill_body(const eldr__req *r, size_t *n) {
  eldr__buf b = {0};
  assert_int_equal(eldr__prefill_body_buf(r, &b), 0);
  *n = b.n;
  return b.p;
}

static char *decode_body(const eldr__req *r, json_t *kv, size_t *n) {
  char *kvs = kv ? json_dumps(kv, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  eldr__buf b = {0};
  assert_int_equal(eldr__decode_body_buf(r, kvs, kvs ? strlen(kvs) : 0, &b), 0);
  free(kvs);
  *n = b.n;
  return b.p;
}

static void test_prefill_and_decode_bodies(void **st) {
  (void)st;
  const char *body = "{\"model\":\"m\",\"prompt\":\"Hi there\",\"max_tokens\":64,\"min_tokens\":8,"
                     "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"temperature\":0.5,"
                     "\"max_completion_tokens\":70,\"return_routed_experts\":true}";
  eldr__req r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__req_parse(body, strlen(body), ELDR__API_COMPLETIONS, &r, &d), 0);
  assert_int_equal(r.stream, 1);
  assert_int_equal(r.want_routed_experts, 1);
  assert_string_equal(r.text, "Hi there");
  assert_null(r.root); /* read by the scanner, no tree */
  size_t n = 0;
  char *p = prefill_body(&r, &n);
  assert_int_equal(strlen(p), n);
  json_t *got = load(p);
  json_t *want = load("{\"model\":\"m\",\"prompt\":\"Hi there\",\"max_tokens\":1,\"stream\":false,"
                      "\"temperature\":0.5,\"max_completion_tokens\":1,\"return_routed_experts\":true,"
                      "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                      "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,"
                      "\"remote_port\":null}}");
  assert_true(json_equal(got, want));
  json_decref(got);
  json_decref(want);
  free(p);
  /* key order of the client's body is preserved */
  p = prefill_body(&r, &n);
  assert_true(strstr(p, "\"model\"") < strstr(p, "\"prompt\""));
  free(p);
  json_t *kv = load("{\"do_remote_prefill\":true,\"remote_engine_id\":\"e1\",\"remote_block_ids\":[1,2],"
                    "\"remote_host\":\"10.0.0.1\",\"remote_port\":5600}");
  p = decode_body(&r, kv, &n);
  got = load(p);
  want = load(body);
  json_object_set(want, "kv_transfer_params", kv);
  assert_true(json_equal(got, want));
  assert_int_equal(json_integer_value(json_object_get(got, "min_tokens")), 8);
  assert_int_equal(json_integer_value(json_object_get(got, "max_tokens")), 64);
  json_decref(got);
  json_decref(want);
  free(p);
  /* without max_completion_tokens the prefill leg does not add it */
  eldr__req_free(&r);
  const char *b2 = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello\"},"
                   "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}],\"max_tokens\":5}";
  assert_int_equal(eldr__req_parse(b2, strlen(b2), ELDR__API_CHAT, &r, &d), 0);
  assert_string_equal(r.text, "system: Be brief.\nuser: Hello\n");
  p = prefill_body(&r, &n);
  got = load(p);
  assert_null(json_object_get(got, "max_completion_tokens"));
  assert_true(json_is_false(json_object_get(got, "stream")));
  json_decref(got);
  free(p);
  p = decode_body(&r, NULL, &n);
  got = load(p);
  want = load(b2);
  assert_true(json_equal(got, want));
  json_decref(want);
  json_decref(got);
  free(p);
  eldr__req_free(&r);
  /* token-id prompts */
  const char *b3 = "{\"prompt\":[5,6,7]}";
  assert_int_equal(eldr__req_parse(b3, strlen(b3), ELDR__API_COMPLETIONS, &r, &d), 0);
  assert_int_equal(r.n_ids, 3);
  assert_int_equal(r.ids[2], 7);
  eldr__req_free(&r);
  json_decref(kv);
}

/* The scanner's read of a request equals the jansson path's, read after
 * read into the same (reused) request; what it does not take goes to the
 * tree path with the same result as before. */
static void test_req_scan_equals_tree(void **st) {
  (void)st;
  struct {
    eldr__api api;
    const char *body;
    int scanned; /* the scanner takes it */
  } cases[] = {
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"Hello, how are you today?\",\"max_tokens\":8}", 1},
      {ELDR__API_COMPLETIONS, "{\"prompt\":[\"a\",[1,2],\"b\\u00e9\\n\"],\"n\":2,\"temperature\":0.7,\"top_p\":1}", 1},
      {ELDR__API_COMPLETIONS, "{\"prompt\":[7,8,4294967295],\"min_tokens\":2,\"max_tokens\":3}", 1},
      {ELDR__API_COMPLETIONS, " {\"prompt\":\"x\",\"prompt\":\"y\",\"prompt_logprobs\":1,\"stream\":false} ", 1},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}", 1},
      {ELDR__API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null},{\"role\":\"a\",\"content\":"
                       "[{\"type\":\"text\",\"text\":\"t\"},{\"type\":\"image_url\"}]}],\"top_logprobs\":2,"
                       "\"logprobs\":true}", 1},
      /* errors and what the scanner leaves to jansson */
      {ELDR__API_COMPLETIONS, "{\"prompt\":[7,-1]}", 0},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"x\",\"temperature\":-0.5}", 0},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}", 0},
      {ELDR__API_CHAT, "{\"messages\":[{\"role\":\"u\",\"content\":[{\"type\":\"text\",\"text\":null}]}]}", 0},
      {ELDR__API_CHAT, "{\"messages\":[{\"role\":\"u\"}],\"top_logprobs\":1}", 0},
      {ELDR__API_COMPLETIONS, "{\"prompt\":\"x\"", 0},
  };
  eldr__req r = {0};
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      const char *b = cases[i].body;
      eldr__req t;
      eldr_diag dt = {{0}}, dr = {{0}};
      int rt = eldr__req_parse_tree(b, strlen(b), cases[i].api, &t, &dt);
      int rr = eldr__req_read(b, strlen(b), cases[i].api, &r, &dr);
      if (rr != rt || strcmp(dr.msg, dt.msg) || (!rr && (r.root == NULL) != cases[i].scanned))
        fail_msg("case %zu (%s): read %d '%s', tree %d '%s'", i, b, rr, dr.msg, rt, dt.msg);
      if (!rr) {
        assert_int_equal(r.stream, t.stream);
        assert_int_equal(r.want_routed_experts, t.want_routed_experts);
        assert_int_equal(r.prompt_logprobs, t.prompt_logprobs);
        assert_int_equal(r.text_len, t.text_len);
        assert_memory_equal(r.text, t.text, t.text_len + 1);
        assert_int_equal(r.n_ids, t.n_ids);
        if (t.n_ids) assert_memory_equal(r.ids, t.ids, t.n_ids * sizeof *t.ids);
        size_t n1 = 0, n2 = 0;
        char *p1 = prefill_body(&r, &n1), *p2 = eldr__prefill_body_tree(&t, &n2);
        json_t *j1 = load(p1), *j2 = load(p2);
        assert_true(json_equal(j1, j2));
        json_decref(j1);
        json_decref(j2);
        free(p1);
        free(p2);
      }
      eldr__req_free(&t);
    }
  eldr__req_free(&r);
}

static char *enc(const uint16_t *sel, size_t n, const eldr_shape *s) {
  char *out = NULL;
  size_t len = 0;
  assert_int_equal(eldr_routed_experts_encode(sel, n, s, ELDR_SEL_U8, &out, &len), 0);
  return out;
}

/* splice against a prefill reply carrying pb (npy) with usage.prompt_tokens P */
static int splice(const char *body, size_t len, const char *pb, size_t pl, long long P, char **out, size_t *ol,
                  eldr_diag *d) {
  json_t *pr = json_pack("{s:[{s:s%}],s:{s:I}}", "choices", "routed_experts", pb, pl, "usage", "prompt_tokens",
                         (json_int_t)P);
  assert_non_null(pr);
  int rc = eldr__splice_routed_experts(body, len, pr, out, ol, d);
  json_decref(pr);
  return rc;
}

/* vLLM 0.21 layouts: the prefill's prompt_routed_experts replaces the
 * decoder's; lists (PR #38939): rows replaced at their prompt positions. */
static void test_splice_layouts(void **st) {
  (void)st;
  json_t *pr = load("{\"prompt_routed_experts\":[[[1,2]],[[3,4]]],\"choices\":[{\"routed_experts\":[]}]}");
  const char *db = "{\"prompt_routed_experts\":null,\"choices\":[{\"routed_experts\":[[[5,6]]]}]}";
  char *out = NULL;
  size_t ol = 0;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__splice_routed_experts(db, strlen(db), pr, &out, &ol, &d), 0);
  json_t *j = load(out), *want = load("{\"prompt_routed_experts\":[[[1,2]],[[3,4]]],\"choices\":[{\"routed_experts\":[[[5,6]]]}]}");
  assert_true(json_equal(j, want));
  json_decref(j);
  json_decref(want);
  free(out);
  /* the decoder carries no prompt_routed_experts key: nothing to splice */
  const char *db2 = "{\"choices\":[{\"routed_experts\":[[[5,6]]]}]}";
  assert_int_equal(eldr__splice_routed_experts(db2, strlen(db2), pr, &out, &ol, &d), ELDR_ENOTFOUND);
  json_decref(pr);
  /* lists: prefill rows for prompt tokens [1, 3) of 3 */
  pr = load("{\"choices\":[{\"routed_experts\":[[[1,2]],[[3,4]]]}],\"usage\":{\"prompt_tokens\":3}}");
  const char *dl = "{\"choices\":[{\"routed_experts\":[[[0,0]],[[0,0]],[[0,0]],[[7,7]]]}]}";
  assert_int_equal(eldr__splice_routed_experts(dl, strlen(dl), pr, &out, &ol, &d), 0);
  j = load(out);
  want = load("{\"choices\":[{\"routed_experts\":[[[0,0]],[[1,2]],[[3,4]],[[7,7]]]}]}");
  assert_true(json_equal(j, want));
  json_decref(j);
  json_decref(want);
  free(out);
  /* layouts that differ: an error, the reply relayed unchanged */
  const char *dn = "{\"choices\":[{\"routed_experts\":\"QUJD\"}]}";
  assert_true(eldr__splice_routed_experts(dn, strlen(dn), pr, &out, &ol, &d) < 0);
  assert_null(out);
  json_decref(pr);
}

static void test_splice_and_view(void **st) {
  (void)st;
  eldr_shape s = {2, 8, 2};
  uint16_t pre[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 0, 1, 1, 2, 2};
  uint16_t dec[5 * 4];
  for (int i = 0; i < 20; i++) dec[i] = 7;
  dec[16] = 3; /* a generated row */
  char *pb = enc(pre, 3, &s), *db = enc(dec, 5, &s);
  char body[4096];
  snprintf(body, sizeof body, "{\"id\":\"x\",\"choices\":[{\"index\":0,\"text\":\"t\",\"routed_experts\":\"%s\"}]}", db);
  char *out = NULL;
  size_t ol = 0;
  eldr_diag d = {{0}};
  assert_int_equal(splice(body, strlen(body), pb, strlen(pb), 3, &out, &ol, &d), 0);
  json_t *j = load(out);
  const char *re = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "routed_experts"));
  uint16_t *sel = NULL;
  size_t nt = 0;
  eldr_shape os;
  assert_int_equal(eldr_routed_experts_decode(re, strlen(re), &s, &sel, &nt, &os, &d), 0);
  assert_int_equal(nt, 5);
  assert_memory_equal(sel, pre, sizeof pre);           /* prompt rows from the prefill */
  assert_memory_equal(sel + 12, dec + 12, 8 * sizeof *sel); /* generated rows kept */
  assert_string_equal(json_string_value(json_object_get(j, "id")), "x");
  free(sel);
  json_decref(j);
  free(out);
  /* prefill rows covering only the uncached tail [1, 3): spliced at offset 1 */
  char *pb2 = enc(pre + 4, 2, &s);
  assert_int_equal(splice(body, strlen(body), pb2, strlen(pb2), 3, &out, &ol, &d), 0);
  j = load(out);
  re = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "routed_experts"));
  assert_int_equal(eldr_routed_experts_decode(re, strlen(re), &s, &sel, &nt, &os, &d), 0);
  assert_memory_equal(sel, dec, 4 * sizeof *sel);
  assert_memory_equal(sel + 4, pre + 4, 8 * sizeof *sel);
  free(sel);
  json_decref(j);
  free(out);
  free(pb2);
  /* errors: no routed_experts in the decode reply, bad JSON, other shape */
  assert_int_equal(splice("{\"choices\":[{}]}", 16, pb, strlen(pb), 3, &out, &ol, &d), ELDR_ENOTFOUND);
  assert_true(splice("{", 1, pb, strlen(pb), 3, &out, &ol, &d) < 0);
  eldr_shape s3 = {3, 8, 2};
  uint16_t z[6] = {0};
  char *other = enc(z, 1, &s3);
  assert_int_equal(splice(body, strlen(body), other, strlen(other), 3, &out, &ol, &d), ELDR_ESHAPE);
  /* view */
  uint8_t *buf = NULL;
  size_t cap = 0;
  eldr_re_view v;
  assert_int_equal(eldr_routed_experts_view(pb, strlen(pb), &s, &buf, &cap, &v, &d), 0);
  assert_int_equal(v.rows, 3);
  assert_int_equal(v.dtype, ELDR_SEL_U8);
  assert_int_equal(((const uint8_t *)v.data)[5], 6);
  assert_int_equal(eldr_routed_experts_view(other, strlen(other), &s, &buf, &cap, &v, &d), ELDR_ESHAPE);
  assert_true(eldr_routed_experts_view("!!!!", 4, &s, &buf, &cap, &v, &d) < 0);
  free(buf);
  free(other);
  free(pb);
  free(db);
}

static void test_config(void **st) {
  (void)st;
  eldr_serve_config c;
  eldr_serve_config_default(&c);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_serve_config_validate(&c, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "prefill"));
  const char *j = "{\"port\":9000,\"prefill\":[\"http://127.0.0.1:1\"],\"decode\":[\"http://a:2/\",\"http://b:3\"],"
                  "\"policy\":\"jsq\",\"tau\":0.2,\"retries\":1,\"max_body\":1000,\"health_interval\":0}";
  assert_int_equal(eldr_serve_config_parse(&c, j, strlen(j), &d), 0);
  assert_int_equal(c.port, 9000);
  assert_int_equal(c.n_prefill, 1);
  assert_int_equal(c.n_decode, 2);
  assert_string_equal(c.decode[0], "http://a:2");
  assert_int_equal(c.policy, ELDR_POLICY_JSQ);
  assert_int_equal(c.max_body, 1000);
  assert_int_equal(c.decode_max_batch, 256); /* vLLM's --max-num-seqs default below 70 GiB */
  const char *mb = "{\"decode_max_batch\":1024}";
  assert_int_equal(eldr_serve_config_parse(&c, mb, strlen(mb), &d), 0);
  assert_int_equal(c.decode_max_batch, 1024);
  assert_true(c.fp_own_weight == 1); /* the cost as measured in docs/footprint.md */
  const char *ow = "{\"fp_own_weight\":2.5}";
  assert_int_equal(eldr_serve_config_parse(&c, ow, strlen(ow), &d), 0);
  assert_true(c.fp_own_weight == 2.5);
  assert_true(c.fp_home_weight == 0); /* off */
  const char *hw = "{\"fp_home_weight\":0.1}";
  assert_int_equal(eldr_serve_config_parse(&c, hw, strlen(hw), &d), 0);
  assert_true(c.fp_home_weight == 0.1);
  assert_int_equal(eldr_serve_config_validate(&c, &d), 0);
  eldr_serve_config cp;
  assert_int_equal(eldr_serve_config_copy(&cp, &c), 0);
  assert_string_equal(cp.decode[1], "http://b:3");
  eldr_serve_config_free(&cp);
  struct {
    const char *j, *word;
  } bad[] = {
      {"{\"bogus\":1}", "bogus"},
      {"{\"port\":\"x\"}", "port"},
      {"{\"port\":70000}", "port"},
      {"{\"tau\":3}", "tau"},
      {"{\"decode_max_batch\":0}", "decode_max_batch"},
      {"{\"fp_own_weight\":0}", "fp_own_weight"},
      {"{\"fp_own_weight\":100.5}", "fp_own_weight"},
      {"{\"fp_own_weight\":\"2\"}", "fp_own_weight"},
      {"{\"fp_home_weight\":-0.1}", "fp_home_weight"},
      {"{\"policy\":\"domain\"}", "policy"},
      {"{\"decode\":\"http://a:1\"}", "decode"},
      {"{\"decode\":[\"ftp://a\"]}", "decode[0]"},
      {"{\"prefill\":[\"http://a:0\"]}", "port"},
      {"{\"prefill\":[\"http://a:1/v1\"]}", "path"},
      {"[]", "object"},
      {"{", "JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = eldr_serve_config_parse(&c, bad[i].j, strlen(bad[i].j), &d);
    if (rc == 0 || !strstr(d.msg, bad[i].word)) fail_msg("case %zu: rc %d msg '%s'", i, rc, d.msg);
  }
  /* failed lists leave the old ones */
  assert_int_equal(c.n_decode, 2);
  char host[64];
  int port;
  assert_int_equal(eldr_serve_parse_url("http://[::1]:8080", host, sizeof host, &port, &d), 0);
  assert_string_equal(host, "::1");
  assert_int_equal(port, 8080);
  assert_int_equal(eldr_serve_parse_url("http://h", host, sizeof host, &port, &d), 0);
  assert_int_equal(port, 80);
  assert_int_equal(eldr_serve_config_load(&c, "/nonexistent/eldr.json", &d), ELDR_EIO);
  eldr_serve_config_free(&c);
}


/* eldr bench route's shapes: the MoE rows only (hidden_layers = the MoE
 * layers, as --routed-experts-layers moe sets it) take the model's layer
 * ids whatever their values (Maverick's odd ids up to 47 for 24 rows: this
 * was refused, "layer ids must rise and lie below the hidden layers");
 * vLLM's all-layers form needs ids below the hidden layers, rising. */
static void test_routebench_layer_forms(void **st) {
  (void)st;
  uint32_t ids[4] = {1, 3, 5, 7};
  eldr_routebench_cfg c = {{4, 16, 2}, 2, 4, 1, 1, ids, 4};
  eldr_routebench *b = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_routebench_new(&c, &b, &d), 0); /* MoE rows only */
  eldr_routebench_result r;
  assert_int_equal(eldr_routebench_run(b, 32, &r, &d), 0);
  eldr_routebench_free(b);
  c.hidden_layers = 8; /* all layers: ids 1..7 below 8 */
  assert_int_equal(eldr_routebench_new(&c, &b, &d), 0);
  assert_int_equal(eldr_routebench_run(b, 32, &r, &d), 0);
  eldr_routebench_free(b);
  c.hidden_layers = 7; /* id 7 is not below 7 */
  assert_int_equal(eldr_routebench_new(&c, &b, &d), ELDR_EINVAL);
  uint32_t falling[4] = {1, 5, 3, 7};
  c.layer_ids = falling;
  c.hidden_layers = 4;
  assert_int_equal(eldr_routebench_new(&c, &b, &d), ELDR_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_http_head),
      cmocka_unit_test(test_req_parse_errors),
      cmocka_unit_test(test_prefill_and_decode_bodies),
      cmocka_unit_test(test_req_scan_equals_tree),
      cmocka_unit_test(test_splice_and_view),
      cmocka_unit_test(test_routebench_layer_forms),
      cmocka_unit_test(test_splice_layouts),
      cmocka_unit_test(test_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
