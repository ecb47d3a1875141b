/* test_sigcache.c — tokenizer, block hash chain and the block-granular
 * signature cache: signatures completed from the cache equal the signature
 * computed from all rows, under partial prefix hits, eviction and reuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/rng.h"
#include "eldr/sigcache.h"
#include "eldr/signature.h"

static const eldr_shape SH = {6, 16, 2};

static void test_tokenize(void **st) {
  (void)st;
  uint32_t a[64], b[64];
  const char *t = "Hello, world! The quick brown fox_jumps over\tthe lazy dog.";
  size_t n = eldr_tokenize(t, strlen(t), a, 64);
  assert_true(n > 10);
  assert_int_equal(eldr_tokenize(t, strlen(t), b, 64), n);
  assert_memory_equal(a, b, n * sizeof *a);
  /* count is reported even when cap is smaller, and the prefix agrees */
  uint32_t c[3];
  assert_int_equal(eldr_tokenize(t, strlen(t), c, 3), n);
  assert_memory_equal(a, c, sizeof c);
  assert_int_equal(eldr_tokenize(t, strlen(t), NULL, 0), n);
  /* leading space changes the id; punctuation is its own token */
  uint32_t x[4], y[4];
  assert_int_equal(eldr_tokenize("a b", 3, x, 4), 2);
  assert_int_equal(eldr_tokenize("ab", 2, y, 4), 1);
  assert_int_equal(eldr_tokenize("a,b", 3, y, 4), 3);
  uint32_t p[2], q[2];
  eldr_tokenize("x word", 6, p, 2);
  eldr_tokenize("xword", 5, q, 2);
  assert_int_not_equal(p[1], q[1]);
  assert_int_equal(eldr_tokenize("", 0, x, 4), 0);
  assert_int_equal(eldr_tokenize("   \n\t", 5, x, 4), 0);
  for (size_t i = 0; i < n; i++) assert_true(a[i] < (1u << 17));
}

static void test_block_hashes(void **st) {
  (void)st;
  uint32_t ids[70];
  for (int i = 0; i < 70; i++) ids[i] = (uint32_t)(i * 7 + 3);
  uint64_t h[5], h2[5];
  assert_int_equal(eldr_block_hashes(ids, 70, 0, h), 4);
  assert_int_equal(eldr_block_hashes(ids, 15, 0, h2), 0);
  /* a prefix gives the same first hashes (chain) */
  assert_int_equal(eldr_block_hashes(ids, 40, 0, h2), 2);
  assert_memory_equal(h, h2, 2 * sizeof *h);
  /* changing block 1 changes hashes 1.. but not 0 */
  ids[20] ^= 1;
  eldr_block_hashes(ids, 70, 0, h2);
  assert_true(h[0] == h2[0]);
  assert_true(h[1] != h2[1] && h[2] != h2[2] && h[3] != h2[3]);
  /* the seed matters */
  eldr_block_hashes(ids, 70, 1, h2);
  assert_true(h[0] != h2[0]);
}

static void block_counts(const uint16_t *sel, size_t t0, size_t n, uint32_t *out) {
  memset(out, 0, eldr_shape_cells(&SH) * sizeof *out);
  assert_int_equal(eldr_counts_accumulate(&SH, sel + t0 * SH.num_layers * SH.top_k, ELDR_SEL_U16, n, out, NULL), 0);
}

static void test_put_add_remove(void **st) {
  (void)st;
  size_t cells = eldr_shape_cells(&SH);
  eldr_sigcache *c = eldr_sigcache_new(&SH, 3);
  assert_non_null(c);
  uint32_t row[96], acc[96];
  assert_int_equal(cells, 96);
  for (size_t i = 0; i < cells; i++) row[i] = (uint32_t)(i % 5);
  assert_int_equal(eldr_sigcache_put(c, 11, row), 0);
  memset(acc, 0, sizeof acc);
  assert_int_equal(eldr_sigcache_add(c, 11, acc), 0);
  assert_int_equal(eldr_sigcache_add(c, 11, acc), 0);
  for (size_t i = 0; i < cells; i++) assert_int_equal(acc[i], 2 * row[i]);
  assert_int_equal(eldr_sigcache_add(c, 12, acc), ELDR_ENOTFOUND);
  row[3] = 128;
  assert_int_equal(eldr_sigcache_put(c, 13, row), ELDR_ERANGE);
  row[3] = 127;
  assert_int_equal(eldr_sigcache_put(c, 13, row), 0);
  assert_int_equal(eldr_sigcache_put(c, 14, row), 0);
  /* LRU: 11 used most recently before 13, 14 were put; touching 11 makes 13 the oldest */
  assert_int_equal(eldr_sigcache_add(c, 11, acc), 0);
  assert_int_equal(eldr_sigcache_put(c, 15, row), 0); /* evicts 13 */
  assert_int_equal(eldr_sigcache_add(c, 13, acc), ELDR_ENOTFOUND);
  assert_int_equal(eldr_sigcache_add(c, 14, acc), 0);
  assert_int_equal(eldr_sigcache_add(c, 15, acc), 0);
  assert_int_equal(eldr_sigcache_remove(c, 14), 0);
  assert_int_equal(eldr_sigcache_remove(c, 14), ELDR_ENOTFOUND);
  assert_int_equal(eldr_sigcache_put(c, 16, row), 0); /* reuses the removed slot, no eviction */
  eldr_sigcache_stats s;
  eldr_sigcache_stats_get(c, &s);
  assert_int_equal(s.rows, 3);
  assert_int_equal(s.capacity, 3);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.hits, 5);
  assert_int_equal(s.misses, 2);
  /* replacing a row keeps one copy */
  row[0] = 9;
  assert_int_equal(eldr_sigcache_put(c, 16, row), 0);
  memset(acc, 0, sizeof acc);
  assert_int_equal(eldr_sigcache_add(c, 16, acc), 0);
  assert_int_equal(acc[0], 9);
  eldr_sigcache_stats_get(c, &s);
  assert_int_equal(s.rows, 3);
  eldr_sigcache_free(c);
  assert_null(eldr_sigcache_new(&SH, 0));
  eldr_shape bad = {0, 4, 1};
  assert_null(eldr_sigcache_new(&bad, 4));
}

/* Many random keys through a small cache: the index (linear probing with
 * backward-shift deletion) must always find exactly the live rows. */
static void test_index_churn(void **st) {
  (void)st;
  eldr_shape s1 = {1, 4, 1};
  eldr_sigcache *c = eldr_sigcache_new(&s1, 64);
  uint64_t keys[64];
  int live[64];
  memset(live, 0, sizeof live);
  eldr_rng r;
  eldr_rng_seed(&r, 7);
  uint32_t row[4] = {1, 0, 0, 0}, acc[4];
  for (int it = 0; it < 20000; it++) {
    int slot = (int)eldr_rng_below(&r, 64);
    if (live[slot] && eldr_rng_below(&r, 3) == 0) {
      assert_int_equal(eldr_sigcache_remove(c, keys[slot]), 0);
      live[slot] = 0;
    } else if (!live[slot]) {
      keys[slot] = eldr_rng_next(&r) & 0xffff; /* collisions of low bits on purpose */
      int dup = 0;
      for (int j = 0; j < 64; j++) dup |= live[j] && keys[j] == keys[slot];
      if (dup) continue;
      assert_int_equal(eldr_sigcache_put(c, keys[slot], row), 0);
      live[slot] = 1;
    }
    if (it % 97 == 0)
      for (int j = 0; j < 64; j++)
        if (live[j]) assert_int_equal(eldr_sigcache_add(c, keys[j], acc), 0);
  }
  eldr_sigcache_stats s;
  eldr_sigcache_stats_get(c, &s);
  size_t n = 0;
  for (int j = 0; j < 64; j++) n += live[j];
  assert_int_equal(s.rows, n);
  assert_int_equal(s.evictions, 0);
  eldr_sigcache_free(c);
}

/* A prompt of 5 full blocks + 7 tokens. Full counts vs counts assembled from
 * cached block rows + the computed rows, for every prefix-hit length. */
static void test_signature_partial_hits(void **st) {
  (void)st;
  const size_t T = 5 * ELDR_BLOCK_TOKENS + 7, LK = SH.num_layers * SH.top_k, cells = eldr_shape_cells(&SH);
  uint16_t *sel = malloc(T * LK * sizeof *sel);
  eldr_rng r;
  eldr_rng_seed(&r, 42);
  for (size_t i = 0; i < T * LK; i++) sel[i] = (uint16_t)eldr_rng_below(&r, SH.num_experts);
  uint32_t ids[5 * ELDR_BLOCK_TOKENS + 7];
  for (size_t i = 0; i < T; i++) ids[i] = (uint32_t)eldr_rng_below(&r, 1000);
  uint64_t h[6];
  size_t nb = eldr_block_hashes(ids, T, 0, h);
  assert_int_equal(nb, 5);
  uint32_t full[96], got[96], scratch[96];
  block_counts(sel, 0, T, full);
  eldr_sigspec spec = {SH, ELDR_REPR_COUNT, NULL, NULL};
  float sfull[96], sgot[96];
  assert_int_equal(eldr_signature_build(&spec, full, NULL, sfull), 0);

  eldr_sigcache *c = eldr_sigcache_new(&SH, 16);
  /* first request: nothing cached, every row computed; store all full blocks */
  size_t stored = 0;
  assert_int_equal(eldr_sigcache_store_blocks(c, h, nb, 0, sel, ELDR_SEL_U16, T, scratch, &stored), 0);
  assert_int_equal(stored, 5);
  for (size_t i = 0; i < cells; i++) assert_int_equal(scratch[i], 0);
  for (size_t hit = 0; hit <= nb; hit++) {
    size_t first = hit * ELDR_BLOCK_TOKENS; /* engine computed tokens [first, T) */
    memset(got, 0, sizeof got);
    assert_int_equal(eldr_counts_accumulate(&SH, sel + first * LK, ELDR_SEL_U16, T - first, got, NULL), 0);
    assert_int_equal(eldr_sigcache_add_blocks(c, h, hit, got), 0);
    assert_memory_equal(got, full, sizeof full);
    assert_int_equal(eldr_signature_build(&spec, got, NULL, sgot), 0);
    assert_memory_equal(sgot, sfull, sizeof sfull);
  }
  /* after eviction of block 2 the miss is reported, the rest still adds up */
  assert_int_equal(eldr_sigcache_remove(c, h[2]), 0);
  memset(got, 0, sizeof got);
  size_t first = 4 * ELDR_BLOCK_TOKENS;
  eldr_counts_accumulate(&SH, sel + first * LK, ELDR_SEL_U16, T - first, got, NULL);
  assert_int_equal(eldr_sigcache_add_blocks(c, h, 4, got), 1);
  uint32_t b2[96];
  block_counts(sel, 2 * ELDR_BLOCK_TOKENS, ELDR_BLOCK_TOKENS, b2);
  for (size_t i = 0; i < cells; i++) assert_int_equal(got[i] + b2[i], full[i]);
  /* the next request recomputes blocks 2.. and stores them again: exact once more */
  assert_int_equal(eldr_sigcache_store_blocks(c, h, nb, 2 * ELDR_BLOCK_TOKENS, sel + 2 * ELDR_BLOCK_TOKENS * LK,
                                              ELDR_SEL_U16, T - 2 * ELDR_BLOCK_TOKENS, scratch, &stored), 0);
  assert_int_equal(stored, 3);
  memset(got, 0, sizeof got);
  eldr_counts_accumulate(&SH, sel + first * LK, ELDR_SEL_U16, T - first, got, NULL);
  assert_int_equal(eldr_sigcache_add_blocks(c, h, 4, got), 0);
  assert_memory_equal(got, full, sizeof full);
  /* storing from a non-block-aligned first token skips the partial block */
  eldr_sigcache *c2 = eldr_sigcache_new(&SH, 16);
  assert_int_equal(eldr_sigcache_store_blocks(c2, h, nb, 5, sel + 5 * LK, ELDR_SEL_U16, T - 5, scratch, &stored), 0);
  assert_int_equal(stored, 4);
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_sigcache_add(c2, h[0], got), ELDR_ENOTFOUND);
  assert_int_equal(eldr_sigcache_add(c2, h[1], got), 0);
  block_counts(sel, ELDR_BLOCK_TOKENS, ELDR_BLOCK_TOKENS, b2);
  assert_memory_equal(got, b2, sizeof b2);
  /* blocks already held are not counted again: a bad id in one is not even
   * read; block 0, new, is counted and stored */
  eldr_sigcache_stats cs0, cs1;
  eldr_sigcache_stats_get(c2, &cs0);
  sel[3 * ELDR_BLOCK_TOKENS * LK] = 99;
  assert_int_equal(eldr_sigcache_store_blocks(c2, h, nb, 0, sel, ELDR_SEL_U16, T, scratch, &stored), 0);
  assert_int_equal(stored, 5);
  eldr_sigcache_stats_get(c2, &cs1);
  assert_int_equal(cs1.stored - cs0.stored, 1);
  assert_int_equal(cs1.present - cs0.present, 4);
  for (size_t i = 0; i < cells; i++) assert_int_equal(scratch[i], 0);
  /* a bad expert id in a new block stops storing with ERANGE */
  eldr_sigcache *c3 = eldr_sigcache_new(&SH, 16);
  assert_int_equal(eldr_sigcache_store_blocks(c3, h, nb, 0, sel, ELDR_SEL_U16, T, scratch, &stored), ELDR_ERANGE);
  assert_int_equal(stored, 3);
  eldr_sigcache_free(c3);
  eldr_sigcache_free(c2);
  eldr_sigcache_free(c);
  free(sel);
}

/* Two prompts share their first two blocks: the second prompt's signature
 * from cache (shared blocks) + its own computed rows is exact, and a capacity
 * that forces LRU eviction only ever costs misses, never wrong sums. */
static void test_block_reuse_and_lru(void **st) {
  (void)st;
  const size_t T = 4 * ELDR_BLOCK_TOKENS, LK = SH.num_layers * SH.top_k;
  uint16_t *a = malloc(T * LK * sizeof *a), *b = malloc(T * LK * sizeof *b);
  uint32_t ia[64], ib[64];
  eldr_rng r;
  eldr_rng_seed(&r, 3);
  for (size_t i = 0; i < T * LK; i++) a[i] = b[i] = (uint16_t)eldr_rng_below(&r, SH.num_experts);
  for (size_t i = 0; i < T; i++) ia[i] = ib[i] = (uint32_t)eldr_rng_below(&r, 5000);
  for (size_t i = 2 * ELDR_BLOCK_TOKENS * LK; i < T * LK; i++) b[i] = (uint16_t)eldr_rng_below(&r, SH.num_experts);
  for (size_t i = 2 * ELDR_BLOCK_TOKENS; i < T; i++) ib[i] = 7000 + (uint32_t)i;
  uint64_t ha[4], hb[4];
  eldr_block_hashes(ia, T, 0, ha);
  eldr_block_hashes(ib, T, 0, hb);
  assert_true(ha[0] == hb[0] && ha[1] == hb[1] && ha[2] != hb[2]);
  uint32_t scratch[96], got[96], full[96];
  for (size_t cap = 1; cap <= 8; cap++) {
    eldr_sigcache *c = eldr_sigcache_new(&SH, cap);
    eldr_sigcache_store_blocks(c, ha, 4, 0, a, ELDR_SEL_U16, T, scratch, NULL);
    /* b: engine reports 2 cached blocks, computes tokens [32, 64) */
    size_t first = 2 * ELDR_BLOCK_TOKENS;
    memset(got, 0, sizeof got);
    eldr_counts_accumulate(&SH, b + first * LK, ELDR_SEL_U16, T - first, got, NULL);
    size_t missing = eldr_sigcache_add_blocks(c, hb, 2, got);
    block_counts(b, 0, T, full);
    if (missing == 0) assert_memory_equal(got, full, sizeof full);
    else
      for (size_t i = 0; i < 96; i++) assert_true(got[i] <= full[i]);
    /* with capacity >= 4 both shared blocks survive */
    if (cap >= 4) assert_int_equal(missing, 0);
    eldr_sigcache_stats s;
    eldr_sigcache_stats_get(c, &s);
    assert_true(s.rows <= cap);
    eldr_sigcache_free(c);
  }
  free(a);
  free(b);
}


/* With a layer mask the cache counts, stores and adds only those layers:
 * the masked part of the completed counts equals the masked full counts. */
static void test_layer_mask(void **st) {
  (void)st;
  const size_t T = 3 * ELDR_BLOCK_TOKENS, LK = SH.num_layers * SH.top_k, E = SH.num_experts;
  uint16_t *sel = malloc(T * LK * sizeof *sel);
  eldr_rng r;
  eldr_rng_seed(&r, 11);
  for (size_t i = 0; i < T * LK; i++) sel[i] = (uint16_t)eldr_rng_below(&r, SH.num_experts);
  uint32_t ids[48];
  for (size_t i = 0; i < T; i++) ids[i] = (uint32_t)i * 31;
  uint64_t h[3];
  eldr_block_hashes(ids, T, 0, h);
  uint8_t mask[6] = {1, 0, 0, 1, 1, 0};
  eldr_sigcache *c = eldr_sigcache_new(&SH, 8);
  assert_int_equal(eldr_sigcache_set_layer_mask(c, mask), 0);
  uint32_t scratch[96], got[96], full[96];
  size_t stored;
  /* an id out of range in an unmasked layer is not even read */
  uint16_t keep = sel[1 * SH.top_k];
  sel[1 * SH.top_k] = 999;
  assert_int_equal(eldr_sigcache_store_blocks(c, h, 3, 0, sel, ELDR_SEL_U16, T, scratch, &stored), 0);
  assert_int_equal(stored, 3);
  sel[1 * SH.top_k] = keep;
  block_counts(sel, 0, T, full);
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_sigcache_add_blocks(c, h, 3, got), 0);
  for (size_t l = 0; l < SH.num_layers; l++)
    for (size_t e = 0; e < E; e++) assert_int_equal(got[l * E + e], mask[l] ? full[l * E + e] : 0);
  /* put() ignores (and does not range-check) unmasked layers */
  uint32_t row[96] = {0};
  row[1 * E] = 500;
  assert_int_equal(eldr_sigcache_put(c, 77, row), 0);
  row[0] = 500;
  assert_int_equal(eldr_sigcache_put(c, 78, row), ELDR_ERANGE);
  assert_int_equal(eldr_sigcache_set_layer_mask(c, NULL), 0);
  eldr_sigcache_free(c);
  free(sel);
}


/* The 8-bit block rows of eldr_sigcache_store_blocks (top_k <= 15) equal
 * eldr_sigcache_put of 32-bit block counts, with and without a layer mask,
 * for u8 and int32 ids; a block whose cell would pass 127 (a row that
 * repeats one expert 8 times) is refused with ERANGE, as put refuses it. */
static void test_store_rows_8bit(void **st) {
  (void)st;
  const eldr_shape sh = {4, 32, 8};
  enum { T = 3 * ELDR_BLOCK_TOKENS, LK = 4 * 8, CELLS = 4 * 32 };
  static uint8_t u8[T * LK];
  static uint8_t i32[T * LK * 4];
  eldr_rng r;
  eldr_rng_seed(&r, 7);
  for (size_t i = 0; i < T * LK; i++) {
    u8[i] = (uint8_t)eldr_rng_below(&r, 32);
    memset(i32 + 4 * i, 0, 4);
    i32[4 * i] = u8[i];
  }
  uint64_t h[3] = {11, 22, 33};
  const uint8_t mask[4] = {1, 0, 1, 1};
  for (int m = 0; m < 2; m++)
    for (int dt = 0; dt < 2; dt++) {
      eldr_sigcache *a = eldr_sigcache_new(&sh, 8), *b = eldr_sigcache_new(&sh, 8);
      assert_non_null(a);
      assert_non_null(b);
      if (m) {
        assert_int_equal(eldr_sigcache_set_layer_mask(a, mask), 0);
        assert_int_equal(eldr_sigcache_set_layer_mask(b, mask), 0);
      }
      uint32_t scratch[CELLS], bc[CELLS], ga[CELLS], gb[CELLS];
      size_t stored = 0;
      assert_int_equal(eldr_sigcache_store_blocks(a, h, 3, 0, dt ? (const void *)i32 : u8,
                                                  dt ? ELDR_SEL_I32LE : ELDR_SEL_U8, T, scratch, &stored), 0);
      assert_int_equal(stored, 3);
      for (size_t i = 0; i < CELLS; i++) assert_int_equal(scratch[i], 0);
      for (size_t blk = 0; blk < 3; blk++) {
        memset(bc, 0, sizeof bc);
        assert_int_equal(eldr_counts_accumulate_masked(&sh, u8 + blk * ELDR_BLOCK_TOKENS * LK, ELDR_SEL_U8,
                                                       ELDR_BLOCK_TOKENS, m ? mask : NULL, bc, NULL), 0);
        assert_int_equal(eldr_sigcache_put(b, h[blk], bc), 0);
        memset(ga, 0, sizeof ga);
        memset(gb, 0, sizeof gb);
        assert_int_equal(eldr_sigcache_add(a, h[blk], ga), 0);
        assert_int_equal(eldr_sigcache_add(b, h[blk], gb), 0);
        assert_memory_equal(ga, gb, sizeof ga);
      }
      eldr_sigcache_free(a);
      eldr_sigcache_free(b);
    }
  /* block 1's first row: expert 5 eight times, in every token: 128 > 127 */
  for (size_t t = ELDR_BLOCK_TOKENS; t < 2 * ELDR_BLOCK_TOKENS; t++) memset(u8 + t * LK, 5, 8);
  eldr_sigcache *c = eldr_sigcache_new(&sh, 8);
  uint32_t scratch[CELLS];
  size_t stored = 9;
  assert_int_equal(eldr_sigcache_store_blocks(c, h, 3, 0, u8, ELDR_SEL_U8, T, scratch, &stored), ELDR_ERANGE);
  assert_int_equal(stored, 1);
  for (size_t i = 0; i < CELLS; i++) assert_int_equal(scratch[i], 0);
  eldr_sigcache_free(c);
}

/* Rows hold the masked layers only (the cache's memory scales with the
 * mask: eldr_sigcache_bytes, eldr_sigcache_capacity_for), and the leading
 * held blocks of a prompt add up exactly through the byte sums, rows with
 * large counts included (the sums are widened before a byte could wrap). */
static void test_compact_rows_and_prefix(void **st) {
  (void)st;
  const size_t E = SH.num_experts, cells = eldr_shape_cells(&SH);
  const uint8_t mask[6] = {0, 1, 0, 0, 1, 0};
  eldr_sigcache *all = eldr_sigcache_new(&SH, 64), *m = eldr_sigcache_new(&SH, 64);
  assert_non_null(all);
  assert_non_null(m);
  assert_int_equal(eldr_sigcache_set_layer_mask(m, mask), 0);
  assert_int_equal(eldr_sigcache_row_bytes(&SH, NULL), 6 * E);
  assert_int_equal(eldr_sigcache_row_bytes(&SH, mask), 2 * E);
  assert_true(eldr_sigcache_bytes(m) < eldr_sigcache_bytes(all));
  assert_true(eldr_sigcache_bytes(m) <= 64 * (2 * E + ELDR_SIGCACHE_ROW_OVERHEAD));
  assert_int_equal(eldr_sigcache_capacity_for(&SH, mask, 1000 * (2 * E + ELDR_SIGCACHE_ROW_OVERHEAD)), 1000);
  /* 40 rows, every masked cell 100 in row 0 and b % 17 in row b: the sums
   * pass 255 many times over */
  uint64_t h[40];
  uint32_t row[96], expect[96], got[96];
  memset(expect, 0, sizeof expect);
  for (size_t b = 0; b < 40; b++) {
    h[b] = 1000 + b * 7;
    for (size_t i = 0; i < cells; i++) row[i] = b == 0 ? 100 : (uint32_t)((b + i) % 17);
    assert_int_equal(eldr_sigcache_put(m, h[b], row), 0);
    for (size_t l = 0; l < 6; l++)
      for (size_t e = 0; e < E; e++) expect[l * E + e] += mask[l] ? row[l * E + e] : 0;
  }
  uint8_t acc[96];
  memset(acc, 0xab, sizeof acc); /* contents ignored */
  memset(got, 0, sizeof got);
  eldr_sigcache_stats s0, s1;
  eldr_sigcache_stats_get(m, &s0);
  assert_int_equal(eldr_sigcache_add_prefix(m, h, 40, got, acc), 40);
  assert_memory_equal(got, expect, sizeof expect);
  for (size_t i = 0; i < 2 * E; i++) assert_int_equal(acc[i], 0); /* left zeroed */
  eldr_sigcache_stats_get(m, &s1);
  assert_int_equal(s1.hits - s0.hits, 40);
  assert_int_equal(s1.misses, s0.misses);
  /* it stops at the first block not held, which is no miss */
  assert_int_equal(eldr_sigcache_remove(m, h[5]), 0);
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_sigcache_add_prefix(m, h, 40, got, acc), 5);
  eldr_sigcache_stats_get(m, &s0);
  assert_int_equal(s0.misses, s1.misses);
  /* a new mask drops the rows (their layout changed) */
  assert_int_equal(eldr_sigcache_set_layer_mask(m, NULL), 0);
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_sigcache_add(m, h[0], got), ELDR_ENOTFOUND);
  eldr_sigcache_stats_get(m, &s0);
  assert_int_equal(s0.rows, 0);
  assert_int_equal(eldr_sigcache_put(m, h[0], row), 0);
  eldr_sigcache_free(all);
  eldr_sigcache_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_compact_rows_and_prefix),
      cmocka_unit_test(test_tokenize),
      cmocka_unit_test(test_block_hashes),
      cmocka_unit_test(test_put_add_remove),
      cmocka_unit_test(test_index_churn),
      cmocka_unit_test(test_signature_partial_hits),
      cmocka_unit_test(test_block_reuse_and_lru),
      cmocka_unit_test(test_layer_mask),
      cmocka_unit_test(test_store_rows_8bit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
