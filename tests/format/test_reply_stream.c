/* test_reply_stream.c — the stream collector (eldr/reply_stream.h): the
 * event carrying routed_experts is kept whatever the split, data lines are
 * joined, "\r\n" line ends and comments are taken, a null routed_experts is
 * not kept, the last one wins, events over the bound are skipped and
 * counted without losing the next one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/reply_stream.h"

static const char *const STREAM =
    "data: {\"choices\":[{\"index\":0,\"text\":\" a\",\"finish_reason\":null}]}\n\n"
    ": keep-alive comment\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\" b\",\"routed_experts\": null}]}\r\n\r\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\" c\",\"finish_reason\":\"length\",\n"
    "data: \"routed_experts\":\"QUJD\"}]}\n\n"
    "data: [DONE]\n\n";
static const char *const WANT =
    "{\"choices\":[{\"index\":0,\"text\":\" c\",\"finish_reason\":\"length\",\n\"routed_experts\":\"QUJD\"}]}";

static void test_splits(void **st) {
  (void)st;
  const size_t n = strlen(STREAM);
  for (size_t step = 1; step <= n; step++) {
    eldr_re_stream s;
    eldr_re_stream_init(&s, 0);
    for (size_t i = 0; i < n; i += step) eldr_re_stream_feed(&s, STREAM + i, i + step > n ? n - i : step);
    size_t kn;
    const char *k = eldr_re_stream_kept(&s, &kn);
    if (!k || kn != strlen(WANT) || strcmp(k, WANT)) fail_msg("step %zu: kept '%s'", step, k ? k : "(none)");
    assert_int_equal(s.events, 5);
    assert_int_equal(s.dropped, 0);
    size_t tn;
    char *t = eldr_re_stream_take(&s, &tn);
    assert_string_equal(t, WANT);
    assert_null(eldr_re_stream_kept(&s, NULL));
    free(t);
    eldr_re_stream_free(&s);
  }
}

/* The last event carrying routed_experts wins; one over the bound is
 * skipped (counted) and the next one is still read. */
static void test_last_and_bound(void **st) {
  (void)st;
  eldr_re_stream s;
  eldr_re_stream_init(&s, 80);
  eldr_re_stream_feed(&s, "data: {\"routed_experts\":\"first\"}\n\n", 35);
  char big[300];
  int bl = snprintf(big, sizeof big, "data: {\"routed_experts\":\"%0200d\"}\n\n", 0);
  eldr_re_stream_feed(&s, big, (size_t)bl);
  assert_int_equal(s.dropped, 1);
  assert_string_equal(eldr_re_stream_kept(&s, NULL), "{\"routed_experts\":\"first\"}");
  eldr_re_stream_feed(&s, "data: {\"routed_experts\":\"second\"}\n\ndata: [DONE]\n\n", 50);
  assert_string_equal(eldr_re_stream_kept(&s, NULL), "{\"routed_experts\":\"second\"}");
  assert_int_equal(s.events, 3);
  eldr_re_stream_free(&s);
  /* no routed_experts anywhere: nothing kept */
  eldr_re_stream_init(&s, 0);
  eldr_re_stream_feed(&s, "data: {\"text\":\"routed_experts\"}\n\n", 34);
  assert_null(eldr_re_stream_kept(&s, NULL));
  eldr_re_stream_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_splits),
      cmocka_unit_test(test_last_and_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
