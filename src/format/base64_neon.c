/* base64_neon.c — the base64 decoder's NEON loop (see format/base64_int.h):
 * base64.c runs it where eldr_cpu_has(ELDR_CPU_NEON) and holds its portable
 * twin. Built only on aarch64 with GCC or clang. */
#include "base64_int.h"

#ifdef ELDR_B64_NEON
#include <arm_neon.h>

/* NEON: 64 chars -> 48 bytes per step. vld4q splits 16 quads into their
 * first, second, third and fourth characters (one vector each); each is
 * translated by two 64-entry table lookups (vqtbl4q over eldr__b64_lut7's
 * halves: an index past a table gives 0, so exactly one of the two hits
 * for a char below 0x80), so a char is invalid exactly when the char or
 * its translation has bit 7 set; three shift-or pairs make the bytes and
 * vst3q interleaves them back. Same contract as eldr__b64_quads_avx2 (a
 * multiple of 16 quads); reads in[0, 64 done), writes out[0, 48 done). */
size_t eldr__b64_quads_neon(const unsigned char *in, size_t nq, uint8_t *out, uint32_t *bad) {
  const uint8x16x4_t lo = vld1q_u8_x4(eldr__b64_lut7), hi = vld1q_u8_x4(eldr__b64_lut7 + 64);
  const uint8x16_t k64 = vdupq_n_u8(64);
  uint8x16_t err = vdupq_n_u8(0);
  size_t i = 0;
  for (; i + 16 <= nq; i += 16, in += 64, out += 48) {
    const uint8x16x4_t v = vld4q_u8(in);
    uint8x16_t t[4];
    for (int j = 0; j < 4; j++) {
      t[j] = vorrq_u8(vqtbl4q_u8(lo, v.val[j]), vqtbl4q_u8(hi, vsubq_u8(v.val[j], k64)));
      err = vorrq_u8(err, vorrq_u8(v.val[j], t[j]));
    }
    uint8x16x3_t o;
    o.val[0] = vorrq_u8(vshlq_n_u8(t[0], 2), vshrq_n_u8(t[1], 4));
    o.val[1] = vorrq_u8(vshlq_n_u8(t[1], 4), vshrq_n_u8(t[2], 2));
    o.val[2] = vorrq_u8(vshlq_n_u8(t[2], 6), t[3]);
    vst3q_u8(out, o);
  }
  *bad = vmaxvq_u8(err) >= 0x80;
  return i;
}

#else
typedef int base64_neon_unused; /* not an empty translation unit */
#endif
