/* test_batch_union.c — the batch-union kernel's three paths (two words per
 * layer, up to four, and one bit at a time) against a plain per-expert
 * count, on random batches of every width; and the whole-batch kernels over
 * compact rows (bitsets, one-byte ids) and the ids8-to-bitset rows, on every
 * path this CPU runs (portable, AVX2, AVX-512), against the same reference
 * union on random traces of every shape they take. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/cpu.h"
#include "support/levels.h"
#include "eldr/batch_union.h"
#include "eldr/counts.h"
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

/* eldr_union_rows_bits / _ids8 on n random rows against the reference:
 * distinct ids per layer counted one by one. Rows are placed at odd offsets
 * of one buffer (any alignment), the last one at the buffer's end (the ids8
 * kernel may read ELDR_UNION_IDS8_PAD bytes past it). */
/* path: 0 portable, 1 AVX2, 2 AVX-512 (each where the CPU has it, else the
 * next one down: then a path is checked twice). */
static void check_rows(uint32_t L, uint32_t E, uint32_t K, int path) {
  eldr_shape s = {L, E, K};
  eldr_union u;
  assert_int_equal(eldr_union_init(&u, &s), 0);
  const size_t B = 70, LK = (size_t)L * K, LW = L * u.W;
  eldr_rng r;
  eldr_rng_seed(&r, (uint64_t)L * 1000003 + E * 131 + K);
  uint16_t *sel = malloc(B * LK * sizeof *sel);
  uint8_t *ids = malloc(B * (LK + 3) + ELDR_UNION_IDS8_PAD);
  uint64_t *bits = calloc(B * LW, sizeof *bits);
  uint8_t *seen = malloc((size_t)L * E);
  uint32_t *per = malloc(L * sizeof *per), *per_b = malloc(L * sizeof *per_b);
  const uint8_t *irow[70];
  const uint64_t *brow[70];
  assert_true(sel && ids && bits && seen && per && per_b);
  for (int round = 0; round < 40; round++) {
    /* n = 0, 1, a full batch, anything between; ids drawn from all E, from a
     * few experts (many duplicates) or the extremes 0 and E - 1 */
    size_t n = round == 0 ? 0 : round == 1 ? 1 : round == 2 ? B : (size_t)eldr_rng_below(&r, B + 1);
    uint32_t span = round % 3 == 0 ? E : round % 3 == 1 ? (E < 5 ? E : 5) : 2;
    size_t at = 0;
    for (size_t j = 0; j < n; j++) {
      uint16_t *t = sel + j * LK;
      for (size_t x = 0; x < LK; x++) {
        uint32_t e = (uint32_t)eldr_rng_below(&r, span);
        t[x] = (uint16_t)(span == 2 ? (e ? E - 1 : 0) : e);
      }
      memset(bits + j * LW, 0, LW * sizeof *bits);
      eldr_union_set_bits(bits + j * LW, L, K, u.W, t);
      brow[j] = bits + j * LW;
      at += (size_t)eldr_rng_below(&r, 4); /* unaligned rows */
      for (size_t x = 0; x < LK; x++) ids[at + x] = (uint8_t)t[x];
      irow[j] = ids + at;
      at += LK;
    }
    memset(seen, 0, (size_t)L * E);
    uint64_t want = 0;
    for (size_t j = 0; j < n; j++)
      for (size_t x = 0; x < LK; x++) {
        size_t cell = (x / K) * E + sel[j * LK + x];
        want += !seen[cell];
        seen[cell] = 1;
      }
    const eldr_cpu_level lv[3] = {ELDR_CPU_PORTABLE, ELDR_CPU_AVX2, ELDR_CPU_AVX512};
    const eldr_cpu_level was = eldr_cpu_set(eldr_test_level(lv[path]));
    memset(u.bits, 0xa5, LW * sizeof *u.bits); /* whatever was there is replaced */
    uint64_t got_b = eldr_union_rows_bits(&u, brow, n, per_b);
    uint64_t *ub = malloc(LW * sizeof *ub), *tb = malloc((n ? n : 1) * LW * sizeof *tb);
    assert_non_null(ub);
    assert_non_null(tb);
    memcpy(ub, u.bits, LW * sizeof *ub);
    uint64_t got_i = E <= 256 ? eldr_union_rows_ids8(&u, irow, n, per) : got_b;
    if (E <= 256) { /* each row's own bitset, the same as eldr_union_set_bits' */
      memset(tb, 0x5a, n * LW * sizeof *tb);
      eldr_union_ids8_bits(&u, irow, n, tb);
      if (n) assert_memory_equal(tb, bits, n * LW * sizeof *tb);
      (void)eldr_union_rows_ids8(&u, irow, n, NULL); /* u's bits again */
    }
    eldr_cpu_set(was);
    free(tb);
    assert_int_equal(got_b, want);
    assert_int_equal(got_i, want);
    for (uint32_t l = 0; l < L; l++) {
      uint32_t c = 0;
      for (uint32_t e = 0; e < E; e++) c += seen[(size_t)l * E + e];
      assert_int_equal(per_b[l], c);
      if (E <= 256) assert_int_equal(per[l], c);
    }
    if (E <= 256) assert_memory_equal(u.bits, ub, LW * sizeof *ub); /* the same bits */
    free(ub);
  }
  free(per_b);
  free(per);
  free(seen);
  free(bits);
  free(ids);
  free(sel);
  eldr_union_free(&u);
}

static void test_rows_kernels(void **st) {
  (void)st;
  /* every preset's shape, widths 1-4 with K a multiple of 4 or not, and
   * wider than ids8 takes (bitsets only) */
  static const uint32_t shapes[][3] = {
      {48, 128, 8}, {36, 128, 4}, {94, 128, 8}, {24, 128, 1}, {16, 64, 8}, {58, 256, 8},
      {3, 1, 1},    {5, 65, 3},   {7, 200, 12}, {2, 256, 2}, {9, 192, 6}, {1, 64, 5},
      {4, 100, 16}, {3, 257, 8},  {2, 1000, 20}, {33, 256, 1}, {61, 256, 8}, {37, 128, 4},
      {13, 64, 1},  {11, 192, 3}, {5, 256, 16}, {29, 100, 2}};
  for (int path = 0; path <= 2; path++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      check_rows(shapes[i][0], shapes[i][1], shapes[i][2], path);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_width),
                                     cmocka_unit_test(test_rows_kernels)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
