/* eldr/routebench.h — the router-side cost of one request (serve layer):
 * signature extraction plus the decode decision, measured on the code the
 * server runs (its signature path and eldr_policy_decode), for prompts of a
 * given token count on a model shape. `eldr bench route` prints it.
 *
 * Per prompt length, in one loop with the stages interleaved: the prefill
 * reply read by the scanner, the signature without and with a signature
 * cache (the store of a prompt's block rows, new and held; a later prompt
 * with a 75% prefix hit; a prompt the cache holds, whole path, the reply
 * with every row and with its last block only), the decision, and for comparison the reply read into a
 * jansson tree with the signature read from it, the signature with the
 * per-id counting kernels only, a memcpy of the reply's base64 blob
 * (the yardstick: about as disturbed by other load as the stages), and the
 * same prompt's compact form (eldr/reply_compact.h: the engine's counts in
 * kv_transfer_params) read and turned into the signature.
 *
 * Ownership: an eldr_routebench owns its artifact, policy and signature
 * paths; a result's stage names are static strings. Errors: ELDR_EINVAL (a
 * shape or option out of range), ELDR_ENOMEM, ELDR_EIO (an extraction fell
 * back or the cache missed a block: the measured path is not the one the
 * server takes). Threads: one bench per thread; it switches the process's
 * counting kernel (eldr_counts_bits_set) during a run, so nothing else may
 * count meanwhile. Each stage callgrind is to count alone runs in a
 * function of its own, never inlined (routebench.c: stage_sig,
 * stage_store_new, stage_store_held, stage_cached_all, stage_cached_last:
 * valgrind --tool=callgrind --toggle-collect=stage_store_new ...).
 */
#ifndef ELDR_ROUTEBENCH_H
#define ELDR_ROUTEBENCH_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"

typedef struct eldr_routebench_cfg {
  eldr_shape shape;     /* the model: layers, experts, top-k */
  uint32_t decoders;    /* decode workers = centroids (>= 1) */
  uint32_t mask_layers; /* layers in the artifact's mask, evenly spread (1..layers) */
  uint32_t iters;       /* timed repetitions per prompt length (>= 1; 5 warm-up rounds besides) */
  uint64_t seed;
  const uint32_t *layer_ids; /* the MoE layers' model layer ids (shape.num_layers entries; NULL: 0..L-1) */
  uint32_t hidden_layers;    /* rows a token has on the wire: vLLM's all-layers form sends one per
                                hidden layer, the dense ones 0 (0: shape.num_layers, the MoE rows only) */
} eldr_routebench_cfg;

typedef enum eldr_routebench_stage {
  ELDR_RB_SIG,        /* signature, no cache */
  ELDR_RB_DECISION,   /* the decode decision */
  ELDR_RB_SIG_DEC,    /* the two together */
  ELDR_RB_SIG_HIT,    /* signature with a 75% prefix hit */
  ELDR_RB_STORE_NEW,  /* the store of a new prompt's block rows (counted) */
  ELDR_RB_STORE_HELD, /* the store of a prompt whose blocks the cache holds (looked up) */
  ELDR_RB_CACHED_ALL, /* a held prompt, whole path (extraction + store), the reply with every row */
  ELDR_RB_CACHED_LAST,/* the same, the reply with the last block's rows only */
  ELDR_RB_PARSE,      /* the prefill reply read by the scanner */
  ELDR_RB_PARSE_SIG,  /* read + signature, scanner */
  ELDR_RB_TREE,       /* read + signature, jansson tree */
  ELDR_RB_PERID,      /* signature, per-id kernels only */
  ELDR_RB_MEMCPY,     /* memcpy of the base64 blob */
  ELDR_RB_COMPACT_SIG,       /* signature from the compact form */
  ELDR_RB_COMPACT_PARSE_SIG, /* the compact reply read + its signature */
  ELDR_RB_SIG_AVX2,   /* signature, no cache, at most the AVX2 level (as ELDR_NO_AVX512=1) */
  ELDR_RB_SIG_PORTABLE, /* signature, no cache, the portable paths (as ELDR_NO_SIMD=1) */
  ELDR_RB_MEMCPY_COLD,  /* memcpy of the blob, source and destination out of the caches */
  ELDR_RB_EXTRACT_NEW,  /* a new prompt's extraction with the cache (its planes kept) */
  ELDR_RB_MEMCPY_HOT,   /* memcpy of the blob repeated at once, the second timed (caches hot) */
  ELDR_RB_NSTAGES
} eldr_routebench_stage;

typedef struct eldr_routebench_row {
  const char *name; /* e.g. "signature (no cache)" */
  double p50_s, p99_s, mean_s;
} eldr_routebench_row;

typedef struct eldr_routebench_result {
  size_t tokens;
  size_t b64_bytes; /* the reply's base64 blob */
  size_t reply_bytes, compact_reply_bytes; /* the whole prefill reply, npy and compact form */
  eldr_routebench_row rows[ELDR_RB_NSTAGES];
  double ratio_p50; /* signature + decision over the memcpy, p50 over p50 */
} eldr_routebench_result;

typedef struct eldr_routebench eldr_routebench;

/* The artifact (IDF on, cfg->mask_layers layers in the mask, random unit
 * centroids), its policy and two signature paths (without and with a
 * cache). */
int eldr_routebench_new(const eldr_routebench_cfg *cfg, eldr_routebench **out, eldr_diag *d);
/* Measure prompts of `tokens` tokens (1 .. 2^20): selections drawn from a
 * skewed per-layer popularity, the prefill reply that carries them. The
 * draws continue from the previous run's (one seeded stream per bench). */
int eldr_routebench_run(eldr_routebench *b, size_t tokens, eldr_routebench_result *out, eldr_diag *d);
void eldr_routebench_free(eldr_routebench *b);

#endif
