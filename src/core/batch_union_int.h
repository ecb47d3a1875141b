/* batch_union_int.h — internal to the batch-union kernels (core/batch_union.c
 * and its per-ISA twins batch_union_avx2.c, batch_union_avx512.c,
 * batch_union_neon.c).
 *
 * Each twin does what its portable counterpart in batch_union.c does, with
 * the same bits: rows_bits sets u->bits to the OR of n bitset rows,
 * rows_ids8 / ids8 to the union of n ids8 rows (ids8: into out, L * W words,
 * written whole), count writes the distinct experts per layer into
 * per_layer (may be NULL) and returns their sum (count: W <= 4 only;
 * eldr_union_count takes wider unions). A twin calls nothing of
 * batch_union.c, so the files do not call each other in a loop. Called only where
 * eldr_cpu_has(ELDR_CPU_AVX2) (the avx2 ones; rows_ids8 with K % 4 != 0
 * needs u->scratch) or eldr_cpu_feature(ELDR_CPU_VPOPCNTDQ) (the avx512
 * ones). Threads: as eldr/batch_union.h (one union per thread). */
#ifndef ELDR_CORE_BATCH_UNION_INT_H
#define ELDR_CORE_BATCH_UNION_INT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/batch_union.h"

/* Groups of four row positions of an ids8 row (L * K bytes). */
static inline size_t eldr__union_groups(const eldr_union *u) { return (u->L * u->K + 3) / 4; }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_UNION_X86 1
uint64_t eldr__union_count_avx2(const eldr_union *u, uint32_t *per_layer);
void eldr__union_rows_bits_avx2(eldr_union *u, const uint64_t *const *rows, size_t n);
void eldr__union_rows_ids8_avx2(eldr_union *u, const uint8_t *const *rows, size_t n);

uint64_t eldr__union_count_avx512(const eldr_union *u, uint32_t *per_layer);
void eldr__union_rows_bits_avx512(eldr_union *u, const uint64_t *const *rows, size_t n);
void eldr__union_ids8_avx512(const eldr_union *u, const uint8_t *const *rows, size_t n, uint64_t *out);
#endif

#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_UNION_NEON 1
/* batch_union_neon.c, where eldr_cpu_has(ELDR_CPU_NEON): count for W <= 4;
 * rows_ids8 for any K (no scratch). */
uint64_t eldr__union_count_neon(const eldr_union *u, uint32_t *per_layer);
void eldr__union_rows_bits_neon(eldr_union *u, const uint64_t *const *rows, size_t n);
void eldr__union_rows_ids8_neon(eldr_union *u, const uint8_t *const *rows, size_t n);
#endif

#endif
