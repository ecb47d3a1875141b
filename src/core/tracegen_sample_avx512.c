/* tracegen_sample_avx512.c — tracegen_sample_tokens's lanes sixteen at a
 * time: two layers side by side (see tracegen_sample.c for the stream,
 * tracegen_int.h for the contract, tracegen_sample_avx2.c for the
 * eight-lane version this one follows step by step).
 *
 * A layer's eight lanes depend only on the phase's key and the layer, so
 * layers l and l + 1 share one 512-bit register per quantity: 32-bit
 * elements 0..7 are layer l's lanes, 8..15 layer l + 1's (the 64-bit
 * elements 0..3 and 4..7 of the rng state are their four streams each).
 * The taken sets, k, repeat counts and row offsets are as in the AVX2 code,
 * with mask registers for the per-lane choices. With an odd number of
 * layers the last one runs alone in the low half (the high half is never
 * active). Each layer writes only its own rows and the 64-repeat fallback
 * (tracegen_draw_rest) depends only on (key, layer, token, k) and the
 * row, so the bytes are those of the portable and the AVX2 code. */
#include "tracegen_int.h"

#ifdef TRACEGEN_AVX512
#include <immintrin.h>

#define A512_FN __attribute__((target("avx512f"))) static inline __attribute__((always_inline))

typedef struct vrng16 {
  __m512i s0, s1, s2, s3; /* word w of the eight streams (four per layer) */
} vrng16;

/* xoshiro256** on the eight streams: x * 5 and x * 9 as shifts and adds. */
A512_FN __m512i vrng16_next(vrng16 *v) {
  const __m512i x = _mm512_add_epi64(_mm512_slli_epi64(v->s1, 2), v->s1);
  const __m512i rx = _mm512_rol_epi64(x, 7);
  const __m512i res = _mm512_add_epi64(_mm512_slli_epi64(rx, 3), rx);
  const __m512i t = _mm512_slli_epi64(v->s1, 17);
  v->s2 = _mm512_xor_si512(v->s2, v->s0);
  v->s3 = _mm512_xor_si512(v->s3, v->s1);
  v->s1 = _mm512_xor_si512(v->s1, v->s2);
  v->s0 = _mm512_xor_si512(v->s0, v->s3);
  v->s2 = _mm512_xor_si512(v->s2, t);
  v->s3 = _mm512_rol_epi64(v->s3, 45);
  return res;
}

/* Word w of the streams of layers la (elements 0..3) and lb (4..7). */
A512_FN __m512i seed_word(const eldr_rng a[4], const eldr_rng b[4], int w) {
  return _mm512_setr_epi64((long long)a[0].s[w], (long long)a[1].s[w], (long long)a[2].s[w],
                           (long long)a[3].s[w], (long long)b[0].s[w], (long long)b[1].s[w],
                           (long long)b[2].s[w], (long long)b[3].s[w]);
}

/* Layers la and lb = la + 1 (pair) or la alone (!pair); NW the taken
 * set's 32-bit words (4 or 8). */
A512_FN void layer_pair(const eldr_shape *sh, tracegen_scratch *s, uint32_t la, int pair,
                        uint64_t key, uint32_t ntok, uint16_t *out, const int NW) {
  const uint32_t lb = pair ? la + 1 : la;
  eldr_rng lsa[4], lsb[4];
  tracegen_lane_seed(key, la, lsa);
  tracegen_lane_seed(key, lb, lsb);
  vrng16 vv, *v = &vv;
  v->s0 = seed_word(lsa, lsb, 0);
  v->s1 = seed_word(lsa, lsb, 1);
  v->s2 = seed_word(lsa, lsb, 2);
  v->s3 = seed_word(lsa, lsb, 3);
  const uint32_t L = sh->num_layers, E = sh->num_experts, K = sh->top_k;
  const int *col = (const int *)(s->col + (size_t)la * E);
  const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  const __m512i m16 = _mm512_set1_epi32(0xffff), c31 = _mm512_set1_epi32(31);
  const __m512i vE = _mm512_set1_epi32((int)E), vK = _mm512_set1_epi32((int)K);
  const __m512i c64 = _mm512_set1_epi32(64), vn = _mm512_set1_epi32((int)ntok);
  const __m512i tstep = _mm512_set1_epi32(TRACEGEN_LANES);
  const __m512i ostep = _mm512_set1_epi32((int)(TRACEGEN_LANES * L * K));
  const __mmask16 hi = 0xff00u;
  /* the high half's column offset (layer lb's table) and layer */
  const __m512i cb = _mm512_mask_set1_epi32(zero, hi, (int)((lb - la) * E));
  const __m512i vl = _mm512_mask_set1_epi32(_mm512_set1_epi32((int)la), hi, (int)lb);
  __m512i tj = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
  __m512i off = _mm512_add_epi32(_mm512_mullo_epi32(tj, _mm512_set1_epi32((int)(L * K))),
                                 _mm512_mullo_epi32(vl, vK));
  __m512i k = zero, rep = zero;
  __m512i W[8];
  _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = zero;
  __mmask16 am = _mm512_cmpgt_epi32_mask(vn, tj) & (pair ? 0xffffu : 0x00ffu);
  _Alignas(64) uint32_t ev[16], ov[16];
  while (am) {
    const __m512i u = vrng16_next(v);
    const __m512i i = _mm512_srli_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(u, 16), vE), 16);
    const __m512i c = _mm512_i32gather_epi32(_mm512_add_epi32(i, cb), col, 4);
    const __mmask16 keep =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(c, m16), _mm512_and_si512(u, m16));
    const __m512i e = _mm512_mask_blend_epi32(keep, _mm512_srli_epi32(c, 16), i);
    const __m512i widx = _mm512_srli_epi32(e, 5);
    const __m512i bit = _mm512_sllv_epi32(one, _mm512_and_si512(e, c31));
    __m512i sel = zero;
    __mmask16 eq[8];
    _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) {
      eq[w] = _mm512_cmpeq_epi32_mask(widx, _mm512_set1_epi32(w));
      sel = _mm512_mask_mov_epi32(sel, eq[w], W[w]);
    }
    const __mmask16 fresh = _mm512_testn_epi32_mask(sel, bit); /* the expert is new */
    _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = _mm512_mask_or_epi32(W[w], eq[w], W[w], bit);
    _mm512_store_si512((void *)ev, e);
    _mm512_store_si512((void *)ov, _mm512_add_epi32(off, k));
    if (am == 0xffffu) { /* every lane fills a token: no test per lane */
      _Pragma("GCC unroll 16") for (unsigned j = 0; j < 16; j++) out[ov[j]] = (uint16_t)ev[j];
    } else {
      for (unsigned j = 0; j < 16; j++)
        if (am >> j & 1) out[ov[j]] = (uint16_t)ev[j];
    }
    k = _mm512_mask_add_epi32(k, fresh, k, one);
    rep = _mm512_maskz_add_epi32((__mmask16)~fresh, rep, one);
    const __mmask16 fb = _mm512_cmpeq_epi32_mask(rep, c64) & am;
    if (__builtin_expect(fb != 0, 0)) { /* 64 repeats: the exact draw per lane */
      _Alignas(64) uint32_t kv[16], rv[16], wv[8][16], tv[16];
      _mm512_store_si512((void *)kv, k);
      _mm512_store_si512((void *)tv, tj);
      _mm512_store_si512((void *)rv, rep);
      _mm512_store_si512((void *)ov, off);
      _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) _mm512_store_si512((void *)wv[w], W[w]);
      for (unsigned j = 0; j < 16; j++) {
        if (!(fb >> j & 1)) continue;
        const uint32_t l = j < 8 ? la : lb;
        uint16_t *row = out + ov[j];
        const uint32_t x =
            tracegen_draw_rest(s, s->prob + (size_t)l * E, E, row, kv[j], key, l, tv[j]);
        wv[x >> 5][j] |= 1u << (x & 31);
        row[kv[j]++] = (uint16_t)x;
        rv[j] = 0;
      }
      k = _mm512_load_si512((const void *)kv);
      rep = _mm512_load_si512((const void *)rv);
      _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = _mm512_load_si512((const void *)wv[w]);
    }
    const __mmask16 full = _mm512_cmpeq_epi32_mask(k, vK);
    k = _mm512_maskz_mov_epi32((__mmask16)~full, k);
    _Pragma("GCC unroll 8") for (int w = 0; w < NW; w++) W[w] = _mm512_maskz_mov_epi32((__mmask16)~full, W[w]);
    tj = _mm512_mask_add_epi32(tj, full, tj, tstep);
    off = _mm512_mask_add_epi32(off, full, off, ostep);
    am &= _mm512_cmpgt_epi32_mask(vn, tj);
  }
}

__attribute__((target("avx512f"))) void tracegen_sample_avx512(const eldr_shape *sh,
                                                               tracegen_scratch *s, uint64_t key,
                                                               uint32_t ntok, uint16_t *out) {
  for (uint32_t l = 0; l < sh->num_layers; l += 2) {
    const int pair = l + 1 < sh->num_layers;
    if (sh->num_experts <= 128)
      layer_pair(sh, s, l, pair, key, ntok, out, 4);
    else
      layer_pair(sh, s, l, pair, key, ntok, out, 8);
  }
}
#else
typedef int tracegen_sample_avx512_unused; /* not an empty translation unit */
#endif
