/* fuzz_bus_msg.c — the fleet bus's message decoder (src/serve/busmsg.c:
 * what any client of the NATS subject can publish). Checks: never crashes
 * or reads out of bounds (an exact-size copy); a head read gives a known
 * kind, a replica id of 1..64 bytes without NUL, part < nparts, at most
 * ELDR__BUS_MAX_RECORDS records; every record read has nnz <= L*E and its
 * pairs come back ascending and below L*E; what was read, written again by
 * the encoder, reads back the same (records, values, indices). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/busmsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *m = malloc(size ? size : 1);
  if (!m) return 0;
  memcpy(m, data, size);
  eldr__bus_head h;
  size_t off;
  eldr_diag d = {{0}};
  if (eldr__bus_head_read(m, size, &h, &off, &d)) {
    free(m);
    return 0;
  }
  if (h.kind < ELDR__BUS_DELTA || h.kind > ELDR__BUS_BYE || h.part >= h.nparts || h.nrec > ELDR__BUS_MAX_RECORDS)
    abort();
  size_t idl = strlen(h.replica);
  if (idl < 1 || idl > ELDR__BUS_ID_MAX) abort();
  size_t cells = (size_t)h.L * h.E;
  static uint32_t idx[1 << 16];
  static int64_t val[1 << 16];
  eldr__bus_out o = {0};
  eldr__bus_out_head(&o, &h);
  for (uint32_t i = 0; i < h.nrec; i++) {
    eldr__bus_rec r;
    if (eldr__bus_rec_read(m, size, &off, &h, &r, &d)) break;
    if (r.nnz > cells) abort();
    size_t pos = 0;
    int64_t prev = -1;
    uint32_t n = 0;
    for (uint32_t k = 0; k < r.nnz; k++) {
      uint32_t ix;
      int64_t v;
      int64_t before = prev;
      eldr__bus_pair_next(&r, &pos, &prev, &ix, &v);
      if ((int64_t)ix <= before || ix >= cells) abort();
      if (n < sizeof idx / sizeof idx[0]) idx[n] = ix, val[n] = v, n++;
    }
    if (pos != r.pairs_len) abort();
    if (n == r.nnz) { /* written again, it reads back the same */
      eldr__bus_out_rec(&o, r.dec, r.n, r.ctx, idx, val, n);
      eldr__bus_out_end(&o);
      eldr__bus_head h2;
      size_t off2;
      if (o.oom || eldr__bus_head_read(o.p, o.n, &h2, &off2, &d) || h2.nrec != o.nrec) abort();
      eldr__bus_rec r2 = {0};
      for (uint32_t j = 0; j < h2.nrec; j++)
        if (eldr__bus_rec_read(o.p, o.n, &off2, &h2, &r2, &d)) abort();
      if (r2.dec != r.dec || r2.n != r.n || r2.ctx != r.ctx || r2.nnz != r.nnz) abort();
      pos = 0;
      prev = -1;
      for (uint32_t k = 0; k < r2.nnz; k++) {
        uint32_t ix;
        int64_t v;
        eldr__bus_pair_next(&r2, &pos, &prev, &ix, &v);
        if (ix != idx[k] || v != val[k]) abort();
      }
    }
  }
  eldr__bus_out_free(&o);
  free(m);
  return 0;
}
