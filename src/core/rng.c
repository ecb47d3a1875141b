#include "eldr/rng.h"

#include <math.h>

uint64_t eldr_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void eldr_rng_seed(eldr_rng *r, uint64_t seed) {
  uint64_t st = seed;
  for (int i = 0; i < 4; i++) r->s[i] = eldr_splitmix64(&st);
}

uint64_t eldr_rng_below(eldr_rng *r, uint64_t n) {
  if (n == 0) return 0;
  uint64_t limit = UINT64_MAX - (UINT64_MAX % n);
  uint64_t x;
  do {
    x = eldr_rng_next(r);
  } while (x >= limit);
  return x % n;
}

double eldr_rng_uniform(eldr_rng *r) {
  return eldr_rng_bits_to_unit(eldr_rng_next(r));
}

double eldr_rng_normal(eldr_rng *r) {
  double u1 = eldr_rng_uniform(r);
  double u2 = eldr_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double eldr_rng_exponential(eldr_rng *r, double rate) {
  double u = eldr_rng_uniform(r);
  return -log1p(-u) / rate;
}

