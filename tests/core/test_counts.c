/* test_counts.c — the single counting routine, all dtypes, masks and errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/counts.h"
#include "eldr/routed_experts.h"
#include "eldr/rng.h"

static void test_shape_validate(void **state) {
  (void)state;
  eldr_diag d = {{0}};
  eldr_shape ok = {24, 128, 1};
  assert_int_equal(eldr_shape_validate(&ok, &d), 0);
  eldr_shape bad_k = {24, 8, 9};
  assert_int_equal(eldr_shape_validate(&bad_k, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "top_k"));
  eldr_shape bad_l = {0, 8, 1};
  assert_int_equal(eldr_shape_validate(&bad_l, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "num_layers"));
  eldr_shape bad_e = {2, ELDR_MAX_EXPERTS + 1, 1};
  assert_int_equal(eldr_shape_validate(&bad_e, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "num_experts"));
}

/* 2 tokens x 2 layers x 2 slots, every dtype, against hand counts. */
static void test_all_dtypes(void **state) {
  (void)state;
  const eldr_shape s = {2, 4, 2};
  const int ids[8] = {0, 3, 1, 1, 3, 2, 0, 1};
  /* layer 0: tokens give {0,3} and {3,2}; layer 1: {1,1} and {0,1} */
  const uint32_t expect[8] = {1, 0, 1, 2, /* layer 1 */ 1, 3, 0, 0};
  uint8_t u8[8], u16le[16], i32le[32];
  uint16_t u16[8];
  for (int i = 0; i < 8; i++) {
    u8[i] = (uint8_t)ids[i];
    u16le[2 * i] = (uint8_t)ids[i];
    u16le[2 * i + 1] = 0;
    for (int b = 0; b < 4; b++) i32le[4 * i + b] = b ? 0 : (uint8_t)ids[i];
    u16[i] = (uint16_t)ids[i];
  }
  const void *raws[4] = {u8, u16le, i32le, u16};
  const eldr_sel_dtype dts[4] = {ELDR_SEL_U8, ELDR_SEL_U16LE, ELDR_SEL_I32LE, ELDR_SEL_U16};
  for (int k = 0; k < 4; k++) {
    uint32_t c[8] = {0};
    assert_int_equal(eldr_counts_accumulate(&s, raws[k], dts[k], 2, c, NULL), 0);
    assert_memory_equal(c, expect, sizeof c);
    /* accumulates: a second call doubles */
    assert_int_equal(eldr_counts_accumulate(&s, raws[k], dts[k], 2, c, NULL), 0);
    for (int i = 0; i < 8; i++) assert_int_equal(c[i], 2 * expect[i]);
  }
  assert_int_equal(eldr_sel_dtype_size(ELDR_SEL_I32LE), 4);
}

static void test_range_errors(void **state) {
  (void)state;
  const eldr_shape s = {2, 4, 2};
  uint8_t u8[8] = {0, 1, 2, 3, 0, 4, 1, 1}; /* id 4 at flat index 5 */
  uint32_t c[8] = {0};
  size_t bad = 99;
  assert_int_equal(eldr_counts_accumulate(&s, u8, ELDR_SEL_U8, 2, c, &bad), ELDR_ERANGE);
  assert_int_equal(bad, 5);
  /* negative int32 */
  uint8_t i32[32] = {0};
  i32[4 * 3 + 0] = 0xff, i32[4 * 3 + 1] = 0xff, i32[4 * 3 + 2] = 0xff, i32[4 * 3 + 3] = 0xff;
  memset(c, 0, sizeof c);
  assert_int_equal(eldr_counts_accumulate(&s, i32, ELDR_SEL_I32LE, 2, c, &bad), ELDR_ERANGE);
  assert_int_equal(bad, 3);
  /* u16 above E */
  uint16_t u16[8] = {0, 0, 0, 0, 0, 0, 0, 300};
  assert_int_equal(eldr_counts_accumulate(&s, u16, ELDR_SEL_U16, 2, c, &bad), ELDR_ERANGE);
  assert_int_equal(bad, 7);
}

static void test_masked(void **state) {
  (void)state;
  const eldr_shape s = {3, 4, 1};
  uint8_t u8[6] = {1, 2, 3, /* token 1 */ 1, 9, 0}; /* 9 is out of range on layer 1 */
  uint8_t mask[3] = {1, 0, 1};
  uint32_t c[12] = {0};
  /* layer 1 is skipped unread, so its bad id is not an error */
  assert_int_equal(eldr_counts_accumulate_masked(&s, u8, ELDR_SEL_U8, 2, mask, c, NULL), 0);
  const uint32_t expect[12] = {0, 2, 0, 0, /* layer 1 */ 0, 0, 0, 0, /* layer 2 */ 1, 0, 0, 1};
  assert_memory_equal(c, expect, sizeof c);
  memset(c, 0, sizeof c);
  assert_int_equal(eldr_counts_accumulate(&s, u8, ELDR_SEL_U8, 2, c, NULL), ELDR_ERANGE);
}

/* The router's masked decode equals the full decode restricted to the mask,
 * across chunk boundaries (4k tokens of a 48 x 128 x 8 model). */
static void test_routed_experts_masked_equals_full(void **state) {
  (void)state;
  const eldr_shape s = {48, 128, 8};
  const size_t T = 4096, n = T * 48 * 8, LE = 48 * 128;
  uint16_t *sel = malloc(n * sizeof *sel);
  eldr_rng r;
  eldr_rng_seed(&r, 5);
  for (size_t i = 0; i < n; i++) sel[i] = (uint16_t)eldr_rng_below(&r, 128);
  char *b64 = NULL;
  size_t len = 0;
  assert_int_equal(eldr_routed_experts_encode(sel, T, &s, ELDR_SEL_U8, &b64, &len), 0);
  uint8_t mask[48] = {0};
  for (size_t l = 1; l < 48; l += 3) mask[l] = 1;
  uint32_t *full = calloc(LE, sizeof *full), *part = calloc(LE, sizeof *part);
  size_t nt = 0;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_routed_experts_count(b64, len, &s, full, &nt, &d), 0);
  assert_int_equal(nt, T);
  assert_int_equal(eldr_routed_experts_count_masked(b64, len, &s, mask, part, &nt, &d), 0);
  for (size_t l = 0; l < 48; l++)
    for (size_t e = 0; e < 128; e++)
      assert_int_equal(part[l * 128 + e], mask[l] ? full[l * 128 + e] : 0);
  free(part);
  free(full);
  free(b64);
  free(sel);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shape_validate),
      cmocka_unit_test(test_all_dtypes),
      cmocka_unit_test(test_range_errors),
      cmocka_unit_test(test_masked),
      cmocka_unit_test(test_routed_experts_masked_equals_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
