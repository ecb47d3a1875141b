/* kvcache.h — the emulated worker's paged KV cache (internal to src/worker).
 *
 * A fixed pool of blocks of ELDR_BLOCK_TOKENS tokens. A full block that has
 * been computed is registered under its block hash (eldr_block_hashes chain)
 * so a later prompt with the same prefix reuses it (prefix caching). Blocks
 * are reference counted; an unreferenced registered block stays cached on an
 * LRU list and is evicted (hash dropped) only when a new block is needed.
 * The block-granular signature cache (eldr/sigcache.h) is co-indexed: when
 * a block is registered its per-(layer, expert) counts row is stored under
 * the block hash, and when the block is evicted the row is removed, so the
 * signature cache holds exactly the rows of the blocks the KV cache holds.
 *
 * Ownership: eldr__kv owns its arrays and its eldr_sigcache. Not thread-safe.
 * Nothing here allocates after eldr__kv_new.
 */
#ifndef ELDR_WORKER_KVCACHE_H
#define ELDR_WORKER_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/sigcache.h"

typedef struct eldr__kv eldr__kv;

/* n_blocks >= 1. shape may be NULL: then no signature cache is kept. */
eldr__kv *eldr__kv_new(size_t n_blocks, const eldr_shape *shape);
void eldr__kv_free(eldr__kv *kv);

/* Number of leading hashes whose blocks are cached (prefix hit length). */
size_t eldr__kv_match(const eldr__kv *kv, const uint64_t *hashes, size_t n);

/* Blocks that an allocation of `total` blocks with `hit` cached leading
 * blocks would need to take from the free/evictable pool. */
size_t eldr__kv_free_blocks(const eldr__kv *kv);

/* Reserve blocks for a sequence: the first `hit` entries of hashes must be
 * cached (from eldr__kv_match) and get a reference; total - hit new blocks are
 * taken (evicting LRU cached blocks as needed). ids receives total block ids.
 * Returns 0, or ELDR_EUNAVAIL (not enough blocks now; nothing changed). */
int eldr__kv_alloc(eldr__kv *kv, const uint64_t *hashes, size_t hit, size_t total,
                   int32_t *ids);

/* After computing: register block ids[i] under hashes[i] for i in [from, n)
 * (full blocks only), storing rows[i - from] (L*E counts each, rows may be
 * NULL) in the signature cache. A hash that is already registered to another
 * block is left as is (the duplicate block stays unregistered). */
void eldr__kv_register(eldr__kv *kv, const int32_t *ids, const uint64_t *hashes, size_t from,
                       size_t n, const uint32_t *rows, size_t row_stride);

/* Drop one reference on each of ids[0..n), last first: blocks that become
 * unreferenced join the LRU in reverse order, so a prefix outlives its tail. */
void eldr__kv_release(eldr__kv *kv, const int32_t *ids, size_t n);

/* Blocks with a reference, total blocks, evictions so far. */
size_t eldr__kv_used(const eldr__kv *kv);
size_t eldr__kv_total(const eldr__kv *kv);
uint64_t eldr__kv_evictions(const eldr__kv *kv);

/* The co-indexed signature cache (NULL when created without a shape). */
eldr_sigcache *eldr__kv_sigcache(eldr__kv *kv);

#endif
