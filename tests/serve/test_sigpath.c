/* test_sigpath.c — the router's signature path (src/serve/sigpath.c) as a
 * pure piece: the prompt's blocks and their bounds, the deferred store of
 * a prefill's block rows into the signature cache, the prediction at
 * arrival from the cached blocks, a cached prompt's signature without
 * recounting. (The cache itself: test_sigcache.c; the router around it:
 * test_serve.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "serve/serve_internal.h"
#include "serve/sigpath.h"

#include <event2/event.h>

/* The prompt's blocks: one tokenisation, the same chain as the tokenizer
 * and block hashes give, the prefix hash as before (first block, or the
 * text / ids when shorter than a block). */
static void test_prompt_blocks(void **st) {
  (void)st;
  eldr__sigpath sp;
  assert_int_equal(eldr__sigpath_init(&sp, NULL), 0);
  const char *text = "the quick brown fox jumps over the lazy dog, again and again, 1234567 times; "
                     "a prompt of more than two blocks of stand-in tokens";
  size_t len = strlen(text);
  uint32_t ids[256];
  size_t n = eldr_tokenize(text, len, ids, 256);
  assert_true(n >= 2 * ELDR_BLOCK_TOKENS && n < 256);
  uint64_t h[16];
  size_t nb = eldr_block_hashes(ids, n, ELDR_BLOCK_HASH_SEED, h);
  eldr__prompt p = {0};
  assert_int_equal(eldr__prompt_init(&sp, &p, text, len, NULL, 0), 0);
  assert_int_equal(p.ntok, n);
  assert_int_equal(p.nblocks, nb);
  assert_memory_equal(p.hashes, h, nb * sizeof *h);
  assert_true(p.prefix_hash == h[0]);
  /* the same prompt as token ids, into the same prompt: its buffer reused */
  const uint64_t *buf = p.hashes;
  assert_int_equal(eldr__prompt_init(&sp, &p, NULL, 0, ids, n), 0);
  assert_ptr_equal(p.hashes, buf);
  assert_int_equal(p.nblocks, nb);
  assert_memory_equal(p.hashes, h, nb * sizeof *h);
  /* a shorter prompt after it: no blocks left over from the longer one */
  assert_int_equal(eldr__prompt_init(&sp, &p, NULL, 0, ids, ELDR_BLOCK_TOKENS + 3), 0);
  assert_int_equal(p.ntok, ELDR_BLOCK_TOKENS + 3);
  assert_int_equal(p.nblocks, 1);
  assert_true(p.prefix_hash == h[0]);
  assert_int_equal(eldr__prompt_init(&sp, &p, NULL, 0, ids, 3), 0);
  assert_int_equal(p.nblocks, 0);
  assert_true(p.prefix_hash != h[0]);
  eldr__prompt_free(&p);
  assert_null(p.hashes);
  assert_int_equal(p.hashcap, 0);
  /* shorter than a block: no blocks; text and ids hash differently */
  eldr__prompt q = {0};
  assert_int_equal(eldr__prompt_init(&sp, &p, "short", 5, NULL, 0), 0);
  assert_int_equal(eldr__prompt_init(&sp, &q, NULL, 0, ids, 3), 0);
  assert_int_equal(p.nblocks, 0);
  assert_null(p.hashes);
  assert_int_equal(q.ntok, 3);
  assert_true(p.prefix_hash != q.prefix_hash);
  eldr__prompt_free(&p);
  eldr__prompt_free(&q);
  eldr__sigpath_free(&sp);
}

/* The loop's token-id buffer does not keep a large prompt's size: a 16 MiB
 * prompt once pinned 64 MiB of ids per loop for the router's lifetime
 * (ELDR_TEST_BIG_KIB=16384 build/test_bounded). The hashes are the same. */
static void test_prompt_ids_bounded(void **st) {
  (void)st;
  eldr__sigpath sp;
  assert_int_equal(eldr__sigpath_init(&sp, NULL), 0);
  const char *small = "a prompt that fits the kept buffer, with a block or two of stand-in tokens in it";
  eldr__prompt p = {0};
  assert_int_equal(eldr__prompt_init(&sp, &p, small, strlen(small), NULL, 0), 0);
  assert_non_null(sp.ids); /* kept for the next prompt */
  size_t len = 4 * ELDR__IDS_KEEP; /* bytes: up to as many tokens */
  char *big = malloc(len);
  assert_non_null(big);
  for (size_t i = 0; i < len; i++) big[i] = i % 7 == 6 ? ' ' : (char)('a' + i % 5);
  uint32_t *ids = malloc(len * sizeof *ids);
  assert_non_null(ids);
  size_t n = eldr_tokenize(big, len, ids, len);
  assert_true(n * sizeof *ids > ELDR__IDS_KEEP);
  size_t nb = n / ELDR_BLOCK_TOKENS;
  uint64_t *h = malloc(nb * sizeof *h);
  assert_non_null(h);
  assert_int_equal(eldr_block_hashes(ids, n, ELDR_BLOCK_HASH_SEED, h), nb);
  assert_int_equal(eldr__prompt_init(&sp, &p, big, len, NULL, 0), 0);
  assert_int_equal(p.ntok, n);
  assert_int_equal(p.nblocks, nb);
  assert_memory_equal(p.hashes, h, nb * sizeof *h);
  assert_true(sp.idscap * sizeof *sp.ids <= ELDR__IDS_KEEP); /* the large one went */
  /* a small prompt after it tokenises as before */
  eldr__prompt q = {0};
  assert_int_equal(eldr__prompt_init(&sp, &q, small, strlen(small), NULL, 0), 0);
  assert_non_null(sp.ids);
  assert_true(sp.idscap * sizeof *sp.ids <= ELDR__IDS_KEEP);
  free(big);
  free(ids);
  free(h);
  eldr__prompt_free(&p);
  eldr__prompt_free(&q);
  eldr__sigpath_free(&sp);
}


/* A prefill reply (npy layout) of rows [first, first + n) of sel. */
static json_t *npy_reply(const uint16_t *sel, size_t first, size_t n, size_t P, const eldr_shape *sh) {
  char *b64 = NULL;
  size_t blen = 0;
  assert_int_equal(eldr_routed_experts_encode(sel + first * sh->num_layers * sh->top_k, n, sh,
                                              ELDR_SEL_U8, &b64, &blen), 0);
  json_t *r = json_pack("{s:s,s:[{s:i,s:s}],s:{s:I,s:i}}", "object", "text_completion", "choices",
                        "index", 0, "routed_experts", b64, "usage", "prompt_tokens", (json_int_t)P,
                        "completion_tokens", 1);
  free(b64);
  assert_non_null(r);
  return r;
}

/* eldr__sigpath_extract on a reply's text (the span reader, as the router
 * reads a prefill reply: with the routed_experts span its scan found), the
 * text freed right after (the views do not point into it). */
static void extract_text(eldr__sigpath *sp, json_t *reply, const eldr__prompt *p, eldr__sigres *res) {
  char *txt = json_dumps(reply, JSON_COMPACT);
  assert_non_null(txt);
  eldr_reply_prefill pr = {0};
  assert_int_equal(eldr_reply_prefill_read(txt, strlen(txt), 0, &pr, NULL), 0);
  free(txt);
  assert_non_null(pr.raw); /* the scanner read it */
  eldr__sigpath_extract(sp, pr.raw, pr.raw_len, NULL, 0, pr.routed_experts, pr.routed_experts_len, pr.compact, p, res);
  eldr_reply_prefill_free(&pr);
}

/* The cache-row store is off the request's path: an extraction leaves its
 * store to the loop (nothing stored until the loop turns, no store run by
 * the next extractions while the ring has room), the loop stores every
 * pending one in a batch, and a later request with the same prefix, whose
 * reply carries only the uncached tail, gets exactly the full prompt's
 * counts from the stored rows. A full ring stores its oldest inline. */
static void test_sigpath_deferred_store(void **st) {
  (void)st;
  const eldr_shape sh = {3, 16, 2};
  eldr_artifact *a = eldr_artifact_new("t", &sh, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  assert_non_null(a);
  for (size_t i = 0; i < 2 * a->dim; i++) a->centroids[i] = (float)((i * 7919) % 13) + 1.0f;
  struct event_base *base = event_base_new();
  eldr__sigpath sp;
  eldr__sigconf conf;
  assert_int_equal(eldr__sigpath_init(&sp, base), 0);
  assert_int_equal(eldr__sigconf_build(&sp, a, 256, &conf, NULL), 0);
  eldr__sigpath_commit(&sp, &conf);
  enum { T = 3 * ELDR_BLOCK_TOKENS, NP = ELDR__SIG_RING + 1 };
  static uint16_t sel[NP][T * 3 * 2];
  char text[NP][T * 8];
  eldr__prompt pr[NP];
  memset(pr, 0, sizeof pr);
  json_t *full[NP];
  for (int q = 0; q < NP; q++) {
    size_t tl = 0;
    for (size_t t = 0; t < T; t++) tl += (size_t)snprintf(text[q] + tl, sizeof text[q] - tl, "%c%02zx ", (char)('a' + q), t);
    for (size_t i = 0; i < T * 6; i += 2) { /* two distinct experts per row */
      sel[q][i] = (uint16_t)((i * 5 + (size_t)q) % 16);
      sel[q][i + 1] = (uint16_t)((sel[q][i] + 1 + i % 7) % 16);
    }
    assert_int_equal(eldr__prompt_init(&sp, &pr[q], text[q], tl, NULL, 0), 0);
    assert_int_equal(pr[q].ntok, T);
    full[q] = npy_reply(sel[q], 0, T, T, &sh);
  }
  uint32_t expect[3 * 16];
  eldr__sigres res;
  eldr_sigcache_stats cs;
  for (int q = 0; q < ELDR__SIG_RING; q++) {
    extract_text(&sp, full[q], &pr[q], &res); /* bytes */
    assert_int_equal(res.fallback, ELDR__FB_NONE);
    assert_int_equal(res.n_tokens, T);
    memset(expect, 0, sizeof expect);
    assert_int_equal(eldr_counts_accumulate(&sh, sel[q], ELDR_SEL_U16, T, expect, NULL), 0);
    assert_memory_equal(res.counts, expect, sizeof expect);
    eldr__sigpath_defer(&sp, &res);
    eldr_sigshard_stats_get(sp.conf.cache, &cs);
    assert_int_equal(cs.rows, 0); /* not on this request's path, nor the next one's */
  }
  assert_int_equal(sp.stores_inline, 0);
  event_base_loop(base, EVLOOP_NONBLOCK); /* the loop turns: every pending store, in one batch */
  eldr_sigshard_stats_get(sp.conf.cache, &cs);
  assert_int_equal(cs.rows, 3 * ELDR__SIG_RING);
  assert_int_equal(sp.stores_deferred, ELDR__SIG_RING);
  /* prompt 0 again: the engine computed only its last block */
  json_t *tail = npy_reply(sel[0], 2 * ELDR_BLOCK_TOKENS, ELDR_BLOCK_TOKENS, T, &sh);
  extract_text(&sp, tail, &pr[0], &res);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_int_equal(res.n_tokens, T);
  memset(expect, 0, sizeof expect);
  assert_int_equal(eldr_counts_accumulate(&sh, sel[0], ELDR_SEL_U16, T, expect, NULL), 0);
  assert_memory_equal(res.counts, expect, sizeof expect);
  assert_int_equal(sp.blocks_missing, 0);
  eldr__sigpath_defer(&sp, &res);
  /* a full ring without a loop turn: the extraction that reuses the
   * oldest pending slot stores it first */
  for (int q = 1; q < NP; q++) {
    eldr__sigpath_extract(&sp, NULL, 0, full[q], 0, NULL, 0, (eldr_js_span){0, 0, ELDR_JS_NONE}, &pr[q], &res); /* a tree */
    eldr__sigpath_defer(&sp, &res);
  }
  assert_int_equal(sp.stores_inline, 1);
  eldr__sigpath_flush(&sp);
  eldr_sigshard_stats_get(sp.conf.cache, &cs);
  assert_int_equal(cs.rows, 3 * NP);
  /* nothing pending: the next extractions decode into the same slot (its
   * buffers still in the CPU's cache), the answers unchanged */
  const unsigned cur = sp.cur;
  for (int q = 1; q < 3; q++) {
    extract_text(&sp, full[q], NULL, &res);
    assert_int_equal(res.fallback, ELDR__FB_NONE);
    memset(expect, 0, sizeof expect);
    assert_int_equal(eldr_counts_accumulate(&sh, sel[q], ELDR_SEL_U16, T, expect, NULL), 0);
    assert_memory_equal(res.counts, expect, sizeof expect);
    assert_int_equal(sp.cur, cur);
  }
  for (int q = 0; q < NP; q++) {
    eldr__prompt_free(&pr[q]);
    json_decref(full[q]);
  }
  json_decref(tail);
  eldr__sigpath_free(&sp);
  event_base_free(base);
  eldr_artifact_free(a);
}

/* The two prediction tests' rig: a 2-centroid artifact on 3 layers x 16
 * experts, top 2, the middle layer masked out; a signature path with a
 * 256-row cache over it; and T tokens of deterministic selections. */
enum { PRED_T = 4 * ELDR_BLOCK_TOKENS + 5 };
static eldr_artifact *pred_rig(eldr__sigpath *sp, uint16_t sel[PRED_T * 3 * 2]) {
  const eldr_shape sh = {3, 16, 2};
  const uint8_t mask[3] = {1, 0, 1};
  eldr_artifact *a = eldr_artifact_new("t", &sh, NULL, ELDR_REPR_COUNT, 0, mask, 2);
  assert_non_null(a);
  for (size_t i = 0; i < 2 * a->dim; i++) a->centroids[i] = (float)((i * 7919) % 13) + 1.0f;
  eldr__sigconf conf;
  assert_int_equal(eldr__sigpath_init(sp, NULL), 0);
  assert_int_equal(eldr__sigconf_build(sp, a, 256, &conf, NULL), 0);
  eldr__sigpath_commit(sp, &conf);
  for (size_t i = 0; i < PRED_T * 6; i += 2) {
    sel[i] = (uint16_t)((i * 5 + i / 7) % 16);
    sel[i + 1] = (uint16_t)((sel[i] + 1 + i % 7) % 16);
  }
  return a;
}

/* At arrival (eldr__sigpath_predict): a prompt whose blocks the cache
 * holds gets the exact counts of those blocks and the share of its tokens
 * they cover; below the threshold no signature (load decides); without a
 * cache none at all. */
static void test_sigpath_predict(void **st) {
  (void)st;
  eldr__sigpath sp;
  enum { T = PRED_T };
  static uint16_t sel[T * 3 * 2];
  eldr_artifact *a = pred_rig(&sp, sel);
  const eldr_shape sh = a->shape;
  const uint8_t *mask = a->mask;
  char text[T * 8], text2[T * 8];
  size_t tl = 0, tl2 = 0;
  for (size_t t = 0; t < T; t++) {
    tl += (size_t)snprintf(text + tl, sizeof text - tl, "c%02zx ", t);
    /* the same first 2 blocks, then other tokens */
    tl2 += (size_t)snprintf(text2 + tl2, sizeof text2 - tl2, "%c%02zx ", t < 2 * ELDR_BLOCK_TOKENS ? 'c' : 'd', t);
  }
  eldr__prompt pr = {0}, pr2 = {0};
  assert_int_equal(eldr__prompt_init(&sp, &pr, text, tl, NULL, 0), 0);
  assert_int_equal(eldr__prompt_init(&sp, &pr2, text2, tl2, NULL, 0), 0);
  assert_int_equal(pr2.ntok, T);
  eldr__sigres res;
  eldr_prediction pred;
  /* nothing held yet: no prediction */
  assert_int_equal(eldr__sigpath_predict(&sp, &pr, 0.5, &res, &pred), 0);
  assert_int_equal(pred.known_tokens, 0);
  assert_null(res.sig);
  json_t *full = npy_reply(sel, 0, T, T, &sh);
  extract_text(&sp, full, &pr, &res);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  eldr__sigpath_store(&sp, &res);
  /* the same prompt: its 4 full blocks known, the last 5 tokens not */
  uint32_t expect[3 * 16];
  memset(expect, 0, sizeof expect);
  assert_int_equal(eldr_counts_accumulate_masked(&sh, sel, ELDR_SEL_U16, 4 * ELDR_BLOCK_TOKENS, mask, expect, NULL), 0);
  assert_int_equal(eldr__sigpath_predict(&sp, &pr, 0.5, &res, &pred), 1);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_non_null(res.sig);
  assert_int_equal(pred.prompt_tokens, T);
  assert_int_equal(pred.known_tokens, 4 * ELDR_BLOCK_TOKENS);
  assert_int_equal(pred.prefix_blocks, 4);
  assert_true(fabs(pred.confidence - (double)(4 * ELDR_BLOCK_TOKENS) / T) < 1e-12);
  assert_int_equal(res.n_tokens, 4 * ELDR_BLOCK_TOKENS);
  assert_memory_equal(res.counts, expect, sizeof expect);
  /* a prompt sharing 2 blocks: 32 of 69 tokens known, below 0.5 */
  assert_int_equal(eldr__sigpath_predict(&sp, &pr2, 0.5, &res, &pred), 0);
  assert_int_equal(pred.known_tokens, 2 * ELDR_BLOCK_TOKENS);
  assert_null(res.sig);
  assert_int_equal(res.fallback, ELDR__FB_NO_ROUTED_EXPERTS);
  /* at a threshold of 0.4 it is routed on: the 2 blocks' exact counts */
  memset(expect, 0, sizeof expect);
  assert_int_equal(eldr_counts_accumulate_masked(&sh, sel, ELDR_SEL_U16, 2 * ELDR_BLOCK_TOKENS, mask, expect, NULL), 0);
  assert_int_equal(eldr__sigpath_predict(&sp, &pr2, 0.4, &res, &pred), 1);
  assert_memory_equal(res.counts, expect, sizeof expect);
  eldr__prompt_free(&pr);
  eldr__prompt_free(&pr2);
  json_decref(full);
  eldr__sigpath_free(&sp);
  /* no cache: no prediction */
  eldr__sigconf conf;
  assert_int_equal(eldr__sigpath_init(&sp, NULL), 0);
  assert_int_equal(eldr__sigconf_build(&sp, a, 0, &conf, NULL), 0);
  eldr__sigpath_commit(&sp, &conf);
  assert_int_equal(eldr__prompt_init(&sp, &pr, text, tl, NULL, 0), 0);
  assert_int_equal(eldr__sigpath_predict(&sp, &pr, 0.0, &res, &pred), 0);
  assert_int_equal(res.fallback, ELDR__FB_NO_ARTIFACT);
  eldr__prompt_free(&pr);
  eldr__sigpath_free(&sp);
  eldr_artifact_free(a);
}

/* extract_text on a reply's JSON text as given (escapes and all). */
static void extract_raw(eldr__sigpath *sp, const char *txt, const eldr__prompt *p, eldr__sigres *res) {
  eldr_reply_prefill pr = {0};
  assert_int_equal(eldr_reply_prefill_read(txt, strlen(txt), 0, &pr, NULL), 0);
  assert_non_null(pr.raw);
  eldr__sigpath_extract(sp, pr.raw, pr.raw_len, NULL, 0, pr.routed_experts, pr.routed_experts_len, pr.compact, p, res);
  eldr_reply_prefill_free(&pr);
}

/* A prompt the cache holds, its reply carrying every row (vLLM since PR
 * #39917): the rows of the held blocks are taken from the cache and not
 * read from the reply (its view starts after them), the counts are the
 * full prompt's; the store counts nothing again. The same with the reply's
 * base64 written with escaped slashes (read whole, then the held rows left
 * out), in vLLM 0.21's list layout, and for a prompt hashed with another
 * token count than the engine's (the reply read whole). */
static void test_sigpath_cached_prompt(void **st) {
  (void)st;
  eldr__sigpath sp;
  enum { T = PRED_T };
  static uint16_t sel[T * 3 * 2];
  eldr_artifact *a = pred_rig(&sp, sel);
  const eldr_shape sh = a->shape;
  const uint8_t *mask = a->mask;
  char text[T * 8], text2[T * 8 + 8];
  size_t tl = 0;
  for (size_t t = 0; t < T; t++) tl += (size_t)snprintf(text + tl, sizeof text - tl, "c%02zx ", t);
  eldr__prompt pr = {0}, pr2 = {0};
  assert_int_equal(eldr__prompt_init(&sp, &pr, text, tl, NULL, 0), 0);
  assert_int_equal(pr.ntok, T);
  uint32_t expect[3 * 16];
  memset(expect, 0, sizeof expect);
  assert_int_equal(eldr_counts_accumulate_masked(&sh, sel, ELDR_SEL_U16, T, mask, expect, NULL), 0);
  json_t *full = npy_reply(sel, 0, T, T, &sh);
  eldr__sigres res;
  eldr_sigcache_stats c0, c1;
  extract_text(&sp, full, &pr, &res); /* the first time: every row read, every block stored */
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_int_equal(res.view.rows, T);
  eldr__sigpath_store(&sp, &res);
  eldr_sigshard_stats_get(sp.conf.cache, &c0);
  assert_int_equal(c0.stored, 4);
  /* again: the 4 held blocks come from the cache (the last token's block too:
   * T is not a multiple of 16), the reply's rows from token 64 on are read */
  extract_text(&sp, full, &pr, &res);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_memory_equal(res.counts, expect, sizeof expect);
  assert_int_equal(res.n_tokens, T);
  assert_int_equal(res.view.first_token, 4 * ELDR_BLOCK_TOKENS);
  assert_int_equal(res.view.rows, 5);
  eldr__sigpath_store(&sp, &res);
  eldr_sigshard_stats_get(sp.conf.cache, &c1);
  assert_int_equal(c1.hits - c0.hits, 4);
  assert_int_equal(c1.stored, c0.stored); /* nothing counted again */
  assert_int_equal(sp.blocks_missing, 0);
  /* an escaped character in the base64 (JSON allows \u00XX for any): the
   * value is decoded whole, the held rows still left out */
  char *txt = json_dumps(full, JSON_COMPACT);
  assert_non_null(txt);
  char *blob = strstr(txt, "\"routed_experts\":\"");
  assert_non_null(blob);
  blob += 18;
  size_t tl2 = strlen(txt), at = (size_t)(blob - txt) + 40; /* a character inside the rows */
  char *esc = malloc(tl2 + 8);
  assert_non_null(esc);
  memcpy(esc, txt, at);
  int w = snprintf(esc + at, 8, "\\u%04x", (unsigned char)txt[at]);
  memcpy(esc + at + w, txt + at + 1, tl2 - at);
  free(txt);
  extract_raw(&sp, esc, &pr, &res);
  free(esc);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_memory_equal(res.counts, expect, sizeof expect);
  assert_int_equal(res.view.first_token, 4 * ELDR_BLOCK_TOKENS);
  /* vLLM 0.21's lists: the prompt rows in prompt_routed_experts */
  json_t *rows = json_array();
  for (size_t t = 0; t < T; t++) {
    json_t *lay = json_array();
    for (size_t l = 0; l < 3; l++)
      json_array_append_new(lay, json_pack("[i,i]", sel[(t * 3 + l) * 2], sel[(t * 3 + l) * 2 + 1]));
    json_array_append_new(rows, lay);
  }
  json_t *v021 = json_pack("{s:s,s:o,s:[{s:i,s:[]}],s:{s:I,s:i}}", "object", "text_completion",
                           "prompt_routed_experts", rows, "choices", "index", 0, "routed_experts", "usage",
                           "prompt_tokens", (json_int_t)T, "completion_tokens", 1);
  assert_non_null(v021);
  extract_text(&sp, v021, &pr, &res);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_memory_equal(res.counts, expect, sizeof expect);
  assert_int_equal(res.view.first_token, 4 * ELDR_BLOCK_TOKENS);
  /* a prompt of one token more than the engine's (another tokenizer): the
   * blocks it shares look held, but the reply is read whole */
  memcpy(text2, text, tl);
  memcpy(text2 + tl, "zz", 3);
  assert_int_equal(eldr__prompt_init(&sp, &pr2, text2, tl + 2, NULL, 0), 0);
  assert_int_equal(pr2.ntok, T + 1);
  uint64_t mism = sp.tokenizer_mismatch;
  extract_text(&sp, full, &pr2, &res);
  assert_int_equal(res.fallback, ELDR__FB_NONE);
  assert_memory_equal(res.counts, expect, sizeof expect);
  assert_int_equal(res.view.first_token, 0);
  assert_int_equal(sp.tokenizer_mismatch, mism + 1);
  json_decref(v021);
  json_decref(full);
  eldr__prompt_free(&pr);
  eldr__prompt_free(&pr2);
  eldr__sigpath_free(&sp);
  eldr_artifact_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prompt_blocks),
      cmocka_unit_test(test_prompt_ids_bounded),
      cmocka_unit_test(test_sigpath_deferred_store),
      cmocka_unit_test(test_sigpath_predict),
      cmocka_unit_test(test_sigpath_cached_prompt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
