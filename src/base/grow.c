/* grow.c — the one growth rule for arrays. */
#include "eldr/grow.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"

int eldr_grow(void *pptr, size_t *cap, size_t need, size_t esz, size_t min_cap) {
  if (need <= *cap) return ELDR_OK;
  if (esz == 0 || need > SIZE_MAX / esz) return ELDR_ENOMEM;
  size_t nc = *cap > min_cap ? *cap : min_cap;
  while (nc < need) nc = nc > SIZE_MAX / 2 ? need : nc * 2;
  if (nc > SIZE_MAX / esz) nc = need;
  void *old;
  memcpy(&old, pptr, sizeof old);
  void *np = realloc(old, nc * esz);
  if (!np) return ELDR_ENOMEM;
  memcpy(pptr, &np, sizeof np);
  *cap = nc;
  return ELDR_OK;
}
