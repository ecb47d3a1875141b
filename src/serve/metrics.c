/* metrics.c — the router's counters and histograms, rendered as
 * Prometheus text on GET /metrics, and GET /health. Each loop counts into
 * its own metrics; /metrics, on whichever loop serves it, sums every loop's
 * (atomic loads) and the workers' shared slots. /health answers from the
 * serving loop's own view (its health checks, its recent decisions). */
#include <stddef.h>
#include <event2/buffer.h>
#include <stdio.h>
#include <string.h>

#include "eldr/sigshard.h"
#include "serve_types.h"

static const char *const dec_name[DEC__N] = {"locality", "load", "none"};
static const char *const out_name[OUT__N] = {"ok", "client_error", "upstream_error",
                                             "timeout", "cancelled", "stream_aborted"};
static const char *const fb_name[FB__N] = {"no_routed_experts", "malformed", "no_artifact",
                                           "shape_mismatch", "empty_signature"};
static const char *const bad_name[BAD__N] = {"malformed_json", "invalid_field", "body_too_large",
                                             "malformed_head", "timeout", "unknown_path",
                                             "method_not_allowed", "length_required", "unauthorized"};

static void histo_init(histo *h, const double *b) {
  memset(h, 0, sizeof *h);
  memcpy(h->bound, b, sizeof h->bound);
}

void eldr__histo_add(histo *h, double x) {
  int i = 0;
  while (i < HB && x > h->bound[i]) i++;
  h->n[i]++;
  h->sum = h->sum + x; /* one writer: its loop (no atomic add on a double) */
  h->count++;
}

void eldr__metrics_init(metrics *m) {
  static const double sig_b[HB] = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 1e-1};
  static const double req_b[HB] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5, 1, 5, 30};
  memset(m, 0, sizeof *m);
  histo_init(&m->sig, sig_b);
  histo_init(&m->decision, sig_b);
  histo_init(&m->request, req_b);
  histo_init(&m->exact_wait, req_b);
}

/* ---- metrics and health endpoints ----------------------------------------- */

/* The counters before the histograms, as one array. */
_Static_assert(offsetof(metrics, sig) % sizeof(ctr) == 0, "metrics: counters first");
#define N_CTR (offsetof(metrics, sig) / sizeof(ctr))

static void histo_sum(histo *dst, const histo *src) {
  for (int i = 0; i <= HB; i++) dst->n[i] += src->n[i];
  dst->sum = dst->sum + src->sum;
  dst->count += src->count;
}

/* Every loop's counters summed into out (initialised here). */
static void metrics_sum(const eldr__group *g, metrics *out) {
  eldr__metrics_init(out);
  for (int l = 0; l < g->n; l++) {
    const metrics *m = &g->loops[l]->m;
    const ctr *a = (const ctr *)m;
    ctr *b = (ctr *)out;
    for (size_t i = 0; i < N_CTR; i++) b[i] += a[i];
    histo_sum(&out->sig, &m->sig);
    histo_sum(&out->decision, &m->decision);
    histo_sum(&out->request, &m->request);
    histo_sum(&out->exact_wait, &m->exact_wait);
  }
}

static void render_histo(struct evbuffer *o, const char *name, const char *help, const histo *h) {
  evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (int i = 0; i < HB; i++) {
    cum += h->n[i];
    evbuffer_add_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bound[i], (unsigned long long)cum);
  }
  cum += h->n[HB];
  evbuffer_add_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                      (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->count);
}

void eldr__handle_metrics(hconn *c) {
  eldr_server *s = c->s;
  const eldr__group *g = s->grp;
  metrics sum;
  metrics_sum(g, &sum);
  const metrics *m = &sum;
  unsigned long long mism = 0, missing = 0, conns = 0;
  eldr_sigcache_stats cs; /* the one cache every loop shares: read once, not summed */
  eldr_sigshard_stats_get(s->sp.conf.cache, &cs);
  for (int l = 0; l < g->n; l++) {
    eldr_server *x = g->loops[l];
    mism += x->sp.tokenizer_mismatch;
    missing += x->sp.blocks_missing;
    conns += x->nconns;
  }
  struct evbuffer *o = evbuffer_new();
  if (!o) {
    eldr__send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  evbuffer_add_printf(o, "# HELP eldr_requests_total Completion requests by the decode policy that served them, decision and outcome.\n"
                         "# TYPE eldr_requests_total counter\n");
  for (int p = 0; p < ELDR_POLICY__COUNT; p++) {
    int any = p == (int)s->cfg.policy;
    for (int d = 0; d < DEC__N && !any; d++)
      for (int k = 0; k < OUT__N; k++) any |= m->requests[p][d][k] != 0;
    if (!any) continue; /* policies never used: no series */
    for (int d = 0; d < DEC__N; d++)
      for (int k = 0; k < OUT__N; k++)
        evbuffer_add_printf(o, "eldr_requests_total{policy=\"%s\",decision=\"%s\",outcome=\"%s\"} %llu\n",
                            eldr_policy_name((eldr_policy_kind)p), dec_name[d], out_name[k],
                            (unsigned long long)m->requests[p][d][k]);
  }
  if (s->fps)
    evbuffer_add_printf(o, "# HELP eldr_footprint_inflight Requests in the footprint policy's current state "
                           "(routed, decode leg not ended).\n# TYPE eldr_footprint_inflight gauge\n"
                           "eldr_footprint_inflight %zu\n", eldr__fps_inflight(s->fps));
  evbuffer_add_printf(o, "# HELP eldr_fallback_total Decisions made by load only, by reason.\n"
                         "# TYPE eldr_fallback_total counter\n");
  for (int f = 0; f < FB__N; f++)
    evbuffer_add_printf(o, "eldr_fallback_total{reason=\"%s\"} %llu\n", fb_name[f],
                        (unsigned long long)m->fallback[f]);
  evbuffer_add_printf(o, "# HELP eldr_bad_requests_total Client requests refused, by reason.\n"
                         "# TYPE eldr_bad_requests_total counter\n");
  for (int b = 0; b < BAD__N; b++)
    evbuffer_add_printf(o, "eldr_bad_requests_total{reason=\"%s\"} %llu\n", bad_name[b],
                        (unsigned long long)m->bad[b]);
  evbuffer_add_printf(o, "# HELP eldr_retries_total Upstream legs retried on another worker.\n"
                         "# TYPE eldr_retries_total counter\n"
                         "eldr_retries_total{leg=\"prefill\"} %llu\neldr_retries_total{leg=\"decode\"} %llu\n",
                      (unsigned long long)m->retries[0], (unsigned long long)m->retries[1]);
  evbuffer_add_printf(o, "# HELP eldr_keepalive_resends_total Upstream legs sent again on a fresh connection: "
                         "the reused keep-alive connection failed before any reply byte.\n"
                         "# TYPE eldr_keepalive_resends_total counter\n"
                         "eldr_keepalive_resends_total{leg=\"prefill\"} %llu\neldr_keepalive_resends_total{leg=\"decode\"} %llu\n"
                         "eldr_keepalive_resends_total{leg=\"models\"} %llu\n",
                      (unsigned long long)m->resends[LEG_PREFILL], (unsigned long long)m->resends[LEG_DECODE],
                      (unsigned long long)m->resends[LEG_MODELS]);
  evbuffer_add_printf(o, "# HELP eldr_hang_probes_total Health probes of workers whose legs made no progress for the hang window.\n"
                         "# TYPE eldr_hang_probes_total counter\n"
                         "eldr_hang_probes_total{result=\"answered\"} %llu\neldr_hang_probes_total{result=\"unanswered\"} %llu\n"
                         "# HELP eldr_queue_timeouts_total Streaming decode legs ended alone by their own queue timeout (the worker not ejected).\n"
                         "# TYPE eldr_queue_timeouts_total counter\neldr_queue_timeouts_total %llu\n",
                      (unsigned long long)m->hang_probes[0], (unsigned long long)m->hang_probes[1],
                      (unsigned long long)m->queue_timeouts);
  evbuffer_add_printf(o, "# HELP eldr_sglang_decisions_total --pd sglang[-exact]: decoders chosen before the prefill's reply, by the signature they had: "
                         "exact (sglang-exact: the prefill's published counts), "
                         "predicted (routed on the prediction), below_threshold (a prediction under --predict-threshold: load), "
                         "none (nothing of the prompt known: load).\n"
                         "# TYPE eldr_sglang_decisions_total counter\n"
                         "eldr_sglang_decisions_total{signature=\"exact\"} %llu\n"
                         "eldr_sglang_decisions_total{signature=\"predicted\"} %llu\n"
                         "eldr_sglang_decisions_total{signature=\"below_threshold\"} %llu\n"
                         "eldr_sglang_decisions_total{signature=\"none\"} %llu\n",
                      (unsigned long long)m->arrival[ARR_EXACT], (unsigned long long)m->arrival[ARR_PREDICTED],
                      (unsigned long long)m->arrival[ARR_BELOW_THRESHOLD], (unsigned long long)m->arrival[ARR_NO_PREDICTION]);
  {
    evbuffer_add_printf(o, "# HELP eldr_sglang_exact_total --pd sglang-exact: waits for the prefill's published expert counts, by end: "
                           "exact (the decoder chosen on them), timeout (none within --exact-timeout), not_published (the prefill's "
                           "bootstrap server does not publish them: no patch), failed (connection or HTTP error), bad (a reply that is no "
                           "counts document for the room), not_read (counts that do not fit the artifact), aborted (the prefill failed first); "
                           "all but exact and aborted fall back to the prediction or load.\n"
                           "# TYPE eldr_sglang_exact_total counter\n");
    for (int i = 0; i < SGX__N; i++)
      evbuffer_add_printf(o, "eldr_sglang_exact_total{result=\"%s\"} %llu\n", eldr__sgx_name[i], (unsigned long long)m->sgl_exact[i]);
  }
  {
    static const char *const spf[SPF__N] = {"ok", "not_read", "failed", "timeout", "abandoned"};
    evbuffer_add_printf(o, "# HELP eldr_sglang_prefill_total --pd sglang: prefill legs by end: ok (its routed experts read), "
                           "not_read (answered; no artifact, no rows, or rows that do not fit it), failed, timeout, abandoned (the request ended first).\n"
                           "# TYPE eldr_sglang_prefill_total counter\n");
    for (int i = 0; i < SPF__N; i++)
      evbuffer_add_printf(o, "eldr_sglang_prefill_total{result=\"%s\"} %llu\n", spf[i], (unsigned long long)m->sgl_prefill[i]);
  }
  evbuffer_add_printf(o, "# HELP eldr_footprint_replaced_total Footprint contributions predicted at arrival replaced by the prefill's true counts.\n"
                         "# TYPE eldr_footprint_replaced_total counter\neldr_footprint_replaced_total %llu\n",
                      (unsigned long long)m->fp_replaced);
  evbuffer_add_printf(o, "# HELP eldr_client_disconnects_total Clients gone before their response.\n"
                         "# TYPE eldr_client_disconnects_total counter\neldr_client_disconnects_total %llu\n",
                      (unsigned long long)m->disconnects);
  evbuffer_add_printf(o, "# HELP eldr_prefill_without_kv_params_total Prefill replies without kv_transfer_params.\n"
                         "# TYPE eldr_prefill_without_kv_params_total counter\neldr_prefill_without_kv_params_total %llu\n",
                      (unsigned long long)m->no_kv_params);
  evbuffer_add_printf(o, "# HELP eldr_routed_experts_rejected_total Prefill replies whose routed_experts "
                         "were rejected, by reason.\n# TYPE eldr_routed_experts_rejected_total counter\n");
  for (int r = 1; r < ELDR_RE__N; r++)
    evbuffer_add_printf(o, "eldr_routed_experts_rejected_total{reason=\"%s\"} %llu\n", eldr_re_reason_name((eldr_re_reason)r),
                        (unsigned long long)m->re_rejected[r]);
  evbuffer_add_printf(o, "# HELP eldr_routed_experts_spliced_total Decode replies given the prefill's prompt rows.\n"
                         "# TYPE eldr_routed_experts_spliced_total counter\neldr_routed_experts_spliced_total %llu\n",
                      (unsigned long long)m->spliced);
  evbuffer_add_printf(o, "# HELP eldr_sigcache_tokenizer_mismatch_total Prompts whose token count differs from the engine's.\n"
                         "# TYPE eldr_sigcache_tokenizer_mismatch_total counter\neldr_sigcache_tokenizer_mismatch_total %llu\n",
                      mism);
  evbuffer_add_printf(o, "# HELP eldr_signature_blocks_missing_total Prefix-cached blocks whose row was not in the signature cache.\n"
                         "# TYPE eldr_signature_blocks_missing_total counter\neldr_signature_blocks_missing_total %llu\n",
                      missing);
  evbuffer_add_printf(o, "# HELP eldr_sigcache_rows Rows held by the signature cache (block rows, and span rows of seven blocks).\n"
                         "# TYPE eldr_sigcache_rows gauge\neldr_sigcache_rows %zu\n"
                         "# HELP eldr_sigcache_hits_total Rows the signature cache supplied for prompt blocks (a block row, or a span row for seven blocks; the engine did not send them, or the reply was not read for them).\n"
                         "# TYPE eldr_sigcache_hits_total counter\neldr_sigcache_hits_total %llu\n"
                         "# HELP eldr_sigcache_misses_total Prefix-cached blocks whose row the signature cache lacked.\n"
                         "# TYPE eldr_sigcache_misses_total counter\neldr_sigcache_misses_total %llu\n"
                         "# HELP eldr_sigcache_evictions_total Block rows evicted from the signature cache.\n"
                         "# TYPE eldr_sigcache_evictions_total counter\neldr_sigcache_evictions_total %llu\n"
                         "# HELP eldr_sigcache_lock_waits_total Signature cache operations that waited for a shard another event loop held.\n"
                         "# TYPE eldr_sigcache_lock_waits_total counter\neldr_sigcache_lock_waits_total %llu\n"
                         "# HELP eldr_sigcache_capacity Block rows the signature cache can hold (--sigcache-rows, --sig-cache-mb).\n"
                         "# TYPE eldr_sigcache_capacity gauge\neldr_sigcache_capacity %zu\n"
                         "# HELP eldr_sigcache_bytes Memory the signature cache allocated (rows, keys, links, index).\n"
                         "# TYPE eldr_sigcache_bytes gauge\neldr_sigcache_bytes %zu\n"
                         "# HELP eldr_sigcache_stored_total Blocks counted and stored in the signature cache.\n"
                         "# TYPE eldr_sigcache_stored_total counter\neldr_sigcache_stored_total %llu\n"
                         "# HELP eldr_sigcache_present_total Blocks to store that the signature cache held already (not counted again).\n"
                         "# TYPE eldr_sigcache_present_total counter\neldr_sigcache_present_total %llu\n"
                         "# HELP eldr_sigcache_spans_total Span rows built (seven held blocks' rows summed, at a prompt's first read from the cache).\n"
                         "# TYPE eldr_sigcache_spans_total counter\neldr_sigcache_spans_total %llu\n",
                      cs.rows, (unsigned long long)cs.hits, (unsigned long long)cs.misses,
                      (unsigned long long)cs.evictions, (unsigned long long)eldr_sigshard_lock_waits(s->sp.conf.cache),
                      cs.capacity, eldr_sigshard_bytes(s->sp.conf.cache), (unsigned long long)cs.stored,
                      (unsigned long long)cs.present, (unsigned long long)cs.spans);
  evbuffer_add_printf(o, "# HELP eldr_reloads_total Configuration/artifact reloads.\n"
                         "# TYPE eldr_reloads_total counter\neldr_reloads_total{result=\"ok\"} %llu\n"
                         "eldr_reloads_total{result=\"error\"} %llu\n",
                      (unsigned long long)m->reloads_ok, (unsigned long long)m->reloads_err);
  evbuffer_add_printf(o, "# HELP eldr_dns_errors_total Worker names or DNS groups that failed to resolve.\n"
                         "# TYPE eldr_dns_errors_total counter\neldr_dns_errors_total %llu\n"
                         "# HELP eldr_dns_updates_total DNS group answers that changed the worker lists.\n"
                         "# TYPE eldr_dns_updates_total counter\neldr_dns_updates_total %llu\n",
                      (unsigned long long)m->dns_errors, (unsigned long long)m->dns_updates);
  evbuffer_add_printf(o, "# HELP eldr_worker_scrapes_total Reads of the workers' /metrics for their load.\n"
                         "# TYPE eldr_worker_scrapes_total counter\neldr_worker_scrapes_total{result=\"ok\"} %llu\n"
                         "eldr_worker_scrapes_total{result=\"error\"} %llu\n",
                      (unsigned long long)m->scrapes[0], (unsigned long long)m->scrapes[1]);
  size_t draining = 0;
  for (const worker *w = s->all_workers; w; w = w->next_all) draining += w->retired != 0;
  evbuffer_add_printf(o, "# HELP eldr_workers_draining Workers dropped by a reload still finishing their legs.\n"
                         "# TYPE eldr_workers_draining gauge\neldr_workers_draining %zu\n", draining);
  evbuffer_add_printf(o, "# HELP eldr_artifact_loaded Whether a routing artifact is loaded.\n"
                         "# TYPE eldr_artifact_loaded gauge\neldr_artifact_loaded %d\n", s->art != NULL);
  static const struct {
    const char *name, *type, *help;
  } gm[] = {
      {"eldr_connections_open", "gauge", "Client connections open."},
      {"eldr_connections_max", "gauge", "Client connection limit (max_connections, resolved)."},
      {"eldr_connections_refused_total", "counter", "Client connections answered 503 at the connection limit."},
      {"eldr_connections_dropped_total", "counter", "Client connections closed unanswered far above the limit."},
      {"eldr_accept_errors_total", "counter", "accept() failures (EMFILE, ENFILE, ENOBUFS); each backs the listener off."},
      {"eldr_accept_paused_total", "counter",
       "Times a loop's listener went off with at most the fd reserve free (new clients wait in the backlog)."},
      {"eldr_accept_paused_loops", "gauge", "Event loops whose listener is off now for the fd reserve."},
      {"eldr_stream_pauses_total", "counter", "Times a decode stream was paused for a slow client."},
      {"eldr_heap_trims_total", "counter", "Heap trims after large requests ended."},
  };
  unsigned long long gv[] = {conns, s->max_conns * (size_t)g->n, m->conn_refused, m->conn_dropped,
                             m->accept_errors, m->accept_pauses, m->accept_paused_loops, m->stream_pauses,
                             m->mem_trims};
  for (size_t q = 0; q < sizeof gv / sizeof gv[0]; q++)
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", gm[q].name, gm[q].help, gm[q].name, gm[q].type,
                        gm[q].name, gv[q]);
  static const char *const wm[][3] = {
      {"eldr_worker_inflight", "gauge", "Requests in flight per worker (router-tracked)."},
      {"eldr_worker_healthy", "gauge", "1 when the worker is admitted, 0 when ejected."},
      {"eldr_worker_requests_total", "counter", "Upstream legs sent per worker."},
      {"eldr_worker_ejections_total", "counter", "Times the worker was ejected."},
      {"eldr_worker_load", "gauge", "Load decisions use: in-flight legs, or scraped running+waiting plus own legs since."},
      {"eldr_worker_hangs_total", "counter", "Times the worker was found hung: no progress on its legs for the hang window and its health probe unanswered."},
  };
  for (int q = 0; q < 6; q++) {
    evbuffer_add_printf(o, "# HELP %s %s\n# TYPE %s %s\n", wm[q][0], wm[q][2], wm[q][0], wm[q][1]);
    for (int role = 0; role < 2; role++)
      for (size_t i = 0; i < s->nw[role]; i++) {
        worker *w = s->w[role][i];
        const eldr__slot *sl = w->slot; /* every loop's legs and counts */
        unsigned long long v = q == 0 ? sl->inflight : q == 1 ? (unsigned long long)eldr__worker_up(w)
                               : q == 2 ? sl->requests : q == 3 ? sl->ejections : q == 4 ? eldr__worker_load(w)
                               : sl->hangs;
        evbuffer_add_printf(o, "%s{role=\"%s\",worker=\"%s\"} %llu\n", wm[q][0], eldr__role_name[role], w->url, v);
      }
  }
  evbuffer_add_printf(o, "# HELP eldr_upstream_errors_total Failed upstream legs by worker and kind.\n"
                         "# TYPE eldr_upstream_errors_total counter\n");
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      worker *w = s->w[role][i];
      evbuffer_add_printf(o, "eldr_upstream_errors_total{role=\"%s\",worker=\"%s\",kind=\"connect\"} %llu\n"
                             "eldr_upstream_errors_total{role=\"%s\",worker=\"%s\",kind=\"status\"} %llu\n"
                             "eldr_upstream_errors_total{role=\"%s\",worker=\"%s\",kind=\"timeout\"} %llu\n",
                          eldr__role_name[role], w->url, (unsigned long long)w->slot->err_connect,
                          eldr__role_name[role], w->url, (unsigned long long)w->slot->err_status,
                          eldr__role_name[role], w->url, (unsigned long long)w->slot->err_timeout);
    }
  unsigned long long bt = 0, ba = 0, bf = 0, bi = 0, bn = 0; /* the loops' reply buffer pools (bufpool.h) */
  for (int l = 0; l < g->n; l++) {
    const eldr__bufpool_stats *b = &g->loops[l]->bufs.st;
    bt += atomic_load_explicit(&b->takes, memory_order_relaxed);
    ba += atomic_load_explicit(&b->allocs, memory_order_relaxed);
    bf += atomic_load_explicit(&b->frees, memory_order_relaxed);
    bi += atomic_load_explicit(&b->idle_bytes, memory_order_relaxed);
    bn += atomic_load_explicit(&b->idle_n, memory_order_relaxed);
  }
  evbuffer_add_printf(o, "# HELP eldr_reply_buffers_taken_total Large reply buffers (64 KiB and more) handed out by the event loops' pools.\n"
                         "# TYPE eldr_reply_buffers_taken_total counter\neldr_reply_buffers_taken_total %llu\n"
                         "# HELP eldr_reply_buffers_allocated_total Large reply buffers allocated (the rest of those taken were reused).\n"
                         "# TYPE eldr_reply_buffers_allocated_total counter\neldr_reply_buffers_allocated_total %llu\n"
                         "# HELP eldr_reply_buffers_freed_total Large reply buffers given back to the system by the pools' policy.\n"
                         "# TYPE eldr_reply_buffers_freed_total counter\neldr_reply_buffers_freed_total %llu\n"
                         "# HELP eldr_reply_buffers_idle_bytes Bytes of large reply buffers the pools hold idle.\n"
                         "# TYPE eldr_reply_buffers_idle_bytes gauge\neldr_reply_buffers_idle_bytes %llu\n"
                         "# HELP eldr_reply_buffers_idle Large reply buffers the pools hold idle.\n"
                         "# TYPE eldr_reply_buffers_idle gauge\neldr_reply_buffers_idle %llu\n",
                      bt, ba, bf, bi, bn);
  eldr__record_metrics(s, o);
  evbuffer_add_printf(o, "# HELP eldr_loop_connections_total Client connections accepted, by event loop.\n"
                         "# TYPE eldr_loop_connections_total counter\n");
  for (int l = 0; l < g->n; l++)
    evbuffer_add_printf(o, "eldr_loop_connections_total{loop=\"%d\"} %llu\n", l,
                        (unsigned long long)g->loops[l]->m.accepted);
  eldr__watch_metrics(s, o);
  eldr__bus_metrics(s->grp ? s->grp->bus : NULL, o);
  render_histo(o, "eldr_signature_seconds", "Signature extraction (decode, counts, cache, build).", &m->sig);
  render_histo(o, "eldr_decision_seconds", "Decode routing decision.", &m->decision);
  render_histo(o, "eldr_request_seconds", "Completion request latency at the router.", &m->request);
  render_histo(o, "eldr_sglang_exact_wait_seconds", "--pd sglang-exact: from the prefill leg's send to the decoder's choice.",
               &m->exact_wait);
  size_t n = evbuffer_get_length(o);
  eldr__send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", evbuffer_pullup(o, -1), n, NULL);
  evbuffer_free(o);
}

/* Locality routing is "on" when the policy is eldr, an artifact is loaded
 * whose shape agrees with the routed_experts seen, routed_experts arrived
 * within this many seconds, and not every recent decision fell back. */
#define LOCALITY_WINDOW_S 60.0

void eldr__handle_health(hconn *c) {
  eldr_server *s = c->s;
  size_t h[2] = {0, 0}, pr[2] = {0, 0};
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      const worker *w = s->w[role][i];
      pr[role] += w->slot->probed != 0;
      h[role] += eldr__worker_up(w) && w->slot->probed;
    }
  /* ready: a prefill and a decode worker answered (a health check, or a
   * leg), and not draining (a load balancer takes the replica out) */
  int draining = eldr__draining(s);
  int ok = h[0] > 0 && h[1] > 0 && !draining;
  const eldr_artifact *a = s->art;
  int L = s->sp.observed_L, K = s->sp.observed_K;
  int shape_ok = a && (!L || (eldr_re_layers_fit((size_t)L, a->shape.num_layers, a->layer_ids) &&
                              (int)a->shape.top_k == K));
  double now = eldr__now_s();
  double seen_ago = s->re_seen_t > 0 ? now - s->re_seen_t : -1;
  size_t nfb = 0;
  for (size_t i = 0; i < s->nrecent; i++) nfb += s->recent[i];
  double frac = s->nrecent ? (double)nfb / (double)s->nrecent : 0;
  int eldr = s->cfg.policy == ELDR_POLICY_ELDR;
  int on = eldr && a && shape_ok && seen_ago >= 0 && seen_ago <= LOCALITY_WINDOW_S && nfb < s->nrecent;
  const char *why = !eldr ? "policy is not eldr"
                    : !a ? "no artifact"
                    : !shape_ok ? "artifact shape differs from routed_experts"
                    : seen_ago < 0 ? "no routed_experts seen yet"
                    : seen_ago > LOCALITY_WINDOW_S ? "no routed_experts seen recently"
                    : nfb >= s->nrecent ? "every recent decision fell back to load"
                                        : "";
  char seen[32] = "null";
  if (seen_ago >= 0) snprintf(seen, sizeof seen, "%.3f", seen_ago);
  /* the fleet bus: its state, and whether this replica routes on its own view */
  const eldr__bus *bus = s->grp ? s->grp->bus : NULL;
  const char *bst = eldr__bus_state(bus);
  char busj[160];
  snprintf(busj, sizeof busj, "{\"state\":\"%s\",\"fallback\":%s}", bst,
           !strcmp(bst, "down") || !strcmp(bst, "connecting") ? "\"own view plus scraping\"" : "null");
  char b[1200];
  int n = snprintf(b, sizeof b,
                   "{\"status\":\"%s\",\"prefill_healthy\":%zu,\"prefill_probed\":%zu,\"prefill_total\":%zu,"
                   "\"decode_healthy\":%zu,\"decode_probed\":%zu,\"decode_total\":%zu,\"artifact\":%s,"
                   "\"locality\":{\"on\":%s,\"reason\":\"%s\",\"policy\":\"%s\",\"artifact_loaded\":%s,"
                   "\"shape_match\":%s,\"routed_experts_seen_s_ago\":%s,\"recent_decisions\":%zu,"
                   "\"recent_fallback_fraction\":%.4f},\"bus\":%s}",
                   draining ? "draining" : ok ? "ok" : "unavailable", h[0], pr[0], s->nw[0], h[1], pr[1], s->nw[1], a ? "true" : "false",
                   on ? "true" : "false", why, eldr_policy_name(s->cfg.policy), a ? "true" : "false",
                   !a ? "null" : shape_ok ? "true" : "false", seen, s->nrecent, frac, busj);
  eldr__send_body(c, ok ? 200 : 503, "application/json", b, (size_t)n, NULL);
}
