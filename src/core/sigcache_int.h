/* sigcache_int.h — internal to the signature cache (core/sigcache.c) and its
 * byte kernels' vector twins, sigcache_avx2.c and sigcache_avx512.c.
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
