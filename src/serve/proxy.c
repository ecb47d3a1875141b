/* proxy.c — one completion request through the two legs: the prefill leg
 * (the client's body rewritten for a KV-producing prefill), the signature of
 * its routed_experts and the decode decision, the decode leg (the original
 * body plus kv_transfer_params) relayed to the client, retries on other
 * workers, deadlines; GET /v1/models passes through the same leg machinery.
 * Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/uuid.h"
#include "serve_types.h"

/* ---- request lifecycle ---------------------------------------------------- */

void eldr__rq_finish_metrics(rq *r, int outcome) {
  if (r->is_models) return; /* completions only */
  int status = r->L.status ? r->L.status : outcome == OUT_OK ? 200 : 0;
  eldr__access_log(r, outcome, status);
  if (r->rec) eldr__record_finish(r, status);
  r->s->m.requests[r->policy][r->decision][outcome]++;
  eldr__histo_add(&r->s->m.request, eldr__now_s() - r->t0);
}

/* The leg's exchange is over (or is dropped): connection back to the pool. */
void eldr__leg_release(rq *r) {
  leg *L = &r->L;
  eldr__bus_end(r); /* the fleet's view of the leg (before its ticket's weights go) */
  eldr__fps_end(r); /* a footprint ticket lives from the decision to the decode leg's end */
  if (L->deadline) event_del(L->deadline);
  if (L->up && eldr_up_resent(L->up)) r->s->m.resends[L->kind]++; /* a stale kept-alive connection */
  if (L->up && eldr_up_active(L->up)) eldr_up_abort(L->up); /* the worker sees us leave */
  if (L->w) eldr__worker_put(L->w, L->up); /* may free a retired worker */
  L->w = NULL;
  L->up = NULL;
}

/* Client went away while the request was in flight. */
void eldr__rq_abort(rq *r) {
  r->s->m.disconnects++;
  eldr__rq_finish_metrics(r, OUT_CANCELLED);
  r->c = NULL;
  eldr__rq_free(r);
}

static int was_tried(const rq *r, const worker *w) {
  for (int i = 0; i < r->ntried; i++)
    if (r->tried[i] == w->id) return 1;
  return 0;
}

/* loads / healthy arrays of a role, tried workers excluded; seen: the
 * in-flight counts (all loops) the loads were computed from. */
int eldr__fill_loads(eldr_server *s, int role, rq *r, size_t *n) {
  size_t k = s->nw[role];
  if (k > s->loadcap) {
    uint32_t *l = realloc(s->loads, k * sizeof *l);
    if (l) s->loads = l;
    uint32_t *sn = realloc(s->seen, k * sizeof *sn);
    if (sn) s->seen = sn;
    uint8_t *h = realloc(s->healthy, k);
    if (h) s->healthy = h;
    uint64_t *ky = realloc(s->keys, k * sizeof *ky);
    if (ky) s->keys = ky;
    if (!l || !sn || !h || !ky) return ELDR_ENOMEM;
    s->loadcap = k;
  }
  for (size_t i = 0; i < k; i++) {
    worker *w = s->w[role][i];
    s->seen[i] = w->slot->inflight;
    s->loads[i] = eldr__worker_load_at(w, s->seen[i]);
    s->healthy[i] = (uint8_t)(eldr__worker_up(w) && !was_tried(r, w));
    s->keys[i] = w->slot->key;
  }
  *n = k;
  return 0;
}

/* The decode pick k of the loads fill_loads read: its in-flight count taken
 * (r->reserved) if no loop changed it since (1), else 0: decide again.
 * last: take it regardless (a bounded number of rounds). */
static int reserve(rq *r, int k, int last) {
  eldr__slot *sl = r->s->w[ROLE_DECODE][k]->slot;
  if (!eldr__slot_reserve(sl, r->s->seen[k])) {
    if (!last) return 0;
    sl->inflight++;
  }
  r->reserved = sl;
  return 1;
}

static void leg_head_cb(void *arg, int status, const char *ctype);
static void leg_data_cb(void *arg, const char *p, size_t n);
static void leg_done_cb(void *arg, int err);
static const eldr_up_cbs leg_cbs = {leg_head_cb, leg_data_cb, leg_done_cb};
static void start_prefill(rq *r);
static void start_decode(rq *r, int retry);

/* Arm the leg's deadline: the first-byte / idle bound `hung` (0: none) or
 * the whole leg's end, whichever comes first. */
static void leg_arm(rq *r, double hung) {
  leg *L = &r->L;
  double left = L->t_end - eldr__now_s();
  if (left < 0) left = 0;
  L->hung_timer = hung > 0 && hung < left;
  struct timeval tv = eldr__tv_of(L->hung_timer ? hung : left);
  event_add(L->deadline, &tv);
}

int eldr__leg_send(rq *r, leg *L, worker *w, int reserved, const char *method, const char *path, const char *body,
                   size_t len, const eldr_up_cbs *cbs) {
  eldr_up *up = eldr__pool_take(w);
  if (!up) return ELDR_ENOMEM;
  char head[ELDR__HTTP_PATH_MAX + 512];
  char *h = head; /* method, path and host are bounded (the path a constant, hosthdr a URL's host) */
  h = eldr__puts(h, method);
  *h++ = ' ';
  h = eldr__puts(h, path);
  h = ELDR__PUT_LIT(h, " HTTP/1.1\r\nHost: ");
  h = eldr__put(h, w->hosthdr, strnlen(w->hosthdr, 300));
  h = ELDR__PUT_LIT(h, "\r\n");
  if (body) {
    h = ELDR__PUT_LIT(h, "Content-Type: application/json\r\nContent-Length: ");
    h = eldr__put_u64(h, len);
    h = ELDR__PUT_LIT(h, "\r\n");
  }
  if (r->reqid[0]) {
    h = ELDR__PUT_LIT(h, "X-Request-Id: ");
    h = eldr__put(h, r->reqid, strnlen(r->reqid, sizeof r->reqid));
    h = ELDR__PUT_LIT(h, "\r\n");
  }
  size_t hn = (size_t)(h - head);
  struct iovec iov[3] = {{head, hn}, {r->b.fwd.p, r->b.fwd.n}, {(void *)body, body ? len : 0}};
  if (eldr_up_request(up, iov, body ? 3 : 2, cbs, r) != 0) {
    eldr__pool_give(w, up);
    return ELDR_EIO;
  }
  L->w = w;
  L->up = up;
  L->hung_gen = w->slot->hung_gen;
  w->inflight++;
  if (!reserved) w->slot->inflight++;
  if (w->slot->inflight == 1) eldr__slot_progress(w->slot); /* work arrived: the hang clock starts now */
  w->slot->requests++;
  return 0;
}

int eldr__leg_start(rq *r, worker *w, int kind, const char *method, const char *path, const char *body, size_t len) {
  leg *L = &r->L;
  eldr_server *s = r->s;
  L->kind = kind;
  L->started = 0;
  L->status = 0;
  L->ctype[0] = 0;
  L->n = 0;
  L->streaming = kind == LEG_DECODE && r->req.stream;
  L->sent = 0;
  int reserved = r->reserved == w->slot; /* the decision took the in-flight count already */
  if (r->reserved && !reserved) r->reserved->inflight--; /* not this worker's: given back */
  r->reserved = NULL;
  int rc = eldr__leg_send(r, L, w, reserved, method, path, body, len, &leg_cbs);
  if (rc) {
    if (reserved) w->slot->inflight--;
    return rc;
  }
  if (kind == LEG_DECODE) eldr__bus_route(r, w);
  if (r->ntried < MAX_TRIED) r->tried[r->ntried++] = w->id;
  double t = kind == LEG_PREFILL ? s->cfg.prefill_timeout_s
             : kind == LEG_DECODE ? s->cfg.decode_timeout_s
                                  : s->cfg.connect_timeout_s;
  L->t_end = eldr__now_s() + t;
  leg_arm(r, L->streaming ? s->cfg.decode_first_byte_timeout_s : 0);
  return 0;
}

void eldr__client_upstream_error(rq *r, int status, int outcome, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (r->reserved) r->reserved->inflight--; /* a decode pick that gets no leg */
  r->reserved = NULL;
  r->L.status = status; /* what the client gets */
  eldr__rq_finish_metrics(r, outcome);
  eldr__send_error(r->c, status, status == 504 ? "timeout" : "upstream_error", "%s", msg);
}

/* The current leg failed (connect, reset, 5xx, bad reply or timeout). */
static void leg_failed(rq *r, int timeout, const char *why) {
  eldr_server *s = r->s;
  int kind = r->L.kind;
  snprintf(r->last_err, sizeof r->last_err, "%s", why);
  r->last_timeout = timeout;
  if (kind == LEG_MODELS) {
    eldr__client_upstream_error(r, timeout ? 504 : 502, timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                          "model list: %s", why);
    return;
  }
  int attempts = r->ntried;
  if (kind == LEG_DECODE && r->L.sent) {
    /* not retried once sent: the decoder may already have pulled (and the
     * prefill freed) the KV blocks; only a failure to connect is retried */
    eldr__client_upstream_error(r, timeout ? 504 : 502, timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                          "decode failed after the request was sent (not retried): %s", why);
    return;
  }
  if (attempts <= s->cfg.retries) {
    s->m.retries[kind == LEG_DECODE]++;
    eldr__logf(s, "request %s: %s leg failed (%s), retrying on another worker", r->reqid,
          eldr__role_name[kind == LEG_DECODE], why);
    if (kind == LEG_PREFILL) start_prefill(r);
    else start_decode(r, 1);
    return;
  }
  eldr__client_upstream_error(r, timeout ? 504 : 502, timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                        "%s failed after %d attempt%s: %s", eldr__role_name[kind == LEG_DECODE],
                        attempts, attempts == 1 ? "" : "s", why);
}

/* A started stream cannot be retried: end it with an SSE error event, then
 * "data: [DONE]", as vLLM's stream generators end after an error
 * (completion_stream_generator: the error event, then [DONE]). */
void eldr__abort_stream(rq *r, int code, const char *type, const char *msg) {
  char ev[560];
  int n = snprintf(ev, sizeof ev,
                   "data: {\"error\":{\"message\":\"%.300s\",\"type\":\"%.32s\",\"code\":%d}}\n\ndata: [DONE]\n\n", msg,
                   type, code); /* bounded: the event fits whatever the message (no quote in one) */
  eldr__stream_chunk(r->c, ev, n > 0 && (size_t)n < sizeof ev ? (size_t)n : 0);
  eldr__rq_finish_metrics(r, OUT_STREAM_ABORTED);
  eldr__stream_end(r->c);
}

/* The leg ran out of time: its exchange aborted, the client answered 504
 * (or its stream ended with an error event). */
static void leg_timed_out(rq *r, const char *why) {
  leg *L = &r->L;
  int started = L->started;
  L->sent = L->up && eldr_up_sent(L->up);
  eldr__leg_release(r); /* aborts the exchange */
  if (started) {
    eldr__abort_stream(r, 504, "timeout", why);
    return;
  }
  leg_failed(r, 1, why);
}

/* r's leg is on w (NULL: on a worker found hung since the leg started). */
static int leg_on_hung(const rq *r, const worker *w, const rq *except) {
  if (!r || r == except || !r->L.w) return 0;
  return w ? r->L.w == w : r->L.w->slot->hung_gen != r->L.hung_gen;
}

/* This loop's legs on w (NULL: on any worker found hung) end now. */
static void end_hung_legs(eldr_server *s, const worker *w, const rq *except) {
  size_t n = 0;
  for (hconn *c = s->conns; c; c = c->next) n += leg_on_hung(c->r, w, except);
  if (!n) return;
  rq **v = malloc(n * sizeof *v);
  if (!v) return; /* they end at their own deadlines */
  size_t k = 0;
  for (hconn *c = s->conns; c && k < n; c = c->next)
    if (leg_on_hung(c->r, w, except)) v[k++] = c->r;
  for (size_t i = 0; i < k; i++) {
    v[i]->L.w->slot->err_timeout++;
    leg_timed_out(v[i], v[i]->L.kind == LEG_DECODE ? "decode worker hung (ejected)" : "worker hung (ejected)");
  }
  free(v);
}

void eldr__hung_sweep(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  end_hung_legs(arg, NULL, NULL);
}

void eldr__worker_hung(worker *w, const char *why) {
  (void)why; /* hang.c logged it */
  eldr_server *s = w->s;
  eldr__slot *sl = w->slot;
  /* ejected for every loop; a successful health check re-admits it (without
   * health checks nothing would: it stays admitted, its legs still end) */
  if (s->cfg.health_interval_s > 0 && atomic_exchange(&sl->healthy, 0)) sl->ejections++;
  sl->fails = 0;
  sl->hung_gen++;
  const eldr__group *g = s->grp;
  for (int i = 0; g && i < g->n; i++)
    if (g->loops[i] && g->loops[i] != s && g->loops[i]->ev_hung) event_active(g->loops[i]->ev_hung, EV_TIMEOUT, 0);
  end_hung_legs(s, w, NULL);
}

void eldr__leg_deadline_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  rq *r = arg;
  leg *L = &r->L;
  worker *w = L->w;
  eldr_server *s = r->s;
  if (L->hung_timer && w) { /* this request's own queue timeout: it alone ends, the worker is not judged */
    w->slot->err_timeout++;
    s->m.queue_timeouts++;
    char why[160];
    snprintf(why, sizeof why,
             L->started ? "no token from the decode worker for %g s (decode_idle_timeout; the worker is not ejected)"
                        : "no token from the decode worker within %g s (queued; decode_first_byte_timeout; the worker is not ejected)",
             L->started ? s->cfg.decode_idle_timeout_s : s->cfg.decode_first_byte_timeout_s);
    leg_timed_out(r, why);
    return;
  }
  if (w) {
    w->slot->err_timeout++;
    eldr__worker_failed(w, "timeout");
  }
  leg_timed_out(r, L->kind == LEG_DECODE && L->started ? "decode timed out" : "timed out");
}

#define PRESIZE_MAX (32ll << 20)
#define REPLY_SLACK 4096

/* The leg's reply buffer to at least need bytes, its bytes kept: a large one
 * from the loop's pool (bufpool.h: reused, no page faults once warm), a
 * small one grown in place. 0 or ELDR_ENOMEM (L unchanged). */
static int leg_buf_grow(rq *r, size_t need) {
  leg *L = &r->L;
  if (need <= L->cap) return 0;
  size_t cap = L->cap ? L->cap : 4096;
  while (cap < need) cap *= 2;
  if (cap < ELDR__BUFPOOL_MIN) {
    char *q = realloc(L->buf, cap);
    if (!q) return ELDR_ENOMEM;
    L->buf = q;
    L->cap = cap;
    return 0;
  }
  size_t got;
  char *q = eldr__bufpool_take(&r->s->bufs, L->n ? cap : need, &got);
  if (!q) return ELDR_ENOMEM;
  if (L->n) memcpy(q, L->buf, L->n);
  eldr__bufpool_give(&r->s->bufs, L->buf, L->cap);
  L->buf = q;
  L->cap = got;
  return 0;
}

static void leg_head_cb(void *arg, int status, const char *ctype) {
  rq *r = arg;
  leg *L = &r->L;
  L->status = status;
  if (L->w) eldr__slot_progress(L->w->slot);
  eldr__copy(L->ctype, sizeof L->ctype, ctype);
  if (L->streaming) return; /* the first-byte bound runs on to the first token (vLLM sends its head at once) */
  /* a body of known length (a prefill reply of megabytes of routed_experts)
   * gets its buffer at once, not by doubling and copying as it arrives; up
   * to PRESIZE_MAX only: a worker's header alone does not reserve more. A
   * large one comes from the loop's pool, with room for what the prefill
   * reply's reader appends (its kv_transfer_params and usage details) */
  long long cl = L->up ? eldr_up_body_length(L->up) : -1;
  if (cl > 0 && cl <= PRESIZE_MAX && L->n == 0) {
    size_t need = (size_t)cl + 1;
    if (need >= ELDR__BUFPOOL_MIN) need += REPLY_SLACK + need / 64;
    if (need > L->cap) leg_buf_grow(r, need); /* on failure the data callback grows it (and reports) */
  }
}

static void leg_data_cb(void *arg, const char *p, size_t n) {
  rq *r = arg;
  leg *L = &r->L;
  if (L->w) eldr__slot_progress(L->w->slot);
  if (L->kind == LEG_DECODE && (r->s->access_log || r->rec)) eldr__al_data(r, p, n);
  if (L->kind == LEG_DECODE && L->streaming && (r->rec || r->wsig)) eldr__record_data(r, p, n);
  if (L->streaming) leg_arm(r, r->s->cfg.decode_idle_timeout_s);
  if (L->streaming && L->status == 200) { /* relay as it arrives */
    if (!L->started) {
      eldr__stream_start(r->c, 200, L->ctype[0] ? L->ctype : "text/event-stream");
      L->started = 1;
    }
    eldr__stream_chunk(r->c, p, n);
    /* backpressure: a client that does not read stops the decode leg
     * (the decoder's sends then block in TCP) until its output drained */
    if (!r->paused && L->up && eldr__conn_pending(r->c) > r->s->cfg.stream_buffer) {
      r->paused = 1;
      r->s->m.stream_pauses++;
      eldr_up_pause(L->up, 1);
    }
    return;
  }
  if (L->n + n > MAX_REPLY) { /* a worker gone mad: not buffered without end */
    worker *w = L->w;
    w->slot->err_status++;
    eldr__worker_failed(w, "reply too large");
    eldr__leg_release(r);
    eldr__client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "worker reply exceeds %u MiB", MAX_REPLY >> 20);
    return;
  }
  if (L->n + n + 1 > L->cap && leg_buf_grow(r, L->n + n + 1)) {
    eldr__leg_release(r);
    eldr__client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "out of memory for the worker's reply");
    return;
  }
  memcpy(L->buf + L->n, p, n);
  L->n += n;
  L->buf[L->n] = 0;
}

void eldr__rq_drained(rq *r) {
  r->paused = 0;
  if (r->L.up && eldr_up_active(r->L.up)) eldr_up_pause(r->L.up, 0);
}

/* Relay the buffered upstream reply to the client (frees r). */
static void relay(rq *r) {
  leg *L = &r->L;
  int code = L->status;
  eldr__rq_finish_metrics(r, code < 400 ? OUT_OK : code < 500 ? OUT_CLIENT_ERROR : OUT_UPSTREAM_ERROR);
  eldr__send_body(r->c, code, L->ctype[0] ? L->ctype : "application/json", L->n ? L->buf : "", L->n, NULL);
}

static void on_prefill_reply(rq *r);
static void on_decode_reply(rq *r);

static void leg_done_cb(void *arg, int err) {
  rq *r = arg;
  leg *L = &r->L;
  worker *w = L->w;
  if (L->deadline) event_del(L->deadline);
  L->sent = !err || (L->up && eldr_up_sent(L->up));
  if (err) { /* connection refused / reset / EOF mid-reply / not HTTP / connect timeout */
    if (w && err != ELDR_ENOMEM) { /* no socket (fds exhausted) is the router's failure */
      if (err == ELDR_ETIMEOUT) w->slot->err_timeout++;
      else w->slot->err_connect++;
      eldr__worker_failed(w, err == ELDR_EPARSE ? "malformed reply" : err == ELDR_ETIMEOUT ? "connect timeout" : "connection failed");
    }
    int started = L->started;
    eldr__leg_release(r);
    if (started) {
      eldr__abort_stream(r, 502, "upstream_error", "decode worker failed mid-stream");
      return;
    }
    leg_failed(r, err == ELDR_ETIMEOUT,
               err == ELDR_ENOMEM     ? "no socket for the worker (the router is out of file descriptors)"
               : err == ELDR_EPARSE   ? "malformed HTTP reply from worker"
               : err == ELDR_ETIMEOUT ? "connect to worker timed out"
                                      : "connection to worker failed");
    return;
  }
  if (L->status >= 500) {
    w->slot->err_status++;
    eldr__worker_failed(w, "5xx reply");
  } else {
    w->slot->fails = 0;
    w->slot->probed = 1; /* it answered: /health may say ready even with health checks off */
  }
  if (L->kind == LEG_MODELS) {
    eldr__leg_release(r);
    relay(r);
    return;
  }
  if (L->kind == LEG_PREFILL) {
    on_prefill_reply(r);
    return;
  }
  on_decode_reply(r);
}

static void on_decode_reply(rq *r) {
  eldr__leg_release(r);
  /* SGLang's flow: a decode that answered waits for its prefill's reply
   * (the gateway joins both; its rows complete the cache), bounded by the
   * prefill leg's deadline */
  if (r->pd && r->L.status < 400 && eldr__sglpd_hold(r)) return;
  eldr__decode_finish(r);
}

void eldr__decode_finish(rq *r) {
  leg *L = &r->L;
  eldr_server *s = r->s;
  int code = L->status;
  if (L->started) { /* streaming relay done */
    eldr__record_stream_end(r); /* its routed_experts, if streamed, to the live rho */
    eldr__rq_finish_metrics(r, OUT_OK);
    eldr__stream_end(r->c);
    return;
  }
  if (code >= 500) {
    char why[64];
    snprintf(why, sizeof why, "worker answered HTTP %d", code);
    leg_failed(r, 0, why);
    return;
  }
  if (code == 200 && L->streaming) { /* empty streaming body */
    eldr__stream_start(r->c, 200, L->ctype[0] ? L->ctype : "text/event-stream");
    eldr__rq_finish_metrics(r, OUT_OK);
    eldr__stream_end(r->c);
    return;
  }
  if (code == 200 && (r->pr.root || r->pr.raw) && L->n) {
    eldr__fix_opts fo = {s->cfg.splice_routed_experts, 1, r->req.prompt_logprobs};
    int spliced = 0;
    eldr_diag d = {{0}};
    int rc = eldr__decode_reply_fix_buf(L->buf, L->n, &r->pr, &fo, &r->b.fix, &spliced, &d);
    const char *fixed = r->b.fix.p;
    size_t fl = r->b.fix.n;
    if (rc == 0 && spliced < 0 && !s->logged_splice++)
      eldr__logf(s, "request %s: routed_experts not spliced (logged once): %s", r->reqid, d.msg);
    if (rc == 0) {
      s->m.spliced += spliced > 0;
      eldr__watch_decode_reply(r, fixed, fl); /* with the prefill's usage: the rows split */
      eldr__rq_finish_metrics(r, OUT_OK);
      eldr__send_body(r->c, 200, "application/json", fixed, fl, NULL); /* frees r (the body is copied first) */
      return;
    }
    if (rc != ELDR_ENOTFOUND && !s->logged_splice++)
      eldr__logf(s, "request %s: decode reply relayed as the decoder sent it (logged once): %s", r->reqid, d.msg);
  }
  const char *merged;
  size_t ml;
  if (code == 200 && L->n && r->pd && eldr__sglpd_reply(r, L->buf, L->n, &merged, &ml) == 0) {
    eldr__rq_finish_metrics(r, OUT_OK); /* SGLang's /generate: the prefill's input log probabilities in front */
    eldr__send_body(r->c, 200, "application/json", merged, ml, NULL); /* frees r */
    return;
  }
  if (code == 200 && L->n) eldr__watch_decode_reply(r, L->buf, L->n);
  relay(r); /* frees r */
}

/* ---- signature and decision ----------------------------------------------- */

static int decide(rq *r, int *fallback) {
  eldr_server *s = r->s;
  *fallback = FB_NONE;
  eldr__sigres res;
  int have = 0;
  if (s->cfg.policy == ELDR_POLICY_ELDR || s->cfg.policy == ELDR_POLICY_FOOTPRINT) {
    double t0 = eldr__now_s();
    /* the reply's bytes when the scanner read it (no tree), else its tree */
    eldr__sigpath_extract(&s->sp, r->pr.raw, r->pr.raw_len, r->pr.raw ? NULL : eldr_reply_prefill_root(&r->pr),
                          r->req.api == ELDR__API_CHAT, r->pr.routed_experts, r->pr.routed_experts_len,
                          r->pr.raw ? r->pr.compact : (eldr_js_span){0, 0, ELDR_JS_NONE}, &r->prompt, &res);
    eldr__histo_add(&s->m.sig, eldr__now_s() - t0);
    /* seen in any layout (a top-level prompt_routed_experts, lists, compact), not only a blob */
    if (r->pr.routed_experts || (res.fallback != ELDR__FB_NO_ROUTED_EXPERTS && res.fallback != ELDR__FB_NO_ARTIFACT))
      s->re_seen_t = t0;
    have = 1;
    *fallback = res.fallback;
    if (res.fallback != FB_NONE) {
      s->m.fallback[res.fallback]++;
      if (res.reason > 0 && res.reason < ELDR_RE__N) s->m.re_rejected[res.reason]++;
      if (res.fallback == FB_SHAPE_MISMATCH) {
        if (!s->logged_shape_mismatch++) eldr__logf(s, "%s: routing by load only (logged once)", res.diag.msg);
      } else if (res.diag.msg[0]) {
        eldr__logf(s, "request %s: %s", r->reqid, res.diag.msg);
      }
    }
  }
  int k = eldr__decide_on(r, have ? &res : NULL, (uint32_t)(r->pr.prompt_tokens > UINT32_MAX ? UINT32_MAX
                                                            : r->pr.prompt_tokens > 0 ? r->pr.prompt_tokens : 0));
  /* remember the rows of the blocks this prefill computed: deferred until the
   * decode leg is on its way (flushed first if another extraction comes) */
  if (have && k != ELDR_ENOMEM) eldr__sigpath_defer(&s->sp, &res);
  return k;
}

int eldr__decide_on(rq *r, const eldr__sigres *resp, uint32_t pt) {
  eldr_server *s = r->s;
  int have = resp != NULL;
  eldr__sigres res;
  if (have) res = *resp;
  size_t n;
  eldr__bus_pull(s); /* the other loops' and replicas' footprints, never waiting */
  if (eldr__fill_loads(s, ROLE_DECODE, r, &n)) return ELDR_ENOMEM;
  double t1 = eldr__now_s();
  eldr_route_req rr = {have ? res.sig : NULL, -1, have ? eldr__watch_sims(s) : NULL};
  eldr_decision dec;
  /* footprint: the prefill's selection counts (uniform profile without them) */
  eldr_fp_request fr = {NULL, 0, pt, NULL};
  if (have && res.fallback == FB_NONE) {
    fr.counts = res.counts;
    fr.n_tokens = res.n_tokens;
    fr.sig = res.sig; /* picks the request's cluster prior (the artifact's footprint section) */
    size_t P = res.view.first_token + res.view.rows; /* without usage: the prompt the rows imply */
    if (!pt) fr.ctx_tokens = P > UINT32_MAX ? UINT32_MAX : (uint32_t)P;
  }
  eldr_policy *pol = &s->pol;
  if (s->fps && s->fps->n != n) { /* the decode list changed (DNS) since the state was built */
    if (!s->logged_fp++)
      eldr__logf(s, "footprint: %zu decode workers but its state has %zu: JSQ until the next reload (logged once)",
                 n, s->fps->n);
    pol = &s->jsq;
  }
  int k;
  for (int t = 1;; t++) { /* until the pick is reserved: another loop may race us to it */
    k = eldr_policy_decide(pol, s->loads, s->healthy, n, &rr, &fr, &dec);
    if (k < 0 || reserve(r, k, t == ELDR__RESERVE_TRIES)) break;
    if (eldr__fill_loads(s, ROLE_DECODE, r, &n)) return ELDR_ENOMEM;
  }
  if (pol == &s->pol) eldr__fps_route(r, s->fps, pol, k, &fr);
  if (k >= 0) eldr__watch_decision(r, &dec, have && res.fallback == FB_NONE ? res.sig : NULL);
  eldr__histo_add(&s->m.decision, eldr__now_s() - t1);
  r->decision = (have && res.sig && k >= 0 && dec.fallback == ELDR_FALLBACK_NONE) ? DEC_LOCALITY : DEC_LOAD;
  eldr__al_decision(r, k >= 0 ? s->w[ROLE_DECODE][k] : NULL, dec.best_sim);
  r->policy = (int)s->cfg.policy;
  if (s->rec) eldr__record_decision(r, have ? &res : NULL, k, &dec);
  if (have) { /* the last decisions, for /health: how many fell back to load */
    s->recent[s->irecent] = r->decision != DEC_LOCALITY;
    s->irecent = (s->irecent + 1) % sizeof s->recent;
    if (s->nrecent < sizeof s->recent) s->nrecent++;
  }
  return k;
}

static void on_prefill_reply(rq *r) {
  eldr_server *s = r->s;
  leg *L = &r->L;
  int code = L->status;
  if (code >= 500) {
    char why[64];
    snprintf(why, sizeof why, "worker answered HTTP %d", code);
    eldr__leg_release(r);
    leg_failed(r, 0, why);
    return;
  }
  if (code != 200) { /* the worker refused the request itself: relay */
    eldr__leg_release(r);
    relay(r); /* frees r */
    return;
  }
  eldr_diag d = {{0}};
  /* the tree only for the recorder (rechook.c reads it) and
   * prompt_logprobs (the decode reply takes the prefill's); else the
   * scanner reads the fields and the signature path the bytes */
  int need_tree = s->rec || r->rec || r->req.prompt_logprobs;
  /* the reply's buffer becomes r->pr's (no copy); L takes r->pr's old one, empty */
  if (eldr_reply_prefill_adopt(&L->buf, &L->cap, &L->n, need_tree, &r->pr, &d) != 0) {
    worker *w = L->w;
    w->slot->err_status++;
    eldr__worker_failed(w, "bad reply");
    eldr__leg_release(r);
    leg_failed(r, 0, d.msg);
    return;
  }
  eldr__leg_release(r);
  if (!r->pr.kv_len) s->m.no_kv_params++;
  start_decode(r, 0);
}

static void start_decode(rq *r, int retry) {
  eldr_server *s = r->s;
  if (!retry) {
    r->ntried = 0;
    if (r->al_pf <= 0) r->al_pf = eldr__now_s(); /* the prefill's end, for the access log */
    int fb;
    int k = decide(r, &fb);
    if (eldr__decode_body_buf(&r->req, r->pr.bytes, r->pr.kv_len, &r->b.db)) {
      eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
      return;
    }
    if (k < 0) {
      r->decision = DEC_NONE;
      eldr__client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy decode worker");
      return;
    }
    if (eldr__leg_start(r, s->w[ROLE_DECODE][k], LEG_DECODE, "POST", r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : "/v1/completions", r->b.db.p, r->b.db.n) == 0)
      return;
    leg_failed(r, 0, "could not send to decode worker");
    return;
  }
  /* retry: shortest queue among the untried healthy decoders, same kv_transfer_params */
  size_t n;
  if (eldr__fill_loads(s, ROLE_DECODE, r, &n)) {
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return;
  }
  eldr_route_req rr = {NULL, -1, NULL};
  int k;
  for (int t = 1;; t++) {
    k = eldr_policy_decode(&s->jsq, s->loads, s->healthy, n, &rr, NULL);
    if (k < 0 || reserve(r, k, t == ELDR__RESERVE_TRIES)) break;
    if (eldr__fill_loads(s, ROLE_DECODE, r, &n)) {
      eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
      return;
    }
  }
  if (k < 0) { /* a timeout is still a timeout when no worker is left to retry on: 504 */
    eldr__client_upstream_error(r, r->last_timeout ? 504 : 502, r->last_timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                          "decode failed (%s) and no other healthy decode worker", r->last_err);
    return;
  }
  if (eldr__leg_start(r, s->w[ROLE_DECODE][k], LEG_DECODE, "POST",
                r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : "/v1/completions",
                r->b.db.p, r->b.db.n) != 0)
    leg_failed(r, 0, "could not send to decode worker");
}

static void start_prefill(rq *r) {
  eldr_server *s = r->s;
  size_t n;
  if (eldr__fill_loads(s, ROLE_PREFILL, r, &n)) {
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return;
  }
  int k = eldr_policy_prefill(r->prompt.prefix_hash, s->keys, s->loads, s->healthy, n, s->cfg.prefill_guard);
  if (k < 0) {
    if (r->ntried == 0) eldr__client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy prefill worker");
    else eldr__client_upstream_error(r, r->last_timeout ? 504 : 502, r->last_timeout ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
                               "prefill failed (%s) and no other healthy prefill worker", r->last_err);
    return;
  }
  if (eldr__leg_start(r, s->w[ROLE_PREFILL][k], LEG_PREFILL, "POST",
                r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : "/v1/completions",
                r->b.pb.p, r->b.pb.n) != 0)
    leg_failed(r, 0, "could not send to prefill worker");
}

/* The header lines every leg of a request carries after its own, ending
 * with the blank line: the workers' Authorization (the backend key; the
 * client's only when configured) and the W3C trace context and baggage, as
 * the client sent them. */
static int forwarded_lines(const eldr_server *s, const eldr__http_head *h, eldr__buf *o) {
  const char *key = s->cfg.backend_api_key;
  const char *auth = !key && s->cfg.forward_authorization ? h->authorization : "";
  size_t cap = (key ? strlen(key) : 0) + strlen(auth) + strlen(h->traceparent) + strlen(h->tracestate) +
               strlen(h->baggage) + 128;
  if (eldr__buf_reserve(o, cap)) return ELDR_ENOMEM;
  char *w = o->p;
  if (key) {
    w = ELDR__PUT_LIT(w, "Authorization: Bearer ");
    w = ELDR__PUT_LIT(eldr__puts(w, key), "\r\n");
  } else if (auth[0]) {
    w = ELDR__PUT_LIT(w, "Authorization: ");
    w = ELDR__PUT_LIT(eldr__puts(w, auth), "\r\n");
  }
  if (h->traceparent[0]) w = ELDR__PUT_LIT(eldr__puts(ELDR__PUT_LIT(w, "traceparent: "), h->traceparent), "\r\n");
  if (h->tracestate[0]) w = ELDR__PUT_LIT(eldr__puts(ELDR__PUT_LIT(w, "tracestate: "), h->tracestate), "\r\n");
  if (h->baggage[0]) w = ELDR__PUT_LIT(eldr__puts(ELDR__PUT_LIT(w, "baggage: "), h->baggage), "\r\n");
  w = ELDR__PUT_LIT(w, "\r\n");
  *w = 0;
  o->n = (size_t)(w - o->p);
  return 0;
}

static rq *rq_new(hconn *c) {
  rq *r = eldr__rq_alloc(c->s);
  if (!r) return NULL;
  r->s = c->s;
  r->c = c;
  r->t0 = eldr__now_s();
  r->decision = DEC_NONE;
  r->confidence = -1;
  r->policy = (int)c->s->cfg.policy;
  /* the engines' request id: random per request (a client's X-Request-Id is
   * echoed and logged, never an engine's id: replicas and restarts would
   * collide on it, and a client could name another request) */
  if (eldr_uuid4(r->reqid) != 0 || forwarded_lines(c->s, c->head, &r->b.fwd) != 0) {
    eldr__rq_destroy(r);
    return NULL;
  }
  if (c->head->request_id[0]) eldr__copy(r->client_reqid, sizeof r->client_reqid, c->head->request_id);
  c->r = r;
  return r;
}

void eldr__handle_completion(hconn *c, eldr__api api, const char *body, size_t len) {
  eldr_server *s = c->s;
  rq *r = rq_new(c);
  if (!r) {
    eldr__send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  eldr_diag d = {{0}};
  int rc = eldr__req_read(body, len, api, &r->req, &d);
  if (rc) {
    s->m.bad[rc == ELDR_EPARSE ? BAD_JSON : BAD_FIELD]++;
    eldr__rq_finish_metrics(r, OUT_CLIENT_ERROR);
    eldr__send_error(c, rc == ELDR_ENOMEM ? 500 : 400, "invalid_request_error", "%s", eldr_diag_msg(&d, rc));
    return;
  }
  /* the prompt's blocks, once: the prefix hash (cache affinity) and the
   * signature cache's keys */
  rc = eldr__prompt_init(&s->sp, &r->prompt, r->req.text, r->req.text_len, r->req.ids, r->req.n_ids);
  if (!rc && s->cfg.pd != ELDR_PD_VLLM) { /* SGLang's flow, sglang or sglang-exact */
    eldr__sglpd_start(r);
    return;
  }
  if (!rc) rc = eldr__prefill_body_buf(&r->req, &r->b.pb);
  if (rc) {
    eldr__rq_finish_metrics(r, OUT_UPSTREAM_ERROR);
    eldr__send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  start_prefill(r);
}

void eldr__handle_models(hconn *c) {
  eldr_server *s = c->s;
  rq *r = rq_new(c);
  if (!r) {
    eldr__send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  r->is_models = 1;
  for (int role = 1; role >= 0; role--)
    for (size_t i = 0; i < s->nw[role]; i++)
      if (eldr__worker_up(s->w[role][i])) {
        if (eldr__leg_start(r, s->w[role][i], LEG_MODELS, "GET", "/v1/models", NULL, 0) == 0) return;
      }
  eldr__client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy worker to list models");
}
