/* test_accesslog.c — --access-log: one JSON line per completion request
 * with id, policy, decision, decoder, similarity, TTFT, TPOT, status; a
 * streamed reply has a TPOT, a whole one does not; a failed request logs
 * the status the client got. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "support/proc.h"

static void test_one_line_per_request(void **st) {
  (void)st;
  char path[128];
  snprintf(path, sizeof path, "/tmp/eldr_test_accesslog_%d.jsonl", (int)getpid());
  unlink(path);
  sf_rig g;
  sf_start(&g, 1, NULL, 1, NULL);
  fx_worker *a = g.d[0];
  g.c.retries = 0;
  g.c.policy = ELDR_POLICY_JSQ;
  g.c.access_log = strdup(path);
  sf_run(&g);
  tc_resp resp;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a\",\"stream\":true}", "X-Request-Id: s1\r\n", &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"b\"}", "X-Request-Id: w2\r\n", &resp), 0);
  assert_int_equal(resp.status, 200);
  tc_free(&resp);
  fx_behaviour bad = fx_defaults();
  bad.status = 500;
  fx_set(a, &bad);
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"c\"}", "X-Request-Id: f3\r\n", &resp), 0);
  assert_int_equal(resp.status, 502);
  tc_free(&resp);
  sf_stop(&g); /* the access log is flushed and closed */
  char *text = eldr_test_slurp(path, NULL);
  assert_non_null(text);
  json_t *line[3] = {NULL, NULL, NULL};
  int n = 0;
  for (char *s = text, *e; *s && n < 4; s = e + 1) {
    e = strchr(s, '\n');
    assert_non_null(e);
    assert_true(n < 3);
    line[n++] = json_loadb(s, (size_t)(e - s), 0, NULL);
    assert_non_null(line[n - 1]);
  }
  assert_int_equal(n, 3);
  const char *ids[] = {"s1", "w2", "f3"};
  for (int i = 0; i < 3; i++) {
    assert_string_equal(json_string_value(json_object_get(line[i], "id")), ids[i]);
    assert_string_equal(json_string_value(json_object_get(line[i], "policy")), "jsq");
    assert_string_equal(json_string_value(json_object_get(line[i], "decision")), "load");
    assert_string_equal(json_string_value(json_object_get(line[i], "decoder")), fx_url(a));
    assert_true(json_is_null(json_object_get(line[i], "similarity"))); /* load decision */
  }
  assert_true(json_real_value(json_object_get(line[0], "ttft_ms")) > 0);
  /* the prefill's end: after the arrival, before the first decode byte and the end */
  for (int i = 0; i < 2; i++) {
    double pf = json_real_value(json_object_get(line[i], "prefill_ms"));
    assert_true(pf > 0);
    assert_true(pf <= json_real_value(json_object_get(line[i], "ttft_ms")));
    assert_true(pf <= json_real_value(json_object_get(line[i], "e2e_ms")));
  }
  assert_true(json_real_value(json_object_get(line[0], "tpot_ms")) >= 0); /* streamed: several events */
  assert_true(json_is_real(json_object_get(line[0], "tpot_ms")));
  assert_true(json_is_null(json_object_get(line[1], "tpot_ms")));     /* whole reply */
  assert_int_equal(json_integer_value(json_object_get(line[0], "status")), 200);
  assert_int_equal(json_integer_value(json_object_get(line[2], "status")), 502);
  assert_string_equal(json_string_value(json_object_get(line[2], "outcome")), "upstream_error");
  for (int i = 0; i < 3; i++) json_decref(line[i]);
  free(text);
  unlink(path);
  sf_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_line_per_request)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
