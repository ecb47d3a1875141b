/* sim_tokens.c — a serve pool's decode selections in a compact per-token
 * form, built once and read at every decode step (eldr_sim_tokens_build,
 * see eldr/sim.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "eldr/batch_union.h"
#include "eldr/sim.h"

static size_t bitsets_budget(void) {
  size_t budget = (size_t)1 << 30;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  if (pages > 0 && psz > 0 && (uint64_t)pages * (uint64_t)psz / 8 > budget)
    budget = (size_t)((uint64_t)pages * (uint64_t)psz / 8);
  return budget;
}

/* Memory for n bytes of rows (every byte is written), on transparent huge
 * pages where the kernel gives them: a pool's rows are up to gigabytes, and
 * faulting them in 4 KiB at a time took about half of building them. */
static unsigned char *rows_alloc(size_t n) {
  const size_t huge = (size_t)2 << 20;
  if (n < huge) return malloc(n);
  void *p = NULL;
  if (posix_memalign(&p, huge, n)) return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(p, n / huge * huge, MADV_HUGEPAGE); /* a hint: failure is harmless */
#endif
  return p;
}

/* Selections (ids < 256) as bytes (blocks of 32: a loop the compiler
 * vectorises at -O2). */
static void narrow_ids(unsigned char *restrict dst, const uint16_t *restrict sel, size_t n) {
  size_t x = 0;
  for (; x + 32 <= n; x += 32)
    for (size_t i = 0; i < 32; i++) dst[x + i] = (unsigned char)sel[x + i];
  for (; x < n; x++) dst[x] = (unsigned char)sel[x];
}

int eldr_sim_tokens_build(const eldr_sim_pool *pool, eldr_sim_tok_form form, eldr_sim_tokens **out,
                          eldr_diag *d) {
  *out = NULL;
  if (!pool || !pool->trace || !pool->idx) return eldr_diag_fail(d, ELDR_EINVAL, "sim: NULL pool");
  /* A step reads one row per member, and at pools of millions of tokens
   * main memory bandwidth bounds a step: ids8 (E <= 256) where a bitset
   * takes at least four times its bytes (top-1 and top-4 of 128 experts,
   * top-8 of 256); else bitsets (cheaper to OR: at twice the bytes, 128
   * experts top-8, they were faster in bench/bench_sim.c) when they take at
   * most twice the bytes of the selections themselves. */
  const eldr_trace *tr = pool->trace;
  const size_t L = tr->shape.num_layers, K = tr->shape.top_k, W = (tr->shape.num_experts + 63) / 64;
  const int ids_ok = tr->shape.num_experts <= 256, bits_ok = W * 8 <= 2 * K * 2;
  if (form == ELDR_SIM_TOK_AUTO)
    form = ids_ok && 4 * K <= W * 8 ? ELDR_SIM_TOK_IDS8
           : bits_ok                ? ELDR_SIM_TOK_BITS
           : ids_ok                 ? ELDR_SIM_TOK_IDS8
                                    : ELDR_SIM_TOK_AUTO;
  if ((form == ELDR_SIM_TOK_IDS8 && !ids_ok) || (form == ELDR_SIM_TOK_BITS && !bits_ok) ||
      form == ELDR_SIM_TOK_AUTO)
    return 0;
  const size_t row = form == ELDR_SIM_TOK_IDS8 ? L * K : L * W * sizeof(uint64_t);
  size_t ntok = 0;
  for (size_t i = 0; i < pool->n; i++) ntok += tr->req[pool->idx[i]].n_decode;
  if (ntok * row > bitsets_budget()) return 0;
  /* Bits rows up to 256 experts come from each token's ids8 row (the union
   * kernels' one-hot code) in tmp; u is their scratch. */
  const int via_ids = form == ELDR_SIM_TOK_BITS && ids_ok;
  eldr_sim_tokens *t = calloc(1, sizeof *t);
  eldr_union u = {0};
  uint8_t *tmp = via_ids ? malloc(L * K + ELDR_UNION_IDS8_PAD) : NULL;
  if (t) {
    t->off = malloc((pool->n ? pool->n : 1) * sizeof *t->off);
    t->rows = rows_alloc(ntok * row + ELDR_UNION_IDS8_PAD + sizeof(uint64_t));
  }
  if (!t || !t->off || !t->rows || (via_ids && (!tmp || eldr_union_init(&u, &tr->shape)))) {
    eldr_sim_tokens_free(t);
    eldr_union_free(&u);
    free(tmp);
    return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory (compact decode tokens)");
  }
  t->form = form;
  t->row_bytes = row;
  memset(t->rows + ntok * row, 0, ELDR_UNION_IDS8_PAD + sizeof(uint64_t));
  if (tmp) memset(tmp + L * K, 0, ELDR_UNION_IDS8_PAD);
  size_t r_i = 0;
  for (size_t i = 0; i < pool->n; i++) {
    const eldr_request *r = &tr->req[pool->idx[i]];
    t->off[i] = r_i;
    for (uint32_t tk = 0; tk < r->n_decode; tk++, r_i++) {
      const uint16_t *sel = r->decode + (size_t)tk * L * K;
      unsigned char *dst = t->rows + r_i * row;
      if (form == ELDR_SIM_TOK_IDS8) {
        narrow_ids(dst, sel, L * K);
      } else if (via_ids) {
        const uint8_t *p = tmp;
        narrow_ids(tmp, sel, L * K);
        eldr_union_ids8_bits(&u, &p, 1, (uint64_t *)(void *)dst);
      } else {
        memset(dst, 0, row);
        eldr_union_set_bits((uint64_t *)(void *)dst, L, K, W, sel);
      }
    }
  }
  eldr_union_free(&u);
  free(tmp);
  *out = t;
  return 0;
}

void eldr_sim_tokens_free(eldr_sim_tokens *t) {
  if (!t) return;
  free(t->rows);
  free(t->off);
  free(t);
}
