/* eldr/reply_splice.h — the decode reply of a PD request with the
 * prefill's prompt-side values put in, by editing the reply's bytes: every
 * byte outside the values it replaces arrives as the decoder sent it
 * (numbers are never re-serialised: "-0.1" stays "-0.1").
 *
 * What is replaced (docs/serve.md, "routed_experts"):
 *  - routed_experts: vLLM 0.21 and later, the decoder's top-level
 *    prompt_routed_experts by the prefill's (its bytes); npy and the lists
 *    of PR #38939 (one array per choice over the whole sequence), the
 *    prefill's prompt rows (prompt tokens [P - rows, P), P the prefill's
 *    usage.prompt_tokens, else rows) over the decode choice's rows at those
 *    positions: an npy blob is decoded, its payload rows overwritten in the
 *    decoder's dtype (its .npy header kept byte for byte) and encoded again;
 *    a list's rows are the prefill's row bytes;
 *  - prompt_logprobs (asked): the prefill's top-level (chat) and choice
 *    (completions) prompt_logprobs, their bytes, replacing the decoder's or
 *    appended to the object when it has none.
 * Usage is not touched here (the router's usage edit, serve/edit.c, is a
 * byte edit too and runs on the result).
 *
 * Errors: 0 with *out (malloc'd, NUL-terminated) and the edits made;
 * ELDR_ENOTFOUND: nothing to change (*spliced says why for routed_experts);
 * ELDR_EPARSE: the scanner refused one of the documents (the caller's tree
 * path decides); ELDR_ENOMEM. *spliced: 1 routed_experts spliced, 0 none to
 * splice, -1 not spliceable (layouts or shapes differ, an id the decoder's
 * dtype cannot hold; d says which; the rest of the edits are still made).
 * Ownership: the caller's documents are borrowed; *out is the caller's.
 * Threads: any (no state). */
#ifndef ELDR_REPLY_SPLICE_H
#define ELDR_REPLY_SPLICE_H

#include <stddef.h>

#include "eldr/error.h"

typedef struct eldr_splice_opts {
  int routed_experts;  /* splice the prompt's routed_experts rows */
  int prompt_logprobs; /* copy the prefill's prompt_logprobs */
} eldr_splice_opts;

/* One replaced value: input bytes [in_off, in_off + in_len) became output
 * bytes [out_off, out_off + out_len); everything between edits is copied. */
typedef struct eldr_splice_edit {
  size_t in_off, in_len, out_off, out_len;
} eldr_splice_edit;

#define ELDR_SPLICE_MAX_EDITS 64 /* edits recorded (a reply with more choices is refused: ENOTFOUND) */

typedef struct eldr_splice_result {
  char *out;
  size_t len;
  eldr_splice_edit edits[ELDR_SPLICE_MAX_EDITS];
  size_t nedits;
  int spliced;
} eldr_splice_result;

int eldr_reply_splice(const char *dec, size_t dlen, const char *pre, size_t plen, const eldr_splice_opts *o,
                      eldr_splice_result *res, eldr_diag *d);

#endif
