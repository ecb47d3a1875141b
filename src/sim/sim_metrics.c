/* sim_metrics.c — what a run measures (see eldr/sim.h for the definitions):
 * per finished request TTFT, TPOT, TPOT from the prefill's end and
 * end-to-end latency; per decode step its inter-token gaps; then the
 * result's quantiles and the per-request log. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"
#include "eldr/quantile.h"
#include "sim/sim_int.h"

void sim_finish_request(simst *st, sreq *q, uint32_t k, double now) {
  q->finish = now;
  q->done++;
  st->ttft[st->completed] = q->first - q->arrival;
  st->e2e[st->completed++] = q->finish - q->arrival;
  if (q->n_decode >= 2) {
    double tp = (q->finish - q->first) / (double)(q->n_decode - 1);
    st->tpot_pf[st->n_tpot] = (q->finish - q->pf_done) / (double)q->n_decode;
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
  if (st->copies_on) st->copies_on[(size_t)q->pool_i * st->D + k]--;
  st->dloads[k]--;
  if (now > st->last_finish) st->last_finish = now;
  if (st->c->progress && (st->completed & 4095) == 0)
    st->c->progress(st->c->progress_ctx, st->completed, st->N);
}

int sim_step_gaps(simst *st, uint32_t gaps, double dur) {
  if (!gaps) return 0;
  sim_gaps *g = &st->gaps;
  if (eldr_grow(&g->v, &g->cap, g->n + 1, sizeof *g->v, 1024)) return ELDR_ENOMEM;
  g->v[g->n++] = (sim_gap){dur, gaps};
  return 0;
}

static int cmp_gap(const void *a, const void *b) {
  const sim_gap *x = a, *y = b;
  return (x->d > y->d) - (x->d < y->d);
}

/* Quantiles q[0..nq) of the gaps, each step's duration counted w times: the
 * same interpolation as eldr_quantile on the expanded list (position
 * q * (n - 1)). Sorts g. NaN without gaps. */
static void gap_quantiles(sim_gaps *g, const double *q, size_t nq, double *out) {
  for (size_t i = 0; i < nq; i++) out[i] = NAN;
  if (!g->n) return;
  sim_gap *v = g->v;
  double total = 0;
  for (size_t i = 0; i < g->n; i++) total += v[i].w;
  qsort(v, g->n, sizeof *v, cmp_gap);
  for (size_t qi = 0; qi < nq; qi++) {
    double pos = q[qi] * (total - 1), lo = floor(pos), frac = pos - lo;
    /* the values at expanded positions lo and lo + 1 */
    double seen = 0, a = NAN, b = NAN;
    for (size_t i = 0; i < g->n; i++) {
      double next = seen + v[i].w;
      if (isnan(a) && lo < next) a = v[i].d;
      if (lo + 1 < next) {
        b = v[i].d;
        break;
      }
      seen = next;
    }
    if (isnan(b)) b = a;
    out[qi] = a + frac * (b - a);
  }
}

static double mean_of(const double *v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += v[i];
  return n ? s / (double)n : NAN;
}

void sim_collect(simst *st, double now, eldr_sim_result *res) {
  const eldr_sim_config *c = st->c;
  memset(res, 0, sizeof *res);
  res->n_requests = st->N;
  res->completed = st->completed;
  res->decode_requests = st->n_tpot;
  res->pool_size = st->pool->n;
  res->fallbacks = st->fallbacks;
  res->decisions = st->N;
  res->predicted = st->predicted;
  res->confidence_mean = st->conf_n ? st->conf_sum / (double)st->conf_n : NAN;
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
  res->tpot_mean = st->n_tpot ? mean_of(st->tpot, st->n_tpot) : NAN;
  res->tpot_min = st->n_tpot ? st->tpot_min : NAN;
  res->tpot_p50 = eldr_quantile(st->tpot, st->n_tpot, 0.5);
  res->tpot_p99 = eldr_quantile_sorted(st->tpot, st->n_tpot, 0.99); /* sorted by the p50 */
  res->tpot_pf_mean = st->n_tpot ? mean_of(st->tpot_pf, st->n_tpot) : NAN;
  res->tpot_pf_p50 = eldr_quantile(st->tpot_pf, st->n_tpot, 0.5);
  res->tpot_pf_p99 = eldr_quantile_sorted(st->tpot_pf, st->n_tpot, 0.99);
  res->ttft_mean = st->completed ? mean_of(st->ttft, st->completed) : NAN;
  res->ttft_p50 = eldr_quantile(st->ttft, st->completed, 0.5);
  res->ttft_p99 = eldr_quantile_sorted(st->ttft, st->completed, 0.99);
  res->e2e_mean = st->completed ? mean_of(st->e2e, st->completed) : NAN;
  res->e2e_p50 = eldr_quantile(st->e2e, st->completed, 0.5);
  res->e2e_p99 = eldr_quantile_sorted(st->e2e, st->completed, 0.99);
  static const double itl_q[2] = {0.5, 0.99};
  double itl[2];
  gap_quantiles(&st->gaps, itl_q, 2, itl);
  res->itl_p50 = itl[0];
  res->itl_p99 = itl[1];
  res->throughput_tok_s = res->makespan_s > 0 ? (double)st->tokens_out / res->makespan_s : 0;
  res->throughput_req_s = res->makespan_s > 0 ? (double)st->completed / res->makespan_s : 0;
  res->mean_batch = st->steps ? (double)st->token_steps / (double)st->steps : 0;
  res->mean_union = st->steps ? (double)st->union_sum / ((double)st->steps * (double)st->L) : 0;
  res->copies_in_flight = st->completed ? st->copies_sum / (double)st->completed : 0;
  res->batch_dup_frac = st->token_steps ? (double)st->dup_steps / (double)st->token_steps : 0;
  res->copy_affinity = st->affinity_n ? st->affinity_sum / (double)st->affinity_n : NAN;
  res->ep_busiest_share = st->ep.all_tokens > 0 ? st->ep.busiest_tokens / st->ep.all_tokens : NAN;
  if (c->log)
    for (size_t i = 0; i < st->N; i++) {
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
      lg->mean_union = q->pos ? q->useen / q->pos : NAN;
      lg->mean_batch = q->pos ? q->bseen / q->pos : NAN;
      lg->pred_union = q->pred_union > 0 ? q->pred_union : NAN;
      lg->confidence = q->confidence;
      lg->predicted = q->predicted;
    }
}
