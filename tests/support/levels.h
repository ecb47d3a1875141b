/* levels.h — the SIMD level a test names, on the architecture it runs on.
 *
 * The tests that compare a kernel's paths name the x86 levels (portable,
 * AVX2, AVX-512); on aarch64 every vector level they name is NEON, so the
 * same loop compares the NEON twins with the portable ones there (and,
 * as on an x86 CPU without AVX-512, checks one path twice). */
#ifndef ELDR_TEST_LEVELS_H
#define ELDR_TEST_LEVELS_H

#include "eldr/cpu.h"

static inline eldr_cpu_level eldr_test_level(eldr_cpu_level x86) {
#if defined(__aarch64__)
  return x86 == ELDR_CPU_PORTABLE ? x86 : ELDR_CPU_NEON;
#else
  return x86;
#endif
}

#endif
