/* bus.c — the fleet bus's hub (bus.h): one thread per router that drains
 * the loops' rings, keeps every source's per-decoder sums and their total,
 * and talks NATS through libnats (whose threads only queue what arrives).
 * The loops' side (rings, pulls, loads) is busview.c; the wire format
 * busmsg.c. Threads: see bus.h; everything static here runs on the hub
 * thread unless it says otherwise. */
#define _GNU_SOURCE
#include <errno.h>
#include <event2/buffer.h>
#include <jansson.h>
#include <math.h>
#include <nats/nats.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "bus_int.h"

/* ---- sums ------------------------------------------------------------------------ */

/* Room for decoder indices [0, need) (new ones zero): 0, or -1 out of memory. */
static int sums_grow(eldr__sums *s, size_t need) {
  if (need <= s->cap) return 0;
  size_t nc = s->cap ? s->cap : 16;
  while (nc < need) nc *= 2;
  int64_t *n = realloc(s->n, nc * sizeof *n);
  if (!n) return -1;
  s->n = n;
  int64_t *c = realloc(s->ctx, nc * sizeof *c);
  if (!c) return -1;
  s->ctx = c;
  int64_t **w = realloc(s->w, nc * sizeof *w);
  if (!w) return -1;
  s->w = w;
  for (size_t i = s->cap; i < nc; i++) s->n[i] = s->ctx[i] = 0, s->w[i] = NULL;
  s->cap = nc;
  return 0;
}

static void sums_free(eldr__sums *s) {
  for (size_t i = 0; i < s->cap; i++) free(s->w[i]);
  free(s->n);
  free(s->ctx);
  free(s->w);
  memset(s, 0, sizeof *s);
}

/* The weights of decoder d in s, allocated (zeroed) on first use; NULL on ENOMEM. */
static int64_t *sums_w(eldr__bus *b, eldr__sums *s, size_t d) {
  if (sums_grow(s, d + 1)) return NULL;
  if (!s->w[d] && b->LE) s->w[d] = calloc(b->LE, sizeof *s->w[d]);
  return s->w[d];
}

/* The index of decoder id (created; b->mu held): -1 when the table is full. */
int eldr__bus_dec_index(eldr__bus *b, uint64_t id) {
  size_t n = atomic_load_explicit(&b->ndec, memory_order_relaxed);
  for (size_t i = 0; i < n; i++)
    if (b->ids[i] == id) return (int)i;
  if (n >= ELDR__BUS_MAX_DEC) return -1;
  b->ids[n] = id;
  atomic_store_explicit(&b->ndec, n + 1, memory_order_release);
  return (int)n;
}

/* Add one record (sign times its values) to source s and the total (mu held). */
static void apply_rec(eldr__bus *b, eldr__sums *s, int d, int64_t n, int64_t ctx, const eldr__bus_rec *r, int sign,
                      int peer) {
  if (sums_grow(s, (size_t)d + 1) || sums_grow(&b->tot, (size_t)d + 1)) return;
  s->n[d] += sign * n;
  s->ctx[d] += sign * ctx;
  b->tot.n[d] += sign * n;
  b->tot.ctx[d] += sign * ctx;
  if (peer) atomic_fetch_add_explicit(&b->peer_n[d], sign * n, memory_order_relaxed);
  if (r && r->nnz && b->LE) {
    int64_t *sw = sums_w(b, s, (size_t)d), *tw = sums_w(b, &b->tot, (size_t)d);
    if (sw && tw) {
      size_t pos = 0;
      int64_t prev = -1;
      for (uint32_t i = 0; i < r->nnz; i++) {
        uint32_t idx;
        int64_t v;
        eldr__bus_pair_next(r, &pos, &prev, &idx, &v);
        sw[idx] += sign * v;
        tw[idx] += sign * v;
      }
    }
  }
  atomic_fetch_add_explicit(&b->ver[d], 1, memory_order_release);
}

/* A loop's ring record into its sums and the total (mu held). */
static void apply_ring(eldr__bus *b, eldr__sums *s, int d, const eldr__ring_rec *rr) {
  if (sums_grow(s, (size_t)d + 1) || sums_grow(&b->tot, (size_t)d + 1)) return;
  s->n[d] += rr->sign;
  s->ctx[d] += rr->sign * (int64_t)rr->ctx;
  b->tot.n[d] += rr->sign;
  b->tot.ctx[d] += rr->sign * (int64_t)rr->ctx;
  if (rr->nnz && b->LE) {
    int64_t *sw = sums_w(b, s, (size_t)d), *tw = sums_w(b, &b->tot, (size_t)d);
    if (sw && tw)
      for (uint32_t i = 0; i < rr->nnz; i++)
        if (rr->idx[i] < b->LE) {
          sw[rr->idx[i]] += rr->sign * (int64_t)rr->w[i];
          tw[rr->idx[i]] += rr->sign * (int64_t)rr->w[i];
        }
  }
  atomic_fetch_add_explicit(&b->ver[d], 1, memory_order_release);
}

/* Remove a whole source from the total (mu held): a peer expired or replaced. */
static void drop_source(eldr__bus *b, eldr__sums *s, int peer) {
  size_t n = atomic_load_explicit(&b->ndec, memory_order_relaxed);
  for (size_t d = 0; d < n && d < s->cap; d++) {
    if (!s->n[d] && !s->ctx[d] && !s->w[d]) continue;
    if (sums_grow(&b->tot, d + 1)) continue;
    b->tot.n[d] -= s->n[d];
    b->tot.ctx[d] -= s->ctx[d];
    if (peer) atomic_fetch_sub_explicit(&b->peer_n[d], s->n[d], memory_order_relaxed);
    if (s->w[d] && b->tot.w[d])
      for (size_t i = 0; i < b->LE; i++) b->tot.w[d][i] -= s->w[d][i];
    s->n[d] = s->ctx[d] = 0;
    free(s->w[d]);
    s->w[d] = NULL;
    atomic_fetch_add_explicit(&b->ver[d], 1, memory_order_release);
  }
}

/* Add a whole source to the total (mu held). */
static void add_source(eldr__bus *b, eldr__sums *s, int peer) {
  size_t n = atomic_load_explicit(&b->ndec, memory_order_relaxed);
  for (size_t d = 0; d < n && d < s->cap; d++) {
    if (!s->n[d] && !s->ctx[d] && !s->w[d]) continue;
    if (sums_grow(&b->tot, d + 1)) continue;
    b->tot.n[d] += s->n[d];
    b->tot.ctx[d] += s->ctx[d];
    if (peer) atomic_fetch_add_explicit(&b->peer_n[d], s->n[d], memory_order_relaxed);
    int64_t *tw = s->w[d] ? sums_w(b, &b->tot, d) : NULL;
    if (tw)
      for (size_t i = 0; i < b->LE; i++) tw[i] += s->w[d][i];
    atomic_fetch_add_explicit(&b->ver[d], 1, memory_order_release);
  }
}

/* ---- time, histogram --------------------------------------------------------------- */

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wall-clock nanoseconds: a message's send time, read by other hosts. */
static uint64_t bus_real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const double eldr__bus_lag_bounds[ELDR__BUS_LAG_B] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                       0.01,   0.025,   0.05,   0.1,   0.25,   1};

static void lag_note(eldr__bus *b, double s) {
  size_t i = 0;
  while (i < ELDR__BUS_LAG_B && s > eldr__bus_lag_bounds[i]) i++;
  atomic_fetch_add_explicit(&b->lag_n[i], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&b->lag_count, 1, memory_order_relaxed);
  double old = atomic_load_explicit(&b->lag_sum, memory_order_relaxed);
  while (!atomic_compare_exchange_weak(&b->lag_sum, &old, old + s)) {
  }
  double mx = atomic_load_explicit(&b->lag_max, memory_order_relaxed);
  while (s > mx && !atomic_compare_exchange_weak(&b->lag_max, &mx, s)) {
  }
}

/* ---- NATS (callbacks run on libnats's threads: queue and flag only) ----------------- */

static void wake(eldr__bus *b) {
  uint64_t one = 1;
  if (write(b->efd, &one, sizeof one) < 0) { /* EAGAIN: already signalled */
  }
}

static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) {
  (void)nc;
  (void)sub;
  eldr__bus *b = closure;
  if (atomic_load(&b->stop)) {
    natsMsg_Destroy(msg);
    return;
  }
  size_t len = (size_t)natsMsg_GetDataLength(msg);
  pthread_mutex_lock(&b->qmu);
  int full = b->qn == ELDR__BUS_QUEUE || b->qbytes + len > ELDR__BUS_QUEUE_BYTES;
  if (!full) {
    b->q[(b->qhead + b->qn) % ELDR__BUS_QUEUE] = msg;
    b->qn++;
    b->qbytes += len;
  }
  pthread_mutex_unlock(&b->qmu);
  if (full) {
    natsMsg_Destroy(msg);
    atomic_fetch_add(&b->dropped_queue, 1);
  }
  wake(b);
}

static void on_disconnected(natsConnection *nc, void *closure) {
  (void)nc;
  eldr__bus *b = closure;
  atomic_store(&b->conn, ELDR__BUS_DOWN);
  atomic_fetch_add(&b->conn_changes, 1);
  wake(b);
}

static void on_connected(natsConnection *nc, void *closure) {
  (void)nc;
  eldr__bus *b = closure;
  atomic_store(&b->conn, ELDR__BUS_UP);
  atomic_fetch_add(&b->conn_changes, 1);
  wake(b);
}

static void on_closed(natsConnection *nc, void *closure) {
  (void)nc;
  eldr__bus *b = closure;
  atomic_store(&b->conn, ELDR__BUS_DOWN);
  wake(b);
  atomic_store(&b->closed, 1); /* last: eldr__bus_free waits for it */
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure) {
  (void)nc;
  (void)sub;
  (void)err;
  eldr__bus *b = closure;
  atomic_fetch_add(&b->nats_errors, 1); /* a slow consumer: the gap asks for a snapshot */
}

static int nats_start(eldr__bus *b) {
  natsOptions *o = NULL;
  if (natsOptions_Create(&o) != NATS_OK) return -1;
  natsOptions_SetURL(o, b->url);
  natsOptions_SetName(o, b->replica);
  natsOptions_SetNoEcho(o, true); /* our own messages are not delivered back */
  natsOptions_SetAllowReconnect(o, true);
  natsOptions_SetMaxReconnect(o, -1);
  natsOptions_SetReconnectWait(o, 250);
  natsOptions_SetTimeout(o, 2000);
  natsOptions_SetPingInterval(o, 1000); /* a dead server is noticed within ~3 s */
  natsOptions_SetMaxPingsOut(o, 2);
  natsOptions_SetReconnectBufSize(o, 8 << 20);
  natsOptions_SetDisconnectedCB(o, on_disconnected, b);
  natsOptions_SetReconnectedCB(o, on_connected, b);
  natsOptions_SetClosedCB(o, on_closed, b);
  natsOptions_SetErrorHandler(o, on_error, b);
  natsOptions_SetRetryOnFailedConnect(o, true, on_connected, b); /* never blocks: connects in the background */
  natsStatus s = natsConnection_Connect(&b->nc, o);
  b->opts = o;
  if (s != NATS_OK && s != NATS_NOT_YET_CONNECTED) return -1;
  if (s == NATS_OK) {
    atomic_store(&b->conn, ELDR__BUS_UP);
    atomic_fetch_add(&b->conn_changes, 1);
  }
  if (natsConnection_Subscribe(&b->sub, b->nc, b->subj, on_msg, b) != NATS_OK) return -1;
  natsSubscription_SetPendingLimits(b->sub, 65536, 256 << 20);
  return 0;
}

/* ---- publishing -------------------------------------------------------------------- */

static void head_init(eldr__bus *b, eldr__bus_head *h, int kind) {
  memset(h, 0, sizeof *h);
  h->kind = kind;
  snprintf(h->replica, sizeof h->replica, "%s", b->replica);
  h->incarnation = b->incarnation;
  h->seq = ++b->seq;
  h->sent_ns = bus_real_ns();
  h->L = b->o.L;
  h->E = b->o.E;
  h->nparts = 1;
}

static void publish(eldr__bus *b, eldr__bus_out *o) {
  if (o->oom) {
    atomic_fetch_add(&b->dropped_oom, 1);
    return;
  }
  eldr__bus_out_end(o);
  if (!b->nc || atomic_load(&b->conn) != ELDR__BUS_UP) return; /* peers resync from our next snapshot */
  if (natsConnection_Publish(b->nc, b->subj, o->p, (int)o->n) == NATS_OK) {
    atomic_fetch_add(&b->pub_msgs, 1);
    atomic_fetch_add(&b->pub_bytes, o->n);
  } else {
    atomic_fetch_add(&b->nats_errors, 1);
  }
}

/* Drain every loop's ring into its sums and the total, and one DELTA
 * message (published). Returns the records drained. */
static size_t drain_rings(eldr__bus *b) {
  size_t got = 0;
  eldr__bus_head h;
  int started = 0;
  uint64_t oldest = 0;
  for (int j = 0; j < b->o.nloops; j++) {
    eldr__ring *rg = &b->rings[j];
    eldr__ring_rec rr;
    int locked = 0;
    while (eldr__ring_peek(rg, &rr)) {
      if (!locked) pthread_mutex_lock(&b->mu), locked = 1;
      int d = eldr__bus_dec_index(b, rr.dec);
      if (d >= 0) {
        if (!started) head_init(b, &h, ELDR__BUS_DELTA), eldr__bus_out_head(&b->out, &h), started = 1;
        eldr__bus_out_rec32(&b->out, rr.dec, rr.sign, rr.sign * (int64_t)rr.ctx, rr.idx, rr.w, rr.nnz, rr.sign);
        apply_ring(b, &b->loops[j], d, &rr);
        if (!oldest || rr.t_ns < oldest) oldest = rr.t_ns;
      }
      eldr__ring_pop(rg, &rr);
      got++;
    }
    if (locked) pthread_mutex_unlock(&b->mu);
  }
  if (started) {
    size_t at = 5 + strnlen(b->replica, ELDR__BUS_ID_MAX) + 16; /* sent_ns: the oldest event's push time */
    if (!b->out.oom && at + 8 <= b->out.n)
      for (int i = 0; i < 8; i++) b->out.p[at + i] = (uint8_t)(oldest >> (8 * i));
    publish(b, &b->out);
  }
  return got;
}

/* Our own sums (every loop's) as SNAP messages of at most ~512 KiB each. */
static void publish_snapshot(eldr__bus *b) {
  pthread_mutex_lock(&b->mu);
  size_t nd = atomic_load(&b->ndec);
  /* own = every loop's sums, into the scratch source */
  eldr__sums *own = &b->scratch;
  if (sums_grow(own, nd ? nd : 1)) {
    pthread_mutex_unlock(&b->mu);
    return;
  }
  for (size_t d = 0; d < nd; d++) {
    own->n[d] = own->ctx[d] = 0;
    if (own->w[d]) memset(own->w[d], 0, b->LE * sizeof *own->w[d]);
    for (int j = 0; j < b->o.nloops; j++) {
      eldr__sums *s = &b->loops[j];
      if (d >= s->cap) continue;
      own->n[d] += s->n[d];
      own->ctx[d] += s->ctx[d];
      if (s->w[d]) {
        int64_t *w = sums_w(b, own, d);
        if (w)
          for (size_t i = 0; i < b->LE; i++) w[i] += s->w[d][i];
      }
    }
  }
  pthread_mutex_unlock(&b->mu);
  /* parts: decoders packed until a part passes 512 KiB */
  size_t npart = 0, first = 0;
  uint32_t *idx = b->snap_idx;
  int64_t *v = b->snap_v;
  for (int pass = 0; pass < 2; pass++) { /* pass 0 counts the parts, pass 1 writes them */
    size_t part = 0, d = 0;
    while (d < nd || (d == 0 && nd == 0 && part == 0)) {
      eldr__bus_head h;
      if (pass) {
        head_init(b, &h, ELDR__BUS_SNAP);
        h.part = (uint32_t)part;
        h.nparts = (uint32_t)npart;
        eldr__bus_out_head(&b->out, &h);
      }
      size_t bytes = 0;
      do {
        if (d >= nd) break;
        uint32_t nnz = 0;
        if (own->w[d])
          for (size_t i = 0; i < b->LE; i++)
            if (own->w[d][i]) idx[nnz] = (uint32_t)i, v[nnz] = own->w[d][i], nnz++;
        if (own->n[d] || own->ctx[d] || nnz) {
          if (pass) eldr__bus_out_rec(&b->out, b->ids[d], own->n[d], own->ctx[d], idx, v, nnz);
          bytes += 24 + (size_t)nnz * 6;
        }
        d++;
      } while (bytes < (512u << 10));
      if (pass) publish(b, &b->out);
      part++;
      if (nd == 0) break;
    }
    npart = part;
    (void)first;
  }
  atomic_fetch_add(&b->snapshots_sent, 1);
}

static void publish_simple(eldr__bus *b, int kind) {
  eldr__bus_head h;
  head_init(b, &h, kind);
  eldr__bus_out_head(&b->out, &h);
  publish(b, &b->out);
}

/* ---- peers ------------------------------------------------------------------------- */

static eldr__peer *peer_find(eldr__bus *b, const char *id, int create) {
  for (size_t i = 0; i < b->npeers; i++)
    if (!strcmp(b->peers[i].id, id)) return &b->peers[i];
  if (!create || b->npeers == ELDR__BUS_MAX_PEERS) return NULL;
  eldr__peer *p = &b->peers[b->npeers++];
  memset(p, 0, sizeof *p);
  snprintf(p->id, sizeof p->id, "%s", id);
  return p;
}

static void peer_expire(eldr__bus *b, eldr__peer *p) {
  pthread_mutex_lock(&b->mu);
  drop_source(b, &p->s, 1);
  pthread_mutex_unlock(&b->mu);
  sums_free(&p->s);
  sums_free(&p->snap);
  *p = b->peers[--b->npeers];
}

static void ask_snapshot(eldr__bus *b, eldr__peer *p, double now) {
  if (now - p->hello_t < 0.1) return; /* one hello per 100 ms per peer */
  p->hello_t = now;
  publish_simple(b, ELDR__BUS_HELLO);
}

/* One message from a peer (hub thread). */
static void on_peer_msg(eldr__bus *b, const uint8_t *m, size_t len, double now) {
  eldr__bus_head h;
  size_t off;
  eldr_diag d = {{0}};
  if (eldr__bus_head_read(m, len, &h, &off, &d)) {
    atomic_fetch_add(&b->bad, 1);
    return;
  }
  if (!strcmp(h.replica, b->replica) && h.incarnation == b->incarnation) return; /* our own */
  if (!strcmp(h.replica, b->replica)) atomic_fetch_add(&b->id_clash, 1);
  if (h.kind != ELDR__BUS_HELLO && h.kind != ELDR__BUS_BYE && (h.L != b->o.L || h.E != b->o.E)) {
    atomic_fetch_add(&b->shape_mismatch, 1); /* another model's fleet on the subject */
    return;
  }
  eldr__peer *p = peer_find(b, h.replica, h.kind != ELDR__BUS_BYE);
  if (!p) return;
  if (h.kind == ELDR__BUS_BYE) {
    peer_expire(b, p);
    atomic_fetch_add(&b->expired, 1);
    return;
  }
  if (p->inc != h.incarnation) { /* a new peer, or one restarted: its old sums are gone */
    pthread_mutex_lock(&b->mu);
    drop_source(b, &p->s, 1);
    pthread_mutex_unlock(&b->mu);
    p->inc = h.incarnation;
    p->synced = 0;
    p->snap_active = 0;
  }
  p->last_heard = now;
  if (h.kind == ELDR__BUS_HELLO) {
    b->want_snapshot = 1;
    return;
  }
  int in_order = p->synced && h.seq == p->last_seq + 1;
  if (h.kind == ELDR__BUS_DELTA) {
    if (!in_order) {
      if (p->synced) atomic_fetch_add(&b->gaps, 1);
      p->synced = 0;
      ask_snapshot(b, p, now);
      return;
    }
    p->last_seq = h.seq;
    lag_note(b, ((double)bus_real_ns() - (double)h.sent_ns) * 1e-9);
    pthread_mutex_lock(&b->mu);
    for (uint32_t i = 0; i < h.nrec; i++) {
      eldr__bus_rec r;
      if (eldr__bus_rec_read(m, len, &off, &h, &r, &d)) {
        atomic_fetch_add(&b->bad, 1);
        break;
      }
      int di = eldr__bus_dec_index(b, r.dec);
      if (di >= 0) apply_rec(b, &p->s, di, r.n, r.ctx, &r, 1, 1);
    }
    pthread_mutex_unlock(&b->mu);
    return;
  }
  /* SNAP part: collected into p->snap; the last part replaces p->s */
  if (h.part == 0) {
    p->snap_active = 1;
    p->snap_nparts = h.nparts;
    for (size_t i = 0; i < p->snap.cap; i++) {
      p->snap.n[i] = p->snap.ctx[i] = 0;
      free(p->snap.w[i]);
      p->snap.w[i] = NULL;
    }
  } else if (!p->snap_active || h.seq != p->snap_seq + 1 || h.nparts != p->snap_nparts) {
    p->snap_active = 0;
    return;
  }
  p->snap_seq = h.seq;
  pthread_mutex_lock(&b->mu);
  for (uint32_t i = 0; i < h.nrec; i++) {
    eldr__bus_rec r;
    if (eldr__bus_rec_read(m, len, &off, &h, &r, &d)) {
      atomic_fetch_add(&b->bad, 1);
      p->snap_active = 0;
      break;
    }
    int di = eldr__bus_dec_index(b, r.dec);
    if (di < 0 || sums_grow(&p->snap, (size_t)di + 1)) continue;
    p->snap.n[di] = r.n;
    p->snap.ctx[di] = r.ctx;
    int64_t *w = r.nnz ? sums_w(b, &p->snap, (size_t)di) : NULL;
    size_t pos = 0;
    int64_t prev = -1;
    for (uint32_t k = 0; w && k < r.nnz; k++) {
      uint32_t ix;
      int64_t v;
      eldr__bus_pair_next(&r, &pos, &prev, &ix, &v);
      w[ix] = v;
    }
  }
  pthread_mutex_unlock(&b->mu);
  if (!p->snap_active || h.part + 1 != h.nparts) return;
  p->snap_active = 0;
  /* complete: in sync, it should equal what the deltas built; else replace */
  if (p->synced && h.seq - h.nparts == p->last_seq) {
    int same = 1;
    size_t nd = atomic_load(&b->ndec);
    for (size_t di = 0; di < nd && same; di++) {
      int64_t n1 = di < p->s.cap ? p->s.n[di] : 0, n2 = di < p->snap.cap ? p->snap.n[di] : 0;
      int64_t c1 = di < p->s.cap ? p->s.ctx[di] : 0, c2 = di < p->snap.cap ? p->snap.ctx[di] : 0;
      same = n1 == n2 && c1 == c2;
      const int64_t *w1 = di < p->s.cap ? p->s.w[di] : NULL, *w2 = di < p->snap.cap ? p->snap.w[di] : NULL;
      for (size_t i = 0; same && (w1 || w2) && i < b->LE; i++) same = (w1 ? w1[i] : 0) == (w2 ? w2[i] : 0);
    }
    p->last_seq = h.seq;
    if (same) return;
    atomic_fetch_add(&b->mismatches, 1);
  }
  pthread_mutex_lock(&b->mu);
  drop_source(b, &p->s, 1);
  eldr__sums tmp = p->s;
  p->s = p->snap;
  p->snap = tmp;
  add_source(b, &p->s, 1);
  pthread_mutex_unlock(&b->mu);
  p->synced = 1;
  p->last_seq = h.seq;
  atomic_fetch_add(&b->snapshots_applied, 1);
}

static size_t take_inbound(eldr__bus *b, double now) {
  size_t got = 0;
  for (;;) {
    pthread_mutex_lock(&b->qmu);
    natsMsg *m = NULL;
    if (b->qn) {
      m = b->q[b->qhead];
      b->qhead = (b->qhead + 1) % ELDR__BUS_QUEUE;
      b->qn--;
      b->qbytes -= (size_t)natsMsg_GetDataLength(m);
    }
    pthread_mutex_unlock(&b->qmu);
    if (!m) return got;
    size_t len = (size_t)natsMsg_GetDataLength(m);
    atomic_fetch_add(&b->recv_msgs, 1);
    atomic_fetch_add(&b->recv_bytes, len);
    on_peer_msg(b, (const uint8_t *)natsMsg_GetData(m), len, now);
    natsMsg_Destroy(m);
    got++;
  }
}

static void expire_all(eldr__bus *b) {
  while (b->npeers) {
    peer_expire(b, &b->peers[0]);
    atomic_fetch_add(&b->expired, 1);
  }
}

/* ---- the hub thread ---------------------------------------------------------------- */

static void *hub_main(void *arg) {
  eldr__bus *b = arg;
  if (b->url && nats_start(b)) atomic_store(&b->conn, ELDR__BUS_DOWN);
  double now = mono_s(), next_snap = now;
  uint64_t seen_changes = 0;
  while (!atomic_load(&b->stop)) {
    size_t did = drain_rings(b);
    now = mono_s();
    did += take_inbound(b, now);
    uint64_t ch = atomic_load(&b->conn_changes);
    if (ch != seen_changes) {
      seen_changes = ch;
      if (atomic_load(&b->conn) == ELDR__BUS_UP) { /* (re)connected: ask everyone for their state */
        publish_simple(b, ELDR__BUS_HELLO);
        b->want_snapshot = 1;
      } else {
        expire_all(b); /* nothing bounds their staleness now: our own view only */
      }
    }
    if (atomic_load(&b->conn) != ELDR__BUS_UP && b->npeers) expire_all(b);
    if (b->want_snapshot || now >= next_snap) {
      b->want_snapshot = 0;
      publish_snapshot(b);
      next_snap = now + b->o.snapshot_s;
      for (size_t i = 0; i < b->npeers;)
        if (now - b->peers[i].last_heard > b->o.peer_timeout_s) {
          peer_expire(b, &b->peers[i]);
          atomic_fetch_add(&b->expired, 1);
        } else {
          i++;
        }
      atomic_store(&b->npeers_pub, b->npeers);
    }
    atomic_store(&b->npeers_pub, b->npeers);
    if (did) continue;
    atomic_store(&b->sleeping, 1);
    int idle = 1;
    for (int j = 0; j < b->o.nloops && idle; j++) idle = eldr__ring_empty(&b->rings[j]);
    if (idle) {
      double wait = next_snap - mono_s();
      int ms = wait <= 0 ? 0 : wait > 0.1 ? 100 : (int)(wait * 1000) + 1;
      struct pollfd pf = {b->efd, POLLIN, 0};
      poll(&pf, 1, ms);
    }
    atomic_store(&b->sleeping, 0);
    uint64_t x;
    if (read(b->efd, &x, sizeof x) < 0) { /* EAGAIN: nothing signalled */
    }
  }
  if (b->nc && atomic_load(&b->conn) == ELDR__BUS_UP) {
    drain_rings(b);
    publish_simple(b, ELDR__BUS_BYE);
    natsConnection_FlushTimeout(b->nc, 500);
  }
  return NULL;
}

void eldr__bus_wake(eldr__bus *b) {
  if (atomic_load_explicit(&b->sleeping, memory_order_acquire)) wake(b);
}

/* ---- lifecycle --------------------------------------------------------------------- */

int eldr__bus_new(const eldr__bus_opts *o, eldr__bus **out, eldr_diag *d) {
  *out = NULL;
  if (o->url && strncmp(o->url, "nats://", 7))
    return eldr_diag_fail(d, ELDR_EINVAL, "bus: '%s' is not a nats://HOST:PORT URL", o->url);
  eldr__bus *b = calloc(1, sizeof *b);
  if (!b) return eldr_diag_fail(d, ELDR_ENOMEM, "bus: out of memory");
  b->o = *o;
  b->LE = (size_t)o->L * o->E;
  b->url = o->url ? strdup(o->url) : NULL;
  b->replica = strdup(o->replica ? o->replica : "eldr");
  size_t sl = strlen(o->subject ? o->subject : "eldr.fleet") + 8;
  b->subj = malloc(sl);
  if (b->subj) snprintf(b->subj, sl, "%s.state", o->subject ? o->subject : "eldr.fleet");
  b->rings = calloc((size_t)o->nloops, sizeof *b->rings);
  b->loops = calloc((size_t)o->nloops, sizeof *b->loops);
  b->q = calloc(ELDR__BUS_QUEUE, sizeof *b->q);
  b->snap_idx = malloc((b->LE ? b->LE : 1) * sizeof *b->snap_idx);
  b->snap_v = malloc((b->LE ? b->LE : 1) * sizeof *b->snap_v);
  b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (getrandom(&b->incarnation, sizeof b->incarnation, 0) != sizeof b->incarnation)
    b->incarnation = (uint64_t)bus_real_ns() ^ (uint64_t)getpid();
  int bad = !b->replica || !b->subj || !b->rings || !b->loops || !b->q || !b->snap_idx || !b->snap_v ||
            b->efd < 0 || (o->url && !b->url);
  for (int j = 0; !bad && j < o->nloops; j++) bad = eldr__ring_init(&b->rings[j], ELDR__BUS_RING_BYTES);
  if (!bad) bad = pthread_mutex_init(&b->mu, NULL) || pthread_mutex_init(&b->qmu, NULL);
  if (bad) {
    b->o.nloops = bad ? b->o.nloops : 0;
    free(b->url);
    free(b->replica);
    free(b->subj);
    for (int j = 0; b->rings && j < o->nloops; j++) eldr__ring_free(&b->rings[j]);
    free(b->rings);
    free(b->loops);
    free(b->q);
    free(b->snap_idx);
    free(b->snap_v);
    if (b->efd >= 0) close(b->efd);
    free(b);
    return eldr_diag_fail(d, ELDR_ENOMEM, "bus: out of memory");
  }
  atomic_store(&b->conn, o->url ? ELDR__BUS_CONNECTING : ELDR__BUS_LOCAL);
  if (pthread_create(&b->th, NULL, hub_main, b)) {
    b->th_started = 0;
    eldr__bus_free(b);
    return eldr_diag_fail(d, ELDR_ENOMEM, "bus: cannot start its thread");
  }
  b->th_started = 1;
  *out = b;
  return 0;
}

void eldr__bus_free(eldr__bus *b) {
  if (!b) return;
  atomic_store(&b->stop, 1);
  wake(b);
  if (b->th_started) pthread_join(b->th, NULL);
  if (b->sub) {
    natsSubscription_Unsubscribe(b->sub);
    natsSubscription_Destroy(b->sub);
  }
  if (b->nc) { /* closed, and its closed callback over, before anything it uses goes */
    natsConnection_Close(b->nc);
    for (int i = 0; i < 400 && !atomic_load(&b->closed); i++) {
      struct timespec ts = {0, 5000000};
      nanosleep(&ts, NULL);
    }
    natsConnection_Destroy(b->nc);
  }
  natsOptions_Destroy(b->opts);
  while (b->qn) {
    natsMsg_Destroy(b->q[b->qhead]);
    b->qhead = (b->qhead + 1) % ELDR__BUS_QUEUE;
    b->qn--;
  }
  while (b->npeers) {
    eldr__peer *p = &b->peers[--b->npeers];
    sums_free(&p->s);
    sums_free(&p->snap);
  }
  for (int j = 0; j < b->o.nloops; j++) {
    eldr__ring_free(&b->rings[j]);
    sums_free(&b->loops[j]);
  }
  sums_free(&b->tot);
  sums_free(&b->scratch);
  eldr__bus_out_free(&b->out);
  pthread_mutex_destroy(&b->mu);
  pthread_mutex_destroy(&b->qmu);
  close(b->efd);
  free(b->rings);
  free(b->loops);
  free(b->q);
  free(b->snap_idx);
  free(b->snap_v);
  free(b->url);
  free(b->replica);
  free(b->subj);
  free(b);
}

/* ---- reporting (any thread) -------------------------------------------------------- */

int eldr__bus_up(const eldr__bus *b) { return b && atomic_load(&b->conn) == ELDR__BUS_UP; }

const char *eldr__bus_state(const eldr__bus *b) {
  if (!b) return "off";
  switch (atomic_load(&b->conn)) {
  case ELDR__BUS_LOCAL: return "local";
  case ELDR__BUS_CONNECTING: return "connecting";
  case ELDR__BUS_UP: return "up";
  default: return "down";
  }
}

/* The lag quantile q from the histogram: the bucket's upper bound. */
static double lag_q(eldr__bus *b, double q) {
  uint64_t n = atomic_load(&b->lag_count), acc = 0;
  if (!n) return NAN;
  for (size_t i = 0; i <= ELDR__BUS_LAG_B; i++) {
    acc += atomic_load(&b->lag_n[i]);
    if ((double)acc >= q * (double)n) return i < ELDR__BUS_LAG_B ? eldr__bus_lag_bounds[i] : atomic_load(&b->lag_max);
  }
  return atomic_load(&b->lag_max);
}

void *eldr__bus_status_json(eldr__bus *b) {
  if (!b) return json_pack("{ss}", "state", "off");
  const char *st = eldr__bus_state(b);
  int down = !strcmp(st, "down") || !strcmp(st, "connecting");
  json_t *j = json_pack("{sssssssIsbsIsIsIsIsIsI}", "state", st, "replica", b->replica, "subject", b->subj,
                        "peers", (json_int_t)atomic_load(&b->npeers_pub), "fallback", down,
                        "published", (json_int_t)atomic_load(&b->pub_msgs), "received",
                        (json_int_t)atomic_load(&b->recv_msgs), "gaps", (json_int_t)atomic_load(&b->gaps),
                        "snapshots_applied", (json_int_t)atomic_load(&b->snapshots_applied), "expired",
                        (json_int_t)atomic_load(&b->expired), "dropped",
                        (json_int_t)(atomic_load(&b->dropped_ring) + atomic_load(&b->dropped_queue)));
  double p50 = lag_q(b, 0.5), p99 = lag_q(b, 0.99), mx = atomic_load(&b->lag_max);
  json_object_set_new(j, "lag_seconds", json_pack("{sosososI}", "p50_le", isnan(p50) ? json_null() : json_real(p50),
                                                  "p99_le", isnan(p99) ? json_null() : json_real(p99), "max",
                                                  atomic_load(&b->lag_count) ? json_real(mx) : json_null(), "messages",
                                                  (json_int_t)atomic_load(&b->lag_count)));
  if (down) json_object_set_new(j, "note", json_string("bus unreachable: this replica routes on its own view "
                                                       "(its event loops) plus scraping"));
  return j;
}

void eldr__bus_metrics(eldr__bus *b, struct evbuffer *o) {
  static const char *states[] = {"off", "local", "connecting", "up", "down"};
  const char *st = eldr__bus_state(b);
  evbuffer_add_printf(o, "# HELP eldr_bus_state The fleet bus's state (1 for the current one).\n# TYPE eldr_bus_state gauge\n");
  for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
    evbuffer_add_printf(o, "eldr_bus_state{state=\"%s\"} %d\n", states[i], !strcmp(st, states[i]));
  int fb = !strcmp(st, "down") || !strcmp(st, "connecting");
  evbuffer_add_printf(o, "# HELP eldr_bus_fallback 1 while the bus is configured but unreachable: decisions use this "
                         "replica's own view plus scraping.\n# TYPE eldr_bus_fallback gauge\neldr_bus_fallback %d\n", fb);
  if (!b) return;
  evbuffer_add_printf(o, "# HELP eldr_bus_peers Router replicas heard on the bus.\n# TYPE eldr_bus_peers gauge\n"
                         "eldr_bus_peers %zu\n", (size_t)atomic_load(&b->npeers_pub));
  evbuffer_add_printf(o, "# HELP eldr_bus_messages_total Bus messages published and received.\n"
                         "# TYPE eldr_bus_messages_total counter\neldr_bus_messages_total{dir=\"out\"} %llu\n"
                         "eldr_bus_messages_total{dir=\"in\"} %llu\n",
                      (unsigned long long)atomic_load(&b->pub_msgs), (unsigned long long)atomic_load(&b->recv_msgs));
  evbuffer_add_printf(o, "# HELP eldr_bus_bytes_total Bus message bytes published and received.\n"
                         "# TYPE eldr_bus_bytes_total counter\neldr_bus_bytes_total{dir=\"out\"} %llu\n"
                         "eldr_bus_bytes_total{dir=\"in\"} %llu\n",
                      (unsigned long long)atomic_load(&b->pub_bytes), (unsigned long long)atomic_load(&b->recv_bytes));
  evbuffer_add_printf(o, "# HELP eldr_bus_dropped_total Events or messages not shared: a full loop ring, a full receive "
                         "queue, no memory.\n# TYPE eldr_bus_dropped_total counter\n"
                         "eldr_bus_dropped_total{reason=\"ring\"} %llu\neldr_bus_dropped_total{reason=\"queue\"} %llu\n"
                         "eldr_bus_dropped_total{reason=\"memory\"} %llu\n",
                      (unsigned long long)atomic_load(&b->dropped_ring), (unsigned long long)atomic_load(&b->dropped_queue),
                      (unsigned long long)atomic_load(&b->dropped_oom));
  evbuffer_add_printf(o, "# HELP eldr_bus_gaps_total Peer sequence gaps (the peer is resynced from its next snapshot).\n"
                         "# TYPE eldr_bus_gaps_total counter\neldr_bus_gaps_total %llu\n",
                      (unsigned long long)atomic_load(&b->gaps));
  evbuffer_add_printf(o, "# HELP eldr_bus_snapshots_total Full-state snapshots sent and applied (a peer resynced).\n"
                         "# TYPE eldr_bus_snapshots_total counter\neldr_bus_snapshots_total{dir=\"sent\"} %llu\n"
                         "eldr_bus_snapshots_total{dir=\"applied\"} %llu\n",
                      (unsigned long long)atomic_load(&b->snapshots_sent),
                      (unsigned long long)atomic_load(&b->snapshots_applied));
  evbuffer_add_printf(o, "# HELP eldr_bus_peers_expired_total Peers whose contributions were dropped (silent, gone, or "
                         "the bus down).\n# TYPE eldr_bus_peers_expired_total counter\neldr_bus_peers_expired_total %llu\n",
                      (unsigned long long)atomic_load(&b->expired));
  evbuffer_add_printf(o, "# HELP eldr_bus_bad_messages_total Bus messages refused: malformed, another shape, or a "
                         "snapshot that disagreed with the deltas.\n# TYPE eldr_bus_bad_messages_total counter\n"
                         "eldr_bus_bad_messages_total{reason=\"malformed\"} %llu\n"
                         "eldr_bus_bad_messages_total{reason=\"shape\"} %llu\n"
                         "eldr_bus_bad_messages_total{reason=\"mismatch\"} %llu\n",
                      (unsigned long long)atomic_load(&b->bad), (unsigned long long)atomic_load(&b->shape_mismatch),
                      (unsigned long long)atomic_load(&b->mismatches));
  evbuffer_add_printf(o, "# HELP eldr_bus_lag_seconds From a peer's route or end to its application here (wall clocks).\n"
                         "# TYPE eldr_bus_lag_seconds histogram\n");
  uint64_t acc = 0;
  for (size_t i = 0; i < ELDR__BUS_LAG_B; i++) {
    acc += atomic_load(&b->lag_n[i]);
    evbuffer_add_printf(o, "eldr_bus_lag_seconds_bucket{le=\"%g\"} %llu\n", eldr__bus_lag_bounds[i], (unsigned long long)acc);
  }
  acc += atomic_load(&b->lag_n[ELDR__BUS_LAG_B]);
  evbuffer_add_printf(o, "eldr_bus_lag_seconds_bucket{le=\"+Inf\"} %llu\neldr_bus_lag_seconds_sum %.9g\n"
                         "eldr_bus_lag_seconds_count %llu\n",
                      (unsigned long long)acc, atomic_load(&b->lag_sum), (unsigned long long)acc);
}
