/* wdecode.c — the emulated engine's decode side (see worker.c for the
 * request lifecycle): KV admission of decode requests, the side-channel
 * pull of a prefill's held blocks (vLLM's NIXL handoff) and its transfer
 * timer, and the step loop (one token per running request per step, each
 * step timed by the latency model over the batch's expert union).
 * Runs on the worker's event loop; owns nothing beyond the requests it
 * moves between the worker's queues. */
#include "worker/worker_impl.h"

static void step_start(eldr_worker *w);
static void decode_admit(eldr_worker *w);

/* The pull's end (a timer, outside the side-channel connection's callbacks,
 * so the connection can be freed here): failed -> the request fails as
 * vLLM's does when the KV load fails; else it joins the batch. */
static void pull_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  wreq *r = arg;
  eldr_worker *w = r->w;
  w->n_pulling--;
  if (r->pull_conn) {
    evhttp_connection_free(r->pull_conn);
    r->pull_conn = NULL;
  }
  if (r->pull_failed) {
    w->st.kv_pulls_failed++;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", r->pull_body ? r->pull_body : "KV transfer failed");
    eldr__w_req_abort(r, 500, msg);
    decode_admit(w);
    return;
  }
  if (r->gone) {
    eldr__w_req_abort(r, 499, "client closed the connection");
    decode_admit(w);
    return;
  }
  r->state = RS_READY;
  eldr__w_q_push(&w->ready_q, r);
  if (!w->stepping) step_start(w);
}

/* The prefill worker's answer to the pull: schedule pull_done now (failure:
 * pull_failed, the message in pull_body) or after the modelled transfer time. */
static void pull_reply(struct evhttp_request *req, void *arg) {
  wreq *r = arg;
  eldr_worker *w = r->w;
  r->pull_req = NULL;
  int code = req ? evhttp_request_get_response_code(req) : 0;
  struct timeval tv = {0, 0};
  if (code == 200) {
    eldr__w_tv_of(eldr_latency_kv_transfer(&w->lm, r->n_prompt) * w->scale, &tv);
  } else {
    char msg[768];
    if (code == 0)
      snprintf(msg, sizeof msg,
               "KV transfer failed: the prefill worker %.255s:%u did not answer the pull of "
               "request %.200s (unreachable, or no answer within %g s)",
               r->remote_host, (unsigned)r->remote_port, r->rid, w->pull_timeout);
    else
      snprintf(msg, sizeof msg,
               "KV transfer failed: the prefill worker %.255s:%u answered %d to the pull (its "
               "blocks were freed: expired, already pulled, or the worker restarted)",
               r->remote_host, (unsigned)r->remote_port, code);
    free(r->pull_body);
    r->pull_body = strdup(msg);
    r->pull_failed = 1;
  }
  evtimer_add(r->pull_ev, &tv);
}

/* Ask the prefill worker (remote_host:remote_port) for the request's blocks. */
static int pull_start(wreq *r) {
  eldr_worker *w = r->w;
  r->pull_ev = evtimer_new(w->base, pull_done, r);
  if (!r->pull_ev) return -1;
  r->pull_conn = evhttp_connection_base_new(w->base, NULL, r->remote_host, r->remote_port);
  if (!r->pull_conn) return -1;
  struct timeval tv;
  eldr__w_tv_of(w->pull_timeout, &tv);
  evhttp_connection_set_timeout_tv(r->pull_conn, &tv);
  evhttp_connection_set_retries(r->pull_conn, 0);
  evhttp_connection_set_max_headers_size(r->pull_conn, 8192);
  evhttp_connection_set_max_body_size(r->pull_conn, 4096);
  struct evhttp_request *req = evhttp_request_new(pull_reply, r);
  if (!req) return -1;
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  char hostport[300];
  snprintf(hostport, sizeof hostport, "%.255s:%u", r->remote_host, (unsigned)r->remote_port);
  evhttp_add_header(h, "Host", hostport);
  evhttp_add_header(h, "Content-Type", "application/json");
  evbuffer_add(evhttp_request_get_output_buffer(req), r->pull_body, strlen(r->pull_body));
  r->pull_req = req;
  if (evhttp_make_request(r->pull_conn, req, EVHTTP_REQ_POST, ELDR__PULL_PATH) < 0) {
    r->pull_req = NULL; /* freed by libevent */
    return -1;
  }
  return 0;
}

/* Move decode-queue requests that get KV blocks (FIFO) into pulling/ready. */
static void decode_admit(eldr_worker *w) {
  while (w->decode_q.head) {
    wreq *r = w->decode_q.head;
    if (r->gone) {
      eldr__w_q_pop(&w->decode_q);
      eldr__w_req_abort(r, 499, "client closed the connection");
      continue;
    }
    if (w->n_running + w->ready_q.n + w->n_pulling >= w->max_seqs) break;
    size_t need = (r->n_prompt + r->n_out + ELDR_BLOCK_TOKENS - 1) / ELDR_BLOCK_TOKENS;
    int32_t *b = malloc(need * sizeof *b);
    if (!b) break;
    if (eldr__kv_alloc(w->dkv, NULL, 0, need, b) < 0) {
      free(b);
      break;
    }
    eldr__w_q_pop(&w->decode_q);
    r->blocks = b;
    r->n_blocks = need;
    if (r->remote_prefill && r->grp) { /* SGLang: register for the room, wait for the KV */
      r->state = RS_PULLING;
      w->n_pulling++;
      if (eldr__sgl_register(r) < 0) eldr__sgl_fail(r, 500, "cannot register with the prefill's bootstrap server");
      continue;
    }
    if (r->remote_prefill) {
      r->state = RS_PULLING;
      if (pull_start(r) < 0) {
        eldr__w_req_abort(r, 500, "cannot start the KV pull");
        continue;
      }
      w->n_pulling++;
    } else {
      r->state = RS_READY;
      eldr__w_q_push(&w->ready_q, r);
    }
  }
  if (!w->stepping && w->ready_q.n) step_start(w);
}

void eldr__w_decode_admit(eldr_worker *w) { decode_admit(w); }

void eldr__w_ready(wreq *r) {
  r->state = RS_READY;
  eldr__w_q_push(&r->w->ready_q, r);
  if (!r->w->stepping) step_start(r->w);
}

void eldr__w_step_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  eldr_worker *w = arg;
  w->stepping = 0;
  size_t keep = 0;
  for (size_t i = 0; i < w->n_running; i++) {
    wreq *r = w->running[i];
    if (r->gone) {
      eldr__w_req_abort(r, 499, "client closed the connection");
      continue;
    }
    uint32_t t = r->emitted++;
    w->st.generation_tokens += r->n_choices;
    if (t == 0) eldr__w_observe_first(r);
    int last = r->emitted >= r->n_out;
    if (r->stream && r->http) {
      eldr__w_stream_start(r);
      for (uint32_t c = 0; c < r->n_choices; c++) eldr__w_stream_token(r, c, t, last);
    } else if (r->grp) {
      eldr__sgl_token(r, t, last);
    }
    if (last) {
      r->state = RS_DONE;
      eldr__w_reply_done(r);
      eldr__w_req_free(r);
      continue;
    }
    w->running[keep++] = r;
  }
  w->n_running = keep;
  decode_admit(w);
  step_start(w);
}

/* EP step time: the batch's current tokens tallied per EP rank. */
static double ep_step(eldr_worker *w, double ctx) {
  eldr_ep_tally_begin(&w->ep);
  for (size_t i = 0; i < w->n_running; i++) {
    const wreq *r = w->running[i];
    eldr_ep_tally_add(&w->ep, w->placement, r->dsel + (size_t)(r->emitted % r->n_dsel) * w->LK,
                      (uint32_t)i);
  }
  eldr_ep_tally_end(&w->ep);
  return eldr_latency_step_ep(&w->lm, w->n_running, w->ep.rank_experts, w->ep.rank_tokens,
                              w->placement->ep_size, ctx);
}

static void step_start(eldr_worker *w) {
  if (w->stepping) return;
  while (w->ready_q.head && w->n_running < w->max_seqs) {
    wreq *r = eldr__w_q_pop(&w->ready_q);
    if (r->gone) {
      eldr__w_req_abort(r, 499, "client closed the connection");
      continue;
    }
    r->state = RS_RUNNING;
    w->running[w->n_running++] = r;
  }
  if (!w->n_running) return;
  const uint32_t L = w->shape.num_layers;
  eldr_union_clear(&w->un);
  double ctx = 0;
  for (size_t i = 0; i < w->n_running; i++) {
    const wreq *r = w->running[i];
    const uint16_t *row = r->dsel + (size_t)(r->emitted % r->n_dsel) * w->LK;
    eldr_union_add_token(&w->un, row);
    ctx += (double)r->n_prompt + r->emitted;
  }
  double mean_union = (double)eldr_union_count(&w->un, w->unions);
  double dur = (w->placement ? ep_step(w, ctx) : eldr_latency_step(&w->lm, w->n_running, w->unions, ctx)) *
               w->scale;
  w->st.union_sum += mean_union / L;
  w->st.batch_sum += w->n_running;
  w->st.token_seconds += dur * (double)w->n_running;
  w->st.steps++;
  w->st.step_seconds += dur;
  /* back-to-back steps are timed from the previous step's planned end, so
   * event-loop latency does not accumulate into the emulated step times */
  double now = eldr_clock_now();
  double start = (w->step_end > now - dur && w->step_end <= now) ? w->step_end : now;
  w->step_end = start + dur;
  struct timeval tv;
  eldr__w_tv_of(w->step_end - now, &tv);
  w->stepping = 1;
  evtimer_add(w->step_ev, &tv);
}
