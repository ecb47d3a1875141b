/* tracegen_sample.c — top-k without replacement from the alias tables of a
 * phase (see tracegen_int.h).
 *
 * Per token and layer: alias draws, each from 32 random bits (16 pick the
 * column, 16 the acceptance test against the integer threshold), two per
 * 64-bit rng output, until K distinct experts are taken; a draw of an
 * expert already taken for that token is redrawn. After 64 redraws in a row
 * one exact draw from the mass not yet taken ends the wait (draw_rest).
 * A token and layer starts on fresh rng output (a spare half is dropped).
 *
 * The loop is branch-free per draw: every draw is stored at o[k] and k
 * moves on only when the expert is new, so the only branches are the
 * end of the token-layer and the 64-redraw fallback, both predictable. */
#include <string.h>

#include "tracegen_int.h"

/* The exact fallback: one draw from the mass not yet taken for this token
 * (taken summed in the order the experts were drawn). */
static uint32_t draw_rest(const float *pl, const uint32_t *mark, uint32_t st, uint32_t E,
                          const uint16_t *o, uint32_t k, eldr_rng *r) {
  double taken = 0;
  for (uint32_t j = 0; j < k; j++) taken += pl[o[j]];
  double rest = 1.0 - taken;
  double x = eldr_rng_bits_to_unit(eldr_rng_next(r)) * (rest > 0 ? rest : 0);
  uint32_t e, last = E;
  for (e = 0; e < E; e++) {
    if (mark[e] == st) continue;
    last = e;
    x -= pl[e];
    if (x < 0) break;
  }
  return e >= E ? last : e;
}

/* One alias draw from 32 bits u into o[k]; k advances when it is new. */
#define DRAW(u)                                                                                    \
  do {                                                                                             \
    const uint32_t u_ = (u);                                                                       \
    const uint32_t i_ = ((u_ >> 16) * E) >> 16;                                                    \
    const uint32_t c_ = col[i_];                                                                   \
    const uint32_t keep_ = 0u - (uint32_t)((u_ & 0xffffu) < (c_ & 0xffffu)); /* no branch */     \
    const uint32_t e_ = (i_ & keep_) | ((c_ >> 16) & ~keep_);                                      \
    const uint32_t fresh_ = mark[e_] != st;                                                        \
    o[k] = (uint16_t)e_;                                                                           \
    mark[e_] = st;                                                                                 \
    k += fresh_;                                                                                   \
    redraws = (redraws + 1) & (fresh_ - 1u);                                                       \
    if (__builtin_expect(redraws == 64, 0)) {                                                      \
      eldr_rng x_ = rr; /* rr's address is never taken: it stays in registers */                \
      const uint32_t r_ = draw_rest(s->prob + (size_t)l * E, mark, st, E, o, k, &x_);             \
      rr = x_;                                                                                     \
      mark[r_] = st;                                                                               \
      o[k++] = (uint16_t)r_;                                                                       \
      redraws = 0;                                                                                 \
    }                                                                                              \
  } while (0)

void tracegen_sample_tokens(const eldr_shape *sh, tracegen_scratch *s, eldr_rng *r,
                            uint32_t ntok, uint16_t *out) {
  const uint32_t L = sh->num_layers, E = sh->num_experts, K = sh->top_k;
  eldr_rng rr = *r; /* in registers for the loop */
  uint32_t *mark = s->mark;
  uint32_t stamp = s->stamp;
  for (uint32_t t = 0; t < ntok; t++) {
    for (uint32_t l = 0; l < L; l++) {
      const uint32_t *col = s->col + (size_t)l * E;
      uint16_t *o = out + ((size_t)t * L + l) * K;
      if (++stamp == 0) {
        memset(mark, 0, E * sizeof *mark);
        stamp = 1;
      }
      const uint32_t st = stamp;
      uint32_t k = 0, redraws = 0;
      for (;;) {
        const uint64_t bits = eldr_rng_next(&rr);
        DRAW((uint32_t)bits);
        if (k == K) break;
        DRAW((uint32_t)(bits >> 32));
        if (k == K) break;
      }
    }
  }
  s->stamp = stamp;
  *r = rr;
}
