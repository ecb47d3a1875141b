/* sigcache.c — the block-granular signature cache (docs/serve.md, "routed_experts"). See
 * include/eldr/sigcache.h; the tokenizer and block hashes are tokenize.c. */
#include "eldr/sigcache.h"

/* The row loops (check, convert, add) are plain array loops: let GCC
 * vectorize them at -O2 too (clang does by default). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize")
#endif

#include <stdlib.h>
#include <string.h>

#include "core/counts_int.h" /* eldr__add_i8_u32, eldr__counts_block8 */

/* ---- cache ----------------------------------------------------------------
 * Fixed arrays: rows (capacity * cells int8), per-slot key and LRU links,
 * and an open-addressing index (linear probing, backward-shift deletion)
 * of 2^k >= 2 * capacity entries holding slot + 1 (0 = empty). */
#define NIL UINT32_MAX

struct eldr_sigcache {
  eldr_shape shape;
  size_t cells;
  size_t capacity;
  size_t used; /* slots handed out so far (never shrinks; free list for removed) */
  int8_t *rows;
  uint64_t *keys;
  uint32_t *prev, *next; /* LRU: head = most recent */
  uint32_t head, tail;
  uint32_t free_head; /* removed slots, chained through next */
  uint32_t *index;
  size_t index_mask;
  uint8_t *mask;     /* L flags, or NULL = all layers */
  eldr_sigcache_stats st;
};



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
  if (capacity > SIZE_MAX / c->cells) goto fail;
  c->rows = malloc(capacity * c->cells);
  c->keys = malloc(capacity * sizeof *c->keys);
  c->prev = malloc(capacity * sizeof *c->prev);
  c->next = malloc(capacity * sizeof *c->next);
  c->index = calloc(isz, sizeof *c->index);
  if (!c->rows || !c->keys || !c->prev || !c->next || !c->index) goto fail;
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
  free(c->index);
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
  if (mask) memset(row, 0, c->cells);
  for (size_t l = 0; l < L; l++) {
    if (mask && !mask[l]) continue;
    int8_t *restrict dst = row + l * E;
    const uint32_t *restrict src = block_counts + l * E;
    for (size_t e = 0; e < E; e++) dst[e] = (int8_t)src[e];
  }
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
  return c->rows + (size_t)s * c->cells;
}

int eldr_sigcache_add(eldr_sigcache *c, uint64_t hash, uint32_t *counts) {
  if (!c || !counts) return ELDR_EINVAL;
  size_t pos = find_pos(c, hash);
  if (pos == SIZE_MAX) {
    c->st.misses++;
    return ELDR_ENOTFOUND;
  }
  uint32_t s = c->index[pos] - 1;
  const int8_t *row = c->rows + (size_t)s * c->cells;
  const size_t L = c->shape.num_layers, E = c->shape.num_experts;
  const uint8_t *mask = c->mask;
  if (!mask) {
    eldr__add_i8_u32(counts, row, L * E);
  } else {
    for (size_t l = 0; l < L; l++)
      if (mask[l]) eldr__add_i8_u32(counts + l * E, row + l * E, E);
  }
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
  free(c->mask);
  c->mask = m;
  return ELDR_OK;
}

size_t eldr_sigcache_add_blocks(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks,
                                uint32_t *counts) {
  size_t missing = 0;
  for (size_t b = 0; b < nblocks; b++)
    if (eldr_sigcache_add(c, hashes[b], counts) != 0) missing++;
  return missing;
}

int eldr_sigcache_store_blocks(eldr_sigcache *c, const uint64_t *hashes, size_t nblocks,
                               size_t first_token, const void *raw, eldr_sel_dtype dtype,
                               size_t nrows, uint32_t *scratch, size_t *stored) {
  size_t n = 0;
  if (stored) *stored = 0;
  if (!c || (!hashes && nblocks) || (!raw && nrows) || !scratch) return ELDR_EINVAL;
  const size_t L = c->shape.num_layers, K = c->shape.top_k;
  const size_t esz = eldr_sel_dtype_size(dtype);
  const size_t row_bytes = L * K * esz;
  size_t b = (first_token + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  if (ELDR_BLOCK_TOKENS * K <= 255) {
    /* 8-bit counters straight into a row image (the scratch's bytes): no
     * 32-bit pass, no conversion; a cell above 127 (a row repeating an
     * expert) is refused as eldr_sigcache_put refuses it */
    uint8_t *row8 = (uint8_t *)scratch;
    for (; b < nblocks; b++) {
      size_t t0 = b * ELDR_BLOCK_TOKENS;
      if (t0 + ELDR_BLOCK_TOKENS > first_token + nrows) break;
      const unsigned char *p = (const unsigned char *)raw + (t0 - first_token) * row_bytes;
      memset(row8, 0, c->cells);
      int rc = eldr__counts_block8(&c->shape, p, dtype, ELDR_BLOCK_TOKENS, c->mask, row8);
      uint8_t any = 0;
      for (size_t i = 0; i < c->cells; i++) any |= row8[i];
      if (rc == 0 && (any & 0x80)) rc = ELDR_ERANGE;
      if (rc != 0) {
        memset(scratch, 0, c->cells * sizeof *scratch);
        if (stored) *stored = n;
        return rc;
      }
      memcpy(slot_row(c, hashes[b]), row8, c->cells);
      n++;
    }
    memset(scratch, 0, c->cells * sizeof *scratch);
    if (stored) *stored = n;
    return ELDR_OK;
  }
  memset(scratch, 0, c->cells * sizeof *scratch);
  for (; b < nblocks; b++) {
    size_t t0 = b * ELDR_BLOCK_TOKENS;
    if (t0 + ELDR_BLOCK_TOKENS > first_token + nrows) break;
    const unsigned char *p = (const unsigned char *)raw + (t0 - first_token) * row_bytes;
    int rc = eldr_counts_accumulate_masked(&c->shape, p, dtype, ELDR_BLOCK_TOKENS, c->mask, scratch, NULL);
    if (rc == 0) rc = eldr_sigcache_put(c, hashes[b], scratch);
    if (!c->mask) memset(scratch, 0, c->cells * sizeof *scratch);
    else
      for (size_t l = 0; l < L; l++)
        if (c->mask[l]) memset(scratch + l * c->shape.num_experts, 0, c->shape.num_experts * sizeof *scratch);
    if (rc != 0) {
      if (stored) *stored = n;
      return rc;
    }
    n++;
  }
  if (stored) *stored = n;
  return ELDR_OK;
}
