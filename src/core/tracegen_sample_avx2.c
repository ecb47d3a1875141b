/* tracegen_sample_avx2.c — tracegen_sample_tokens's lanes eight at a time
 * (see tracegen_sample.c for the stream, tracegen_int.h for the contract).
 *
 * One 256-bit register per quantity, lane j in 32-bit element j: the four
 * xoshiro256** streams (64-bit elements m = 0..3, so element j of the
 * output is the low/high half of stream j / 2, as the portable code reads
 * it), the alias draw (gathered columns), the token's taken set as 4 or 8
 * words of 32 bits (E <= 128 or <= 256), k, the repeat count and the
 * offset of the token's row in out. The draws of the lanes that still fill
 * a token are stored with scalar writes; the rare 64-repeat fallback runs
 * the portable tracegen_draw_rest on the spilled lanes. */
#include "tracegen_int.h"

#ifdef TRACEGEN_AVX2
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2"))) static inline __attribute__((always_inline))
#define ROTL64(x, k) _mm256_or_si256(_mm256_slli_epi64((x), (k)), _mm256_srli_epi64((x), 64 - (k)))

typedef struct vrng {
  __m256i s0, s1, s2, s3; /* word w of the four streams */
} vrng;

/* xoshiro256** on the four streams: x * 5 and x * 9 as shifts and adds. */
AVX2_FN __m256i vrng_next(vrng *v) {
  const __m256i x = _mm256_add_epi64(_mm256_slli_epi64(v->s1, 2), v->s1);
  const __m256i rx = ROTL64(x, 7);
  const __m256i res = _mm256_add_epi64(_mm256_slli_epi64(rx, 3), rx);
  const __m256i t = _mm256_slli_epi64(v->s1, 17);
  v->s2 = _mm256_xor_si256(v->s2, v->s0);
  v->s3 = _mm256_xor_si256(v->s3, v->s1);
  v->s1 = _mm256_xor_si256(v->s1, v->s2);
  v->s0 = _mm256_xor_si256(v->s0, v->s3);
  v->s2 = _mm256_xor_si256(v->s2, t);
  v->s3 = ROTL64(v->s3, 45);
  return res;
}

AVX2_FN unsigned lanes_of(__m256i m) { return (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(m)); }

/* One layer; NW the taken set's 32-bit words (4 or 8). */
AVX2_FN void layer(const eldr_shape *sh, tracegen_scratch *s, uint32_t l, uint64_t key,
                   uint32_t ntok, uint16_t *out, const int NW) {
  eldr_rng ls[4];
  tracegen_lane_seed(key, l, ls);
  vrng vv, *v = &vv;
  v->s0 = _mm256_setr_epi64x((long long)ls[0].s[0], (long long)ls[1].s[0], (long long)ls[2].s[0],
                             (long long)ls[3].s[0]);
  v->s1 = _mm256_setr_epi64x((long long)ls[0].s[1], (long long)ls[1].s[1], (long long)ls[2].s[1],
                             (long long)ls[3].s[1]);
  v->s2 = _mm256_setr_epi64x((long long)ls[0].s[2], (long long)ls[1].s[2], (long long)ls[2].s[2],
                             (long long)ls[3].s[2]);
  v->s3 = _mm256_setr_epi64x((long long)ls[0].s[3], (long long)ls[1].s[3], (long long)ls[2].s[3],
                             (long long)ls[3].s[3]);
  const uint32_t L = sh->num_layers, E = sh->num_experts, K = sh->top_k;
  const int *col = (const int *)(s->col + (size_t)l * E);
  const float *pl = s->prob + (size_t)l * E;
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1);
  const __m256i m16 = _mm256_set1_epi32(0xffff), c31 = _mm256_set1_epi32(31);
  const __m256i vE = _mm256_set1_epi32((int)E), vK = _mm256_set1_epi32((int)K);
  const __m256i c64 = _mm256_set1_epi32(64), vn = _mm256_set1_epi32((int)ntok);
  const __m256i tstep = _mm256_set1_epi32(TRACEGEN_LANES);
  const __m256i ostep = _mm256_set1_epi32((int)(TRACEGEN_LANES * L * K));
  __m256i tj = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i off = _mm256_add_epi32(_mm256_mullo_epi32(tj, _mm256_set1_epi32((int)(L * K))),
                                 _mm256_set1_epi32((int)(l * K)));
  __m256i k = zero, rep = zero, active = _mm256_cmpgt_epi32(vn, tj);
  __m256i W[8];
  _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = zero;
  unsigned am = lanes_of(active);
  _Alignas(32) uint32_t ev[8], ov[8];
  while (am) {
    const __m256i u = vrng_next(v);
    const __m256i i = _mm256_srli_epi32(_mm256_mullo_epi32(_mm256_srli_epi32(u, 16), vE), 16);
    const __m256i c = _mm256_i32gather_epi32(col, i, 4);
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_and_si256(c, m16), _mm256_and_si256(u, m16));
    const __m256i e = _mm256_blendv_epi8(_mm256_srli_epi32(c, 16), i, keep);
    const __m256i widx = _mm256_srli_epi32(e, 5);
    const __m256i bit = _mm256_sllv_epi32(one, _mm256_and_si256(e, c31));
    __m256i sel = zero, eq[8];
    _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) {
      eq[w] = _mm256_cmpeq_epi32(widx, _mm256_set1_epi32(w));
      sel = _mm256_or_si256(sel, _mm256_and_si256(W[w], eq[w]));
    }
    const __m256i fresh = _mm256_cmpeq_epi32(_mm256_and_si256(sel, bit), zero); /* -1: new */
    _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = _mm256_or_si256(W[w], _mm256_and_si256(bit, eq[w]));
    _mm256_store_si256((__m256i *)ev, e);
    _mm256_store_si256((__m256i *)ov, _mm256_add_epi32(off, k));
    if (am == 0xffu) { /* every lane fills a token: no test per lane */
      _Pragma("GCC unroll 8") for (unsigned j = 0; j < 8; j++) out[ov[j]] = (uint16_t)ev[j];
    } else {
      for (unsigned j = 0; j < 8; j++)
        if (am >> j & 1) out[ov[j]] = (uint16_t)ev[j];
    }
    k = _mm256_sub_epi32(k, fresh);
    rep = _mm256_andnot_si256(fresh, _mm256_add_epi32(rep, one));
    const unsigned fb = lanes_of(_mm256_cmpeq_epi32(rep, c64)) & am;
    if (__builtin_expect(fb != 0, 0)) { /* 64 repeats: the exact draw, lanes in order */
      _Alignas(32) uint32_t kv[8], rv[8], wv[8][8], tv[8];
      _mm256_store_si256((__m256i *)kv, k);
      _mm256_store_si256((__m256i *)tv, tj);
      _mm256_store_si256((__m256i *)rv, rep);
      _mm256_store_si256((__m256i *)ov, off);
      _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) _mm256_store_si256((__m256i *)wv[w], W[w]);
      for (unsigned j = 0; j < 8; j++) {
        if (!(fb >> j & 1)) continue;
        uint16_t *row = out + ov[j];
        const uint32_t x = tracegen_draw_rest(s, pl, E, row, kv[j], key, l, tv[j]);
        wv[x >> 5][j] |= 1u << (x & 31);
        row[kv[j]++] = (uint16_t)x;
        rv[j] = 0;
      }
      k = _mm256_load_si256((const __m256i *)kv);
      rep = _mm256_load_si256((const __m256i *)rv);
      _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = _mm256_load_si256((const __m256i *)wv[w]);
    }
    const __m256i full = _mm256_cmpeq_epi32(k, vK);
    k = _mm256_andnot_si256(full, k);
    _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = _mm256_andnot_si256(full, W[w]);
    tj = _mm256_add_epi32(tj, _mm256_and_si256(full, tstep));
    off = _mm256_add_epi32(off, _mm256_and_si256(full, ostep));
    active = _mm256_and_si256(active, _mm256_cmpgt_epi32(vn, tj));
    am = lanes_of(active);
  }
}

__attribute__((target("avx2"))) void tracegen_sample_avx2(const eldr_shape *sh,
                                                           tracegen_scratch *s, uint64_t key,
                                                           uint32_t ntok, uint16_t *out) {
  for (uint32_t l = 0; l < sh->num_layers; l++) {
    if (sh->num_experts <= 128)
      layer(sh, s, l, key, ntok, out, 4);
    else
      layer(sh, s, l, key, ntok, out, 8);
  }
}
#else
typedef int tracegen_sample_avx2_unused; /* not an empty translation unit */
#endif
