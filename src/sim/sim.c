/* sim.c — discrete-event xPyD cluster simulator (see include/eldr/sim.h). */
#include "eldr/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "eldr/batch_union.h"
#include "eldr/grow.h"
#include "eldr/quantile.h"
#include "eldr/rng.h"

enum { EV_ARRIVAL = 0, EV_PREFILL_DONE, EV_KV_ARRIVE, EV_STEP_DONE, EV_WAKE, EV_PREFILL_WAKE };

typedef struct event {
  double t;
  uint64_t seq;
  uint32_t type, id;
} event;

typedef struct heap {
  event *v;
  size_t n, cap;
  uint64_t seq;
} heap;

static inline int ev_less(const event *a, const event *b) {
  return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(heap *h, double t, uint32_t type, uint32_t id) {
  if (h->n == h->cap && eldr_grow(&h->v, &h->cap, h->n + 1, sizeof *h->v, 256)) return ELDR_ENOMEM;
  event e = {t, h->seq++, type, id};
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!ev_less(&e, &h->v[p])) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = e;
  return 0;
}

static event heap_pop(heap *h) {
  event top = h->v[0];
  event last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const event *best = &last;
    if (l < h->n && ev_less(&h->v[l], best)) {
      m = l;
      best = &h->v[l];
    }
    if (r < h->n && ev_less(&h->v[r], best)) m = r;
    if (m == i) break;
    h->v[i] = h->v[m];
    i = m;
  }
  if (h->n) h->v[i] = last;
  return top;
}

typedef struct sreq {
  const unsigned char *trow; /* first decode token's compact row, or NULL */
  const uint16_t *tids;  /* the recorded decode selections (n_decode * L * K) */
  uint32_t pool_i;
  uint32_t n_prefill, n_decode, pos, offset;
  int32_t next; /* queue / batch link */
  int pw, dec;
  double arrival, pf_done, first, finish, pred;
  uint32_t done;
  uint64_t ticket; /* FOOTPRINT */
} sreq;

typedef struct pworker {
  int32_t qhead, qtail, bhead;
  uint32_t qlen, blen;
  int busy;
} pworker;

typedef struct dworker {
  int32_t whead, wtail;
  uint32_t wlen, nrun;
  uint32_t *run; /* max_batch ids */
  int busy;
  int changed;   /* the batch's membership changed since dups was counted */
  uint32_t dups; /* members whose recorded request has another copy in the batch */
} dworker;

void eldr_sim_config_default(eldr_sim_config *c) {
  memset(c, 0, sizeof *c);
  c->n_prefill = 8;
  c->n_decode = 16;
  c->max_batch = 64;
  c->prefill_max_tokens = 8192;
  c->prefill_guard = 4;
  c->rate = 10;
  c->n_requests = 1000;
  c->seed = 1;
  c->policy = ELDR_POLICY_JSQ;
  c->tau = 0.1;
}


static uint64_t prefix_hash(const eldr_request *r) {
  /* the hash of the request's first block of prompt: the prompt text when the
   * trace has it, else the request id (copies of one recorded request share it) */
  if (r->prompt && r->prompt[0]) {
    size_t len = strlen(r->prompt);
    if (len > 256) len = 256;
    return XXH64(r->prompt, len, 0);
  }
  return XXH64(r->id, strlen(r->id), 0);
}


static void shuffle_pool(uint32_t *s, size_t n, eldr_rng *r) {
  for (size_t i = 0; i < n; i++) s[i] = (uint32_t)i;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)eldr_rng_below(r, i);
    uint32_t t = s[i - 1];
    s[i - 1] = s[j];
    s[j] = t;
  }
}

typedef struct arr_key {
  double t;
  uint32_t i;
} arr_key;

static int cmp_arrival(const void *a, const void *b) {
  const arr_key *x = a, *y = b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

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

double eldr_sim_capacity(const eldr_sim_pool *pool, const eldr_latency_model *m,
                         const eldr_sim_config *c) {
  if (!pool || !pool->n || !m || !c || !c->n_decode || !c->n_prefill || !c->max_batch) return 0;
  double lp = 0, ld = 0;
  for (size_t i = 0; i < pool->n; i++) {
    const eldr_request *r = &pool->trace->req[pool->idx[i]];
    lp += r->n_prefill;
    ld += r->n_decode;
  }
  lp /= (double)pool->n;
  ld /= (double)pool->n;
  if (ld < 1) ld = 1;
  const uint32_t L = m->shape.num_layers;
  uint32_t u[ELDR_MAX_LAYERS];
  double eu = eldr_latency_expected_union(&m->shape, c->max_batch);
  for (uint32_t l = 0; l < L && l < ELDR_MAX_LAYERS; l++) u[l] = (uint32_t)(eu + 0.5);
  double ctx = (double)c->max_batch * (lp + ld / 2);
  double step = eldr_latency_step(m, c->max_batch, u, ctx);
  if (c->placements && c->placements[0] && m->rank_hbm_bw > 0) { /* EP: the union spread evenly */
    const size_t R = c->placements[0]->ep_size;
    uint32_t *rx = malloc((size_t)L * R * sizeof *rx), *rt = malloc((size_t)L * R * sizeof *rt);
    if (rx && rt) {
      for (size_t i = 0; i < (size_t)L * R; i++) {
        rx[i] = (uint32_t)ceil(eu / (double)R);
        rt[i] = (uint32_t)ceil((double)c->max_batch * m->shape.top_k / (double)R);
      }
      step = eldr_latency_step_ep(m, c->max_batch, rx, rt, (uint32_t)R, ctx);
    }
    free(rx);
    free(rt);
  }
  double dec = (double)c->n_decode * (double)c->max_batch / step / ld;
  size_t budget = c->prefill_max_tokens ? c->prefill_max_tokens : 8192;
  double per_batch = lp > 0 ? (double)budget / lp : (double)budget;
  if (per_batch < 1) per_batch = 1;
  double pre = (double)c->n_prefill * per_batch /
               eldr_latency_prefill(m, (size_t)(per_batch * (lp > 0 ? lp : 1)));
  return dec < pre ? dec : pre;
}

typedef struct simst {
  const eldr_sim_pool *pool;
  const eldr_trace *tr;
  const eldr_latency_model *m;
  const eldr_sim_config *c;
  size_t L, K, W, P, D, B, N;
  heap h;
  sreq *rq;
  pworker *pw;
  dworker *dw;
  uint32_t *run_store, *ploads, *dloads, *uni, *perm, *copies, *bcount;
  eldr_union un;       /* the step's per-layer expert union */
  uint64_t *stamp, *phash;
  const eldr_sim_tokens *tok; /* the pool's compact decode tokens, or NULL */
  eldr_sim_tokens *own_tok;   /* built by this run (freed at its end), or NULL */
  const void **rows;   /* B: the step's members' rows (compact, or selections) */
  double *tpot, *ttft;
  size_t completed, n_tpot, fallbacks;
  uint64_t steps, token_steps, union_sum, dup_steps, tokens_out;
  double copies_sum, first_arrival, last_finish, tpot_min;
  eldr_policy pol;
  eldr_ep_tally ep; /* with c->placements */
  eldr_footprint *fp;  /* FOOTPRINT with a policy model, else NULL */
  uint32_t *counts;    /* L*E scratch (FOOTPRINT) */
  double pe_sum, pa_sum, pp_sum, aa_sum, ap_sum, rel_sum;
  size_t n_pred;
} simst;

/* Take queued prompts of prefill worker w into one batch (up to the token
 * budget, at least one) and schedule its completion. */
static int start_prefill(simst *st, uint32_t w, double now) {
  pworker *x = &st->pw[w];
  size_t tokens = 0;
  int32_t btail = -1;
  x->bhead = -1;
  x->blen = 0;
  while (x->qhead >= 0) {
    sreq *y = &st->rq[x->qhead];
    if (x->blen > 0 && tokens + y->n_prefill > st->c->prefill_max_tokens) break;
    int32_t yid = x->qhead;
    x->qhead = y->next;
    if (x->qhead < 0) x->qtail = -1;
    x->qlen--;
    y->next = -1;
    if (btail >= 0)
      st->rq[btail].next = yid;
    else
      x->bhead = yid;
    btail = yid;
    x->blen++;
    tokens += y->n_prefill;
  }
  if (x->blen == 0) return 0;
  x->busy = 1;
  return heap_push(&st->h, now + eldr_latency_prefill(st->m, tokens), EV_PREFILL_DONE, w);
}

static void finish_request(simst *st, sreq *q, uint32_t k, double now) {
  q->finish = now;
  q->done++;
  st->ttft[st->completed++] = q->first - q->arrival;
  if (q->n_decode >= 2) {
    double tp = (q->finish - q->first) / (double)(q->n_decode - 1);
    st->tpot[st->n_tpot++] = tp;
    if (tp < st->tpot_min) st->tpot_min = tp;
    if (q->pred > 0) {
      st->n_pred++;
      st->rel_sum += fabs(q->pred - tp) / tp;
      st->pe_sum += q->pred;
      st->pa_sum += tp;
      st->pp_sum += q->pred * q->pred;
      st->aa_sum += tp * tp;
      st->ap_sum += tp * q->pred;
    }
  }
  eldr_policy_on_end(&st->pol, q->ticket);
  q->ticket = ELDR_FP_NO_TICKET;
  st->copies[q->pool_i]--;
  st->dloads[k]--;
  if (now > st->last_finish) st->last_finish = now;
  if (st->c->progress && (st->completed & 4095) == 0)
    st->c->progress(st->c->progress_ctx, st->completed, st->N);
}

/* EP step time of decoder k's batch: tally each member's current token on
 * the decoder's placement, then the slowest-rank model. */
static double ep_step(simst *st, uint32_t k, const dworker *x, double ctx) {
  const eldr_placement *pl = st->c->placements[k];
  eldr_ep_tally_begin(&st->ep);
  for (uint32_t j = 0; j < x->nrun; j++) {
    const sreq *q = &st->rq[x->run[j]];
    uint32_t tok = q->pos + q->offset;
    if (tok >= q->n_decode) tok -= q->n_decode;
    const eldr_request *r = &st->tr->req[st->pool->idx[q->pool_i]];
    eldr_ep_tally_add(&st->ep, pl, r->decode + (size_t)tok * st->L * st->K, j);
  }
  eldr_ep_tally_end(&st->ep);
  return eldr_latency_step_ep(st->m, x->nrun, st->ep.rank_experts, st->ep.rank_tokens, pl->ep_size,
                              ctx);
}

static inline void prefetch_bytes(const void *p, size_t n) {
  const char *c = p;
  for (size_t i = 0; i < n; i += 64) __builtin_prefetch(c + i, 0, 3);
  __builtin_prefetch(c + n - 1, 0, 3);
}

/* Decoder k: admit waiting requests into the batch and start a step (if any
 * member): latency from the per-layer union of the members' current tokens. */
static int start_step(simst *st, uint32_t k, double now) {
  dworker *x = &st->dw[k];
  while (x->nrun < st->B && x->whead >= 0) {
    int32_t id = x->whead;
    x->whead = st->rq[id].next;
    if (x->whead < 0) x->wtail = -1;
    st->rq[id].next = -1;
    x->wlen--;
    x->run[x->nrun++] = (uint32_t)id;
    x->changed = 1;
  }
  if (x->nrun == 0) return 0;
  const size_t L = st->L, K = st->K;
  uint64_t ctx = 0; /* integers: the same value as summing them as doubles in any order */
  uint64_t stp = ++st->steps;
  st->token_steps += x->nrun;
  const size_t rb = st->tok ? st->tok->row_bytes : L * K * sizeof(uint16_t);
  for (uint32_t j = 0; j < x->nrun; j++) {
    sreq *q = &st->rq[x->run[j]];
    uint32_t tok = q->pos + q->offset;
    if (tok >= q->n_decode) tok -= q->n_decode;
    /* the member's next token is read at this decoder's next step: fetch it
     * now (rows of different requests defeat the hardware prefetcher) */
    uint32_t nxt = tok + 1 < q->n_decode ? tok + 1 : 0;
    const unsigned char *base = q->trow ? q->trow : (const unsigned char *)q->tids;
    st->rows[j] = base + (size_t)tok * rb;
    prefetch_bytes(base + (size_t)nxt * rb, rb);
    ctx += (uint64_t)q->n_prefill + q->pos;
  }
  if (x->changed) { /* copies of one recorded request in the batch: recounted on a change */
    for (uint32_t j = 0; j < x->nrun; j++) {
      uint32_t pi = st->rq[x->run[j]].pool_i;
      if (st->stamp[pi] != stp) {
        st->stamp[pi] = stp;
        st->bcount[pi] = 0;
      }
      st->bcount[pi]++;
    }
    x->dups = 0;
    for (uint32_t j = 0; j < x->nrun; j++) x->dups += st->bcount[st->rq[x->run[j]].pool_i] > 1;
    x->changed = 0;
  }
  st->dup_steps += x->dups;
  uint64_t usum;
  if (!st->tok) {
    eldr_union_clear(&st->un);
    for (uint32_t j = 0; j < x->nrun; j++) eldr_union_add_token(&st->un, st->rows[j]);
    usum = eldr_union_count(&st->un, st->uni);
  } else if (st->tok->form == ELDR_SIM_TOK_IDS8) {
    usum = eldr_union_rows_ids8(&st->un, (const uint8_t *const *)st->rows, x->nrun, st->uni);
  } else {
    usum = eldr_union_rows_bits(&st->un, (const uint64_t *const *)st->rows, x->nrun, st->uni);
  }
  st->union_sum += usum;
  double lat = st->c->placements ? ep_step(st, k, x, (double)ctx)
                                 : eldr_latency_step(st->m, x->nrun, st->uni, (double)ctx);
  x->busy = 1;
  return heap_push(&st->h, now + lat, EV_STEP_DONE, k);
}

/* End of a step on decoder k: every member emitted a token; finished ones leave. */
static int step_done(simst *st, uint32_t k, double now) {
  dworker *x = &st->dw[k];
  uint32_t keep = 0;
  for (uint32_t j = 0; j < x->nrun; j++) {
    uint32_t id = x->run[j];
    sreq *q = &st->rq[id];
    q->pos++;
    st->tokens_out++;
    if (q->pos == 1) q->first = now;
    if (q->pos >= q->n_decode) {
      finish_request(st, q, k, now);
      x->changed = 1;
    } else
      x->run[keep++] = id;
  }
  x->nrun = keep;
  x->busy = 0;
  return start_step(st, k, now);
}

/* Prefill batch of worker w done: route each request to a decoder (the
 * policy sees in-flight loads) and start its KV transfer. */
static int prefill_done(simst *st, uint32_t w, double now, eldr_diag *d) {
  pworker *x = &st->pw[w];
  const eldr_sim_pool *pool = st->pool;
  int32_t cur = x->bhead;
  while (cur >= 0) {
    sreq *q = &st->rq[cur];
    int32_t nx = q->next;
    q->next = -1;
    q->pf_done = now;
    eldr_route_req rr = {NULL, st->tr->req[pool->idx[q->pool_i]].domain, NULL};
    if (pool->sigs) {
      uint32_t si = st->c->permute_signatures ? st->perm[q->pool_i] : q->pool_i;
      if (!pool->sig_ok || pool->sig_ok[si]) rr.sig = pool->sigs + (size_t)si * pool->dim;
    }
    eldr_fp_request fr = {NULL, 0, q->n_prefill};
    if (st->counts) { /* FOOTPRINT: the request's selection counts */
      uint32_t si = st->c->permute_signatures ? st->perm[q->pool_i] : q->pool_i;
      const eldr_request *src = &st->tr->req[pool->idx[si]];
      int dec_sel = st->c->footprint_oracle;
      eldr_trace_request_counts(st->tr, src, dec_sel, st->counts);
      fr.counts = st->counts;
      fr.n_tokens = dec_sel ? src->n_decode : src->n_prefill;
    }
    eldr_decision dec;
    int k = eldr_policy_decide(&st->pol, st->dloads, NULL, st->D, &rr, &fr, &dec);
    if (k < 0) return eldr_diag_fail(d, k, "sim: decode policy failed (%s)", eldr_strerror(k));
    if (dec.fallback != ELDR_FALLBACK_NONE) st->fallbacks++;
    q->pred = dec.pred_tpot;
    q->ticket = eldr_policy_on_route(&st->pol, k, &fr);
    if (st->fp && q->ticket == ELDR_FP_NO_TICKET)
      return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory (footprint)");
    if (st->c->log) {
      eldr_sim_log *lg = &st->c->log[cur];
      uint32_t mn = UINT32_MAX;
      for (size_t j = 0; j < st->D; j++)
        if (st->dloads[j] < mn) mn = st->dloads[j];
      lg->chosen_load = st->dloads[k];
      lg->min_load = mn;
      lg->fallback = (int)dec.fallback;
      lg->pred_tpot = dec.pred_tpot;
    }
    st->copies_sum += (double)(st->copies[q->pool_i] - 1);
    q->dec = k;
    st->dloads[k]++;
    int rc = heap_push(&st->h, now + eldr_latency_kv_transfer(st->m, q->n_prefill), EV_KV_ARRIVE,
                       (uint32_t)cur);
    if (rc < 0) return eldr_diag_fail(d, rc, "sim: out of memory");
    cur = nx;
  }
  x->bhead = -1;
  x->blen = 0;
  x->busy = 0;
  int rc = start_prefill(st, w, now);
  return rc < 0 ? eldr_diag_fail(d, rc, "sim: out of memory") : 0;
}

static int kv_arrive(simst *st, uint32_t id, double now) {
  sreq *q = &st->rq[id];
  uint32_t k = (uint32_t)q->dec;
  dworker *x = &st->dw[k];
  if (q->n_decode == 0) { /* nothing to decode: done at the handoff */
    q->first = now;
    finish_request(st, q, k, now);
    return 0;
  }
  if (x->wtail >= 0)
    st->rq[x->wtail].next = (int32_t)id;
  else
    x->whead = (int32_t)id;
  x->wtail = (int32_t)id;
  x->wlen++;
  if (x->busy) return 0;
  /* an idle decoder schedules at the end of this instant, so that requests
   * arriving at the same time join the same first step */
  x->busy = 1;
  return heap_push(&st->h, now, EV_WAKE, k);
}

int eldr_sim_run(const eldr_sim_pool *pool, const eldr_latency_model *m, const eldr_sim_config *c,
                 eldr_sim_result *res, eldr_diag *d) {
  if (!pool || !m || !c || !res) return eldr_diag_fail(d, ELDR_EINVAL, "sim: NULL argument");
  if (!pool->trace || !pool->idx || pool->n == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: empty serve pool");
  if (pool->n > UINT32_MAX / 2) return eldr_diag_fail(d, ELDR_EINVAL, "sim: pool too large");
  if (c->n_prefill == 0 || c->n_decode == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: need at least one prefill and one decode worker");
  if (c->n_prefill > 4096 || c->n_decode > 4096)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: at most 4096 workers per pool");
  if (c->max_batch == 0 || c->max_batch > 65536)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: max_batch must be in [1, 65536]");
  const eldr_trace *tr = pool->trace;
  const eldr_shape S = tr->shape;
  if (m->shape.num_layers != S.num_layers || m->shape.num_experts != S.num_experts ||
      m->shape.top_k != S.top_k)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "sim: latency model '%s' has shape %u layers x %u experts top-%u but the "
                          "trace has %u x %u top-%u",
                          m->model, m->shape.num_layers, m->shape.num_experts, m->shape.top_k,
                          S.num_layers, S.num_experts, S.top_k);
  for (size_t i = 0; i < pool->n; i++)
    if (pool->idx[i] >= tr->n)
      return eldr_diag_fail(d, ELDR_EINVAL, "sim: pool index %zu out of range", pool->idx[i]);
  if (pool->sigs && pool->dim == 0) return eldr_diag_fail(d, ELDR_EINVAL, "sim: signatures with dim 0");
  if (pool->centroids && pool->n_centroids && pool->dim == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: centroids with dim 0");
  int trace_mode = !(c->rate > 0);
  if (!trace_mode && !isfinite(c->rate)) return eldr_diag_fail(d, ELDR_EINVAL, "sim: rate must be finite");
  size_t N = trace_mode ? pool->n : c->n_requests;
  if (N == 0) return eldr_diag_fail(d, ELDR_EINVAL, "sim: zero requests");
  if (N > (size_t)INT32_MAX) return eldr_diag_fail(d, ELDR_EINVAL, "sim: too many requests");
  if (trace_mode)
    for (size_t i = 0; i < pool->n; i++)
      if (!(tr->req[pool->idx[i]].arrival >= 0))
        return eldr_diag_fail(d, ELDR_EINVAL,
                              "sim: request '%s' has no arrival timestamp (give a rate instead)",
                              tr->req[pool->idx[i]].id);
  size_t n_dom = tr->n_domains ? tr->n_domains : 1;
  if (c->placements) {
    const eldr_placement *p0 = c->placements[0];
    for (size_t k = 0; k < c->n_decode; k++) {
      const eldr_placement *p = c->placements[k];
      if (!p || p->num_layers != S.num_layers || p->num_experts != S.num_experts ||
          p->ep_size != p0->ep_size || p->num_physical != p0->num_physical || !p->ncopies)
        return eldr_diag_fail(d, ELDR_ESHAPE,
                              "sim: placement of decoder %zu is missing or does not match the trace "
                              "(%u layers x %u experts) and decoder 0's EP size", k, S.num_layers,
                              S.num_experts);
    }
    if (!(m->rank_hbm_bw > 0) || !(m->rank_flops > 0))
      return eldr_diag_fail(d, ELDR_EINVAL,
                            "sim: placements given but latency model '%s' has no EP rank bandwidth "
                            "(use an EP preset)", m->model);
  }

  simst st0 = {0}, *st = &st0;
  uint64_t sm = c->seed ^ 0x5eed5eedULL;
  uint64_t s_arr = eldr_splitmix64(&sm), s_pick = eldr_splitmix64(&sm), s_off = eldr_splitmix64(&sm),
           s_pol = eldr_splitmix64(&sm), s_perm = eldr_splitmix64(&sm);
  if (eldr_policy_init(&st->pol, c->policy, c->tau, s_pol, pool->centroids,
                       pool->centroids ? pool->n_centroids : 0, pool->dim, n_dom) < 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: invalid policy configuration (policy %s, tau %g)",
                          eldr_policy_name(c->policy), c->tau);
  st->pool = pool;
  st->tr = tr;
  st->m = m;
  st->c = c;
  st->L = S.num_layers;
  st->K = S.top_k;
  st->W = (S.num_experts + 63) / 64;
  st->P = c->n_prefill;
  st->D = c->n_decode;
  st->B = c->max_batch;
  st->N = N;
  st->first_arrival = -1;
  st->tpot_min = INFINITY;
  const size_t P = st->P, D = st->D, B = st->B;
  int rc = 0;
  st->rq = calloc(N, sizeof *st->rq);
  st->pw = calloc(P, sizeof *st->pw);
  st->dw = calloc(D, sizeof *st->dw);
  st->run_store = calloc(D * B, sizeof *st->run_store);
  st->ploads = calloc(P, sizeof *st->ploads);
  st->dloads = calloc(D, sizeof *st->dloads);
  if (eldr_union_init(&st->un, &S)) st->un.bits = NULL;
  st->uni = calloc(st->L, sizeof *st->uni);
  st->rows = calloc(B, sizeof *st->rows);
  st->perm = calloc(pool->n, sizeof *st->perm);
  st->copies = calloc(pool->n, sizeof *st->copies);
  st->bcount = calloc(pool->n, sizeof *st->bcount);
  st->stamp = calloc(pool->n, sizeof *st->stamp);
  st->phash = calloc(pool->n, sizeof *st->phash);
  st->tpot = calloc(N, sizeof *st->tpot);
  st->ttft = calloc(N, sizeof *st->ttft);
  uint32_t *shuffle = calloc(pool->n, sizeof *shuffle);
  if (c->placements &&
      (rc = eldr_ep_tally_init(&st->ep, (uint32_t)st->L, (uint32_t)st->K, c->placements[0]->ep_size,
                               c->placements[0]->num_physical, d)) < 0)
    goto out;
  if (!st->rq || !st->pw || !st->dw || !st->run_store || !st->ploads || !st->dloads || !st->un.bits ||
      !st->uni || !st->rows || !st->perm || !st->copies || !st->bcount || !st->stamp || !st->phash || !st->tpot ||
      !st->ttft || !shuffle) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
    goto out;
  }
  eldr_rng rng_arr, rng_pick, rng_off;
  eldr_rng_seed(&rng_arr, s_arr);
  eldr_rng_seed(&rng_pick, s_pick);
  eldr_rng_seed(&rng_off, s_off);
  {
    eldr_rng rp;
    eldr_rng_seed(&rp, s_perm);
    shuffle_pool(st->perm, pool->n, &rp);
  }
  for (size_t i = 0; i < pool->n; i++) st->phash[i] = prefix_hash(&tr->req[pool->idx[i]]);
  if (c->direct_union) {
    st->tok = NULL;
  } else if (pool->tokens) {
    st->tok = pool->tokens; /* borrowed: never freed or written here */
  } else if ((rc = eldr_sim_tokens_build(pool, ELDR_SIM_TOK_AUTO, &st->own_tok, d)) < 0) {
    goto out;
  } else {
    st->tok = st->own_tok;
  }
  if (st->tok && (st->tok->row_bytes != (st->tok->form == ELDR_SIM_TOK_IDS8
                                             ? st->L * st->K
                                             : st->L * st->W * sizeof(uint64_t)) ||
                  (st->tok->form == ELDR_SIM_TOK_IDS8 && st->W > 4))) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE, "sim: the pool's compact tokens do not match the trace's shape");
    goto out;
  }
  if (c->policy == ELDR_POLICY_FOOTPRINT && pool->policy_model) {
    eldr_footprint_opts fo = {.n_decoders = D, .max_batch = B, .layer_mask = c->footprint_mask};
    if (pool->policy_model->shape.num_layers != S.num_layers ||
        pool->policy_model->shape.num_experts != S.num_experts ||
        pool->policy_model->shape.top_k != S.top_k) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE, "sim: the policy's latency model has another shape than the trace");
      goto out;
    }
    if ((rc = eldr_footprint_new(pool->policy_model, &fo, &st->fp, d)) < 0) goto out;
    st->counts = calloc(eldr_shape_cells(&S), sizeof *st->counts);
    if (!st->counts) goto nomem;
    eldr_policy_attach_footprint(&st->pol, st->fp);
  }
  for (size_t p = 0; p < P; p++) st->pw[p].qhead = st->pw[p].qtail = st->pw[p].bhead = -1;
  for (size_t k = 0; k < D; k++) {
    st->dw[k].whead = st->dw[k].wtail = -1;
    st->dw[k].run = st->run_store + k * B;
  }
  double t0 = 0;
  size_t shuf_pos = 0;
  if (trace_mode) { /* the pool in arrival order (stable) */
    arr_key *keys = malloc(pool->n * sizeof *keys);
    if (!keys) goto nomem;
    for (size_t i = 0; i < pool->n; i++) keys[i] = (arr_key){tr->req[pool->idx[i]].arrival, (uint32_t)i};
    qsort(keys, pool->n, sizeof *keys, cmp_arrival);
    for (size_t i = 0; i < pool->n; i++) shuffle[i] = keys[i].i;
    free(keys);
    t0 = tr->req[pool->idx[shuffle[0]]].arrival;
  } else {
    shuffle_pool(shuffle, pool->n, &rng_pick);
  }

  size_t next_arrival = 0;
  double now = trace_mode ? 0.0 : eldr_rng_exponential(&rng_arr, c->rate);
  if ((rc = heap_push(&st->h, now, EV_ARRIVAL, 0)) < 0) goto nomem;
  while (st->h.n) {
    event e = heap_pop(&st->h);
    now = e.t;
    switch (e.type) {
    case EV_ARRIVAL: {
      uint32_t id = (uint32_t)next_arrival++;
      uint32_t pi;
      if (trace_mode) {
        pi = shuffle[id];
      } else {
        if (shuf_pos == pool->n) {
          shuffle_pool(shuffle, pool->n, &rng_pick);
          shuf_pos = 0;
        }
        pi = shuffle[shuf_pos++];
      }
      const eldr_request *r = &tr->req[pool->idx[pi]];
      sreq *q = &st->rq[id];
      q->pool_i = pi;
      q->tids = r->decode;
      q->trow = st->tok ? st->tok->rows + st->tok->off[pi] * st->tok->row_bytes : NULL;
      q->n_prefill = r->n_prefill;
      q->n_decode = r->n_decode;
      q->next = -1;
      q->dec = -1;
      q->ticket = ELDR_FP_NO_TICKET;
      q->arrival = now;
      q->offset = (c->decorrelate && r->n_decode > 1)
                      ? (uint32_t)eldr_rng_below(&rng_off, r->n_decode)
                      : 0;
      if (st->first_arrival < 0) st->first_arrival = now;
      st->copies[pi]++;
      for (size_t p = 0; p < P; p++) st->ploads[p] = st->pw[p].qlen + st->pw[p].blen;
      int w = eldr_policy_prefill(st->phash[pi], NULL, st->ploads, NULL, P, c->prefill_guard);
      if (w < 0) w = 0;
      q->pw = w;
      pworker *pp = &st->pw[w];
      if (pp->qtail >= 0)
        st->rq[pp->qtail].next = (int32_t)id;
      else
        pp->qhead = (int32_t)id;
      pp->qtail = (int32_t)id;
      pp->qlen++;
      if (next_arrival < N) {
        double tn = trace_mode ? tr->req[pool->idx[shuffle[next_arrival]]].arrival - t0
                               : now + eldr_rng_exponential(&rng_arr, c->rate);
        if (tn < now) tn = now;
        if ((rc = heap_push(&st->h, tn, EV_ARRIVAL, 0)) < 0) goto nomem;
      }
      if (!pp->busy) { /* start at the end of this instant: simultaneous arrivals share the batch */
        pp->busy = 1;
        if ((rc = heap_push(&st->h, now, EV_PREFILL_WAKE, (uint32_t)w)) < 0) goto nomem;
      }
      break;
    }
    case EV_PREFILL_DONE:
      if ((rc = prefill_done(st, e.id, now, d)) < 0) goto out;
      break;
    case EV_KV_ARRIVE:
      if ((rc = kv_arrive(st, e.id, now)) < 0) goto nomem;
      break;
    case EV_STEP_DONE:
      if ((rc = step_done(st, e.id, now)) < 0) goto nomem;
      break;
    case EV_PREFILL_WAKE:
      st->pw[e.id].busy = 0;
      if ((rc = start_prefill(st, e.id, now)) < 0) goto nomem;
      break;
    case EV_WAKE:
      st->dw[e.id].busy = 0;
      if ((rc = start_step(st, e.id, now)) < 0) goto nomem;
      break;
    default:
      break;
    }
  }
  if (st->completed != N) {
    rc = eldr_diag_fail(d, ELDR_EINVAL, "sim: internal error: %zu of %zu requests completed",
                        st->completed, N);
    goto out;
  }
  memset(res, 0, sizeof *res);
  res->n_requests = N;
  res->completed = st->completed;
  res->decode_requests = st->n_tpot;
  res->pool_size = pool->n;
  res->fallbacks = st->fallbacks;
  res->pred_rel_err = NAN;
  res->pred_corr = NAN;
  if (st->n_pred > 1) {
    double np = (double)st->n_pred, mp = st->pe_sum / np, ma = st->pa_sum / np;
    double cov = st->ap_sum / np - mp * ma, vp = st->pp_sum / np - mp * mp,
           va = st->aa_sum / np - ma * ma;
    res->pred_rel_err = st->rel_sum / np;
    res->pred_corr = vp > 0 && va > 0 ? cov / sqrt(vp * va) : NAN;
  }
  res->steps = st->steps;
  res->token_steps = st->token_steps;
  res->sim_seconds = now;
  res->makespan_s = st->last_finish - (st->first_arrival < 0 ? 0 : st->first_arrival);
  double sum = 0;
  for (size_t i = 0; i < st->n_tpot; i++) sum += st->tpot[i];
  res->tpot_mean = st->n_tpot ? sum / (double)st->n_tpot : NAN;
  res->tpot_min = st->n_tpot ? st->tpot_min : NAN;
  res->tpot_p50 = eldr_quantile(st->tpot, st->n_tpot, 0.5);
  res->tpot_p99 = eldr_quantile_sorted(st->tpot, st->n_tpot, 0.99); /* sorted by the p50 */
  res->ttft_p50 = eldr_quantile(st->ttft, st->completed, 0.5);
  res->ttft_p99 = eldr_quantile_sorted(st->ttft, st->completed, 0.99);
  res->throughput_tok_s = res->makespan_s > 0 ? (double)st->tokens_out / res->makespan_s : 0;
  res->throughput_req_s = res->makespan_s > 0 ? (double)st->completed / res->makespan_s : 0;
  res->mean_batch = st->steps ? (double)st->token_steps / (double)st->steps : 0;
  res->mean_union = st->steps ? (double)st->union_sum / ((double)st->steps * (double)st->L) : 0;
  res->copies_in_flight = st->completed ? st->copies_sum / (double)st->completed : 0;
  res->batch_dup_frac = st->token_steps ? (double)st->dup_steps / (double)st->token_steps : 0;
  res->ep_busiest_share = st->ep.all_tokens > 0 ? st->ep.busiest_tokens / st->ep.all_tokens : NAN;
  if (c->log)
    for (size_t i = 0; i < N; i++) {
      eldr_sim_log *lg = &c->log[i];
      const sreq *q = &st->rq[i];
      lg->pool_index = q->pool_i;
      lg->prefill_worker = q->pw;
      lg->decoder = q->dec;
      lg->arrival = q->arrival;
      lg->prefill_done = q->pf_done;
      lg->first_token = q->first;
      lg->finish = q->finish;
      lg->tokens = q->pos;
      lg->completions = q->done;
    }
  if (c->progress) c->progress(c->progress_ctx, st->completed, N);
  goto out;
nomem:
  rc = eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
out:
  eldr_ep_tally_free(&st->ep);
  free(st->counts);
  eldr_footprint_free(st->fp);
  free(shuffle);
  eldr_sim_tokens_free(st->own_tok);
  free(st->ttft);
  free(st->tpot);
  free(st->phash);
  free(st->stamp);
  free(st->bcount);
  free(st->copies);
  free(st->perm);
  free(st->rows);
  free(st->uni);
  eldr_union_free(&st->un);
  free(st->dloads);
  free(st->ploads);
  free(st->run_store);
  free(st->dw);
  free(st->pw);
  free(st->rq);
  free(st->h.v);
  return rc;
}
