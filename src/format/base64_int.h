/* base64_int.h — the streaming base64 decoder shared by the routed_experts
 * readers (format/base64.c), internal to src/format.
 *
 * Ownership: an eldr__b64s borrows the text it decodes (it must outlive the
 * stream) and owns nothing. Errors: ELDR_EPARSE with a message naming the
 * offset of a bad character or padding. Threads: one stream per thread; the
 * functions hold no global state. */
#ifndef ELDR_FORMAT_BASE64_INT_H
#define ELDR_FORMAT_BASE64_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "eldr/routed_experts.h"

/* A streaming decoder over a whole base64 text. */
typedef struct eldr__b64s {
  const unsigned char *in;
  size_t len;     /* chars */
  size_t nq_full; /* quads without padding */
  size_t q;       /* next quad */
  int pad;        /* '=' count in the last quad (0..2) */
  bool tail_done;
  size_t total;   /* decoded length of the whole text */
} eldr__b64s;

/* Start a stream over in[0, len): ELDR_EPARSE when len is not a multiple of 4. */
int eldr__b64s_init(eldr__b64s *s, const char *in, size_t len, eldr_diag *d);
/* Decode up to maxq quads into out (capacity >= maxq * 3), the final padded
 * quad included when it fits; *got bytes (0 at the end of the text). */
int eldr__b64s_read(eldr__b64s *s, uint8_t *out, size_t maxq, size_t *got, eldr_diag *d);

/* The decoding table of the characters below 0x80 (the value of each
 * valid one, 0x80 for the invalid ones), for the vector loops' lookups. */
extern const unsigned char eldr__b64_lut7[128];

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_B64_X86 1
/* The vector loops of base64.c's decoder: nq full quads (no '=') from in
 * into out, a step at a time (AVX2: 8 quads, AVX-512 VBMI: 16); return the
 * quads done (nq rounded down to a step) and set *bad when a character
 * outside the alphabet was seen (the caller locates it). Never read or
 * write outside in[0, 4 nq) and out[0, 3 done). Call only where
 * eldr_cpu_has(ELDR_CPU_AVX2) (base64_avx2.c), (ELDR_CPU_AVX512)
 * (base64_avx512.c). */
size_t eldr__b64_quads_avx2(const unsigned char *in, size_t nq, uint8_t *out, uint32_t *bad);
size_t eldr__b64_quads_avx512(const unsigned char *in, size_t nq, uint8_t *out, uint32_t *bad);
#endif

#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define ELDR_B64_NEON 1
/* The same for NEON, 16 quads a step (base64_neon.c): call only where
 * eldr_cpu_has(ELDR_CPU_NEON). */
size_t eldr__b64_quads_neon(const unsigned char *in, size_t nq, uint8_t *out, uint32_t *bad);
#endif

#endif
