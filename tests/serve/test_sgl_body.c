/* test_sgl_body.c — the body of both legs of an SGLang prefill/decode
 * request (serve_internal.h, eldr__sgl_leg_body): the bootstrap fields set
 * as SGLang's gateway sets them, a room per item, the client's own
 * bootstrap fields never passed on, every other member kept; and each body
 * accepted by the emulated SGLang prefill and decode workers' request
 * checks (the SGLang reading in src/worker/sgl_req.c), where the gateway's
 * B-rooms form of a batch with n > 1 is refused for sharing rooms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include "eldr/worker.h"
#include "serve/serve_internal.h"
#include "worker/worker_internal.h"

static struct event_base *g_base;
static eldr_worker *g_w[2]; /* SGLang prefill, decode (their loop never runs) */

static int setup(void **st) {
  (void)st;
  g_base = event_base_new();
  for (int i = 0; i < 2; i++) {
    eldr_worker_config c;
    eldr_worker_config_default(&c);
    c.model = "olmoe-1b-7b";
    c.port = 0;
    c.engine = ELDR_WORKER_ENGINE_SGLANG;
    c.role = i ? ELDR_WORKER_DECODE : ELDR_WORKER_PREFILL;
    c.bootstrap_port = 0;
    if (!g_base || eldr_worker_new(g_base, &c, &g_w[i], NULL) < 0) return -1;
  }
  return 0;
}

static int teardown(void **st) {
  (void)st;
  for (int i = 0; i < 2; i++) eldr_worker_free(g_w[i]);
  event_base_free(g_base);
  return 0;
}

/* Both emulated SGLang workers take body (0), or the status of the first
 * that refuses it, its message in err. */
static int workers_take(const char *body, int chat /* eldr__api */, char *err, size_t cap) {
  for (int i = 0; i < 2; i++) {
    int st = eldr__worker_check_request(g_w[i], body, strlen(body), chat, err, cap);
    if (st) return st;
  }
  return 0;
}

static json_t *build(const char *client, eldr__api api, const char *host, int port, const uint64_t *rooms,
                     uint32_t n) {
  eldr__buf b = {0};
  eldr_diag d = {{0}};
  int rc = eldr__sgl_leg_body(client, strlen(client), api, host, port, rooms, n, &b, &d);
  if (rc) fail_msg("eldr__sgl_leg_body: %d %s", rc, d.msg);
  char err[400];
  int st = port > 0 ? workers_take(b.p, (int)api, err, sizeof err) : 0;
  if (st) fail_msg("the emulated SGLang workers refuse %s: %d %s", b.p, st, err);
  json_t *j = json_loads(b.p, 0, NULL);
  assert_non_null(j);
  eldr__buf_free(&b);
  return j;
}

/* every member but the bootstrap fields is the client's */
static void same_rest(json_t *got, const char *client) {
  json_t *c = json_loads(client, 0, NULL), *g = json_deep_copy(got);
  const char *k[3] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};
  for (int i = 0; i < 3; i++) {
    json_object_del(c, k[i]);
    json_object_del(g, k[i]);
  }
  assert_true(json_equal(c, g));
  json_decref(c);
  json_decref(g);
}

static void test_single(void **st) {
  (void)st;
  /* a hostile client names a room and a bootstrap server: both replaced */
  const char *cl = "{\"prompt\":\"hello world\",\"max_tokens\":3,\"stream\":true,\"bootstrap_host\":\"evil\","
                   "\"bootstrap_port\":1,\"bootstrap_room\":7,\"bootstrap_room\":8}";
  uint64_t room = 9223372036854775807ull;
  json_t *j = build(cl, ELDR__API_COMPLETIONS, "10.0.0.5", 8998, &room, 1);
  assert_string_equal(json_string_value(json_object_get(j, "bootstrap_host")), "10.0.0.5");
  assert_int_equal(json_integer_value(json_object_get(j, "bootstrap_port")), 8998);
  assert_true((uint64_t)json_integer_value(json_object_get(j, "bootstrap_room")) == room);
  same_rest(j, cl);
  json_decref(j);
  /* no bootstrap port given with the prefill worker: null, as the gateway */
  room = 3;
  j = build("{\"prompt\":\"x\"}", ELDR__API_COMPLETIONS, "h", 0, &room, 1);
  assert_true(json_is_null(json_object_get(j, "bootstrap_port")));
  json_decref(j);
}

static void check_arrays(json_t *j, const uint64_t *rooms, uint32_t n) {
  const char *k[3] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};
  for (int i = 0; i < 3; i++) {
    json_t *a = json_object_get(j, k[i]);
    assert_true(json_is_array(a));
    assert_int_equal(json_array_size(a), n);
  }
  for (uint32_t i = 0; i < n; i++)
    assert_true((uint64_t)json_integer_value(json_array_get(json_object_get(j, "bootstrap_room"), i)) == rooms[i]);
}

static void test_arrays(void **st) {
  (void)st;
  uint64_t rooms[8] = {11, 12, 13, 14, 15, 16, 17, 18};
  /* chat, n = 3: the gateway's get_chat_batch_size, a room per sample */
  const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":3,\"max_tokens\":2}";
  json_t *j = build(chat, ELDR__API_CHAT, "p0", 8998, rooms, 3);
  check_arrays(j, rooms, 3);
  same_rest(j, chat);
  json_decref(j);
  /* a batch of 2 prompts x n 2: 4 items, a room each */
  const char *batch = "{\"prompt\":[\"a b\",\"c d\"],\"n\":2,\"max_tokens\":2}";
  j = build(batch, ELDR__API_COMPLETIONS, "p0", 8998, rooms, 4);
  check_arrays(j, rooms, 4);
  json_decref(j);
  /* the gateway's form (B = 2 rooms for 2 x 2 items) is the one SGLang
   * repeats n times: samples of a prompt share a room, which the emulator
   * refuses as SGLang would hang the later one */
  char err[400];
  const char *gw = "{\"prompt\":[\"a b\",\"c d\"],\"n\":2,\"bootstrap_host\":[\"p0\",\"p0\"],"
                   "\"bootstrap_port\":[8998,8998],\"bootstrap_room\":[11,12]}";
  assert_int_equal(workers_take(gw, 0, err, sizeof err), 400);
  assert_non_null(strstr(err, "share bootstrap_room"));
  /* token-id prompts: one array of ids is one prompt, an array of them a batch */
  uint32_t items;
  eldr_diag d = {{0}};
  const char *ids1 = "{\"prompt\":[1,2,3]}", *ids2 = "{\"prompt\":[[1,2],[3]],\"n\":3}";
  assert_int_equal(eldr__sgl_items(ids1, strlen(ids1), ELDR__API_COMPLETIONS, &items, &d), 0);
  assert_int_equal(items, 1);
  assert_int_equal(eldr__sgl_items(ids2, strlen(ids2), ELDR__API_COMPLETIONS, &items, &d), 0);
  assert_int_equal(items, 6);
}

/* SGLang's /generate (GenerateReqInput): a list of texts, or of id lists,
 * is a batch; one list of ids is one prompt; n is sampling_params.n. Each
 * item gets its room, and the emulated workers take the body. */
static void test_generate(void **st) {
  (void)st;
  uint64_t rooms[8] = {21, 22, 23, 24, 25, 26, 27, 28};
  const char *one = "{\"text\":\"hello\",\"sampling_params\":{\"max_new_tokens\":3},\"bootstrap_room\":[1,2]}";
  json_t *j = build(one, ELDR__API_GENERATE, "p0", 8998, rooms, 1);
  assert_true((uint64_t)json_integer_value(json_object_get(j, "bootstrap_room")) == rooms[0]);
  same_rest(j, one);
  json_decref(j);
  const char *texts = "{\"text\":[\"a b\",\"c d\"],\"sampling_params\":{\"max_new_tokens\":2,\"n\":2}}";
  j = build(texts, ELDR__API_GENERATE, "p0", 8998, rooms, 4);
  check_arrays(j, rooms, 4);
  same_rest(j, texts);
  json_decref(j);
  const char *idb = "{\"input_ids\":[[1,2],[3],[4,5,6]],\"sampling_params\":[{},{},{}]}";
  j = build(idb, ELDR__API_GENERATE, "p0", 8998, rooms, 3);
  check_arrays(j, rooms, 3);
  json_decref(j);
  j = build("{\"input_ids\":[1,2,3]}", ELDR__API_GENERATE, "p0", 8998, rooms, 1);
  assert_true(json_is_integer(json_object_get(j, "bootstrap_room")));
  json_decref(j);
  /* the prefill's body: whole, with the rows */
  eldr__buf b = {0};
  eldr_diag d = {{0}};
  assert_int_equal(eldr__sgl_prefill_body(texts, strlen(texts), ELDR__API_GENERATE, "p0", 8998, rooms, 4, &b, &d), 0);
  j = json_loads(b.p, 0, NULL);
  assert_true(json_is_false(json_object_get(j, "stream")) && json_is_true(json_object_get(j, "return_routed_experts")));
  json_decref(j);
  eldr__buf_free(&b);
  /* errors name the field */
  uint32_t items;
  assert_int_equal(eldr__sgl_items("{\"text\":[]}", 11, ELDR__API_GENERATE, &items, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "'text'"));
  const char *badn = "{\"text\":\"x\",\"sampling_params\":{\"n\":0}}";
  assert_int_equal(eldr__sgl_items(badn, strlen(badn), ELDR__API_GENERATE, &items, &d), ELDR_EINVAL);
  assert_non_null(strstr(d.msg, "'n'"));
}

/* The prefill's meta_info.input_token_logprobs in front of the decode's,
 * one reply or item by item; anything else leaves the decode's reply. */
static void test_merge_logprobs(void **st) {
  (void)st;
  const char *pre = "{\"text\":\" a\",\"meta_info\":{\"input_token_logprobs\":[[null,5,null],[-1.5,6,null]]}}";
  const char *dec = "{\"text\":\" a b\",\"meta_info\":{\"id\":\"x\",\"input_token_logprobs\":[[-0.25,7,null]]}}";
  eldr__buf b = {0};
  eldr_diag d = {{0}};
  assert_int_equal(eldr__sgl_merge_logprobs(pre, strlen(pre), dec, strlen(dec), &b, &d), 0);
  assert_string_equal(b.p, "{\"text\":\" a b\",\"meta_info\":{\"id\":\"x\",\"input_token_logprobs\":"
                           "[[null,5,null],[-1.5,6,null],[-0.25,7,null]]}}");
  char lp[600], ld[600];
  snprintf(lp, sizeof lp, "[%s,%s]", pre, pre);
  snprintf(ld, sizeof ld, "[%s,%s]", dec, dec);
  assert_int_equal(eldr__sgl_merge_logprobs(lp, strlen(lp), ld, strlen(ld), &b, &d), 0);
  json_t *j = json_loads(b.p, 0, NULL);
  for (size_t i = 0; i < 2; i++)
    assert_int_equal(json_array_size(json_object_get(json_object_get(json_array_get(j, i), "meta_info"),
                                                     "input_token_logprobs")), 3);
  json_decref(j);
  /* nothing to merge: the decode has none, shapes differ, not JSON */
  const char *none = "{\"text\":\"\",\"meta_info\":{}}";
  assert_int_equal(eldr__sgl_merge_logprobs(pre, strlen(pre), none, strlen(none), &b, &d), 1);
  assert_int_equal(eldr__sgl_merge_logprobs(lp, strlen(lp), dec, strlen(dec), &b, &d), 1);
  snprintf(lp, sizeof lp, "[%s]", pre);
  assert_int_equal(eldr__sgl_merge_logprobs(lp, strlen(lp), ld, strlen(ld), &b, &d), 1);
  assert_int_equal(eldr__sgl_merge_logprobs("{", 1, dec, strlen(dec), &b, &d), 1);
  eldr__buf_free(&b);
}

static void test_errors(void **st) {
  (void)st;
  uint64_t rooms[2] = {1, 2}, big = (uint64_t)INT64_MAX + 1;
  eldr__buf b = {0};
  struct {
    const char *body;
    const uint64_t *rooms;
    uint32_t n;
    int rc;
    const char *msg;
  } cases[] = {
      {"{\"prompt\":", rooms, 1, ELDR_EPARSE, "not valid JSON"},
      {"[1]", rooms, 1, ELDR_EINVAL, "JSON object"},
      {"{\"prompt\":\"x\",\"n\":0}", rooms, 1, ELDR_EINVAL, "'n'"},
      {"{\"prompt\":\"x\",\"n\":\"2\"}", rooms, 1, ELDR_EINVAL, "'n'"},
      {"{\"prompt\":[]}", rooms, 1, ELDR_EINVAL, "empty array"},
      {"{\"prompt\":\"x\",\"n\":129}", rooms, 1, ELDR_EINVAL, "at most 128"},
      {"{\"prompt\":\"x\",\"n\":2}", rooms, 1, ELDR_EINVAL, "1 rooms for 2 items"},
      {"{\"prompt\":\"x\"}", &big, 1, ELDR_EINVAL, "2^63-1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    eldr_diag d = {{0}};
    int rc = eldr__sgl_leg_body(cases[i].body, strlen(cases[i].body), ELDR__API_COMPLETIONS, "h", 1, cases[i].rooms,
                                cases[i].n, &b, &d);
    if (rc != cases[i].rc || !strstr(d.msg, cases[i].msg)) fail_msg("case %zu: %d '%s'", i, rc, d.msg);
  }
  eldr_diag d = {{0}};
  assert_int_equal(eldr__sgl_leg_body("{}", 2, ELDR__API_COMPLETIONS, "", 1, rooms, 1, &b, &d), ELDR_EINVAL);
  eldr__buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_single),
      cmocka_unit_test(test_arrays),
      cmocka_unit_test(test_generate),
      cmocka_unit_test(test_merge_logprobs),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
