/* busmsg.c — the fleet bus's message codec (busmsg.h): bounded reads of
 * every field, varint pairs checked once per record. */
#include "busmsg.h"

#include <stdlib.h>
#include <string.h>

/* ---- reading ------------------------------------------------------------------- */

typedef struct rd {
  const uint8_t *p;
  size_t n, off;
} rd;

static int get_u8(rd *r, uint32_t *v) {
  if (r->off + 1 > r->n) return -1;
  *v = r->p[r->off++];
  return 0;
}

static int get_le(rd *r, size_t bytes, uint64_t *v) {
  if (r->n - r->off < bytes || r->off > r->n) return -1;
  uint64_t x = 0;
  for (size_t i = 0; i < bytes; i++) x |= (uint64_t)r->p[r->off + i] << (8 * i);
  r->off += bytes;
  *v = x;
  return 0;
}

static int get_varint(rd *r, uint64_t *v) {
  uint64_t x = 0;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    if (r->off >= r->n) return -1;
    uint8_t b = r->p[r->off++];
    if (shift == 63 && b > 1) return -1; /* more than 64 bits */
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

static int64_t unzig(uint64_t u) { return (int64_t)(u >> 1) ^ -(int64_t)(u & 1); }
static uint64_t zig(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

int eldr__bus_head_read(const uint8_t *msg, size_t len, eldr__bus_head *h, size_t *off, eldr_diag *d) {
  memset(h, 0, sizeof *h);
  rd r = {msg, len, 0};
  uint32_t ver, kind, idlen;
  uint64_t x;
  if (len > ELDR__BUS_MAX_MSG) return eldr_diag_fail(d, ELDR_EPARSE, "bus message: %zu bytes (at most %zu)", len, ELDR__BUS_MAX_MSG);
  if (len < 2 || msg[0] != 'E' || msg[1] != 'B') return eldr_diag_fail(d, ELDR_EPARSE, "bus message: no EB magic");
  r.off = 2;
  if (get_u8(&r, &ver) || ver != 1) return eldr_diag_fail(d, ELDR_EPARSE, "bus message: version not 1");
  if (get_u8(&r, &kind) || kind < ELDR__BUS_DELTA || kind > ELDR__BUS_BYE)
    return eldr_diag_fail(d, ELDR_EPARSE, "bus message: unknown kind");
  h->kind = (int)kind;
  if (get_u8(&r, &idlen) || idlen == 0 || idlen > ELDR__BUS_ID_MAX || r.n - r.off < idlen)
    return eldr_diag_fail(d, ELDR_EPARSE, "bus message: replica id length");
  memcpy(h->replica, msg + r.off, idlen);
  h->replica[idlen] = 0;
  if (memchr(h->replica, 0, idlen)) return eldr_diag_fail(d, ELDR_EPARSE, "bus message: NUL in the replica id");
  r.off += idlen;
  if (get_le(&r, 8, &h->incarnation) || get_le(&r, 8, &h->seq) || get_le(&r, 8, &h->sent_ns))
    return eldr_diag_fail(d, ELDR_EPARSE, "bus message: truncated head");
  uint64_t L, E, part, nparts, nrec;
  if (get_le(&r, 2, &L) || get_le(&r, 2, &E) || get_le(&r, 2, &part) || get_le(&r, 2, &nparts) ||
      get_le(&r, 4, &nrec))
    return eldr_diag_fail(d, ELDR_EPARSE, "bus message: truncated head");
  if ((L == 0) != (E == 0) || L * E > ELDR__BUS_MAX_CELLS)
    return eldr_diag_fail(d, ELDR_EPARSE, "bus message: shape %llu x %llu", (unsigned long long)L, (unsigned long long)E);
  if (nparts == 0 || part >= nparts) return eldr_diag_fail(d, ELDR_EPARSE, "bus message: part %llu of %llu",
                                                           (unsigned long long)part, (unsigned long long)nparts);
  if (nrec > ELDR__BUS_MAX_RECORDS) return eldr_diag_fail(d, ELDR_EPARSE, "bus message: %llu records", (unsigned long long)nrec);
  if ((kind == ELDR__BUS_HELLO || kind == ELDR__BUS_BYE) && nrec)
    return eldr_diag_fail(d, ELDR_EPARSE, "bus message: records in a hello or bye");
  (void)x;
  h->L = (uint32_t)L;
  h->E = (uint32_t)E;
  h->part = (uint32_t)part;
  h->nparts = (uint32_t)nparts;
  h->nrec = (uint32_t)nrec;
  *off = r.off;
  return 0;
}

int eldr__bus_rec_read(const uint8_t *msg, size_t len, size_t *off, const eldr__bus_head *h, eldr__bus_rec *out,
                       eldr_diag *d) {
  rd r = {msg, len, *off};
  uint64_t dec, n, ctx, nnz;
  if (get_le(&r, 8, &dec) || get_varint(&r, &n) || get_varint(&r, &ctx) || get_varint(&r, &nnz))
    return eldr_diag_fail(d, ELDR_EPARSE, "bus record: truncated");
  uint64_t cells = (uint64_t)h->L * h->E;
  if (nnz > cells) return eldr_diag_fail(d, ELDR_EPARSE, "bus record: %llu weights for %llu cells",
                                         (unsigned long long)nnz, (unsigned long long)cells);
  size_t start = r.off;
  int64_t prev = -1;
  for (uint64_t i = 0; i < nnz; i++) {
    uint64_t gap, v;
    if (get_varint(&r, &gap) || get_varint(&r, &v)) return eldr_diag_fail(d, ELDR_EPARSE, "bus record: truncated weights");
    if (gap >= cells || (uint64_t)(prev + 1) + gap >= cells)
      return eldr_diag_fail(d, ELDR_EPARSE, "bus record: weight index past %llu cells", (unsigned long long)cells);
    prev = prev + 1 + (int64_t)gap;
  }
  out->dec = dec;
  out->n = unzig(n);
  out->ctx = unzig(ctx);
  out->nnz = (uint32_t)nnz;
  out->pairs = msg + start;
  out->pairs_len = r.off - start;
  *off = r.off;
  return 0;
}

void eldr__bus_pair_next(const eldr__bus_rec *rec, size_t *pos, int64_t *prev, uint32_t *idx, int64_t *v) {
  rd r = {rec->pairs, rec->pairs_len, *pos};
  uint64_t gap = 0, z = 0;
  get_varint(&r, &gap); /* checked by eldr__bus_rec_read */
  get_varint(&r, &z);
  *prev = *prev + 1 + (int64_t)gap;
  *idx = (uint32_t)*prev;
  *v = unzig(z);
  *pos = r.off;
}

/* ---- writing ------------------------------------------------------------------- */

static uint8_t *room(eldr__bus_out *o, size_t k) {
  if (o->oom) return NULL;
  if (o->cap - o->n < k) {
    size_t nc = o->cap ? o->cap : 4096;
    while (nc - o->n < k) nc *= 2;
    uint8_t *np = realloc(o->p, nc);
    if (!np) {
      o->oom = 1;
      return NULL;
    }
    o->p = np;
    o->cap = nc;
  }
  return o->p + o->n;
}

static void put_le(eldr__bus_out *o, uint64_t v, size_t bytes) {
  uint8_t *p = room(o, bytes);
  if (!p) return;
  for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
  o->n += bytes;
}

static void put_varint(eldr__bus_out *o, uint64_t v) {
  uint8_t *p = room(o, 10);
  if (!p) return;
  size_t k = 0;
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    p[k++] = b | (v ? 0x80 : 0);
  } while (v);
  o->n += k;
}

void eldr__bus_out_head(eldr__bus_out *o, const eldr__bus_head *h) {
  o->n = 0;
  o->nrec = 0;
  o->oom = 0;
  size_t idlen = strnlen(h->replica, ELDR__BUS_ID_MAX);
  uint8_t *p = room(o, 5 + idlen);
  if (!p) return;
  p[0] = 'E';
  p[1] = 'B';
  p[2] = 1;
  p[3] = (uint8_t)h->kind;
  p[4] = (uint8_t)idlen;
  memcpy(p + 5, h->replica, idlen);
  o->n += 5 + idlen;
  put_le(o, h->incarnation, 8);
  put_le(o, h->seq, 8);
  put_le(o, h->sent_ns, 8);
  put_le(o, h->L, 2);
  put_le(o, h->E, 2);
  put_le(o, h->part, 2);
  put_le(o, h->nparts ? h->nparts : 1, 2);
  o->nrec_at = o->n;
  put_le(o, 0, 4);
}

void eldr__bus_out_rec(eldr__bus_out *o, uint64_t dec, int64_t n, int64_t ctx, const uint32_t *idx,
                       const int64_t *v, uint32_t nnz) {
  put_le(o, dec, 8);
  put_varint(o, zig(n));
  put_varint(o, zig(ctx));
  put_varint(o, nnz);
  int64_t prev = -1;
  for (uint32_t i = 0; i < nnz; i++) {
    put_varint(o, (uint64_t)((int64_t)idx[i] - prev - 1));
    put_varint(o, zig(v[i]));
    prev = idx[i];
  }
  o->nrec++;
}

void eldr__bus_out_rec32(eldr__bus_out *o, uint64_t dec, int64_t n, int64_t ctx, const uint32_t *idx,
                         const uint32_t *w, uint32_t nnz, int sign) {
  put_le(o, dec, 8);
  put_varint(o, zig(n));
  put_varint(o, zig(ctx));
  put_varint(o, nnz);
  int64_t prev = -1;
  for (uint32_t i = 0; i < nnz; i++) {
    put_varint(o, (uint64_t)((int64_t)idx[i] - prev - 1));
    put_varint(o, zig(sign * (int64_t)w[i]));
    prev = idx[i];
  }
  o->nrec++;
}

void eldr__bus_out_end(eldr__bus_out *o) {
  if (o->oom || o->n < o->nrec_at + 4) return;
  for (int i = 0; i < 4; i++) o->p[o->nrec_at + i] = (uint8_t)(o->nrec >> (8 * i));
}

void eldr__bus_out_free(eldr__bus_out *o) {
  free(o->p);
  memset(o, 0, sizeof *o);
}
