/* tracegen_sample.c — top-k without replacement from the alias tables of a
 * phase (see tracegen_int.h): the definition of the stream (this portable
 * code) and the switch to the AVX2 version (tracegen_sample_avx2.c) or,
 * where the CPU has AVX-512F, the two-layer AVX-512 one
 * (tracegen_sample_avx512.c), which make the same draws and write the same
 * bytes.
 *
 * The stream. A phase takes one 64-bit key from the request's rng. Each
 * layer seeds four xoshiro256** lane streams from (key, layer) with
 * splitmix64, and eight lanes share its tokens: lane j takes tokens j,
 * j + 8, j + 16, ... in turn. Every step advances the four streams once;
 * lane j reads 32 bits of it (the low half of stream j / 2 for even j, the
 * high half for odd j) if it still has a token to fill. A draw: 16 bits
 * pick the alias column, 16 the acceptance test against the column's
 * integer threshold. A token's experts are the first K distinct draws of
 * its lane after the lane's previous token (K draws without replacement, in
 * order of first appearance). After 64 repeats in a row, one exact draw
 * from the mass the token has not taken (tracegen_draw_rest, with an rng
 * seeded from (key, layer, token, k)) ends the wait.
 *
 * So token t of a layer depends only on the key and the tokens t - 8,
 * t - 16, ... of its lane: the first n tokens are the same whatever the
 * phase's token count (a worker's prefix cache relies on it), and the
 * request's rng moves by one draw per phase. */
#include <string.h>

#include "eldr/cpu.h"
#include "tracegen_int.h"

void tracegen_lane_seed(uint64_t key, uint32_t l, eldr_rng ls[4]) {
  uint64_t st = key ^ ((uint64_t)l * 0x9e6c63d0676a9a99ULL);
  for (int m = 0; m < 4; m++) {
    for (int w = 0; w < 4; w++) ls[m].s[w] = eldr_splitmix64(&st);
    if (!(ls[m].s[0] | ls[m].s[1] | ls[m].s[2] | ls[m].s[3])) ls[m].s[0] = 1; /* never all-zero */
  }
}

uint32_t tracegen_draw_rest(tracegen_scratch *s, const float *pl, uint32_t E, const uint16_t *o,
                            uint32_t k, uint64_t key, uint32_t l, uint32_t t) {
  uint64_t h = key ^ ((uint64_t)l << 48) ^ ((uint64_t)t << 16) ^ k ^ 0x72657374ULL; /* "rest" */
  eldr_rng fr;
  eldr_rng_seed(&fr, eldr_splitmix64(&h));
  eldr_rng *r = &fr;
  if (++s->stamp == 0) {
    memset(s->mark, 0, E * sizeof *s->mark);
    s->stamp = 1;
  }
  const uint32_t st = s->stamp;
  double taken = 0;
  for (uint32_t j = 0; j < k; j++) {
    taken += pl[o[j]];
    s->mark[o[j]] = st;
  }
  double rest = 1.0 - taken;
  double x = eldr_rng_bits_to_unit(eldr_rng_next(r)) * (rest > 0 ? rest : 0);
  uint32_t e, last = E;
  for (e = 0; e < E; e++) {
    if (s->mark[e] == st) continue;
    last = e;
    x -= pl[e];
    if (x < 0) break;
  }
  return e >= E ? last : e;
}

/* One layer, portable: per lane a stamp array (lmark + j * E; a token's
 * experts carry its stamp). */
static void sample_layer(const eldr_shape *sh, tracegen_scratch *s, uint32_t l, uint64_t key,
                         uint32_t ntok, uint16_t *out) {
  eldr_rng ls[4];
  tracegen_lane_seed(key, l, ls);
  const uint32_t L = sh->num_layers, E = sh->num_experts, K = sh->top_k;
  const uint32_t *col = s->col + (size_t)l * E;
  const float *pl = s->prob + (size_t)l * E;
  if ((uint64_t)s->lstamp + ntok + TRACEGEN_LANES + 1 > UINT32_MAX) {
    memset(s->lmark, 0, (size_t)TRACEGEN_LANES * E * sizeof *s->lmark);
    s->lstamp = 0;
  }
  uint32_t tj[TRACEGEN_LANES], k[TRACEGEN_LANES], rep[TRACEGEN_LANES], st[TRACEGEN_LANES];
  unsigned active = 0;
  for (uint32_t j = 0; j < TRACEGEN_LANES; j++) {
    tj[j] = j;
    k[j] = rep[j] = 0;
    st[j] = ++s->lstamp;
    if (j < ntok) active |= 1u << j;
  }
  while (active) {
    uint64_t o[4];
    for (int m = 0; m < 4; m++) o[m] = eldr_rng_next(&ls[m]);
    for (uint32_t j = 0; j < TRACEGEN_LANES; j++) {
      if (!(active >> j & 1)) continue;
      const uint32_t u = (uint32_t)(o[j >> 1] >> (32 * (j & 1)));
      const uint32_t i = ((u >> 16) * E) >> 16, c = col[i];
      const uint32_t e = (u & 0xffffu) < (c & 0xffffu) ? i : c >> 16;
      uint32_t *mj = s->lmark + (size_t)j * E;
      uint16_t *row = out + ((size_t)tj[j] * L + l) * K;
      const uint32_t fresh = mj[e] != st[j];
      mj[e] = st[j];
      row[k[j]] = (uint16_t)e;
      k[j] += fresh;
      rep[j] = fresh ? 0 : rep[j] + 1;
      if (rep[j] == 64) {
        const uint32_t x = tracegen_draw_rest(s, pl, E, row, k[j], key, l, tj[j]);
        mj[x] = st[j];
        row[k[j]++] = (uint16_t)x;
        rep[j] = 0;
      }
      if (k[j] == K) {
        k[j] = 0;
        st[j] = ++s->lstamp;
        tj[j] += TRACEGEN_LANES;
        if (tj[j] >= ntok) active &= ~(1u << j);
      }
    }
  }
}

void tracegen_sample_tokens(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r,
                            uint32_t ntok, uint16_t *out) {
  const uint64_t key = eldr_rng_next(r);
  if (ntok == 0) return;
#ifdef TRACEGEN_AVX2
  const uint64_t cells = (uint64_t)(ntok + TRACEGEN_LANES) * sh->num_layers * sh->top_k;
  if (sh->num_experts <= 256 && cells < 0x7fffffffu && eldr_cpu_has(ELDR_CPU_AVX2)) { /* 32-bit offsets */
#ifdef TRACEGEN_AVX512
    if (eldr_cpu_has(ELDR_CPU_AVX512))
      tracegen_sample_avx512(sh, s, key, ntok, out);
    else
#endif
      tracegen_sample_avx2(sh, s, key, ntok, out);
    return;
  }
#endif
  for (uint32_t l = 0; l < sh->num_layers; l++) sample_layer(sh, s, l, key, ntok, out);
}
