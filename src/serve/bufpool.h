/* bufpool.h — the large buffers of one event loop (serve-private): worker
 * replies of 64 KiB and more (a prefill reply carrying routed_experts is
 * megabytes) are received into buffers that live with the loop, reused
 * from one request to the next, instead of a fresh allocation per request
 * that the system gives back and faults in again (docs/serve.md, "Memory").
 *
 * Memory policy (the one place that decides what stays):
 *   - a buffer is handed out with a capacity rounded up to a size class
 *     (2^k x 1, 1.25, 1.5 or 1.75: at most a quarter more than asked), the
 *     smallest idle one that fits first, the most recently given back among
 *     equals (its lines may still be in the CPU's caches);
 *   - a buffer given back stays idle with the loop while the loop's idle
 *     bytes stay within max_idle (ELDR__BUFPOOL_IDLE_MAX unless set) and
 *     it is at most ELDR__BUFPOOL_KEEP_MAX; otherwise it is freed at once;
 *   - idle buffers the loop did not need for a whole ELDR__BUFPOOL_DECAY_S
 *     (the fewest buffers idle at any moment of that interval: a surplus)
 *     are freed at its end, so a burst's buffers go back within two
 *     intervals of its end and a steady load keeps exactly what it uses;
 *   - a fresh buffer's pages are populated in one system call
 *     (MADV_POPULATE_WRITE where the kernel has it) instead of one page
 *     fault per page as the reply arrives;
 *   - every free of a buffer is noted with the loop's heap trim
 *     (eldr__mem_note), so the memory goes back to the system.
 * Peak memory: what requests in flight hold (each at most the reply bound,
 * MAX_REPLY) plus at most max_idle idle.
 *
 * Buffers come from malloc and may be released with free() or grown with
 * realloc() by code that does not know the pool (the prefill reply's
 * reader, the recorder): such a buffer is then simply not reused.
 *
 * Ownership: the pool owns its idle buffers; a taken buffer belongs to the
 * taker until given back. Errors: take returns NULL on ENOMEM. Threads: its
 * loop's thread only, except the _Atomic statistics, which the loop
 * rendering /metrics reads.
 */
#ifndef ELDR_SERVE_BUFPOOL_H
#define ELDR_SERVE_BUFPOOL_H

#include <event2/event.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define ELDR__BUFPOOL_MIN ((size_t)64 << 10)        /* smaller buffers are not pooled */
#define ELDR__BUFPOOL_KEEP_MAX ((size_t)32 << 20)   /* larger ones are freed when given back */
#define ELDR__BUFPOOL_IDLE_MAX ((size_t)256 << 20)  /* idle bytes a loop keeps at most (default) */
#define ELDR__BUFPOOL_DECAY_S 1.0

typedef struct eldr__bufpool_stats {
  _Atomic uint64_t takes;    /* buffers handed out */
  _Atomic uint64_t allocs;   /* ... of which freshly allocated (the rest: reused) */
  _Atomic uint64_t frees;    /* buffers freed (given back above the policy, or decayed) */
  _Atomic size_t idle_bytes; /* held idle now */
  _Atomic size_t idle_n;
} eldr__bufpool_stats;

typedef struct eldr__bufpool {
  struct eldr__pbuf {
    char *p;
    size_t cap;
  } *idle;                  /* idle buffers, oldest first */
  size_t n, arrcap;
  size_t low;               /* fewest idle since the last decay tick */
  size_t max_idle;
  struct event *ev_decay;   /* armed while something is idle */
  void (*on_free)(void *arg, size_t bytes); /* told of every buffer freed (the heap trim) */
  void *on_free_arg;
  eldr__bufpool_stats st;
} eldr__bufpool;

/* base: the loop (NULL: no decay; idle buffers stay until _free). 0 or
 * ELDR_ENOMEM. */
int eldr__bufpool_init(eldr__bufpool *bp, struct event_base *base, size_t max_idle);
/* Free every idle buffer and the timer (taken buffers stay the takers'). */
void eldr__bufpool_free(eldr__bufpool *bp);
/* The capacity a request for need bytes gets (its size class). */
size_t eldr__bufpool_class(size_t need);
/* A buffer of at least need bytes; *cap: its capacity. NULL on ENOMEM. */
char *eldr__bufpool_take(eldr__bufpool *bp, size_t need, size_t *cap);
/* p (capacity cap; NULL is a no-op) back to the pool: kept or freed by the
 * policy above. A buffer below ELDR__BUFPOOL_MIN is freed. */
void eldr__bufpool_give(eldr__bufpool *bp, char *p, size_t cap);

/* ---- spares: small blocks of one size a loop hands from connection to
 * connection (a request head being parsed, a connection's input buffer):
 * taken when a connection has a request in progress, given back when it
 * goes idle, so an idle keep-alive connection holds neither. At most max
 * spares stay (the rest are freed): a bound of max x size bytes per loop.
 * Ownership and threads as the pool's. */
typedef struct eldr__spares {
  void **v;
  size_t n, max, size;
} eldr__spares;

/* A spares list of blocks of size bytes, keeping at most max. */
void eldr__spares_init(eldr__spares *sp, size_t size, size_t max);
void eldr__spares_free(eldr__spares *sp);
/* A block of sp->size bytes (contents undefined); NULL on ENOMEM. */
void *eldr__spares_take(eldr__spares *sp);
/* p (a block of sp->size bytes; NULL is a no-op) back: kept or freed. */
void eldr__spares_give(eldr__spares *sp, void *p);

#endif
