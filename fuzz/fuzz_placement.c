/* fuzz_placement.c — libFuzzer target for the SGLang expert-location
 * reader (eldr_placement_parse), which `eldr worker --placement FILE` and
 * `eldr sim` drive.
 *
 * The first input byte picks the EP size (1, 2, 4 or 8) and the logical
 * expert count (4 or 8); the rest is the JSON. An accepted placement must
 * place every expert, keep P / R slots per rank, and survive dump -> parse
 * unchanged, otherwise the target aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/placement_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const uint32_t ranks[] = {1, 2, 4, 8};
  uint32_t R = ranks[data[0] & 3], E = (data[0] & 4) ? 8 : 4, L = 2;
  const uint32_t ids[2] = {0, 1};
  eldr_placement *p = NULL;
  eldr_diag d;
  d.msg[0] = 0;
  int rc = eldr_placement_parse((const char *)data + 1, size - 1, E, R, ids, L, &p, &d);
  if (rc != 0) {
    if (p || !d.msg[0]) abort();
    return 0;
  }
  if (p->num_physical % R || p->num_physical < E) abort();
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t e = 0; e < E; e++)
      if (!p->ncopies[l * E + e]) abort();
  char *s = eldr_placement_dump(p, ids, L);
  if (!s) abort();
  eldr_placement *q = NULL;
  if (eldr_placement_parse(s, strlen(s), E, R, ids, L, &q, &d) != 0) abort();
  if (q->num_physical != p->num_physical ||
      memcmp(q->phys, p->phys, (size_t)L * p->num_physical * sizeof *p->phys))
    abort();
  free(s);
  eldr_placement_free(q);
  eldr_placement_free(p);
  return 0;
}
