/* test_predict.c — the signature predicted at arrival (eldr/predict.h): the
 * found blocks' rows are exactly those blocks' share of the true counts
 * (checked against counts taken from the selections themselves), the
 * longest held prefix and the held blocks after a gap, the confidence as
 * the token share, the cache's layer mask, hits without misses, and the
 * routing rule the router and the simulator share. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/predict.h"
#include "eldr/rng.h"
#include "eldr/tokenize.h"

static const eldr_shape SH = {4, 32, 2};
#define LK (4 * 2)
#define CELLS (4 * 32)

/* Causal selections of a token stream: token t's experts depend on the
 * ids up to t (a running hash), as a real model's do on the prefix. */
static uint16_t *causal_sel(const uint32_t *ids, size_t n) {
  uint16_t *sel = malloc((n ? n : 1) * LK * sizeof *sel);
  assert_non_null(sel);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t t = 0; t < n; t++) {
    h = (h ^ ids[t]) * 0x100000001b3ull;
    for (size_t l = 0; l < 4; l++) {
      uint16_t a = (uint16_t)((h >> (8 * l)) % 32);
      sel[t * LK + l * 2] = a;
      sel[t * LK + l * 2 + 1] = (uint16_t)((a + 1 + (h >> 40) % 31) % 32);
    }
  }
  return sel;
}

typedef struct prompt {
  uint32_t ids[2048];
  size_t n, nb;
  uint64_t hashes[128];
  uint16_t *sel;
} prompt;

static void prompt_make(prompt *p, const char *text) {
  p->n = eldr_tokenize(text, strlen(text), p->ids, 2048);
  assert_true(p->n < 2048);
  p->nb = eldr_block_hashes(p->ids, p->n, ELDR_BLOCK_HASH_SEED, p->hashes);
  p->sel = causal_sel(p->ids, p->n);
}

/* A text of nwords words drawn from a seeded vocabulary; the first
 * shared words equal for equal prefix seeds. */
static char *words(uint64_t prefix_seed, size_t shared, uint64_t tail_seed, size_t nwords) {
  char *s = malloc(nwords * 12 + 1);
  assert_non_null(s);
  size_t k = 0;
  uint64_t a = prefix_seed, b = tail_seed;
  for (size_t i = 0; i < nwords; i++) {
    uint64_t x = i < shared ? eldr_splitmix64(&a) : eldr_splitmix64(&b);
    k += (size_t)sprintf(s + k, "w%u ", (unsigned)(x % 900 + 100));
  }
  s[k] = 0;
  return s;
}

/* The true counts of blocks [b0, b1) of p, from the selections. */
static void block_counts(const prompt *p, size_t b0, size_t b1, const uint8_t *mask, uint32_t *out) {
  memset(out, 0, CELLS * sizeof *out);
  assert_int_equal(eldr_counts_accumulate(&SH, p->sel + b0 * ELDR_BLOCK_TOKENS * LK, ELDR_SEL_U16,
                                          (b1 - b0) * ELDR_BLOCK_TOKENS, out, NULL),
                   0);
  for (size_t l = 0; mask && l < 4; l++)
    if (!mask[l]) memset(out + l * 32, 0, 32 * sizeof *out);
}

static void store(eldr_sigshard *c, const prompt *p, size_t first_block) {
  uint32_t scratch[CELLS] = {0};
  size_t first = first_block * ELDR_BLOCK_TOKENS, stored = 0;
  assert_int_equal(eldr_sigshard_store_blocks(c, p->hashes, p->nb, first, p->sel + first * LK, ELDR_SEL_U16,
                                              p->n - first, scratch, &stored),
                   0);
}

static void test_prefix_exact(void **st) {
  (void)st;
  eldr_sigshard *c = eldr_sigshard_new(&SH, 4096, 4, NULL);
  assert_non_null(c);
  /* an earlier request: 300 words; the arriving one shares its first 200 */
  char *t1 = words(7, 300, 1, 300), *t2 = words(7, 200, 2, 330);
  prompt a, b;
  prompt_make(&a, t1);
  prompt_make(&b, t2);
  store(c, &a, 0);
  /* blocks of b equal to a's: the shared words' whole blocks */
  size_t same = 0;
  while (same < b.nb && same < a.nb && b.hashes[same] == a.hashes[same]) same++;
  assert_true(same >= 8 && same < b.nb);
  uint32_t got[CELLS] = {0}, want[CELLS];
  uint8_t acc[2 * CELLS];
  eldr_prediction pr;
  assert_int_equal(eldr_predict_from_cache(c, b.hashes, b.nb, (uint32_t)b.n, got, acc, &pr), 0);
  block_counts(&b, 0, same, NULL, want);
  assert_memory_equal(got, want, sizeof want);
  for (size_t i = 0; i < 2 * CELLS; i++) assert_int_equal(acc[i], 0); /* scratch left zeroed */
  assert_int_equal(pr.prefix_blocks, same);
  assert_int_equal(pr.later_blocks, 0);
  assert_int_equal(pr.known_tokens, same * ELDR_BLOCK_TOKENS);
  assert_int_equal(pr.prompt_tokens, b.n);
  assert_float_equal(pr.confidence, (double)(same * ELDR_BLOCK_TOKENS) / (double)b.n, 1e-12);
  /* the request itself again: every full block known; the partial tail is not */
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_predict_from_cache(c, a.hashes, a.nb, (uint32_t)a.n, got, acc, &pr), 0);
  block_counts(&a, 0, a.nb, NULL, want);
  assert_memory_equal(got, want, sizeof want);
  assert_int_equal(pr.prefix_blocks, a.nb);
  assert_true(pr.confidence <= 1.0 && pr.confidence > 0.9);
  free(t1);
  free(t2);
  free(a.sel);
  free(b.sel);
  eldr_sigshard_free(c);
}

static void test_gap_mask_and_stats(void **st) {
  (void)st;
  const uint8_t mask[4] = {1, 0, 0, 1};
  eldr_sigshard *c = eldr_sigshard_new(&SH, 4096, 1, mask);
  assert_non_null(c);
  char *t = words(11, 400, 3, 400);
  prompt p;
  prompt_make(&p, t);
  /* only blocks 5.. were stored (5 leading rows evicted, as it were) */
  store(c, &p, 5);
  eldr_sigcache_stats s0, s1;
  eldr_sigshard_stats_get(c, &s0);
  uint32_t got[CELLS] = {0}, want[CELLS];
  uint8_t acc[2 * CELLS];
  eldr_prediction pr;
  assert_int_equal(eldr_predict_from_cache(c, p.hashes, p.nb, (uint32_t)p.n, got, acc, &pr), 0);
  block_counts(&p, 5, p.nb, mask, want);
  assert_memory_equal(got, want, sizeof want); /* masked layers only, exact */
  assert_int_equal(pr.prefix_blocks, 0);
  assert_int_equal(pr.later_blocks, p.nb - 5);
  assert_int_equal(pr.known_tokens, (p.nb - 5) * ELDR_BLOCK_TOKENS);
  eldr_sigshard_stats_get(c, &s1);
  assert_int_equal(s1.hits - s0.hits, p.nb - 5); /* the first read: every held block's row */
  assert_int_equal(s1.spans, (p.nb - 7) / ELDR_SIGSHARD_SPAN); /* spans 7.. built (blocks 0..6 are not all held) */
  assert_int_equal(s1.misses, s0.misses); /* new blocks are not misses */
  /* held flags and the counts accumulate into what the caller had */
  uint8_t held[128];
  size_t prefix = 99;
  for (size_t i = 0; i < CELLS; i++) got[i] = 1;
  assert_int_equal(eldr_sigshard_add_held(c, p.hashes, p.nb, got, acc, &prefix, held), p.nb - 5);
  assert_int_equal(prefix, 0);
  for (size_t b = 0; b < p.nb; b++) assert_int_equal(held[b], b >= 5);
  for (size_t i = 0; i < CELLS; i++) assert_int_equal(got[i], want[i] + 1);
  /* more blocks than the tokens hold are cut to the prompt's */
  memset(got, 0, sizeof got);
  assert_int_equal(eldr_predict_from_cache(c, p.hashes, p.nb, 5 * ELDR_BLOCK_TOKENS, got, acc, &pr), 0);
  assert_int_equal(pr.nblocks, 5);
  assert_int_equal(pr.known_tokens, 0);
  assert_float_equal(pr.confidence, 0.0, 0);
  free(t);
  free(p.sel);
  eldr_sigshard_free(c);
}

/* Many prompts over a shared vocabulary of prefixes: the prediction never
 * exceeds the truth, and equals the truth of the blocks it found. */
static void test_never_more_than_truth(void **st) {
  (void)st;
  eldr_sigshard *c = eldr_sigshard_new(&SH, 1 << 14, 8, NULL);
  assert_non_null(c);
  uint64_t r = 5;
  size_t with_prefix = 0, partial = 0;
  for (int i = 0; i < 60; i++) {
    size_t shared = eldr_splitmix64(&r) % 260, n = shared + 10 + eldr_splitmix64(&r) % 200;
    char *t = words(eldr_splitmix64(&r) % 4, shared, (uint64_t)i + 100, n);
    prompt p;
    prompt_make(&p, t);
    uint32_t got[CELLS] = {0}, all[CELLS];
    uint8_t acc[2 * CELLS], held[128];
    eldr_prediction pr;
    assert_int_equal(eldr_predict_from_cache(c, p.hashes, p.nb, (uint32_t)p.n, got, acc, &pr), 0);
    memset(all, 0, sizeof all);
    assert_int_equal(eldr_counts_accumulate(&SH, p.sel, ELDR_SEL_U16, p.n, all, NULL), 0);
    for (size_t k = 0; k < CELLS; k++) assert_true(got[k] <= all[k]);
    /* the found blocks, one by one */
    uint32_t want[CELLS] = {0}, one[CELLS];
    uint32_t scratch2[CELLS] = {0};
    size_t pre = 0;
    (void)eldr_sigshard_add_held(c, p.hashes, p.nb, scratch2, acc, &pre, held);
    for (size_t b = 0; b < p.nb; b++)
      if (held[b]) {
        block_counts(&p, b, b + 1, NULL, one);
        for (size_t k = 0; k < CELLS; k++) want[k] += one[k];
      }
    assert_memory_equal(got, want, sizeof want);
    assert_true(eldr_predict_confidence(pr.known_tokens, pr.prompt_tokens) == pr.confidence);
    with_prefix += pr.prefix_blocks > 0;
    partial += pr.prefix_blocks > 0 && pr.prefix_blocks < pr.nblocks;
    store(c, &p, 0); /* its prefill ran: its rows are known to the next */
    free(t);
    free(p.sel);
  }
  assert_true(with_prefix >= 20); /* the prompts do share prefixes, partly */
  assert_true(partial >= 10);
  eldr_sigshard_free(c);
}

static void test_rule(void **st) {
  (void)st;
  assert_float_equal(eldr_predict_confidence(0, 0), 0, 0);
  assert_float_equal(eldr_predict_confidence(32, 64), 0.5, 0);
  assert_float_equal(eldr_predict_confidence(80, 64), 1.0, 0);
  assert_true(eldr_predict_usable(0.5, 32, 0.5));
  assert_false(eldr_predict_usable(0.49, 32, 0.5));
  assert_false(eldr_predict_usable(0.0, 0, 0.0)); /* nothing known: never */
  assert_true(eldr_predict_usable(0.01, 16, 0.0));
  assert_false(eldr_predict_usable(0.0 / 0.0, 16, 0.0));
  uint32_t counts[CELLS];
  uint8_t acc[2 * CELLS];
  eldr_prediction pr;
  assert_int_equal(eldr_predict_from_cache(NULL, NULL, 0, 10, counts, acc, &pr), ELDR_EINVAL);
  eldr_sigshard *c = eldr_sigshard_new(&SH, 64, 1, NULL);
  assert_int_equal(eldr_predict_from_cache(c, NULL, 3, 100, counts, acc, &pr), ELDR_EINVAL);
  assert_int_equal(eldr_predict_from_cache(c, NULL, 0, 0, counts, acc, &pr), 0);
  assert_int_equal(pr.known_tokens, 0);
  eldr_sigshard_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefix_exact),
      cmocka_unit_test(test_gap_mask_and_stats),
      cmocka_unit_test(test_never_more_than_truth),
      cmocka_unit_test(test_rule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
