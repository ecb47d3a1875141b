/* eldr/predict.h — a request's prefill signature predicted at its arrival,
 * before any leg is sent: for routers that must pick the decode worker
 * before the prefill has run (SGLang's prefill/decode serving, llm-d's
 * decode-first scheduling; docs/sglang.md).
 *
 * The method. A prompt's prefill selection counts are the sum of its KV
 * blocks' rows (eldr/sigcache.h): block b's row depends only on the
 * prompt's tokens up to the end of b (a causal model), and the block hash
 * chain names exactly that prefix. So every block of the arriving prompt
 * whose row the signature cache already holds contributes its *exact*
 * share of the true counts: the longest held prefix, and any held blocks
 * after the first one missing (a prefix that was seen whole once, whose
 * middle row was since evicted). The prediction is the sum of those rows;
 * the tokens not covered (new blocks, the prompt's partial last block) are
 * unknown, not guessed.
 *
 * The confidence is the share of the prompt's tokens the found rows cover:
 * known_tokens / prompt_tokens, in [0, 1]. Why this and nothing cleverer:
 * the predicted counts are a sub-sum of the true ones, and without a model
 * of the unknown tokens every bound on the cosine between the predicted and
 * the true signature is a function of that share alone (unknown tokens that
 * repeat the known ones' experts: cosine 1; tokens on experts of their own,
 * each token's row of similar weight: cosine sqrt(share) to share /
 * sqrt(share^2 + (1 - share)^2), monotone in it). A threshold on the share is
 * therefore a threshold on the worst case, and the share is what the router
 * reports and the simulator sweeps (docs/sglang.md, "The predicted
 * signature"). Limits, said plainly: the share does not know which tokens
 * matter: a prompt whose known part is a system prompt every request shares
 * predicts the system prompt, however large its share; and the new turn of
 * a conversation, the part the answer is about, is exactly the part never
 * known at arrival.
 *
 * eldr_predict_confidence and eldr_predict_usable are the rule both the
 * router and the simulator apply (the simulator's blocks are its own: it
 * calls them with its own token counts).
 *
 * Ownership: the caller owns every buffer; nothing is allocated. Errors:
 * ELDR_EINVAL for NULL arguments. Threads: eldr_predict_from_cache may run
 * on any thread at once (the cache is thread-safe); the rest is pure.
 */
#ifndef ELDR_PREDICT_H
#define ELDR_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/sigshard.h"

/* The default confidence a prediction needs to be routed on (the router's
 * --predict-threshold and the simulator's): half the prompt's tokens. */
#define ELDR_PREDICT_THRESHOLD_DEFAULT 0.5

typedef struct eldr_prediction {
  uint32_t prompt_tokens; /* tokens of the prompt */
  uint32_t known_tokens;  /* tokens of the blocks whose rows were found */
  size_t nblocks;         /* full blocks of the prompt that were looked up */
  size_t prefix_blocks;   /* the leading run of found blocks */
  size_t later_blocks;    /* found after the first missing one */
  double confidence;      /* eldr_predict_confidence(known_tokens, prompt_tokens) */
} eldr_prediction;

/* known / prompt, clamped to [0, 1]; 0 for an empty prompt. */
double eldr_predict_confidence(uint64_t known_tokens, uint64_t prompt_tokens);

/* 1 when a prediction of this confidence is routed on: confidence >=
 * threshold and something is known (a threshold of 0 still needs a found
 * block). 0 otherwise: route by load (or the footprint's neutral cost). */
int eldr_predict_usable(double confidence, uint64_t known_tokens, double threshold);

/* The prediction from the signature cache. hashes: the prompt's nblocks
 * full-block hashes (eldr_block_hashes, ELDR_BLOCK_TOKENS each);
 * prompt_tokens: all its tokens (the partial last block included).
 * counts: L*E, accumulated into (zero it first for the prediction alone);
 * only the cache's stored layers (its layer mask) receive anything.
 * acc: a scratch of 2 x eldr_sigcache_row_bytes bytes (left zeroed).
 * Held blocks count as the cache's hits and are made its most recent (a
 * held span of eldr/sigshard.h: one hit for its seven blocks); a block
 * not held is not a miss (a prompt's later blocks may simply be new).
 * 0, or ELDR_EINVAL. */
int eldr_predict_from_cache(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, uint32_t prompt_tokens,
                            uint32_t *counts, uint8_t *acc, eldr_prediction *out);

#endif
