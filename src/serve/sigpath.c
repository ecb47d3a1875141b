/* sigpath.c — the router's signature extraction: base64 npy routed_experts
 * decoded once into reusable scratch, counted, completed from the
 * block-granular signature cache for prefix-cached tokens, built into a
 * unit signature. Shared by the server and `eldr bench route`. */
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

static int grow(void **p, size_t *cap, size_t n, size_t elem) {
  if (n <= *cap) return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < n) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return -1;
  *p = q;
  *cap = c;
  return 0;
}

/* Tokens and block hashes of the prompt into ctx; returns the block count
 * (0 on allocation failure) and the token count in *ntok. */
static size_t prompt_blocks(eldr__sigctx *c, const char *text, size_t text_len,
                            const uint32_t *ids, size_t n, size_t *ntok) {
  if (!ids) {
    n = eldr_tokenize(text, text_len, NULL, 0);
    if (grow((void **)&c->ids, &c->idscap, n + 1, sizeof *c->ids)) return 0;
    eldr_tokenize(text, text_len, c->ids, n);
    ids = c->ids;
  }
  *ntok = n;
  if (grow((void **)&c->hashes, &c->hashcap, n / ELDR_BLOCK_TOKENS + 1, sizeof *c->hashes)) return 0;
  return eldr_block_hashes(ids, n, 0, c->hashes);
}

void eldr__sig_extract(eldr__sigctx *c, const char *b64, size_t b64_len, int64_t prompt_tokens,
                       const char *text, size_t text_len, const uint32_t *ids, size_t n_ids,
                       eldr__sigres *res) {
  memset(res, 0, sizeof *res);
  res->fallback = ELDR__FB_NONE;
  if (!c->shape) {
    res->fallback = ELDR__FB_NO_ARTIFACT;
    return;
  }
  if (!b64) {
    res->fallback = ELDR__FB_NO_ROUTED_EXPERTS;
    return;
  }
  const eldr_shape *sh = c->shape;
  eldr__npy_view *v = &res->view;
  if (eldr__routed_experts_view(b64, b64_len, NULL, &c->npy, &c->npycap, v, &res->diag) != 0) {
    res->fallback = ELDR__FB_MALFORMED;
    return;
  }
  c->observed_L = (int)v->layers;
  c->observed_K = (int)v->top_k;
  if (v->layers != sh->num_layers || v->top_k != sh->top_k) {
    eldr_diag_fail(&res->diag, ELDR_ESHAPE,
                   "routed_experts are %zu layers x top-%zu but the artifact is %u x top-%u",
                   v->layers, v->top_k, sh->num_layers, sh->top_k);
    res->fallback = ELDR__FB_SHAPE_MISMATCH;
    return;
  }
  memset(c->counts, 0, eldr_shape_cells(sh) * sizeof *c->counts);
  size_t bad = 0;
  /* only the layers of the artifact's mask enter the signature (NULL when
   * that is every layer: the unmasked loop is the faster one) */
  const uint8_t *mask = c->spec.mask;
  if (mask) {
    size_t l = 0;
    while (l < sh->num_layers && mask[l]) l++;
    if (l == sh->num_layers) mask = NULL;
  }
  if (eldr_counts_accumulate_masked(sh, v->data, v->dtype, v->rows, mask, c->counts, &bad) != 0) {
    eldr_diag_fail(&res->diag, ELDR_ERANGE, "routed_experts: expert id out of range at element %zu", bad);
    res->fallback = ELDR__FB_MALFORMED;
    return;
  }
  size_t P = prompt_tokens >= 0 ? (size_t)prompt_tokens : v->rows;
  size_t first = P > v->rows ? P - v->rows : 0;
  res->first_token = first;
  if (c->cache) {
    size_t ntok = 0;
    size_t nb = prompt_blocks(c, text, text_len, ids, n_ids, &ntok);
    if (ntok != P) {
      c->tokenizer_mismatch++;
    } else {
      res->nblocks = nb;
      if (first > 0) c->blocks_missing += eldr_sigcache_add_blocks(c->cache, c->hashes, first / ELDR_BLOCK_TOKENS, c->counts);
      if (first % ELDR_BLOCK_TOKENS) c->blocks_missing++;
    }
  } else if (first > 0) {
    c->blocks_missing += (first + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  }
  if (eldr_signature_build(&c->spec, c->counts, NULL, c->sig) != 0) {
    res->fallback = ELDR__FB_EMPTY_SIGNATURE;
    return;
  }
  res->sig = c->sig;
}

void eldr__sig_store(eldr__sigctx *c, const eldr__sigres *res) {
  if (!c->cache || res->nblocks == 0 || res->fallback != ELDR__FB_NONE) return;
  eldr_sigcache_store_blocks(c->cache, c->hashes, res->nblocks, res->first_token, res->view.data,
                             res->view.dtype, res->view.rows, c->scratch, NULL);
}

void eldr__sigctx_free_scratch(eldr__sigctx *c) {
  free(c->npy);
  free(c->ids);
  free(c->hashes);
  c->npy = NULL;
  c->ids = NULL;
  c->hashes = NULL;
  c->npycap = c->idscap = c->hashcap = 0;
}
