/* sigcache_int.h — internal to the signature cache (core/sigcache.c), its
 * byte kernels' vector twins, sigcache_avx2.c and sigcache_avx512.c, and
 * its sharded form (core/sigshard.c, eldr/sigshard.h), which calls the
 * one-block store and the byte-sum adds below under each shard's lock.
 *
 * sigcache.c holds the portable loops and the dispatch (eldr_cpu_has,
 * eldr/cpu.h); a twin is called only on its level. Each twin handles the
 * first multiple of its vector width of n and returns how many elements it
 * did; the caller finishes the rest. Pure functions of their arguments
 * (any thread).
 */
#ifndef ELDR_CORE_SIGCACHE_INT_H
#define ELDR_CORE_SIGCACHE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/sigcache.h"

/* One block of ELDR_BLOCK_TOKENS rows at p stored under hash unless held
 * (1: held, made the most recent; 0: counted and stored; ELDR_ERANGE:
 * refused, nothing stored). bp (may be NULL): the block's planes kept by
 * the pass that counted it over the cache's layer mask (eldr/counts.h,
 * eldr_count_planes; format: its `format`): converted, not counted again.
 * row8: a scratch of L*E uint32, zero in the stored layers, left so; NULL:
 * only the lookup (ELDR_ENOTFOUND when not held and it is needed: no
 * planes, or a mask of a layer count not a multiple of four). Caller holds
 * whatever lock guards c (sigshard: the shard's). */
int eldr__sigcache_store1(eldr_sigcache *c, uint64_t hash, const unsigned char *p, eldr_sel_dtype dtype,
                          const unsigned char *bp, int format, uint8_t *row8);
/* The row under hash added into the byte sums acc (the stored layers, in
 * row order) when held (1, made the most recent), else 0 (not a miss).
 * *room: what acc's bytes can still take (255 after a flush); when the row
 * could wrap one, acc is flushed into counts first. */
int eldr__sigcache_add_if(eldr_sigcache *c, uint64_t hash, uint8_t *acc, unsigned *room, uint32_t *counts);
/* The byte sums acc added into counts (L*E), acc zeroed. */
void eldr__sigcache_acc_flush(const eldr_sigcache *c, uint8_t *acc, uint32_t *counts);

/* Span rows (eldr/sigshard.h): a row summing a run of blocks' rows.
 * _span_add: the row under hash added into the byte sums acc (row order)
 * and its largest count into *sum when held (1, a hit; the LRU order
 * unchanged), else 0; with *sum UINT_MAX (a span's first row) copied into acc and
 * *sum set instead. The caller uses acc only while *sum <= 127, so no
 * byte has wrapped.
 * _put_span: the row image row (row bytes, every byte <= 127) stored under
 * hash, counted in the stats' spans; returns its largest byte.
 * _acc_add: the row image row (its largest byte mx) added into the byte
 * sums acc as _add_if adds a held row (acc flushed into counts first when
 * a byte could wrap). */
int eldr__sigcache_span_add(eldr_sigcache *c, uint64_t hash, uint8_t *acc, unsigned *sum);
uint8_t eldr__sigcache_put_span(eldr_sigcache *c, uint64_t hash, const uint8_t *row);
void eldr__sigcache_acc_add(const eldr_sigcache *c, uint8_t *acc, const uint8_t *row, uint8_t mx, unsigned *room,
                            uint32_t *counts);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_SIGCACHE_X86 1

/* a[i] += r[i] (bytes, wrapping) */
size_t eldr__addb_avx2(uint8_t *restrict a, const int8_t *restrict r, size_t n);
size_t eldr__addb_512(uint8_t *restrict a, const int8_t *restrict r, size_t n);
/* d[i] += a[i] (bytes widened to 32 bits) */
size_t eldr__widen_avx2(uint32_t *restrict d, const uint8_t *restrict a, size_t n);
size_t eldr__widen_512(uint32_t *restrict d, const uint8_t *restrict a, size_t n);
/* *m = the largest byte of the elements done (0 when none) */
size_t eldr__maxb_avx2(const uint8_t *r, size_t n, uint8_t *m);
size_t eldr__maxb_512(const uint8_t *r, size_t n, uint8_t *m);
#endif

#endif
