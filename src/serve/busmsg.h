/* busmsg.h — the fleet bus's message codec (serve-private; pure: no I/O,
 * no state; fuzzed by fuzz/fuzz_bus_msg.c).
 *
 * What a router replica tells the others about each decoder it routes to,
 * and nothing else: no request content ever travels. A message is
 *
 *   magic "EB", version 1, kind (u8)            DELTA, SNAP, HELLO or BYE
 *   replica id: length (u8, 1..64), bytes       the sender's --bus-replica-id
 *   incarnation (u64)                           random per process start
 *   seq (u64)                                   consecutive per incarnation, every message
 *   sent_ns (u64)                               CLOCK_REALTIME of the oldest event in it
 *   L, E (u16 each)                             the footprint's shape (0, 0: counts only)
 *   part, nparts (u16 each)                     SNAP: this part of how many (else 0, 1)
 *   records (u32), then each record:
 *     decoder id (u64: XXH64 of the decoder's URL)
 *     n, ctx (zig-zag varints)                  DELTA: in-flight requests and prompt
 *                                               tokens added (+) or removed (-);
 *                                               SNAP: the sender's totals
 *     nnz (varint), then nnz pairs:             footprint weights at flat index
 *       index gap (varint), value (zig-zag)     l*E + e, ascending (the first gap is
 *                                               the index itself, then index - previous - 1)
 *
 * all integers little-endian. DELTA values are the fixed-point -ln(1 - p)
 * weights of eldr/footprint.h a route added (or an end removed); SNAP
 * values are the sender's sums over its requests in flight. Decoding
 * checks every length against the buffer, indices against L*E, counts
 * against ELDR__BUS_MAX_*; an error names what is wrong.
 * Threads: any (no state). */
#ifndef ELDR_SERVE_BUSMSG_H
#define ELDR_SERVE_BUSMSG_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"

enum { ELDR__BUS_DELTA = 1, ELDR__BUS_SNAP = 2, ELDR__BUS_HELLO = 3, ELDR__BUS_BYE = 4 };

#define ELDR__BUS_ID_MAX 64          /* replica id bytes */
#define ELDR__BUS_MAX_RECORDS 65536  /* records in one message */
#define ELDR__BUS_MAX_CELLS (1u << 22) /* L * E */
#define ELDR__BUS_MAX_MSG ((size_t)8 << 20) /* bytes of one message */

typedef struct eldr__bus_head {
  int kind;
  char replica[ELDR__BUS_ID_MAX + 1];
  uint64_t incarnation, seq, sent_ns;
  uint32_t L, E;
  uint32_t part, nparts;
  uint32_t nrec;
} eldr__bus_head;

/* One decoder's record; pairs are read with eldr__bus_pair_next. */
typedef struct eldr__bus_rec {
  uint64_t dec;
  int64_t n, ctx;
  uint32_t nnz;
  const uint8_t *pairs; /* into the message */
  size_t pairs_len;
} eldr__bus_rec;

/* Read the head of msg[0..len): 0 with *off at the first record, or
 * ELDR_EPARSE with d naming the field. */
int eldr__bus_head_read(const uint8_t *msg, size_t len, eldr__bus_head *h, size_t *off, eldr_diag *d);
/* The next record at *off (h->nrec of them follow the head): 0, or
 * ELDR_EPARSE. Its pairs are checked here (ascending, below L*E), so
 * eldr__bus_pair_next cannot fail on a record this returned. */
int eldr__bus_rec_read(const uint8_t *msg, size_t len, size_t *off, const eldr__bus_head *h, eldr__bus_rec *r,
                       eldr_diag *d);
/* The pairs of a record read by eldr__bus_rec_read: *pos starts at 0,
 * *prev at -1; fills idx and v. */
void eldr__bus_pair_next(const eldr__bus_rec *r, size_t *pos, int64_t *prev, uint32_t *idx, int64_t *v);

/* ---- writing: into a growing buffer ------------------------------------------ */
typedef struct eldr__bus_out {
  uint8_t *p;
  size_t n, cap;
  size_t nrec_at; /* offset of the head's record count */
  uint32_t nrec;
  int oom;        /* a growth failed: the message is lost */
} eldr__bus_out;
/* Start a message (o->n = 0; its buffer kept). */
void eldr__bus_out_head(eldr__bus_out *o, const eldr__bus_head *h);
/* One record: pairs given as indices (ascending) and values. */
void eldr__bus_out_rec(eldr__bus_out *o, uint64_t dec, int64_t n, int64_t ctx, const uint32_t *idx,
                       const int64_t *v, uint32_t nnz);
/* The same with 32-bit values, signed by sign (+1 route, -1 end). */
void eldr__bus_out_rec32(eldr__bus_out *o, uint64_t dec, int64_t n, int64_t ctx, const uint32_t *idx,
                         const uint32_t *w, uint32_t nnz, int sign);
/* Patch the record count in (after the last record). */
void eldr__bus_out_end(eldr__bus_out *o);
void eldr__bus_out_free(eldr__bus_out *o);

#endif
