/* fuzz_mooncake.c — libFuzzer target for the Mooncake trace reader
 * (eldr trace gen --from-mooncake, eldr sim --serve-mooncake) and the
 * builder behind it.
 *
 * Any input: eldr_mooncake_parse returns an error with a message, or
 * records within the documented bounds (one id per 512-token block); the
 * first records' structure then builds on a tiny generator with prompts
 * and outputs capped, every block row summing to 512 tokens x top_k. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/mooncake_io.h"
#include "eldr/preset_files.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_mooncake m;
  eldr_diag d = {{0}};
  int rc = eldr_mooncake_parse((const char *)data, size, "fuzz", 64, &m, &d);
  if (rc != 0) {
    if (!d.msg[0] || m.rec || m.n) abort();
    return 0;
  }
  size_t ids = 0;
  for (size_t i = 0; i < m.n; i++) {
    const eldr_mooncake_rec *r = &m.rec[i];
    if (r->input_length < 1 || r->input_length > ELDR_MOONCAKE_MAX_INPUT) abort();
    if (r->output_length > ELDR_MOONCAKE_MAX_OUTPUT || !(r->timestamp_ms >= 0)) abort();
    if (r->n_ids != (r->input_length + 511) / 512 || r->ids_off != ids) abort();
    ids += r->n_ids;
  }
  if (ids != m.n_ids) abort();
  /* build only small ones (a fuzz input may ask for a million tokens) */
  uint64_t tokens = 0;
  for (size_t i = 0; i < m.n; i++) tokens += m.rec[i].input_length + (m.rec[i].output_length > 4 ? 4 : m.rec[i].output_length);
  if (tokens <= 8192) {
    eldr_shape s = {2, 8, 2};
    eldr_tracegen *g = NULL;
    if (eldr_tracegen_new(&s, "fuzz", "realistic", 1, &g, &d) != 0) abort();
    eldr_trace *t = NULL;
    eldr_block_table bt;
    if (eldr_mooncake_build(g, &m, 0, 4, &t, &bt, NULL, NULL, &d) != 0) abort();
    if (t->n != m.n) abort();
    for (size_t b = 0; b < bt.n_blocks; b++) {
      uint32_t sum = 0;
      for (uint32_t e = 0; e < s.num_experts; e++) sum += bt.counts[b * bt.cells + e];
      if (sum != 512 * 2) abort();
    }
    eldr_block_table_free(&bt);
    eldr_trace_free(t);
    eldr_tracegen_free(g);
  }
  eldr_mooncake_free(&m);
  return 0;
}
