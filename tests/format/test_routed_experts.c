/* test_routed_experts.c — base64, .npy header and routed_experts codec on
 * hand-made .npy bytes (every dtype and format version) and every error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/trace_expect.h"

#include "eldr/cpu.h"
#include "support/levels.h"
#include "eldr/routed_experts.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}

/* Reference base64 encoder, written independently of the library's. */
static char *ref_b64(const uint8_t *in, size_t n) {
  static const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *o = malloc((n + 2) / 3 * 4 + 1);
  size_t j = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t b0 = in[i], b1 = i + 1 < n ? in[i + 1] : 0, b2 = i + 2 < n ? in[i + 2] : 0;
    o[j++] = A[b0 >> 2];
    o[j++] = A[((b0 & 3) << 4) | (b1 >> 4)];
    o[j++] = i + 1 < n ? A[((b1 & 15) << 2) | (b2 >> 6)] : '=';
    o[j++] = i + 2 < n ? A[b2 & 63] : '=';
  }
  o[j] = '\0';
  return o;
}

typedef struct bytes {
  uint8_t *p;
  size_t n;
} bytes;

/* .npy bytes: magic, version major, header dict text (padded with spaces and
 * '\n' to a multiple of 64 unless raw), payload. */
static bytes npy_make(int major, const char *dict, const void *payload, size_t plen, int pad) {
  size_t pre = major == 1 ? 10 : 12;
  size_t dl = strlen(dict);
  size_t hlen = dl + (pad ? 1 : 0);
  if (pad) hlen = (pre + hlen + 63) / 64 * 64 - pre;
  bytes b;
  b.n = pre + hlen + plen;
  b.p = malloc(b.n ? b.n : 1);
  memcpy(b.p, "\x93NUMPY", 6);
  b.p[6] = (uint8_t)major;
  b.p[7] = 0;
  if (major == 1) {
    b.p[8] = (uint8_t)hlen;
    b.p[9] = (uint8_t)(hlen >> 8);
  } else {
    for (int i = 0; i < 4; i++) b.p[8 + i] = (uint8_t)(hlen >> (8 * i));
  }
  memcpy(b.p + pre, dict, dl);
  if (pad) {
    memset(b.p + pre + dl, ' ', hlen - dl);
    b.p[pre + hlen - 1] = '\n';
  }
  if (plen) memcpy(b.p + pre + hlen, payload, plen);
  return b;
}

/* Serialise host ids as a dtype's little-endian bytes. */
static uint8_t *to_wire(const int32_t *ids, size_t n, const char *descr, size_t *plen) {
  size_t isz = strstr(descr, "u1") ? 1 : strstr(descr, "2") ? 2 : strstr(descr, "8") ? 8 : 4;
  uint8_t *p = malloc(n * isz + 1);
  for (size_t i = 0; i < n; i++) {
    uint64_t v = (uint64_t)(int64_t)ids[i]; /* sign-extended for i8 */
    for (size_t k = 0; k < isz; k++) p[i * isz + k] = (uint8_t)(v >> (8 * k));
  }
  *plen = n * isz;
  return p;
}

/* base64 of a whole .npy for (T, L, K) of descr holding ids. */
static char *blob(int major, const char *descr, size_t T, uint32_t L, uint32_t K,
                  const int32_t *ids) {
  char dict[256];
  snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%zu, %u, %u), }",
           descr, T, L, K);
  size_t plen;
  uint8_t *pl = to_wire(ids, T * L * K, descr, &plen);
  bytes b = npy_make(major, dict, pl, plen, 1);
  char *s = ref_b64(b.p, b.n);
  free(pl);
  free(b.p);
  return s;
}

static char *blob_dict(int major, const char *dict, const void *payload, size_t plen) {
  bytes b = npy_make(major, dict, payload, plen, 1);
  char *s = ref_b64(b.p, b.n);
  free(b.p);
  return s;
}

static void naive_count(const int32_t *ids, size_t T, uint32_t L, uint32_t E, uint32_t K,
                        uint32_t *out) {
  memset(out, 0, sizeof(uint32_t) * L * E);
  for (size_t t = 0; t < T; t++)
    for (uint32_t l = 0; l < L; l++)
      for (uint32_t k = 0; k < K; k++) out[l * E + (uint32_t)ids[(t * L + l) * K + k]]++;
}

static int32_t *random_ids(size_t n, uint32_t E) {
  int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % E);
  return ids;
}

static int count_str(const char *b64, const eldr_shape *s, uint32_t *counts, size_t *nt,
                     eldr_diag *d) {
  return eldr_routed_experts_count(b64, strlen(b64), s, counts, nt, d);
}

#define ASSERT_MSG(d, sub) eldr_test_msg_has(&(d), (sub))

/* ---- base64 ------------------------------------------------------------- */

static void test_b64_vectors(void **state) {
  (void)state;
  const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (int i = 0; i < 7; i++) {
    size_t n = strlen(plain[i]);
    char out[32];
    assert_int_equal(eldr_b64_encoded_len(n), strlen(enc[i]));
    eldr_b64_encode((const uint8_t *)plain[i], n, out);
    assert_string_equal(out, enc[i]);
    uint8_t dec[32];
    size_t got = 99;
    eldr_diag d = {{0}};
    assert_int_equal(eldr_b64_decode(enc[i], strlen(enc[i]), dec, sizeof dec, &got, &d), 0);
    assert_int_equal(got, n);
    assert_memory_equal(dec, plain[i], n);
    assert_true(eldr_b64_decoded_max(strlen(enc[i])) >= n);
  }
}

static void test_b64_random_roundtrip(void **state) {
  (void)state;
  const size_t big[] = {3071, 3072, 3073, 3074, 5000, 10001, 65536};
  for (size_t j = 0; j < 300 + sizeof big / sizeof big[0]; j++) {
    size_t n = j < 300 ? j : big[j - 300]; /* the large ones take the table encoder */
    uint8_t *in = malloc(n + 1);
    for (size_t i = 0; i < n; i++) in[i] = (uint8_t)rnd();
    char *ref = ref_b64(in, n);
    char *mine = malloc(eldr_b64_encoded_len(n) + 1);
    eldr_b64_encode(in, n, mine);
    assert_string_equal(mine, ref);
    uint8_t *dec = malloc(eldr_b64_decoded_max(strlen(ref)) + 1);
    size_t got;
    assert_int_equal(eldr_b64_decode(ref, strlen(ref), dec, eldr_b64_decoded_max(strlen(ref)),
                                     &got, NULL),
                     0);
    assert_int_equal(got, n);
    if (n) assert_memory_equal(dec, in, n);
    free(in);
    free(ref);
    free(mine);
    free(dec);
  }
}

/* The same text at every offset of a cache line (the vector decoders load
 * whole lines and put the chars together; nothing may be read outside the
 * text: ASan watches): the same bytes, and a bad char in the first or last
 * vector step named at its offset. */
static void test_b64_every_alignment(void **state) {
  (void)state;
  enum { N = 3 * 200 }; /* 800 chars: 12 steps of 64 and a scalar tail */
  uint8_t raw[N], out[N];
  for (int i = 0; i < N; i++) raw[i] = (uint8_t)(i * 13 + 5);
  char *txt = ref_b64(raw, N);
  const size_t len = strlen(txt);
  for (size_t off = 0; off < 64; off++) {
    for (int bad = -1; bad < 4; bad++) {
      /* bad: -1 none, else at 3, 70, len - 70 (the last step) or len - 3 */
      const size_t at = bad == 0 ? 3 : bad == 1 ? 70 : bad == 2 ? len - 70 : len - 3;
      char *buf = malloc(off + len); /* the text ends where the allocation does */
      assert_non_null(buf);
      memcpy(buf + off, txt, len);
      if (bad >= 0) buf[off + at] = '*';
      size_t got = 0;
      eldr_diag d = {{0}};
      int rc = eldr_b64_decode(buf + off, len, out, sizeof out, &got, &d);
      if (bad < 0) {
        if (rc) fail_msg("offset %zu: %s", off, d.msg);
        assert_int_equal(got, N);
        assert_memory_equal(out, raw, N);
      } else {
        char want[32];
        snprintf(want, sizeof want, "offset %zu", at);
        assert_int_equal(rc, ELDR_EPARSE);
        ASSERT_MSG(d, want);
      }
      free(buf);
    }
  }
  free(txt);
}

static void test_b64_errors(void **state) {
  (void)state;
  uint8_t out[64];
  size_t got;
  eldr_diag d = {{0}};
  assert_int_equal(eldr_b64_decode("Zm9", 3, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "multiple of 4");
  assert_int_equal(eldr_b64_decode("Zm9vY!Fy", 8, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "'!' at offset 5");
  assert_int_equal(eldr_b64_decode("Zm9v\nmFy", 8, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "offset 4");
  assert_int_equal(eldr_b64_decode("Zm9vYmF\x80", 8, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "0x80");
  /* '=' inside the text */
  assert_int_equal(eldr_b64_decode("Zm=vYmFy", 8, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "'=' at offset 2");
  assert_int_equal(eldr_b64_decode("Zg==Zg==", 8, out, sizeof out, &got, &d), ELDR_EPARSE);
  assert_int_equal(eldr_b64_decode("Z===", 4, out, sizeof out, &got, &d), ELDR_EPARSE);
  assert_int_equal(eldr_b64_decode("====", 4, out, sizeof out, &got, &d), ELDR_EPARSE);
  /* non-zero bits under the padding */
  assert_int_equal(eldr_b64_decode("Zh==", 4, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "padding");
  assert_int_equal(eldr_b64_decode("Zm9=", 4, out, sizeof out, &got, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "padding");
  /* too small a buffer */
  assert_int_equal(eldr_b64_decode("Zm9vYmFy", 8, out, 5, &got, &d), ELDR_ERANGE);
  /* empty is fine for plain base64 */
  assert_int_equal(eldr_b64_decode("", 0, out, 0, &got, &d), 0);
  assert_int_equal(got, 0);
}

/* Every byte value at every position of a long text (SIMD blocks and the
 * scalar tail): accepted exactly when it is in the alphabet, and an invalid
 * one is reported at its offset. */
static void test_b64_every_byte_every_position(void **state) {
  (void)state;
  static const char *A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  enum { N = 150 }; /* 600 chars: SIMD blocks of 32 chars plus a scalar tail */
  uint8_t raw[N];
  for (int i = 0; i < N; i++) raw[i] = (uint8_t)(i * 7 + 3);
  char *txt = ref_b64(raw, N);
  size_t len = strlen(txt);
  uint8_t out[N + 8];
  size_t got;
  eldr_diag d = {{0}};
  for (size_t pos = 0; pos < len; pos += (pos < 80 ? 1 : 13)) {
    char saved = txt[pos];
    for (int c = 0; c < 256; c++) {
      txt[pos] = (char)c;
      int rc = eldr_b64_decode(txt, len, out, sizeof out, &got, &d);
      int valid = c != 0 && strchr(A, c) != NULL;
      if (valid != (rc == 0)) fail_msg("byte 0x%02x at %zu: rc %d", c, pos, rc);
      if (!valid) {
        char want[32];
        snprintf(want, sizeof want, "offset %zu", pos);
        ASSERT_MSG(d, want);
      } else {
        /* the decoded value of that character lands in the right bits */
        uint8_t ref[N];
        size_t rl;
        char *p = strdup(txt);
        assert_int_equal(eldr_b64_decode(p, len, ref, sizeof ref, &rl, NULL), 0);
        free(p);
        uint32_t v = (uint32_t)(strchr(A, c) - A);
        size_t q = pos / 4, r = pos % 4;
        uint32_t x = (uint32_t)out[3 * q] << 16 | (uint32_t)out[3 * q + 1] << 8 | out[3 * q + 2];
        assert_int_equal((x >> (18 - 6 * r)) & 63, v);
      }
    }
    txt[pos] = saved;
  }
  free(txt);
}

/* ---- npy header --------------------------------------------------------- */

static void test_npy_versions_dtypes(void **state) {
  (void)state;
  const char *descr[] = {"|u1", "<u1", "u1", "<u2", "<i4", "<i2", "<i8"};
  const eldr_sel_dtype want[] = {ELDR_SEL_U8, ELDR_SEL_U8, ELDR_SEL_U8, ELDR_SEL_U16LE,
                                 ELDR_SEL_I32LE, ELDR_SEL_I16LE, ELDR_SEL_I64LE};
  for (int major = 1; major <= 3; major++)
    for (int i = 0; i < 7; i++) {
      char dict[200];
      snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (7, 3, 2), }",
               descr[i]);
      bytes b = npy_make(major, dict, NULL, 0, 1);
      eldr_npy_info info;
      eldr_diag d = {{0}};
      assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), 0);
      assert_int_equal(info.dtype, want[i]);
      assert_int_equal(info.ndim, 3);
      assert_int_equal(info.shape[0], 7);
      assert_int_equal(info.shape[1], 3);
      assert_int_equal(info.shape[2], 2);
      assert_int_equal(info.data_offset, b.n);
      assert_int_equal(info.data_offset % 64, 0);
      free(b.p);
    }
}

static void test_npy_dict_variants(void **state) {
  (void)state;
  const char *ok[] = {
      "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }",
      "{'shape': (1, 2, 3), 'descr': '|u1', 'fortran_order': False}",
      "{ 'fortran_order' :False,'shape':(1,2,3,),'descr':'|u1' }",
      "{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": ( 1 , 2 , 3 )}",
      "  {'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3),}  \n",
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    bytes b = npy_make(1, ok[i], NULL, 0, 0);
    eldr_npy_info info;
    eldr_diag d = {{0}};
    int rc = eldr_npy_parse_header(b.p, b.n, &info, &d);
    if (rc) fail_msg("variant %zu: %s", i, d.msg);
    assert_int_equal(info.shape[2], 3);
    free(b.p);
  }
  /* other ndims parse (routed_experts rejects them later) */
  bytes b = npy_make(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }", NULL, 0, 1);
  eldr_npy_info info;
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, NULL), 0);
  assert_int_equal(info.ndim, 1);
  assert_int_equal(info.shape[0], 5);
  free(b.p);
}

static void expect_hdr_err(const char *dict, int err, const char *sub) {
  bytes b = npy_make(1, dict, NULL, 0, 1);
  eldr_npy_info info;
  eldr_diag d = {{0}};
  int rc = eldr_npy_parse_header(b.p, b.n, &info, &d);
  if (rc != err) fail_msg("dict %s: rc %d, want %d (%s)", dict, rc, err, d.msg);
  ASSERT_MSG(d, sub);
  free(b.p);
}

static void test_npy_header_errors(void **state) {
  (void)state;
  eldr_npy_info info;
  eldr_diag d = {{0}};
  const char *good = "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }";
  bytes b = npy_make(1, good, NULL, 0, 1);
  /* bad magic */
  b.p[1] = 'M';
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "magic");
  b.p[1] = 'N';
  assert_int_equal(eldr_npy_parse_header(b.p, 3, &info, &d), ELDR_EPARSE);
  assert_int_equal(eldr_npy_parse_header(b.p, 0, &info, &d), ELDR_EPARSE);
  /* bad versions */
  b.p[6] = 4;
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), ELDR_EVERSION);
  ASSERT_MSG(d, "4.0");
  b.p[6] = 0;
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), ELDR_EVERSION);
  b.p[6] = 1;
  b.p[7] = 1;
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), ELDR_EVERSION);
  ASSERT_MSG(d, "1.1");
  b.p[7] = 0;
  /* truncated: before the version, inside the length, inside the dict */
  assert_int_equal(eldr_npy_parse_header(b.p, 7, &info, &d), ELDR_EPARSE);
  assert_int_equal(eldr_npy_parse_header(b.p, 9, &info, &d), ELDR_EPARSE);
  assert_int_equal(eldr_npy_parse_header(b.p, 40, &info, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "overflows");
  /* header length far beyond the buffer (v1 and v2) */
  b.p[8] = 0xff;
  b.p[9] = 0xff;
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "overflows");
  free(b.p);
  b = npy_make(2, good, NULL, 0, 1);
  b.p[11] = 0xff;
  assert_int_equal(eldr_npy_parse_header(b.p, b.n, &info, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "overflows");
  free(b.p);

  expect_hdr_err("'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }", ELDR_EPARSE, "'{'");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), ", ELDR_EPARSE, "dict");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False}", ELDR_EPARSE, "missing 'shape'");
  expect_hdr_err("{'descr': '|u1', 'shape': (1, 2, 3)}", ELDR_EPARSE, "missing 'fortran_order'");
  expect_hdr_err("{'fortran_order': False, 'shape': (1, 2, 3)}", ELDR_EPARSE, "missing 'descr'");
  expect_hdr_err("{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3)}",
                 ELDR_EPARSE, "duplicate");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), 'x': 1}",
                 ELDR_EPARSE, "unknown key 'x'");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': [1, 2, 3]}", ELDR_EPARSE,
                 "tuple");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, -2, 3)}", ELDR_EPARSE,
                 "integers");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2 3)}", ELDR_EPARSE,
                 "expected ','");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3", ELDR_EPARSE,
                 "shape");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': No, 'shape': (1, 2, 3)}", ELDR_EPARSE,
                 "fortran_order");
  expect_hdr_err("{'descr': |u1, 'fortran_order': False, 'shape': (1, 2, 3)}", ELDR_EPARSE,
                 "quoted");
  expect_hdr_err("{'descr': '|u1, 'fortran_order': False, 'shape': (1, 2, 3)}", ELDR_EUNSUPPORTED,
                 "'|u1, '");
  expect_hdr_err("{'descr': '|u1", ELDR_EPARSE, "descr");
  expect_hdr_err("{'descr': '|u1' 'fortran_order': False, 'shape': (1, 2, 3)}", ELDR_EPARSE,
                 "expected ','");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3)} x", ELDR_EPARSE,
                 "after the dict");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3, 4)}", ELDR_ESHAPE,
                 "more than 3");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999, 2, 3)}",
                 ELDR_ERANGE, "too large");
  expect_hdr_err("{'descr': '|u1', 'fortran_order': True, 'shape': (1, 2, 3)}", ELDR_EUNSUPPORTED,
                 "fortran_order True");
  const char *bad_dtypes[] = {"<f4", ">u2", "|i1", ">i8", "<u4", "|b1", "O"};
  for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++) {
    char dict[200], want[40];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (1, 2, 3)}",
             bad_dtypes[i]);
    snprintf(want, sizeof want, "'%s'", bad_dtypes[i]);
    expect_hdr_err(dict, ELDR_EUNSUPPORTED, want);
  }
}

/* ---- counting ------------------------------------------------------------ */

static void check_count(int major, const char *descr, size_t T, uint32_t L, uint32_t E,
                        uint32_t K) {
  int32_t *ids = random_ids(T * L * K, E);
  char *b = blob(major, descr, T, L, K, ids);
  eldr_shape s = {L, E, K};
  uint32_t *got = calloc((size_t)L * E, sizeof *got), *want = malloc(sizeof *want * L * E);
  naive_count(ids, T, L, E, K, want);
  size_t nt = 12345;
  eldr_diag d = {{0}};
  int rc = count_str(b, &s, got, &nt, &d);
  if (rc) fail_msg("%s v%d T=%zu L=%u K=%u: %s", descr, major, T, L, K, d.msg);
  assert_int_equal(nt, T);
  assert_memory_equal(got, want, sizeof *want * L * E);
  /* counts accumulate (not zeroed) */
  assert_int_equal(count_str(b, &s, got, &nt, &d), 0);
  for (size_t i = 0; i < (size_t)L * E; i++) assert_int_equal(got[i], 2 * want[i]);
  /* decode gives the same ids */
  uint16_t *sel = NULL;
  eldr_shape os;
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), &s, &sel, &nt, &os, &d), 0);
  assert_int_equal(nt, T);
  assert_int_equal(os.num_layers, L);
  assert_int_equal(os.top_k, K);
  assert_int_equal(os.num_experts, E);
  for (size_t i = 0; i < T * L * K; i++) assert_int_equal(sel[i], ids[i]);
  free(sel);
  free(got);
  free(want);
  free(b);
  free(ids);
}

static void test_count_all_dtypes_versions(void **state) {
  (void)state;
  const char *descr[] = {"|u1", "<u1", "u1", "<u2", "<i4"};
  for (int major = 1; major <= 3; major++)
    for (int i = 0; i < 5; i++) {
      uint32_t E = strstr(descr[i], "u1") ? 200 : 3000;
      check_count(major, descr[i], 37, 5, E, 3);
      check_count(major, descr[i], 1, 2, E, 1);
      check_count(major, descr[i], 0, 4, E, 2);
    }
}

static void test_count_chunk_boundaries(void **state) {
  (void)state;
  /* many chunks, whole tokens */
  check_count(1, "|u1", 100, 48, 128, 8);
  /* rows that straddle chunk boundaries (unit 28 does not divide 12 KiB) */
  check_count(1, "<i4", 300, 13, 50, 7);
  check_count(2, "<u2", 211, 11, 700, 5);
  /* one token larger than a chunk: 512 layers x 64 x int32 = 128 KiB */
  check_count(1, "<i4", 3, 512, 4096, 64);
  /* long payloads continue in 192 KiB heap chunks: whole tokens of top-8
   * rows (the bit-sliced kernel), and 104-byte tokens straddling them */
  check_count(1, "|u1", 2000, 48, 128, 8);
  check_count(1, "|u1", 5000, 13, 128, 8);
  /* a bad id deep in a long payload is named by token, layer and slot */
  int32_t *ids = random_ids(3000 * 13 * 8, 100);
  ids[(2711 * 13 + 5) * 8 + 3] = 117;
  char *b = blob(1, "|u1", 3000, 13, 8, ids);
  eldr_shape s = {13, 100, 8};
  uint32_t *got = calloc(13 * 100, sizeof *got);
  size_t nt;
  eldr_diag d = {{0}};
  assert_int_equal(count_str(b, &s, got, &nt, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "token 2711 layer 5 slot 3: expert id 117 out of range");
  free(got);
  free(b);
  free(ids);
}

static void test_count_errors(void **state) {
  (void)state;
  eldr_shape s = {4, 16, 2};
  uint32_t counts[64];
  size_t nt;
  eldr_diag d = {{0}};
  int32_t ids[3 * 4 * 2];
  for (size_t i = 0; i < 24; i++) ids[i] = (int32_t)(i % 16);

  /* empty */
  assert_int_equal(count_str("", &s, counts, &nt, &d), ELDR_EEMPTY);
  /* wrong ndim */
  char *b = blob_dict(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (24,), }", ids, 0);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "1-dimensional");
  free(b);
  uint8_t pl[24];
  for (int i = 0; i < 24; i++) pl[i] = (uint8_t)ids[i];
  b = blob_dict(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 8), }", pl, 24);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "2-dimensional");
  free(b);
  /* shape mismatch with the model: layers, top_k */
  b = blob(1, "|u1", 3, 8, 1, ids);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "does not match the model");
  free(b);
  b = blob(1, "|u1", 6, 4, 1, ids);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_ESHAPE);
  free(b);
  /* short / long payload */
  b = blob_dict(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 2), }", pl, 23);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "short");
  free(b);
  uint8_t pl2[25];
  memcpy(pl2, pl, 24);
  pl2[24] = 0;
  b = blob_dict(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 2), }", pl2, 25);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "long");
  free(b);
  /* a huge shape: no overflow, just short */
  b = blob_dict(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (281474976710656, 4, 2), }",
                pl, 24);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "short");
  free(b);
  /* expert id >= E, with its position */
  int32_t bad[24];
  memcpy(bad, ids, sizeof bad);
  bad[2 * 8 + 1 * 2 + 1] = 16; /* token 2, layer 1, slot 1 */
  b = blob(1, "|u1", 3, 4, 2, bad);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "token 2 layer 1 slot 1: expert id 16");
  free(b);
  /* negative int32 id */
  bad[2 * 8 + 1 * 2 + 1] = -3;
  b = blob(3, "<i4", 3, 4, 2, bad);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "-3 is negative");
  free(b);
  /* bad base64 char in the payload, bad padding, bad length */
  b = blob(1, "|u1", 3, 4, 2, ids);
  size_t n = strlen(b);
  b[n - 6] = '*';
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "'*'");
  free(b);
  b = blob(1, "|u1", 3, 4, 2, ids); /* 128 + 24 = 152 bytes: "xxx=" tail */
  n = strlen(b);
  assert_int_equal(b[n - 1], '=');
  assert_true(b[n - 2] != '=');
  b[n - 2] = 'B'; /* non-zero bits under the padding */
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "padding");
  b[n - 1] = '\0';
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "multiple of 4");
  free(b);
  /* not an npy at all, bad header in base64 */
  assert_int_equal(count_str("Zm9vYmFy", &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "magic");
  /* fortran order / unsupported dtype through the codec */
  b = blob_dict(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (3, 4, 2), }", pl, 24);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EUNSUPPORTED);
  free(b);
  b = blob_dict(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4, 2), }", pl, 24);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EUNSUPPORTED);
  ASSERT_MSG(d, "'<f8'");
  free(b);
  /* header length pointing past the data */
  bytes hb = npy_make(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 2), }", pl, 24, 1);
  hb.p[8] = 0xf0;
  hb.p[9] = 0x7f;
  b = ref_b64(hb.p, hb.n);
  assert_int_equal(count_str(b, &s, counts, &nt, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "overflows");
  free(b);
  free(hb.p);
  /* invalid model shape */
  eldr_shape z = {0, 16, 2};
  assert_int_equal(count_str("Zm9v", &z, counts, &nt, &d), ELDR_ERANGE);
}

static void test_decode_errors_and_any_shape(void **state) {
  (void)state;
  eldr_diag d = {{0}};
  int32_t ids[2 * 3 * 2] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 299};
  char *b = blob(1, "<u2", 2, 3, 2, ids);
  uint16_t *sel;
  size_t nt;
  eldr_shape os;
  /* any shape */
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), NULL, &sel, &nt, &os, &d), 0);
  assert_int_equal(nt, 2);
  assert_int_equal(os.num_layers, 3);
  assert_int_equal(os.top_k, 2);
  assert_int_equal(os.num_experts, 300);
  assert_int_equal(sel[11], 299);
  free(sel);
  eldr_shape any = {0, 0, 0};
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), &any, &sel, &nt, NULL, &d), 0);
  free(sel);
  /* E given: out of range */
  eldr_shape s = {3, 256, 2};
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), &s, &sel, &nt, &os, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "token 1 layer 2 slot 1: expert id 299");
  assert_null(sel);
  free(b);
  /* int32 beyond uint16 with E unknown */
  ids[0] = 70000;
  b = blob(1, "<i4", 2, 3, 2, ids);
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), NULL, &sel, &nt, &os, &d), ELDR_ERANGE);
  free(b);
  /* shape so large the byte count overflows size_t */
  uint8_t pl[8] = {0};
  b = blob_dict(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2814749767106560, 512, 64), }",
                pl, 8);
  eldr_shape big = {512, 4096, 64};
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), &big, &sel, &nt, &os, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "too large");
  uint32_t *counts = calloc(512 * 4096, sizeof *counts);
  assert_int_equal(eldr_routed_experts_count(b, strlen(b), &big, counts, &nt, &d), ELDR_ESHAPE);
  free(counts);
  free(b);
  /* zero layers in the array */
  b = blob_dict(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 0, 2), }", pl, 0);
  assert_int_equal(eldr_routed_experts_decode(b, strlen(b), NULL, &sel, &nt, &os, &d), ELDR_ESHAPE);
  free(b);
  assert_int_equal(eldr_routed_experts_decode("", 0, NULL, &sel, &nt, &os, &d), ELDR_EEMPTY);
  assert_int_equal(eldr_routed_experts_decode("QUJD", 4, NULL, &sel, &nt, &os, &d), ELDR_EPARSE);
}

/* ---- view (the router's path: one decode into a reused buffer) ------------- */

static void test_view_bounds(void **state) {
  (void)state;
  eldr_diag d = {{0}};
  uint8_t *buf = NULL;
  size_t cap = 0;
  eldr_re_view v;
  int32_t ids[2 * 3 * 2] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 299};
  char *b = blob(2, "<u2", 2, 3, 2, ids);
  assert_int_equal(eldr_routed_experts_view(b, strlen(b), NULL, &buf, &cap, &v, &d), 0);
  assert_int_equal(v.rows, 2);
  assert_int_equal(v.layers, 3);
  assert_int_equal(v.top_k, 2);
  assert_int_equal(v.dtype, ELDR_SEL_U16LE);
  const uint8_t *p = v.data;
  assert_int_equal(p[22] | p[23] << 8, 299);
  eldr_shape s = {3, 300, 2}, other = {4, 300, 2};
  assert_int_equal(eldr_routed_experts_view(b, strlen(b), &s, &buf, &cap, &v, &d), 0);
  assert_int_equal(eldr_routed_experts_view(b, strlen(b), &other, &buf, &cap, &v, &d), ELDR_ESHAPE);
  free(b);
  /* the codec's array check, bounds included: top_k 0, layers beyond the
   * limit, a byte count that overflows, a payload one byte long */
  uint8_t pl[8] = {0};
  const char *bad[] = {
      "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 0), }",
      "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 100000, 1), }",
      "{'descr': '<i4', 'fortran_order': False, 'shape': (2814749767106560, 512, 64), }",
      "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 2), }",
  };
  size_t plen[] = {0, 0, 8, 13};
  uint8_t big[16] = {0};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    b = blob_dict(1, bad[i], i == 3 ? big : pl, plen[i]);
    int rc = eldr_routed_experts_view(b, strlen(b), NULL, &buf, &cap, &v, &d);
    if (rc != (i == 3 ? ELDR_EPARSE : ELDR_ESHAPE)) fail_msg("case %zu: rc %d (%s)", i, rc, d.msg);
    free(b);
  }
  assert_int_equal(eldr_routed_experts_view("", 0, NULL, &buf, &cap, &v, &d), ELDR_EEMPTY);
  assert_true(eldr_routed_experts_view("!!!!", 4, NULL, &buf, &cap, &v, &d) < 0);
  free(buf);
}

/* ---- encode -------------------------------------------------------------- */

static int has_sub(const uint8_t *h, size_t n, const char *sub) {
  size_t m = strlen(sub);
  for (size_t i = 0; i + m <= n; i++)
    if (!memcmp(h + i, sub, m)) return 1;
  return 0;
}

static void roundtrip(const eldr_shape *s, size_t T, eldr_sel_dtype dt, const char *want_descr) {
  size_t n = T * s->num_layers * s->top_k;
  uint16_t *sel = malloc(sizeof *sel * (n ? n : 1));
  for (size_t i = 0; i < n; i++) sel[i] = (uint16_t)(rnd() % s->num_experts);
  char *txt = NULL;
  size_t len = 0;
  assert_int_equal(eldr_routed_experts_encode(sel, T, s, dt, &txt, &len), 0);
  assert_int_equal(strlen(txt), len);
  /* the header is what numpy writes */
  uint8_t hdr[192];
  size_t got;
  eldr_diag d = {{0}};
  int rc = eldr_b64_decode(txt, len < 256 ? len : 256, hdr, sizeof hdr, &got, &d);
  if (rc) fail_msg("%s", d.msg);
  eldr_npy_info info;
  rc = eldr_npy_parse_header(hdr, got, &info, &d);
  if (rc) fail_msg("%s", d.msg);
  assert_int_equal(info.data_offset % 64, 0);
  assert_true(has_sub(hdr, info.data_offset, want_descr));
  assert_int_equal(hdr[info.data_offset - 1], '\n');
  uint16_t *back = NULL;
  size_t nt;
  eldr_shape os;
  assert_int_equal(eldr_routed_experts_decode(txt, len, s, &back, &nt, &os, NULL), 0);
  assert_int_equal(nt, T);
  if (n) assert_memory_equal(back, sel, n * sizeof *sel);
  /* counts of the blob equal the counting of the host array */
  size_t cells = eldr_shape_cells(s);
  uint32_t *c1 = calloc(cells, sizeof *c1), *c2 = calloc(cells, sizeof *c2);
  assert_int_equal(eldr_routed_experts_count(txt, len, s, c1, &nt, NULL), 0);
  assert_int_equal(eldr_counts_accumulate(s, sel, ELDR_SEL_U16, T, c2, NULL), 0);
  assert_memory_equal(c1, c2, cells * sizeof *c1);
  free(c1);
  free(c2);
  free(back);
  free(txt);
  free(sel);
}

static void test_encode_roundtrip(void **state) {
  (void)state;
  eldr_shape s = {48, 128, 8};
  roundtrip(&s, 50, ELDR_SEL_U16, "'|u1'");
  roundtrip(&s, 50, ELDR_SEL_U8, "'|u1'");
  roundtrip(&s, 7, ELDR_SEL_U16LE, "'<u2'");
  roundtrip(&s, 7, ELDR_SEL_I32LE, "'<i4'");
  roundtrip(&s, 0, ELDR_SEL_U16, "'|u1'");
  eldr_shape big = {3, 300, 4};
  roundtrip(&big, 11, ELDR_SEL_U16, "'<u2'");
  roundtrip(&big, 11, ELDR_SEL_I32LE, "'<i4'");
  eldr_shape one = {1, 1, 1};
  for (size_t T = 0; T < 5; T++) roundtrip(&one, T, ELDR_SEL_U16, "'|u1'");
}

static void test_encode_errors(void **state) {
  (void)state;
  eldr_shape s = {1, 300, 1};
  uint16_t sel[2] = {5, 299};
  char *txt = (char *)0x1;
  assert_int_equal(eldr_routed_experts_encode(sel, 2, &s, ELDR_SEL_U8, &txt, NULL), ELDR_ERANGE);
  assert_null(txt);
  sel[1] = 300;
  assert_int_equal(eldr_routed_experts_encode(sel, 2, &s, ELDR_SEL_U16, &txt, NULL), ELDR_ERANGE);
  eldr_shape bad = {0, 300, 1};
  assert_int_equal(eldr_routed_experts_encode(sel, 2, &bad, ELDR_SEL_U16, &txt, NULL), ELDR_EINVAL);
  assert_int_equal(eldr_routed_experts_encode(sel, 2, &s, (eldr_sel_dtype)42, &txt, NULL),
                   ELDR_EINVAL);
}

/* The same base64 and codec tests with the SIMD decoder switched off. */
static int scalar_setup(void **state) {
  (void)state;
  eldr_cpu_set(ELDR_CPU_PORTABLE);
  return 0;
}
static int scalar_teardown(void **state) {
  (void)state;
  eldr_cpu_set(eldr_cpu_allowed());
  return 0;
}
/* ... and with AVX2 the widest (the AVX-512 decoder off, where the CPU has it). */
static int avx2_setup(void **state) {
  (void)state;
  eldr_cpu_set(eldr_test_level(ELDR_CPU_AVX2));
  return 0;
}
static int avx2_teardown(void **state) {
  (void)state;
  eldr_cpu_set(eldr_cpu_allowed());
  return 0;
}

/* int16 and int64 arrays (numpy's '<i2', '<i8'): counted and decoded like
 * the others; a negative id is an error naming it. */
static void test_count_decode_i2_i8(void **state) {
  (void)state;
  const eldr_shape s = {2, 300, 2};
  const char *descr[] = {"<i2", "<i8"};
  for (int i = 0; i < 2; i++) {
    const int32_t ids[8] = {0, 299, 7, 8, 150, 151, 2, 1};
    char *b = blob(1, descr[i], 2, 2, 2, ids);
    uint32_t counts[2 * 300] = {0};
    size_t nt = 0;
    eldr_diag d = {{0}};
    if (eldr_routed_experts_count(b, strlen(b), &s, counts, &nt, &d)) fail_msg("%s: %s", descr[i], d.msg);
    assert_int_equal(nt, 2);
    assert_int_equal(counts[299], 1);
    assert_int_equal(counts[300 + 8], 1);
    uint16_t *sel = NULL;
    assert_int_equal(eldr_routed_experts_decode(b, strlen(b), &s, &sel, &nt, NULL, &d), 0);
    for (int k = 0; k < 8; k++) assert_int_equal(sel[k], ids[k]);
    free(sel);
    free(b);
    const int32_t neg[8] = {0, 1, 2, -3, 4, 5, 6, 7};
    b = blob(1, descr[i], 2, 2, 2, neg);
    memset(counts, 0, sizeof counts);
    assert_int_equal(eldr_routed_experts_count(b, strlen(b), &s, counts, &nt, &d), ELDR_ERANGE);
    assert_non_null(strstr(d.msg, "-3 is negative"));
    assert_int_equal(eldr_routed_experts_decode(b, strlen(b), &s, &sel, &nt, NULL, &d), ELDR_ERANGE);
    assert_null(sel);
    free(b);
  }
}

int main(void) {
  const struct CMUnitTest scalar[] = {
      cmocka_unit_test(test_b64_vectors),
      cmocka_unit_test(test_b64_random_roundtrip),
      cmocka_unit_test(test_b64_errors),
      cmocka_unit_test(test_b64_every_byte_every_position),
      cmocka_unit_test(test_b64_every_alignment),
      cmocka_unit_test(test_count_chunk_boundaries),
      cmocka_unit_test(test_count_errors),
  };
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_b64_vectors),
      cmocka_unit_test(test_b64_random_roundtrip),
      cmocka_unit_test(test_b64_errors),
      cmocka_unit_test(test_b64_every_byte_every_position),
      cmocka_unit_test(test_b64_every_alignment),
      cmocka_unit_test(test_npy_versions_dtypes),
      cmocka_unit_test(test_npy_dict_variants),
      cmocka_unit_test(test_npy_header_errors),
      cmocka_unit_test(test_count_all_dtypes_versions),
      cmocka_unit_test(test_count_decode_i2_i8),
      cmocka_unit_test(test_count_chunk_boundaries),
      cmocka_unit_test(test_count_errors),
      cmocka_unit_test(test_decode_errors_and_any_shape),
      cmocka_unit_test(test_view_bounds),
      cmocka_unit_test(test_encode_roundtrip),
      cmocka_unit_test(test_encode_errors),
  };
  int failed = cmocka_run_group_tests_name("scalar base64", scalar, scalar_setup, scalar_teardown);
  failed += cmocka_run_group_tests_name("AVX2 base64", scalar, avx2_setup, avx2_teardown);
  return failed + cmocka_run_group_tests_name("default (SIMD where available)", tests, NULL, NULL);
}
