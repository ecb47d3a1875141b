/* sim.c — discrete-event xPyD cluster simulator (see include/eldr/sim.h;
 * the files of the simulator: sim/sim_int.h). The run, in phases:
 * sim_check (arguments), sim_setup (state, streams, the policy), the
 * event loop (sim_loop) with one handler per event, sim_collect
 * (sim_metrics.c), sim_free. A decode decision is one function
 * (route_decode) of the request and the decoders' state, called when the
 * request's prefill batch ends. */
#include "eldr/sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "eldr/batch_union.h"
#include "eldr/grow.h"
#include "eldr/predict.h"
#include "eldr/rng.h"
#include "sim/sim_int.h"

/* ---- the event heap --------------------------------------------------- */

static inline int ev_late(uint32_t type) { return type == EV_WAKE || type == EV_PREFILL_WAKE; }

/* Time, then the wakes after everything else of the instant, then order of
 * scheduling. */
static inline int ev_less(const sim_event *a, const sim_event *b) {
  if (a->t != b->t) return a->t < b->t;
  int la = ev_late(a->type), lb = ev_late(b->type);
  if (la != lb) return la < lb;
  return a->seq < b->seq;
}

static int heap_push(sim_heap *h, double t, uint32_t type, uint32_t id) {
  if (h->n == h->cap && eldr_grow(&h->v, &h->cap, h->n + 1, sizeof *h->v, 256)) return ELDR_ENOMEM;
  sim_event e = {t, h->seq++, type, id};
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

static sim_event heap_pop(sim_heap *h) {
  sim_event top = h->v[0];
  sim_event last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const sim_event *best = &last;
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
  c->known_fraction = -1;
  c->predict_threshold = ELDR_PREDICT_THRESHOLD_DEFAULT;
}

static const char *const PD_NAMES[] = {"vllm", "sglang", "sglang-exact"};

const char *eldr_sim_pd_name(eldr_sim_pd pd) {
  return (unsigned)pd < sizeof PD_NAMES / sizeof *PD_NAMES ? PD_NAMES[pd] : "?";
}

int eldr_sim_pd_parse(const char *name, eldr_sim_pd *out) {
  for (unsigned i = 0; name && i < sizeof PD_NAMES / sizeof *PD_NAMES; i++)
    if (!strcmp(name, PD_NAMES[i])) {
      *out = (eldr_sim_pd)i;
      return 0;
    }
  return ELDR_EINVAL;
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

/* ---- prefill ------------------------------------------------------------ */

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

/* ---- decode steps ------------------------------------------------------- */

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

/* Copies of one recorded request in decoder x's batch (step number stp):
 * recounted when the membership changed. */
static void count_dups(simst *st, dworker *x, uint64_t stp) {
  if (!x->changed) return;
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
  uint32_t gaps = 0;
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
    gaps += q->pos > 0;
  }
  count_dups(st, x, stp);
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
  const double ulayer = (double)usum / (double)L, b = (double)x->nrun;
  for (uint32_t j = 0; j < x->nrun; j++) { /* what each member's step saw */
    sreq *q = &st->rq[x->run[j]];
    q->useen += ulayer;
    q->bseen += b;
  }
  double lat = st->c->placements ? ep_step(st, k, x, (double)ctx)
                                 : eldr_latency_step(st->m, x->nrun, st->uni, (double)ctx);
  x->busy = 1;
  x->t_start = now;
  x->n_gaps = gaps;
  return heap_push(&st->h, now + lat, EV_STEP_DONE, k);
}

/* End of a step on decoder k: every member emitted a token; finished ones leave. */
static int step_done(simst *st, uint32_t k, double now) {
  dworker *x = &st->dw[k];
  if (sim_step_gaps(st, x->n_gaps, now - x->t_start)) return ELDR_ENOMEM;
  uint32_t keep = 0;
  for (uint32_t j = 0; j < x->nrun; j++) {
    uint32_t id = x->run[j];
    sreq *q = &st->rq[id];
    q->pos++;
    st->tokens_out++;
    if (q->pos == 1) q->first = now;
    if (q->pos >= q->n_decode) {
      sim_finish_request(st, q, k, now);
      x->changed = 1;
    } else
      x->run[keep++] = id;
  }
  x->nrun = keep;
  x->busy = 0;
  return start_step(st, k, now);
}

/* ---- decode routing ----------------------------------------------------- */

/* What is known of pool request si when it is decided on a prediction:
 * its held blocks' counts (the run's signature cache), or the counts of the
 * first known_fraction of its prompt, into st->pcounts. The known tokens. */
static uint64_t predict_counts(simst *st, uint32_t si) {
  const eldr_sim_pool *pool = st->pool;
  const eldr_request *r = &st->tr->req[pool->idx[si]];
  const size_t cells = eldr_shape_cells(&st->tr->shape);
  uint64_t known = 0;
  if (st->c->known_fraction >= 0)
    return eldr_trace_request_prefix_counts(st->tr, r, st->c->known_fraction, st->pcounts);
  memset(st->pcounts, 0, cells * sizeof *st->pcounts);
  const eldr_block_table *bt = pool->blocks;
  if (!bt) return 0;
  const size_t ti = pool->idx[si];
  for (uint32_t j = bt->off[ti]; j < bt->off[ti + 1]; j++) {
    uint32_t b = bt->ids[j];
    if (!st->held[b]) continue;
    const uint16_t *row = bt->counts + (size_t)b * cells;
    for (size_t c = 0; c < cells; c++) st->pcounts[c] += row[c];
    known += bt->block_tokens;
  }
  return known;
}

/* Request q's prefill ended: its blocks are held by the run's cache. */
static void hold_blocks(simst *st, const sreq *q) {
  const eldr_block_table *bt = st->pool->blocks;
  if (!bt || !st->held) return;
  const size_t ti = st->pool->idx[q->pool_i];
  for (uint32_t j = bt->off[ti]; j < bt->off[ti + 1]; j++) st->held[bt->ids[j]] = 1;
}

/* The decode decision for request id: what the router knows of it (its
 * prefill signature, or with predict its predicted one: eldr/predict.h's
 * rule; domain label; FOOTPRINT its selection counts) and the decoders'
 * in-flight loads, through eldr_policy_decide; the replay metrics and the
 * log at the decision. Returns the decoder or an error. */
static int route_decode(simst *st, uint32_t id, int predict, eldr_diag *d) {
  sreq *q = &st->rq[id];
  const eldr_sim_pool *pool = st->pool;
  eldr_route_req rr = {NULL, st->tr->req[pool->idx[q->pool_i]].domain, NULL};
  const uint32_t si = st->c->permute_signatures ? st->perm[q->pool_i] : q->pool_i;
  eldr_fp_request fr = {NULL, 0, q->n_prefill, NULL};
  q->confidence = -1;
  if (predict) {
    uint64_t known = predict_counts(st, si);
    double conf = eldr_predict_confidence(known, q->n_prefill);
    q->confidence = conf;
    st->conf_sum += conf;
    st->conf_n++;
    if (eldr_predict_usable(conf, known, st->c->predict_threshold)) {
      q->predicted = 1;
      st->predicted++;
      if (pool->spec && pool->dim && eldr_signature_build(pool->spec, st->pcounts, NULL, st->psig) == 0)
        rr.sig = st->psig;
      if (st->counts) {
        fr.counts = st->pcounts;
        fr.n_tokens = known > UINT32_MAX ? UINT32_MAX : (uint32_t)known;
      }
    }
  } else {
    if (pool->sigs && (!pool->sig_ok || pool->sig_ok[si])) rr.sig = pool->sigs + (size_t)si * pool->dim;
    if (st->counts) { /* FOOTPRINT: the request's selection counts */
      const eldr_request *src = &st->tr->req[pool->idx[si]];
      int dec_sel = st->c->footprint_oracle;
      eldr_trace_request_counts(st->tr, src, dec_sel, st->counts);
      fr.counts = st->counts;
      fr.n_tokens = dec_sel ? src->n_decode : src->n_prefill;
    }
  }
  fr.sig = rr.sig;
  eldr_decision dec;
  int k = eldr_policy_decide(&st->pol, st->dloads, NULL, st->D, &rr, &fr, &dec);
  if (k < 0) return eldr_diag_fail(d, k, "sim: decode policy failed (%s)", eldr_strerror(k));
  if (dec.fallback != ELDR_FALLBACK_NONE) st->fallbacks++;
  q->pred = dec.pred_tpot;
  if (st->fp) {
    eldr_fp_explain ex;
    eldr_footprint_explain(st->fp, &ex);
    q->pred_union = ex.union_mean;
  }
  q->ticket = eldr_policy_on_route(&st->pol, k, &fr);
  if (st->fp && q->ticket == ELDR_FP_NO_TICKET)
    return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory (footprint)");
  if (st->c->log) {
    eldr_sim_log *lg = &st->c->log[id];
    uint32_t mn = UINT32_MAX;
    for (size_t j = 0; j < st->D; j++)
      if (st->dloads[j] < mn) mn = st->dloads[j];
    lg->chosen_load = st->dloads[k];
    lg->min_load = mn;
    lg->fallback = (int)dec.fallback;
    lg->pred_tpot = dec.pred_tpot;
  }
  st->copies_sum += (double)(st->copies[q->pool_i] - 1);
  if (st->copies_on) { /* of the other copies already routed, the share on k */
    uint32_t *on = st->copies_on + (size_t)q->pool_i * st->D, routed = 0;
    for (size_t j = 0; j < st->D; j++) routed += on[j];
    if (routed) {
      st->affinity_sum += (double)on[k] / (double)routed;
      st->affinity_n++;
    }
    on[k]++;
  }
  q->dec = k;
  st->dloads[k]++;
  return k;
}

/* SGLANG: the prefill of a request decided at arrival ended: footprint's
 * contribution becomes the true counts (eldr_footprint_replace). */
static int replace_prediction(simst *st, sreq *q, eldr_diag *d) {
  if (!st->fp || q->ticket == ELDR_FP_NO_TICKET) return 0;
  const eldr_sim_pool *pool = st->pool;
  const uint32_t si = st->c->permute_signatures ? st->perm[q->pool_i] : q->pool_i;
  const eldr_request *src = &st->tr->req[pool->idx[si]];
  int dec_sel = st->c->footprint_oracle;
  eldr_trace_request_counts(st->tr, src, dec_sel, st->counts);
  const float *sig = pool->sigs && (!pool->sig_ok || pool->sig_ok[si]) ? pool->sigs + (size_t)si * pool->dim : NULL;
  eldr_fp_request fr = {st->counts, dec_sel ? src->n_decode : src->n_prefill, q->n_prefill, sig};
  int err = 0;
  uint64_t tk = eldr_footprint_replace(st->fp, q->ticket, &fr, &err);
  if (tk == ELDR_FP_NO_TICKET) return eldr_diag_fail(d, err ? err : ELDR_ENOMEM, "sim: footprint replace failed");
  q->ticket = tk;
  return 0;
}

/* Prefill batch of worker w done: route each request to a decoder and start
 * its KV transfer; then the worker's next batch. */
static int prefill_done(simst *st, uint32_t w, double now, eldr_diag *d) {
  pworker *x = &st->pw[w];
  int32_t cur = x->bhead;
  while (cur >= 0) {
    sreq *q = &st->rq[cur];
    int32_t nx = q->next;
    q->next = -1;
    q->pf_done = now;
    double kv_at = now + eldr_latency_kv_transfer(st->m, q->n_prefill);
    if (st->c->pd == ELDR_SIM_PD_SGLANG) { /* decided at arrival */
      int rc = replace_prediction(st, q, d);
      if (rc < 0) return rc;
    } else {
      int k = route_decode(st, (uint32_t)cur, st->c->known_fraction >= 0, d);
      if (k < 0) return k;
      kv_at += st->c->register_s;
    }
    hold_blocks(st, q);
    int rc = heap_push(&st->h, kv_at, EV_KV_ARRIVE, (uint32_t)cur);
    if (rc < 0) return eldr_diag_fail(d, rc, "sim: out of memory");
    cur = nx;
  }
  x->bhead = -1;
  x->blen = 0;
  x->busy = 0;
  int rc = start_prefill(st, w, now);
  return rc < 0 ? eldr_diag_fail(d, rc, "sim: out of memory") : 0;
}

/* The request's KV reached its decoder: it waits for the next step. */
static int kv_arrive(simst *st, uint32_t id, double now) {
  sreq *q = &st->rq[id];
  uint32_t k = (uint32_t)q->dec;
  dworker *x = &st->dw[k];
  if (q->n_decode == 0) { /* nothing to decode: done at the handoff */
    q->first = now;
    sim_finish_request(st, q, k, now);
    return 0;
  }
  if (x->wtail >= 0)
    st->rq[x->wtail].next = (int32_t)id;
  else
    x->whead = (int32_t)id;
  x->wtail = (int32_t)id;
  x->wlen++;
  if (x->busy) return 0;
  /* an idle decoder starts at the end of this instant (a wake sorts after
   * every other event of its time), so that requests arriving at the same
   * time join the same first step */
  x->busy = 1;
  return heap_push(&st->h, now, EV_WAKE, k);
}

/* ---- arrivals ----------------------------------------------------------- */

/* The next arrival: a recorded request of the pool (the trace's next one,
 * or the next of the seeded shuffles), its prefill worker (prefix hash with
 * a load guard), and the arrival after it. */
static int on_arrival(simst *st, double now, eldr_diag *d) {
  const eldr_sim_pool *pool = st->pool;
  const eldr_trace *tr = st->tr;
  const eldr_sim_config *c = st->c;
  uint32_t id = (uint32_t)st->next_arrival++;
  uint32_t pi;
  if (st->trace_mode) {
    pi = st->shuffle[id];
  } else {
    if (st->shuf_pos == pool->n) {
      shuffle_pool(st->shuffle, pool->n, &st->rng_pick);
      st->shuf_pos = 0;
    }
    pi = st->shuffle[st->shuf_pos++];
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
  q->offset = (c->decorrelate && r->n_decode > 1) ? (uint32_t)eldr_rng_below(&st->rng_off, r->n_decode)
                                                  : 0;
  if (st->first_arrival < 0) st->first_arrival = now;
  st->copies[pi]++;
  const size_t P = st->P;
  for (size_t p = 0; p < P; p++) st->ploads[p] = st->pw[p].qlen + st->pw[p].blen;
  int w = eldr_policy_prefill(st->phash[pi], NULL, st->ploads, NULL, P, c->prefill_guard);
  if (w < 0) w = 0;
  q->pw = w;
  int rc;
  if (c->pd == ELDR_SIM_PD_SGLANG && (rc = route_decode(st, id, 1, d)) < 0) return rc;
  pworker *pp = &st->pw[w];
  if (pp->qtail >= 0)
    st->rq[pp->qtail].next = (int32_t)id;
  else
    pp->qhead = (int32_t)id;
  pp->qtail = (int32_t)id;
  pp->qlen++;
  if (st->next_arrival < st->N) {
    double tn = st->trace_mode
                    ? (tr->req[pool->idx[st->shuffle[st->next_arrival]]].arrival - st->t0) * st->tscale
                    : now + eldr_rng_exponential(&st->rng_arr, c->rate);
    if (tn < now) tn = now;
    if ((rc = heap_push(&st->h, tn, EV_ARRIVAL, 0)) < 0) return eldr_diag_fail(d, rc, "sim: out of memory");
  }
  if (!pp->busy) { /* start at the end of this instant: simultaneous arrivals share the batch */
    pp->busy = 1;
    if ((rc = heap_push(&st->h, now, EV_PREFILL_WAKE, (uint32_t)w)) < 0)
      return eldr_diag_fail(d, rc, "sim: out of memory");
  }
  return 0;
}

/* ---- the run ------------------------------------------------------------ */

/* Arguments: NULLs, sizes, shapes, timestamps, placements. Sets the number
 * of arrivals and the arrival mode. */
static int sim_check(const eldr_sim_pool *pool, const eldr_latency_model *m, const eldr_sim_config *c,
                     const eldr_sim_result *res, size_t *n_out, int *trace_mode, eldr_diag *d) {
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
  if ((unsigned)c->pd > ELDR_SIM_PD_SGLANG_EXACT) return eldr_diag_fail(d, ELDR_EINVAL, "sim: unknown pd mode %d", (int)c->pd);
  if (!(c->known_fraction <= 1) && !(c->known_fraction < 0))
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: known_fraction must be in [0, 1] (or < 0: off)");
  if (!(c->predict_threshold >= 0) || !(c->predict_threshold <= 1))
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: predict_threshold must be in [0, 1]");
  if (!(c->register_s >= 0) || !isfinite(c->register_s))
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: register_s must be >= 0 and finite");
  if (c->known_fraction >= 0)
    for (size_t i = 0; i < pool->n; i++)
      if (eldr_request_is_counts(&pool->trace->req[pool->idx[i]]))
        return eldr_diag_fail(d, ELDR_EINVAL,
                              "sim: a known fraction of the prompt needs per-token prefill rows; "
                              "request '%s' is in counts form", pool->trace->req[pool->idx[i]].id);
  if (pool->blocks && (pool->blocks->n_req < pool->trace->n ||
                       pool->blocks->cells != eldr_shape_cells(&pool->trace->shape) ||
                       !pool->blocks->block_tokens))
    return eldr_diag_fail(d, ELDR_ESHAPE, "sim: the pool's block table does not match its trace");
  if (pool->spec && pool->dim && eldr_signature_dim(pool->spec) != pool->dim)
    return eldr_diag_fail(d, ELDR_ESHAPE, "sim: the signature spec's dim differs from the pool's");
  *trace_mode = !(c->rate > 0) || c->scale_arrivals;
  if (!*trace_mode && !isfinite(c->rate)) return eldr_diag_fail(d, ELDR_EINVAL, "sim: rate must be finite");
  size_t N = *trace_mode ? pool->n : c->n_requests;
  if (N == 0) return eldr_diag_fail(d, ELDR_EINVAL, "sim: zero requests");
  if (N > (size_t)INT32_MAX) return eldr_diag_fail(d, ELDR_EINVAL, "sim: too many requests");
  if (*trace_mode)
    for (size_t i = 0; i < pool->n; i++)
      if (!(tr->req[pool->idx[i]].arrival >= 0))
        return eldr_diag_fail(d, ELDR_EINVAL,
                              "sim: request '%s' has no arrival timestamp (give a rate instead)",
                              tr->req[pool->idx[i]].id);
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
  *n_out = N;
  return 0;
}

static void sim_free(simst *st) {
  free(st->pcounts);
  free(st->psig);
  free(st->held);
  eldr_ep_tally_free(&st->ep);
  free(st->counts);
  eldr_footprint_free(st->fp);
  free(st->shuffle);
  eldr_sim_tokens_free(st->own_tok);
  free(st->gaps.v);
  free(st->e2e);
  free(st->tpot_pf);
  free(st->ttft);
  free(st->tpot);
  free(st->phash);
  free(st->stamp);
  free(st->bcount);
  free(st->copies_on);
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
}

/* The compact tokens a run reads: the pool's (borrowed), its own, or none
 * (direct_union, or no form applies). */
static int setup_tokens(simst *st, eldr_diag *d) {
  if (st->c->direct_union) {
    st->tok = NULL;
  } else if (st->pool->tokens) {
    st->tok = st->pool->tokens; /* borrowed: never freed or written here */
  } else {
    int rc = eldr_sim_tokens_build(st->pool, ELDR_SIM_TOK_AUTO, &st->own_tok, d);
    if (rc < 0) return rc;
    st->tok = st->own_tok;
  }
  if (st->tok && (st->tok->row_bytes != (st->tok->form == ELDR_SIM_TOK_IDS8
                                             ? st->L * st->K
                                             : st->L * st->W * sizeof(uint64_t)) ||
                  (st->tok->form == ELDR_SIM_TOK_IDS8 && st->W > 4)))
    return eldr_diag_fail(d, ELDR_ESHAPE, "sim: the pool's compact tokens do not match the trace's shape");
  return 0;
}

/* FOOTPRINT with the pool's policy model: the run's footprint state. */
static int setup_footprint(simst *st, eldr_diag *d) {
  const eldr_sim_pool *pool = st->pool;
  const eldr_shape *S = &st->tr->shape;
  if (st->c->policy != ELDR_POLICY_FOOTPRINT || !pool->policy_model) return 0;
  eldr_footprint_opts fo = {.n_decoders = st->D, .max_batch = st->B,
                            .layer_mask = st->c->footprint_mask, .own_weight = st->c->footprint_own_weight};
  if (!st->c->footprint_no_prior) {
    fo.prior = pool->policy_prior;
    fo.n_priors = pool->policy_n_priors;
    fo.prior_tokens = pool->policy_prior_tokens;
    if (fo.n_priors > 1 && (fo.n_priors - 1 != pool->n_centroids || !pool->centroids))
      return eldr_diag_fail(d, ELDR_EINVAL, "sim: %zu cluster priors but %zu centroids",
                            fo.n_priors - 1, pool->n_centroids);
    fo.centroids = pool->centroids;
    fo.dim = pool->dim;
  }
  if (st->c->footprint_home_weight > 0) { /* every footprint row, the oracle's and the raw one's too */
    if (!pool->centroids || pool->n_centroids != st->D)
      return eldr_diag_fail(d, ELDR_EINVAL, "sim: footprint's home weight needs one centroid per decoder "
                            "(%zu centroids, %zu decoders)", pool->centroids ? pool->n_centroids : 0, st->D);
    fo.home_weight = st->c->footprint_home_weight;
    fo.home_centroids = pool->centroids;
    fo.dim = pool->dim;
  }
  if (pool->policy_model->shape.num_layers != S->num_layers ||
      pool->policy_model->shape.num_experts != S->num_experts ||
      pool->policy_model->shape.top_k != S->top_k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "sim: the policy's latency model has another shape than the trace");
  int rc = eldr_footprint_new(pool->policy_model, &fo, &st->fp, d);
  if (rc < 0) return rc;
  st->counts = calloc(eldr_shape_cells(S), sizeof *st->counts);
  if (!st->counts) return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
  eldr_policy_attach_footprint(&st->pol, st->fp);
  return 0;
}

/* The run's state: arrays, the seed's streams, the policy, the tokens, the
 * arrival order and the first arrival on the heap. */
static int sim_setup(simst *st, const eldr_sim_pool *pool, const eldr_latency_model *m,
                     const eldr_sim_config *c, size_t N, int trace_mode, eldr_diag *d) {
  const eldr_trace *tr = pool->trace;
  const eldr_shape S = tr->shape;
  uint64_t sm = c->seed ^ 0x5eed5eedULL;
  uint64_t s_arr = eldr_splitmix64(&sm), s_pick = eldr_splitmix64(&sm), s_off = eldr_splitmix64(&sm),
           s_pol = eldr_splitmix64(&sm), s_perm = eldr_splitmix64(&sm);
  size_t n_dom = tr->n_domains ? tr->n_domains : 1;
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
  st->trace_mode = trace_mode;
  st->first_arrival = -1;
  st->tpot_min = INFINITY;
  const size_t P = st->P, D = st->D, B = st->B;
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
  if (pool->n <= ((size_t)1 << 26) / D) st->copies_on = calloc(pool->n * D, sizeof *st->copies_on);
  st->bcount = calloc(pool->n, sizeof *st->bcount);
  st->stamp = calloc(pool->n, sizeof *st->stamp);
  st->phash = calloc(pool->n, sizeof *st->phash);
  st->tpot = calloc(N, sizeof *st->tpot);
  st->tpot_pf = calloc(N, sizeof *st->tpot_pf);
  st->ttft = calloc(N, sizeof *st->ttft);
  st->e2e = calloc(N, sizeof *st->e2e);
  st->shuffle = calloc(pool->n, sizeof *st->shuffle);
  int rc;
  if (c->placements &&
      (rc = eldr_ep_tally_init(&st->ep, (uint32_t)st->L, (uint32_t)st->K, c->placements[0]->ep_size,
                               c->placements[0]->num_physical, d)) < 0)
    return rc;
  if (!st->rq || !st->pw || !st->dw || !st->run_store || !st->ploads || !st->dloads || !st->un.bits ||
      !st->uni || !st->rows || !st->perm || !st->copies || !st->bcount || !st->stamp ||
      !st->phash || !st->tpot || !st->tpot_pf || !st->ttft || !st->e2e || !st->shuffle)
    return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
  eldr_rng_seed(&st->rng_arr, s_arr);
  eldr_rng_seed(&st->rng_pick, s_pick);
  eldr_rng_seed(&st->rng_off, s_off);
  {
    eldr_rng rp;
    eldr_rng_seed(&rp, s_perm);
    shuffle_pool(st->perm, pool->n, &rp);
  }
  for (size_t i = 0; i < pool->n; i++) st->phash[i] = prefix_hash(&tr->req[pool->idx[i]]);
  if ((rc = setup_tokens(st, d)) < 0 || (rc = setup_footprint(st, d)) < 0) return rc;
  if (c->pd == ELDR_SIM_PD_SGLANG || c->known_fraction >= 0) { /* predicting */
    st->pcounts = calloc(eldr_shape_cells(&S), sizeof *st->pcounts);
    st->psig = calloc(pool->dim ? pool->dim : 1, sizeof *st->psig);
    if (pool->blocks) st->held = calloc(pool->blocks->n_blocks ? pool->blocks->n_blocks : 1, 1);
    if (!st->pcounts || !st->psig || (pool->blocks && !st->held))
      return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
  }
  for (size_t p = 0; p < P; p++) st->pw[p].qhead = st->pw[p].qtail = st->pw[p].bhead = -1;
  for (size_t k = 0; k < D; k++) {
    st->dw[k].whead = st->dw[k].wtail = -1;
    st->dw[k].run = st->run_store + k * B;
  }
  if (trace_mode) { /* the pool in arrival order (stable) */
    arr_key *keys = malloc(pool->n * sizeof *keys);
    if (!keys) return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
    for (size_t i = 0; i < pool->n; i++) keys[i] = (arr_key){tr->req[pool->idx[i]].arrival, (uint32_t)i};
    qsort(keys, pool->n, sizeof *keys, cmp_arrival);
    for (size_t i = 0; i < pool->n; i++) st->shuffle[i] = keys[i].i;
    free(keys);
    st->t0 = tr->req[pool->idx[st->shuffle[0]]].arrival;
    st->tscale = 1;
    if (c->scale_arrivals && c->rate > 0 && pool->n > 1) { /* (n - 1) gaps at the rate */
      double span = tr->req[pool->idx[st->shuffle[pool->n - 1]]].arrival - st->t0;
      st->tscale = span > 0 ? (double)(pool->n - 1) / c->rate / span : 1;
    }
  } else {
    shuffle_pool(st->shuffle, pool->n, &st->rng_pick);
  }
  double first = trace_mode ? 0.0 : eldr_rng_exponential(&st->rng_arr, c->rate);
  if (heap_push(&st->h, first, EV_ARRIVAL, 0) < 0)
    return eldr_diag_fail(d, ELDR_ENOMEM, "sim: out of memory");
  return 0;
}

/* Events in time order until none is left; *now_out is the last one's time. */
static int sim_loop(simst *st, double *now_out, eldr_diag *d) {
  double now = 0;
  int rc = 0;
  while (st->h.n && rc >= 0) {
    sim_event e = heap_pop(&st->h);
    now = e.t;
    switch (e.type) {
    case EV_ARRIVAL:
      if ((rc = on_arrival(st, now, d)) < 0) return rc;
      break;
    case EV_PREFILL_DONE:
      if ((rc = prefill_done(st, e.id, now, d)) < 0) return rc;
      break;
    case EV_KV_ARRIVE: rc = kv_arrive(st, e.id, now); break;
    case EV_STEP_DONE: rc = step_done(st, e.id, now); break;
    case EV_PREFILL_WAKE:
      st->pw[e.id].busy = 0;
      rc = start_prefill(st, e.id, now);
      break;
    case EV_WAKE:
      st->dw[e.id].busy = 0;
      rc = start_step(st, e.id, now);
      break;
    default: break;
    }
  }
  if (rc < 0) return eldr_diag_fail(d, rc, "sim: out of memory");
  *now_out = now;
  if (st->completed != st->N)
    return eldr_diag_fail(d, ELDR_EINVAL, "sim: internal error: %zu of %zu requests completed",
                          st->completed, st->N);
  return 0;
}

int eldr_sim_run(const eldr_sim_pool *pool, const eldr_latency_model *m, const eldr_sim_config *c,
                 eldr_sim_result *res, eldr_diag *d) {
  size_t N = 0;
  int trace_mode = 0;
  int rc = sim_check(pool, m, c, res, &N, &trace_mode, d);
  if (rc) return rc;
  simst st = {0};
  double now = 0;
  if ((rc = sim_setup(&st, pool, m, c, N, trace_mode, d)) == 0 &&
      (rc = sim_loop(&st, &now, d)) == 0) {
    sim_collect(&st, now, res);
    if (c->progress) c->progress(c->progress_ctx, st.completed, N);
  }
  sim_free(&st);
  return rc;
}
