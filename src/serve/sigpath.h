/* sigpath.h — the router's signature path, one owner from prompt to cache
 * store (serve-private; also used by `eldr bench route`, which measures the
 * server's own code):
 *
 *   eldr__prompt_init     at request arrival: the prompt tokenised once, its
 *                         block hashes and prefix hash (the request owns them)
 *   eldr__sigpath_extract after the prefill: routed_experts of the reply's
 *                         bytes read in any layout vLLM ships, without a
 *                         JSON tree (eldr_reply_experts_scan: the base64
 *                         text handed to the codec where it lies), into reused
 *                         buffers, counted over the artifact's layer mask in
 *                         the pass that range-checks them, completed from the
 *                         signature cache for prefix-cached blocks, built
 *                         into a unit signature
 *   eldr__sigpath_defer   the rows of the blocks this prefill computed are
 *                         stored in the cache once the decode leg is on its
 *                         way: on the next loop turn, every pending store in
 *                         one batch. An extraction decodes into the last
 *                         slot again once its store ran (warm buffers),
 *                         else into the next of ELDR__SIG_RING slots, so up
 *                         to that many stores wait without delaying a
 *                         request; only when the ring is full does an
 *                         extraction store the oldest first (counted in
 *                         stores_inline).
 *
 * Configuration (artifact, cache) is built off to the side with
 * eldr__sigconf_build and swapped in with eldr__sigpath_commit (cannot fail),
 * so a reload replaces all of it or none.
 *
 * The cache (eldr/sigshard.h: sharded, one mutex per shard) is shared by
 * every sigpath given the same eldr__sigshare (the router's loops): a
 * build takes the cache committed last by any of them when it fits the
 * artifact's shape, layer mask and row count, else makes a new one, which
 * its commit then offers to the others. Stores (deferred or inline) and
 * lookups go to that one cache, so a prefix stored through one loop is
 * found by every other.
 *
 * Ownership: eldr__sigpath owns its buffers (per ring slot: the decoded
 * routed_experts, the reply's views, the block hashes; token ids), the
 * committed configuration's buffers, one reference on its cache, and its
 * timer. A slot's
 * decode buffers are kept for the next reply up to ELDR__SIG_KEEP bytes
 * each (larger ones are freed once stored); the artifact is borrowed (the server owns it and
 * swaps it together with the configuration). eldr__sigpath_free releases
 * everything. Errors: extraction never fails, it reports a fallback reason.
 * Threads: not thread-safe; its loop's thread only, except the _Atomic
 * counters, which any loop reads, and the cache, which is thread-safe. An
 * eldr__sigshare is locked by its own mutex (any thread).
 */
#ifndef ELDR_SERVE_SIGPATH_H
#define ELDR_SERVE_SIGPATH_H

#include <event2/event.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact.h"
#include "eldr/error.h"
#include "eldr/predict.h"
#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"
#include "eldr/sigshard.h"
#include "eldr/signature.h"

/* Why a request's decode decision fell back to load-only routing. */
typedef enum eldr__fallback {
  ELDR__FB_NONE = -1,
  ELDR__FB_NO_ROUTED_EXPERTS = 0,
  ELDR__FB_MALFORMED,
  ELDR__FB_NO_ARTIFACT,
  ELDR__FB_SHAPE_MISMATCH,
  ELDR__FB_EMPTY_SIGNATURE,
  ELDR__FB__COUNT
} eldr__fallback;

/* A request's prompt, as blocks: tokenised once at arrival. The hash
 * buffer is kept from prompt to prompt (eldr__prompt_init reuses it), so a
 * pooled request hashes a prompt without allocating once warm. */
typedef struct eldr__prompt {
  size_t ntok;          /* tokens */
  uint64_t *hashes;     /* owned: block hashes of the full blocks (grown, kept) */
  size_t hashcap;       /* hashes' capacity, in blocks */
  size_t nblocks;
  uint64_t prefix_hash; /* first block's hash; a hash of the text/ids when shorter */
} eldr__prompt;

/* The artifact-dependent part, built off to the side. */
typedef struct eldr__sigconf {
  const eldr_artifact *art; /* borrowed; NULL = no artifact */
  eldr_sigshard *cache;     /* a reference; NULL = no cache */
  uint32_t *counts, *scratch; /* L*E each */
  float *sig;               /* signature dim */
} eldr__sigconf;

/* One extraction's result, valid until the next extraction. */
typedef struct eldr__sigres {
  int fallback;         /* eldr__fallback */
  const float *sig;     /* the signature, or NULL on fallback */
  int reason;           /* eldr_re_reason of a MALFORMED / SHAPE_MISMATCH reply */
  const uint32_t *counts; /* the L*E selection counts behind sig (mask layers only), or NULL */
  uint32_t n_tokens;    /* prompt tokens those counts cover (rows + cached blocks) */
  eldr_re_view view;    /* the computed prompt rows (valid until its slot is reused); its
                           first_token: the prompt position of its first row (the
                           compact form: of the first token counted, no rows) */
  size_t nblocks;       /* prompt blocks usable for the cache (0: cache unusable) */
  const uint64_t *hashes; /* their hashes (the slot's copy: the store may run after
                             the request is gone) */
  const eldr_count_planes *planes; /* the blocks' bit planes the count kept (the
                                      slot's), or NULL: the store converts, not recounts */
  eldr_diag diag;       /* why, for MALFORMED / SHAPE_MISMATCH */
} eldr__sigres;

#define ELDR__SIG_RING 4                 /* extractions whose store may wait */
#define ELDR__SIG_KEEP ((size_t)8 << 20) /* decode bytes a slot keeps between replies */
#define ELDR__IDS_KEEP ((size_t)1 << 20) /* token-id bytes a sigpath keeps between prompts (256 Ki
                                          * ids); a larger prompt's are freed once hashed */

/* One extraction's buffers, kept until its store ran. */
typedef struct eldr__sigslot {
  eldr_re_scratch scr;    /* decoded routed_experts (reused) */
  eldr_reply_experts rex; /* the reply's views into scr */
  uint64_t *hashes;       /* the prompt's block hashes (grown) */
  size_t hashcap;
  uint8_t *sgl;           /* SGLang's routed experts decoded (grown; kept up to ELDR__SIG_KEEP) */
  size_t sglcap;
  eldr_count_planes planes; /* its buf: the counted blocks' planes (grown; kept up
                             * to ELDR__SIG_KEEP / 2 bytes) */
  eldr__sigres res;       /* what the deferred store needs */
  int pending;            /* a store waits for the loop */
} eldr__sigslot;

/* The cache the sigpaths of a group share: the one committed last. */
typedef struct eldr__sigshare {
  pthread_mutex_t mu;
  eldr_sigshard *cache; /* a reference, or NULL */
} eldr__sigshare;
/* 0 or ELDR_ENOMEM. _free drops the reference. */
int eldr__sigshare_init(eldr__sigshare *sh);
void eldr__sigshare_free(eldr__sigshare *sh);

typedef struct eldr__sigpath {
  eldr__sigconf conf;        /* committed */
  eldr_sigspec spec;         /* of conf.art */
  eldr__sigslot ring[ELDR__SIG_RING];
  unsigned cur;              /* slot of the last extraction */
  uint32_t *ids;             /* token ids of the prompt being tokenised (grown; kept
                              * up to ELDR__IDS_KEEP bytes) */
  size_t idscap;
  struct event *ev_store;    /* NULL without a loop: stores wait until their slot is reused */
  eldr__sigshare *share;     /* borrowed; NULL: the cache is this sigpath's alone */
  /* observations */
  _Atomic int observed_L, observed_K; /* routed_experts seen last: layer rows as sent (the
                                       * all-layers form: every hidden layer) and top-k (0:
                                       * none yet);
                                       * any loop's reload checks every loop's */
  _Atomic uint64_t tokenizer_mismatch, blocks_missing; /* read by any loop's /metrics */
  uint64_t stores_deferred;  /* stores run by the loop, after the decode leg left */
  uint64_t stores_inline;    /* stores run by an extraction (the ring was full) */
  uint64_t compact_reads;    /* signatures from the compact form (eldr/reply_compact.h) */
} eldr__sigpath;

/* base: the loop whose next turn runs deferred stores (NULL: none). 0 or
 * ELDR_ENOMEM. */
int eldr__sigpath_init(eldr__sigpath *sp, struct event_base *base);
void eldr__sigpath_free(eldr__sigpath *sp);

/* The signature cache's rows for artifact a (NULL: 0): at most rows, and
 * what fits in mb MiB, each row the artifact's masked layers x experts
 * bytes plus ELDR_SIGCACHE_ROW_OVERHEAD (0 when either is 0). */
size_t eldr__sigcache_capacity(const eldr_artifact *a, size_t rows, size_t mb);
/* Build the configuration for artifact a (NULL: none) with a cache of
 * cache_rows blocks (0: none). The shared cache (sp->share), else the
 * running one, is kept when it fits a's shape and layer mask and holds
 * cache_rows rows. 0 or ELDR_ENOMEM (with d); on error nothing is left
 * allocated. */
int eldr__sigconf_build(const eldr__sigpath *sp, const eldr_artifact *a, size_t cache_rows,
                        eldr__sigconf *out, eldr_diag *d);
/* Drop a built configuration that was not committed. */
void eldr__sigconf_drop(const eldr__sigpath *sp, eldr__sigconf *c);
/* Swap c in (cannot fail); the previous configuration is freed and a
 * pending store of its shape dropped; c's cache becomes the shared one.
 * c is emptied. */
void eldr__sigpath_commit(eldr__sigpath *sp, eldr__sigconf *c);

/* Tokenise (when ids is NULL) and hash the prompt: 0 or ELDR_ENOMEM (the
 * prompt then has no blocks). p: zeroed, or a prompt filled before, whose
 * hash buffer is reused (grown when the prompt has more blocks). */
int eldr__prompt_init(eldr__sigpath *sp, eldr__prompt *p, const char *text, size_t text_len,
                      const uint32_t *ids, size_t n_ids);
/* Release the hash buffer; p is zeroed. */
void eldr__prompt_free(eldr__prompt *p);

/* Signature of a prefill reply's prompt rows: body[0..len) is the reply's
 * text, one eldr_js_scan accepted (borrowed, read in place without a tree
 * and not validated again: eldr_reply_experts_scanned), or, with body NULL,
 * root the reply parsed once (a json_t *, borrowed; both NULL: no reply;
 * the router passes the tree only for a reply it parsed anyway: recording,
 * prompt_logprobs, a NUL byte), read in every layout
 * (eldr/reply_experts.h) against the artifact's shape, experts and layer
 * mask; chat: the reply of /v1/chat/completions. p: the request's prompt
 * (NULL: the cache is not used). Runs a pending store first. A rejected
 * reply gives fallback MALFORMED or SHAPE_MISMATCH with res->reason.
 * blob, blob_len (optional, NULL: none): a string of body, quotes excluded,
 * that the scan which accepted body found (eldr_reply_prefill's
 * routed_experts): its end is taken from here, not searched again.
 * compact (type NONE: none): the span of body's
 * kv_transfer_params.eldr_expert_counts (eldr/reply_compact.h): when
 * present, the engine's counts are read instead of any rows (the artifact's
 * masked layers, by layer id), completed from the cache for the prefix
 * they skip; nothing is stored in the cache (no per-block rows). */
void eldr__sigpath_extract(eldr__sigpath *sp, const char *body, size_t len, const void *root, int chat,
                           const char *blob, size_t blob_len, eldr_js_span compact, const eldr__prompt *p,
                           eldr__sigres *res);
/* The same for an SGLang prefill's reply (OpenAI form, read without a
 * tree): its "sglext": {"routed_experts": base64 int32 (prompt tokens,
 * hidden layers, top_k)} (eldr/reply_sglang.h), the rows usage's
 * prompt_tokens, the artifact's MoE layers read by layer id and checked
 * over its mask. res as eldr__sigpath_extract gives it: the whole prompt's
 * rows (first_token 0), so the blocks it computed can be stored (defer).
 * A reply without them: NO_ROUTED_EXPERTS; a bad one MALFORMED (or
 * SHAPE_MISMATCH) with the reason. */
void eldr__sigpath_extract_sglang(eldr__sigpath *sp, const char *body, size_t len, const eldr__prompt *p,
                                  eldr__sigres *res);
/* At arrival, before any leg (a flow that picks the decoder before the
 * prefill runs: SGLang's prefill/decode, docs/sglang.md): the prompt's
 * signature predicted from the signature cache (eldr/predict.h: the rows
 * of the prompt's blocks the cache holds, the share of its tokens they
 * cover as the confidence). *pred receives the prediction (zero without
 * an artifact or a cache). Returns 1 when eldr_predict_usable(confidence,
 * known tokens, threshold) and its signature could be built: res as an
 * extraction gives it (fallback NONE, counts of the held blocks, n_tokens
 * the tokens they cover, sig; no rows to store: nblocks 0). Else 0 and
 * res->sig NULL (res->fallback NO_ARTIFACT without an artifact or a cache,
 * EMPTY_SIGNATURE when the counts gave none, NO_ROUTED_EXPERTS below the
 * threshold: no signature at arrival); the caller says which in its
 * decision reason. Valid until the next extraction or prediction; the
 * held blocks count as the cache's hits. */
int eldr__sigpath_predict(eldr__sigpath *sp, const eldr__prompt *p, double threshold, eldr__sigres *res,
                          eldr_prediction *pred);
/* Store the rows of the fully computed blocks of an extraction now (res:
 * the last extraction's, or one whose slot was not reused since). */
void eldr__sigpath_store(eldr__sigpath *sp, const eldr__sigres *res);
/* The same for the last extraction, on the next loop turn (batched with any
 * other pending store), or when its slot comes round again. */
void eldr__sigpath_defer(eldr__sigpath *sp, const eldr__sigres *res);
/* Run every pending store now (the loop's deferred event does this). */
void eldr__sigpath_flush(eldr__sigpath *sp);

#endif
