/* sigpath.c — the router's signature path (sigpath.h): prompt blocks at
 * arrival, routed_experts decoded once into a ring slot's reused buffers
 * and counted in the pass that range-checks them, completed from the
 * block-granular signature cache for prefix-cached tokens, built into a
 * unit signature; the computed blocks' rows stored back by the loop once
 * the decode leg is on its way. Shared by the server and `eldr bench route`. */
#include "sigpath.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "eldr/grow.h"
#include "eldr/jscan.h"
#include "eldr/reply_compact.h"
#include "eldr/reply_sglang.h"
#include "eldr/trace_model.h"

/* Run a slot's pending store; its large buffers go back to the system. */
static void slot_store(eldr__sigpath *sp, eldr__sigslot *sl) {
  if (!sl->pending) return;
  sl->pending = 0;
  eldr__sigpath_store(sp, &sl->res);
  eldr_re_scratch_trim(&sl->scr, ELDR__SIG_KEEP);
  if (sl->sglcap > ELDR__SIG_KEEP) {
    free(sl->sgl);
    sl->sgl = NULL;
    sl->sglcap = 0;
  }
  if (sl->planes.cap > ELDR__SIG_KEEP / 2) {
    free(sl->planes.buf);
    sl->planes = (eldr_count_planes){0};
  }
}

void eldr__sigpath_flush(eldr__sigpath *sp) {
  for (unsigned i = 1; i <= ELDR__SIG_RING; i++) { /* oldest first */
    eldr__sigslot *sl = &sp->ring[(sp->cur + i) % ELDR__SIG_RING];
    if (sl->pending) sp->stores_deferred++;
    slot_store(sp, sl);
  }
}

static void store_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr__sigpath_flush(arg);
}

int eldr__sigpath_init(eldr__sigpath *sp, struct event_base *base) {
  memset(sp, 0, sizeof *sp);
  if (base && !(sp->ev_store = evtimer_new(base, store_cb, sp))) return ELDR_ENOMEM;
  return 0;
}

int eldr__sigshare_init(eldr__sigshare *sh) {
  sh->cache = NULL;
  return pthread_mutex_init(&sh->mu, NULL) ? ELDR_ENOMEM : 0;
}

void eldr__sigshare_free(eldr__sigshare *sh) {
  eldr_sigshard_free(sh->cache);
  sh->cache = NULL;
  pthread_mutex_destroy(&sh->mu);
}

static void conf_free(eldr__sigconf *c) {
  eldr_sigshard_free(c->cache);
  free(c->counts);
  free(c->scratch);
  free(c->sig);
  memset(c, 0, sizeof *c);
}

void eldr__sigpath_free(eldr__sigpath *sp) {
  if (!sp) return;
  if (sp->ev_store) event_free(sp->ev_store);
  conf_free(&sp->conf);
  for (unsigned i = 0; i < ELDR__SIG_RING; i++) {
    eldr_reply_experts_free(&sp->ring[i].rex);
    eldr_re_scratch_free(&sp->ring[i].scr);
    free(sp->ring[i].hashes);
    free(sp->ring[i].sgl);
    free(sp->ring[i].planes.buf);
  }
  free(sp->ids);
  memset(sp, 0, sizeof *sp);
}

size_t eldr__sigcache_capacity(const eldr_artifact *a, size_t rows, size_t mb) {
  if (!a || !rows || !mb) return 0;
  size_t fit = eldr_sigcache_capacity_for(&a->shape, a->mask, mb << 20);
  return fit < rows ? fit : rows;
}

int eldr__sigconf_build(const eldr__sigpath *sp, const eldr_artifact *a, size_t cache_rows,
                        eldr__sigconf *out, eldr_diag *d) {
  memset(out, 0, sizeof *out);
  out->art = a;
  if (!a) return 0;
  size_t cells = eldr_shape_cells(&a->shape);
  out->counts = malloc(cells * sizeof *out->counts);
  out->scratch = malloc(cells * sizeof *out->scratch);
  out->sig = malloc((a->dim ? a->dim : 1) * sizeof *out->sig);
  if (cache_rows) {
    /* rows hold the masked layers only: keep them while shape and mask stay;
     * the one the other loops use first */
    if (sp->share) {
      pthread_mutex_lock(&sp->share->mu);
      if (eldr_sigshard_fits(sp->share->cache, &a->shape, a->mask, cache_rows))
        out->cache = eldr_sigshard_ref(sp->share->cache);
      pthread_mutex_unlock(&sp->share->mu);
    }
    if (!out->cache && eldr_sigshard_fits(sp->conf.cache, &a->shape, a->mask, cache_rows))
      out->cache = eldr_sigshard_ref(sp->conf.cache);
    if (!out->cache)
      out->cache = eldr_sigshard_new(&a->shape, cache_rows, eldr_sigshard_count_for(cache_rows), a->mask);
  }
  if (!out->counts || !out->scratch || !out->sig || (cache_rows && !out->cache)) {
    conf_free(out);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the artifact's buffers");
  }
  return 0;
}

void eldr__sigconf_drop(const eldr__sigpath *sp, eldr__sigconf *c) {
  (void)sp;
  conf_free(c);
}

void eldr__sigpath_commit(eldr__sigpath *sp, eldr__sigconf *c) {
  for (unsigned i = 0; i < ELDR__SIG_RING; i++) sp->ring[i].pending = 0; /* rows of the old shape: drop */
  conf_free(&sp->conf);
  sp->conf = *c;
  memset(c, 0, sizeof *c);
  if (sp->share) { /* offered to the other loops' next build */
    pthread_mutex_lock(&sp->share->mu);
    if (sp->share->cache != sp->conf.cache) {
      eldr_sigshard_free(sp->share->cache);
      sp->share->cache = eldr_sigshard_ref(sp->conf.cache);
    }
    pthread_mutex_unlock(&sp->share->mu);
  }
  memset(&sp->spec, 0, sizeof sp->spec);
  if (sp->conf.art) eldr_artifact_sigspec(sp->conf.art, &sp->spec);
}

int eldr__prompt_init(eldr__sigpath *sp, eldr__prompt *p, const char *text, size_t text_len,
                      const uint32_t *ids, size_t n) {
  p->ntok = 0;
  p->nblocks = 0;
  p->prefix_hash = 0;
  int rc = 0;
  if (!ids) { /* a text has at most one token per byte: one pass takes them all */
    if (eldr_grow(&sp->ids, &sp->idscap, text_len + 1, sizeof *sp->ids, 1024)) return ELDR_ENOMEM;
    n = eldr_tokenize(text, text_len, sp->ids, text_len);
    ids = sp->ids;
  }
  size_t nb = n / ELDR_BLOCK_TOKENS;
  if (nb) {
    if (eldr_grow_array(p->hashes, p->hashcap, nb)) {
      rc = ELDR_ENOMEM;
      goto out;
    }
    p->nblocks = eldr_block_hashes(ids, n, ELDR_BLOCK_HASH_SEED, p->hashes);
    p->prefix_hash = p->hashes[0];
  } else if (ids == sp->ids) {
    p->prefix_hash = XXH64(text, text_len, 0);
  } else {
    p->prefix_hash = XXH64(ids, n * sizeof *ids, 0);
  }
  p->ntok = n;
out:
  /* a large prompt's ids go: the loop keeps no more than ELDR__IDS_KEEP */
  if (sp->idscap * sizeof *sp->ids > ELDR__IDS_KEEP) {
    free(sp->ids);
    sp->ids = NULL;
    sp->idscap = 0;
  }
  return rc;
}

void eldr__prompt_free(eldr__prompt *p) {
  if (!p) return;
  free(p->hashes);
  memset(p, 0, sizeof *p);
}

/* The reply's routed_experts: its bytes (the scanner accepted them when the
 * reply was read: eldr_reply_prefill_read) by the span reader, else its tree. */
static int read_reply(const char *body, size_t len, const void *root, const eldr_re_opts *o, eldr_js_span known,
                      eldr_reply_experts *r, eldr_re_reason *why, eldr_diag *d) {
  return body ? eldr_reply_experts_scanned(body, len, o, known, r, why, d)
              : eldr_reply_experts_from_json(root, o, r, why, d);
}

/* The shape of a reply the artifact does not fit, for the reload check. */
static void observe_shape(eldr__sigpath *sp, const char *body, size_t len, const void *root, eldr_re_api api) {
  eldr_re_opts any = {.api = api};
  eldr_reply_experts r;
  if (read_reply(body, len, root, &any, (eldr_js_span){0, 0, ELDR_JS_NONE}, &r, NULL, NULL) == 0 && r.nchoices) {
    const eldr_re_view *v = r.choices[0].prompt.data ? &r.choices[0].prompt : &r.choices[0].generated;
    if (v->data) {
      sp->observed_L = (int)r.array_layers; /* as sent: the all-layers form's every row */
      sp->observed_K = (int)v->top_k;
    }
  }
  eldr_reply_experts_free(&r);
}

/* The slot's planes buffer sized for nblocks blocks of the mask's layers
 * (a shape the bit-sliced kernel counts; else nothing to keep: -1). */
static int slot_planes(eldr__sigslot *sl, const eldr_shape *sh, const uint8_t *mask, size_t nblocks) {
  if (sh->top_k != 8 || sh->num_experts > 128) return -1;
  size_t nl = 0;
  for (size_t l = 0; l < sh->num_layers; l++) nl += !mask || mask[l];
  const size_t need = nblocks * (nl / 4) * ELDR_PLANES_GROUP_BYTES;
  if (!need) return -1;
  if (sl->planes.cap < need) {
    unsigned char *b = realloc(sl->planes.buf, need);
    if (!b) return -1;
    sl->planes.buf = b;
    sl->planes.cap = need;
  }
  sl->planes.nblocks = 0;
  return 0;
}

/* The counts of prompt tokens [first, first + rows) are in c->counts: the
 * prefix-cached blocks before first completed from the signature cache,
 * then the signature. rows_stored: the view holds those rows (their blocks
 * go to the cache); else nothing is stored (the compact form). */
static void complete_and_sign(eldr__sigpath *sp, eldr__sigslot *sl, eldr__sigres *res, const eldr__prompt *p,
                              size_t first, size_t rows, size_t held, int rows_stored) {
  const eldr__sigconf *c = &sp->conf;
  size_t P = first + rows;
  res->view.first_token = first;
  size_t covered = rows;
  if (c->cache && p) {
    if (p->ntok != P) {
      sp->tokenizer_mismatch++;
    } else if (eldr_grow(&sl->hashes, &sl->hashcap, p->nblocks + 1, sizeof *sl->hashes, 1024) == 0) {
      /* the store may run after the request is gone: keep the hashes here */
      if (p->nblocks) memcpy(sl->hashes, p->hashes, p->nblocks * sizeof *sl->hashes);
      res->nblocks = rows_stored ? p->nblocks : 0;
      res->hashes = sl->hashes;
      /* blocks before the reply's rows: the `held` ones added before the
       * reply was read, then the rest the engine did not send (its prefix
       * cache) */
      size_t need = first / ELDR_BLOCK_TOKENS;
      covered += held * ELDR_BLOCK_TOKENS;
      if (need > held) {
        size_t miss = eldr_sigshard_add_blocks(c->cache, sl->hashes + held, need - held, c->counts);
        sp->blocks_missing += miss;
        covered += (need - held - miss) * ELDR_BLOCK_TOKENS;
      }
      if (first % ELDR_BLOCK_TOKENS) sp->blocks_missing++;
    }
  } else if (first > 0) {
    sp->blocks_missing += (first + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  }
  res->counts = c->counts;
  res->n_tokens = covered > UINT32_MAX ? UINT32_MAX : (uint32_t)covered;
  if (eldr_signature_build(&sp->spec, c->counts, NULL, c->sig) != 0) {
    res->fallback = ELDR__FB_EMPTY_SIGNATURE;
    return;
  }
  res->sig = c->sig;
}

/* The compact form (eldr/reply_compact.h): the engine's counts, the
 * artifact's masked layers read by layer id. */
static void extract_compact(eldr__sigpath *sp, eldr__sigslot *sl, const char *body, eldr_js_span compact,
                            const eldr__prompt *p, eldr__sigres *res) {
  const eldr__sigconf *c = &sp->conf;
  const eldr_shape *sh = &c->art->shape;
  eldr_compact_opts co = {sh->num_layers, c->art->layer_ids, sh->num_experts, sh->top_k, c->art->mask};
  eldr_compact_info ci;
  eldr_re_reason why = ELDR_RE_OK;
  if (eldr_compact_read(body, compact, &co, c->counts, NULL, &ci, &why, &res->diag)) {
    res->reason = (int)why;
    res->fallback = why == ELDR_RE_SHAPE_MISMATCH ? ELDR__FB_SHAPE_MISMATCH : ELDR__FB_MALFORMED;
    return;
  }
  sp->compact_reads++;
  complete_and_sign(sp, sl, res, p, ci.first_token, ci.tokens, 0, 0);
}

void eldr__sigpath_extract(eldr__sigpath *sp, const char *body, size_t len, const void *root, int chat,
                           const char *blob, size_t blob_len, eldr_js_span compact, const eldr__prompt *p,
                           eldr__sigres *res) {
  /* the current slot again when its store has run (its decode buffer is
   * still in the cache: a reply of megabytes decodes into warm lines), else
   * the next: its store (if the loop has not run it yet) needs the buffers
   * this extraction reuses */
  if (sp->ring[sp->cur].pending) sp->cur = (sp->cur + 1) % ELDR__SIG_RING;
  eldr__sigslot *sl = &sp->ring[sp->cur];
  if (sl->pending) sp->stores_inline++;
  slot_store(sp, sl);
  eldr_reply_experts_free(&sl->rex);
  memset(res, 0, sizeof *res);
  res->fallback = ELDR__FB_NONE;
  const eldr__sigconf *c = &sp->conf;
  if (!c->art) {
    res->fallback = ELDR__FB_NO_ARTIFACT;
    return;
  }
  if (!body && !root) {
    res->fallback = ELDR__FB_NO_ROUTED_EXPERTS;
    return;
  }
  const eldr_shape *sh = &c->art->shape;
  /* counted by the reader in the pass that range-checks the prompt rows,
   * over the artifact's layer mask */
  memset(c->counts, 0, eldr_shape_cells(sh) * sizeof *c->counts);
  if (body && compact.type == ELDR_JS_OBJECT && compact.off + compact.len <= len) { /* counted by the engine */
    extract_compact(sp, sl, body, compact, p, res);
    return;
  }
  /* the artifact's layer ids map an all-layers array onto its MoE layers */
  eldr_re_opts o = {chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, sh->num_layers, sh->top_k, sh->num_experts,
                    c->art->mask, &sl->scr, c->counts, c->art->layer_ids, 0, NULL};
  /* a prompt whose blocks go to the cache: the count keeps their planes,
   * so that the store converts them instead of counting the rows again */
  if (c->cache && p && p->nblocks && slot_planes(sl, sh, c->art->mask, p->nblocks) == 0) o.planes = &sl->planes;
  eldr_js_span known = {0, 0, ELDR_JS_NONE};
  if (body && blob && blob > body && blob + blob_len < body + len) /* its quotes within body */
    known = (eldr_js_span){(size_t)(blob - body) - 1, blob_len + 2, ELDR_JS_STRING};
  /* the prompt's leading blocks the cache holds (every block but the one
   * of the prompt's last token, which the reply must carry) are added now,
   * and their rows are not read from the reply (not even decoded): a
   * repeated prompt costs lookups and adds, not its megabytes again */
  size_t held = 0;
  if (c->cache && p && body && p->nblocks && p->ntok) {
    size_t lim = (p->ntok - 1) / ELDR_BLOCK_TOKENS;
    held = eldr_sigshard_add_prefix(c->cache, p->hashes, lim < p->nblocks ? lim : p->nblocks, c->counts,
                                    (uint8_t *)c->scratch); /* the store's scratch, free until the store */
  }
  eldr_re_reason why = ELDR_RE_OK;
  int rrc = held ? eldr_reply_experts_scanned_skip(body, len, &o, known, held * ELDR_BLOCK_TOKENS, &sl->rex, &why,
                                                   &res->diag)
                 : read_reply(body, len, root, &o, known, &sl->rex, &why, &res->diag);
  if (rrc == 0 && held && sl->rex.prompt_tokens != (int64_t)p->ntok) {
    /* the engine's prompt is not the one hashed (another tokenizer): the
     * rows added may be another prompt's; read the reply whole instead */
    eldr_reply_experts_free(&sl->rex);
    memset(c->counts, 0, eldr_shape_cells(sh) * sizeof *c->counts);
    held = 0;
    rrc = read_reply(body, len, root, &o, known, &sl->rex, &why, &res->diag);
  }
  if (rrc != 0) {
    res->reason = (int)why;
    if (why == ELDR_RE_SHAPE_MISMATCH) {
      observe_shape(sp, body, len, root, o.api); /* only on this fallback path */
      res->fallback = ELDR__FB_SHAPE_MISMATCH;
    } else {
      res->fallback = ELDR__FB_MALFORMED;
    }
    return;
  }
  const eldr_re_view *pv = sl->rex.nchoices ? &sl->rex.choices[0].prompt : NULL;
  if (!pv || !pv->data || !pv->rows || !sl->rex.counted) {
    res->fallback = ELDR__FB_NO_ROUTED_EXPERTS;
    return;
  }
  res->view = *pv;
  res->planes = o.planes && sl->planes.nblocks ? &sl->planes : NULL;
  sp->observed_L = (int)sl->rex.array_layers;
  sp->observed_K = (int)pv->top_k;
  complete_and_sign(sp, sl, res, p, pv->first_token, pv->rows, held, 1);
}

/* The slot an extraction decodes into (its pending store run first). */
static eldr__sigslot *take_slot(eldr__sigpath *sp) {
  if (sp->ring[sp->cur].pending) sp->cur = (sp->cur + 1) % ELDR__SIG_RING;
  eldr__sigslot *sl = &sp->ring[sp->cur];
  if (sl->pending) sp->stores_inline++;
  slot_store(sp, sl);
  eldr_reply_experts_free(&sl->rex);
  return sl;
}

void eldr__sigpath_extract_sglang(eldr__sigpath *sp, const char *body, size_t len, const eldr__prompt *p,
                                  eldr__sigres *res) {
  eldr__sigslot *sl = take_slot(sp);
  memset(res, 0, sizeof *res);
  const eldr__sigconf *c = &sp->conf;
  if (!c->art) {
    res->fallback = ELDR__FB_NO_ARTIFACT;
    return;
  }
  if (!body || !len) {
    res->fallback = ELDR__FB_NO_ROUTED_EXPERTS;
    return;
  }
  const eldr_shape *sh = &c->art->shape;
  memset(c->counts, 0, eldr_shape_cells(sh) * sizeof *c->counts);
  eldr_sglang_opts o = {0, sh->num_layers, c->art->layer_ids, sh->top_k, sh->num_experts, c->art->mask};
  uint32_t hidden = 0;
  size_t rows = 0;
  eldr_re_reason why = ELDR_RE_OK;
  int rc = eldr_sglang_reply_experts(body, len, &o, &sl->sgl, &sl->sglcap, &hidden, &rows, c->counts, &why,
                                     &res->diag);
  if (rc == 1 || (rc == 0 && !rows)) {
    res->fallback = ELDR__FB_NO_ROUTED_EXPERTS;
    return;
  }
  if (rc) {
    res->reason = (int)why;
    res->fallback = why == ELDR_RE_SHAPE_MISMATCH ? ELDR__FB_SHAPE_MISMATCH : ELDR__FB_MALFORMED;
    return;
  }
  res->fallback = ELDR__FB_NONE;
  res->view = (eldr_re_view){sl->sgl, ELDR_SEL_I32LE, rows, sh->num_layers, sh->top_k, 0};
  sp->observed_L = (int)hidden;
  sp->observed_K = (int)sh->top_k;
  complete_and_sign(sp, sl, res, p, 0, rows, 0, 1);
}

int eldr__sigpath_predict(eldr__sigpath *sp, const eldr__prompt *p, double threshold, eldr__sigres *res,
                          eldr_prediction *pred) {
  const eldr__sigconf *c = &sp->conf;
  memset(res, 0, sizeof *res);
  memset(pred, 0, sizeof *pred);
  res->fallback = ELDR__FB_NO_ARTIFACT;
  if (!c->art || !c->cache || !p) return 0;
  size_t cells = eldr_shape_cells(&c->art->shape);
  memset(c->counts, 0, cells * sizeof *c->counts);
  /* the store's scratch (L*E words) is free now and holds a cache row's bytes */
  memset(c->scratch, 0, cells * sizeof *c->scratch);
  uint32_t ntok = p->ntok > UINT32_MAX ? UINT32_MAX : (uint32_t)p->ntok;
  if (eldr_predict_from_cache(c->cache, p->hashes, p->nblocks, ntok, c->counts, (uint8_t *)c->scratch, pred))
    return 0;
  res->fallback = ELDR__FB_NO_ROUTED_EXPERTS;
  if (!eldr_predict_usable(pred->confidence, pred->known_tokens, threshold)) return 0;
  res->counts = c->counts;
  res->n_tokens = pred->known_tokens;
  if (eldr_signature_build(&sp->spec, c->counts, NULL, c->sig) != 0) {
    res->fallback = ELDR__FB_EMPTY_SIGNATURE;
    return 0;
  }
  res->fallback = ELDR__FB_NONE;
  res->sig = c->sig;
  return 1;
}

void eldr__sigpath_store(eldr__sigpath *sp, const eldr__sigres *res) {
  const eldr__sigconf *c = &sp->conf;
  if (!c->cache || res->nblocks == 0 || res->fallback != ELDR__FB_NONE) return;
  eldr_sigshard_store_planes(c->cache, res->hashes, res->nblocks, res->view.first_token, res->view.data,
                             res->view.dtype, res->view.rows, res->planes, c->scratch, NULL);
}

void eldr__sigpath_defer(eldr__sigpath *sp, const eldr__sigres *res) {
  if (!sp->conf.cache || res->nblocks == 0 || res->fallback != ELDR__FB_NONE) return;
  eldr__sigslot *sl = &sp->ring[sp->cur];
  sl->res = *res;
  sl->pending = 1;
  static const struct timeval zero = {0, 0};
  if (sp->ev_store) event_add(sp->ev_store, &zero);
}
