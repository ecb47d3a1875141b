/* eldr/mooncake.h — real prefix structure for the simulator: a
 * Mooncake-format trace (arrivals, prompt and output lengths, the prompt's
 * 512-token blocks as prefix hash ids; ../shared/traces/README.md) turned
 * into expert selections (docs/sim.md, "Mooncake structure").
 *
 * The records (eldr_mooncake) are read by eldr_mooncake_parse
 * (eldr/mooncake_io.h, format layer). eldr_mooncake_build gives them
 * experts from a trace generator (eldr/tracegen.h, the model's `realistic`
 * workload as a rule):
 *   - every distinct full block (its hash id) gets the routed experts of
 *     512 prompt tokens drawn once, from the generator request of the first
 *     request that holds it; every later request holding that block has
 *     exactly those rows (what a signature cache would hold of it);
 *   - a request's new blocks and its partial last block are drawn from its
 *     own generator request (index ELDR_MOONCAKE_INDEX_BASE + its line: a
 *     trace generated with the same generator, indices from 0, shares the
 *     domain tables and no request; what a fit on it needs), in the domain of its
 *     conversation: the request that first held its block 1 (the first
 *     block after the system prompt every request shares), itself when new;
 *     its output tokens likewise, capped at max_decode;
 *   - its prefill counts are the sum of its blocks' rows and its tail's.
 * Prompt tokens of one generator request are independent draws given its
 * prefill distribution, so only the tokens of new blocks and the tail are
 * drawn. Limits: the expert content is a model's, not Kimi's; a
 * conversation's turns share a domain, not their request-level logits.
 *
 * The trace built has the records' arrivals (timestamp / 1000 s), the true
 * prompt lengths, counts-form prefill (prefill_counts), and decode token
 * rows kept in memory for the simulator beside decode_counts (written as a
 * counts-form line by eldr_trace_format_request).
 *
 * Ownership: eldr_mooncake and eldr_block_table own their arrays (free
 * with their _free). Errors: ELDR_EINVAL, ELDR_ERANGE, ELDR_ENOMEM, with d
 * naming the request. Threads: one call per generator at a time.
 */
#ifndef ELDR_MOONCAKE_H
#define ELDR_MOONCAKE_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/error.h"
#include "eldr/trace_model.h"
#include "eldr/tracegen.h"

#define ELDR_MOONCAKE_BLOCK_TOKENS 512u
#define ELDR_MOONCAKE_INDEX_BASE ((size_t)1 << 40)
/* bounds of one record (a longer prompt or output is an error) */
#define ELDR_MOONCAKE_MAX_INPUT (1u << 20)
#define ELDR_MOONCAKE_MAX_OUTPUT (1u << 20)

typedef struct eldr_mooncake_rec {
  double timestamp_ms;     /* arrival, >= 0 */
  uint32_t input_length;   /* prompt tokens, >= 1 */
  uint32_t output_length;  /* generated tokens */
  uint32_t n_ids;          /* ceil(input_length / 512) block ids */
  size_t ids_off;          /* its ids are eldr_mooncake.ids[ids_off ..] */
} eldr_mooncake_rec;

typedef struct eldr_mooncake {
  eldr_mooncake_rec *rec;
  size_t n;
  uint64_t *ids; /* every record's hash ids, in order */
  size_t n_ids;
} eldr_mooncake;

void eldr_mooncake_free(eldr_mooncake *m);

/* The distinct full blocks of a pool and each request's blocks. */
typedef struct eldr_block_table {
  uint32_t block_tokens; /* tokens per block (512) */
  size_t cells;          /* L*E of a row */
  size_t n_blocks;       /* distinct full blocks */
  uint16_t *counts;      /* n_blocks * cells: each block's expert counts */
  size_t n_req;          /* requests (the trace's, in order) */
  uint32_t *off;         /* n_req + 1: request i's blocks are ids[off[i] .. off[i+1]) */
  uint32_t *ids;         /* block indices, the request's full blocks in prompt order */
} eldr_block_table;

void eldr_block_table_free(eldr_block_table *b);

/* Build the trace and its block table from the first n records of m (all
 * when n is 0 or larger) with generator g (its shape; decode capped at
 * max_decode tokens when > 0). progress (may be NULL) is called per
 * request. 0, or an error with d naming the request. */
int eldr_mooncake_build(eldr_tracegen *g, const eldr_mooncake *m, size_t n, uint32_t max_decode,
                        eldr_trace **out, eldr_block_table *bt,
                        void (*progress)(void *ctx, size_t done, size_t total), void *ctx,
                        eldr_diag *d);

#endif
