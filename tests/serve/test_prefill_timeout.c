/* test_prefill_timeout.c — a prefill leg that times out is answered 504
 * (docs/serve.md, Faults), also when no other prefill worker is left to
 * retry on (it was 502 there: issue 26); a failure that is not a timeout
 * stays 502. Fixture workers on real sockets behind the in-process router. */
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

static void run(int np, const fx_behaviour *pb, int expect_status, const char *expect_words, int attempts) {
  sf_rig g;
  sf_start(&g, np, pb, 1, NULL);
  g.c.threads = 1;
  g.c.prefill_timeout_s = 0.3;
  g.c.retries = 2;
  sf_run(&g);
  tc_resp r;
  assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a b c\",\"max_tokens\":2}", NULL, &r), 0);
  if (r.status != expect_status || !strstr(r.body, expect_words))
    fail_msg("%d prefill worker(s): %d %s (wanted %d '%s')", np, r.status, r.body, expect_status, expect_words);
  tc_free(&r);
  size_t sent = 0;
  for (int i = 0; i < np; i++) sent += fx_count(g.p[i], "/v1/completions");
  assert_int_equal(sent, (size_t)attempts);
  const char *outcome = expect_status == 504 ? "timeout" : "upstream_error";
  char s[160];
  snprintf(s, sizeof s, "eldr_requests_total{policy=\"eldr\",decision=\"none\",outcome=\"%s\"}", outcome);
  assert_int_equal(rt_metric(g.r.port, s), 1);
  sf_free(&g);
}

static void test_prefill_timeout_is_504(void **st) {
  (void)st;
  fx_behaviour hang = fx_defaults();
  hang.hang = 1;
  /* one worker: it times out, nobody is left to retry on */
  run(1, &hang, 504, "no other healthy prefill worker", 1);
  /* two: both time out, the retries are spent on them */
  run(2, &hang, 504, "timed out", 2);
  /* a 5xx is not a timeout: 502 */
  fx_behaviour err = fx_defaults();
  err.status = 503;
  run(1, &err, 502, "no other healthy prefill worker", 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_timeout_is_504),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
