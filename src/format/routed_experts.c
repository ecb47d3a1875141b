/* routed_experts.c — the .npy codec for vLLM's routed_experts (see
 * eldr/routed_experts.h); the base64 layer is format/base64.c.
 *
 * Hot path (eldr_routed_experts_count): the base64 text is decoded in
 * fixed-size chunks into a stack buffer (a long payload continues in
 * 192 KiB heap chunks, so the counting kernels get hundreds of tokens a
 * call while the chunk is in L2). Decoded payload goes to
 * eldr_counts_accumulate() in runs of whole tokens (a token that straddles
 * two chunks is handled per layer row). Payload length versus shape is
 * checked from the base64 length before any payload byte is decoded.
 */
#include "eldr/routed_experts.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64_int.h"

/* ------------------------------------------------------------------------ */
/* npy header                                                                */

static bool hws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

typedef struct hcur {
  const uint8_t *p, *e;
} hcur;

static void hskip(hcur *c) {
  while (c->p < c->e && hws(*c->p)) c->p++;
}

/* A Python string literal '...' or "..." of printable ASCII, no escapes. */
static int hstring(hcur *c, char *out, size_t cap, const char *what, eldr_diag *d) {
  if (c->p >= c->e || (*c->p != '\'' && *c->p != '"'))
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected a quoted %s", what);
  uint8_t q = *c->p++;
  size_t n = 0;
  while (c->p < c->e && *c->p != q) {
    uint8_t ch = *c->p;
    if (ch < 0x20 || ch >= 0x7f || ch == '\\')
      return eldr_diag_fail(d, ELDR_EPARSE, "npy header: bad character in %s", what);
    if (n + 1 >= cap) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: %s too long", what);
    out[n++] = (char)ch;
    c->p++;
  }
  if (c->p >= c->e) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unterminated %s", what);
  c->p++;
  out[n] = '\0';
  return ELDR_OK;
}

static int hdtype(const char *s, eldr_sel_dtype *t, eldr_diag *d) {
  if (!strcmp(s, "|u1") || !strcmp(s, "<u1") || !strcmp(s, "u1") || !strcmp(s, "=u1") ||
      !strcmp(s, ">u1")) {
    *t = ELDR_SEL_U8;
    return ELDR_OK;
  }
  if (!strcmp(s, "<u2")) {
    *t = ELDR_SEL_U16LE;
    return ELDR_OK;
  }
  if (!strcmp(s, "<i4")) {
    *t = ELDR_SEL_I32LE;
    return ELDR_OK;
  }
  if (!strcmp(s, "<i2")) {
    *t = ELDR_SEL_I16LE;
    return ELDR_OK;
  }
  if (!strcmp(s, "<i8")) {
    *t = ELDR_SEL_I64LE;
    return ELDR_OK;
  }
  return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                        "npy header: dtype '%s' unsupported (need uint8 '|u1', little-endian "
                        "uint16 '<u2', int16 '<i2', int32 '<i4' or int64 '<i8')",
                        s);
}

int eldr_npy_parse_header(const uint8_t *buf, size_t len, eldr_npy_info *info, eldr_diag *d) {
  if ((!buf && len) || !info) return eldr_diag_fail(d, ELDR_EINVAL, "npy: argument missing");
  memset(info, 0, sizeof *info);
  if (len < 6 || memcmp(buf, "\x93NUMPY", 6))
    return eldr_diag_fail(d, ELDR_EPARSE, "npy: bad magic (not a .npy array)");
  if (len < 8) return eldr_diag_fail(d, ELDR_EPARSE, "npy: truncated before the version");
  const unsigned major = buf[6], minor = buf[7];
  if (major < 1 || major > 3 || minor != 0)
    return eldr_diag_fail(d, ELDR_EVERSION, "npy: format version %u.%u unsupported (1.0-3.0)",
                          major, minor);
  const size_t pre = major == 1 ? 10 : 12;
  if (len < pre) return eldr_diag_fail(d, ELDR_EPARSE, "npy: truncated header length");
  size_t hlen = major == 1 ? (size_t)buf[8] | (size_t)buf[9] << 8
                           : (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 |
                                 (size_t)buf[11] << 24;
  if (hlen > len - pre)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "npy: header length %zu overflows the input (%zu bytes after the prefix)",
                          hlen, len - pre);
  hcur c = {buf + pre, buf + pre + hlen};
  bool have_descr = false, have_fortran = false, have_shape = false;
  hskip(&c);
  if (c.p >= c.e || *c.p != '{')
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected '{'");
  c.p++;
  int rc;
  for (;;) {
    hskip(&c);
    if (c.p >= c.e) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unterminated dict");
    if (*c.p == '}') {
      c.p++;
      break;
    }
    char key[32];
    if ((rc = hstring(&c, key, sizeof key, "key", d))) return rc;
    hskip(&c);
    if (c.p >= c.e || *c.p != ':')
      return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected ':' after '%s'", key);
    c.p++;
    hskip(&c);
    if (!strcmp(key, "descr")) {
      if (have_descr) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: duplicate 'descr'");
      char ds[24];
      if ((rc = hstring(&c, ds, sizeof ds, "descr", d))) return rc;
      if ((rc = hdtype(ds, &info->dtype, d))) return rc;
      have_descr = true;
    } else if (!strcmp(key, "fortran_order")) {
      if (have_fortran)
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: duplicate 'fortran_order'");
      if (c.e - c.p >= 5 && !memcmp(c.p, "False", 5)) {
        c.p += 5;
      } else if (c.e - c.p >= 4 && !memcmp(c.p, "True", 4)) {
        return eldr_diag_fail(d, ELDR_EUNSUPPORTED,
                              "npy header: fortran_order True unsupported (need C order)");
      } else {
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: fortran_order must be True or False");
      }
      have_fortran = true;
    } else if (!strcmp(key, "shape")) {
      if (have_shape) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: duplicate 'shape'");
      if (c.p >= c.e || *c.p != '(')
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: shape must be a tuple");
      c.p++;
      uint32_t nd = 0;
      for (;;) {
        hskip(&c);
        if (c.p >= c.e) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unterminated shape");
        if (*c.p == ')') {
          c.p++;
          break;
        }
        if (!(*c.p >= '0' && *c.p <= '9'))
          return eldr_diag_fail(d, ELDR_EPARSE, "npy header: shape entries must be integers");
        size_t v = 0;
        while (c.p < c.e && *c.p >= '0' && *c.p <= '9') {
          if (v > ((size_t)1 << 48))
            return eldr_diag_fail(d, ELDR_ERANGE, "npy header: shape dimension too large");
          v = v * 10 + (size_t)(*c.p++ - '0');
        }
        if (nd >= 3)
          return eldr_diag_fail(d, ELDR_ESHAPE, "npy header: more than 3 dimensions");
        info->shape[nd++] = v;
        hskip(&c);
        if (c.p < c.e && *c.p == ',') {
          c.p++;
          continue;
        }
        if (c.p < c.e && *c.p == ')') {
          c.p++;
          break;
        }
        return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected ',' or ')' in shape");
      }
      info->ndim = nd;
      have_shape = true;
    } else {
      return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unknown key '%s'", key);
    }
    hskip(&c);
    if (c.p < c.e && *c.p == ',') {
      c.p++;
      continue;
    }
    if (c.p < c.e && *c.p == '}') {
      c.p++;
      break;
    }
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: expected ',' or '}' after '%s'", key);
  }
  hskip(&c);
  if (c.p != c.e)
    return eldr_diag_fail(d, ELDR_EPARSE, "npy header: unexpected characters after the dict");
  if (!have_descr) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: missing 'descr'");
  if (!have_fortran) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: missing 'fortran_order'");
  if (!have_shape) return eldr_diag_fail(d, ELDR_EPARSE, "npy header: missing 'shape'");
  info->data_offset = pre + hlen;
  return ELDR_OK;
}

/* ------------------------------------------------------------------------ */
/* routed_experts                                                            */

#define CHUNK_Q 4096               /* quads per chunk: 16 KiB of text, 12 KiB decoded */
#define BIG_Q 65536                /* quads per heap chunk: 256 KiB of text, 192 KiB decoded */
#define MAX_UNIT (ELDR_MAX_TOPK * 8) /* bytes of one (token, layer) row */

/* Checks shared by count and decode: ndim, dims against the model (0 =
 * accept any), payload length against the decoded length. */
static int check_array(const eldr_npy_info *h, size_t total, uint32_t L, uint32_t K,
                       size_t *payload, eldr_diag *d) {
  if (h->ndim != 3)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "routed_experts: %u-dimensional array, expected 3 (tokens, layers, top_k)",
                          h->ndim);
  if ((L && h->shape[1] != L) || (K && h->shape[2] != K))
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "routed_experts: shape (%zu, %zu, %zu) does not match the model "
                          "(layers %u, top_k %u)",
                          h->shape[0], h->shape[1], h->shape[2], L, K);
  if (h->shape[1] < 1 || h->shape[1] > ELDR_MAX_LAYERS || h->shape[2] < 1 ||
      h->shape[2] > ELDR_MAX_TOPK)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "routed_experts: shape (%zu, %zu, %zu): layers must be in [1, %d] and "
                          "top_k in [1, %d]",
                          h->shape[0], h->shape[1], h->shape[2], ELDR_MAX_LAYERS, ELDR_MAX_TOPK);
  size_t n;
  if (__builtin_mul_overflow(h->shape[0], h->shape[1], &n) ||
      __builtin_mul_overflow(n, h->shape[2], &n) ||
      __builtin_mul_overflow(n, eldr_sel_dtype_size(h->dtype), &n))
    return eldr_diag_fail(d, ELDR_ESHAPE, "routed_experts: shape (%zu, %zu, %zu) too large",
                          h->shape[0], h->shape[1], h->shape[2]);
  size_t have = total - h->data_offset;
  if (have < n)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "routed_experts: payload short: %zu bytes, shape (%zu, %zu, %zu) needs %zu",
                          have, h->shape[0], h->shape[1], h->shape[2], n);
  if (have > n)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "routed_experts: payload long: %zu bytes, shape (%zu, %zu, %zu) needs %zu",
                          have, h->shape[0], h->shape[1], h->shape[2], n);
  *payload = n;
  return ELDR_OK;
}

static int64_t read_elem(const uint8_t *p, eldr_sel_dtype t) { return eldr_sel_load(p, t, 0); }

static int range_error(const uint8_t *raw, size_t bad, size_t elem0, const eldr_shape *s,
                       eldr_sel_dtype t, eldr_diag *d) {
  int64_t v = read_elem(raw + bad * eldr_sel_dtype_size(t), t);
  size_t g = elem0 + bad;
  size_t K = s->top_k, L = s->num_layers;
  return eldr_diag_fail(d, ELDR_ERANGE,
                        "routed_experts: token %zu layer %zu slot %zu: expert id %lld %s", g / K / L,
                        g / K % L, g % K, (long long)v,
                        v < 0 ? "is negative" : "out of range");
}

typedef struct counter {
  const eldr_shape *s;
  eldr_sel_dtype dt;
  size_t unit;   /* bytes of one layer row: K * itemsize */
  size_t lpos;   /* layer of the next row within its token */
  size_t rows;   /* layer rows consumed so far */
  uint32_t *counts;
  const uint8_t *mask; /* L layer flags, or NULL for all layers */
} counter;

/* Count nrows whole layer rows at p. */
static int count_rows(counter *c, const uint8_t *p, size_t nrows, eldr_diag *d) {
  const size_t L = c->s->num_layers, K = c->s->top_k;
  size_t bad;
  while (nrows) {
    size_t take;
    int rc;
    if (c->lpos == 0 && nrows >= L) {
      size_t nt = nrows / L;
      take = nt * L;
      rc = eldr_counts_accumulate_masked(c->s, p, c->dt, nt, c->mask, c->counts, &bad);
    } else {
      take = L - c->lpos;
      if (take > nrows) take = nrows;
      eldr_shape sub = {(uint32_t)take, c->s->num_experts, c->s->top_k};
      rc = eldr_counts_accumulate_masked(&sub, p, c->dt, 1, c->mask ? c->mask + c->lpos : NULL,
                                         c->counts + c->lpos * c->s->num_experts, &bad);
    }
    if (rc == ELDR_ERANGE) {
      eldr_shape full = *c->s;
      return range_error(p, bad, c->rows * K, &full, c->dt, d);
    }
    if (rc) return eldr_diag_fail(d, rc, "routed_experts: counting failed");
    p += take * c->unit;
    nrows -= take;
    c->rows += take;
    c->lpos = (c->lpos + take) % L;
  }
  return ELDR_OK;
}

int eldr_routed_experts_count(const char *b64, size_t len, const eldr_shape *shape,
                              uint32_t *counts, size_t *ntokens, eldr_diag *d) {
  return eldr_routed_experts_count_masked(b64, len, shape, NULL, counts, ntokens, d);
}

int eldr_routed_experts_count_masked(const char *b64, size_t len, const eldr_shape *shape,
                                     const uint8_t *mask, uint32_t *counts, size_t *ntokens,
                                     eldr_diag *d) {
  if ((!b64 && len) || !counts) return eldr_diag_fail(d, ELDR_EINVAL, "routed_experts: argument missing");
  if (ntokens) *ntokens = 0;
  int rc = eldr_shape_validate(shape, d);
  if (rc) return rc;
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "routed_experts: empty");
  eldr__b64s s;
  if ((rc = eldr__b64s_init(&s, b64, len, d))) return rc;
  uint8_t buf[MAX_UNIT + CHUNK_Q * 3];
  size_t got;
  if ((rc = eldr__b64s_read(&s, buf, CHUNK_Q, &got, d))) return rc;
  eldr_npy_info h;
  if ((rc = eldr_npy_parse_header(buf, got, &h, d))) {
    if (got == CHUNK_Q * 3 && s.total > got)
      eldr_diag_prefix(d, "routed_experts (header limited to %d bytes)", CHUNK_Q * 3);
    return rc;
  }
  size_t payload;
  if ((rc = check_array(&h, s.total, shape->num_layers, shape->top_k, &payload, d))) return rc;
  counter c = {shape, h.dtype, (size_t)shape->top_k * eldr_sel_dtype_size(h.dtype), 0, 0, counts,
               mask};
  /* payload bytes in buf: [data_offset, got). A long payload continues in
   * a heap buffer of BIG_Q quads (hundreds of tokens a chunk, still in L2:
   * the bit-sliced counting kernel takes blocks of 256 tokens and more);
   * without one, in the stack buffer. */
  uint8_t *big = s.total - got > 4 * (size_t)CHUNK_Q * 3 ? malloc(MAX_UNIT + BIG_Q * 3) : NULL;
  uint8_t *b = buf;
  const size_t q = big ? BIG_Q : CHUNK_Q;
  size_t start = h.data_offset, avail = got - h.data_offset;
  for (;;) {
    size_t nrows = avail / c.unit;
    if (nrows && (rc = count_rows(&c, b + start, nrows, d))) break;
    size_t carry = avail - nrows * c.unit;
    uint8_t *to = big ? big : b; /* the first time from the stack buffer into big */
    memmove(to, b + start + nrows * c.unit, carry);
    b = to;
    if ((rc = eldr__b64s_read(&s, b + carry, q, &got, d))) break;
    if (!got) {
      if (carry) rc = eldr_diag_fail(d, ELDR_EPARSE, "routed_experts: payload ends inside a row");
      break;
    }
    start = 0;
    avail = carry + got;
  }
  free(big);
  if (rc) return rc;
  if (ntokens) *ntokens = h.shape[0];
  return ELDR_OK;
}

int eldr_routed_experts_decode(const char *b64, size_t len, const eldr_shape *shape,
                               uint16_t **sel, size_t *ntokens, eldr_shape *out_shape,
                               eldr_diag *d) {
  if ((!b64 && len) || !sel) return eldr_diag_fail(d, ELDR_EINVAL, "routed_experts: argument missing");
  *sel = NULL;
  if (ntokens) *ntokens = 0;
  const uint32_t L = shape ? shape->num_layers : 0, K = shape ? shape->top_k : 0;
  const uint32_t E = shape ? shape->num_experts : 0;
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "routed_experts: empty");
  eldr__b64s s;
  int rc = eldr__b64s_init(&s, b64, len, d);
  if (rc) return rc;
  uint8_t *raw = malloc(s.total ? s.total : 1);
  if (!raw) return eldr_diag_fail(d, ELDR_ENOMEM, "routed_experts: out of memory");
  uint16_t *out = NULL;
  size_t n = 0, got;
  do {
    if ((rc = eldr__b64s_read(&s, raw + n, (size_t)-1 / 4, &got, d))) goto fail;
    n += got;
  } while (got);
  eldr_npy_info h;
  if ((rc = eldr_npy_parse_header(raw, n, &h, d))) goto fail;
  size_t payload;
  if ((rc = check_array(&h, n, L, K, &payload, d))) goto fail;
  const size_t isz = eldr_sel_dtype_size(h.dtype);
  const size_t cnt = payload / isz;
  out = malloc((cnt ? cnt : 1) * sizeof *out);
  if (!out) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "routed_experts: out of memory");
    goto fail;
  }
  const eldr_shape arr = {(uint32_t)h.shape[1], E, (uint32_t)h.shape[2]};
  const uint8_t *p = raw + h.data_offset;
  /* one loop per dtype; the limit is E, or what uint16 holds when E is 0 */
  const uint32_t lim = E ? E : 65536u;
  uint32_t maxv = 0;
  size_t bad = cnt;
  switch (h.dtype) {
  case ELDR_SEL_U8:
    for (size_t i = 0; i < cnt; i++) {
      uint32_t v = p[i];
      maxv = v > maxv ? v : maxv;
      out[i] = (uint16_t)v;
    }
    if (maxv >= lim)
      for (bad = 0; bad < cnt && p[bad] < lim; bad++) {
      }
    break;
  case ELDR_SEL_U16LE:
    for (size_t i = 0; i < cnt; i++) {
      uint32_t v = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
      maxv = v > maxv ? v : maxv;
      out[i] = (uint16_t)v;
    }
    if (maxv >= lim)
      for (bad = 0; bad < cnt && out[bad] < lim; bad++) {
      }
    break;
  case ELDR_SEL_I16LE:
  case ELDR_SEL_I64LE:
    /* rare wire dtypes: one generic loop; negative ids fail the limit */
    for (size_t i = 0; i < cnt; i++) {
      int64_t v = read_elem(p + i * isz, h.dtype);
      uint32_t u = v < 0 || v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
      maxv = u > maxv ? u : maxv;
      out[i] = (uint16_t)u;
      if (u >= lim && bad == cnt) bad = i;
    }
    break;
  default: /* I32LE */
    for (size_t i = 0; i < cnt; i++) {
      /* negative ids become huge unsigned values and fail the limit */
      uint32_t v = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                   (uint32_t)p[4 * i + 3] << 24;
      maxv = v > maxv ? v : maxv;
      out[i] = (uint16_t)v;
    }
    if (maxv >= lim)
      for (bad = 0; bad < cnt; bad++) {
        uint32_t v = (uint32_t)p[4 * bad] | (uint32_t)p[4 * bad + 1] << 8 |
                     (uint32_t)p[4 * bad + 2] << 16 | (uint32_t)p[4 * bad + 3] << 24;
        if (v >= lim) break;
      }
    break;
  }
  if (bad < cnt) {
    rc = range_error(p, bad, 0, &arr, h.dtype, d);
    goto fail;
  }
  int64_t maxid = cnt ? (int64_t)maxv : -1;
  free(raw);
  *sel = out;
  if (ntokens) *ntokens = h.shape[0];
  if (out_shape) {
    out_shape->num_layers = (uint32_t)h.shape[1];
    out_shape->top_k = (uint32_t)h.shape[2];
    out_shape->num_experts = E ? E : (uint32_t)(maxid + 1);
  }
  return ELDR_OK;
fail:
  free(out);
  free(raw);
  return rc;
}

/* The .npy format 1.0 header for (T, L, K) of descr, padded so that the
 * payload starts at a multiple of 64. Returns its length. */
static size_t npy_header(uint8_t *h, size_t cap, const char *descr, size_t T, uint32_t L,
                         uint32_t K) {
  char dict[160];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%zu, %u, %u), }",
                   descr, T, L, K);
  if (n < 0 || (size_t)n >= sizeof dict) return 0;
  size_t hlen = (size_t)n + 1; /* + '\n' */
  size_t total = (10 + hlen + 63) / 64 * 64;
  if (total > cap) return 0;
  hlen = total - 10;
  memcpy(h, "\x93NUMPY\x01\x00", 8);
  h[8] = (uint8_t)(hlen & 0xff);
  h[9] = (uint8_t)(hlen >> 8);
  memcpy(h + 10, dict, (size_t)n);
  memset(h + 10 + n, ' ', hlen - (size_t)n - 1);
  h[total - 1] = '\n';
  return total;
}

int eldr_routed_experts_encode(const uint16_t *sel, size_t ntokens, const eldr_shape *shape,
                               eldr_sel_dtype dtype, char **out, size_t *out_len) {
  if (!out || !shape || (ntokens && !sel)) return ELDR_EINVAL;
  *out = NULL;
  if (out_len) *out_len = 0;
  if (eldr_shape_validate(shape, NULL)) return ELDR_EINVAL;
  const uint32_t E = shape->num_experts;
  if (dtype == ELDR_SEL_U16) dtype = E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8;
  const char *descr = dtype == ELDR_SEL_U8 ? "|u1" : dtype == ELDR_SEL_U16LE ? "<u2" : "<i4";
  if (dtype != ELDR_SEL_U8 && dtype != ELDR_SEL_U16LE && dtype != ELDR_SEL_I32LE)
    return ELDR_EINVAL;
  const size_t isz = eldr_sel_dtype_size(dtype);
  size_t cnt, bytes, npy_len;
  if (__builtin_mul_overflow(ntokens, (size_t)shape->num_layers * shape->top_k, &cnt) ||
      __builtin_mul_overflow(cnt, isz, &bytes))
    return ELDR_ERANGE;
  const uint32_t lim = dtype == ELDR_SEL_U8 ? 256u : 65536u;
  for (size_t i = 0; i < cnt; i++)
    if (sel[i] >= E || sel[i] >= lim) return ELDR_ERANGE;
  uint8_t hdr[256];
  size_t hl = npy_header(hdr, sizeof hdr, descr, ntokens, shape->num_layers, shape->top_k);
  if (!hl) return ELDR_ERANGE;
  if (__builtin_add_overflow(hl, bytes, &npy_len) || npy_len > (SIZE_MAX - 4) / 4 * 3)
    return ELDR_ERANGE;
  uint8_t *npy = malloc(npy_len);
  if (!npy) return ELDR_ENOMEM;
  memcpy(npy, hdr, hl);
  uint8_t *p = npy + hl;
  if (dtype == ELDR_SEL_U8) {
    for (size_t i = 0; i < cnt; i++) p[i] = (uint8_t)sel[i];
  } else if (dtype == ELDR_SEL_U16LE) {
    for (size_t i = 0; i < cnt; i++) {
      p[2 * i] = (uint8_t)sel[i];
      p[2 * i + 1] = (uint8_t)(sel[i] >> 8);
    }
  } else {
    for (size_t i = 0; i < cnt; i++) {
      p[4 * i] = (uint8_t)sel[i];
      p[4 * i + 1] = (uint8_t)(sel[i] >> 8);
      p[4 * i + 2] = 0;
      p[4 * i + 3] = 0;
    }
  }
  size_t elen = eldr_b64_encoded_len(npy_len);
  char *txt = malloc(elen + 1);
  if (!txt) {
    free(npy);
    return ELDR_ENOMEM;
  }
  eldr_b64_encode(npy, npy_len, txt);
  free(npy);
  *out = txt;
  if (out_len) *out_len = elen;
  return ELDR_OK;
}

int eldr_routed_experts_view(const char *b64, size_t len, const eldr_shape *shape, uint8_t **buf, size_t *cap,
                             eldr_re_view *v, eldr_diag *d) {
  if ((!b64 && len) || !buf || !cap || !v)
    return eldr_diag_fail(d, ELDR_EINVAL, "routed_experts: argument missing");
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "routed_experts: empty");
  size_t need = eldr_b64_decoded_max(len);
  if (need < 64) need = 64;
  if (need > *cap) {
    uint8_t *p = realloc(*buf, need);
    if (!p) return eldr_diag_fail(d, ELDR_ENOMEM, "routed_experts: out of memory");
    *buf = p;
    *cap = need;
  }
  size_t n = 0, payload;
  eldr_npy_info h;
  int rc = eldr_b64_decode(b64, len, *buf, *cap, &n, d);
  if (!rc) rc = eldr_npy_parse_header(*buf, n, &h, d);
  if (!rc) rc = check_array(&h, n, shape ? shape->num_layers : 0, shape ? shape->top_k : 0, &payload, d);
  if (rc) return rc;
  v->data = *buf + h.data_offset;
  v->dtype = h.dtype;
  v->rows = h.shape[0];
  v->layers = h.shape[1];
  v->top_k = h.shape[2];
  v->first_token = 0;
  return ELDR_OK;
}
