/* jscan_int.h — internal to the JSON scanner (format/jscan.c and its
 * per-ISA twins jscan_avx2.c and jscan_neon.c). Pure functions: any thread. */
#ifndef ELDR_FORMAT_JSCAN_INT_H
#define ELDR_FORMAT_JSCAN_INT_H

#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_JS_X86 1
/* The index of the first byte at or after i of p[0, n) that is '"', '\\',
 * below 0x20 or >= 0x80, looked for 64 bytes a step; i + 64 > n when none
 * was found (the caller scans the rest). Call only where
 * eldr_cpu_has(ELDR_CPU_AVX2). */
size_t eldr__js_special_avx2(const char *p, size_t i, size_t n);
#endif

#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_JS_NEON 1
/* As eldr__js_special_avx2, with NEON (jscan_neon.c). Call only where
 * eldr_cpu_has(ELDR_CPU_NEON). */
size_t eldr__js_special_neon(const char *p, size_t i, size_t n);
#endif

#endif
