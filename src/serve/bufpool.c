/* bufpool.c — the large buffers of one event loop: see bufpool.h (the
 * memory policy is stated there). */
#define _GNU_SOURCE
#include "bufpool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "eldr/error.h"

#define RELAXED memory_order_relaxed

static void stat_idle(eldr__bufpool *bp, long dn, long long dbytes) {
  atomic_store_explicit(&bp->st.idle_n, (size_t)((long)atomic_load_explicit(&bp->st.idle_n, RELAXED) + dn), RELAXED);
  atomic_store_explicit(&bp->st.idle_bytes,
                        (size_t)((long long)atomic_load_explicit(&bp->st.idle_bytes, RELAXED) + dbytes), RELAXED);
}

static void release(eldr__bufpool *bp, char *p, size_t cap) {
  free(p);
  atomic_fetch_add_explicit(&bp->st.frees, 1, RELAXED);
  if (bp->on_free) bp->on_free(bp->on_free_arg, cap);
}

/* Drop the oldest idle buffer. */
static void drop_oldest(eldr__bufpool *bp) {
  struct eldr__pbuf b = bp->idle[0];
  memmove(bp->idle, bp->idle + 1, (bp->n - 1) * sizeof *bp->idle);
  bp->n--;
  stat_idle(bp, -1, -(long long)b.cap);
  release(bp, b.p, b.cap);
}

static size_t idle_bytes(const eldr__bufpool *bp) { return atomic_load_explicit(&bp->st.idle_bytes, RELAXED); }

static void decay_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr__bufpool *bp = arg;
  /* what stayed idle through the whole interval was not needed: the oldest go */
  for (size_t k = bp->low < bp->n ? bp->low : bp->n; k > 0; k--) drop_oldest(bp);
  bp->low = bp->n;
  if (bp->n) {
    struct timeval tv = {(time_t)ELDR__BUFPOOL_DECAY_S,
                         (suseconds_t)((ELDR__BUFPOOL_DECAY_S - (double)(time_t)ELDR__BUFPOOL_DECAY_S) * 1e6)};
    evtimer_add(bp->ev_decay, &tv);
  }
}

int eldr__bufpool_init(eldr__bufpool *bp, struct event_base *base, size_t max_idle) {
  memset(bp, 0, sizeof *bp);
  bp->max_idle = max_idle;
  if (base && !(bp->ev_decay = evtimer_new(base, decay_cb, bp))) return ELDR_ENOMEM;
  return 0;
}

/* Free every idle buffer now. */
static void bufpool_drain(eldr__bufpool *bp) {
  while (bp->n) drop_oldest(bp);
  bp->low = 0;
}

void eldr__bufpool_free(eldr__bufpool *bp) {
  if (!bp) return;
  bp->on_free = NULL; /* the loop is going: no trims to schedule */
  bufpool_drain(bp);
  free(bp->idle);
  if (bp->ev_decay) event_free(bp->ev_decay);
  memset(bp, 0, sizeof *bp);
}

size_t eldr__bufpool_class(size_t need) {
  if (need <= ELDR__BUFPOOL_MIN) return ELDR__BUFPOOL_MIN;
  size_t top = (size_t)1 << (63 - __builtin_clzll((unsigned long long)need)); /* 2^k <= need */
  if (top == need) return need;
  size_t q = top / 4; /* quarter steps between 2^k and 2^(k+1) */
  size_t c = (need + q - 1) / q * q;
  return c < need ? need : c; /* (overflow near SIZE_MAX: no rounding) */
}

/* A fresh buffer's pages made present at once: one system call instead of
 * one fault per 4 KiB page as the reply is written into it. Best effort. */
static void populate(char *p, size_t cap) {
#ifdef MADV_POPULATE_WRITE
  long pg = sysconf(_SC_PAGESIZE);
  if (pg <= 0) return;
  uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
  uintptr_t e = ((uintptr_t)p + cap) & ~((uintptr_t)pg - 1);
  if (e > a) (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)cap;
#endif
}

char *eldr__bufpool_take(eldr__bufpool *bp, size_t need, size_t *cap) {
  atomic_fetch_add_explicit(&bp->st.takes, 1, RELAXED);
  /* the smallest that fits; among equals the newest (the last in the array) */
  size_t best = SIZE_MAX;
  for (size_t i = bp->n; i-- > 0;)
    if (bp->idle[i].cap >= need && (best == SIZE_MAX || bp->idle[i].cap < bp->idle[best].cap)) best = i;
  if (best != SIZE_MAX) {
    struct eldr__pbuf b = bp->idle[best];
    memmove(bp->idle + best, bp->idle + best + 1, (bp->n - best - 1) * sizeof *bp->idle);
    bp->n--;
    if (bp->n < bp->low) bp->low = bp->n;
    stat_idle(bp, -1, -(long long)b.cap);
    *cap = b.cap;
    return b.p;
  }
  size_t c = eldr__bufpool_class(need);
  char *p = malloc(c);
  if (!p) return NULL;
  atomic_fetch_add_explicit(&bp->st.allocs, 1, RELAXED);
  populate(p, c);
  *cap = c;
  return p;
}

void eldr__bufpool_give(eldr__bufpool *bp, char *p, size_t cap) {
  if (!p) return;
  if (cap < ELDR__BUFPOOL_MIN) {
    free(p);
    return;
  }
  if (cap > ELDR__BUFPOOL_KEEP_MAX || cap > bp->max_idle) {
    release(bp, p, cap);
    return;
  }
  while (bp->n && idle_bytes(bp) + cap > bp->max_idle) drop_oldest(bp); /* the newest stays: it is warm */
  if (bp->n == bp->arrcap) {
    size_t nc = bp->arrcap ? bp->arrcap * 2 : 16;
    struct eldr__pbuf *q = realloc(bp->idle, nc * sizeof *q);
    if (!q) {
      release(bp, p, cap);
      return;
    }
    bp->idle = q;
    bp->arrcap = nc;
  }
  bp->idle[bp->n++] = (struct eldr__pbuf){p, cap};
  stat_idle(bp, 1, (long long)cap);
  if (bp->ev_decay && !evtimer_pending(bp->ev_decay, NULL)) {
    bp->low = bp->n - 1; /* the interval starts now: what was idle before it */
    struct timeval tv = {(time_t)ELDR__BUFPOOL_DECAY_S,
                         (suseconds_t)((ELDR__BUFPOOL_DECAY_S - (double)(time_t)ELDR__BUFPOOL_DECAY_S) * 1e6)};
    evtimer_add(bp->ev_decay, &tv);
  }
}

/* ---- spares ---------------------------------------------------------------- */

void eldr__spares_init(eldr__spares *sp, size_t size, size_t max) {
  memset(sp, 0, sizeof *sp);
  sp->size = size;
  sp->max = max;
}

void eldr__spares_free(eldr__spares *sp) {
  for (size_t i = 0; i < sp->n; i++) free(sp->v[i]);
  free(sp->v);
  sp->v = NULL;
  sp->n = 0;
}

void *eldr__spares_take(eldr__spares *sp) { return sp->n ? sp->v[--sp->n] : malloc(sp->size); }

void eldr__spares_give(eldr__spares *sp, void *p) {
  if (!p) return;
  if (sp->n == sp->max || (!sp->v && !(sp->v = malloc(sp->max * sizeof *sp->v)))) {
    free(p);
    return;
  }
  sp->v[sp->n++] = p;
}
