/* mooncake.c — a Mooncake-format trace's prefix structure given expert
 * selections (eldr/mooncake.h). */
#include "eldr/mooncake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"

void eldr_mooncake_free(eldr_mooncake *m) {
  if (!m) return;
  free(m->rec);
  free(m->ids);
  memset(m, 0, sizeof *m);
}

void eldr_block_table_free(eldr_block_table *b) {
  if (!b) return;
  free(b->counts);
  free(b->off);
  free(b->ids);
  memset(b, 0, sizeof *b);
}

/* hash id -> block index, open addressing (the table never fills: sized
 * to twice the full blocks of all the requests built) */
typedef struct id_map {
  uint64_t *key;
  uint32_t *val; /* block index + 1; 0 = empty */
  size_t mask;
} id_map;

static size_t slot_of(const id_map *m, uint64_t id) {
  uint64_t h = id * 0x9e3779b97f4a7c15ULL;
  size_t i = (size_t)(h ^ (h >> 29)) & m->mask;
  while (m->val[i] && m->key[i] != id) i = (i + 1) & m->mask;
  return i;
}

typedef struct mc_build {
  eldr_tracegen *g;
  const eldr_mooncake *m;
  eldr_trace *t;
  eldr_block_table *bt;
  id_map map;
  uint32_t *first_req; /* per block: the request that first held it */
  size_t blocks_cap, first_cap;
  uint32_t *pcounts, *dcounts; /* L*E */
  uint32_t *newb;              /* the request's new blocks, in prompt order */
  eldr_tracegen_bufs bufs;
} mc_build;

static void add_rows(uint32_t *counts, const uint16_t *rows, size_t ntok, uint32_t L, uint32_t K,
                     uint32_t E) {
  for (size_t t = 0; t < ntok; t++)
    for (uint32_t l = 0; l < L; l++)
      for (uint32_t k = 0; k < K; k++) counts[(size_t)l * E + rows[(t * L + l) * K + k]]++;
}

/* Request i: its blocks (new ones drawn), its counts, its decode rows. */
static int build_one(mc_build *b, size_t i, uint32_t max_decode, eldr_diag *d) {
  const eldr_mooncake_rec *r = &b->m->rec[i];
  const eldr_shape *S = eldr_tracegen_shape(b->g);
  const uint32_t L = S->num_layers, K = S->top_k, E = S->num_experts, BT = ELDR_MOONCAKE_BLOCK_TOKENS;
  const size_t cells = b->bt->cells;
  const uint64_t *ids = b->m->ids + r->ids_off;
  uint32_t nf = r->input_length / BT;
  if (nf > r->n_ids) nf = r->n_ids;
  eldr_block_table *bt = b->bt;
  uint32_t n_new = 0;
  for (uint32_t p = 0; p < nf; p++) {
    size_t s = slot_of(&b->map, ids[p]);
    if (!b->map.val[s]) {
      if (bt->n_blocks >= UINT32_MAX - 1)
        return eldr_diag_fail(d, ELDR_ERANGE, "mooncake: request %zu: too many distinct blocks", i + 1);
      if (eldr_grow(&bt->counts, &b->blocks_cap, bt->n_blocks + 1, cells * sizeof *bt->counts, 64) ||
          eldr_grow_array(b->first_req, b->first_cap, bt->n_blocks + 1))
        return eldr_diag_fail(d, ELDR_ENOMEM, "mooncake: out of memory (%zu blocks)", bt->n_blocks + 1);
      b->map.key[s] = ids[p];
      b->map.val[s] = (uint32_t)(bt->n_blocks + 1);
      b->first_req[bt->n_blocks] = (uint32_t)i;
      b->newb[n_new++] = (uint32_t)bt->n_blocks++;
    }
    bt->ids[bt->off[i] + p] = b->map.val[s] - 1;
  }
  bt->off[i + 1] = bt->off[i] + nf;
  size_t root = nf >= 2 ? b->first_req[bt->ids[bt->off[i] + 1]] : i;
  uint32_t tail = r->input_length - nf * BT;
  uint32_t n_dec = max_decode && r->output_length > max_decode ? max_decode : r->output_length;
  eldr_tracegen_req q;
  int rc = eldr_tracegen_request_sized(b->g, ELDR_MOONCAKE_INDEX_BASE + i, ELDR_MOONCAKE_INDEX_BASE + root,
                                       n_new * BT + tail, n_dec, &b->bufs, &q, d);
  if (rc) return rc;
  const size_t per = (size_t)L * K;
  uint32_t *bc = b->pcounts; /* a new block's counts, then the request's */
  for (uint32_t k = 0; k < n_new; k++) {
    memset(bc, 0, cells * sizeof *bc);
    add_rows(bc, q.prefill + (size_t)k * BT * per, BT, L, K, E);
    uint16_t *row = bt->counts + (size_t)b->newb[k] * cells;
    for (size_t c = 0; c < cells; c++) row[c] = (uint16_t)bc[c]; /* <= 512 */
  }
  memset(bc, 0, cells * sizeof *bc);
  add_rows(bc, q.prefill + (size_t)n_new * BT * per, tail, L, K, E);
  for (uint32_t p = 0; p < nf; p++) {
    const uint16_t *row = bt->counts + (size_t)bt->ids[bt->off[i] + p] * cells;
    for (size_t c = 0; c < cells; c++) bc[c] += row[c];
  }
  memset(b->dcounts, 0, cells * sizeof *b->dcounts);
  add_rows(b->dcounts, q.decode, n_dec, L, K, E);
  char id[48];
  snprintf(id, sizeof id, "mooncake/%zu", i);
  const char *dom = q.domain >= 0 && (size_t)q.domain < b->t->n_domains ? b->t->domains[q.domain] : NULL;
  int ix = eldr_trace_append_counts(b->t, id, dom, NULL, r->timestamp_ms / 1000.0, bc, r->input_length,
                                    b->dcounts, n_dec, NULL, d);
  if (ix < 0) return ix;
  if (n_dec) { /* the decode rows the simulator steps through */
    eldr_request *er = &b->t->req[ix];
    er->decode = malloc((size_t)n_dec * per * sizeof *er->decode);
    if (!er->decode) return eldr_diag_fail(d, ELDR_ENOMEM, "mooncake: out of memory (decode rows)");
    memcpy(er->decode, q.decode, (size_t)n_dec * per * sizeof *er->decode);
  }
  return 0;
}

int eldr_mooncake_build(eldr_tracegen *g, const eldr_mooncake *m, size_t n, uint32_t max_decode,
                        eldr_trace **out, eldr_block_table *bt,
                        void (*progress)(void *ctx, size_t done, size_t total), void *ctx,
                        eldr_diag *d) {
  if (!g || !m || !out || !bt) return eldr_diag_fail(d, ELDR_EINVAL, "mooncake: argument missing");
  *out = NULL;
  memset(bt, 0, sizeof *bt);
  if (!n || n > m->n) n = m->n;
  if (!n) return eldr_diag_fail(d, ELDR_EINVAL, "mooncake: no requests");
  if (n > UINT32_MAX / 2) return eldr_diag_fail(d, ELDR_ERANGE, "mooncake: too many requests");
  const eldr_shape *S = eldr_tracegen_shape(g);
  size_t full = 0, most = 0;
  for (size_t i = 0; i < n; i++) {
    size_t f = m->rec[i].input_length / ELDR_MOONCAKE_BLOCK_TOKENS;
    if (f > m->rec[i].n_ids) f = m->rec[i].n_ids;
    full += f;
    if (f > most) most = f;
  }
  if (full >= UINT32_MAX / 4) return eldr_diag_fail(d, ELDR_ERANGE, "mooncake: too many blocks");
  mc_build b = {.g = g, .m = m, .bt = bt};
  bt->block_tokens = ELDR_MOONCAKE_BLOCK_TOKENS;
  bt->cells = eldr_shape_cells(S);
  bt->n_req = n;
  size_t slots = 16;
  while (slots < 2 * full + 2) slots <<= 1;
  b.map.mask = slots - 1;
  b.map.key = malloc(slots * sizeof *b.map.key);
  b.map.val = calloc(slots, sizeof *b.map.val);
  bt->off = calloc(n + 1, sizeof *bt->off);
  bt->ids = malloc((full ? full : 1) * sizeof *bt->ids);
  b.newb = malloc((most ? most : 1) * sizeof *b.newb);
  b.pcounts = malloc(bt->cells * sizeof *b.pcounts);
  b.dcounts = malloc(bt->cells * sizeof *b.dcounts);
  b.t = eldr_tracegen_trace_header(g);
  int rc = 0;
  if (!b.map.key || !b.map.val || !bt->off || !bt->ids || !b.newb || !b.pcounts || !b.dcounts || !b.t ||
      eldr_trace_reserve(b.t, n))
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "mooncake: out of memory");
  if (!rc) {
    char gen[256];
    snprintf(gen, sizeof gen, "%s mooncake=%zu", b.t->generator ? b.t->generator : "eldr-tracegen", n);
    if (eldr_trace_set_generator(b.t, gen)) rc = eldr_diag_fail(d, ELDR_ENOMEM, "mooncake: out of memory");
  }
  for (size_t i = 0; !rc && i < n; i++) {
    rc = build_one(&b, i, max_decode, d);
    if (progress && (rc || (i + 1) % 64 == 0 || i + 1 == n)) progress(ctx, i + 1, n);
  }
  free(b.map.key);
  free(b.map.val);
  free(b.first_req);
  free(b.newb);
  free(b.pcounts);
  free(b.dcounts);
  free(b.bufs.prefill);
  free(b.bufs.decode);
  if (rc) {
    eldr_trace_free(b.t);
    eldr_block_table_free(bt);
    return rc;
  }
  *out = b.t;
  return 0;
}
