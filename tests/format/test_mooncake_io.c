/* test_mooncake_io.c — the Mooncake trace reader: records as written,
 * blank lines and unknown fields, the record limit, and every error naming
 * the line and the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/mooncake_io.h"

static void test_records(void **st) {
  (void)st;
  static const char buf[] =
      "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": "
      "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n"
      "\r\n"
      "{\"hash_ids\": [0], \"output_length\": 0, \"input_length\": 512, \"timestamp\": 12.5, \"x\": [1]}";
  eldr_mooncake m;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_mooncake_parse(buf, sizeof buf - 1, "t", 0, &m, &d), 0);
  assert_int_equal(m.n, 2);
  assert_int_equal(m.n_ids, 15);
  assert_int_equal(m.rec[0].input_length, 6758);
  assert_int_equal(m.rec[0].output_length, 500);
  assert_int_equal(m.rec[0].n_ids, 14);
  assert_int_equal(m.ids[m.rec[0].ids_off + 13], 13);
  assert_true(m.rec[1].timestamp_ms == 12.5);
  assert_int_equal(m.rec[1].ids_off, 14);
  eldr_mooncake_free(&m);
  assert_int_equal(eldr_mooncake_parse(buf, sizeof buf - 1, "t", 1, &m, &d), 0);
  assert_int_equal(m.n, 1);
  eldr_mooncake_free(&m);
}

/* Each bad line: the code and the message's line and field. */
static void test_errors(void **st) {
  (void)st;
  static const struct {
    const char *line;
    int rc;
    const char *want;
  } cases[] = {
      {"{\"timestamp\": 0, \"input_length\": 2000, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}",
       ELDR_ERANGE, "t:line 2: field 'hash_ids': 3 ids for 2000 tokens (expected 4"},
      {"{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}", ELDR_EPARSE,
       "line 2: field 'timestamp': missing"},
      {"{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}", ELDR_ERANGE,
       "field 'timestamp': negative"},
      {"{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}", ELDR_ERANGE,
       "field 'input_length': 0 out of range"},
      {"{\"timestamp\": 0, \"input_length\": 1.5, \"output_length\": 1, \"hash_ids\": [1]}", ELDR_EPARSE,
       "field 'input_length': not an integer"},
      {"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [-4]}", ELDR_ERANGE,
       "field 'hash_ids': entry 0"},
      {"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": \"0\"}", ELDR_EPARSE,
       "field 'hash_ids': not an array"},
      {"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]", ELDR_EPARSE,
       "line 2: bad JSON"},
      {"[1, 2]", ELDR_EPARSE, "line 2: not a JSON object"},
      {"{\"timestamp\": 0, \"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}",
       ELDR_EPARSE, "line 2: bad JSON"},
      {"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 99999999, \"hash_ids\": [1]}", ELDR_ERANGE,
       "field 'output_length'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char buf[512];
    snprintf(buf, sizeof buf,
             "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [9]}\n%s\n",
             cases[i].line);
    eldr_mooncake m;
    eldr_diag d = {{0}};
    int rc = eldr_mooncake_parse(buf, strlen(buf), "t", 0, &m, &d);
    if (rc != cases[i].rc || !strstr(d.msg, cases[i].want))
      fail_msg("case %zu: rc %d msg '%s'", i, rc, d.msg);
    assert_null(m.rec);
    assert_int_equal(m.n, 0);
  }
  eldr_mooncake m;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_mooncake_parse("\n \n", 3, "t", 0, &m, &d), ELDR_EEMPTY);
  assert_int_equal(eldr_mooncake_load("/nonexistent/mc.jsonl", 0, &m, &d), ELDR_EIO);
  /* a line over the bound */
  size_t n = ELDR_MOONCAKE_MAX_LINE + 2;
  char *big = malloc(n);
  memset(big, ' ', n);
  assert_int_equal(eldr_mooncake_parse(big, n, "t", 0, &m, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "line 1: longer than"));
  free(big);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_records), cmocka_unit_test(test_errors)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
