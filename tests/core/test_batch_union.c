/* test_batch_union.c — the batch-union kernel's three paths (two words per
 * layer, up to four, and one bit at a time) against a plain per-expert
 * count, on random batches of every width. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/batch_union.h"
#include "eldr/rng.h"

static void check_shape(uint32_t L, uint32_t E, uint32_t K) {
  eldr_shape s = {L, E, K};
  eldr_union u;
  assert_int_equal(eldr_union_init(&u, &s), 0);
  eldr_rng r;
  eldr_rng_seed(&r, E * 131 + K);
  const size_t B = 24;
  uint16_t *sel = malloc(B * L * K * sizeof *sel);
  uint8_t *seen = calloc((size_t)L * E, 1);
  uint32_t *per = calloc(L, sizeof *per);
  uint64_t *tb = calloc(eldr_union_token_words(&s), sizeof *tb);
  assert_non_null(sel);
  assert_non_null(seen);
  assert_non_null(per);
  assert_non_null(tb);
  for (int round = 0; round < 20; round++) {
    size_t n = 1 + (size_t)eldr_rng_below(&r, B);
    memset(seen, 0, (size_t)L * E);
    eldr_union_clear(&u);
    eldr_union ub = u; /* the same union built from per-token bitsets */
    ub.bits = calloc(L * u.W, sizeof *ub.bits);
    assert_non_null(ub.bits);
    for (size_t j = 0; j < n; j++) {
      uint16_t *t = sel + j * L * K;
      for (uint32_t l = 0; l < L; l++)
        for (uint32_t k = 0; k < K; k++) {
          /* the extremes too: expert 0 and E - 1 */
          uint32_t e = round == 0 ? (k % 2 ? E - 1 : 0) : (uint32_t)eldr_rng_below(&r, E);
          t[l * K + k] = (uint16_t)e;
          seen[(size_t)l * E + e] = 1;
        }
      eldr_union_add_token(&u, t);
      memset(tb, 0, eldr_union_token_words(&s) * sizeof *tb);
      eldr_union_set_bits(tb, L, K, u.W, t);
      eldr_union_add_bits(&ub, tb);
    }
    uint64_t want = 0;
    for (uint32_t l = 0; l < L; l++) {
      uint32_t c = 0;
      for (uint32_t e = 0; e < E; e++) c += seen[(size_t)l * E + e];
      want += c;
      (void)eldr_union_count(&u, per);
      assert_int_equal(per[l], c);
    }
    assert_int_equal(eldr_union_count(&u, NULL), want);
    assert_int_equal(eldr_union_count(&ub, NULL), want);
    assert_memory_equal(u.bits, ub.bits, L * u.W * sizeof *u.bits);
    free(ub.bits);
  }
  free(tb);
  free(per);
  free(seen);
  free(sel);
  eldr_union_free(&u);
}

static void test_every_width(void **st) {
  (void)st;
  static const uint32_t shapes[][3] = {{3, 1, 1},    {4, 64, 8},   {5, 65, 3},  {48, 128, 8},
                                       {24, 128, 1}, {2, 129, 4},  {58, 256, 8}, {3, 200, 16},
                                       {3, 257, 8},  {2, 1000, 20}, {1, 4096, 4}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    check_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_width)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
