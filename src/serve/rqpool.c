/* rqpool.c — the request objects of one event loop: allocated from the
 * loop's pool of ended requests (their timer and small buffers reused, so
 * that long prompts do not allocate and free their buffers per request),
 * their large buffers handed to the loop's buffer pool (bufpool.h) at the
 * end, the record submitted, and freed (the heap trimmed soon after a big
 * one) or pooled under a count and byte bound. Loop thread only. */
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

/* Requests whose buffers (other than the pooled large ones) add up to at
 * least this much trim the heap when they are freed. */
#define BIG_REQUEST (1u << 20)
/* Ended requests a loop keeps for reuse (with their timer and buffers), and
 * the most buffer bytes one may hold to be kept: a loop's pool stays under
 * RQ_POOL_MAX x RQ_KEEP_BYTES. A prompt of 4096 tokens is about 25 KB of
 * JSON, and a request holds it about five times (the client's body, its
 * text, both legs' bodies): kept, so that long prompts do not allocate and
 * free 125 KB per request (the large reply buffers are the loop's: bufpool.h). */
#define RQ_POOL_MAX 64
#define RQ_KEEP_BYTES (256u << 10)

/* rq_bufs: what they hold, emptied for the next request, freed. */
static size_t bufs_bytes(const rq_bufs *b) { return b->fwd.cap + b->pb.cap + b->db.cap + b->fix.cap; }

static void bufs_empty(rq_bufs *b) { b->fwd.n = b->pb.n = b->db.n = b->fix.n = 0; }

static void bufs_free(rq_bufs *b) {
  eldr__buf_free(&b->fwd);
  eldr__buf_free(&b->pb);
  eldr__buf_free(&b->db);
  eldr__buf_free(&b->fix);
}

static size_t rq_kept_bytes(const rq *r) {
  return r->L.cap + r->req.text_cap + r->req.raw_cap + r->req.ids_cap * sizeof *r->req.ids + r->pr.raw_cap +
         r->prompt.hashcap * sizeof *r->prompt.hashes + bufs_bytes(&r->b);
}

void eldr__rq_destroy(rq *r) {
  if (r->L.deadline) event_free(r->L.deadline);
  free(r->L.buf);
  eldr__req_free(&r->req);
  eldr__prompt_free(&r->prompt);
  eldr_reply_prefill_free(&r->pr);
  bufs_free(&r->b);
  free(r->wsig);
  eldr__record_stream_free(r);
  free(r);
}

void eldr__rq_pool_free(eldr_server *s) {
  while (s->rq_pool) {
    rq *r = s->rq_pool;
    s->rq_pool = r->pool_next;
    eldr__rq_destroy(r);
  }
  s->rq_pooled = 0;
}

/* The request's large buffers (a worker's reply, the prefill reply it became,
 * the decode reply as fixed) go back to the loop's pool (bufpool.h), whose
 * policy decides what stays; the request keeps only small ones. */
static void rq_give_large(rq *r) {
  eldr__bufpool *bp = &r->s->bufs;
  if (r->L.cap >= ELDR__BUFPOOL_MIN) {
    eldr__bufpool_give(bp, r->L.buf, r->L.cap);
    r->L.buf = NULL;
    r->L.n = r->L.cap = 0;
  }
  eldr_reply_prefill_clear(&r->pr); /* keeps its copy's buffer (and nothing borrows from it now) */
  if (r->pr.raw_cap >= ELDR__BUFPOOL_MIN) {
    eldr__bufpool_give(bp, r->pr.raw, r->pr.raw_cap);
    r->pr.raw = NULL;
    r->pr.raw_cap = 0;
  }
  if (r->b.fix.cap >= ELDR__BUFPOOL_MIN) {
    eldr__bufpool_give(bp, r->b.fix.p, r->b.fix.cap);
    r->b.fix = (eldr__buf){0};
  }
}

void eldr__rq_free(rq *r) {
  if (!r) return;
  eldr_server *s = r->s;
  eldr__sglpd_free(r);
  eldr__leg_release(r);
  if (r->reserved) r->reserved->inflight--; /* reserved, never started (not reached today) */
  if (r->rec) eldr__record_submit(r); /* takes L.buf and pr.root when it needs them */
  rq_give_large(r);
  if (s->rq_pooled >= RQ_POOL_MAX || rq_kept_bytes(r) > RQ_KEEP_BYTES || !r->L.deadline) {
    size_t big = rq_kept_bytes(r); /* a large prompt's buffers: freed, the heap trimmed soon */
    if (big >= BIG_REQUEST) eldr__mem_note(s, big);
    eldr__rq_destroy(r);
    return;
  }
  /* back to the pool: what this request read is dropped, the buffers stay */
  eldr__req_clear(&r->req);
  /* the prompt's hash buffer stays too: the next prompt_init reuses it */
  free(r->wsig);
  r->wsig = NULL;
  eldr__record_stream_free(r);
  r->pool_next = s->rq_pool;
  s->rq_pool = r;
  s->rq_pooled++;
}

/* A request for c: from the loop's pool (its buffers reused) or new. */
rq *eldr__rq_alloc(eldr_server *s) {
  rq *r = s->rq_pool;
  if (!r) {
    r = calloc(1, sizeof *r);
    if (r && !(r->L.deadline = evtimer_new(s->base, eldr__leg_deadline_cb, r))) {
      free(r);
      return NULL;
    }
    return r;
  }
  s->rq_pool = r->pool_next;
  s->rq_pooled--;
  /* every field zero as calloc gives it, but the timer and the buffers */
  rq keep = *r;
  memset(r, 0, sizeof *r);
  r->L.deadline = keep.L.deadline;
  r->L.buf = keep.L.buf;
  r->L.cap = keep.L.cap;
  r->req = keep.req; /* cleared, buffers kept */
  r->pr.raw = keep.pr.raw;
  r->pr.raw_cap = keep.pr.raw_cap;
  r->prompt.hashes = keep.prompt.hashes;
  r->prompt.hashcap = keep.prompt.hashcap;
  r->b = keep.b;
  bufs_empty(&r->b);
  return r;
}
