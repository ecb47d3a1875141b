/* bus_int.h — the fleet bus's internals shared by bus.c (the hub thread
 * and NATS) and busview.c (the event loops' side); include only from those
 * two. Threads: see bus.h; each field says who writes it. */
#ifndef ELDR_SERVE_BUS_INT_H
#define ELDR_SERVE_BUS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <nats/nats.h>

#include "bus.h"
#include "busmsg.h"

#define ELDR__BUS_MAX_DEC 4096                    /* decoders the bus tracks */
#define ELDR__BUS_MAX_PEERS 64                    /* replicas a router hears */
#define ELDR__BUS_RING_BYTES ((size_t)4 << 20)    /* one loop's events waiting for the hub */
#define ELDR__BUS_QUEUE 8192                      /* received messages waiting for the hub */
#define ELDR__BUS_QUEUE_BYTES ((size_t)256 << 20) /* and their bytes */
#define ELDR__BUS_LAG_B 12                        /* lag histogram bounds */

enum { ELDR__BUS_LOCAL, ELDR__BUS_CONNECTING, ELDR__BUS_UP, ELDR__BUS_DOWN };

/* ---- a loop's ring of events (one producer: the loop; one consumer: the hub) ---- */
typedef struct eldr__ring {
  uint8_t *buf;
  size_t cap;
  _Atomic size_t head, tail; /* bytes written / read so far */
} eldr__ring;
typedef struct eldr__ring_rec {
  uint64_t dec, t_ns;
  int32_t sign;        /* +1 route, -1 end */
  uint32_t ctx, nnz;
  const uint32_t *idx, *w; /* into the ring (valid until popped) */
  size_t len;
} eldr__ring_rec;
int eldr__ring_init(eldr__ring *r, size_t cap);
void eldr__ring_free(eldr__ring *r);
/* Producer: 0, or -1 when it does not fit (nothing written). */
int eldr__ring_push(eldr__ring *r, uint64_t dec, uint64_t t_ns, int32_t sign, uint32_t ctx, const uint32_t *idx,
                    const uint32_t *w, uint32_t nnz);
/* Consumer: 1 and the oldest record, or 0 when empty; pop releases it. */
int eldr__ring_peek(eldr__ring *r, eldr__ring_rec *out);
void eldr__ring_pop(eldr__ring *r, const eldr__ring_rec *rec);
int eldr__ring_empty(eldr__ring *r);

/* ---- sums of one source, per decoder index ------------------------------------------ */
typedef struct eldr__sums {
  int64_t *n, *ctx; /* requests and prompt tokens in flight */
  int64_t **w;      /* L*E fixed-point weights, or NULL (all zero) */
  size_t cap;
} eldr__sums;

typedef struct eldr__peer {
  char id[ELDR__BUS_ID_MAX + 1];
  uint64_t inc, last_seq;
  int synced;                 /* its deltas apply in order since its last snapshot */
  double last_heard, hello_t; /* monotonic seconds */
  eldr__sums s;               /* its contributions (in the total) */
  eldr__sums snap;            /* a snapshot being received */
  uint64_t snap_seq;
  uint32_t snap_nparts;
  int snap_active;
} eldr__peer;

struct eldr__bus {
  eldr__bus_opts o;
  char *url, *replica, *subj;
  uint64_t incarnation;
  size_t LE;
  /* under mu (any thread that holds it; the hub writes, loops read in pulls) */
  pthread_mutex_t mu;
  uint64_t ids[ELDR__BUS_MAX_DEC]; /* decoder index -> id (append-only) */
  _Atomic size_t ndec;
  eldr__sums *loops;               /* nloops: each loop's contributions */
  eldr__sums tot;                  /* every source's sum */
  /* lock-free for the loops */
  _Atomic uint64_t ver[ELDR__BUS_MAX_DEC];   /* bumped on every change of tot */
  _Atomic int64_t peer_n[ELDR__BUS_MAX_DEC]; /* peers' requests in flight */
  eldr__ring *rings;               /* nloops */
  _Atomic int sleeping, stop, conn, closed;
  _Atomic uint64_t conn_changes;
  _Atomic size_t npeers_pub;
  int efd;                         /* eventfd: wakes the hub */
  pthread_t th;
  int th_started;
  /* the hub thread only */
  eldr__peer peers[ELDR__BUS_MAX_PEERS];
  size_t npeers;
  uint64_t seq;
  eldr__bus_out out;
  eldr__sums scratch;
  uint32_t *snap_idx;
  int64_t *snap_v;
  int want_snapshot;
  /* received messages (libnats's delivery thread -> hub), under qmu */
  pthread_mutex_t qmu;
  natsMsg **q;
  size_t qhead, qn, qbytes;
  /* libnats objects (created and destroyed by the hub / free) */
  natsConnection *nc;
  natsSubscription *sub;
  natsOptions *opts;
  /* counters (any thread) */
  _Atomic uint64_t pub_msgs, pub_bytes, recv_msgs, recv_bytes, dropped_ring, dropped_queue, dropped_oom, gaps,
      snapshots_sent, snapshots_applied, expired, bad, mismatches, shape_mismatch, id_clash, nats_errors;
  _Atomic uint64_t lag_n[ELDR__BUS_LAG_B + 1], lag_count;
  _Atomic double lag_sum, lag_max;
};
extern const double eldr__bus_lag_bounds[ELDR__BUS_LAG_B];

/* The index of decoder id, created when new (mu held): -1 when full. */
int eldr__bus_dec_index(eldr__bus *b, uint64_t id);
/* Wake the hub if it sleeps (a loop pushed). */
void eldr__bus_wake(eldr__bus *b);

#endif
