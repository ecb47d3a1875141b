/* fuzz_routed_experts.c — libFuzzer target for the routed_experts codec.
 *
 * The input is used three ways: as raw bytes for eldr_npy_parse_header, as
 * base64 text for count/decode with a fixed small model shape (L=3, E=16,
 * K=2), and base64-encoded (so the fuzzer reaches the npy header and the
 * payload directly) for count/decode again. The SIMD and the scalar base64
 * decoders must agree. Count and decode must agree on
 * success, counts must equal a naive count of the decoded ids, and an
 * accepted array must survive encode -> decode; otherwise the target
 * aborts. The input's tail is also counted as a raw selection array (dtype,
 * shape and layer mask taken from its first 4 bytes) by the library's
 * blocked, range-checked, fixed-K counter (with the AVX2 range check and
 * with the portable one) and by the per-id reference (core/counts_ref.h):
 * return code, bad index and (partial) counts must be identical, the
 * check-only walk must find the same bad index, and the 8-bit block
 * counter must give the same counts (or refuse, counting nothing). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/counts_int.h"
#include "core/counts_ref.h"
#include "eldr/cpu.h"
#include "eldr/routed_experts.h"

static const eldr_shape S = {3, 16, 2};

static void check(const char *txt, size_t len) {
  uint32_t counts[3 * 16];
  memset(counts, 0, sizeof counts);
  size_t nt_c = 0, nt_d = 0;
  eldr_diag d;
  d.msg[0] = '\0';
  int rc_c = eldr_routed_experts_count(txt, len, &S, counts, &nt_c, &d);
  if (rc_c != 0 && d.msg[0] == '\0') abort();
  uint16_t *sel = NULL;
  eldr_shape os;
  int rc_d = eldr_routed_experts_decode(txt, len, &S, &sel, &nt_d, &os, NULL);
  if ((rc_c == 0) != (rc_d == 0)) abort();
  if (rc_d != 0) {
    if (sel) abort();
    /* any shape: must not crash either */
    if (eldr_routed_experts_decode(txt, len, NULL, &sel, &nt_d, &os, NULL) == 0) free(sel);
    return;
  }
  if (nt_c != nt_d || os.num_layers != 3 || os.top_k != 2 || os.num_experts != 16) abort();
  uint32_t naive[3 * 16];
  memset(naive, 0, sizeof naive);
  for (size_t t = 0; t < nt_d; t++)
    for (size_t l = 0; l < 3; l++)
      for (size_t k = 0; k < 2; k++) {
        uint16_t e = sel[(t * 3 + l) * 2 + k];
        if (e >= 16) abort();
        naive[l * 16 + e]++;
      }
  if (memcmp(naive, counts, sizeof naive)) abort();
  char *enc = NULL;
  size_t elen = 0;
  if (eldr_routed_experts_encode(sel, nt_d, &S, ELDR_SEL_U16, &enc, &elen) != 0) abort();
  uint16_t *back = NULL;
  size_t nt_b = 0;
  if (eldr_routed_experts_decode(enc, elen, &S, &back, &nt_b, NULL, NULL) != 0 || nt_b != nt_d ||
      (nt_d && memcmp(back, sel, nt_d * 6 * sizeof *sel)))
    abort();
  free(back);
  free(enc);
  free(sel);
}

static void check_counts(const uint8_t *data, size_t size) {
  if (size < 4) return;
  static const eldr_sel_dtype dts[6] = {ELDR_SEL_U8,    ELDR_SEL_U16LE, ELDR_SEL_U16,
                                        ELDR_SEL_I16LE, ELDR_SEL_I32LE, ELDR_SEL_I64LE};
  const eldr_sel_dtype dt = dts[data[0] % 6];
  eldr_shape s = {1u + data[1] % 6u, 1u + (data[2] | (uint32_t)(data[3] & 1) << 8), 0};
  s.top_k = 1u + (data[3] >> 1) % (s.num_experts < 9 ? s.num_experts : 9u);
  const uint8_t mask[6] = {data[1] & 64, data[1] & 128, data[2] & 1, 1, data[0] & 64, 0};
  const size_t w = eldr_sel_dtype_size(dt), row = s.num_layers * s.top_k * w;
  const size_t T = (size - 4) / row, cells = eldr_shape_cells(&s);
  uint32_t a[6 * 512], b[6 * 512];
  for (int m = 0; m < 6; m++) { /* AVX-512 where the CPU has it, AVX2, portable; no mask, mask */
    eldr_cpu_set(m < 2 ? ELDR_CPU_AVX512 : m < 4 ? ELDR_CPU_AVX2 : ELDR_CPU_PORTABLE);
    const uint8_t *mk = m & 1 ? mask : NULL;
    memset(a, 0, cells * sizeof *a);
    memset(b, 0, cells * sizeof *b);
    size_t ba = 0, bb = 0, bc = 0;
    int ra = eldr_counts_accumulate_masked(&s, data + 4, dt, T, mk, a, &ba);
    int rb = eldr__counts_ref(&s, data + 4, dt, T, mk, b, &bb);
    if (ra != rb || (ra && ba != bb) || memcmp(a, b, cells * sizeof *a)) abort();
    int rc = eldr_counts_check_masked(&s, data + 4, dt, T, mk, &bc);
    if (rc != rb || (rc && bc != bb)) abort();
    /* the 8-bit block counter of the signature cache: all or nothing */
    if (T * s.top_k <= 255) {
      static uint8_t c8[6 * 512];
      memset(c8, 0, cells);
      int r8 = eldr__counts_block8(&s, data + 4, dt, T, mk, c8);
      if (r8 != rb) abort();
      for (size_t i = 0; i < cells; i++)
        if (c8[i] != (rb ? 0 : b[i])) abort();
    }
  }
  eldr_cpu_set(eldr_cpu_allowed());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_counts(data, size);
  eldr_npy_info info;
  eldr_diag d;
  d.msg[0] = '\0';
  if (eldr_npy_parse_header(data, size, &info, &d) != 0) {
    if (d.msg[0] == '\0') abort();
  } else if (info.data_offset > size || info.ndim > 3) {
    abort();
  }
  /* SIMD and scalar base64 decoders agree on the result and the message */
  {
    size_t cap = eldr_b64_decoded_max(size) + 1;
    uint8_t *o1 = malloc(cap), *o2 = malloc(cap);
    if (!o1 || !o2) abort();
    size_t n1 = 0;
    eldr_diag d1, d2;
    d1.msg[0] = d2.msg[0] = '\0';
    int r1 = eldr_b64_decode((const char *)data, size, o1, cap, &n1, &d1);
    { /* the same text off a cache line, ending where its allocation ends (ASan) */
      const size_t off = 1 + size % 63;
      char *moved = malloc(off + size);
      if (!moved) abort();
      memcpy(moved + off, data, size);
      size_t n2 = 0;
      d2.msg[0] = '\0';
      int r2 = eldr_b64_decode(moved + off, size, o2, cap, &n2, &d2);
      if (r1 != r2 || strcmp(d1.msg, d2.msg) || n1 != n2 || (r1 == 0 && n1 && memcmp(o1, o2, n1)))
        abort();
      free(moved);
    }
    for (int m = 0; m < 2; m++) { /* scalar; AVX2 the widest (where the CPU has AVX-512) */
      size_t n2 = 0;
      d2.msg[0] = '\0';
      eldr_cpu_set(m == 0 ? ELDR_CPU_PORTABLE : ELDR_CPU_AVX2);
      int r2 = eldr_b64_decode((const char *)data, size, o2, cap, &n2, &d2);
      eldr_cpu_set(eldr_cpu_allowed());
      if (r1 != r2 || strcmp(d1.msg, d2.msg) || n1 != n2 || (r1 == 0 && n1 && memcmp(o1, o2, n1)))
        abort();
    }
    free(o1);
    free(o2);
  }
  check((const char *)data, size);
  char *b64 = malloc(eldr_b64_encoded_len(size) + 1);
  if (!b64) abort();
  eldr_b64_encode(data, size, b64);
  size_t blen = strlen(b64);
  if (blen != eldr_b64_encoded_len(size)) abort();
  uint8_t *back = malloc(size + 1);
  size_t got = 0;
  if (!back || eldr_b64_decode(b64, blen, back, size, &got, NULL) != 0 || got != size ||
      (size && memcmp(back, data, size)))
    abort();
  free(back);
  check(b64, blen);
  free(b64);
  return 0;
}
