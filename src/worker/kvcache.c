/* kvcache.c — paged KV cache with prefix caching and a co-indexed block
 * signature cache (see kvcache.h). */
#include "worker/kvcache.h"

#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"

/* lists: a block with ref == 0 is on exactly one of them: `free` (never
 * registered or evicted: no hash) or `lru` (registered, cached). */
enum { LIST_NONE = 0, LIST_FREE, LIST_LRU };

struct eldr__kv {
  size_t n;
  uint64_t *hash;
  uint8_t *hashed, *list;
  uint32_t *ref;
  int32_t *prev, *next;
  int32_t free_head, free_tail, lru_head, lru_tail;
  size_t n_free, n_lru, n_used;
  /* open-addressing table hash -> block + 1 (0 = empty), linear probing */
  int32_t *tab;
  size_t tab_mask;
  uint64_t evictions;
  eldr_sigcache *sc;
};

static size_t slot_of(const eldr__kv *kv, uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (size_t)h & kv->tab_mask;
}

static int32_t tab_find(const eldr__kv *kv, uint64_t h) {
  for (size_t i = slot_of(kv, h);; i = (i + 1) & kv->tab_mask) {
    int32_t b = kv->tab[i];
    if (!b) return -1;
    if (kv->hash[b - 1] == h) return b - 1;
  }
}

static void tab_insert(eldr__kv *kv, int32_t blk) {
  size_t i = slot_of(kv, kv->hash[blk]);
  while (kv->tab[i]) i = (i + 1) & kv->tab_mask;
  kv->tab[i] = blk + 1;
}

static void tab_remove(eldr__kv *kv, int32_t blk) {
  size_t i = slot_of(kv, kv->hash[blk]);
  while (kv->tab[i] != blk + 1) i = (i + 1) & kv->tab_mask;
  /* backward-shift deletion keeps probe chains intact */
  size_t j = i;
  for (;;) {
    kv->tab[i] = 0;
    for (;;) {
      j = (j + 1) & kv->tab_mask;
      if (!kv->tab[j]) return;
      size_t k = slot_of(kv, kv->hash[kv->tab[j] - 1]);
      /* move tab[j] to i unless its home k lies cyclically in (i, j] */
      if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
      break;
    }
    kv->tab[i] = kv->tab[j];
    i = j;
  }
}

static void list_push(eldr__kv *kv, int which, int32_t b) {
  int32_t *head = which == LIST_FREE ? &kv->free_head : &kv->lru_head;
  int32_t *tail = which == LIST_FREE ? &kv->free_tail : &kv->lru_tail;
  kv->prev[b] = *tail;
  kv->next[b] = -1;
  if (*tail >= 0) kv->next[*tail] = b;
  else *head = b;
  *tail = b;
  kv->list[b] = (uint8_t)which;
  if (which == LIST_FREE) kv->n_free++;
  else kv->n_lru++;
}

static void list_unlink(eldr__kv *kv, int32_t b) {
  int which = kv->list[b];
  int32_t *head = which == LIST_FREE ? &kv->free_head : &kv->lru_head;
  int32_t *tail = which == LIST_FREE ? &kv->free_tail : &kv->lru_tail;
  if (kv->prev[b] >= 0) kv->next[kv->prev[b]] = kv->next[b];
  else *head = kv->next[b];
  if (kv->next[b] >= 0) kv->prev[kv->next[b]] = kv->prev[b];
  else *tail = kv->prev[b];
  kv->prev[b] = kv->next[b] = -1;
  kv->list[b] = LIST_NONE;
  if (which == LIST_FREE) kv->n_free--;
  else kv->n_lru--;
}

eldr__kv *eldr__kv_new(size_t n_blocks, const eldr_shape *shape) {
  if (n_blocks == 0 || n_blocks > (1u << 30)) return NULL;
  eldr__kv *kv = calloc(1, sizeof *kv);
  if (!kv) return NULL;
  kv->n = n_blocks;
  size_t tab = 16;
  while (tab < 2 * n_blocks) tab <<= 1;
  kv->tab_mask = tab - 1;
  kv->hash = calloc(n_blocks, sizeof *kv->hash);
  kv->hashed = calloc(n_blocks, 1);
  kv->list = calloc(n_blocks, 1);
  kv->ref = calloc(n_blocks, sizeof *kv->ref);
  kv->prev = malloc(n_blocks * sizeof *kv->prev);
  kv->next = malloc(n_blocks * sizeof *kv->next);
  kv->tab = calloc(tab, sizeof *kv->tab);
  if (!kv->hash || !kv->hashed || !kv->list || !kv->ref || !kv->prev || !kv->next || !kv->tab)
    goto fail;
  if (shape) {
    kv->sc = eldr_sigcache_new(shape, n_blocks);
    if (!kv->sc) goto fail;
  }
  kv->free_head = kv->free_tail = kv->lru_head = kv->lru_tail = -1;
  for (size_t b = 0; b < n_blocks; b++) list_push(kv, LIST_FREE, (int32_t)b);
  return kv;
fail:
  eldr__kv_free(kv);
  return NULL;
}

void eldr__kv_free(eldr__kv *kv) {
  if (!kv) return;
  eldr_sigcache_free(kv->sc);
  free(kv->tab);
  free(kv->next);
  free(kv->prev);
  free(kv->ref);
  free(kv->list);
  free(kv->hashed);
  free(kv->hash);
  free(kv);
}

size_t eldr__kv_match(const eldr__kv *kv, const uint64_t *hashes, size_t n) {
  size_t i = 0;
  while (i < n && tab_find(kv, hashes[i]) >= 0) i++;
  return i;
}

size_t eldr__kv_free_blocks(const eldr__kv *kv) { return kv->n_free + kv->n_lru; }

static void evict(eldr__kv *kv, int32_t b) {
  tab_remove(kv, b);
  if (kv->sc) (void)eldr_sigcache_remove(kv->sc, kv->hash[b]);
  kv->hashed[b] = 0;
  kv->evictions++;
}

int eldr__kv_alloc(eldr__kv *kv, const uint64_t *hashes, size_t hit, size_t total,
                   int32_t *ids) {
  if (hit > total) return ELDR_EINVAL;
  size_t hit_idle = 0;
  for (size_t i = 0; i < hit; i++) {
    int32_t b = tab_find(kv, hashes[i]);
    if (b < 0) return ELDR_EINVAL;
    if (kv->ref[b] == 0) hit_idle++;
  }
  if (total - hit > kv->n_free + kv->n_lru - hit_idle) return ELDR_EUNAVAIL;
  for (size_t i = 0; i < hit; i++) {
    int32_t b = tab_find(kv, hashes[i]);
    if (kv->ref[b]++ == 0) {
      list_unlink(kv, b);
      kv->n_used++;
    }
    ids[i] = b;
  }
  for (size_t i = hit; i < total; i++) {
    int32_t b;
    if (kv->free_head >= 0) {
      b = kv->free_head;
      list_unlink(kv, b);
    } else {
      b = kv->lru_head;
      list_unlink(kv, b);
      evict(kv, b);
    }
    kv->ref[b] = 1;
    kv->n_used++;
    ids[i] = b;
  }
  return 0;
}

void eldr__kv_register(eldr__kv *kv, const int32_t *ids, const uint64_t *hashes, size_t from,
                       size_t n, const uint32_t *rows, size_t row_stride) {
  for (size_t i = from; i < n; i++) {
    int32_t b = ids[i];
    if (kv->hashed[b] || tab_find(kv, hashes[i]) >= 0) continue;
    kv->hash[b] = hashes[i];
    kv->hashed[b] = 1;
    tab_insert(kv, b);
    if (kv->sc && rows) (void)eldr_sigcache_put(kv->sc, hashes[i], rows + (i - from) * row_stride);
  }
}

void eldr__kv_release(eldr__kv *kv, const int32_t *ids, size_t n) {
  /* last block first, so that (like vLLM) a sequence's tail is evicted
   * before its prefix, which other requests are more likely to share */
  for (size_t i = n; i-- > 0;) {
    int32_t b = ids[i];
    if (b < 0 || (size_t)b >= kv->n || kv->ref[b] == 0) continue;
    if (--kv->ref[b] == 0) {
      kv->n_used--;
      list_push(kv, kv->hashed[b] ? LIST_LRU : LIST_FREE, b);
    }
  }
}

size_t eldr__kv_used(const eldr__kv *kv) { return kv->n_used; }
size_t eldr__kv_total(const eldr__kv *kv) { return kv->n; }
uint64_t eldr__kv_evictions(const eldr__kv *kv) { return kv->evictions; }
eldr_sigcache *eldr__kv_sigcache(eldr__kv *kv) { return kv->sc; }
