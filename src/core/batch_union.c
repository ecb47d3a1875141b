/* batch_union.c — the batch-union bitmap's lifetime (the kernel itself is
 * inline in eldr/batch_union.h: it runs once per batch member per step). */
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
