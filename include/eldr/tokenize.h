/* eldr/tokenize.h — prompt tokens and KV blocks: eldr's deterministic
 * stand-in tokenizer and the block hash chain that names a prompt prefix.
 *
 * Prompts are cut into blocks of ELDR_BLOCK_TOKENS tokens (16, like vLLM's
 * paged KV cache). Block i's hash chains the previous block's hash with the
 * block's token ids (xxhash64), so a block hash identifies the whole prefix
 * up to and including that block — the key of the emulated worker's KV
 * prefix cache and of the router's signature cache, which must agree: both
 * chain from ELDR_BLOCK_HASH_SEED.
 *
 * eldr_tokenize() is shared by the emulated worker and the router, so both
 * see the same block boundaries. Against a real engine, feed the engine's
 * token ids instead.
 *
 * Pure functions: no allocation, no state, any thread.
 */
#ifndef ELDR_TOKENIZE_H
#define ELDR_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#define ELDR_BLOCK_TOKENS 16
/* The chain's "no parent" hash, for every caller. */
#define ELDR_BLOCK_HASH_SEED 0

/* Writes up to cap token ids of text[0..len) into ids and returns the number
 * of tokens the text has (may exceed cap). A text never has more tokens than
 * bytes: cap >= len always takes every token in one pass. */
size_t eldr_tokenize(const char *text, size_t len, uint32_t *ids, size_t cap);

/* Hash chain of the full blocks of ids[0..n): writes n / ELDR_BLOCK_TOKENS
 * hashes (caller's buffer) and returns that count. seed = hash of "no
 * parent" (ELDR_BLOCK_HASH_SEED for the chain the caches share). */
size_t eldr_block_hashes(const uint32_t *ids, size_t n, uint64_t seed, uint64_t *hashes);

#endif
