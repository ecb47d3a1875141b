/* footprint_int.h — internal to the footprint policy (core/footprint.c and
 * its per-ISA twin footprint_avx2.c). Pure functions: any thread. */
#ifndef ELDR_CORE_FOOTPRINT_INT_H
#define ELDR_CORE_FOOTPRINT_INT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_FP_X86 1
/* Per layer l with mask[l]: out[l] = sum_e q[l*E+e] * p[l*E+e], eight lanes
 * (lane j: e = j mod 8), lanes j and j+4 added, the four reduced as
 * ((0+2)+(1+3)), then the tail summed in order: the bits of
 * eldr_dot_lanes8 (eldr/dot.h). Call only where
 * eldr_cpu_has(ELDR_CPU_AVX2). */
void eldr__fp_dots_avx(const float *q, const float *p, size_t L, size_t E, const uint8_t *mask, float *out);
#endif

#endif
