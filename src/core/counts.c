/* counts.c — model shape checks and the single counting routine (see
 * eldr/counts.h).
 *
 * eldr_counts_accumulate_masked runs in blocks of whole tokens (a few KiB,
 * in L1). Each block is range-checked a vector at a time first (the largest
 * element of the whole block, every layer, against E: AVX2 or NEON where
 * eldr_cpu_has says, else a portable loop), then counted by a kernel without any check:
 * the artifact's mask is a list of layer indices (the bytes of other layers
 * are never read), the K slots of a row are unrolled for the common K (1, 2,
 * 4, 6, 8) and, for 1-byte ids with K = 8, read as one 64-bit word. A block
 * whose check fails (a bad id, possibly in a layer outside the mask) is
 * redone by the precise per-id loop, which stops at the first bad id of the
 * mask's layers: return code, bad index and partial sums are exactly the
 * reference's (core/counts_ref.h). int64 ids always take the precise loop.
 * One counter per (layer, expert): the K ids of a row are distinct experts
 * in every real reply, so consecutive increments hit different counters and
 * no store-to-load chain forms. The vector twins live in counts_avx2.c,
 * counts_avx512.c and counts_neon.c; this file decides, by eldr_cpu_has (eldr/cpu.h), which
 * one runs. */
#include "eldr/counts.h"

#include <stdlib.h>
#include <string.h>

#include "core/counts_int.h"
#include "eldr/cpu.h"

int eldr_shape_validate(const eldr_shape *s, eldr_diag *d) {
  if (!s) return eldr_diag_fail(d, ELDR_EINVAL, "model shape missing");
  if (s->num_layers < 1 || s->num_layers > ELDR_MAX_LAYERS)
    return eldr_diag_fail(d, ELDR_ERANGE, "num_layers %u out of range [1, %d]", s->num_layers,
                          ELDR_MAX_LAYERS);
  if (s->num_experts < 1 || s->num_experts > ELDR_MAX_EXPERTS)
    return eldr_diag_fail(d, ELDR_ERANGE, "num_experts %u out of range [1, %d]", s->num_experts,
                          ELDR_MAX_EXPERTS);
  if (s->top_k < 1 || s->top_k > ELDR_MAX_TOPK || s->top_k > s->num_experts)
    return eldr_diag_fail(d, ELDR_ERANGE, "top_k %u out of range [1, min(num_experts=%u, %d)]",
                          s->top_k, s->num_experts, ELDR_MAX_TOPK);
  return ELDR_OK;
}

size_t eldr_sel_dtype_size(eldr_sel_dtype t) {
  switch (t) {
  case ELDR_SEL_U8: return 1;
  case ELDR_SEL_U16LE: return 2;
  case ELDR_SEL_U16: return 2;
  case ELDR_SEL_I32LE: return 4;
  case ELDR_SEL_I16LE: return 2;
  case ELDR_SEL_I64LE: return 8;
  }
  return 0;
}

/* ---- range check: the largest element of n (w-byte, little-endian,
 * unsigned) elements, every one of which must be < E ---------------------- */

static inline uint32_t ld16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static inline uint32_t ld32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t max_portable(const unsigned char *p, size_t n, size_t w) {
  uint32_t m = 0;
  if (w == 1) {
    uint32_t m0 = 0, m1 = 0, m2 = 0, m3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      m0 = p[i] > m0 ? p[i] : m0;
      m1 = p[i + 1] > m1 ? p[i + 1] : m1;
      m2 = p[i + 2] > m2 ? p[i + 2] : m2;
      m3 = p[i + 3] > m3 ? p[i + 3] : m3;
    }
    for (; i < n; i++) m0 = p[i] > m0 ? p[i] : m0;
    m0 = m0 > m1 ? m0 : m1;
    m2 = m2 > m3 ? m2 : m3;
    return m0 > m2 ? m0 : m2;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t v = w == 2 ? ld16(p + 2 * i) : ld32(p + 4 * i);
    m = v > m ? v : m;
  }
  return m;
}

static uint32_t max_elem(const unsigned char *p, size_t n, size_t w) {
#ifdef ELDR_COUNTS_X86
  if (n * w >= 64 && eldr_cpu_has(ELDR_CPU_AVX2)) {
    uint32_t m;
    const size_t i = eldr__max_avx2(p, n * w, w, &m);
    const uint32_t r = max_portable(p + i, n - i / w, w);
    return r > m ? r : m;
  }
#endif
#ifdef ELDR_COUNTS_NEON
  if (n * w >= 64 && eldr_cpu_has(ELDR_CPU_NEON)) {
    uint32_t m;
    const size_t i = eldr__max_neon(p, n * w, w, &m);
    const uint32_t r = max_portable(p + i, n - i / w, w);
    return r > m ? r : m;
  }
#endif
  return max_portable(p, n, w);
}

/* ---- the precise loop: per id, stops at the first bad id ----------------- */

/* Count ntok tokens of row-major data; idx0 = flat index of p's first
 * element (for *bad_index). Checks every id of the mask's layers. */
static int count_precise(const eldr_shape *s, const unsigned char *p, eldr_sel_dtype dt,
                         size_t ntok, const uint8_t *mask, uint32_t *counts, size_t idx0,
                         size_t *bad_index) {
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k;
  size_t idx = 0;
#define PRECISE(LOAD)                                                           \
  for (size_t t = 0; t < ntok; t++)                                             \
    for (size_t l = 0; l < L; l++) {                                            \
      if (mask && !mask[l]) {                                                   \
        idx += K;                                                               \
        continue;                                                               \
      }                                                                         \
      uint32_t *row = counts + l * E;                                           \
      for (size_t k = 0; k < K; k++, idx++) {                                   \
        int64_t e = (LOAD);                                                     \
        if ((uint64_t)e >= E) { /* also catches negative ids */                 \
          if (bad_index) *bad_index = idx0 + idx;                               \
          return ELDR_ERANGE;                                                   \
        }                                                                       \
        row[e]++;                                                               \
      }                                                                         \
    }
  switch (dt) {
  case ELDR_SEL_U8: PRECISE(eldr_sel_load(p, ELDR_SEL_U8, idx)); break;
  case ELDR_SEL_U16LE: PRECISE(eldr_sel_load(p, ELDR_SEL_U16LE, idx)); break;
  case ELDR_SEL_U16: PRECISE(eldr_sel_load(p, ELDR_SEL_U16, idx)); break;
  case ELDR_SEL_I32LE: PRECISE(eldr_sel_load(p, ELDR_SEL_I32LE, idx)); break;
  case ELDR_SEL_I16LE: PRECISE(eldr_sel_load(p, ELDR_SEL_I16LE, idx)); break;
  case ELDR_SEL_I64LE: PRECISE(eldr_sel_load(p, ELDR_SEL_I64LE, idx)); break;
  default: return ELDR_EINVAL;
  }
#undef PRECISE
  return ELDR_OK;
}

/* ---- the kernels: no checks (the block passed the range check) ----------- */

typedef struct kargs {
  const unsigned char *p; /* first token of the block */
  size_t ntok, L, K, E;
  const uint16_t *lay; /* the mask's layers, ascending */
  size_t nl;
  void *counts; /* uint32_t, or uint8_t for the 8-bit kernels */
} kargs;

/* W-byte unsigned little-endian ids, KK slots (0: a->K), counters of CT. */
#define KERNEL(NAME, W, KK, LOAD, CT)                                           \
  static void NAME(const kargs *a) {                                            \
    const size_t K = (KK) ? (size_t)(KK) : a->K, E = a->E, nl = a->nl;          \
    const size_t tb = a->L * K * (W), rb = K * (W);                             \
    const unsigned char *p = a->p;                                              \
    for (size_t t = 0; t < a->ntok; t++, p += tb)                               \
      for (size_t i = 0; i < nl; i++) {                                         \
        const size_t l = a->lay[i];                                             \
        const unsigned char *r = p + l * rb;                                    \
        CT *row = (CT *)a->counts + l * E;                                      \
        for (size_t k = 0; k < K; k++) row[LOAD(r + k * (W))]++;                \
      }                                                                         \
  }

/* 1-byte ids, K = 8: one 64-bit load per row, the ids shifted out of it. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KERNEL_1_8(NAME, CT)                                                    \
  static void NAME(const kargs *a) {                                            \
    const size_t E = a->E, nl = a->nl, tb = a->L * 8;                           \
    const unsigned char *p = a->p;                                              \
    for (size_t t = 0; t < a->ntok; t++, p += tb)                               \
      for (size_t i = 0; i < nl; i++) {                                         \
        const size_t l = a->lay[i];                                             \
        CT *row = (CT *)a->counts + l * E;                                      \
        uint64_t x;                                                             \
        memcpy(&x, p + l * 8, 8);                                               \
        uint32_t lo = (uint32_t)x, hi = (uint32_t)(x >> 32);                    \
        row[lo & 255]++;                                                        \
        row[(lo >> 8) & 255]++;                                                 \
        row[(lo >> 16) & 255]++;                                                \
        row[lo >> 24]++;                                                        \
        row[hi & 255]++;                                                        \
        row[(hi >> 8) & 255]++;                                                 \
        row[(hi >> 16) & 255]++;                                                \
        row[hi >> 24]++;                                                        \
      }                                                                         \
  }
#else
#define KERNEL_1_8(NAME, CT) KERNEL(NAME, 1, 8, LD8, CT)
#endif

#define LD8(q) (*(q))
/* every kernel, for one counter type; T: the name's suffix */
#define KERNELS(CT, T)                                                          \
  KERNEL(k1_any##T, 1, 0, LD8, CT)                                              \
  KERNEL(k1_1##T, 1, 1, LD8, CT)                                                \
  KERNEL(k1_2##T, 1, 2, LD8, CT)                                                \
  KERNEL(k1_4##T, 1, 4, LD8, CT)                                                \
  KERNEL(k1_6##T, 1, 6, LD8, CT)                                                \
  KERNEL_1_8(k1_8##T, CT)                                                       \
  KERNEL(k2_any##T, 2, 0, ld16, CT)                                             \
  KERNEL(k2_1##T, 2, 1, ld16, CT)                                               \
  KERNEL(k2_2##T, 2, 2, ld16, CT)                                               \
  KERNEL(k2_4##T, 2, 4, ld16, CT)                                               \
  KERNEL(k2_6##T, 2, 6, ld16, CT)                                               \
  KERNEL(k2_8##T, 2, 8, ld16, CT)                                               \
  KERNEL(k4_any##T, 4, 0, ld32, CT)                                             \
  KERNEL(k4_8##T, 4, 8, ld32, CT)                                               \
  static kernel_fn pick##T(size_t w, size_t K) {                                \
    if (w == 1) {                                                               \
      switch (K) {                                                              \
      case 1: return k1_1##T;                                                   \
      case 2: return k1_2##T;                                                   \
      case 4: return k1_4##T;                                                   \
      case 6: return k1_6##T;                                                   \
      case 8: return k1_8##T;                                                   \
      default: return k1_any##T;                                                \
      }                                                                         \
    }                                                                           \
    if (w == 2) {                                                               \
      switch (K) {                                                              \
      case 1: return k2_1##T;                                                   \
      case 2: return k2_2##T;                                                   \
      case 4: return k2_4##T;                                                   \
      case 6: return k2_6##T;                                                   \
      case 8: return k2_8##T;                                                   \
      default: return k2_any##T;                                                \
      }                                                                         \
    }                                                                           \
    return K == 8 ? k4_8##T : k4_any##T;                                        \
  }

typedef void (*kernel_fn)(const kargs *);
KERNELS(uint32_t, _32)
KERNELS(uint8_t, _8)
#undef KERNELS
#undef KERNEL
#undef KERNEL_1_8

/* ---- the bit-sliced kernel: 1-byte ids, K = 8, E <= 128 ------------------
 *
 * The mask's layers are taken four at a time (a "group": one 32-byte load
 * when they are consecutive layers, four 8-byte loads else), so only masked
 * rows are built; the mask's last nl % 4 layers go to the per-id kernel. A
 * group is counted by the group kernel of the widest level in use
 * (counts_avx2.c, counts_avx512.c: each row a 128-bit set, sets summed in
 * bit-sliced carry-save planes; the contract is in core/counts_int.h). A
 * block of tokens is counted into a separate buffer and checked before
 * anything reaches the caller's counts: every row must have set exactly 8
 * bits (a repeated id in a row, or an id >= 128, sets fewer) and nothing at
 * an expert >= E. A block that fails is left to the kernels above (which
 * count repeats and report the first bad id exactly as the reference does),
 * and so is the rest of the call. No portable twin: without AVX2 the
 * per-id kernels count every call. */
#define BITS_BLOCK 2048   /* tokens per checked block: sixteens byte counters stay <= 128 */
#define BITS_FIRST 64     /* tokens of the first block */
#define BITS_MIN 256      /* fewer tokens in a call: the per-id kernels (the flush would dominate) */
#define BITS_MAX_LAYERS 128 /* the block's buffer: 128 x 128 x uint16 on the stack */

static int bits_off; /* eldr_counts_bits_set(0) */

int eldr_counts_bits_set(int enable) {
  int was = !__atomic_load_n(&bits_off, __ATOMIC_RELAXED);
  __atomic_store_n(&bits_off, !enable, __ATOMIC_RELAXED);
  return was;
}

#ifdef ELDR_COUNTS_X86
/* Count whole blocks of tokens by bit planes, the mask's layers in groups
 * of four (lay[4g..4g+3]), while every block passes its check; returns the
 * tokens counted (a multiple of 16: the caller's kernels take the rest).
 * The mask's last nl % 4 layers (rest) are counted by kern, after the whole
 * block's range check. */
static size_t count_bits(const unsigned char *p, size_t ntokens, size_t L, size_t E, const uint16_t *lay,
                         size_t nl, uint32_t *counts, kernel_fn kern, eldr_count_planes *pl) {
  const size_t tb = L * 8, ng = nl / 4, nrest = nl % 4;
  const uint16_t *rest = lay + 4 * ng;
  const int wide = eldr_cpu_has(ELDR_CPU_AVX512);
  size_t (*group)(const unsigned char *, size_t, size_t, const uint32_t *, uint16_t *, unsigned char *, size_t) =
      wide ? eldr__bits_group512 : eldr__bits_group_avx2;
  uint16_t blk[BITS_MAX_LAYERS * 128];
  uint32_t off[BITS_MAX_LAYERS];
  for (size_t i = 0; i < 4 * ng; i++) off[i] = 8u * lay[i];
  /* the blocks' planes: kept while they fit in the caller's buffer */
  const size_t bb = ng * ELDR_PLANES_GROUP_BYTES;
  size_t keep = 0;
  if (pl && pl->buf) {
    *pl = (eldr_count_planes){pl->buf, pl->cap, p, 0, ng, bb, tb, wide ? ELDR_CPU_AVX512 : ELDR_CPU_AVX2};
    keep = pl->cap / bb;
  }
  size_t done = 0;
  while (ntokens - done >= ELDR_BITS_GROUP) {
    size_t n = ntokens - done;
    /* a short first block: an input it does not fit (repeats) costs little */
    const size_t cap = done ? BITS_BLOCK : BITS_FIRST;
    if (n > cap) n = cap;
    n -= n % ELDR_BITS_GROUP;
    const unsigned char *q = p + done * tb;
    if (nrest && max_elem(q, n * L * 8, 1) >= E) return done;
    const int kept = (done + n) / ELDR_BITS_GROUP <= keep;
    unsigned char *kp = kept ? pl->buf + done / ELDR_BITS_GROUP * bb : NULL;
    for (size_t g = 0; g < ng; g++) {
      if (group(q, tb, n, off + 4 * g, blk + 4 * g * 128, kp ? kp + g * ELDR_PLANES_GROUP_BYTES : NULL, bb) !=
          n * 32)
        return done; /* a repeat, or id >= 128 */
      for (size_t e = E; e < 128; e++)
        for (int r = 0; r < 4; r++)
          if (blk[(4 * g + r) * 128 + e]) return done; /* an id >= E */
    }
    for (size_t i = 0; i < 4 * ng; i++) /* 8 counters a step (the compiler kept this scalar) */
      eldr__add_row_avx2(counts + (size_t)lay[i] * E, blk + i * 128, E);
    if (nrest) {
      kargs a = {q, n, L, 8, E, rest, nrest, counts};
      kern(&a);
    }
    done += n;
    if (kept) pl->nblocks = done / ELDR_BITS_GROUP; /* checked: theirs are true counts */
  }
  return done;
}
#endif

#define BLOCK_BYTES 8192 /* range-checked then counted while in L1 */

int eldr_counts_accumulate(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                           size_t ntokens, uint32_t *counts, size_t *bad_index) {
  return eldr_counts_accumulate_masked(s, raw, dtype, ntokens, NULL, counts, bad_index);
}

int eldr_counts_accumulate_masked(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                                  size_t ntokens, const uint8_t *mask, uint32_t *counts,
                                  size_t *bad_index) {
  return eldr_counts_accumulate_planes(s, raw, dtype, ntokens, mask, counts, bad_index, NULL);
}

int eldr_counts_accumulate_planes(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype, size_t ntokens,
                                  const uint8_t *mask, uint32_t *counts, size_t *bad_index,
                                  eldr_count_planes *planes) {
  if (planes) planes->nblocks = 0;
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k;
  const size_t w = eldr_sel_dtype_size(dtype);
  const unsigned char *p = raw;
  if (!w) return ELDR_EINVAL;
  int native = 1; /* host-order U16 is the little-endian layout on such hosts */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  native = dtype != ELDR_SEL_U16;
#endif
  if (w == 8 || !native || L > ELDR_MAX_LAYERS || !ntokens)
    return count_precise(s, p, dtype, ntokens, mask, counts, 0, bad_index);
  uint16_t lay[ELDR_MAX_LAYERS];
  size_t nl = 0;
  for (size_t l = 0; l < L; l++)
    if (!mask || mask[l]) lay[nl++] = (uint16_t)l;
  if (!nl) return ELDR_OK; /* nothing read, nothing checked (as the reference) */
  const size_t tb = L * K * w;
  size_t bt = BLOCK_BYTES / tb;
  if (bt < 1) bt = 1;
  kargs a = {NULL, 0, L, K, E, lay, nl, counts};
  kernel_fn kern = pick_32(w, K);
  size_t t0 = 0;
#ifdef ELDR_COUNTS_X86
  /* the bit kernel pays from one group of four masked layers on */
  if (w == 1 && K == 8 && E <= 128 && nl >= 4 && L <= BITS_MAX_LAYERS && ntokens >= BITS_MIN &&
      eldr_cpu_has(ELDR_CPU_AVX2) && !__atomic_load_n(&bits_off, __ATOMIC_RELAXED))
    t0 = count_bits(p, ntokens, L, E, lay, nl, counts, kern, planes);
#endif
  for (size_t t = t0; t < ntokens; t += bt) {
    size_t n = ntokens - t < bt ? ntokens - t : bt;
    const unsigned char *q = p + t * tb;
    if (max_elem(q, n * L * K, w) >= E) /* some id is bad, maybe outside the mask */
      return count_precise(s, q, dtype, ntokens - t, mask, counts, t * L * K, bad_index);
    a.p = q;
    a.ntok = n;
    kern(&a);
  }
  return ELDR_OK;
}

int eldr_counts_check_masked(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                             size_t ntokens, const uint8_t *mask, size_t *bad_index) {
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k;
  const size_t w = eldr_sel_dtype_size(dtype);
  if (!w) return ELDR_EINVAL;
  const unsigned char *p = raw;
  int fast = w != 8;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  fast = fast && dtype != ELDR_SEL_U16;
#endif
  if (fast && ntokens && max_elem(p, ntokens * L * K, w) < E) return ELDR_OK;
  /* the precise walk, without counting: find the first bad id of the mask */
  size_t idx = 0;
  for (size_t t = 0; t < ntokens; t++)
    for (size_t l = 0; l < L; l++) {
      if (mask && !mask[l]) {
        idx += K;
        continue;
      }
      for (size_t k = 0; k < K; k++, idx++)
        if ((uint64_t)eldr_sel_load(p, dtype, idx) >= E) {
          if (bad_index) *bad_index = idx;
          return ELDR_ERANGE;
        }
    }
  return ELDR_OK;
}

#ifdef ELDR_COUNTS_X86
/* A 16-token block of 1-byte top-8 rows over 128 experts, the mask's layers
 * four at a time by the AVX-512 bit kernel, added to counts8 once every
 * group passed (each row 8 distinct ids: a repeat sets fewer bits). Returns
 * the masked layers it counted: 4 * (nl / 4), or 0 (nothing added: the
 * caller's per-id kernel counts every layer, repeats included). */
static size_t block16_bits(const unsigned char *p, size_t L, const uint16_t *lay, size_t nl, uint8_t *counts8) {
  const size_t ng = nl / 4;
  uint8_t blk[ELDR_MAX_LAYERS * 128];
  for (size_t g = 0; g < ng; g++) {
    const uint32_t off[4] = {8u * lay[4 * g], 8u * lay[4 * g + 1], 8u * lay[4 * g + 2], 8u * lay[4 * g + 3]};
    if (eldr__bits_block16_512(p, L * 8, off, blk + 4 * g * 128) != 16 * 32) return 0;
  }
  for (size_t i = 0; i < 4 * ng; i++) {
    uint8_t *row = counts8 + (size_t)lay[i] * 128;
    const uint8_t *b = blk + i * 128;
    for (size_t e = 0; e < 128; e++) row[e] = (uint8_t)(row[e] + b[e]);
  }
  return 4 * ng;
}
#endif

/* The portable converter of either layout (core/counts_int.h): qword
 * (plane k, row r, half h) at AVX2's h * 160 + 32 k + 8 r or AVX-512's
 * 64 k + 8 (2 r + h). */
static uint8_t planes_rows_portable(const unsigned char *gp, int format, uint8_t *out) {
  uint8_t mx = 0;
  for (size_t r = 0; r < 4; r++)
    for (size_t h = 0; h < 2; h++) {
      uint64_t q[5];
      for (size_t k = 0; k < 5; k++)
        memcpy(&q[k], gp + (format == ELDR_CPU_AVX512 ? 64 * k + 8 * (2 * r + h) : 160 * h + 32 * k + 8 * r), 8);
      for (size_t i = 0; i < 64; i++) {
        unsigned v = 0;
        for (size_t k = 0; k < 5; k++) v |= (unsigned)(q[k] >> i & 1) << k;
        out[r * 128 + h * 64 + i] = (uint8_t)v;
        mx = (uint8_t)v > mx ? (uint8_t)v : mx;
      }
    }
  return mx;
}

uint8_t eldr__planes_rows(const unsigned char *gp, int format, uint8_t *out) {
#ifdef ELDR_COUNTS_X86
  if (format == ELDR_CPU_AVX512 && eldr_cpu_has(ELDR_CPU_AVX512)) return eldr__planes_bytes512(gp, out);
  if (format == ELDR_CPU_AVX2 && eldr_cpu_has(ELDR_CPU_AVX2)) return eldr__planes_bytes_avx2(gp, out);
#endif
  return planes_rows_portable(gp, format, out);
}

void eldr__add_i8_u32(uint32_t *restrict dst, const int8_t *restrict src, size_t n) {
  size_t i = 0;
#ifdef ELDR_COUNTS_X86
  if (eldr_cpu_has(ELDR_CPU_AVX512)) i = eldr__add_i8_512(dst, src, n);
  else if (eldr_cpu_has(ELDR_CPU_AVX2)) i = eldr__add_i8_avx2(dst, src, n);
#endif
#ifdef ELDR_COUNTS_NEON
  if (eldr_cpu_has(ELDR_CPU_NEON)) i = eldr__add_i8_neon(dst, src, n);
#endif
  for (; i < n; i++) dst[i] += (uint32_t)src[i];
}

int eldr__counts_block8(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype, size_t ntokens,
                        const uint8_t *mask, uint8_t *counts8) {
  const size_t L = s->num_layers, E = s->num_experts, K = s->top_k;
  const size_t w = eldr_sel_dtype_size(dtype);
  if (!w || ntokens * K > 255) return ELDR_EINVAL;
  int fast = w != 8 && L <= ELDR_MAX_LAYERS;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  fast = fast && dtype != ELDR_SEL_U16;
#endif
  const unsigned char *p = raw;
  if (fast && ntokens && max_elem(p, ntokens * L * K, w) < E) {
    uint16_t lay[ELDR_MAX_LAYERS];
    size_t nl = 0;
    for (size_t l = 0; l < L; l++)
      if (!mask || mask[l]) lay[nl++] = (uint16_t)l;
    size_t done = 0; /* masked layers counted by the bit kernel */
#ifdef ELDR_COUNTS_X86
    if (w == 1 && K == 8 && E == 128 && ntokens == 16 && nl >= 4 && eldr_cpu_has(ELDR_CPU_AVX512) &&
        !__atomic_load_n(&bits_off, __ATOMIC_RELAXED))
      done = block16_bits(p, L, lay, nl, counts8);
#endif
    kargs a = {p, ntokens, L, K, E, lay + done, nl - done, counts8};
    pick_8(w, K)(&a);
    return ELDR_OK;
  }
  /* rare dtypes, or a bad id somewhere: check the mask's ids one by one first */
  if (eldr_counts_check_masked(s, raw, dtype, ntokens, mask, NULL)) return ELDR_ERANGE;
  size_t idx = 0;
  for (size_t t = 0; t < ntokens; t++)
    for (size_t l = 0; l < L; l++, idx += K)
      if (!mask || mask[l])
        for (size_t k = 0; k < K; k++) counts8[l * E + (size_t)eldr_sel_load(p, dtype, idx + k)]++;
  return ELDR_OK;
}
