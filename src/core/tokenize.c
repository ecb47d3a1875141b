/* tokenize.c — the stand-in tokenizer and the prompt block hash chain
 * (include/eldr/tokenize.h). */
#include "eldr/tokenize.h"

#include <xxhash.h>

/* ---- tokenizer ------------------------------------------------------------
 * Tokens: runs of "word" bytes (ASCII letters/digits, '_' and any byte >=
 * 0x80, i.e. UTF-8 sequences) cut into pieces of at most 4 bytes; every other
 * non-space byte (punctuation) is a token of its own. Whitespace is not a
 * token, but a token that follows whitespace hashes differently (like the
 * leading-space tokens of BPE vocabularies). ids are in [0, 2^17). */
#define TOK_PIECE 4
#define TOK_VOCAB (1u << 17)

static inline int is_word(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c >= 0x80;
}
static inline int is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static uint32_t tok_id(const unsigned char *p, size_t n, int after_space) {
  return (uint32_t)(XXH64(p, n, after_space ? 0x9e3779b97f4a7c15ull : 0x2545f4914f6cdd1dull) %
                    TOK_VOCAB);
}

size_t eldr_tokenize(const char *text, size_t len, uint32_t *ids, size_t cap) {
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0, n = 0;
  int after_space = 0;
  if (!s) return 0;
  while (i < len) {
    unsigned char c = s[i];
    if (is_space(c)) {
      after_space = 1;
      i++;
      continue;
    }
    size_t piece = 1;
    if (is_word(c)) {
      while (piece < TOK_PIECE && i + piece < len && is_word(s[i + piece])) piece++;
    }
    if (ids && n < cap) ids[n] = tok_id(s + i, piece, after_space);
    n++;
    i += piece;
    after_space = 0;
  }
  return n;
}

size_t eldr_block_hashes(const uint32_t *ids, size_t n, uint64_t seed, uint64_t *hashes) {
  size_t nb = n / ELDR_BLOCK_TOKENS;
  uint64_t h = seed;
  unsigned char buf[ELDR_BLOCK_TOKENS * 4];
  for (size_t b = 0; b < nb; b++) {
    const uint32_t *blk = ids + b * ELDR_BLOCK_TOKENS;
    for (size_t t = 0; t < ELDR_BLOCK_TOKENS; t++) { /* little-endian, host independent */
      buf[4 * t] = (unsigned char)(blk[t]);
      buf[4 * t + 1] = (unsigned char)(blk[t] >> 8);
      buf[4 * t + 2] = (unsigned char)(blk[t] >> 16);
      buf[4 * t + 3] = (unsigned char)(blk[t] >> 24);
    }
    h = XXH64(buf, sizeof buf, h);
    hashes[b] = h;
  }
  return nb;
}
