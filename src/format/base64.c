/* base64.c — the base64 codec (eldr/routed_experts.h's eldr_b64_*) and the
 * streaming decoder the routed_experts readers use (format/base64_int.h).
 *
 * Decoding goes 4 chars -> 3 bytes per step through one lookup table whose
 * invalid entries carry bit 8; the table values of a whole call are OR-ed
 * into an accumulator tested once, so the inner loop has no per-character
 * branch. The AVX2 and AVX-512 VBMI loops (base64_avx2.c, base64_avx512.c)
 * and the NEON loop (base64_neon.c) run where eldr_cpu_has says (eldr/cpu.h); a bad character is then
 * located by the scalar loop, for the same message. */
#include "base64_int.h"

#include "eldr/cpu.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* base64                                                                    */

#define X 0x100
static const uint32_t B64D[256] = {
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X, 62,  X,  X,  X, 63,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61,  X,  X,  X,  X,  X,  X,
     X,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,  X,  X,  X,  X,  X,
     X, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
     X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
};
#undef X
static const char B64E[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t eldr_b64_decoded_max(size_t len) { return len / 4 * 3 + (len % 4 ? 3 : 0); }

size_t eldr_b64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

/* Decode nq full quads (no '='); returns non-zero if any char is invalid. */
static uint32_t dec_quads(const unsigned char *in, size_t nq, uint8_t *out) {
  uint32_t bad = 0;
  size_t i = 0;
  for (; i + 4 <= nq; i += 4, in += 16, out += 12) {
    uint32_t a0 = B64D[in[0]], a1 = B64D[in[1]], a2 = B64D[in[2]], a3 = B64D[in[3]];
    uint32_t b0 = B64D[in[4]], b1 = B64D[in[5]], b2 = B64D[in[6]], b3 = B64D[in[7]];
    uint32_t c0 = B64D[in[8]], c1 = B64D[in[9]], c2 = B64D[in[10]], c3 = B64D[in[11]];
    uint32_t d0 = B64D[in[12]], d1 = B64D[in[13]], d2 = B64D[in[14]], d3 = B64D[in[15]];
    bad |= a0 | a1 | a2 | a3 | b0 | b1 | b2 | b3 | c0 | c1 | c2 | c3 | d0 | d1 | d2 | d3;
    uint32_t x = a0 << 18 | a1 << 12 | a2 << 6 | a3;
    uint32_t y = b0 << 18 | b1 << 12 | b2 << 6 | b3;
    uint32_t z = c0 << 18 | c1 << 12 | c2 << 6 | c3;
    uint32_t w = d0 << 18 | d1 << 12 | d2 << 6 | d3;
    out[0] = (uint8_t)(x >> 16); out[1] = (uint8_t)(x >> 8); out[2] = (uint8_t)x;
    out[3] = (uint8_t)(y >> 16); out[4] = (uint8_t)(y >> 8); out[5] = (uint8_t)y;
    out[6] = (uint8_t)(z >> 16); out[7] = (uint8_t)(z >> 8); out[8] = (uint8_t)z;
    out[9] = (uint8_t)(w >> 16); out[10] = (uint8_t)(w >> 8); out[11] = (uint8_t)w;
  }
  for (; i < nq; i++, in += 4, out += 3) {
    uint32_t a0 = B64D[in[0]], a1 = B64D[in[1]], a2 = B64D[in[2]], a3 = B64D[in[3]];
    bad |= a0 | a1 | a2 | a3;
    uint32_t x = a0 << 18 | a1 << 12 | a2 << 6 | a3;
    out[0] = (uint8_t)(x >> 16); out[1] = (uint8_t)(x >> 8); out[2] = (uint8_t)x;
  }
  return bad & 0x100;
}

/* Decode nq full quads with the fastest available loop. */
static uint32_t dec_quads_any(const unsigned char *in, size_t nq, uint8_t *out) {
#ifdef ELDR_B64_X86
  if (nq >= 8 && eldr_cpu_has(ELDR_CPU_AVX2)) {
    uint32_t bad = 0;
    size_t done = nq >= 16 && eldr_cpu_has(ELDR_CPU_AVX512) ? eldr__b64_quads_avx512(in, nq, out, &bad)
                                                            : eldr__b64_quads_avx2(in, nq, out, &bad);
    if (bad) return 0x100;
    return dec_quads(in + 4 * done, nq - done, out + 3 * done);
  }
#endif
#ifdef ELDR_B64_NEON
  if (nq >= 16 && eldr_cpu_has(ELDR_CPU_NEON)) {
    uint32_t bad = 0;
    const size_t done = eldr__b64_quads_neon(in, nq, out, &bad);
    if (bad) return 0x100;
    return dec_quads(in + 4 * done, nq - done, out + 3 * done);
  }
#endif
  return dec_quads(in, nq, out);
}

static int bad_char(const unsigned char *in, size_t len, size_t base, eldr_diag *d) {
  for (size_t i = 0; i < len; i++)
    if (B64D[in[i]] & 0x100) {
      if (in[i] >= 0x21 && in[i] < 0x7f)
        return eldr_diag_fail(d, ELDR_EPARSE, "base64: invalid character '%c' at offset %zu",
                              in[i], base + i);
      return eldr_diag_fail(d, ELDR_EPARSE, "base64: invalid byte 0x%02x at offset %zu", in[i],
                            base + i);
    }
  return eldr_diag_fail(d, ELDR_EPARSE, "base64: invalid input");
}

int eldr__b64s_init(eldr__b64s *s, const char *in, size_t len, eldr_diag *d) {
  memset(s, 0, sizeof *s);
  if (len % 4)
    return eldr_diag_fail(d, ELDR_EPARSE, "base64: length %zu is not a multiple of 4", len);
  s->in = (const unsigned char *)in;
  s->len = len;
  if (len) {
    if (in[len - 1] == '=') s->pad = in[len - 2] == '=' ? 2 : 1;
  }
  s->nq_full = len / 4 - (s->pad ? 1 : 0);
  s->tail_done = s->pad == 0;
  s->total = len / 4 * 3 - (size_t)s->pad;
  return ELDR_OK;
}

int eldr__b64s_read(eldr__b64s *s, uint8_t *out, size_t maxq, size_t *got, eldr_diag *d) {
  size_t n = s->q < s->nq_full ? s->nq_full - s->q : 0;
  if (n > maxq) n = maxq;
  *got = 0;
  if (n) {
    if (dec_quads_any(s->in + 4 * s->q, n, out))
      return bad_char(s->in + 4 * s->q, 4 * n, 4 * s->q, d);
    s->q += n;
    *got = 3 * n;
    out += 3 * n;
  }
  if (!s->tail_done && n < maxq && s->q == s->nq_full) {
    const unsigned char *t = s->in + 4 * s->q;
    size_t keep = 4 - (size_t)s->pad; /* 2 or 3 significant chars */
    uint32_t v[3] = {0, 0, 0}, bad = 0;
    for (size_t i = 0; i < keep; i++) bad |= v[i] = B64D[t[i]];
    if (bad & 0x100) return bad_char(t, keep, 4 * s->q, d);
    if (s->pad == 2) {
      if (v[1] & 0xf)
        return eldr_diag_fail(d, ELDR_EPARSE, "base64: bad padding at offset %zu (non-zero bits)",
                              4 * s->q + 1);
      out[0] = (uint8_t)(v[0] << 2 | v[1] >> 4);
      *got += 1;
    } else {
      if (v[2] & 0x3)
        return eldr_diag_fail(d, ELDR_EPARSE, "base64: bad padding at offset %zu (non-zero bits)",
                              4 * s->q + 2);
      out[0] = (uint8_t)(v[0] << 2 | v[1] >> 4);
      out[1] = (uint8_t)((v[1] & 0xf) << 4 | v[2] >> 2);
      *got += 2;
    }
    s->q++;
    s->tail_done = true;
  }
  return ELDR_OK;
}

int eldr_b64_decode(const char *in, size_t len, uint8_t *out, size_t cap, size_t *out_len,
                    eldr_diag *d) {
  if ((!in && len) || !out_len) return eldr_diag_fail(d, ELDR_EINVAL, "base64: argument missing");
  *out_len = 0;
  eldr__b64s s;
  int rc = eldr__b64s_init(&s, in, len, d);
  if (rc) return rc;
  if (s.total > cap)
    return eldr_diag_fail(d, ELDR_ERANGE, "base64: %zu decoded bytes exceed the buffer (%zu)",
                          s.total, cap);
  if (s.total && !out) return eldr_diag_fail(d, ELDR_EINVAL, "base64: output missing");
  if (s.total == 0) return ELDR_OK; /* nothing to write (out may be NULL) */
  size_t n = 0;
  for (;;) {
    size_t got;
    if ((rc = eldr__b64s_read(&s, out + n, (size_t)-1 / 4, &got, d))) return rc;
    if (!got) break;
    n += got;
  }
  *out_len = n;
  return ELDR_OK;
}

/* Two output characters per 12 input bits. */
typedef struct b64pairs {
  char c[4096][2];
} b64pairs;

static void build_pairs(b64pairs *t) {
  for (int i = 0; i < 4096; i++) {
    t->c[i][0] = B64E[i >> 6];
    t->c[i][1] = B64E[i & 63];
  }
}

static const b64pairs *pairs(void) {
  static b64pairs table;
  static int ready; /* 0 no, 1 being built, 2 ready */
  if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) == 2) return &table;
  int expected = 0;
  if (__atomic_compare_exchange_n(&ready, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    build_pairs(&table);
    __atomic_store_n(&ready, 2, __ATOMIC_RELEASE);
    return &table;
  }
  return NULL; /* another thread is building it: use the plain loop */
}

void eldr_b64_encode(const uint8_t *in, size_t n, char *out) {
  size_t i = 0;
  const b64pairs *t = n >= 3072 ? pairs() : NULL;
  if (t) {
    for (; i + 3 <= n; i += 3, out += 4) {
      uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
      memcpy(out, t->c[x >> 12], 2);
      memcpy(out + 2, t->c[x & 4095], 2);
    }
  }
  for (; i + 3 <= n; i += 3, out += 4) {
    uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
    out[0] = B64E[x >> 18];
    out[1] = B64E[(x >> 12) & 63];
    out[2] = B64E[(x >> 6) & 63];
    out[3] = B64E[x & 63];
  }
  if (n - i == 1) {
    uint32_t x = (uint32_t)in[i] << 16;
    out[0] = B64E[x >> 18];
    out[1] = B64E[(x >> 12) & 63];
    out[2] = '=';
    out[3] = '=';
    out += 4;
  } else if (n - i == 2) {
    uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
    out[0] = B64E[x >> 18];
    out[1] = B64E[(x >> 12) & 63];
    out[2] = B64E[(x >> 6) & 63];
    out[3] = '=';
    out += 4;
  }
  *out = '\0';
}
