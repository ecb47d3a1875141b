/* test_sigshard.c — the signature cache shared by threads (eldr/sigshard.h):
 * the same rows and counts as one eldr_sigcache, memory bounded by the
 * capacity split over the shards, the reuse check of a reload, references,
 * bad arguments, and two threads storing and reading across each other's
 * blocks at once (exact counts afterwards; run under -DELDR_TSAN=ON too). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/cpu.h"
#include "eldr/rng.h"
#include "eldr/sigshard.h"

static const eldr_shape SH = {3, 16, 2};
#define LK (3 * 2)
#define CELLS (3 * 16)

/* Selections of nblocks blocks: block b's tokens pick experts that depend
 * on b (two distinct ones per layer). */
static uint16_t *make_sel(size_t nblocks, unsigned salt) {
  size_t n = nblocks * ELDR_BLOCK_TOKENS;
  uint16_t *sel = malloc(n * LK * sizeof *sel);
  assert_non_null(sel);
  for (size_t t = 0; t < n; t++)
    for (size_t l = 0; l < 3; l++) {
      uint16_t e = (uint16_t)((t / ELDR_BLOCK_TOKENS * 7 + t * 3 + l + salt) % 16);
      sel[t * LK + l * 2] = e;
      sel[t * LK + l * 2 + 1] = (uint16_t)((e + 1 + t % 5) % 16);
    }
  return sel;
}

static uint64_t *make_hashes(size_t n, uint64_t seed) {
  uint64_t *h = malloc(n * sizeof *h);
  assert_non_null(h);
  uint64_t x = seed << 40; /* sequences of different seeds never meet */
  for (size_t i = 0; i < n; i++) h[i] = eldr_splitmix64(&x); /* spread over every shard */
  return h;
}

static void test_same_as_one_cache(void **st) {
  (void)st;
  enum { NB = 40 };
  uint16_t *sel = make_sel(NB, 1);
  uint64_t *h = make_hashes(NB, 1);
  const uint8_t mask[3] = {1, 0, 1};
  eldr_sigshard *sc = eldr_sigshard_new(&SH, 1024, 8, mask);
  eldr_sigcache *one = eldr_sigcache_new(&SH, 1024);
  assert_non_null(sc);
  assert_non_null(one);
  assert_int_equal(eldr_sigcache_set_layer_mask(one, mask), 0);
  assert_int_equal(eldr_sigshard_nshards(sc), 8);
  uint32_t scratch[CELLS] = {0};
  size_t stored = 0;
  /* a prompt whose first 5 tokens were cached: blocks 1.. are computed */
  size_t first = 5;
  const uint16_t *raw = sel + first * LK;
  assert_int_equal(eldr_sigshard_store_blocks(sc, h, NB, first, raw, ELDR_SEL_U16, NB * ELDR_BLOCK_TOKENS - first,
                                              scratch, &stored),
                   0);
  assert_int_equal(stored, NB - 1);
  for (size_t i = 0; i < CELLS; i++) assert_int_equal(scratch[i], 0);
  assert_int_equal(eldr_sigcache_store_blocks(one, h, NB, first, raw, ELDR_SEL_U16, NB * ELDR_BLOCK_TOKENS - first,
                                              scratch, &stored),
                   0);
  uint32_t a[CELLS] = {0}, b[CELLS] = {0};
  assert_int_equal(eldr_sigshard_add_blocks(sc, h, NB, a), 1); /* block 0 was never computed */
  assert_int_equal(eldr_sigcache_add_blocks(one, h, NB, b), 1);
  assert_memory_equal(a, b, sizeof a);
  for (size_t e = 0; e < 16; e++) assert_int_equal(a[16 + e], 0); /* layer 1 is outside the mask */
  eldr_sigcache_stats s;
  eldr_sigshard_stats_get(sc, &s);
  assert_int_equal(s.rows, NB - 1);
  assert_int_equal(s.capacity, 1024);
  assert_int_equal(s.hits, NB - 1);
  assert_int_equal(s.misses, 1);
  assert_int_equal(s.evictions, 0);
  assert_int_equal(eldr_sigshard_lock_waits(sc), 0); /* one thread never waits */
  assert_int_equal(eldr_sigshard_lock_waits(NULL), 0);
  /* a row repeating an expert past 127 is refused as the single cache refuses it:
   * not possible with 16 tokens x top-2; an expert id out of range is */
  uint16_t bad[ELDR_BLOCK_TOKENS * LK];
  memcpy(bad, sel, sizeof bad);
  bad[4] = 99;
  assert_int_equal(eldr_sigshard_store_blocks(sc, h, 1, 0, bad, ELDR_SEL_U16, ELDR_BLOCK_TOKENS, scratch, &stored),
                   ELDR_ERANGE);
  assert_int_equal(stored, 0);
  eldr_sigshard_free(sc);
  eldr_sigcache_free(one);
  free(sel);
  free(h);
}

static void test_bounded_and_evicting(void **st) {
  (void)st;
  enum { NB = 300, CAP = 100 };
  uint16_t *sel = make_sel(NB, 2);
  uint64_t *h = make_hashes(NB, 2);
  eldr_sigshard *sc = eldr_sigshard_new(&SH, CAP, 16, NULL);
  assert_non_null(sc);
  uint32_t scratch[CELLS] = {0};
  size_t stored = 0;
  assert_int_equal(eldr_sigshard_store_blocks(sc, h, NB, 0, sel, ELDR_SEL_U16, NB * ELDR_BLOCK_TOKENS, scratch,
                                              &stored),
                   0);
  assert_int_equal(stored, NB);
  eldr_sigcache_stats s;
  eldr_sigshard_stats_get(sc, &s);
  assert_true(s.rows <= CAP); /* every shard full at most */
  assert_int_equal(s.capacity, CAP);
  assert_int_equal(s.rows + s.evictions, NB);
  /* the last block stored is the most recent of its shard: still there */
  uint32_t c[CELLS] = {0};
  assert_int_equal(eldr_sigshard_add_blocks(sc, h + NB - 1, 1, c), 0);
  eldr_sigshard_free(sc);
  free(sel);
  free(h);
}

static void test_fits_count_refs_and_bad_args(void **st) {
  (void)st;
  assert_int_equal(eldr_sigshard_count_for(1), 1);
  assert_int_equal(eldr_sigshard_count_for(2 * ELDR_SIGSHARD_MIN_ROWS - 1), 1);
  assert_int_equal(eldr_sigshard_count_for(2 * ELDR_SIGSHARD_MIN_ROWS), 2);
  assert_int_equal(eldr_sigshard_count_for(65536), ELDR_SIGSHARD_MAX);
  assert_int_equal(eldr_sigshard_count_for((size_t)1 << 26), ELDR_SIGSHARD_MAX);
  const uint8_t all[3] = {1, 1, 1}, some[3] = {1, 0, 1}, other[3] = {0, 1, 1};
  eldr_sigshard *sc = eldr_sigshard_new(&SH, 512, 2, some);
  assert_non_null(sc);
  assert_true(eldr_sigshard_fits(sc, &SH, some, 512));
  assert_false(eldr_sigshard_fits(sc, &SH, other, 512));
  assert_false(eldr_sigshard_fits(sc, &SH, NULL, 512));
  assert_false(eldr_sigshard_fits(sc, &SH, some, 513)); /* another row count: a new cache */
  const eldr_shape sh2 = {3, 16, 4};
  assert_false(eldr_sigshard_fits(sc, &sh2, some, 512));
  assert_false(eldr_sigshard_fits(NULL, &SH, some, 512));
  eldr_sigshard *nomask = eldr_sigshard_new(&SH, 512, 1, all); /* every layer = no mask */
  assert_non_null(nomask);
  assert_true(eldr_sigshard_fits(nomask, &SH, NULL, 512));
  assert_true(eldr_sigshard_fits(nomask, &SH, all, 512));
  eldr_sigshard_free(nomask);
  /* references: the cache lives until the last is dropped */
  assert_ptr_equal(eldr_sigshard_ref(sc), sc);
  eldr_sigshard_free(sc);
  assert_true(eldr_sigshard_fits(sc, &SH, some, 512));
  eldr_sigshard_free(sc);
  eldr_sigshard_free(NULL);
  assert_null(eldr_sigshard_ref(NULL));
  /* bad arguments */
  assert_null(eldr_sigshard_new(&SH, 512, 3, NULL));  /* not a power of two */
  assert_null(eldr_sigshard_new(&SH, 512, 0, NULL));
  assert_null(eldr_sigshard_new(&SH, 512, 2 * ELDR_SIGSHARD_MAX, NULL));
  assert_null(eldr_sigshard_new(&SH, 3, 4, NULL));    /* fewer rows than shards */
  assert_null(eldr_sigshard_new(NULL, 512, 1, NULL));
  const eldr_shape bad = {0, 16, 2};
  assert_null(eldr_sigshard_new(&bad, 512, 1, NULL));
  eldr_sigcache_stats s;
  eldr_sigshard_stats_get(NULL, &s);
  assert_int_equal(s.rows, 0);
}

/* ---- two threads at once ------------------------------------------------------- */

enum { TB = 256, ROUNDS = 20 };

typedef struct racer {
  eldr_sigshard *sc;
  pthread_barrier_t *go;
  const uint16_t *sel;
  const uint64_t *mine, *theirs; /* TB hashes each */
  uint32_t *want_theirs;         /* counts of all their blocks */
  size_t missing, wrong;
} racer;

/* Span rows: the first whole read of a prefix builds its spans from the
 * block rows, later reads take them (one hit for seven blocks), the
 * counts exact; a prompt sharing part of a span reads that part's block
 * rows; a run with a block not held builds nothing. */
static void test_spans(void **st) {
  (void)st;
  enum { NB = 20 };
  uint16_t *sel = make_sel(NB, 4);
  uint64_t *h = make_hashes(NB, 4);
  eldr_sigshard *sc = eldr_sigshard_new(&SH, 1024, 4, NULL);
  assert_non_null(sc);
  uint32_t scratch[CELLS] = {0};
  size_t stored = 0;
  assert_int_equal(eldr_sigshard_store_blocks(sc, h, NB, 0, sel, ELDR_SEL_U16, NB * ELDR_BLOCK_TOKENS, scratch,
                                              &stored),
                   0);
  eldr_sigcache_stats s0, s1;
  eldr_sigshard_stats_get(sc, &s0);
  assert_int_equal(s0.spans, 0); /* a store builds none */
  uint32_t got[CELLS] = {0}, want[CELLS] = {0};
  uint8_t acc[2 * CELLS];
  memset(acc, 0xAB, sizeof acc); /* contents ignored */
  assert_int_equal(eldr_counts_accumulate(&SH, sel, ELDR_SEL_U16, NB * ELDR_BLOCK_TOKENS, want, NULL), 0);
  /* the first read: every block row (spans 0..6 and 7..13 built), exact */
  assert_int_equal(eldr_sigshard_add_prefix(sc, h, NB, got, acc), NB);
  assert_memory_equal(got, want, sizeof want);
  for (size_t i = 0; i < sizeof acc; i++) assert_int_equal(acc[i], 0); /* left zeroed */
  eldr_sigshard_stats_get(sc, &s1);
  assert_int_equal(s1.spans, 2);
  assert_int_equal(s1.rows, NB + 2);
  assert_int_equal(s1.hits - s0.hits, NB);
  /* the second: two spans and six blocks, the same counts */
  s0 = s1;
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_sigshard_add_prefix(sc, h, NB, got, acc), NB);
  assert_memory_equal(got, want, sizeof want);
  eldr_sigshard_stats_get(sc, &s1);
  assert_int_equal(s1.hits - s0.hits, 2 + 6);
  assert_int_equal(s1.spans, 2);
  /* another prompt sharing blocks 0..9: span 0, then blocks 7, 8, 9 */
  uint64_t *h2 = make_hashes(NB, 5);
  memcpy(h2, h, 10 * sizeof *h);
  memset(got, 0, sizeof got);
  memset(want, 0, sizeof want);
  assert_int_equal(eldr_counts_accumulate(&SH, sel, ELDR_SEL_U16, 10 * ELDR_BLOCK_TOKENS, want, NULL), 0);
  s0 = s1;
  assert_int_equal(eldr_sigshard_add_prefix(sc, h2, NB, got, acc), 10);
  assert_memory_equal(got, want, sizeof want);
  eldr_sigshard_stats_get(sc, &s1);
  assert_int_equal(s1.hits - s0.hits, 1 + 3);
  assert_int_equal(s1.spans, 2); /* blocks 7..13 of this prompt are not all held */
  /* add_held flags every block a held span covers */
  uint8_t held[NB];
  size_t prefix = 0;
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_sigshard_add_held(sc, h2, NB, got, acc, &prefix, held), 10);
  assert_int_equal(prefix, 10);
  for (size_t b = 0; b < NB; b++) assert_int_equal(held[b], b < 10);
  assert_memory_equal(got, want, sizeof want);
  eldr_sigshard_free(sc);
  free(sel);
  free(h);
  free(h2);
}

static void *race(void *arg) {
  racer *x = arg;
  uint32_t scratch[CELLS] = {0}, got[CELLS];
  pthread_barrier_wait(x->go);
  for (int r = 0; r < ROUNDS; r++) {
    size_t stored = 0;
    if (eldr_sigshard_store_blocks(x->sc, x->mine, TB, 0, x->sel, ELDR_SEL_U16, TB * ELDR_BLOCK_TOKENS, scratch,
                                   &stored) ||
        stored != TB)
      x->wrong++;
    /* the other thread's blocks: each row present is its exact row */
    memset(got, 0, sizeof got);
    x->missing += eldr_sigshard_add_blocks(x->sc, x->theirs, TB, got);
  }
  pthread_barrier_wait(x->go); /* both stored everything: every row is there */
  memset(got, 0, sizeof got);
  if (eldr_sigshard_add_blocks(x->sc, x->theirs, TB, got) != 0 || memcmp(got, x->want_theirs, sizeof got)) x->wrong++;
  return NULL;
}

static void test_two_threads(void **st) {
  (void)st;
  uint16_t *sel = make_sel(TB, 3);
  uint64_t *h0 = make_hashes(TB, 10), *h1 = make_hashes(TB, 11);
  eldr_sigshard *sc = eldr_sigshard_new(&SH, 4 * TB, 16, NULL); /* room for both */
  assert_non_null(sc);
  uint32_t want[CELLS] = {0};
  assert_int_equal(eldr_counts_accumulate(&SH, sel, ELDR_SEL_U16, TB * ELDR_BLOCK_TOKENS, want, NULL), 0);
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, 2);
  racer x[2] = {{sc, &go, sel, h0, h1, want, 0, 0}, {sc, &go, sel, h1, h0, want, 0, 0}};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, race, &x[1]), 0);
  race(&x[0]);
  pthread_join(th, NULL);
  pthread_barrier_destroy(&go);
  assert_int_equal(x[0].wrong, 0);
  assert_int_equal(x[1].wrong, 0);
  eldr_sigcache_stats s;
  eldr_sigshard_stats_get(sc, &s);
  assert_int_equal(s.rows, 2 * TB);
  assert_int_equal(s.evictions, 0);
  /* every lookup counted once, as a hit or a miss */
  assert_int_equal(s.hits + s.misses, 2 * (ROUNDS + 1) * (size_t)TB);
  assert_int_equal(s.misses, x[0].missing + x[1].missing);
  eldr_sigshard_free(sc);
  free(sel);
  free(h0);
  free(h1);
}


/* The planes a count keeps (eldr_counts_accumulate_planes) stored as rows
 * (eldr_sigshard_store_planes) equal the rows counted again from the ids
 * (eldr_sigshard_store_blocks): each level's planes converted at every
 * level (the portable converter of each layout included), E of 128 (rows
 * converted in place) and 100, masks of 8 layers and of 9 (one left to
 * the per-id kernel), and rows that do not start on a block (the planes
 * then unused: counted again, the same rows). */
#define PT 512 /* tokens: the bit kernel's minimum is 256 */
#define PL 10
static void planes_case(uint32_t E, const uint8_t *mask, eldr_cpu_level count_at, eldr_cpu_level store_at,
                        size_t first) {
  const eldr_shape sh = {PL, E, 8};
  const size_t cells = (size_t)PL * E, NB = PT / ELDR_BLOCK_TOKENS;
  uint8_t *sel = malloc((size_t)PT * PL * 8);
  assert_non_null(sel);
  uint64_t x = 7 + E + first;
  for (size_t r = 0; r < (size_t)PT * PL; r++) /* 8 distinct ids a row, skewed (r: token * PL + layer) */
    for (int k = 0; k < 8; k++) {
      uint8_t e;
      int dup;
      do {
        /* slot 0: one expert for a whole block (a count of 16: the sixteens plane) */
        e = k == 0 ? (uint8_t)((r / PL / ELDR_BLOCK_TOKENS * 5 + r % PL) % E)
                   : (uint8_t)(eldr_splitmix64(&x) % (k & 1 ? E : 24));
        dup = 0;
        for (int j = 0; j < k; j++) dup |= sel[r * 8 + (size_t)j] == e;
      } while (dup);
      sel[r * 8 + (size_t)k] = e;
    }
  uint64_t *h = make_hashes(NB, 40 + E);
  eldr_sigshard *a = eldr_sigshard_new(&sh, 256, 4, mask), *b = eldr_sigshard_new(&sh, 256, 4, mask);
  assert_non_null(a);
  assert_non_null(b);
  uint32_t *c1 = calloc(cells, sizeof *c1), *c2 = calloc(cells, sizeof *c2), *scratch = calloc(cells, 4);
  uint8_t *buf = malloc(NB * 2 * ELDR_PLANES_GROUP_BYTES);
  assert_true(c1 && c2 && scratch && buf);
  eldr_count_planes pl = {buf, NB * 2 * ELDR_PLANES_GROUP_BYTES, NULL, 0, 0, 0, 0, 0};
  const eldr_cpu_level was = eldr_cpu_set(count_at);
  const uint8_t *raw = sel + first * PL * 8;
  assert_int_equal(eldr_counts_accumulate_planes(&sh, raw, ELDR_SEL_U8, PT - first, mask, c1, NULL, &pl), 0);
  assert_int_equal(eldr_counts_accumulate_masked(&sh, raw, ELDR_SEL_U8, PT - first, mask, c2, NULL), 0);
  assert_memory_equal(c1, c2, cells * sizeof *c1);
  /* the bit kernel runs from AVX2 on (x86-64); nothing kept below it */
  const int kept = eldr_cpu_level_now() == ELDR_CPU_AVX2 || eldr_cpu_level_now() == ELDR_CPU_AVX512;
  assert_int_equal(pl.nblocks, kept ? (PT - first) / ELDR_BLOCK_TOKENS : 0);
  eldr_cpu_set(store_at);
  size_t na = 0, nb = 0;
  assert_int_equal(eldr_sigshard_store_planes(a, h, NB, first, raw, ELDR_SEL_U8, PT - first, &pl, scratch, &na), 0);
  assert_int_equal(eldr_sigshard_store_blocks(b, h, NB, first, raw, ELDR_SEL_U8, PT - first, scratch, &nb), 0);
  eldr_cpu_set(was);
  assert_int_equal(na, nb);
  assert_int_equal(na, NB - (first + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS);
  for (size_t i = 0; i < cells; i++) assert_int_equal(scratch[i], 0); /* left zeroed */
  for (size_t blk = NB - na; blk < NB; blk++) { /* every stored row, one at a time */
    memset(c1, 0, cells * sizeof *c1);
    memset(c2, 0, cells * sizeof *c2);
    assert_int_equal(eldr_sigshard_add_blocks(a, h + blk, 1, c1), 0);
    assert_int_equal(eldr_sigshard_add_blocks(b, h + blk, 1, c2), 0);
    assert_memory_equal(c1, c2, cells * sizeof *c1);
  }
  eldr_sigshard_free(a);
  eldr_sigshard_free(b);
  free(c1);
  free(c2);
  free(scratch);
  free(buf);
  free(sel);
  free(h);
}

static void test_planes_equal_recount(void **st) {
  (void)st;
  const uint8_t m8[PL] = {1, 1, 0, 1, 1, 1, 0, 1, 1, 1}, m9[PL] = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
  const eldr_cpu_level levels[3] = {ELDR_CPU_AVX512, ELDR_CPU_AVX2, ELDR_CPU_PORTABLE};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      planes_case(128, m8, levels[i], levels[j], 0);
      planes_case(100, m9, levels[i], levels[j], 0);
    }
  planes_case(128, m9, ELDR_CPU_AVX512, ELDR_CPU_AVX512, 16);
  planes_case(128, m8, ELDR_CPU_AVX512, ELDR_CPU_AVX512, 5);
  planes_case(128, m8, ELDR_CPU_AVX2, ELDR_CPU_AVX2, 21);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_as_one_cache),
      cmocka_unit_test(test_bounded_and_evicting),
      cmocka_unit_test(test_fits_count_refs_and_bad_args),
      cmocka_unit_test(test_two_threads),
      cmocka_unit_test(test_spans),
      cmocka_unit_test(test_planes_equal_recount),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
