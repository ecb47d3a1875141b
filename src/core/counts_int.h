/* counts_int.h — internal to the counting code of core (counts.c, its
 * per-ISA twins counts_avx2.c, counts_avx512.c and counts_neon.c, and the signature
 * cache, sigcache.c).
 *
 * counts.c holds the portable paths and the dispatch: which twin runs is
 * decided there, by eldr_cpu_has (eldr/cpu.h); a twin is called only on its
 * level. Every twin is a pure function of its arguments (any thread).
 *
 * The bit-sliced group kernel's contract (eldr__bits_group_avx2 and
 * eldr__bits_group512): count ntok tokens (a multiple of 16, at most 2048
 * so that no byte counter wraps) of one group of four rows per token (rows
 * of 8 one-byte ids at byte offsets off[0..3] of each token, tokens tb
 * bytes apart, starting at p) into out[r * 128 + e] (uint16, 4 x 128
 * counters, overwritten); returns the number of bits counted. An id >= 128
 * sets nothing and a repeated id in a row sets one bit, so the return is
 * ntok * 32 exactly when every row held 8 distinct ids below 128.
 * With planes (may be NULL), each 16-token block's own counts are kept at
 * planes + i * pstride (block i), ELDR_PLANES_GROUP_BYTES each (eldr/counts.h):
 * AVX2: two halves of 160 bytes (experts 0..63, then 64..127), each the
 * ones, twos, fours, eights and sixteens planes of 32 bytes, qword r of a
 * plane row r; AVX-512: the five planes of 64 bytes, qword 2r + h row r's
 * half h. eldr__planes_rows turns one back into bytes, any level. */
#ifndef ELDR_CORE_COUNTS_INT_H
#define ELDR_CORE_COUNTS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"

#define ELDR_BITS_GROUP 16 /* tokens per carry-save tree */

/* For the signature cache's block rows: count ntokens tokens into 8-bit
 * counters counts8 (L*E, accumulated), the mask's layers only, after
 * range-checking every id of those layers. Needs ntokens * top_k <= 255 (no
 * counter can wrap); else ELDR_EINVAL. ELDR_ERANGE on a bad id: then
 * nothing was counted. */
int eldr__counts_block8(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype, size_t ntokens,
                        const uint8_t *mask, uint8_t *counts8);

/* One group-block's kept planes (format: the level that wrote them) into
 * out[r * 128 + e] (4 x 128 bytes, overwritten); returns the largest. The
 * writer's level's converter where it is in use, else a portable one. */
uint8_t eldr__planes_rows(const unsigned char *gp, int format, uint8_t *out);

/* dst[i] += src[i] (sign-extended) for i < n: a signature-cache row (int8
 * counts) onto 32-bit counts, 16 (AVX-512) or 8 (AVX2) at a time. dst and
 * src do not overlap. */
void eldr__add_i8_u32(uint32_t *restrict dst, const int8_t *restrict src, size_t n);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_COUNTS_X86 1

/* ---- counts_avx2.c: call only where eldr_cpu_has(ELDR_CPU_AVX2) -------- */

/* The largest of the w-byte (1, 2 or 4) little-endian unsigned elements in
 * the first bytes & ~63 bytes of p, 64 bytes a step, into *m (0 when none);
 * returns the bytes read (the caller reads the rest). */
size_t eldr__max_avx2(const unsigned char *p, size_t bytes, size_t w, uint32_t *m);
size_t eldr__bits_group_avx2(const unsigned char *p, size_t tb, size_t ntok, const uint32_t *off,
                             uint16_t *out, unsigned char *planes, size_t pstride);
/* One group-block's kept planes, this level's layout, into 4 x 128 bytes;
 * their largest. */
uint8_t eldr__planes_bytes_avx2(const unsigned char *gp, uint8_t *out);
/* row[0, E) += b[0, E) (E <= 128). */
void eldr__add_row_avx2(uint32_t *restrict row, const uint16_t *restrict b, size_t E);
/* dst[0, i) += src[0, i) sign-extended, 8 at a time; returns i (n & ~7). */
size_t eldr__add_i8_avx2(uint32_t *restrict dst, const int8_t *restrict src, size_t n);

/* ---- counts_avx512.c: call only where eldr_cpu_has(ELDR_CPU_AVX512) ---- */

size_t eldr__bits_group512(const unsigned char *p, size_t tb, size_t ntok, const uint32_t *off,
                           uint16_t *out, unsigned char *planes, size_t pstride);
uint8_t eldr__planes_bytes512(const unsigned char *gp, uint8_t *out);
/* The same for exactly 16 tokens into bytes: out[r * 128 + e] (4 x 128,
 * overwritten, each <= 16); returns the bits counted (512 when every row
 * held 8 distinct ids below 128). For the signature cache's 16-token rows. */
size_t eldr__bits_block16_512(const unsigned char *p, size_t tb, const uint32_t *off, uint8_t *out);
/* dst[0, i) += src[0, i) sign-extended, 16 at a time; returns i (n & ~15). */
size_t eldr__add_i8_512(uint32_t *restrict dst, const int8_t *restrict src, size_t n);
#endif

#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_COUNTS_NEON 1

/* ---- counts_neon.c: call only where eldr_cpu_has(ELDR_CPU_NEON) -------- */

/* As eldr__max_avx2 (bytes >= 64). */
size_t eldr__max_neon(const unsigned char *p, size_t bytes, size_t w, uint32_t *m);
/* dst[0, i) += src[0, i) sign-extended, 16 at a time; returns i (n & ~15). */
size_t eldr__add_i8_neon(uint32_t *restrict dst, const int8_t *restrict src, size_t n);
#endif

#endif
