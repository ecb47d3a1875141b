/* sigcache.c — the block-granular signature cache (docs/serve.md, "routed_experts"). See
 * include/eldr/sigcache.h; the tokenizer and block hashes are tokenize.c. */
#include "eldr/sigcache.h"

/* The row loops (check, convert, add) are plain array loops: let GCC
 * vectorize them at -O2 too (clang does by default). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize")
#endif

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/counts_int.h" /* eldr__add_i8_u32, eldr__counts_block8 */
#include "core/sigcache_int.h" /* the byte kernels' vector twins */
#include "eldr/cpu.h"

/* ---- byte sums of cached rows (a prompt the cache holds) ---------------------
 * acc[i] += row[i] a vector at a time, then acc widened onto 32-bit counts:
 * a held row costs one byte add a cell instead of a widening add, and the
 * widening runs once per up to 15 rows. The vector twins are
 * sigcache_avx2.c and sigcache_avx512.c (core/sigcache_int.h); each loop
 * below finishes what they leave. */

/* The largest of n bytes. */
static uint8_t maxb(const uint8_t *r, size_t n) {
  size_t i = 0;
  uint8_t m = 0;
#ifdef ELDR_SIGCACHE_X86
  if (eldr_cpu_has(ELDR_CPU_AVX512)) i = eldr__maxb_512(r, n, &m);
  else if (eldr_cpu_has(ELDR_CPU_AVX2)) i = eldr__maxb_avx2(r, n, &m);
#endif
  for (; i < n; i++) m = r[i] > m ? r[i] : m;
  return m;
}

static void addb(uint8_t *restrict a, const int8_t *restrict r, size_t n) {
  size_t i = 0;
#ifdef ELDR_SIGCACHE_X86
  if (eldr_cpu_has(ELDR_CPU_AVX512)) i = eldr__addb_512(a, r, n);
  else if (eldr_cpu_has(ELDR_CPU_AVX2)) i = eldr__addb_avx2(a, r, n);
#endif
  for (; i < n; i++) a[i] = (uint8_t)(a[i] + (uint8_t)r[i]);
}

static void widen(uint32_t *restrict d, const uint8_t *restrict a, size_t n) {
  size_t i = 0;
#ifdef ELDR_SIGCACHE_X86
  if (eldr_cpu_has(ELDR_CPU_AVX512)) i = eldr__widen_512(d, a, n);
  else if (eldr_cpu_has(ELDR_CPU_AVX2)) i = eldr__widen_avx2(d, a, n);
#endif
  for (; i < n; i++) d[i] += a[i];
}

/* ---- cache ----------------------------------------------------------------
 * Fixed arrays: rows (capacity * rowb int8: the masked layers' counts only,
 * nl layers of E, in layer order), per-slot key and LRU links, and an
 * open-addressing index (linear probing, backward-shift deletion) of 2^k >=
 * 2 * capacity entries holding slot + 1 (0 = empty). */
#define NIL UINT32_MAX

struct eldr_sigcache {
  eldr_shape shape;
  size_t cells;      /* L * E: the counts arrays the callers pass */
  size_t rowb;       /* nl * E: a stored row */
  size_t nl;         /* layers stored: the mask's (all without one) */
  uint16_t *lay;     /* their indices (nl) */
  size_t capacity;
  size_t used; /* slots handed out so far (never shrinks; free list for removed) */
  int8_t *rows;
  uint64_t *keys;
  uint32_t *prev, *next; /* LRU: head = most recent */
  uint8_t *rowmax;       /* per slot: the row's largest count (byte sums stay below 256) */
  uint32_t head, tail;
  uint32_t free_head; /* removed slots, chained through next */
  uint32_t *index;
  size_t index_mask;
  uint8_t *mask;     /* L flags, or NULL = all layers */
  eldr_sigcache_stats st;
};

size_t eldr_sigcache_row_bytes(const eldr_shape *shape, const uint8_t *mask) {
  if (!shape) return 0;
  size_t nl = 0;
  for (size_t l = 0; l < shape->num_layers; l++) nl += !mask || mask[l];
  return nl * shape->num_experts;
}

size_t eldr_sigcache_capacity_for(const eldr_shape *shape, const uint8_t *mask, size_t bytes) {
  size_t rb = eldr_sigcache_row_bytes(shape, mask);
  return rb ? bytes / (rb + ELDR_SIGCACHE_ROW_OVERHEAD) : 0;
}

/* The stored layers for mask (NULL: all): c->lay, c->nl, c->rowb. */
static int set_layers(eldr_sigcache *c, const uint8_t *mask) {
  const size_t L = c->shape.num_layers;
  uint16_t *lay = malloc(L * sizeof *lay);
  if (!lay) return ELDR_ENOMEM;
  size_t nl = 0;
  for (size_t l = 0; l < L; l++)
    if (!mask || mask[l]) lay[nl++] = (uint16_t)l;
  free(c->lay);
  c->lay = lay;
  c->nl = nl;
  c->rowb = nl * c->shape.num_experts;
  return ELDR_OK;
}


static inline size_t home_of(const eldr_sigcache *c, uint64_t h) {
  return (size_t)(h ^ (h >> 29) ^ (h >> 47)) & c->index_mask;
}

eldr_sigcache *eldr_sigcache_new(const eldr_shape *shape, size_t capacity) {
  if (!shape || eldr_shape_validate(shape, NULL) != 0 || capacity == 0 || capacity >= NIL / 4)
    return NULL;
  eldr_sigcache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->shape = *shape;
  c->cells = eldr_shape_cells(shape);
  c->capacity = capacity;
  size_t isz = 1;
  while (isz < 2 * capacity) isz <<= 1;
  c->index_mask = isz - 1;
  if (capacity > SIZE_MAX / c->cells || set_layers(c, NULL)) goto fail;
  c->rows = malloc(capacity * c->rowb);
  c->keys = malloc(capacity * sizeof *c->keys);
  c->prev = malloc(capacity * sizeof *c->prev);
  c->next = malloc(capacity * sizeof *c->next);
  c->index = calloc(isz, sizeof *c->index);
  c->rowmax = malloc(capacity);
  if (!c->rows || !c->keys || !c->prev || !c->next || !c->index || !c->rowmax) goto fail;
  c->head = c->tail = c->free_head = NIL;
  c->st.capacity = capacity;
  return c;
fail:
  eldr_sigcache_free(c);
  return NULL;
}

void eldr_sigcache_free(eldr_sigcache *c) {
  if (!c) return;
  free(c->mask);
  free(c->lay);
  free(c->index);
  free(c->rowmax);
  free(c->next);
  free(c->prev);
  free(c->keys);
  free(c->rows);
  free(c);
}

/* Index position of hash, or SIZE_MAX. */
static size_t find_pos(const eldr_sigcache *c, uint64_t h) {
  size_t i = home_of(c, h);
  for (;;) {
    uint32_t v = c->index[i];
    if (v == 0) return SIZE_MAX;
    if (c->keys[v - 1] == h) return i;
    i = (i + 1) & c->index_mask;
  }
}

static void index_delete_at(eldr_sigcache *c, size_t i) {
  /* backward-shift deletion keeps every probe chain unbroken */
  size_t j = i;
  for (;;) {
    c->index[i] = 0;
    for (;;) {
      j = (j + 1) & c->index_mask;
      uint32_t v = c->index[j];
      if (v == 0) return;
      size_t k = home_of(c, c->keys[v - 1]);
      /* move v to i if its home k is cyclically outside (i, j] */
      if ((i <= j) ? (i < k && k <= j) : (i < k || k <= j)) continue;
      c->index[i] = v;
      i = j;
      break;
    }
  }
}

static void lru_unlink(eldr_sigcache *c, uint32_t s) {
  if (c->prev[s] != NIL) c->next[c->prev[s]] = c->next[s];
  else c->head = c->next[s];
  if (c->next[s] != NIL) c->prev[c->next[s]] = c->prev[s];
  else c->tail = c->prev[s];
}

static void lru_push_front(eldr_sigcache *c, uint32_t s) {
  c->prev[s] = NIL;
  c->next[s] = c->head;
  if (c->head != NIL) c->prev[c->head] = s;
  c->head = s;
  if (c->tail == NIL) c->tail = s;
}

static int8_t *slot_row(eldr_sigcache *c, uint64_t hash);
static size_t slot_of_row(const eldr_sigcache *c, const int8_t *row) { return (size_t)(row - c->rows) / c->rowb; }

/* A stored row onto L*E counts: runs of consecutive stored layers in one go. */
static void add_row(const eldr_sigcache *c, const int8_t *row, uint32_t *counts) {
  const size_t E = c->shape.num_experts;
  for (size_t j = 0; j < c->nl;) {
    size_t k = j + 1;
    while (k < c->nl && c->lay[k] == c->lay[k - 1] + 1) k++;
    eldr__add_i8_u32(counts + (size_t)c->lay[j] * E, row + j * E, (k - j) * E);
    j = k;
  }
}

int eldr_sigcache_put(eldr_sigcache *c, uint64_t hash, const uint32_t *block_counts) {
  if (!c || !block_counts) return ELDR_EINVAL;
  const size_t L = c->shape.num_layers, E = c->shape.num_experts;
  const uint8_t *mask = c->mask;
  uint32_t any = 0; /* OR of all values: some value > 127 iff a bit above 127 is set */
  for (size_t l = 0; l < L; l++) {
    if (mask && !mask[l]) continue;
    const uint32_t *restrict src = block_counts + l * E;
    for (size_t e = 0; e < E; e++) any |= src[e];
  }
  if (any & ~(uint32_t)127) return ELDR_ERANGE;
  int8_t *row = slot_row(c, hash);
  uint8_t mx = 0;
  for (size_t j = 0; j < c->nl; j++) {
    int8_t *restrict dst = row + j * E;
    const uint32_t *restrict src = block_counts + (size_t)c->lay[j] * E;
    for (size_t e = 0; e < E; e++) {
      dst[e] = (int8_t)src[e];
      mx = (uint8_t)src[e] > mx ? (uint8_t)src[e] : mx;
    }
  }
  c->rowmax[slot_of_row(c, row)] = mx;
  return ELDR_OK;
}

/* The row stored under hash, made the most recent: an existing one, a free
 * slot, or the least recently used one evicted. Its contents are the
 * caller's to fill. */
static int8_t *slot_row(eldr_sigcache *c, uint64_t hash) {
  uint32_t s;
  size_t pos = find_pos(c, hash);
  if (pos != SIZE_MAX) {
    s = c->index[pos] - 1;
    lru_unlink(c, s);
  } else {
    if (c->free_head != NIL) {
      s = c->free_head;
      c->free_head = c->next[s];
    } else if (c->used < c->capacity) {
      s = (uint32_t)c->used++;
    } else { /* evict the least recently used row */
      s = c->tail;
      lru_unlink(c, s);
      index_delete_at(c, find_pos(c, c->keys[s]));
      c->st.evictions++;
      c->st.rows--;
    }
    c->keys[s] = hash;
    size_t i = home_of(c, hash);
    while (c->index[i] != 0) i = (i + 1) & c->index_mask;
    c->index[i] = s + 1;
    c->st.rows++;
  }
  lru_push_front(c, s);
  return c->rows + (size_t)s * c->rowb;
}

int eldr_sigcache_add(eldr_sigcache *c, uint64_t hash, uint32_t *counts) {
  if (!c || !counts) return ELDR_EINVAL;
  size_t pos = find_pos(c, hash);
  if (pos == SIZE_MAX) {
    c->st.misses++;
    return ELDR_ENOTFOUND;
  }
  uint32_t s = c->index[pos] - 1;
  add_row(c, c->rows + (size_t)s * c->rowb, counts);
  lru_unlink(c, s);
  lru_push_front(c, s);
  c->st.hits++;
  return ELDR_OK;
}

int eldr_sigcache_remove(eldr_sigcache *c, uint64_t hash) {
  if (!c) return ELDR_EINVAL;
  size_t pos = find_pos(c, hash);
  if (pos == SIZE_MAX) return ELDR_ENOTFOUND;
  uint32_t s = c->index[pos] - 1;
  index_delete_at(c, pos);
  lru_unlink(c, s);
  c->next[s] = c->free_head;
  c->free_head = s;
  c->st.rows--;
  return ELDR_OK;
}

void eldr_sigcache_stats_get(const eldr_sigcache *c, eldr_sigcache_stats *s) {
  if (!s) return;
  if (!c) {
    memset(s, 0, sizeof *s);
    return;
  }
  *s = c->st;
}

const eldr_shape *eldr_sigcache_shape(const eldr_sigcache *c) { return c ? &c->shape : NULL; }

int eldr_sigcache_set_layer_mask(eldr_sigcache *c, const uint8_t *mask) {
  if (!c) return ELDR_EINVAL;
  uint8_t *m = NULL;
  size_t l = 0;
  while (mask && l < c->shape.num_layers && mask[l]) l++;
  if (mask && l < c->shape.num_layers) { /* a mask of every layer is no mask */
    m = malloc(c->shape.num_layers);
    if (!m) return ELDR_ENOMEM;
    memcpy(m, mask, c->shape.num_layers);
  }
  /* rows hold the masked layers only: the layout changes, the rows go */
  uint16_t *old_lay = c->lay;
  size_t old_nl = c->nl, old_rowb = c->rowb;
  c->lay = NULL;
  if (set_layers(c, m)) {
    c->lay = old_lay;
    free(m);
    return ELDR_ENOMEM;
  }
  if (c->rowb != old_rowb) { /* the rows array sized for the new width */
    int8_t *r = malloc(c->capacity * c->rowb);
    if (!r) {
      free(c->lay);
      c->lay = old_lay;
      c->nl = old_nl;
      c->rowb = old_rowb;
      free(m);
      return ELDR_ENOMEM;
    }
    free(c->rows);
    c->rows = r;
  }
  free(old_lay);
  memset(c->index, 0, (c->index_mask + 1) * sizeof *c->index);
  c->head = c->tail = c->free_head = NIL;
  c->used = 0;
  c->st.rows = 0;
  free(c->mask);
  c->mask = m;
  return ELDR_OK;
}

size_t eldr_sigcache_bytes(const eldr_sigcache *c) {
  if (!c) return 0;
  return c->capacity * (c->rowb + sizeof *c->keys + sizeof *c->prev + sizeof *c->next) +
         (c->index_mask + 1) * sizeof *c->index;
}

size_t eldr_sigcache_add_blocks(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks,
                                uint32_t *counts) {
  size_t missing = 0;
  for (size_t b = 0; b < nblocks; b++)
    if (eldr_sigcache_add(c, hashes[b], counts) != 0) missing++;
  return missing;
}

int eldr__sigcache_add_if(eldr_sigcache *c, uint64_t hash, uint8_t *acc, unsigned *room, uint32_t *counts) {
  size_t pos = find_pos(c, hash);
  if (pos == SIZE_MAX) return 0;
  uint32_t s = c->index[pos] - 1;
  eldr__sigcache_acc_add(c, acc, (const uint8_t *)(c->rows + (size_t)s * c->rowb), c->rowmax[s], room, counts);
  lru_unlink(c, s);
  lru_push_front(c, s);
  c->st.hits++;
  return 1;
}

void eldr__sigcache_acc_flush(const eldr_sigcache *c, uint8_t *acc, uint32_t *counts) {
  const size_t E = c->shape.num_experts;
  for (size_t j = 0; j < c->nl;) { /* runs of consecutive stored layers in one go */
    size_t k = j + 1;
    while (k < c->nl && c->lay[k] == c->lay[k - 1] + 1) k++;
    widen(counts + (size_t)c->lay[j] * E, acc + j * E, (k - j) * E);
    j = k;
  }
  memset(acc, 0, c->rowb);
}

int eldr__sigcache_span_add(eldr_sigcache *c, uint64_t hash, uint8_t *acc, unsigned *sum) {
  size_t pos = find_pos(c, hash);
  if (pos == SIZE_MAX) return 0;
  uint32_t s = c->index[pos] - 1;
  const int8_t *row = c->rows + (size_t)s * c->rowb;
  c->st.hits++;
  if (*sum == UINT_MAX) { /* the span's first row: copied, no sums to clear first */
    *sum = c->rowmax[s];
    memcpy(acc, row, c->rowb);
    return 1;
  }
  *sum += c->rowmax[s];
  if (*sum <= 127) addb(acc, row, c->rowb);
  return 1;
}

uint8_t eldr__sigcache_put_span(eldr_sigcache *c, uint64_t hash, const uint8_t *row) {
  int8_t *dst = slot_row(c, hash);
  memcpy(dst, row, c->rowb);
  const uint8_t mx = maxb(row, c->rowb);
  c->rowmax[slot_of_row(c, dst)] = mx;
  c->st.spans++;
  return mx;
}

void eldr__sigcache_acc_add(const eldr_sigcache *c, uint8_t *acc, const uint8_t *row, uint8_t mx, unsigned *room,
                            uint32_t *counts) {
  if (mx > *room) { /* a byte could wrap: the sums go to counts first */
    eldr__sigcache_acc_flush(c, acc, counts);
    *room = 255;
  }
  *room -= mx;
  addb(acc, (const int8_t *)row, c->rowb);
}

size_t eldr_sigcache_add_prefix(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks, uint32_t *counts,
                                uint8_t *acc) {
  size_t b = 0;
  unsigned room = 255;
  memset(acc, 0, c->rowb);
  while (b < nblocks && eldr__sigcache_add_if(c, hashes[b], acc, &room, counts)) b++;
  eldr__sigcache_acc_flush(c, acc, counts);
  return b;
}

/* One block's rows into a new row (a block already held is not counted
 * again: 1, made the most recent). row8: L*E uint32 of scratch, zero in
 * the stored layers, left so (NULL: ELDR_ENOTFOUND when not held: call
 * again with one). 0, 1, ELDR_ENOTFOUND or ELDR_ERANGE (nothing stored). */
/* A block's row from the planes its counting pass kept (bp, in the layout
 * of `format`; core/counts_int.h): each group of four stored layers
 * converted into the row (in place when E is 128), the mask's last nl % 4
 * layers counted from the rows at p into row8 (needed then). */
static int store_planes(eldr_sigcache *c, uint64_t hash, const unsigned char *p, eldr_sel_dtype dtype,
                        const unsigned char *bp, int format, uint8_t *row8) {
  const size_t E = c->shape.num_experts, ng = c->nl / 4;
  int rc = 0;
  if (c->nl % 4) { /* the rest: the per-id kernel over those layers only */
    uint8_t rm[ELDR_MAX_LAYERS] = {0};
    for (size_t j = 4 * ng; j < c->nl; j++) rm[c->lay[j]] = 1;
    rc = eldr__counts_block8(&c->shape, p, dtype, ELDR_BLOCK_TOKENS, rm, row8);
  }
  uint8_t mx = 0;
  if (rc == 0) {
    int8_t *dst = slot_row(c, hash);
    uint8_t tmp[4 * 128];
    for (size_t g = 0; g < ng; g++) {
      const unsigned char *gp = bp + g * ELDR_PLANES_GROUP_BYTES;
      uint8_t m;
      if (E == 128) {
        m = eldr__planes_rows(gp, format, (uint8_t *)dst + 4 * g * 128);
      } else { /* rows of E: the ids >= E counted nothing (checked) */
        m = eldr__planes_rows(gp, format, tmp);
        for (size_t r = 0; r < 4; r++) memcpy(dst + (4 * g + r) * E, tmp + r * 128, E);
      }
      mx = m > mx ? m : mx;
    }
    for (size_t j = 4 * ng; j < c->nl; j++) {
      memcpy(dst + j * E, row8 + (size_t)c->lay[j] * E, E);
      uint8_t m = maxb(row8 + (size_t)c->lay[j] * E, E);
      mx = m > mx ? m : mx;
    }
    c->rowmax[slot_of_row(c, dst)] = mx; /* <= 16 (16 tokens, one bit a row) */
    c->st.stored++;
  }
  for (size_t j = 4 * ng; j < c->nl; j++) memset(row8 + (size_t)c->lay[j] * E, 0, E);
  return rc;
}

int eldr__sigcache_store1(eldr_sigcache *c, uint64_t hash, const unsigned char *p, eldr_sel_dtype dtype,
                          const unsigned char *bp, int format, uint8_t *row8) {
  size_t pos = find_pos(c, hash);
  if (pos != SIZE_MAX) {
    uint32_t s = c->index[pos] - 1;
    lru_unlink(c, s);
    lru_push_front(c, s);
    c->st.present++;
    return 1;
  }
  if (bp && c->nl >= 4 && (c->nl % 4 == 0 || row8)) return store_planes(c, hash, p, dtype, bp, format, row8);
  if (!row8) return ELDR_ENOTFOUND;
  const size_t E = c->shape.num_experts;
  int rc;
  if (ELDR_BLOCK_TOKENS * c->shape.top_k <= 255) {
    /* 8-bit counters straight into a row image: no 32-bit pass, no
     * conversion; a cell above 127 (a row repeating an expert) is refused
     * as eldr_sigcache_put refuses it */
    rc = eldr__counts_block8(&c->shape, p, dtype, ELDR_BLOCK_TOKENS, c->mask, row8);
    uint8_t mx = 0;
    for (size_t j = 0; j < c->nl;) { /* runs of consecutive stored layers */
      size_t k = j + 1;
      while (k < c->nl && c->lay[k] == c->lay[k - 1] + 1) k++;
      uint8_t m = maxb(row8 + (size_t)c->lay[j] * E, (k - j) * E);
      mx = m > mx ? m : mx;
      j = k;
    }
    if (rc == 0 && mx > 127) rc = ELDR_ERANGE;
    if (rc == 0) {
      int8_t *dst = slot_row(c, hash);
      for (size_t j = 0; j < c->nl; j++) memcpy(dst + j * E, row8 + (size_t)c->lay[j] * E, E);
      c->rowmax[slot_of_row(c, dst)] = mx;
      c->st.stored++;
    }
    for (size_t j = 0; j < c->nl; j++) memset(row8 + (size_t)c->lay[j] * E, 0, E);
    return rc;
  }
  /* wide top-k: 32-bit counts in the row image's place (L*E uint32) */
  uint32_t *w = (uint32_t *)(void *)row8;
  rc = eldr_counts_accumulate_masked(&c->shape, p, dtype, ELDR_BLOCK_TOKENS, c->mask, w, NULL);
  if (rc == 0) rc = eldr_sigcache_put(c, hash, w);
  if (rc == 0) c->st.stored++;
  for (size_t j = 0; j < c->nl; j++) memset(w + (size_t)c->lay[j] * E, 0, E * sizeof *w);
  return rc;
}

int eldr_sigcache_store_blocks(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks,
                               size_t first_token, const void *raw, eldr_sel_dtype dtype,
                               size_t nrows, uint32_t *scratch, size_t *stored) {
  size_t n = 0;
  if (stored) *stored = 0;
  if (!c || (!hashes && nblocks) || (!raw && nrows) || !scratch) return ELDR_EINVAL;
  const size_t row_bytes = (size_t)c->shape.num_layers * c->shape.top_k * eldr_sel_dtype_size(dtype);
  memset(scratch, 0, c->cells * sizeof *scratch); /* each block leaves it zeroed */
  int rc = ELDR_OK;
  for (size_t b = (first_token + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS; b < nblocks; b++) {
    size_t t0 = b * ELDR_BLOCK_TOKENS;
    if (t0 + ELDR_BLOCK_TOKENS > first_token + nrows) break;
    const unsigned char *p = (const unsigned char *)raw + (t0 - first_token) * row_bytes;
    int r = eldr__sigcache_store1(c, hashes[b], p, dtype, NULL, 0, (uint8_t *)scratch);
    if (r < 0 || r > 1) {
      rc = r;
      break;
    }
    n++;
  }
  if (stored) *stored = n;
  return rc;
}
