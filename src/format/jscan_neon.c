/* jscan_neon.c — the scanner's NEON search for the bytes of a string that
 * need a look (see format/jscan_int.h): 64 bytes a step, the twin of
 * jscan_avx2.c, so that a base64 blob of megabytes is not walked a byte at
 * a time on aarch64 (no SSE2 there: the portable loop is per byte).
 * jscan.c runs it where eldr_cpu_has(ELDR_CPU_NEON). Built only on aarch64
 * with GCC or clang. */
#include "jscan_int.h"

#ifdef ELDR_JS_NEON
#include <arm_neon.h>
#include <stdint.h>

/* 0xFF where the byte is '"', '\\', below 0x20 or >= 0x80 (c - 0x20 >= 0x60
 * unsigned covers the last two at once). */
static inline uint8x16_t special16(uint8x16_t b) {
  const uint8x16_t m = vorrq_u8(vceqq_u8(b, vdupq_n_u8('"')), vceqq_u8(b, vdupq_n_u8('\\')));
  return vorrq_u8(m, vcgeq_u8(vsubq_u8(b, vdupq_n_u8(0x20)), vdupq_n_u8(0x60)));
}

/* The first marked byte of m (some byte is): four bits a byte, narrowed. */
static inline size_t first16(uint8x16_t m) {
  const uint64_t bits = vget_lane_u64(vreinterpret_u64_u8(vshrn_n_u16(vreinterpretq_u16_u8(m), 4)), 0);
  return (size_t)__builtin_ctzll(bits) / 4;
}

size_t eldr__js_special_neon(const char *p, size_t i, size_t n) {
  for (; i + 64 <= n; i += 64) {
    const uint8_t *q = (const uint8_t *)p + i;
    const uint8x16_t a = special16(vld1q_u8(q)), b = special16(vld1q_u8(q + 16)),
                     c = special16(vld1q_u8(q + 32)), d = special16(vld1q_u8(q + 48));
    if (vmaxvq_u8(vorrq_u8(vorrq_u8(a, b), vorrq_u8(c, d)))) {
      if (vmaxvq_u8(a)) return i + first16(a);
      if (vmaxvq_u8(b)) return i + 16 + first16(b);
      if (vmaxvq_u8(c)) return i + 32 + first16(c);
      return i + 48 + first16(d);
    }
  }
  return i;
}

#else
typedef int jscan_neon_unused; /* not an empty translation unit */
#endif
