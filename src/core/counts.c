/* counts.c — model shape checks and the single counting routine (see
 * eldr/counts.h).
 *
 * eldr_counts_accumulate_masked runs in blocks of whole tokens (a few KiB,
 * in L1). Each block is range-checked a vector at a time first (the largest
 * element of the whole block, every layer, against E: AVX2 when the CPU has
 * it, else a portable loop), then counted by a kernel without any check:
 * the artifact's mask is a list of layer indices (the bytes of other layers
 * are never read), the K slots of a row are unrolled for the common K (1, 2,
 * 4, 6, 8) and, for 1-byte ids with K = 8, read as one 64-bit word. A block
 * whose check fails (a bad id, possibly in a layer outside the mask) is
 * redone by the precise per-id loop, which stops at the first bad id of the
 * mask's layers: return code, bad index and partial sums are exactly the
 * reference's (core/counts_ref.h). int64 ids always take the precise loop.
 * One counter per (layer, expert): the K ids of a row are distinct experts
 * in every real reply, so consecutive increments hit different counters and
 * no store-to-load chain forms. */
#include "eldr/counts.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ELDR_COUNTS_AVX2 1
#endif
#include "core/counts_int.h"

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

/* ---- SIMD dispatch ------------------------------------------------------- */

static int simd_state = -1; /* -1 unknown, 0 portable, 1 AVX2 (benign race: same value) */

/* The environment variable name is set to anything but "" or "0". */
static int env_says_no(const char *name) {
  const char *env = getenv(name);
  return env && *env && strcmp(env, "0");
}

/* The CPU has what the AVX-512 paths use: F, BW, VL and VBMI. */
static int cpu_avx512(void) {
#ifdef ELDR_COUNTS_BITS512
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
#else
  return 0;
#endif
}

/* Whether the AVX2 paths run: the CPU has AVX2 and neither ELDR_NO_SIMD
 * (environment, any non-empty value but "0") nor eldr__simd_set(0) said no. */
int eldr__simd_on(void) {
  int s = __atomic_load_n(&simd_state, __ATOMIC_RELAXED);
  if (s < 0) {
    s = 0;
#ifdef ELDR_COUNTS_AVX2
    __builtin_cpu_init();
    s = __builtin_cpu_supports("avx2") && !env_says_no("ELDR_NO_SIMD") ? 1 : 0;
#endif
    __atomic_store_n(&simd_state, s, __ATOMIC_RELAXED);
  }
  return s;
}

static int avx512_state = -1; /* -1 unknown, 0 off, 1 on (the same benign race) */

/* AVX-512 F/BW/VL/VBMI on the CPU, the SIMD paths on, and neither
 * ELDR_NO_AVX512 (as ELDR_NO_SIMD) nor eldr__simd_avx512_set(0) said no. */
static int avx512_allowed(void) {
  int s = __atomic_load_n(&avx512_state, __ATOMIC_RELAXED);
  if (s < 0) {
    s = cpu_avx512() && !env_says_no("ELDR_NO_AVX512");
    __atomic_store_n(&avx512_state, s, __ATOMIC_RELAXED);
  }
  return s;
}

int eldr__simd_avx512(void) { return eldr__simd_on() && avx512_allowed(); }

int eldr__simd_avx512_set(int enable) {
  int was = avx512_allowed(); /* whatever eldr__simd_set says */
  __atomic_store_n(&avx512_state, enable && cpu_avx512(), __ATOMIC_RELAXED);
  return was;
}

int eldr__simd_set(int enable) {
  int was = eldr__simd_on();
  int now = 0;
#ifdef ELDR_COUNTS_AVX2
  __builtin_cpu_init();
  now = enable && __builtin_cpu_supports("avx2");
#else
  (void)enable;
#endif
  __atomic_store_n(&simd_state, now, __ATOMIC_RELAXED);
  return was;
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

#ifdef ELDR_COUNTS_AVX2
__attribute__((target("avx2"))) static uint32_t max_avx2(const unsigned char *p, size_t n,
                                                          size_t w) {
  const size_t bytes = n * w;
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  size_t i = 0;
#define MAXV(OP)                                                                   \
  for (; i + 64 <= bytes; i += 64) {                                               \
    a = OP(a, _mm256_loadu_si256((const __m256i *)(const void *)(p + i)));         \
    b = OP(b, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32)));    \
  }                                                                                \
  a = OP(a, b)
  if (w == 1) {
    MAXV(_mm256_max_epu8);
  } else if (w == 2) {
    MAXV(_mm256_max_epu16);
  } else {
    MAXV(_mm256_max_epu32);
  }
#undef MAXV
  uint32_t lanes[8], m = 0;
  if (w == 1) {
    a = _mm256_max_epu8(a, _mm256_srli_epi32(a, 8));
    a = _mm256_max_epu8(a, _mm256_srli_epi32(a, 16));
    a = _mm256_and_si256(a, _mm256_set1_epi32(0xff));
  } else if (w == 2) {
    a = _mm256_max_epu16(a, _mm256_srli_epi32(a, 16));
    a = _mm256_and_si256(a, _mm256_set1_epi32(0xffff));
  }
  _mm256_storeu_si256((__m256i *)(void *)lanes, a);
  for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
  uint32_t r = max_portable(p + i, (bytes - i) / w, w);
  return r > m ? r : m;
}
#endif

static uint32_t max_elem(const unsigned char *p, size_t n, size_t w) {
#ifdef ELDR_COUNTS_AVX2
  if (n * w >= 64 && eldr__simd_on()) return max_avx2(p, n, w);
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
 * A (token, layer) row of 8 distinct ids < 128 is a 128-bit set. The mask's
 * layers are taken four at a time (a "group": one 32-byte load when they
 * are consecutive layers, four 8-byte loads else), so only masked rows are
 * built; the mask's last nl % 4 layers go to the per-id kernel. A group's
 * four rows of a token become two vectors of four 64-bit sets (ids 0..63,
 * ids 64..127), built with variable shifts (an id >= 64, or >= 128, shifts
 * the bit out: it sets nothing). Per group, the sets of 16 tokens go through a Harley-Seal carry-save tree
 * into bit planes (ones, twos, fours, eights carried; sixteens expanded into
 * byte counters), so one vector operation counts 256 (layer, expert)
 * positions at once instead of one increment per id. A block of tokens is
 * counted into a separate buffer and checked before anything reaches the
 * caller's counts: every row must have set exactly 8 bits (a repeated id
 * in a row, or an id >= 128, sets fewer) and nothing at an expert >= E. A
 * block that fails is left to the kernels below (which count repeats and
 * report the first bad id exactly as the reference does), and so is the
 * rest of the call. Where eldr__simd_avx512() holds, a group is counted by
 * the AVX-512 twin of bits_group (counts_bits512.c, same contract: see
 * core/counts_int.h); the blocks, checks and the rest stay here. */
#ifdef ELDR_COUNTS_AVX2
#define BITS_GROUP 16     /* tokens per carry-save tree */
#define BITS_BLOCK 2048   /* tokens per checked block: sixteens byte counters stay <= 128 */
#define BITS_FIRST 64     /* tokens of the first block */
#define BITS_MIN 256      /* fewer tokens in a call: the per-id kernels (the flush would dominate) */
#define BITS_MAX_LAYERS 128 /* the block's buffer: 128 x 128 x uint16 on the stack */

#define AVX2_FN __attribute__((target("avx2"))) static inline

AVX2_FN void csa(__m256i *h, __m256i *l, __m256i a, __m256i b, __m256i c) {
  const __m256i u = _mm256_xor_si256(a, b);
  *h = _mm256_or_si256(_mm256_and_si256(a, b), _mm256_and_si256(u, c));
  *l = _mm256_xor_si256(u, c);
}

/* The rows of one group at token p: four 8-byte rows at byte offsets off[0..3]
 * (one 32-byte load when they are consecutive layers). */
AVX2_FN __m256i bits_load(const unsigned char *p, const uint32_t *off, int contig) {
  if (contig) return _mm256_loadu_si256((const __m256i *)(const void *)(p + off[0]));
  uint64_t r[4];
  for (int i = 0; i < 4; i++) memcpy(&r[i], p + off[i], 8);
  return _mm256_setr_epi64x((long long)r[0], (long long)r[1], (long long)r[2], (long long)r[3]);
}

/* The sets of 16 tokens' rows of one group: m[i] ids 0..63, m[16 + i] ids 64..127. */
AVX2_FN void bits_build16(const unsigned char *p, size_t tb, const uint32_t *off, int contig, __m256i *m) {
  const __m256i one = _mm256_set1_epi64x(1), off64 = _mm256_set1_epi64x(64);
#define SEL(k) _mm256_setr_epi8(k, -1, -1, -1, -1, -1, -1, -1, 8 + k, -1, -1, -1, -1, -1, -1, -1, \
                                k, -1, -1, -1, -1, -1, -1, -1, 8 + k, -1, -1, -1, -1, -1, -1, -1)
  const __m256i s0 = SEL(0), s1 = SEL(1), s2 = SEL(2), s3 = SEL(3), s4 = SEL(4), s5 = SEL(5),
                s6 = SEL(6), s7 = SEL(7);
#undef SEL
  for (int i = 0; i < BITS_GROUP; i++, p += tb) {
    const __m256i v = bits_load(p, off, contig);
    __m256i lo = _mm256_setzero_si256(), hi = lo;
    /* x: one id per 64-bit lane; x - 64 wraps to >= 2^63 below 64: shifted out */
#define ID(s)                                                        \
  {                                                                  \
    const __m256i x = _mm256_shuffle_epi8(v, s);                     \
    lo = _mm256_or_si256(lo, _mm256_sllv_epi64(one, x));             \
    hi = _mm256_or_si256(hi, _mm256_sllv_epi64(one, _mm256_sub_epi64(x, off64))); \
  }
    ID(s0) ID(s1) ID(s2) ID(s3) ID(s4) ID(s5) ID(s6) ID(s7)
#undef ID
    m[i] = lo;
    m[BITS_GROUP + i] = hi;
  }
}

typedef struct bits_planes {
  __m256i ones, twos, fours, eights;
} bits_planes;

/* 16 sets into the carried planes; returns the sixteens plane. */
AVX2_FN __m256i bits_tree16(bits_planes *s, const __m256i *in) {
  __m256i tA, tB, fA, fB, eA, eB, sixteens;
  csa(&tA, &s->ones, s->ones, in[0], in[1]);
  csa(&tB, &s->ones, s->ones, in[2], in[3]);
  csa(&fA, &s->twos, s->twos, tA, tB);
  csa(&tA, &s->ones, s->ones, in[4], in[5]);
  csa(&tB, &s->ones, s->ones, in[6], in[7]);
  csa(&fB, &s->twos, s->twos, tA, tB);
  csa(&eA, &s->fours, s->fours, fA, fB);
  csa(&tA, &s->ones, s->ones, in[8], in[9]);
  csa(&tB, &s->ones, s->ones, in[10], in[11]);
  csa(&fA, &s->twos, s->twos, tA, tB);
  csa(&tA, &s->ones, s->ones, in[12], in[13]);
  csa(&tB, &s->ones, s->ones, in[14], in[15]);
  csa(&fB, &s->twos, s->twos, tA, tB);
  csa(&eB, &s->fours, s->fours, fA, fB);
  csa(&sixteens, &s->eights, s->eights, eA, eB);
  return sixteens;
}

/* 0xFF in byte i where bit i of plane is set (i = 32c .. 32c + 31). */
AVX2_FN __m256i bits_bytes(__m256i plane, int c) {
  const __m256i ctrl = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                        2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  __m256i x = _mm256_permutevar8x32_epi32(plane, _mm256_set1_epi32(c));
  x = _mm256_shuffle_epi8(x, ctrl);
  return _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
}

/* Add a plane's 256 bits to 256 byte counters (byte i of cnt: bit i). */
AVX2_FN void bits_expand(__m256i plane, __m256i *cnt) {
  for (int c = 0; c < 8; c++) cnt[c] = _mm256_sub_epi8(cnt[c], bits_bytes(plane, c));
}

/* The counts of one half: 16 x sixteens + 8 x eights + 4 x fours + 2 x
 * twos + ones, position 32c + i into out[(c / 2) * 128 + 32 * (c % 2) + i];
 * adds them to *sum (32-bit lanes). */
AVX2_FN void bits_flush(const bits_planes *s, const __m256i *cnt, uint16_t *out, __m256i *sum) {
  const __m256i w1 = _mm256_set1_epi8(1), w2 = _mm256_set1_epi8(2), w4 = _mm256_set1_epi8(4),
                w8 = _mm256_set1_epi8(8), ones16 = _mm256_set1_epi16(1);
  for (int c = 0; c < 8; c++) {
    __m256i b = _mm256_and_si256(bits_bytes(s->ones, c), w1);
    b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(s->twos, c), w2));
    b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(s->fours, c), w4));
    b = _mm256_or_si256(b, _mm256_and_si256(bits_bytes(s->eights, c), w8));
    const __m128i bl = _mm256_castsi256_si128(b), bh = _mm256_extracti128_si256(b, 1);
    const __m128i cl = _mm256_castsi256_si128(cnt[c]), ch = _mm256_extracti128_si256(cnt[c], 1);
    __m256i lo = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(cl), 4), _mm256_cvtepu8_epi16(bl));
    __m256i hi = _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(ch), 4), _mm256_cvtepu8_epi16(bh));
    uint16_t *o = out + (c / 2) * 128 + 32 * (c % 2);
    _mm256_storeu_si256((__m256i *)(void *)o, lo);
    _mm256_storeu_si256((__m256i *)(void *)(o + 16), hi);
    *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(_mm256_madd_epi16(lo, ones16), _mm256_madd_epi16(hi, ones16)));
  }
}

/* Count ntok (a multiple of 16) tokens of one group (rows at byte offsets
 * off[0..3] of each token) into out[r * 128 + e]; returns the number of
 * bits counted. */
__attribute__((target("avx2"))) static size_t bits_group_avx2(const unsigned char *p, size_t tb, size_t ntok,
                                                        const uint32_t *off, uint16_t *out) {
  const int contig = off[1] == off[0] + 8 && off[2] == off[0] + 16 && off[3] == off[0] + 24;
  bits_planes lo = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  bits_planes hi = lo;
  __m256i cnt[16], m[2 * BITS_GROUP];
  for (int c = 0; c < 16; c++) cnt[c] = _mm256_setzero_si256();
  for (size_t t = 0; t < ntok; t += BITS_GROUP, p += BITS_GROUP * tb) {
    bits_build16(p, tb, off, contig, m);
    bits_expand(bits_tree16(&lo, m), cnt);
    bits_expand(bits_tree16(&hi, m + BITS_GROUP), cnt + 8);
  }
  __m256i sum = _mm256_setzero_si256();
  bits_flush(&lo, cnt, out, &sum);
  bits_flush(&hi, cnt + 8, out + 64, &sum);
  uint32_t lanes[8];
  _mm256_storeu_si256((__m256i *)(void *)lanes, sum);
  size_t total = 0;
  for (int i = 0; i < 8; i++) total += lanes[i];
  return total;
}

/* row[0, E) += b[0, E) (E <= 128). */
__attribute__((target("avx2"))) static void add_row(uint32_t *restrict row, const uint16_t *restrict b, size_t E) {
  size_t e = 0;
  for (; e + 8 <= E; e += 8) {
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b + e)));
    const __m256i r = _mm256_loadu_si256((const __m256i *)(const void *)(row + e));
    _mm256_storeu_si256((__m256i *)(void *)(row + e), _mm256_add_epi32(r, x));
  }
  for (; e < E; e++) row[e] += b[e];
}

/* Count whole blocks of tokens by bit planes, the mask's layers in groups
 * of four (lay[4g..4g+3]), while every block passes its check; returns the
 * tokens counted (a multiple of 16: the caller's kernels take the rest).
 * The mask's last nl % 4 layers (rest) are counted by kern, after the whole
 * block's range check. */
__attribute__((target("avx2"))) static size_t count_bits(const unsigned char *p, size_t ntokens, size_t L,
                                                        size_t E, const uint16_t *lay, size_t nl,
                                                        uint32_t *counts, kernel_fn kern) {
  const size_t tb = L * 8, ng = nl / 4, nrest = nl % 4;
  const uint16_t *rest = lay + 4 * ng;
  size_t (*group)(const unsigned char *, size_t, size_t, const uint32_t *, uint16_t *) =
      bits_group_avx2;
#ifdef ELDR_COUNTS_BITS512
  if (eldr__simd_avx512()) group = eldr__bits_group512;
#endif
  uint16_t blk[BITS_MAX_LAYERS * 128];
  uint32_t off[BITS_MAX_LAYERS];
  for (size_t i = 0; i < 4 * ng; i++) off[i] = 8u * lay[i];
  size_t done = 0;
  while (ntokens - done >= BITS_GROUP) {
    size_t n = ntokens - done;
    /* a short first block: an input it does not fit (repeats) costs little */
    const size_t cap = done ? BITS_BLOCK : BITS_FIRST;
    if (n > cap) n = cap;
    n -= n % BITS_GROUP;
    const unsigned char *q = p + done * tb;
    if (nrest && max_elem(q, n * L * 8, 1) >= E) return done;
    for (size_t g = 0; g < ng; g++) {
      if (group(q, tb, n, off + 4 * g, blk + 4 * g * 128) != n * 32) return done; /* a repeat, or id >= 128 */
      for (size_t e = E; e < 128; e++)
        for (int r = 0; r < 4; r++)
          if (blk[(4 * g + r) * 128 + e]) return done; /* an id >= E */
    }
    for (size_t i = 0; i < 4 * ng; i++) /* 8 counters a step (the compiler kept this scalar) */
      add_row(counts + (size_t)lay[i] * E, blk + i * 128, E);
    if (nrest) {
      kargs a = {q, n, L, 8, E, rest, nrest, counts};
      kern(&a);
    }
    done += n;
  }
  return done;
}

static int bits_off; /* eldr__counts_bits_set(0) */

#endif

#define BLOCK_BYTES 8192 /* range-checked then counted while in L1 */

int eldr__counts_bits_set(int enable) {
#ifdef ELDR_COUNTS_AVX2
  int was = !__atomic_load_n(&bits_off, __ATOMIC_RELAXED);
  __atomic_store_n(&bits_off, !enable, __ATOMIC_RELAXED);
  return was;
#else
  (void)enable;
  return 0;
#endif
}

int eldr_counts_accumulate(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                           size_t ntokens, uint32_t *counts, size_t *bad_index) {
  return eldr_counts_accumulate_masked(s, raw, dtype, ntokens, NULL, counts, bad_index);
}

int eldr_counts_accumulate_masked(const eldr_shape *s, const void *raw, eldr_sel_dtype dtype,
                                  size_t ntokens, const uint8_t *mask, uint32_t *counts,
                                  size_t *bad_index) {
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
#ifdef ELDR_COUNTS_AVX2
  /* the bit kernel pays from one group of four masked layers on */
  if (w == 1 && K == 8 && E <= 128 && nl >= 4 && L <= BITS_MAX_LAYERS && ntokens >= BITS_MIN &&
      eldr__simd_on() && !__atomic_load_n(&bits_off, __ATOMIC_RELAXED))
    t0 = count_bits(p, ntokens, L, E, lay, nl, counts, kern);
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

#ifdef ELDR_COUNTS_BITS512
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

#ifdef ELDR_COUNTS_BITS512
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) static size_t add_i8_512(uint32_t *restrict dst,
                                                                                      const int8_t *restrict src,
                                                                                      size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
    _mm512_storeu_si512(dst + i, _mm512_add_epi32(_mm512_loadu_si512(dst + i), x));
  }
  return i;
}
#endif
#ifdef ELDR_COUNTS_AVX2
__attribute__((target("avx2"))) static size_t add_i8_avx2(uint32_t *restrict dst, const int8_t *restrict src,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(src + i)));
    const __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(dst + i));
    _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm256_add_epi32(d, x));
  }
  return i;
}
#endif

void eldr__add_i8_u32(uint32_t *restrict dst, const int8_t *restrict src, size_t n) {
  size_t i = 0;
#ifdef ELDR_COUNTS_BITS512
  if (eldr__simd_avx512()) i = add_i8_512(dst, src, n);
  else
#endif
#ifdef ELDR_COUNTS_AVX2
  if (eldr__simd_on()) i = add_i8_avx2(dst, src, n);
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
#ifdef ELDR_COUNTS_BITS512
    if (w == 1 && K == 8 && E == 128 && ntokens == 16 && nl >= 4 && eldr__simd_avx512() &&
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
