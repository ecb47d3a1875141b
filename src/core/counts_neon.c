/* counts_neon.c — the counting code's NEON twins (see core/counts_int.h):
 * the range check's maximum a vector at a time and the signature cache's
 * row add. counts.c decides when they run (eldr_cpu_has(ELDR_CPU_NEON))
 * and holds their portable twins. The bit-sliced group kernel has no NEON
 * twin yet: on aarch64 the counting itself is counts.c's unrolled loop.
 *
 * Built only on aarch64 with GCC or clang. */
#include "core/counts_int.h"

#ifdef ELDR_COUNTS_NEON
#include <arm_neon.h>

size_t eldr__max_neon(const unsigned char *p, size_t bytes, size_t w, uint32_t *out) {
  size_t i = 0;
#define MAXV(T, LD, MAX, RED)                                                      \
  {                                                                                \
    T a = LD((const void *)p), b = a, c = a, d = a;                                \
    for (; i + 64 <= bytes; i += 64) {                                             \
      a = MAX(a, LD((const void *)(p + i)));                                       \
      b = MAX(b, LD((const void *)(p + i + 16)));                                  \
      c = MAX(c, LD((const void *)(p + i + 32)));                                  \
      d = MAX(d, LD((const void *)(p + i + 48)));                                  \
    }                                                                              \
    *out = RED(MAX(MAX(a, b), MAX(c, d)));                                         \
  }
  /* the first vector seeds the maxima: it is part of the range (bytes >= 64) */
  if (w == 1) MAXV(uint8x16_t, vld1q_u8, vmaxq_u8, vmaxvq_u8)
  else if (w == 2) MAXV(uint16x8_t, vld1q_u16, vmaxq_u16, vmaxvq_u16)
  else MAXV(uint32x4_t, vld1q_u32, vmaxq_u32, vmaxvq_u32)
#undef MAXV
  return i;
}

size_t eldr__add_i8_neon(uint32_t *restrict dst, const int8_t *restrict src, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const int8x16_t s = vld1q_s8(src + i);
    const int16x8_t lo = vmovl_s8(vget_low_s8(s)), hi = vmovl_high_s8(s);
    const int32x4_t e[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)),
                            vmovl_high_s16(hi)};
    for (int j = 0; j < 4; j++)
      vst1q_u32(dst + i + 4 * j, vaddq_u32(vld1q_u32(dst + i + 4 * j), vreinterpretq_u32_s32(e[j])));
  }
  return i;
}

#else
typedef int counts_neon_unused; /* not an empty translation unit */
#endif
