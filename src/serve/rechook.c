/* rechook.c — what `eldr serve --record` takes from a request (record.h
 * writes it): at the decision, the prompt's expert counts (the signature
 * path's, completed from the signature cache, when the artifact's layer
 * mask is every layer; else the computed prompt rows, counted over every
 * layer by the writer thread), the similarity to each centroid and the
 * choice; while the decode reply streams, its usage; at the end, TTFT,
 * TPOT, the client's status and the decode reply's bytes (parsed for the
 * generated rows by the writer thread). Loop thread only. */
#include <event2/buffer.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "eldr/dot.h"
#include "eldr/reply_compact.h"
#include "eldr/reply_sglang.h"
#include "eldr/reply_stream.h"
#include "serve_types.h"

_Static_assert(ELDR__REC_CLIENT_ID_MAX >= ELDR__HTTP_REQID_MAX, "a record holds every X-Request-Id the parser accepts");

static const char *const fb_reason[FB__N] = {"no_routed_experts", "malformed", "no_artifact", "shape_mismatch",
                                             "empty_signature"};

int eldr__record_start(eldr_server *s, eldr_diag *d) {
  const eldr_serve_config *c = &s->cfg;
  if (!c->record_dir) return 0;
  eldr__rec_limits lim = {c->record_sample, c->record_max_bytes, c->record_max_seconds};
  int rc = eldr__rec_new(c->record_dir, &lim, c->record_queue, c->record_queue_bytes, &s->rec, d);
  if (rc) return rc;
  eldr__logf(s, "recording %g of the requests into %s (files up to %llu bytes, %g s)", c->record_sample,
             c->record_dir, (unsigned long long)c->record_max_bytes, c->record_max_seconds);
  return 0;
}

void eldr__record_commit(eldr_server *s) {
  /* the identity of the routing the records were made under */
  const eldr_artifact *a = s->art;
  s->rec_artifact[0] = 0;
  if (a && a->centroids) /* the hash /eldr/status and eldr_artifact_info show */
    snprintf(s->rec_artifact, sizeof s->rec_artifact, "%016llx",
             a->text_hash ? (unsigned long long)a->text_hash
                          : (unsigned long long)XXH64(a->centroids, a->k * a->dim * sizeof *a->centroids, a->k));
  const char *want = s->cfg.record_dir, *have = s->rec ? eldr__rec_dir(s->rec) : NULL;
  if ((want || have) && (!want || !have || strcmp(want, have)))
    eldr__logf(s, "reload: a changed record directory needs a restart (still %s)", have ? have : "off");
  if (!s->rec) return;
  eldr__rec_limits lim = {s->cfg.record_sample, s->cfg.record_max_bytes, s->cfg.record_max_seconds};
  eldr__rec_set_limits(s->rec, &lim);
}

void eldr__record_stop(eldr_server *s) {
  eldr__rec_free(s->rec);
  s->rec = NULL;
}

/* Every layer in the artifact's mask: the signature path's counts are the
 * whole prompt's (prefix-cached blocks included). */
static int mask_all(const eldr_artifact *a) {
  for (uint32_t l = 0; l < a->shape.num_layers; l++)
    if (!a->mask[l]) return 0;
  return 1;
}

/* Copy rows x L x K ids of a view. */
static int take_rows(eldr__rec_item *it, const void *data, eldr_sel_dtype dt, size_t rows) {
  size_t n = rows * it->shape.num_layers * it->shape.top_k * eldr_sel_dtype_size(dt);
  if (!rows || !(it->prefill_raw = malloc(n))) return -1;
  memcpy(it->prefill_raw, data, n);
  it->prefill_dtype = dt;
  it->prefill_rows = rows;
  it->bytes += n;
  return 0;
}

/* The compact form (eldr/reply_compact.h): the engine's counts, every
 * layer the artifact has (else every MoE row it carries), read on the loop
 * (a few KB). 0, 1 (not this form) or -1. */
static int compact_counts(const eldr_artifact *a, rq *r, eldr__rec_item **out) {
  if (!r->pr.raw || r->pr.compact.type != ELDR_JS_OBJECT) return 1;
  eldr_compact_opts co = {0};
  if (a) co = (eldr_compact_opts){a->shape.num_layers, a->layer_ids, a->shape.num_experts, a->shape.top_k, NULL};
  eldr_compact_info ci;
  uint32_t ids[ELDR_MAX_LAYERS];
  if (eldr_compact_read(r->pr.raw, r->pr.compact, &co, NULL, ids, &ci, NULL, NULL) || ci.tokens > UINT32_MAX) return -1;
  eldr_shape sh = {a ? a->shape.num_layers : ci.layers, ci.experts, ci.top_k};
  eldr__rec_item *it = *out = eldr__rec_item_new(&sh, a ? a->layer_ids : ids);
  size_t cells = eldr_shape_cells(&sh);
  if (!it || !(it->prefill_counts = calloc(cells, sizeof *it->prefill_counts))) return -1;
  if (eldr_compact_read(r->pr.raw, r->pr.compact, &co, it->prefill_counts, ids, &ci, NULL, NULL)) return -1;
  it->prefill_tokens = (uint32_t)ci.tokens;
  it->bytes += cells * sizeof *it->prefill_counts;
  return 0;
}

/* The prompt's counts, or where they will come from: 0, or -1 when there
 * are none. The loop copies as little as it can: the counts the signature
 * was built from when they are every layer's; else the prefill reply's
 * tree is handed to the writer at the end (a .npy string: its size is
 * known); else (JSON-list layouts) the decoded rows are copied. */
static int prompt_counts(eldr_server *s, rq *r, const eldr__sigres *res, eldr__rec_item **out) {
  const eldr_artifact *a = s->art;
  int crc = compact_counts(a, r, out);
  if (crc <= 0) return crc;
  int sig_rows = res && a && (res->fallback == FB_NONE || res->fallback == ELDR__FB_EMPTY_SIGNATURE) && res->view.data;
  uint32_t E = s->cfg.record_experts ? s->cfg.record_experts : a ? a->shape.num_experts : 0;
  if (sig_rows && res->counts && res->fallback == FB_NONE && mask_all(a)) {
    eldr__rec_item *it = *out = eldr__rec_item_new(&a->shape, a->layer_ids);
    size_t cells = eldr_shape_cells(&a->shape);
    if (!it || !(it->prefill_counts = malloc(cells * sizeof *it->prefill_counts))) return -1;
    memcpy(it->prefill_counts, res->counts, cells * sizeof *it->prefill_counts);
    it->prefill_tokens = res->n_tokens;
    it->bytes += cells * sizeof *it->prefill_counts;
    return 0;
  }
  if (r->pr.routed_experts && E) { /* the tree goes to the writer at the end (eldr__record_submit) */
    eldr_shape one = {1, E, 1};
    eldr__rec_item *it = *out = eldr__rec_item_new(a ? &a->shape : &one, a ? a->layer_ids : NULL);
    if (!it) return -1;
    it->experts = E;
    it->from_artifact = a != NULL;
    it->bytes += r->pr.routed_experts_len;
    return 0;
  }
  if (sig_rows) {
    eldr__rec_item *it = *out = eldr__rec_item_new(&a->shape, a->layer_ids);
    return it ? take_rows(it, res->view.data, res->view.dtype, res->view.rows) : -1;
  }
  /* no artifact, or rows of another shape, in a JSON-list layout: read them
   * here, over the model's MoE layers (eldr_reply_prompt_rows) */
  if (!E) return -1;
  eldr_reply_experts rex;
  eldr_re_view v;
  eldr_shape sh;
  uint32_t ids[ELDR_MAX_LAYERS];
  if (eldr_reply_prompt_rows(r->pr.root, r->req.api == ELDR__API_CHAT ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, E,
                             a ? &a->shape : NULL, a ? a->layer_ids : NULL, &rex, &v, &sh, ids) != 0)
    return -1;
  int rc = (*out = eldr__rec_item_new(&sh, ids)) ? take_rows(*out, v.data, v.dtype, v.rows) : -1;
  eldr_reply_experts_free(&rex);
  return rc;
}

void eldr__record_decision(rq *r, const eldr__sigres *res, int k, const eldr_decision *dec) {
  eldr_server *s = r->s;
  if (!s->rec || r->is_models || !eldr__rec_sample(s->rec)) return;
  eldr__rec_item *it = NULL;
  if (r->pd) { /* --pd sglang: decided at arrival; the counts come with the prefill's reply */
    if (!s->art || !(it = eldr__rec_item_new(&s->art->shape, s->art->layer_ids))) {
      eldr__rec_drop_count(s->rec, s->art ? ELDR__REC_NO_MEMORY : ELDR__REC_NO_COUNTS);
      return;
    }
    it->counts_later = 1;
  } else if (prompt_counts(s, r, res, &it) != 0) {
    eldr__rec_drop_count(s->rec, it ? ELDR__REC_NO_MEMORY : ELDR__REC_NO_COUNTS);
    eldr__rec_item_free(it);
    return;
  }
  snprintf(it->id, sizeof it->id, "%s", r->reqid);
  snprintf(it->client_id, sizeof it->client_id, "%s", r->client_reqid);
  json_t *m = json_object_get(r->pr.root, "model");
  snprintf(it->model, sizeof it->model, "%s",
           json_is_string(m) ? json_string_value(m) : s->art && s->art->model ? s->art->model : "");
  it->arrival = eldr__rec_clock(s->rec, r->t0);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  it->time = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 - (eldr__now_s() - r->t0);
  it->chat = r->req.api == ELDR__API_CHAT;
  it->prompt_tokens = r->pr.prompt_tokens;
  it->policy = eldr_policy_name(s->cfg.policy);
  int sgl_fb = r->pd && r->decision != DEC_LOCALITY && res; /* --pd sglang: no usable prediction */
  it->reason = k < 0 ? "no_decoder"
               : r->decision == DEC_LOCALITY ? "locality"
               : sgl_fb ? (r->arrival == ARR_BELOW_THRESHOLD ? "prediction_below_threshold" : "no_prediction")
               : res && res->fallback != FB_NONE && res->fallback < FB__N ? fb_reason[res->fallback]
               : s->cfg.policy == ELDR_POLICY_ELDR || s->cfg.policy == ELDR_POLICY_FOOTPRINT ? "no_signature"
                                                                                              : "load_policy";
  if (k >= 0) {
    const worker *w = s->w[ROLE_DECODE][k];
    snprintf(it->decoder, sizeof it->decoder, "%s", w->url + (strncmp(w->url, "http://", 7) ? 0 : 7));
    it->decoder_index = k;
  }
  const eldr_artifact *a = s->art;
  if (a && a->k) {
    if (k >= 0) it->centroid = dec && dec->centroid >= 0 ? dec->centroid : (int)((size_t)k % a->k);
    if (res && res->sig && (it->sims = malloc(a->k * sizeof *it->sims))) {
      for (size_t c = 0; c < a->k; c++) it->sims[c] = eldr_dot_lanes8(res->sig, a->centroids + c * a->dim, a->dim);
      it->nsims = a->k;
      it->bytes += a->k * sizeof *it->sims;
    }
  }
  snprintf(it->artifact, sizeof it->artifact, "%s", s->rec_artifact);
  r->rec = it;
}

void eldr__record_sglang_prefill(rq *r, const char *body, size_t n) {
  eldr__rec_item *it = r->rec;
  const eldr_artifact *a = r->s->art;
  if (!it || !it->counts_later || it->prefill_counts || !a) return;
  const eldr_shape *sh = &a->shape;
  if (sh->num_layers != it->shape.num_layers || sh->num_experts != it->shape.num_experts) return; /* reloaded */
  size_t cells = eldr_shape_cells(sh);
  uint32_t *counts = calloc(cells, sizeof *counts);
  if (!counts) return;
  /* every MoE layer, whatever the routing mask: a refit chooses its own */
  eldr_sglang_opts o = {0, sh->num_layers, a->layer_ids, sh->top_k, sh->num_experts, NULL};
  uint8_t *buf = NULL;
  size_t cap = 0, rows = 0;
  uint32_t hidden = 0;
  eldr_re_reason why = ELDR_RE_OK;
  eldr_diag d = {{0}};
  int rc = eldr_sglang_reply_experts(body, n, &o, &buf, &cap, &hidden, &rows, counts, &why, &d);
  free(buf);
  if (rc != 0 || !rows) {
    free(counts);
    return;
  }
  it->prefill_counts = counts;
  it->prefill_tokens = rows > UINT32_MAX ? UINT32_MAX : (uint32_t)rows;
  if (it->prompt_tokens <= 0) it->prompt_tokens = (int64_t)rows;
  it->bytes += cells * sizeof *counts;
}

/* The streamed decode reply: its usage.completion_tokens (stream_options
 * include_usage; the last seen wins; a number split across reads is missed),
 * and the event carrying routed_experts, when the decoder streams them
 * (bounded by the record queue's byte bound). */
void eldr__record_data(rq *r, const char *p, size_t n) {
  if (r->rec) r->rec->output_tokens = eldr__rec_scan_usage(p, n, r->rec->output_tokens);
  if (!r->rs && (r->rs = malloc(sizeof *r->rs)))
    eldr_re_stream_init(r->rs, r->s->cfg.record_queue_bytes ? r->s->cfg.record_queue_bytes : 0);
  if (r->rs) eldr_re_stream_feed(r->rs, p, n);
}

void eldr__record_stream_end(rq *r) {
  size_t n;
  const char *kept = r->rs ? eldr_re_stream_kept(r->rs, &n) : NULL;
  if (kept) eldr__watch_decode_reply(r, kept, n);
}

void eldr__record_stream_free(rq *r) {
  if (!r->rs) return;
  eldr_re_stream_free(r->rs);
  free(r->rs);
  r->rs = NULL;
}

void eldr__record_finish(rq *r, int status) {
  eldr__rec_item *it = r->rec;
  if (!it || it->status) return;
  it->status = status ? status : -1; /* -1: the client got nothing */
  if (r->al_first > 0) it->ttft_ms = (r->al_first - r->t0) * 1e3;
  if (r->al_events > 1 && r->L.streaming) it->tpot_ms = (r->al_last - r->al_first) * 1e3 / (r->al_events - 1);
}

/* SGLang's /generate reply: its items' meta_info.completion_tokens summed
 * (a batch's list, as usage.completion_tokens sums a completion's
 * choices), or prev when it has none. */
static int64_t generate_output_tokens(const char *p, size_t n, int64_t prev) {
  json_t *j = json_loadb(p, n, 0, NULL);
  int64_t sum = -1;
  size_t k = json_is_array(j) ? json_array_size(j) : 1;
  for (size_t i = 0; j && i < k; i++) {
    json_t *ct = json_object_get(json_object_get(json_is_array(j) ? json_array_get(j, i) : j, "meta_info"),
                                 "completion_tokens");
    if (json_is_integer(ct) && json_integer_value(ct) >= 0) sum = (sum < 0 ? 0 : sum) + json_integer_value(ct);
  }
  json_decref(j);
  return sum < 0 ? prev : sum;
}

void eldr__record_submit(rq *r) {
  eldr_server *s = r->s;
  eldr__rec_item *it = r->rec;
  if (!it) return;
  r->rec = NULL;
  if (it->counts_later && !it->prefill_counts) { /* the prefill's reply had no rows */
    eldr__rec_drop_count(s->rec, ELDR__REC_NO_COUNTS);
    eldr__rec_item_free(it);
    return;
  }
  if (!it->status) it->status = -1;
  /* handed over, not copied: the request is being freed */
  leg *L = &r->L;
  if (L->kind == LEG_DECODE && !L->streaming && L->status == 200 && L->n && L->buf) {
    if (r->req.api == ELDR__API_GENERATE) it->output_tokens = generate_output_tokens(L->buf, L->n, it->output_tokens);
    it->decode_body = L->buf;
    it->decode_len = L->n;
    it->bytes += L->cap;
    L->buf = NULL;
    L->n = L->cap = 0;
  } else if (L->kind == LEG_DECODE && L->streaming && L->status == 200 && r->rs && r->rs->kept) {
    /* a stream's routed_experts event, read like a whole reply */
    it->decode_body = eldr_re_stream_take(r->rs, &it->decode_len);
    it->bytes += it->decode_len;
  }
  if (it->experts && !it->prefill_counts && !it->prefill_raw) {
    it->prefill_root = r->pr.root;
    r->pr.root = NULL;
  }
  eldr__rec_submit(s->rec, it);
  /* the writer thread cannot log: its errors are logged here, once each */
  eldr__rec_stats st;
  eldr__rec_stats_get(s->rec, &st);
  if (st.errors != s->rec_errors_logged) {
    s->rec_errors_logged = st.errors;
    eldr__logf(s, "%s", st.last_error);
  }
}

void eldr__record_metrics(eldr_server *s, struct evbuffer *o) {
  if (!s->rec) return;
  eldr__rec_stats st;
  eldr__rec_stats_get(s->rec, &st);
  evbuffer_add_printf(o, "# HELP eldr_record_written_total Request records written (serve --record).\n"
                         "# TYPE eldr_record_written_total counter\neldr_record_written_total %llu\n"
                         "# HELP eldr_record_bytes_total Bytes of request records written.\n"
                         "# TYPE eldr_record_bytes_total counter\neldr_record_bytes_total %llu\n"
                         "# HELP eldr_record_files_total Record files opened.\n"
                         "# TYPE eldr_record_files_total counter\neldr_record_files_total %llu\n"
                         "# HELP eldr_record_sampled_out_total Requests not recorded by --record-sample.\n"
                         "# TYPE eldr_record_sampled_out_total counter\neldr_record_sampled_out_total %llu\n"
                         "# HELP eldr_record_queue_depth Records queued for the writer thread.\n"
                         "# TYPE eldr_record_queue_depth gauge\neldr_record_queue_depth %zu\n"
                         "# HELP eldr_record_queue_bytes Memory held by queued records.\n"
                         "# TYPE eldr_record_queue_bytes gauge\neldr_record_queue_bytes %zu\n"
                         "# HELP eldr_record_write_errors_total Failed opens, writes and syncs of record files (disk full, directory gone).\n"
                         "# TYPE eldr_record_write_errors_total counter\neldr_record_write_errors_total %llu\n"
                         "# HELP eldr_record_paused 1 while the recorder leaves the disk alone after a failure (records dropped as write_error).\n"
                         "# TYPE eldr_record_paused gauge\neldr_record_paused %d\n"
                         "# HELP eldr_record_dropped_total Sampled requests not recorded, by reason.\n"
                         "# TYPE eldr_record_dropped_total counter\n",
                      (unsigned long long)st.written, (unsigned long long)st.bytes, (unsigned long long)st.files,
                      (unsigned long long)st.sampled_out, st.queued, st.queued_bytes,
                      (unsigned long long)st.write_errors, st.paused);
  for (int w = 0; w < ELDR__REC_DROP__N; w++)
    evbuffer_add_printf(o, "eldr_record_dropped_total{reason=\"%s\"} %llu\n", eldr__rec_drop_name((eldr__rec_drop)w),
                        (unsigned long long)st.dropped[w]);
}
