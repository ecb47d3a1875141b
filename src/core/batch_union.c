/* batch_union.c — the batch-union bitmap's lifetime and its count (the
 * per-member kernel is inline in eldr/batch_union.h: it runs once per batch
 * member per step). */
#include "eldr/batch_union.h"

#include <stdlib.h>

#include "eldr/error.h"

int eldr_union_init(eldr_union *u, const eldr_shape *s) {
  memset(u, 0, sizeof *u);
  if (!s || eldr_shape_validate(s, NULL)) return ELDR_EINVAL;
  u->L = s->num_layers;
  u->K = s->top_k;
  u->W = ((size_t)s->num_experts + 63) / 64;
  u->bits = calloc(u->L * u->W, sizeof *u->bits);
  return u->bits ? ELDR_OK : ELDR_ENOMEM;
}

void eldr_union_free(eldr_union *u) {
  if (!u) return;
  free(u->bits);
  u->bits = NULL;
}

/* x86-64's baseline has no popcnt instruction: without a clone the builtin
 * is a libgcc call per word. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define UNION_CLONES __attribute__((target_clones("popcnt", "default")))
#endif
#ifndef UNION_CLONES
#define UNION_CLONES
#endif

UNION_CLONES uint64_t eldr_union_count(const eldr_union *u, uint32_t *per_layer) {
  uint64_t sum = 0;
  for (size_t l = 0; l < u->L; l++) {
    uint32_t cnt = 0;
    const uint64_t *bl = u->bits + l * u->W;
    for (size_t w = 0; w < u->W; w++) cnt += (uint32_t)__builtin_popcountll(bl[w]);
    if (per_layer) per_layer[l] = cnt;
    sum += cnt;
  }
  return sum;
}
