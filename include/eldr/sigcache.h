/* eldr/sigcache.h — block-granular signature cache (docs/serve.md, "routed_experts"),
 * keyed by the prompt block-hash chain of eldr/tokenize.h.
 *
 * The cache stores, per block hash, one row of int8 per-(layer, expert)
 * counts of that block's tokens (saturating at 127; a block of 16 tokens
 * selects at most 16 times any expert of a layer, so the row is exact).
 * A request's prefill counts = sum of its cached blocks' rows + counts of
 * the tokens the engine computed; exact under partial prefix hits and
 * evictions as long as each used block's row is present.
 *
 * Ownership: eldr_sigcache is created by _new and released by _free; it is
 * not thread-safe (eldr/sigshard.h shares one between threads: shards of
 * it, each behind a mutex). Lookups and inserts allocate nothing (fixed capacity,
 * LRU eviction).
 */
#ifndef ELDR_SIGCACHE_H
#define ELDR_SIGCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/tokenize.h" /* ELDR_BLOCK_TOKENS, the block hashes */

typedef struct eldr_sigcache eldr_sigcache;

/* capacity: number of block rows kept (LRU beyond). NULL on error. */
eldr_sigcache *eldr_sigcache_new(const eldr_shape *shape, size_t capacity);
void eldr_sigcache_free(eldr_sigcache *c);

/* Store the counts (L*E) of one block's tokens under hash (replacing any
 * previous row). Returns 0, or ELDR_ERANGE if a count exceeds 127. */
int eldr_sigcache_put(eldr_sigcache *c, uint64_t hash, const uint32_t *block_counts);

/* Add the row stored under hash into counts (L*E). 0, or ELDR_ENOTFOUND. */
int eldr_sigcache_add(eldr_sigcache *c, uint64_t hash, uint32_t *counts);

/* Drop a row (e.g. when the engine evicts the block). 0 or ELDR_ENOTFOUND. */
int eldr_sigcache_remove(eldr_sigcache *c, uint64_t hash);

/* Rows currently held; hits, misses, evictions since creation. */
typedef struct eldr_sigcache_stats {
  size_t rows, capacity;
  uint64_t hits, misses, evictions;
} eldr_sigcache_stats;
void eldr_sigcache_stats_get(const eldr_sigcache *c, eldr_sigcache_stats *s);

/* Restrict the cache to the layers with mask[l] != 0 (L flags, copied; NULL
 * = all layers, the default): eldr_sigcache_store_blocks counts only those
 * layers, put stores zeros for the others, add adds only those. For a router
 * whose signature uses the artifact's layer mask; drop the cache's rows
 * (create a new cache) when the mask changes. 0, or ELDR_ENOMEM. */
int eldr_sigcache_set_layer_mask(eldr_sigcache *c, const uint8_t *mask);

/* The shape the cache was created with. */
const eldr_shape *eldr_sigcache_shape(const eldr_sigcache *c);

/* Add the rows of blocks hashes[0..nblocks) into counts (L*E, accumulated).
 * Returns the number of blocks whose row was missing (0 = exact). */
size_t eldr_sigcache_add_blocks(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks,
                                uint32_t *counts);

/* Store the rows of every block fully covered by a selection array.
 * raw: nrows * L * K selections of dtype (as in eldr_counts_accumulate),
 * holding the prompt tokens [first_token, first_token + nrows). hashes:
 * the prompt's nblocks block hashes. scratch: L*E uint32 (caller's buffer,
 * contents ignored, left zeroed). Writes the number of rows stored in
 * *stored (may be NULL). Returns 0, or ELDR_ERANGE for an expert id >= E
 * (rows stored before it are kept). Allocates nothing. */
int eldr_sigcache_store_blocks(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks,
                               size_t first_token, const void *raw, eldr_sel_dtype dtype,
                               size_t nrows, uint32_t *scratch, size_t *stored);

#endif
