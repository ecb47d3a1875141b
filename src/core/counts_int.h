/* counts_int.h — internal to the counting code (counts.c, counts_bits512.c).
 *
 * The bit-sliced group kernel's contract: count ntok tokens (a multiple of
 * 16, at most 2048 so that no byte counter wraps) of one group of four rows
 * per token (rows of 8 one-byte ids at byte offsets off[0..3] of each token,
 * tokens tb bytes apart, starting at p) into out[r * 128 + e] (uint16, 4 x
 * 128 counters, overwritten); returns the number of bits counted. An id >= 128
 * sets nothing and a repeated id in a row sets one bit, so the return is
 * ntok * 32 exactly when every row held 8 distinct ids below 128. Pure
 * functions of their arguments: any thread. */
#ifndef ELDR_CORE_COUNTS_INT_H
#define ELDR_CORE_COUNTS_INT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_COUNTS_BITS512 1
/* AVX-512 F/BW/VL/VBMI: call only where eldr__simd_avx512() is true. */
size_t eldr__bits_group512(const unsigned char *p, size_t tb, size_t ntok, const uint32_t *off,
                           uint16_t *out);
/* The same for exactly 16 tokens into bytes: out[r * 128 + e] (4 x 128,
 * overwritten, each <= 16); returns the bits counted (512 when every row
 * held 8 distinct ids below 128). For the signature cache's 16-token rows. */
size_t eldr__bits_block16_512(const unsigned char *p, size_t tb, const uint32_t *off, uint8_t *out);
#endif

#endif
