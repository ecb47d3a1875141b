/* sigshard.c — the signature cache shared by threads (eldr/sigshard.h):
 * eldr_sigcache shards, each behind its own mutex, chosen by the block
 * hash's top bits (the shard's own index hashes the low ones). */
#include "eldr/sigshard.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/sigcache_int.h" /* eldr__sigcache_store1, _add_if, _acc_flush */

/* One shard per cache line: two threads locking neighbouring shards do not
 * share a line. */
typedef struct shard {
  _Alignas(64) pthread_mutex_t mu;
  eldr_sigcache *c;
  _Atomic uint64_t waits; /* locks that found mu taken */
} shard;

/* Lock a shard, counting the times another thread held it. */
static void shard_lock(shard *s) {
  if (pthread_mutex_trylock(&s->mu) == 0) return;
  atomic_fetch_add_explicit(&s->waits, 1, memory_order_relaxed);
  pthread_mutex_lock(&s->mu);
}

struct eldr_sigshard {
  shard *sh;        /* n, 64-byte aligned */
  unsigned n, bits; /* n = 2^bits */
  eldr_shape shape;
  size_t capacity;
  uint8_t *mask;    /* L flags, or NULL = all layers */
  _Atomic size_t refs;
};

unsigned eldr_sigshard_count_for(size_t capacity) {
  unsigned n = 1;
  while (n < ELDR_SIGSHARD_MAX && capacity / (2 * n) >= ELDR_SIGSHARD_MIN_ROWS) n *= 2;
  return n;
}

/* A copy of mask, NULL for none or one of every layer (no mask). */
static int mask_copy(const eldr_shape *s, const uint8_t *mask, uint8_t **out) {
  *out = NULL;
  size_t l = 0;
  while (mask && l < s->num_layers && mask[l]) l++;
  if (!mask || l == s->num_layers) return 0;
  if (!(*out = malloc(s->num_layers))) return -1;
  memcpy(*out, mask, s->num_layers);
  return 0;
}

static inline shard *shard_of(const eldr_sigshard *c, uint64_t h) {
  return &c->sh[c->bits ? (size_t)(h >> (64 - c->bits)) : 0];
}

eldr_sigshard *eldr_sigshard_new(const eldr_shape *shape, size_t capacity, unsigned nshards,
                                 const uint8_t *mask) {
  if (!shape || eldr_shape_validate(shape, NULL) != 0 || nshards == 0 || nshards > ELDR_SIGSHARD_MAX ||
      (nshards & (nshards - 1)) || capacity < nshards)
    return NULL;
  eldr_sigshard *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->shape = *shape;
  c->capacity = capacity;
  c->n = nshards;
  while ((1u << c->bits) < nshards) c->bits++;
  atomic_init(&c->refs, 1);
  void *mem = NULL;
  if (posix_memalign(&mem, 64, nshards * sizeof *c->sh)) {
    free(c);
    return NULL;
  }
  c->sh = memset(mem, 0, nshards * sizeof *c->sh);
  int ok = mask_copy(shape, mask, &c->mask) == 0;
  unsigned made = 0;
  for (; ok && made < nshards; made++) {
    size_t rows = capacity / nshards + (made < capacity % nshards);
    shard *s = &c->sh[made];
    if (!(s->c = eldr_sigcache_new(shape, rows)) || eldr_sigcache_set_layer_mask(s->c, c->mask) ||
        pthread_mutex_init(&s->mu, NULL)) {
      eldr_sigcache_free(s->c);
      ok = 0;
      break;
    }
  }
  if (!ok) {
    for (unsigned i = 0; i < made; i++) {
      pthread_mutex_destroy(&c->sh[i].mu);
      eldr_sigcache_free(c->sh[i].c);
    }
    free(c->sh);
    free(c->mask);
    free(c);
    return NULL;
  }
  return c;
}

eldr_sigshard *eldr_sigshard_ref(eldr_sigshard *c) {
  if (c) atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
  return c;
}

void eldr_sigshard_free(eldr_sigshard *c) {
  if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1) return;
  for (unsigned i = 0; i < c->n; i++) {
    pthread_mutex_destroy(&c->sh[i].mu);
    eldr_sigcache_free(c->sh[i].c);
  }
  free(c->sh);
  free(c->mask);
  free(c);
}

int eldr_sigshard_fits(const eldr_sigshard *c, const eldr_shape *shape, const uint8_t *mask,
                       size_t capacity) {
  if (!c || !shape || c->capacity != capacity || memcmp(&c->shape, shape, sizeof *shape)) return 0;
  uint8_t *m = NULL;
  if (mask_copy(shape, mask, &m)) return 0;
  int same = (!m && !c->mask) || (m && c->mask && !memcmp(m, c->mask, shape->num_layers));
  free(m);
  return same;
}

const eldr_shape *eldr_sigshard_shape(const eldr_sigshard *c) { return c ? &c->shape : NULL; }
unsigned eldr_sigshard_nshards(const eldr_sigshard *c) { return c ? c->n : 0; }

size_t eldr_sigshard_add_blocks(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks,
                                uint32_t *counts) {
  size_t missing = 0;
  for (size_t b = 0; b < nblocks; b++) {
    shard *s = shard_of(c, hashes[b]);
    shard_lock(s);
    int rc = eldr_sigcache_add(s->c, hashes[b], counts);
    pthread_mutex_unlock(&s->mu);
    missing += rc != 0;
  }
  return missing;
}

/* The key of the span row of blocks [b - SPAN + 1, b]: from block b's
 * hash, which names the whole prefix (the chain of eldr/tokenize.h), moved
 * to another key space than the block rows'. */
static inline uint64_t span_key(uint64_t last) { return (last ^ 0x5350414e5350414eULL) * 0x9e3779b97f4a7c15ULL; }

/* The row under key added into the byte sums (1 when held). */
static int add_if(eldr_sigshard *c, uint64_t key, uint8_t *acc, unsigned *room, uint32_t *counts) {
  shard *s = shard_of(c, key);
  shard_lock(s);
  int held = eldr__sigcache_add_if(s->c, key, acc, room, counts);
  pthread_mutex_unlock(&s->mu);
  return held;
}

/* At an aligned block b with a whole span ahead, the span's counts added
 * into the byte sums acc: its span row when held; else its block rows as
 * far as they are held, summed in span (a row's bytes of scratch) and
 * added, and when all seven are, stored as the span row first (the first
 * whole read of a prefix builds its spans). Returns the blocks added (0:
 * not an aligned block with a whole span ahead, or its first block not
 * held). */
static size_t add_span(eldr_sigshard *c, const uint64_t *hashes, size_t b, size_t nblocks, uint8_t *acc,
                       uint8_t *span, unsigned *room, uint32_t *counts) {
  if (b % ELDR_SIGSHARD_SPAN || nblocks - b < ELDR_SIGSHARD_SPAN) return 0;
  const uint64_t key = span_key(hashes[b + ELDR_SIGSHARD_SPAN - 1]);
  if (add_if(c, key, acc, room, counts)) return ELDR_SIGSHARD_SPAN;
  unsigned sum = UINT_MAX, bound = 0; /* UINT_MAX: the first row is copied into span */
  size_t k = 0;
  for (; k < ELDR_SIGSHARD_SPAN; k++) {
    shard *s = shard_of(c, hashes[b + k]);
    shard_lock(s);
    int ok = eldr__sigcache_span_add(s->c, hashes[b + k], span, &sum);
    pthread_mutex_unlock(&s->mu);
    if (!ok || sum > 127) break; /* not held, or a row too full to sum: span holds the rows before it */
    bound = sum;
  }
  if (!k) return 0;
  uint8_t mx = (uint8_t)bound; /* at least each byte */
  if (k == ELDR_SIGSHARD_SPAN) {
    shard *s = shard_of(c, key);
    shard_lock(s);
    mx = eldr__sigcache_put_span(s->c, key, span);
    pthread_mutex_unlock(&s->mu);
  }
  eldr__sigcache_acc_add(c->sh[0].c, acc, span, mx, room, counts); /* one layout: shard 0's */
  return k;
}

size_t eldr_sigshard_add_prefix(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, uint32_t *counts,
                                uint8_t *acc) {
  /* every shard's rows have one layout (one shape, one mask): shard 0's
   * flushes the byte sums */
  const eldr_sigcache *lay = c->sh[0].c;
  uint8_t *span = acc + eldr_sigcache_row_bytes(&c->shape, c->mask); /* the scratch's second half */
  memset(acc, 0, eldr_sigcache_row_bytes(&c->shape, c->mask));
  size_t b = 0;
  unsigned room = 255;
  while (b < nblocks) {
    size_t k = add_span(c, hashes, b, nblocks, acc, span, &room, counts);
    if (!k && !add_if(c, hashes[b], acc, &room, counts)) break;
    b += k ? k : 1;
  }
  eldr__sigcache_acc_flush(lay, acc, counts);
  memset(span, 0, eldr_sigcache_row_bytes(&c->shape, c->mask)); /* a span built or begun there */
  return b;
}

size_t eldr_sigshard_add_held(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, uint32_t *counts,
                              uint8_t *acc, size_t *prefix, uint8_t *held) {
  const eldr_sigcache *lay = c->sh[0].c; /* one layout: shard 0's flushes the byte sums */
  uint8_t *span = acc + eldr_sigcache_row_bytes(&c->shape, c->mask); /* the scratch's second half */
  memset(acc, 0, eldr_sigcache_row_bytes(&c->shape, c->mask));
  size_t n = 0, run = 0;
  int in_run = 1;
  unsigned room = 255;
  for (size_t b = 0; b < nblocks;) {
    size_t k = add_span(c, hashes, b, nblocks, acc, span, &room, counts); /* blocks held from b on */
    int h = 1;
    if (!k) {
      k = 1;
      h = add_if(c, hashes[b], acc, &room, counts);
    }
    if (held) memset(held + b, h, k);
    n += h ? k : 0;
    if (!h) in_run = 0;
    else if (in_run) run += k;
    b += k;
  }
  eldr__sigcache_acc_flush(lay, acc, counts);
  memset(span, 0, eldr_sigcache_row_bytes(&c->shape, c->mask)); /* a span built or begun there */
  if (prefix) *prefix = run;
  return n;
}

int eldr_sigshard_store_blocks(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks,
                               size_t first_token, const void *raw, eldr_sel_dtype dtype,
                               size_t nrows, uint32_t *scratch, size_t *stored) {
  return eldr_sigshard_store_planes(c, hashes, nblocks, first_token, raw, dtype, nrows, NULL, scratch, stored);
}

/* The planes of the block whose rows start at p, or NULL: kept by the pass
 * that counted these rows (the same buffer), at a block's distance from
 * their origin. */
static const unsigned char *planes_of(const eldr_count_planes *pl, const unsigned char *p, size_t row_bytes) {
  if (!pl || !pl->nblocks || !pl->buf || pl->row_bytes != row_bytes) return NULL;
  const uintptr_t at = (uintptr_t)p, o = (uintptr_t)pl->origin, bb = (uintptr_t)ELDR_BLOCK_TOKENS * row_bytes;
  if (at < o || (at - o) % bb || (at - o) / bb >= pl->nblocks) return NULL;
  return pl->buf + (at - o) / bb * pl->block_bytes;
}

int eldr_sigshard_store_planes(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, size_t first_token,
                               const void *raw, eldr_sel_dtype dtype, size_t nrows, const eldr_count_planes *pl,
                               uint32_t *scratch, size_t *stored) {
  if (stored) *stored = 0;
  if (!c || (!hashes && nblocks) || (!raw && nrows) || !scratch) return ELDR_EINVAL;
  const size_t row_bytes = (size_t)c->shape.num_layers * c->shape.top_k * eldr_sel_dtype_size(dtype);
  const size_t cells = eldr_shape_cells(&c->shape);
  /* planes of another layout than the rows' (another mask) are not used */
  if (pl && pl->ngroups != eldr_sigcache_row_bytes(&c->shape, c->mask) / c->shape.num_experts / 4) pl = NULL;
  int zeroed = 0; /* zeroed once, at the first block not held: each block leaves it so */
  size_t n = 0;
  int rc = ELDR_OK;
  for (size_t b = (first_token + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS; b < nblocks; b++) {
    size_t t0 = b * ELDR_BLOCK_TOKENS;
    if (t0 + ELDR_BLOCK_TOKENS > first_token + nrows) break;
    const unsigned char *p = (const unsigned char *)raw + (t0 - first_token) * row_bytes;
    const unsigned char *bp = planes_of(pl, p, row_bytes);
    const int fmt = pl ? pl->format : 0;
    shard *s = shard_of(c, hashes[b]);
    shard_lock(s);
    int r = eldr__sigcache_store1(s->c, hashes[b], p, dtype, bp, fmt, zeroed ? (uint8_t *)scratch : NULL);
    if (r == ELDR_ENOTFOUND) { /* not held: it needs the scratch */
      memset(scratch, 0, cells * sizeof *scratch);
      zeroed = 1;
      r = eldr__sigcache_store1(s->c, hashes[b], p, dtype, bp, fmt, (uint8_t *)scratch);
    }
    pthread_mutex_unlock(&s->mu);
    if (r < 0) {
      rc = r;
      break;
    }
    n++;
  }
  if (!zeroed) memset(scratch, 0, cells * sizeof *scratch); /* the contract: left zeroed */
  if (stored) *stored = n;
  return rc;
}

size_t eldr_sigshard_bytes(const eldr_sigshard *c) {
  size_t n = 0;
  for (unsigned i = 0; c && i < c->n; i++) n += eldr_sigcache_bytes(c->sh[i].c);
  return n;
}

uint64_t eldr_sigshard_lock_waits(const eldr_sigshard *c) {
  uint64_t n = 0;
  for (unsigned i = 0; c && i < c->n; i++) n += atomic_load_explicit(&c->sh[i].waits, memory_order_relaxed);
  return n;
}

void eldr_sigshard_stats_get(eldr_sigshard *c, eldr_sigcache_stats *s) {
  if (!s) return;
  memset(s, 0, sizeof *s);
  if (!c) return;
  for (unsigned i = 0; i < c->n; i++) {
    eldr_sigcache_stats x;
    shard_lock(&c->sh[i]);
    eldr_sigcache_stats_get(c->sh[i].c, &x);
    pthread_mutex_unlock(&c->sh[i].mu);
    s->rows += x.rows;
    s->capacity += x.capacity;
    s->hits += x.hits;
    s->misses += x.misses;
    s->evictions += x.evictions;
    s->stored += x.stored;
    s->present += x.present;
    s->spans += x.spans;
  }
}
