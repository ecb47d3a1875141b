/* worker.c — the emulated vLLM-compatible MoE engine (see eldr/worker.h).
 *
 * One event loop: the HTTP server, the prefill engine (a timer per batch) and
 * the decode engine (a step timer) all run in the caller's event_base.
 * Request lifecycle:
 *   parse -> [prefill queue -> prefill batch] -> (prefill leg: reply)
 *         -> decode queue (KV admission) -> [side-channel pull of the prefill's
 *            held blocks, then the transfer timer] -> ready -> running
 *         -> one token per step -> reply end.
 * A prefill leg's blocks are parked in the kvhold (sidechan.h) until pulled
 * or expired. Replies live in wreply.c, parsing in wparse.c.
 * Every wreq is on the `all` list until freed, so eldr_worker_free can end
 * the requests still open.
 */
#include "eldr/worker.h"

#include "worker/worker_impl.h"



static double now_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec;
}

/* ---------------------------------------------------------------- utilities */

const char *eldr_worker_role_name(eldr_worker_role r) {
  switch (r) {
  case ELDR_WORKER_PREFILL: return "prefill";
  case ELDR_WORKER_DECODE: return "decode";
  case ELDR_WORKER_BOTH: return "both";
  }
  return "?";
}

int eldr_worker_role_parse(const char *name, eldr_worker_role *out) {
  if (!name) return ELDR_EINVAL;
  if (!strcmp(name, "prefill")) *out = ELDR_WORKER_PREFILL;
  else if (!strcmp(name, "decode")) *out = ELDR_WORKER_DECODE;
  else if (!strcmp(name, "both")) *out = ELDR_WORKER_BOTH;
  else return ELDR_EINVAL;
  return 0;
}

void eldr_worker_config_default(eldr_worker_config *c) {
  memset(c, 0, sizeof *c);
  c->role = ELDR_WORKER_BOTH;
  c->model = "qwen3-30b-a3b";
  c->hardware = "h200";
  c->time_scale = 1.0;
  c->return_routed_experts = 1;
  c->kv_abort_timeout = DEFAULT_ABORT_TIMEOUT;
  c->kv_pull_timeout = DEFAULT_PULL_TIMEOUT;
  c->routed_experts_layout = ELDR_RE_LAYOUT_NPY;
}

static char *json_quote(const char *s) {
  json_t *j = json_string(s);
  if (!j) return NULL;
  char *out = json_dumps(j, JSON_ENCODE_ANY);
  json_decref(j);
  return out;
}

static uint64_t str_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

long eldr__w_trace_find(const eldr_worker *w, const char *id) {
  if (!w->trace_index) return -1;
  for (size_t i = str_hash(id) & w->trace_mask;; i = (i + 1) & w->trace_mask) {
    size_t v = w->trace_index[i];
    if (!v) return -1;
    if (!strcmp(w->trace->req[v - 1].id, id)) return (long)(v - 1);
  }
}

void eldr__w_tv_of(double s, struct timeval *tv) {
  if (!(s > 0)) s = 0;
  if (s > 1e6) s = 1e6;
  tv->tv_sec = (time_t)s;
  tv->tv_usec = (suseconds_t)((s - (double)tv->tv_sec) * 1e6);
}

void eldr__w_q_push(rqueue *q, wreq *r) {
  r->qnext = NULL;
  if (q->tail) q->tail->qnext = r;
  else q->head = r;
  q->tail = r;
  q->n++;
}

wreq *eldr__w_q_pop(rqueue *q) {
  wreq *r = q->head;
  if (!r) return NULL;
  q->head = r->qnext;
  if (!q->head) q->tail = NULL;
  r->qnext = NULL;
  q->n--;
  return r;
}

/* --------------------------------------------------------- request objects */

static void conn_closed(struct evhttp_connection *c, void *arg);

void eldr__w_detach(wreq *r) {
  if (!r->http) return;
  struct evhttp_connection *c = evhttp_request_get_connection(r->http);
  if (c) evhttp_connection_set_closecb(c, NULL, NULL);
}

static void req_free(wreq *r) {
  eldr_worker *w = r->w;
  if (r->grp) eldr__sgl_item_release(r); /* an SGLang item leaves its group */
  if (r->all_prev) r->all_prev->all_next = r->all_next;
  else w->all = r->all_next;
  if (r->all_next) r->all_next->all_prev = r->all_prev;
  if (r->pull_ev) event_free(r->pull_ev);
  if (r->pull_req) evhttp_cancel_request(r->pull_req);
  if (r->pull_conn) evhttp_connection_free(r->pull_conn);
  free(r->pull_body);
  if (r->blocks) {
    eldr__kv *kv = (r->state == RS_PREFILLING || r->state == RS_PREFILL_Q) ? w->pkv : w->dkv;
    eldr__kv_release(kv, r->blocks, r->n_blocks);
  }
  free(r->blocks);
  free(r->chunk_head);
  free(r->echo);
  free(r->ids);
  free(r->hashes);
  free(r->psel);
  free(r->dsel);
  free(r);
}

void eldr__w_req_free(wreq *r) { req_free(r); }

/* End the HTTP exchange of r (if any) and free r. */
void eldr__w_req_abort(wreq *r, int code, const char *msg) {
  r->w->m.finished[code >= 500 ? ELDR__FIN_ERROR : ELDR__FIN_ABORT]++;
  if (r->grp) /* its group answers the error (a room's failure, else the engine's reason) */
    eldr__sgl_item_fail(r, r->sg.failed ? 500 : code, r->sg.failed && r->sg.err ? r->sg.err : msg);
  if (r->http) {
    eldr__w_detach(r);
    if (!r->started) eldr__w_send_error(r->http, code, NULL, "%s", msg);
    else if (r->gone) evhttp_send_reply_end(r->http); /* frees it */
    else eldr__w_stream_error(r, code, msg);
    r->http = NULL;
  }
  req_free(r);
}

static void conn_closed(struct evhttp_connection *c, void *arg) {
  (void)c;
  wreq *r = arg;
  r->gone = 1; /* the request object stays ours until we end it */
  r->w->st.requests_cancelled++;
}

/* --------------------------------------------------------- prefill engine */


static void prefill_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  eldr_worker *w = arg;
  w->prefilling = 0;
  const size_t LE = w->LE, LK = w->LK;
  for (size_t i = 0; i < w->n_pbatch; i++) {
    wreq *r = w->pbatch[i];
    /* register the computed full blocks with their signature rows */
    size_t hit = r->cached / ELDR_BLOCK_TOKENS;
    for (size_t b = hit; b < r->n_full; b++) {
      memset(w->rowbuf, 0, LE * sizeof *w->rowbuf);
      (void)eldr_counts_accumulate(&w->shape, r->psel + b * ELDR_BLOCK_TOKENS * LK, ELDR_SEL_U16,
                                   ELDR_BLOCK_TOKENS, w->rowbuf, NULL);
      eldr__kv_register(w->pkv, r->blocks, r->hashes, b, b + 1, w->rowbuf, LE);
    }
    w->st.prompt_tokens += r->n_prompt;
    w->st.cached_tokens += r->cached;
    if (r->gone) {
      eldr__w_req_abort(r, 499, "client closed the connection");
      continue;
    }
    if (r->grp && r->sg.role == 1) { /* SGLang's prefill: the KV goes to its decode */
      eldr__sgl_forward_done(r);
      continue;
    }
    if (r->remote_decode) {
      /* the prefill leg: one token, kv_transfer_params; blocks stay cached */
      r->emitted = 1;
      r->capped = 1;
      w->st.generation_tokens++;
      eldr__w_observe_first(r);
      if (r->stream) {
        eldr__w_stream_start(r);
        eldr__w_stream_token(r, 0, 0, 1);
      }
      eldr__w_reply_done(r);
      /* NixlConnector's request_finished: delay freeing the blocks until the
       * decode worker has read them or the abort timeout expires */
      (void)eldr__kvhold_park(w->hold, r->rid, r->blocks, r->n_blocks);
      r->blocks = NULL;
      r->state = RS_DONE;
      req_free(r);
      continue;
    }
    /* local: the first token comes out of the prefill */
    eldr__kv_release(w->pkv, r->blocks, r->n_blocks);
    free(r->blocks);
    r->blocks = NULL;
    r->n_blocks = 0;
    r->emitted = 1;
    w->st.generation_tokens += r->n_choices;
    eldr__w_observe_first(r);
    if (r->stream) {
      eldr__w_stream_start(r);
      for (uint32_t c = 0; c < r->n_choices; c++) eldr__w_stream_token(r, c, 0, r->n_out <= 1);
    } else if (r->grp) {
      eldr__sgl_token(r, 0, r->n_out <= 1);
    }
    if (r->n_out <= 1) {
      r->state = RS_DONE;
      eldr__w_reply_done(r);
      req_free(r);
      continue;
    }
    r->state = RS_DECODE_Q;
    eldr__w_q_push(&w->decode_q, r);
  }
  w->n_pbatch = 0;
  eldr__w_decode_admit(w);
  eldr__w_prefill_try(w);
}

void eldr__w_prefill_try(eldr_worker *w) {
  if (w->prefilling) return;
  size_t tokens = 0;
  w->n_pbatch = 0;
  while (w->prefill_q.head && w->n_pbatch < w->max_seqs) {
    wreq *r = w->prefill_q.head;
    if (r->gone) {
      eldr__w_q_pop(&w->prefill_q);
      eldr__w_req_abort(r, 499, "client closed the connection");
      continue;
    }
    /* prefix hit, leaving at least one token to compute (like vLLM) */
    size_t hit = eldr__kv_match(w->pkv, r->hashes, r->n_full);
    size_t max_hit = (r->n_prompt - 1) / ELDR_BLOCK_TOKENS;
    if (hit > max_hit) hit = max_hit;
    size_t compute = r->n_prompt - hit * ELDR_BLOCK_TOKENS;
    if (w->n_pbatch > 0 && tokens + compute > w->max_batched_tokens) break;
    size_t total = (r->n_prompt + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
    int32_t *b = malloc(total * sizeof *b);
    if (!b) break;
    if (eldr__kv_alloc(w->pkv, r->hashes, hit, total, b) < 0) {
      free(b);
      break; /* wait for blocks to be released */
    }
    eldr__w_q_pop(&w->prefill_q);
    w->st.prefix_queries += r->n_full;
    w->st.prefix_hits += hit;
    r->blocks = b;
    r->n_blocks = total;
    r->cached = (uint32_t)(hit * ELDR_BLOCK_TOKENS);
    r->state = RS_PREFILLING;
    w->pbatch[w->n_pbatch++] = r;
    tokens += compute;
  }
  if (!w->n_pbatch) return;
  struct timeval tv;
  eldr__w_tv_of(eldr_latency_prefill(&w->lm, tokens) * w->scale, &tv);
  w->prefilling = 1;
  evtimer_add(w->prefill_ev, &tv);
}

static void handle_completion(eldr_worker *w, struct evhttp_request *req, int chat) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t blen = evbuffer_get_length(in);
  char *body = malloc(blen + 1);
  if (!body) {
    eldr__w_send_error(req, 500, NULL, "out of memory");
    return;
  }
  evbuffer_copyout(in, body, blen);
  body[blen] = 0;
  preq pq;
  const char *param = NULL;
  char err[320];
  int status = eldr__w_parse_body(w, body, blen, chat, &pq, err, sizeof err, &param);
  free(body);
  if (status) {
    eldr__w_send_error(req, status, param, "%s", err);
    return;
  }
  char *prompt = pq.prompt;
  size_t plen = pq.plen;
  const int stream = pq.stream, include_usage = pq.include_usage;
  const int remote_decode = pq.remote_decode, remote_prefill = pq.remote_prefill;
  const json_int_t max_tokens = pq.max_tokens;
  const long rec = pq.rec;
  wreq *r = NULL;

  r = calloc(1, sizeof *r);
  if (!r) {
    eldr__w_send_error(req, 500, NULL, "out of memory");
    goto out;
  }
  r->w = w;
  r->t_arrival = eldr_clock_now();
  r->n_choices = pq.n;
  r->pull_body = pq.pull_body;
  pq.pull_body = NULL;
  memcpy(r->remote_host, pq.remote_host, sizeof r->remote_host);
  r->remote_port = pq.remote_port;
  r->chat = chat;
  r->stream = stream;
  r->include_usage = stream && include_usage;
  r->remote_decode = remote_decode;
  r->remote_prefill = remote_prefill;
  if (pq.echo && !remote_decode) { /* the prefill leg's reply is the router's, not the client's */
    if (!(r->echo = malloc(plen + 1))) {
      eldr__w_send_error(req, 500, NULL, "out of memory");
      goto fail;
    }
    memcpy(r->echo, prompt, plen);
    r->echo[plen] = '\0';
    r->echo_only = max_tokens == 0;
  }
  r->all_next = w->all;
  if (w->all) w->all->all_prev = r;
  w->all = r;
  size_t ntok = 0;
  if (eldr__w_tokenize(prompt, plen, &r->ids, &ntok) < 0) {
    eldr__w_send_error(req, 500, NULL, "out of memory");
    goto fail;
  }
  if (ntok == 0) {
    eldr__w_send_error(req, 400, chat ? "messages" : "prompt", "the prompt is empty (0 tokens)");
    goto fail;
  }
  if (ntok > UINT32_MAX / 2) {
    eldr__w_send_error(req, 400, "prompt", "the prompt is too long (%zu tokens)", ntok);
    goto fail;
  }
  r->n_prompt = (uint32_t)ntok;
  /* output length: the record's decode length or max_tokens (default 16), capped */
  uint32_t want = DEFAULT_MAX_TOKENS;
  if (rec >= 0 && w->trace->req[rec].n_decode > 0) want = w->trace->req[rec].n_decode;
  else if (max_tokens > 0) want = max_tokens > 1 << 20 ? 1 << 20 : (uint32_t)max_tokens;
  r->n_out = want;
  if (max_tokens > 0 && (json_int_t)r->n_out >= max_tokens) {
    r->n_out = (uint32_t)max_tokens;
    r->capped = 1;
  }
  if (max_tokens == 0) { /* echo alone: one token runs, the reply shows the prompt */
    r->n_out = 1;
    r->capped = 1;
  }
  if (remote_decode) {
    r->n_out = 1;
    r->capped = 1;
  }
  size_t pblocks = (ntok + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  size_t dblocks = (ntok + r->n_out + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
  if ((!remote_prefill && pblocks > eldr__kv_total(w->pkv)) ||
      (!remote_decode && dblocks > eldr__kv_total(w->dkv))) {
    eldr__w_send_error(req, 400, chat ? "messages" : "prompt",
               "this request needs %zu tokens of KV cache (prompt %zu + output %u), more than "
               "the worker's %zu blocks of %d tokens",
               remote_decode ? ntok : ntok + r->n_out, ntok, remote_decode ? 0 : r->n_out,
               remote_decode ? eldr__kv_total(w->pkv) : eldr__kv_total(w->dkv), ELDR_BLOCK_TOKENS);
    goto fail;
  }
  r->n_full = ntok / ELDR_BLOCK_TOKENS;
  r->hashes = malloc((r->n_full ? r->n_full : 1) * sizeof *r->hashes);
  if (!r->hashes) {
    eldr__w_send_error(req, 500, NULL, "out of memory");
    goto fail;
  }
  (void)eldr_block_hashes(r->ids, ntok, ELDR_BLOCK_HASH_SEED, r->hashes);
  eldr_diag d = {{0}};
  if (eldr__w_selections(w, prompt, plen, r->ids, ntok, rec, r->n_out, &r->psel,
                 remote_decode ? NULL : &r->dsel, &r->n_dsel, &d) < 0) {
    eldr__w_send_error(req, 500, NULL, "cannot derive expert selections: %s", d.msg);
    goto fail;
  }
  if (!remote_decode && (!r->dsel || r->n_dsel == 0)) {
    eldr__w_send_error(req, 500, NULL, "no decode selections for this request");
    goto fail;
  }
  /* ids and escaped chunk prefix */
  const char *xrid = evhttp_find_header(evhttp_request_get_input_headers(req), "X-Request-Id");
  /* vLLM's serving layer: the request id is "<cmpl|chatcmpl>-" + the
   * X-Request-Id header when given; the engine refuses an id that is
   * already running (OutputProcessor.add_request: ValueError -> 400) */
  if (xrid && *xrid) {
    if (strlen(xrid) > 256) {
      eldr__w_send_error(req, 400, NULL, "X-Request-Id is longer than 256 bytes");
      goto fail;
    }
    snprintf(r->rid, sizeof r->rid, "%s-%s", chat ? "chatcmpl" : "cmpl", xrid);
  } else {
    snprintf(r->rid, sizeof r->rid, "%s-%s-%llu", chat ? "chatcmpl" : "cmpl", w->engine_id,
             (unsigned long long)++w->seq);
  }
  for (const wreq *o = w->all; o; o = o->all_next)
    if (o != r && !o->gone && o->http && !strcmp(o->rid, r->rid)) {
      eldr__w_send_error(req, 400, NULL, "Request id %s already running.", r->rid);
      goto fail;
    }
  r->text_seed = str_hash(r->rid) ^ w->seq;
  char *qrid = json_quote(r->rid);
  if (qrid) {
    size_t cap = strlen(qrid) + strlen(w->served_json) + strlen(w->engine_json) + 160;
    r->chunk_head = malloc(cap);
    if (r->chunk_head)
      snprintf(r->chunk_head, cap,
               "{\"id\":%s,\"object\":\"%s\",\"created\":%lld,\"model\":%s,\"eldr_engine_id\":%s,"
               "\"choices\":[{\"index\":",
               qrid, chat ? "chat.completion.chunk" : "text_completion", (long long)w->created,
               w->served_json, w->engine_json);
    free(qrid);
  }
  if (!r->chunk_head) {
    eldr__w_send_error(req, 500, NULL, "out of memory");
    goto fail;
  }
  /* the connection may close while we work: keep the request, mark it gone */
  r->http = req;
  struct evhttp_connection *c = evhttp_request_get_connection(req);
  if (c) evhttp_connection_set_closecb(c, conn_closed, r);
  if (stream) eldr__w_stream_head(r); /* at once, as vLLM's (wreply.c) */
  if (remote_prefill) {
    if (!w->re_decode) { /* the decode reply's routed_experts need the prompt's rows */
      free(r->psel);
      r->psel = NULL;
    }
    r->state = RS_DECODE_Q;
    eldr__w_q_push(&w->decode_q, r);
    eldr__w_decode_admit(w);
  } else {
    r->state = RS_PREFILL_Q;
    eldr__w_q_push(&w->prefill_q, r);
    eldr__w_prefill_try(w);
  }
  r = NULL;
  goto out;
fail:
  w->st.requests_failed++;
  req_free(r);
out:
  free(pq.pull_body);
  free(prompt);
}

/* --------------------------------------------------------------- endpoints */

static void on_request(struct evhttp_request *req, void *arg) {
  eldr_worker *w = arg;
  const char *uri = evhttp_request_get_uri(req);
  const struct evhttp_uri *pu = evhttp_request_get_evhttp_uri(req);
  const char *path = pu ? evhttp_uri_get_path(pu) : NULL;
  if (!path) path = uri ? uri : "";
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  int is_get = cmd == EVHTTP_REQ_GET, is_post = cmd == EVHTTP_REQ_POST;
  if (!strcmp(path, "/health")) {
    if (!is_get) {
      eldr__w_send_error(req, 405, NULL, "%s allows GET only", path);
      return;
    }
    evhttp_send_reply(req, 200, "OK", NULL);
  } else if (!strcmp(path, "/metrics")) {
    if (!is_get) eldr__w_send_error(req, 405, NULL, "%s allows GET only", path);
    else eldr__w_handle_metrics(w, req);
  } else if (!strcmp(path, "/v1/models")) {
    if (!is_get) eldr__w_send_error(req, 405, NULL, "%s allows GET only", path);
    else eldr__w_handle_models(w, req);
  } else if (!strcmp(path, ELDR__PULL_PATH) && !w->sglang) {
    if (!is_post) eldr__w_send_error(req, 405, NULL, "%s allows POST only", path);
    else if (w->role == ELDR_WORKER_DECODE) eldr__w_send_error(req, 404, NULL, "role decode holds no KV for others");
    else eldr__w_handle_pull(w, req);
  } else if (!strcmp(path, "/generate") && w->sglang) { /* SGLang's native API */
    if (!is_post) eldr__w_send_error(req, 405, NULL, "%s allows POST only", path);
    else eldr__sgl_handle(w, req, SGL_API_GENERATE);
  } else if (!strcmp(path, "/v1/completions") || !strcmp(path, "/v1/chat/completions")) {
    if (!is_post) eldr__w_send_error(req, 405, NULL, "%s allows POST only", path);
    else if (w->sglang) eldr__sgl_handle(w, req, path[4] == 'c' && path[5] == 'h');
    else handle_completion(w, req, path[4] == 'c' && path[5] == 'h');
  } else {
    eldr__w_send_error(req, 404, NULL, "no route for %s", path);
  }
}

/* ------------------------------------------------------------- lifecycle */

/* Expert parallelism: the placement (given, else linear) and the tally. */
static int ep_setup(eldr_worker *w, const eldr_worker_config *cfg, eldr_diag *d) {
  const eldr_placement *p = cfg->placement;
  int rc;
  if (!p) {
    if ((rc = eldr_placement_linear(w->shape.num_layers, w->shape.num_experts, cfg->ep_size, 0,
                                    &w->own_placement, d)) < 0)
      return rc;
    p = w->own_placement;
  }
  if (p->num_layers != w->shape.num_layers || p->num_experts != w->shape.num_experts ||
      p->ep_size != cfg->ep_size || !p->ncopies)
    return eldr_diag_fail(d, ELDR_ESHAPE,
                          "worker: placement of %u layers x %u experts over %u ranks does not fit "
                          "model '%s' (%u x %u) with EP %u",
                          p->num_layers, p->num_experts, p->ep_size, cfg->model, w->shape.num_layers,
                          w->shape.num_experts, cfg->ep_size);
  w->placement = p;
  return eldr_ep_tally_init(&w->ep, w->shape.num_layers, w->shape.top_k, p->ep_size,
                            p->num_physical, d);
}

/* SGLang: peers that left while their request waited (no write tells evhttp). */
static void sgl_sweep(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  eldr_worker *w = arg;
  eldr__sgl_sweep(w);
  eldr__sgl_boot_sweep(w);
}

/* Held blocks were freed (expiry): prompts waiting for blocks may start. */
static void blocks_freed(void *arg) { eldr__w_prefill_try(arg); }

int eldr_worker_new(struct event_base *base, const eldr_worker_config *cfg, eldr_worker **out,
                    eldr_diag *d) {
  *out = NULL;
  if (!base || !cfg || !cfg->model || !cfg->hardware)
    return eldr_diag_fail(d, ELDR_EINVAL, "worker: base, model and hardware are required");
  if (!(cfg->time_scale > 0) || !isfinite(cfg->time_scale))
    return eldr_diag_fail(d, ELDR_EINVAL, "worker: time_scale must be > 0 (got %g)", cfg->time_scale);
  eldr_worker *w = calloc(1, sizeof *w);
  if (!w) return ELDR_ENOMEM;
  int rc = 0;
  w->base = base;
  w->role = cfg->role;
  w->scale = cfg->time_scale;
  w->return_re = cfg->return_routed_experts;
  w->re_computed_only = cfg->routed_experts_computed_only;
  w->re_decode = cfg->routed_experts_decode && cfg->return_routed_experts;
  w->re_stream = w->re_decode && cfg->routed_experts_stream;
  w->prompt_details = cfg->enable_prompt_tokens_details;
  w->pull_timeout = cfg->kv_pull_timeout > 0 ? cfg->kv_pull_timeout : DEFAULT_PULL_TIMEOUT;
  w->sglang = cfg->engine == ELDR_WORKER_ENGINE_SGLANG;
  w->sgl_exact = w->sglang && cfg->sglang_exact;
  w->sgl_bootstrap_timeout = cfg->bootstrap_timeout > 0 ? cfg->bootstrap_timeout : SGL_DEFAULT_TIMEOUT;
  w->sgl_waiting_timeout = cfg->waiting_timeout > 0 ? cfg->waiting_timeout : SGL_DEFAULT_TIMEOUT;
  eldr__wmetrics_init(&w->m);
  if (cfg->corpus_dir) {
    rc = eldr__corpus_load(cfg->corpus_dir, &w->corpus, d);
    if (rc < 0) goto fail;
  }
  w->re_layout = cfg->routed_experts_layout ? cfg->routed_experts_layout : ELDR_RE_LAYOUT_NPY;
  w->max_seqs = cfg->max_num_seqs ? cfg->max_num_seqs : DEFAULT_MAX_SEQS;
  w->max_batched_tokens = cfg->max_batched_tokens ? cfg->max_batched_tokens : DEFAULT_BATCH_TOKENS;
  w->created = (time_t)now_wall();
  snprintf(w->model, sizeof w->model, "%s", cfg->model);
  snprintf(w->served, sizeof w->served, "%s",
           cfg->served_model_name ? cfg->served_model_name : cfg->model);
  snprintf(w->host, sizeof w->host, "%s", cfg->host ? cfg->host : "127.0.0.1");
  rc = cfg->ep_size ? eldr_latency_preset_ep(cfg->model, cfg->hardware,
                                              cfg->tp ? cfg->tp : cfg->ep_size, cfg->ep_size, &w->lm, d)
                     : eldr_latency_preset(cfg->model, cfg->hardware, &w->lm, d);
  if (rc < 0) goto fail;
  char canon[64];
  rc = eldr_tracegen_model_shape(cfg->model, &w->shape, canon, sizeof canon, d);
  if (rc < 0) goto fail;
  if (memcmp(&w->shape, &w->lm.shape, sizeof w->shape)) {
    rc = eldr_diag_fail(d, ELDR_ESHAPE, "worker: latency preset shape of '%s' differs from the trace generator's",
                        cfg->model);
    goto fail;
  }
  w->LK = (size_t)w->shape.num_layers * w->shape.top_k;
  /* vLLM's capturer: a row per hidden layer, MoE layer l at its layer index */
  eldr_tracegen_layer_ids(cfg->model, &w->shape, w->re_ids);
  w->re_hidden = cfg->routed_experts_moe_only ? w->shape.num_layers : w->re_ids[w->shape.num_layers - 1] + 1;
  w->LE = eldr_shape_cells(&w->shape);
  if (cfg->trace) {
    const eldr_shape *ts = &cfg->trace->shape;
    if (ts->num_layers != w->shape.num_layers || ts->num_experts != w->shape.num_experts ||
        ts->top_k != w->shape.top_k) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE,
                          "worker: trace shape (%u layers, %u experts, top-%u) differs from model "
                          "'%s' (%u, %u, top-%u); pass --model matching the trace",
                          ts->num_layers, ts->num_experts, ts->top_k, cfg->model,
                          w->shape.num_layers, w->shape.num_experts, w->shape.top_k);
      goto fail;
    }
    w->trace = cfg->trace;
    size_t cap = 16;
    while (cap < 2 * cfg->trace->n + 2) cap <<= 1;
    w->trace_index = calloc(cap, sizeof *w->trace_index);
    if (!w->trace_index) {
      rc = ELDR_ENOMEM;
      goto fail;
    }
    w->trace_mask = cap - 1;
    for (size_t i = 0; i < cfg->trace->n; i++) {
      if (eldr__w_trace_find(w, cfg->trace->req[i].id) >= 0) continue; /* first wins */
      size_t s = str_hash(cfg->trace->req[i].id) & w->trace_mask;
      while (w->trace_index[s]) s = (s + 1) & w->trace_mask;
      w->trace_index[s] = i + 1;
    }
  }
  rc = eldr_tracegen_new(&w->shape, canon, "task", cfg->seed, &w->gen, d);
  if (rc < 0) goto fail;
  if (cfg->ep_size && (rc = ep_setup(w, cfg, d)) < 0) goto fail;
  size_t kvb = cfg->kv_blocks ? cfg->kv_blocks : DEFAULT_KV_BLOCKS;
  w->pkv = eldr__kv_new(kvb, &w->shape);
  w->dkv = eldr__kv_new(kvb, NULL);
  w->hold = w->pkv ? eldr__kvhold_new(base, w->pkv,
                                      cfg->kv_abort_timeout > 0 ? cfg->kv_abort_timeout
                                                                : DEFAULT_ABORT_TIMEOUT,
                                      blocks_freed, w)
                   : NULL;
  w->pbatch = calloc(w->max_seqs, sizeof *w->pbatch);
  w->running = calloc(w->max_seqs, sizeof *w->running);
  if (eldr_union_init(&w->un, &w->shape)) w->un.bits = NULL;
  w->unions = calloc(w->shape.num_layers, sizeof *w->unions);
  w->rowbuf = calloc(w->LE, sizeof *w->rowbuf);
  w->prefill_ev = evtimer_new(base, prefill_done, w);
  w->step_ev = evtimer_new(base, eldr__w_step_done, w);
  w->http = evhttp_new(base);
  if (!w->pkv || !w->dkv || !w->hold || !w->pbatch || !w->running || !w->un.bits || !w->unions || !w->rowbuf ||
      !w->prefill_ev || !w->step_ev || !w->http) {
    rc = ELDR_ENOMEM;
    goto fail;
  }
  evhttp_set_max_body_size(w->http, MAX_BODY);
  evhttp_set_timeout(w->http, 600);
  evhttp_set_allowed_methods(w->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                          EVHTTP_REQ_DELETE | EVHTTP_REQ_HEAD);
  evhttp_set_gencb(w->http, on_request, w);
  struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(w->http, w->host, cfg->port);
  if (!bs) {
    int e = errno;
    rc = eldr_diag_fail(d, ELDR_EIO, "worker: cannot listen on %s:%u: %s", w->host,
                        (unsigned)cfg->port, e ? strerror(e) : "in use or not a local address");
    goto fail;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET) w->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6) w->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  }
  if (w->sglang && w->role == ELDR_WORKER_PREFILL && (rc = eldr__sgl_boot_new(w, cfg->bootstrap_port, d)) < 0)
    goto fail;
  if (w->sglang) {
    struct timeval tv = {0, (suseconds_t)(SGL_SWEEP_S * 1e6)};
    if (!(w->sgl_sweep_ev = event_new(base, -1, EV_PERSIST, sgl_sweep, w)) || event_add(w->sgl_sweep_ev, &tv)) {
      rc = ELDR_ENOMEM;
      goto fail;
    }
  }
  if (cfg->engine_id) snprintf(w->engine_id, sizeof w->engine_id, "%.80s", cfg->engine_id);
  else snprintf(w->engine_id, sizeof w->engine_id, "eldr-%s-%u", eldr_worker_role_name(w->role),
                (unsigned)w->port);
  w->served_json = json_quote(w->served);
  w->engine_json = json_quote(w->engine_id);
  if (!w->served_json || !w->engine_json) {
    rc = ELDR_ENOMEM;
    goto fail;
  }
  *out = w;
  return 0;
fail:
  eldr_worker_free(w);
  return rc < 0 ? rc : ELDR_ENOMEM;
}

void eldr_worker_free(eldr_worker *w) {
  if (!w) return;
  while (w->all) {
    wreq *r = w->all;
    if (r->state == RS_PULLING && !r->grp) w->n_pulling--; /* an SGLang item's cleanup counts its own */
    eldr__w_req_abort(r, 503, "the worker is shutting down");
  }
  eldr__sgl_groups_free(w);
  eldr__sgl_boot_free(w);
  if (w->sgl_sweep_ev) event_free(w->sgl_sweep_ev);
  if (w->http) evhttp_free(w->http);
  eldr__kvhold_free(w->hold);
  eldr__corpus_free(w->corpus);
  if (w->step_ev) event_free(w->step_ev);
  if (w->prefill_ev) event_free(w->prefill_ev);
  eldr_ep_tally_free(&w->ep);
  eldr_placement_free(w->own_placement);
  free(w->rowbuf);
  free(w->unions);
  eldr_union_free(&w->un);
  free(w->running);
  free(w->pbatch);
  eldr__kv_free(w->dkv);
  eldr__kv_free(w->pkv);
  eldr_tracegen_free(w->gen);
  free(w->trace_index);
  free(w->served_json);
  free(w->engine_json);
  free(w);
}

uint16_t eldr_worker_port(const eldr_worker *w) { return w->port; }

uint16_t eldr_worker_bootstrap_port(const eldr_worker *w) { return eldr__sgl_boot_port(w); }

void eldr_worker_stats_get(const eldr_worker *w, eldr_worker_stats *s) {
  *s = w->st;
  s->running = w->n_running;
  s->waiting = w->prefill_q.n + w->n_pbatch + w->decode_q.n + w->n_pulling + w->ready_q.n;
  s->kv_blocks_used = eldr__kv_used(w->pkv) + eldr__kv_used(w->dkv);
  s->kv_blocks_total = eldr__kv_total(w->pkv) + eldr__kv_total(w->dkv);
  s->kv_held = eldr__kvhold_count(w->hold);
  s->kv_held_expired = eldr__kvhold_expired(w->hold);
}
