/* test_serve_sglang_generate.c — SGLang's native API, POST /generate
 * (GenerateReqInput), through the router's SGLang prefill/decode flows
 * (--pd sglang and sglang-exact; src/serve/sglpd.c, docs/sglang.md
 * "Native API") end to end over loopback sockets, in front of emulated
 * SGLang workers (`eldr worker --engine sglang`, in process): one prompt,
 * a batch of texts x n, a batch of token-id prompts, streamed and whole;
 * the decision counted as for the OpenAI routes (the second sight of a
 * prompt predicted from the cache the first one's prefill filled; the exact
 * counts in sglang-exact); bad bodies refused with a 400 naming the field
 * before any worker sees them; /generate refused in the vLLM flow; the
 * emulated worker's own /generate errors in SGLang's form. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "eldr/trace.h"
#include "sgl_rig.h"
#include "support/proc.h"

/* A /generate item as SGLang's tokenizer manager sends it: text, and
 * meta_info with id, finish_reason {"type": "length", ...} when final,
 * prompt_tokens and completion_tokens. */
static void check_item(json_t *it, long want_tokens, int final) {
  if (!json_is_object(it)) fail_msg("not an object");
  if (!json_is_string(json_object_get(it, "text"))) fail_msg("no text");
  json_t *m = json_object_get(it, "meta_info");
  if (!json_is_object(m)) fail_msg("no meta_info");
  assert_true(json_is_string(json_object_get(m, "id")));
  assert_true(json_integer_value(json_object_get(m, "prompt_tokens")) >= 1);
  if (want_tokens >= 0) assert_int_equal(json_integer_value(json_object_get(m, "completion_tokens")), want_tokens);
  json_t *fin = json_object_get(m, "finish_reason");
  if (final) assert_string_equal(json_string_value(json_object_get(fin, "type")), "length");
  else assert_true(json_is_null(fin));
}

/* meta_info.input_token_logprobs: [logprob, id, null] per prompt token,
 * the first logprob null. */
static void check_logprobs(json_t *it) {
  json_t *m = json_object_get(it, "meta_info"), *lp = json_object_get(m, "input_token_logprobs");
  check_item(it, 2, 1);
  if (!json_is_array(lp)) fail_msg("no input_token_logprobs");
  assert_int_equal(json_array_size(lp), json_integer_value(json_object_get(m, "prompt_tokens")));
  assert_true(json_is_null(json_array_get(json_array_get(lp, 0), 0)));
  for (size_t t = 1; t < json_array_size(lp); t++) {
    json_t *e = json_array_get(lp, t);
    assert_true(json_is_real(json_array_get(e, 0)) && json_real_value(json_array_get(e, 0)) < 0);
    assert_true(json_is_integer(json_array_get(e, 1)));
  }
}

static json_t *post_json(int port, const char *body) {
  tc_resp r;
  sf_post_ok(port, "/generate", body, NULL, &r);
  json_t *j = json_loads(r.body, 0, NULL);
  if (!j) fail_msg("not JSON: %s", r.body);
  tc_free(&r);
  return j;
}

/* A streamed /generate: "data: {...}" events, each an item (with "index"
 * when batched), the text growing, then "data: [DONE]". Returns the items'
 * final events seen (finish_reason set). */
static int check_stream(const char *body, int batched) {
  const char *p = body;
  int finals = 0, events = 0, done = 0;
  while ((p = strstr(p, "data: "))) {
    p += 6;
    const char *e = strstr(p, "\n\n");
    if (!e) fail_msg("unterminated event in [%s]", body);
    if (!strncmp(p, "[DONE]", 6)) {
      done = 1;
      assert_null(strstr(e, "data: ")); /* the last event */
      break;
    }
    json_t *j = json_loadb(p, (size_t)(e - p), 0, NULL);
    if (!j) fail_msg("event not JSON: %.*s", (int)(e - p), p);
    int final = !json_is_null(json_object_get(json_object_get(j, "meta_info"), "finish_reason"));
    check_item(j, -1, final);
    assert_int_equal(json_is_integer(json_object_get(j, "index")), batched);
    finals += final;
    events++;
    json_decref(j);
    p = e;
  }
  if (!done || !events) fail_msg("no events or no [DONE]: [%s]", body);
  return finals;
}

static void test_generate_sglang(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 2, &art);
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  /* one prompt: the decode's reply (5 tokens, not the prefill's one) relayed
   * whole; the prefill's meta_info.routed_experts read into the cache */
  snprintf(body, sizeof body, "{\"text\":\"%s\",\"sampling_params\":{\"max_new_tokens\":5,\"temperature\":0},"
           "\"return_routed_experts\":true}", LONG_PROMPT);
  json_t *j = post_json(port, body);
  check_item(j, 5, 1);
  json_t *m = json_object_get(j, "meta_info");
  long pt = (long)json_integer_value(json_object_get(m, "prompt_tokens"));
  assert_true(pt >= 2 * 16);
  /* the decode's meta_info.routed_experts in SGLang's form: base64 of int32
   * (seqlen - 1 = prompt + 4 rows, 48 hidden layers, top-8) */
  const char *re = json_string_value(json_object_get(m, "routed_experts"));
  if (!re) fail_msg("no meta_info.routed_experts");
  size_t bl = strlen(re), raw = bl / 4 * 3 - (bl && re[bl - 1] == '=') - (bl > 1 && re[bl - 2] == '=');
  assert_int_equal(raw, (size_t)(pt + 4) * 48 * 8 * 4);
  json_decref(j);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 1, 10), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"none\"}"), 1);
  /* the same prompt again: decided on the prediction, counted as for the
   * OpenAI routes */
  j = post_json(port, body);
  check_item(j, 5, 1);
  json_decref(j);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"predicted\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"), 1);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"load\",outcome=\"ok\"}"), 1);
  /* a batch of 2 texts x n 2 with the client's own bootstrap fields (a
   * server that does not exist): a list of 4 items, a room each, the
   * router's fields alone reaching the workers; the prefill's list read */
  j = post_json(port, "{\"text\":[\"first prompt of a batch\",\"second prompt of it\"],"
                      "\"sampling_params\":{\"max_new_tokens\":2,\"n\":2},\"bootstrap_host\":\"203.0.113.9\","
                      "\"bootstrap_port\":1,\"bootstrap_room\":[7,8]}");
  assert_int_equal(json_array_size(j), 4);
  for (size_t i = 0; i < 4; i++) check_item(json_array_get(j, i), 2, 1);
  assert_string_not_equal(json_string_value(json_object_get(json_object_get(json_array_get(j, 0), "meta_info"), "id")),
                          json_string_value(json_object_get(json_object_get(json_array_get(j, 1), "meta_info"), "id")));
  json_decref(j);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 3, 10), 0);
  /* return_logprob: the prefill's input_token_logprobs (one per prompt
   * token, the first null) in front of the decode's (none: it never ran the
   * prompt), one reply and a batch's items each */
  j = post_json(port, "{\"text\":\"Log probabilities of a prompt\",\"sampling_params\":{\"max_new_tokens\":2},"
                      "\"return_logprob\":true}");
  check_logprobs(j);
  json_decref(j);
  j = post_json(port, "{\"text\":[\"first of two\",\"the second prompt is longer\"],\"sampling_params\":"
                      "{\"max_new_tokens\":2},\"return_logprob\":[true,true]}");
  assert_int_equal(json_array_size(j), 2);
  for (size_t i = 0; i < 2; i++) check_logprobs(json_array_get(j, i));
  json_decref(j);
  /* token-id prompts: a batch, and one */
  j = post_json(port, "{\"input_ids\":[[101,102,103,104,105],[201,202,203]],\"sampling_params\":{\"max_new_tokens\":3}}");
  assert_int_equal(json_array_size(j), 2);
  for (size_t i = 0; i < 2; i++) check_item(json_array_get(j, i), 3, 1);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(json_array_get(j, 1), "meta_info"), "prompt_tokens")), 3);
  json_decref(j);
  j = post_json(port, "{\"input_ids\":[7,8,9,10],\"sampling_params\":{\"max_new_tokens\":3}}");
  check_item(j, 3, 1);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "meta_info"), "prompt_tokens")), 4);
  json_decref(j);
  /* streamed: SGLang's data: events, the decode's, ending in [DONE] */
  tc_resp r;
  sf_post_ok(port, "/generate", "{\"text\":\"Say something about experts.\",\"sampling_params\":{\"max_new_tokens\":4},"
                                "\"stream\":true}", NULL, &r);
  assert_int_equal(check_stream(r.body, 0), 1);
  tc_free(&r);
  sf_post_ok(port, "/generate", "{\"text\":[\"one streamed prompt\",\"and another\"],\"sampling_params\":"
                                "{\"max_new_tokens\":3},\"stream\":true}", NULL, &r);
  assert_int_equal(check_stream(r.body, 1), 2);
  tc_free(&r);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 9, 10), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"failed\"}"), 0);
  assert_int_equal(rt_metric(port, "eldr_sglang_prefill_total{result=\"abandoned\"}"), 0);
  /* bad bodies: a 400 naming what is wrong, and no worker sees them */
  char series[200];
  snprintf(series, sizeof series, "eldr_worker_requests_total{role=\"decode\",worker=\"%s\"}", g.durl[0]);
  double d0 = rt_metric(port, series);
  static const struct {
    const char *body, *names;
  } bad[] = {
      {"{\"text\":\"x\",\"input_ids\":[1]}", "exactly one of 'text' and 'input_ids'"},
      {"{\"sampling_params\":{\"max_new_tokens\":4}}", "exactly one of 'text' and 'input_ids'"},
      {"{\"text\":[]}", "'text'"},
      {"{\"text\":[\"a\",3]}", "'text'"},
      {"{\"input_ids\":[[1,2],\"x\"]}", "'input_ids'"},
      {"{\"input_ids\":[1,-2]}", "'input_ids'"},
      {"{\"text\":\"x\",\"sampling_params\":\"greedy\"}", "'sampling_params'"},
      {"{\"text\":[\"a\",\"b\"],\"sampling_params\":[{}]}", "'sampling_params'"},
      {"{\"text\":\"x\",\"sampling_params\":{\"max_new_tokens\":-1}}", "'sampling_params.max_new_tokens'"},
      {"{\"text\":\"x\",\"sampling_params\":{\"n\":0}}", "'sampling_params.n'"},
      {"{\"text\":\"x\",\"stream\":\"yes\"}", "'stream'"},
      {"{\"text\":\"x\",\"return_logprob\":[true,false]}", "'return_logprob'"},
      {"{\"text\":\"x\",\"input_embeds\":[[0.5]]}", "'input_embeds'"},
      {"[\"text\"]", "JSON object"},
      {"{\"text\":", "invalid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(tc_post(port, "/generate", bad[i].body, NULL, &r), 0);
    if (r.status != 400 || !strstr(r.body, bad[i].names))
      fail_msg("%s: want 400 naming %s, got %d %s", bad[i].body, bad[i].names, r.status, r.body);
    tc_free(&r);
  }
  assert_true(rt_metric(port, series) == d0);
  for (int i = 0; i < 3; i++) assert_int_equal(worker_idle(engine_port(&g, i), 10), 0);
  rig_end(&g, art);
}

/* --pd sglang-exact: /generate decided on the prefill's published counts,
 * one prompt and a batch alike (the first item's room is polled). */
static void test_generate_exact(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  exact_rig_start(&g, 2, 1, 0.01, &art);
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  snprintf(body, sizeof body, "{\"text\":\"%s\",\"sampling_params\":{\"max_new_tokens\":4}}", LONG_PROMPT);
  json_t *j = post_json(port, body);
  check_item(j, 4, 1);
  json_decref(j);
  j = post_json(port, "{\"text\":[\"a batch decided exactly\",\"on its first prompt\"],"
                      "\"sampling_params\":{\"max_new_tokens\":2},\"stream\":false}");
  assert_int_equal(json_array_size(j), 2);
  json_decref(j);
  tc_resp r;
  sf_post_ok(port, "/generate", "{\"input_ids\":[5,6,7,8,9,10],\"sampling_params\":{\"max_new_tokens\":3},\"stream\":true}",
             NULL, &r);
  assert_int_equal(check_stream(r.body, 0), 1);
  tc_free(&r);
  assert_int_equal(rt_metric(port, "eldr_sglang_decisions_total{signature=\"exact\"}"), 3);
  assert_int_equal(rt_metric(port, "eldr_sglang_exact_total{result=\"exact\"}"), 3);
  assert_int_equal(rt_metric(port, "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"), 3);
  for (int i = 0; i < 3; i++) assert_int_equal(worker_idle(engine_port(&g, i), 10), 0);
  rig_end(&g, art);
}

/* --record: a /generate request is recorded as the OpenAI routes' are,
 * the prefill's counts over the prompt's tokens and the decode's output
 * tokens (a batch's summed over its items, as usage sums choices). */
static void test_generate_record(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 1, &art);
  char dir[128];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_sglgenrec_%d", (int)getpid());
  assert_int_equal(eldr_test_rmtree(dir), 0);
  g.c.record_dir = strdup(dir);
  g.c.record_sample = 1;
  sf_run(&g);
  int port = g.r.port;
  char body[2048];
  snprintf(body, sizeof body, "{\"text\":\"%s\",\"sampling_params\":{\"max_new_tokens\":4}}", LONG_PROMPT);
  json_t *j = post_json(port, body);
  long pt = (long)json_integer_value(json_object_get(json_object_get(j, "meta_info"), "prompt_tokens"));
  json_decref(j);
  j = post_json(port, "{\"text\":[\"a recorded batch\",\"of two prompts\"],\"sampling_params\":{\"max_new_tokens\":3}}");
  json_decref(j);
  assert_int_equal(rt_wait_metric(port, "eldr_sglang_prefill_total{result=\"ok\"}", 2, 10), 0);
  sf_free(&g); /* the recorder writes what is queued and closes */
  DIR *dd = opendir(dir);
  assert_non_null(dd);
  struct dirent *de;
  char path[512] = "";
  while ((de = readdir(dd)))
    if (strstr(de->d_name, ".jsonl")) snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
  closedir(dd);
  eldr_trace *t = NULL;
  eldr_diag d = {{0}};
  if (eldr_trace_load(path, &t, &d)) fail_msg("record %s: %s", path, d.msg);
  assert_int_equal(t->n, 2);
  assert_int_equal(t->req[0].n_prefill, (uint32_t)pt);
  assert_non_null(t->req[0].prefill_counts);
  assert_int_equal(t->req[0].n_decode, 4);
  assert_int_equal(t->req[1].n_decode, 2 * 3);
  eldr_trace_free(t);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  unlink(art);
  free(art);
}

/* The vLLM flow has no native API: /generate is a 404 saying which modes
 * serve it. The emulated SGLang worker's own /generate errors are SGLang's
 * ({"error": {"message": ...}}): a prefill without a room, a bad body. */
static void test_generate_refusals(void **st) {
  (void)st;
  sf_rig g;
  char *art;
  rig_start(&g, 1, &art);
  g.c.pd = ELDR_PD_VLLM;
  sf_run(&g);
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/generate", "{\"text\":\"x\"}", NULL, &r), 0);
  if (r.status != 404 || !strstr(r.body, "--pd sglang")) fail_msg("want 404 naming --pd sglang: %d %s", r.status, r.body);
  tc_free(&r);
  int pp = engine_port(&g, 0);
  assert_int_equal(tc_post(pp, "/generate", "{\"text\":\"x\"}", NULL, &r), 0);
  if (r.status != 400 || !strstr(r.body, "bootstrap_room should not be None"))
    fail_msg("want 400 bootstrap_room: %d %s", r.status, r.body);
  json_t *j = json_loads(r.body, 0, NULL);
  assert_true(json_is_string(json_object_get(json_object_get(j, "error"), "message")));
  json_decref(j);
  tc_free(&r);
  assert_int_equal(tc_post(pp, "/generate", "{\"input_ids\":[1,\"a\"],\"bootstrap_room\":1}", NULL, &r), 0);
  if (r.status != 400 || !strstr(r.body, "input_ids")) fail_msg("want 400 input_ids: %d %s", r.status, r.body);
  tc_free(&r);
  rig_end(&g, art);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generate_sglang),
      cmocka_unit_test(test_generate_exact),
      cmocka_unit_test(test_generate_record),
      cmocka_unit_test(test_generate_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
