/* eldr/sigshard.h — the block-granular signature cache (eldr/sigcache.h)
 * shared by threads: split into shards by block hash, each an
 * eldr_sigcache behind its own mutex, so operations on blocks of different
 * shards never wait for each other. The router's event loops share one
 * (docs/architecture.md, "Threads").
 *
 * Memory is bounded as the single cache's: the capacity is split over the
 * shards (shard i holds capacity / n rows, the first capacity % n one
 * more), and each shard evicts its own least recently used row, so
 * eviction is LRU within a shard (approximately LRU overall: block hashes
 * spread evenly over the shards).
 *
 * Ownership: eldr_sigshard_new returns one reference; eldr_sigshard_ref
 * adds one, eldr_sigshard_free drops one and frees the cache with the last.
 * Errors: NULL from _new on bad arguments or ENOMEM; the operations return
 * those of eldr/sigcache.h. Threads: every function may be called from any
 * thread at once, except that the cache must not be used after its last
 * reference is dropped. Lookups and stores allocate nothing.
 */
#ifndef ELDR_SIGSHARD_H
#define ELDR_SIGSHARD_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/sigcache.h"

typedef struct eldr_sigshard eldr_sigshard;

#define ELDR_SIGSHARD_MAX 64 /* shards at most */

/* Span rows. Besides a row per block, the cache keeps a row per aligned
 * run of ELDR_SIGSHARD_SPAN blocks (blocks [7i, 7i + 7) of a prompt): the
 * sum of the run's block rows (at most 7 x 16 a cell, within a row's 127),
 * under a key made from the run's last block hash, which names the whole
 * prefix. add_prefix and add_held take a held span row in one lookup and
 * one row's bytes instead of seven: a prompt the cache holds whole reads a
 * seventh of the rows. A span is built by the first of them that finds
 * the run's seven block rows held (from those rows; later reads take the
 * span), so a prompt never read again costs no span. Spans are rows like
 * any other (capacity, LRU, hits, evictions; the stats' spans counts those
 * built); reading a span does not refresh its block rows, which a prompt
 * sharing only part of the run still reads. */
#define ELDR_SIGSHARD_SPAN 7

/* The shard count for a capacity: a power of two, at most
 * ELDR_SIGSHARD_MAX, with at least ELDR_SIGSHARD_MIN_ROWS rows per shard
 * (1 for a smaller capacity: small caches keep exact LRU). */
#define ELDR_SIGSHARD_MIN_ROWS 256
unsigned eldr_sigshard_count_for(size_t capacity);

/* A cache of capacity rows in nshards shards (a power of two in
 * [1, ELDR_SIGSHARD_MAX], at most capacity) for the layers with mask[l]
 * != 0 (L flags, copied; NULL: all layers). NULL on bad arguments or ENOMEM. */
eldr_sigshard *eldr_sigshard_new(const eldr_shape *shape, size_t capacity, unsigned nshards,
                                 const uint8_t *mask);
eldr_sigshard *eldr_sigshard_ref(eldr_sigshard *c);
void eldr_sigshard_free(eldr_sigshard *c);

/* 1 when c's rows are valid for shape and mask (NULL: all layers) and c
 * holds capacity rows: a cache that can be kept across a reload. */
int eldr_sigshard_fits(const eldr_sigshard *c, const eldr_shape *shape, const uint8_t *mask,
                       size_t capacity);
const eldr_shape *eldr_sigshard_shape(const eldr_sigshard *c);
unsigned eldr_sigshard_nshards(const eldr_sigshard *c);

/* eldr_sigcache_add_blocks over the shards: the rows of hashes[0..nblocks)
 * added into counts (L*E); the number of blocks whose row was missing. */
size_t eldr_sigshard_add_blocks(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks,
                                uint32_t *counts);

/* eldr_sigcache_add_prefix over the shards: the rows of the leading held
 * blocks added into counts, up to the first block not held; their number.
 * A span held at an aligned block is taken for its blocks' rows (whether
 * they are still held or not), and one is built where its seven block rows
 * are held. acc: 2 x eldr_sigcache_row_bytes bytes of scratch (the byte
 * sums, then a span being built; left zeroed). */
size_t eldr_sigshard_add_prefix(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, uint32_t *counts,
                                uint8_t *acc);

/* Every held block of hashes[0..nblocks) added into counts (L*E), the
 * blocks not held skipped (not counted as misses, unlike add_blocks): the
 * number held (a held span's blocks held; spans built as add_prefix
 * builds them). *prefix (may be NULL): the leading run of held blocks;
 * held (may be NULL): nblocks flags, 1 where the block was held. acc: 2 x
 * eldr_sigcache_row_bytes bytes of scratch as add_prefix's. eldr/predict.h's
 * lookup. */
size_t eldr_sigshard_add_held(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, uint32_t *counts,
                              uint8_t *acc, size_t *prefix, uint8_t *held);

/* eldr_sigcache_store_blocks over the shards (same arguments and errors;
 * scratch: L*E uint32, the caller's, left zeroed). Each block is looked up,
 * and counted and stored only when not held, under its shard's lock. */
int eldr_sigshard_store_blocks(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks,
                               size_t first_token, const void *raw, eldr_sel_dtype dtype,
                               size_t nrows, uint32_t *scratch, size_t *stored);

/* As eldr_sigshard_store_blocks; pl (may be NULL): the planes that the
 * pass that counted these rows kept (eldr_counts_accumulate_planes over
 * the cache's layer mask, on this raw buffer): a block they hold is
 * converted into its row instead of counted again. Same results. */
int eldr_sigshard_store_planes(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, size_t first_token,
                               const void *raw, eldr_sel_dtype dtype, size_t nrows, const eldr_count_planes *pl,
                               uint32_t *scratch, size_t *stored);

/* The bytes every shard allocated (eldr_sigcache_bytes); 0 for NULL. */
size_t eldr_sigshard_bytes(const eldr_sigshard *c);

/* The statistics of every shard summed (each shard read under its lock). */
void eldr_sigshard_stats_get(eldr_sigshard *c, eldr_sigcache_stats *s);

/* Times an operation found its shard locked by another thread and waited
 * (all shards, since creation; 0 for NULL): the contention sharding keeps
 * low. */
uint64_t eldr_sigshard_lock_waits(const eldr_sigshard *c);

#endif
