/* busview.c — the event loops' side of the fleet bus (bus.h): each loop's
 * ring of routes and ends (single producer, the loop; single consumer, the
 * hub), its pull of everyone else's footprint weights into its own
 * footprint (a trylock: a busy hub is simply tried at the next decision),
 * and the peers' request counts that decisions add to a decoder's load.
 * Loop thread only, except the ring's consumer half (the hub). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "bus_int.h"
#include "serve_types.h"

/* ---- the ring ---------------------------------------------------------------------- */

#define REC_HEAD 32
#define WRAP 0xffffffffu

int eldr__ring_init(eldr__ring *r, size_t cap) {
  r->buf = malloc(cap);
  r->cap = cap;
  atomic_init(&r->head, 0);
  atomic_init(&r->tail, 0);
  return r->buf ? 0 : -1;
}

void eldr__ring_free(eldr__ring *r) {
  free(r->buf);
  r->buf = NULL;
}

int eldr__ring_push(eldr__ring *r, uint64_t dec, uint64_t t_ns, int32_t sign, uint32_t ctx, const uint32_t *idx,
                    const uint32_t *w, uint32_t nnz) {
  size_t len = (REC_HEAD + (size_t)nnz * 8 + 7) & ~(size_t)7;
  if (len > r->cap / 2) return -1;
  size_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
  size_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
  size_t pos = h % r->cap, contig = r->cap - pos, skip = len > contig ? contig : 0;
  if (skip + len > r->cap - (h - t)) return -1;
  if (skip) {
    uint32_t m = WRAP;
    memcpy(r->buf + pos, &m, 4);
    pos = 0;
  }
  uint8_t *p = r->buf + pos;
  uint32_t l32 = (uint32_t)len;
  memcpy(p, &l32, 4);
  memcpy(p + 4, &sign, 4);
  memcpy(p + 8, &dec, 8);
  memcpy(p + 16, &t_ns, 8);
  memcpy(p + 24, &ctx, 4);
  memcpy(p + 28, &nnz, 4);
  if (nnz) {
    memcpy(p + REC_HEAD, idx, (size_t)nnz * 4);
    memcpy(p + REC_HEAD + (size_t)nnz * 4, w, (size_t)nnz * 4);
  }
  atomic_store_explicit(&r->head, h + skip + len, memory_order_release);
  return 0;
}

int eldr__ring_peek(eldr__ring *r, eldr__ring_rec *o) {
  for (;;) {
    size_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    size_t h = atomic_load_explicit(&r->head, memory_order_acquire);
    if (t == h) return 0;
    size_t pos = t % r->cap;
    uint8_t *p = r->buf + pos;
    uint32_t l32;
    memcpy(&l32, p, 4);
    if (l32 == WRAP) {
      atomic_store_explicit(&r->tail, t + (r->cap - pos), memory_order_release);
      continue;
    }
    o->len = l32;
    memcpy(&o->sign, p + 4, 4);
    memcpy(&o->dec, p + 8, 8);
    memcpy(&o->t_ns, p + 16, 8);
    memcpy(&o->ctx, p + 24, 4);
    memcpy(&o->nnz, p + 28, 4);
    o->idx = (const uint32_t *)(p + REC_HEAD);
    o->w = (const uint32_t *)(p + REC_HEAD + (size_t)o->nnz * 4);
    return 1;
  }
}

void eldr__ring_pop(eldr__ring *r, const eldr__ring_rec *rec) {
  size_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
  atomic_store_explicit(&r->tail, t + rec->len, memory_order_release);
}

int eldr__ring_empty(eldr__ring *r) {
  return atomic_load_explicit(&r->tail, memory_order_acquire) == atomic_load_explicit(&r->head, memory_order_acquire);
}

/* ---- a loop's view ------------------------------------------------------------------ */

/* An end that did not fit the ring: kept until it does (an end is never
 * dropped, or its route's weights would stay in the peers' sums). */
typedef struct backlog {
  struct backlog *next;
  uint64_t dec, t_ns;
  uint32_t ctx, nnz;
  uint32_t *idx, *w;
} backlog;

struct eldr__busview {
  eldr__bus *b;
  int loop;
  const eldr__fpstate *fps; /* the footprint generation the weights below went into */
  size_t n;                 /* its decoders */
  int *di;                  /* per decoder: the bus's index, -1 none, -2 not looked up */
  uint64_t *seen;           /* per decoder: the bus version applied */
  int64_t *applied, *actx;  /* per decoder: the others' weights (L*E) and prompt tokens applied */
  uint32_t *idx;            /* L*E scratch */
  int64_t *dw;
  backlog *bl, **bl_tail;
};

int eldr__busview_new(eldr__bus *b, int loop, eldr__busview **out) {
  *out = NULL;
  eldr__busview *v = calloc(1, sizeof *v);
  if (!v) return ELDR_ENOMEM;
  v->b = b;
  v->loop = loop;
  v->idx = malloc((b->LE ? b->LE : 1) * sizeof *v->idx);
  v->dw = malloc((b->LE ? b->LE : 1) * sizeof *v->dw);
  v->bl_tail = &v->bl;
  if (!v->idx || !v->dw) {
    eldr__busview_free(v);
    return ELDR_ENOMEM;
  }
  *out = v;
  return 0;
}

void eldr__busview_free(eldr__busview *v) {
  if (!v) return;
  while (v->bl) {
    backlog *x = v->bl;
    v->bl = x->next;
    free(x->idx);
    free(x->w);
    free(x);
  }
  free(v->di);
  free(v->seen);
  free(v->applied);
  free(v->actx);
  free(v->idx);
  free(v->dw);
  free(v);
}

static uint64_t real_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t dec_id(const worker *w) { return XXH64(w->url, strlen(w->url), 0); }

/* Push the backlog's oldest ends while they fit. */
static void flush_backlog(eldr__busview *v) {
  eldr__ring *rg = &v->b->rings[v->loop];
  while (v->bl && !eldr__ring_push(rg, v->bl->dec, v->bl->t_ns, -1, v->bl->ctx, v->bl->idx, v->bl->w, v->bl->nnz)) {
    backlog *x = v->bl;
    v->bl = x->next;
    if (!v->bl) v->bl_tail = &v->bl;
    free(x->idx);
    free(x->w);
    free(x);
  }
}

/* The footprint generation f has the bus's shape (a reload may change the
 * artifact; the bus keeps the shape it started with). */
static int fits(const eldr__bus *b, const eldr__fpstate *f) {
  const eldr_artifact *a = f && f->art ? f->art->a : NULL;
  return a && b->LE && a->shape.num_layers == b->o.L && a->shape.num_experts == b->o.E;
}

/* r's footprint weights, when its ticket holds them. */
static int ticket_of(const rq *r, uint32_t *nnz, const uint32_t **idx, const uint32_t **w, uint32_t *ctx) {
  size_t k;
  return fits(r->s->bv->b, r->fps) && eldr_footprint_ticket(r->fps->fp, r->fp_ticket, &k, nnz, idx, w, ctx) == 0;
}

void eldr__bus_route(rq *r, worker *w) {
  eldr__busview *v = r->s->bv;
  if (!v) return;
  if (r->bus_on) eldr__bus_end(r);
  flush_backlog(v);
  uint32_t nnz = 0, ctx = 0;
  const uint32_t *idx = NULL, *wt = NULL;
  int have = ticket_of(r, &nnz, &idx, &wt, &ctx);
  if (!have) nnz = ctx = 0;
  uint64_t id = dec_id(w);
  if (v->bl || eldr__ring_push(&v->b->rings[v->loop], id, real_ns(), 1, ctx, idx, wt, nnz)) {
    atomic_fetch_add_explicit(&v->b->dropped_ring, 1, memory_order_relaxed); /* not shared; nor its end */
    return;
  }
  r->bus_on = 1;
  r->bus_w = have;
  r->bus_dec = id;
  eldr__bus_wake(v->b);
}

void eldr__bus_end(rq *r) {
  eldr__busview *v = r->s->bv;
  if (!v || !r->bus_on) return;
  r->bus_on = 0;
  uint32_t nnz = 0, ctx = 0;
  const uint32_t *idx = NULL, *wt = NULL;
  if (!(r->bus_w && ticket_of(r, &nnz, &idx, &wt, &ctx))) nnz = ctx = 0;
  uint64_t t = real_ns();
  flush_backlog(v);
  if (!v->bl && !eldr__ring_push(&v->b->rings[v->loop], r->bus_dec, t, -1, ctx, idx, wt, nnz)) {
    eldr__bus_wake(v->b);
    return;
  }
  backlog *x = calloc(1, sizeof *x); /* bounded by the routes in flight */
  if (x) {
    x->dec = r->bus_dec;
    x->t_ns = t;
    x->ctx = ctx;
    x->nnz = nnz;
    x->idx = malloc((nnz ? nnz : 1) * sizeof *x->idx);
    x->w = malloc((nnz ? nnz : 1) * sizeof *x->w);
  }
  if (!x || !x->idx || !x->w) {
    if (x) free(x->idx), free(x->w), free(x);
    atomic_fetch_add_explicit(&v->b->dropped_oom, 1, memory_order_relaxed);
    return;
  }
  if (nnz) {
    memcpy(x->idx, idx, nnz * sizeof *idx);
    memcpy(x->w, wt, nnz * sizeof *wt);
  }
  *v->bl_tail = x;
  v->bl_tail = &x->next;
}

/* The view follows s's decoders and footprint generation: a new one
 * starts from nothing applied. */
static int view_reset(eldr__busview *v, const eldr__fpstate *f, size_t n) {
  size_t LE = v->b->LE;
  free(v->di);
  free(v->seen);
  free(v->applied);
  free(v->actx);
  v->di = malloc((n ? n : 1) * sizeof *v->di);
  v->seen = calloc(n ? n : 1, sizeof *v->seen);
  v->applied = f && LE ? calloc(n * LE, sizeof *v->applied) : NULL;
  v->actx = calloc(n ? n : 1, sizeof *v->actx);
  v->fps = f;
  v->n = n;
  if (!v->di || !v->seen || !v->actx || (f && LE && n && !v->applied)) {
    v->n = 0;
    v->fps = NULL;
    return -1;
  }
  for (size_t k = 0; k < n; k++) v->di[k] = -2;
  return 0;
}

void eldr__busview_stale(eldr__busview *v) {
  if (v) v->n = SIZE_MAX;
}

void eldr__bus_pull(eldr_server *s) {
  eldr__busview *v = s->bv;
  if (!v) return;
  eldr__bus *b = v->b;
  flush_backlog(v);
  size_t n = s->nw[ROLE_DECODE];
  const eldr__fpstate *f = s->fps && s->fps->n == n && fits(b, s->fps) ? s->fps : NULL;
  if ((v->fps != f || v->n != n) && view_reset(v, f, n)) return;
  int todo = 0;
  for (size_t k = 0; k < n && !todo; k++)
    todo = v->di[k] == -2 || (f && v->di[k] >= 0 && atomic_load_explicit(&b->ver[v->di[k]], memory_order_acquire) != v->seen[k]);
  if (!todo || pthread_mutex_trylock(&b->mu)) return; /* busy: the next decision pulls */
  const size_t LE = b->LE;
  const eldr__sums *own = &b->loops[v->loop], *tot = &b->tot;
  for (size_t k = 0; k < n; k++) {
    worker *w = s->w[ROLE_DECODE][k];
    if (v->di[k] == -2) {
      v->di[k] = w->bus_di1 ? w->bus_di1 - 1 : eldr__bus_dec_index(b, dec_id(w));
      if (v->di[k] >= 0) w->bus_di1 = v->di[k] + 1;
    }
    int d = v->di[k];
    if (!f || d < 0) continue;
    uint64_t ver = atomic_load_explicit(&b->ver[d], memory_order_acquire);
    if (ver == v->seen[k]) continue;
    v->seen[k] = ver;
    /* the others' contributions: everyone's less this loop's own */
    const int64_t *tw = (size_t)d < tot->cap ? tot->w[d] : NULL, *ow = (size_t)d < own->cap ? own->w[d] : NULL;
    int64_t *ap = v->applied + k * LE;
    size_t m = 0;
    for (size_t i = 0; i < LE; i++) {
      int64_t want = (tw ? tw[i] : 0) - (ow ? ow[i] : 0);
      if (want != ap[i]) {
        v->idx[m] = (uint32_t)i;
        v->dw[m++] = want - ap[i];
        ap[i] = want;
      }
    }
    int64_t wctx = ((size_t)d < tot->cap ? tot->ctx[d] : 0) - ((size_t)d < own->cap ? own->ctx[d] : 0);
    int64_t dctx = wctx - v->actx[k];
    v->actx[k] = wctx;
    if (m || dctx) eldr_footprint_adjust(f->fp, k, v->idx, v->dw, m, dctx);
  }
  pthread_mutex_unlock(&b->mu);
}

uint32_t eldr__bus_peer_load(const worker *w) {
  eldr__bus *b = w->s->grp ? w->s->grp->bus : NULL;
  if (!eldr__bus_up(b)) return 0;
  if (!w->bus_di1) { /* lock-free: the id table is append-only, its count published last */
    uint64_t id = dec_id(w);
    size_t n = atomic_load_explicit(&b->ndec, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
      if (b->ids[i] == id) ((worker *)w)->bus_di1 = (int)i + 1; /* the loop's own worker */
    if (!w->bus_di1) return 0;
  }
  int64_t x = atomic_load_explicit(&b->peer_n[w->bus_di1 - 1], memory_order_relaxed);
  return x <= 0 ? 0 : x > UINT32_MAX ? UINT32_MAX : (uint32_t)x;
}
