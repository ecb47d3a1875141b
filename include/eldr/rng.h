/* eldr/rng.h — deterministic pseudo-random numbers (xoshiro256**, seeded by
 * splitmix64). Every random choice in eldr takes an explicit eldr_rng or
 * seed; there is no global generator. The state is a plain value owned by
 * the caller; no allocation, no errors. */
#ifndef ELDR_RNG_H
#define ELDR_RNG_H

#include <stdint.h>

typedef struct eldr_rng {
  uint64_t s[4];
} eldr_rng;

/* Seed the generator; the same seed always gives the same stream. */
void eldr_rng_seed(eldr_rng *r, uint64_t seed);
/* Next 64 random bits (inline: the generator's inner loops call it per draw). */
static inline uint64_t eldr_rng_next(eldr_rng *r) {
  uint64_t *s = r->s;
  uint64_t x = s[1] * 5;
  uint64_t result = ((x << 7) | (x >> 57)) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return result;
}
/* Uniform double in [0, 1) from 64 random bits (the top 53). */
static inline double eldr_rng_bits_to_unit(uint64_t bits) {
  return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}
/* Uniform integer in [0, n) (n > 0), unbiased. Returns 0 when n == 0. */
uint64_t eldr_rng_below(eldr_rng *r, uint64_t n);
/* Uniform double in [0, 1). */
double eldr_rng_uniform(eldr_rng *r);
/* Standard normal (Box-Muller, no cached spare: stateless beyond r). */
double eldr_rng_normal(eldr_rng *r);
/* Exponential with the given rate (> 0). */
double eldr_rng_exponential(eldr_rng *r, double rate);
/* splitmix64 step: a good 64-bit mixer, also used to derive sub-seeds. */
uint64_t eldr_splitmix64(uint64_t *state);

#endif
