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
#include "core/counts_int.h"
#include "core/counts_ref.h"
#include "eldr/cpu.h"
#include "support/levels.h"

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

/* The blocked, range-checked, fixed-K kernels against the per-id
 * reference: random arrays of every dtype, shapes for every unrolled K (1,
 * 2, 4, 6, 8) and others (odd K, E not a power of two, E > 255), short
 * arrays and arrays of many range-check blocks, with and without a layer
 * mask, clean and with one bad id (too large, or negative for signed
 * dtypes) at a random place, with the AVX2 range check and with the
 * portable one (as on a CPU without AVX2): same return code, same bad
 * index, same (partial) counts; eldr_counts_check_masked finds the same
 * bad index. */
static void test_fast_equals_reference(void **state) {
  (void)state;
  const eldr_sel_dtype dts[6] = {ELDR_SEL_U8,    ELDR_SEL_U16LE, ELDR_SEL_U16,
                                 ELDR_SEL_I16LE, ELDR_SEL_I32LE, ELDR_SEL_I64LE};
  const eldr_shape shapes[8] = {{48, 128, 8}, {3, 7, 3},  {5, 300, 1}, {2, 256, 5},
                                {4, 64, 4},   {6, 160, 6}, {2, 16, 2}, {7, 4096, 8}};
  eldr_rng r;
  eldr_rng_seed(&r, 1234);
  for (int simd = 0; simd < 2; simd++) {
  eldr_cpu_set(simd ? eldr_cpu_allowed() : ELDR_CPU_PORTABLE);
  for (int sh = 0; sh < 8; sh++) {
    const eldr_shape *s = &shapes[sh];
    const size_t L = s->num_layers, E = s->num_experts, K = s->top_k, cells = L * E;
    for (int d = 0; d < 6; d++) {
      const size_t w = eldr_sel_dtype_size(dts[d]);
      if (dts[d] == ELDR_SEL_U8 && E > 256) continue;
      for (int trial = 0; trial < 12; trial++) {
        /* a few tokens, or enough for several 8 KiB blocks */
        const size_t span = trial < 6 ? 37 : 1 + 40000 / (L * K * w);
        const size_t T = 1 + (size_t)(eldr_rng_next(&r) % span), n = T * L * K;
        unsigned char *raw = malloc(n * w);
        assert_non_null(raw);
        for (size_t i = 0; i < n; i++) {
          uint64_t v = eldr_rng_next(&r) % E;
          for (size_t b = 0; b < w; b++) raw[i * w + b] = (unsigned char)(v >> (8 * b));
          if (dts[d] == ELDR_SEL_U16) {
            uint16_t h = (uint16_t)v;
            memcpy(raw + i * w, &h, 2);
          }
        }
        if (trial % 3 != 0) { /* one bad id */
          size_t at = (size_t)(eldr_rng_next(&r) % n);
          int neg = (dts[d] == ELDR_SEL_I16LE || dts[d] == ELDR_SEL_I32LE ||
                     dts[d] == ELDR_SEL_I64LE) && trial % 3 == 2;
          uint64_t v = neg ? (uint64_t)-1 : (w == 1 ? 255 : E + (eldr_rng_next(&r) % 5));
          if (w == 1 && E == 256) v = 0; /* u8 cannot exceed 255: keep it clean */
          for (size_t b = 0; b < w; b++) raw[at * w + b] = (unsigned char)(v >> (8 * b));
          if (dts[d] == ELDR_SEL_U16) {
            uint16_t h = (uint16_t)v;
            memcpy(raw + at * w, &h, 2);
          }
        }
        uint8_t mask[48];
        for (size_t l = 0; l < L; l++) mask[l] = (uint8_t)(eldr_rng_next(&r) & 1);
        for (int m = 0; m < 2; m++) {
          const uint8_t *mk = m ? mask : NULL;
          uint32_t *a = calloc(cells, sizeof *a), *b = calloc(cells, sizeof *b);
          assert_non_null(a);
          assert_non_null(b);
          size_t bad_a = (size_t)-1, bad_b = (size_t)-1;
          int ra = eldr_counts_accumulate_masked(s, raw, dts[d], T, mk, a, &bad_a);
          int rb = eldr__counts_ref(s, raw, dts[d], T, mk, b, &bad_b);
          assert_int_equal(ra, rb);
          assert_true(bad_a == bad_b);
          assert_memory_equal(a, b, cells * sizeof *a);
          size_t bad_c = (size_t)-1;
          assert_int_equal(eldr_counts_check_masked(s, raw, dts[d], T, mk, &bad_c), rb);
          if (rb) assert_true(bad_c == bad_b);
          free(a);
          free(b);
        }
        free(raw);
      }
    }
  }
  }
  eldr_cpu_set(eldr_cpu_allowed());
}

/* Rows of K distinct ids < E (a router's top-k). */
static void fill_rows(eldr_rng *r, uint8_t *raw, size_t rows, size_t K, size_t E) {
  for (size_t i = 0; i < rows; i++)
    for (size_t k = 0; k < K; k++) {
      uint8_t v;
      int rep;
      do {
        v = (uint8_t)(eldr_rng_next(r) % E);
        rep = 0;
        for (size_t j = 0; j < k; j++) rep |= raw[i * K + j] == v;
      } while (rep);
      raw[i * K + k] = v;
    }
}

/* The bit-sliced kernel (1-byte ids, K = 8, E <= 128, >= 256 tokens) gives
 * the reference's answers: on rows of distinct ids (where it counts), and on
 * inputs it must hand back to the per-id kernels — a repeated id in a row,
 * an id in [E, 128), an id >= 128, in the first block or a later one — with
 * the same return code, bad index and partial counts; L not a multiple of
 * 4, masks dense, half and sparse. Bits on, bits off, portable: all equal. */
static void test_bits_equals_reference(void **state) {
  (void)state;
  const eldr_shape shapes[5] = {{48, 128, 8}, {8, 128, 8}, {10, 100, 8}, {94, 128, 8}, {4, 9, 8}};
  eldr_rng r;
  eldr_rng_seed(&r, 99);
  for (int sh = 0; sh < 5; sh++) {
    const eldr_shape *s = &shapes[sh];
    const size_t L = s->num_layers, E = s->num_experts, K = 8, cells = L * E;
    for (int trial = 0; trial < 10; trial++) {
      const size_t T = trial < 2 ? 256 : 256 + (size_t)(eldr_rng_next(&r) % 4000), n = T * L * K;
      uint8_t *raw = malloc(n);
      assert_non_null(raw);
      fill_rows(&r, raw, T * L, K, E);
      /* 0, 1: clean; then a repeat, an id in [E, 128) (or 200 when E = 128), an
       * id >= 128, early (first 64 tokens) or anywhere */
      const int kind = trial < 2 ? 0 : 1 + trial % 3;
      const size_t at = trial % 2 ? (size_t)(eldr_rng_next(&r) % (64 * L * K))
                                  : (size_t)(eldr_rng_next(&r) % n);
      if (kind == 1) raw[at] = raw[at ^ 1];
      if (kind == 2) raw[at] = (uint8_t)(E < 128 ? E + eldr_rng_next(&r) % (128 - E) : 200);
      if (kind == 3) raw[at] = (uint8_t)(128 + eldr_rng_next(&r) % 128);
      uint8_t mask[128];
      /* dense (7 of 8 layers), half, sparse (1 of 4): the bit kernel's groups
       * of four masked layers are consecutive or gathered */
      const unsigned keep = trial % 3 == 0 ? 7 : trial % 3 == 1 ? 4 : 2;
      for (size_t l = 0; l < L; l++) mask[l] = (uint8_t)(eldr_rng_next(&r) % 8 < keep);
      for (int m = 0; m < 2; m++) {
        const uint8_t *mk = m ? mask : NULL;
        uint32_t *ref = calloc(cells, sizeof *ref);
        assert_non_null(ref);
        size_t bad_ref = (size_t)-1;
        int rr = eldr__counts_ref(s, raw, ELDR_SEL_U8, T, mk, ref, &bad_ref);
        if (kind == 0) assert_int_equal(rr, 0);
        for (int mode = 0; mode < 4; mode++) { /* bits AVX-512, bits AVX2, per-id AVX2, portable */
          /* where the CPU has it; else mode 0 = mode 1 */
          eldr_cpu_set(eldr_test_level(mode == 0 ? ELDR_CPU_AVX512 : mode < 3 ? ELDR_CPU_AVX2 : ELDR_CPU_PORTABLE));
          eldr_counts_bits_set(mode < 2);
          uint32_t *a = calloc(cells, sizeof *a);
          assert_non_null(a);
          size_t bad = (size_t)-1;
          int ra = eldr_counts_accumulate_masked(s, raw, ELDR_SEL_U8, T, mk, a, &bad);
          assert_int_equal(ra, rr);
          if (rr) assert_true(bad == bad_ref);
          assert_memory_equal(a, ref, cells * sizeof *a);
          free(a);
        }
        free(ref);
      }
      free(raw);
    }
  }
  eldr_cpu_set(eldr_cpu_allowed());
  eldr_counts_bits_set(1);
}

/* The signature cache's 16-token byte rows (eldr__counts_block8): with the
 * AVX-512 bit kernel (1-byte ids, top-8 of 128 experts, 16 tokens, four
 * masked layers and more) and without it, the reference's counts: rows of
 * distinct ids, a repeated id (handed to the per-id kernel), an id out of
 * range (ELDR_ERANGE, nothing counted); masks dense, half, sparse, none. */
static void test_block8_equals_reference(void **state) {
  (void)state;
  eldr_rng r;
  eldr_rng_seed(&r, 11);
  const eldr_shape shapes[] = {{48, 128, 8}, {7, 128, 8}, {4, 128, 8}, {3, 128, 8}, {48, 100, 8}};
  for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
    const eldr_shape *sh = &shapes[si];
    const size_t L = sh->num_layers, E = sh->num_experts, T = 16, cells = L * E;
    for (int trial = 0; trial < 12; trial++) {
      uint8_t raw[16 * 48 * 8];
      fill_rows(&r, raw, T * L, 8, E);
      const int kind = trial % 4; /* 0, 1 clean; 2 a repeat; 3 an id >= E */
      const size_t at = (size_t)(eldr_rng_next(&r) % (T * L * 8));
      if (kind == 2) raw[at] = raw[at ^ 1];
      if (kind == 3) raw[at] = (uint8_t)(E + eldr_rng_next(&r) % (256 - E));
      uint8_t mask[48];
      const unsigned keep = trial % 3 == 0 ? 8 : trial % 3 == 1 ? 4 : 2;
      for (size_t l = 0; l < L; l++) mask[l] = (uint8_t)(eldr_rng_next(&r) % 8 < keep);
      const uint8_t *mk = trial % 6 == 5 ? NULL : mask;
      uint32_t ref[48 * 128] = {0};
      size_t bad = 0;
      const int rr = eldr__counts_ref(sh, raw, ELDR_SEL_U8, T, mk, ref, &bad);
      for (int mode = 0; mode < 3; mode++) { /* bits (AVX-512 where the CPU has it), per-id, portable */
        eldr_cpu_set(mode < 2 ? eldr_cpu_allowed() : ELDR_CPU_PORTABLE);
        eldr_counts_bits_set(mode == 0);
        uint8_t c8[48 * 128];
        memset(c8, 7, sizeof c8); /* accumulated onto */
        const int rc = eldr__counts_block8(sh, raw, ELDR_SEL_U8, T, mk, c8);
        if (rr) {
          assert_int_equal(rc, ELDR_ERANGE);
          continue;
        }
        assert_int_equal(rc, 0);
        for (size_t i = 0; i < cells; i++)
          if (c8[i] != (uint8_t)(7 + ref[i])) fail_msg("shape %zu trial %d mode %d cell %zu: %u, want %u", si, trial, mode, i, c8[i], 7 + ref[i]);
      }
    }
  }
  eldr_cpu_set(eldr_cpu_allowed());
  eldr_counts_bits_set(1);
}

/* eldr__add_i8_u32 on every SIMD level and length (vector bodies, tails). */
static void test_add_i8_u32(void **state) {
  (void)state;
  int8_t src[301];
  uint32_t want[301], got[301];
  for (int i = 0; i < 301; i++) src[i] = (int8_t)(i * 37 % 251 - 120);
  for (int mode = 0; mode < 3; mode++) { /* AVX-512 where the CPU has it, AVX2, portable */
    eldr_cpu_set(eldr_test_level(mode == 0 ? ELDR_CPU_AVX512 : mode == 1 ? ELDR_CPU_AVX2 : ELDR_CPU_PORTABLE));
    for (size_t n = 0; n <= 301; n += n < 40 ? 1 : 29) {
      for (size_t i = 0; i < 301; i++) want[i] = got[i] = (uint32_t)(1000 + i);
      for (size_t i = 0; i < n; i++) want[i] += (uint32_t)src[i];
      eldr__add_i8_u32(got, src, n);
      assert_memory_equal(got, want, sizeof got);
    }
  }
  eldr_cpu_set(eldr_cpu_allowed());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shape_validate),
      cmocka_unit_test(test_all_dtypes),
      cmocka_unit_test(test_range_errors),
      cmocka_unit_test(test_masked),
      cmocka_unit_test(test_fast_equals_reference),
      cmocka_unit_test(test_bits_equals_reference),
      cmocka_unit_test(test_block8_equals_reference),
      cmocka_unit_test(test_add_i8_u32),
      cmocka_unit_test(test_routed_experts_masked_equals_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
