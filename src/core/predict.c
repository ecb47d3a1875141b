/* predict.c — a request's prefill signature predicted at arrival from the
 * signature cache (eldr/predict.h). */
#include "eldr/predict.h"


double eldr_predict_confidence(uint64_t known_tokens, uint64_t prompt_tokens) {
  if (!prompt_tokens) return 0;
  if (known_tokens >= prompt_tokens) return 1;
  return (double)known_tokens / (double)prompt_tokens;
}

int eldr_predict_usable(double confidence, uint64_t known_tokens, double threshold) {
  if (!known_tokens || !(confidence >= 0)) return 0; /* nothing known, or NaN */
  return confidence >= threshold;
}

int eldr_predict_from_cache(eldr_sigshard *c, const uint64_t *hashes, size_t nblocks, uint32_t prompt_tokens,
                            uint32_t *counts, uint8_t *acc, eldr_prediction *out) {
  if (!c || !counts || !acc || !out || (!hashes && nblocks)) return ELDR_EINVAL;
  /* a prompt has no more full blocks than its tokens allow: a caller's
   * inconsistent pair is cut to what the prompt can hold */
  if (nblocks > prompt_tokens / ELDR_BLOCK_TOKENS) nblocks = prompt_tokens / ELDR_BLOCK_TOKENS;
  size_t prefix = 0;
  size_t held = nblocks ? eldr_sigshard_add_held(c, hashes, nblocks, counts, acc, &prefix, NULL) : 0;
  out->prompt_tokens = prompt_tokens;
  out->known_tokens = (uint32_t)(held * ELDR_BLOCK_TOKENS);
  out->nblocks = nblocks;
  out->prefix_blocks = prefix;
  out->later_blocks = held - prefix;
  out->confidence = eldr_predict_confidence(out->known_tokens, prompt_tokens);
  return 0;
}
