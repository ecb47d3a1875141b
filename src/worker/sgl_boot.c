/* sgl_boot.c — the emulated SGLang engine's KV handoff (sgl.h): the
 * prefill's bootstrap server and its rooms, the prefill side of an item
 * (waiting for its decode, the forward's end, the transfer), the decode
 * side (handshake, registration, the KV's arrival), and --exact's
 * published counts. */
#include "worker/worker_impl.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "eldr/reply_compact.h"

struct sgl_room {
  uint64_t room;
  sgl_boot *b;
  wreq *item;                  /* the prefill item of this room, once its request arrived */
  struct evhttp_request *reg;  /* the decode's registration, waiting for the KV */
  struct evhttp_request *polls[SGL_MAX_COUNT_POLLS];
  int npolls;
  char *counts;                /* --exact: the compact object's JSON, once the forward ended */
  struct event *timer;         /* the bootstrap timeout */
};

struct sgl_boot {
  eldr_worker *w;
  struct evhttp *http;
  uint16_t port;
  sgl_room **rooms;
  size_t n, cap;
};

static void boot_reply(struct evhttp_request *req, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void boot_reply(struct evhttp_request *req, int code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *e = json_pack("{s:s,s:i}", "error", msg, "code", code);
  eldr__w_send_json(req, code, code >= 500 ? "Internal Server Error" : code == 404 ? "Not Found" : "Bad Request",
                    e ? e : json_object());
}

static void req_detach(struct evhttp_request *req) {
  struct evhttp_connection *c = req ? evhttp_request_get_connection(req) : NULL;
  if (c) evhttp_connection_set_closecb(c, NULL, NULL);
}

/* ------------------------------------------------------------ rooms */

static sgl_room *room_find(sgl_boot *b, uint64_t room) {
  for (size_t i = 0; i < b->n; i++)
    if (b->rooms[i]->room == room) return b->rooms[i];
  return NULL;
}

static void room_expired(evutil_socket_t fd, short what, void *arg);

static sgl_room *room_get(sgl_boot *b, uint64_t room) {
  sgl_room *e = room_find(b, room);
  if (e || b->n >= SGL_MAX_ROOMS) return e;
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    sgl_room **q = realloc(b->rooms, cap * sizeof *q);
    if (!q) return NULL;
    b->rooms = q;
    b->cap = cap;
  }
  e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->room = room;
  e->b = b;
  e->timer = evtimer_new(b->w->base, room_expired, e);
  if (!e->timer) {
    free(e);
    return NULL;
  }
  struct timeval tv;
  eldr__w_tv_of(b->w->sgl_bootstrap_timeout, &tv); /* wall time, as SGLang's */
  evtimer_add(e->timer, &tv);
  b->rooms[b->n++] = e;
  return e;
}

static void room_free(sgl_room *e) {
  sgl_boot *b = e->b;
  for (size_t i = 0; i < b->n; i++)
    if (b->rooms[i] == e) {
      b->rooms[i] = b->rooms[--b->n];
      break;
    }
  if (e->reg) {
    req_detach(e->reg);
    boot_reply(e->reg, 410, "room %llu is gone", (unsigned long long)e->room);
  }
  for (int i = 0; i < e->npolls; i++) {
    req_detach(e->polls[i]);
    boot_reply(e->polls[i], 404, "room %llu ended without counts", (unsigned long long)e->room);
  }
  if (e->item) e->item->sg.entry = NULL;
  if (e->timer) event_free(e->timer);
  free(e->counts);
  free(e);
}

/* A room whose work is over (the item gone, the decode answered) goes. */
static void room_maybe_free(sgl_room *e) {
  if (!e->item && !e->reg && !e->npolls) room_free(e);
}

static void item_fail(wreq *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void room_expired(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  sgl_room *e = arg;
  event_free(e->timer);
  e->timer = NULL;
  if (e->item && !e->item->sg.registered) {
    wreq *r = e->item;
    /* prefill.py, pop_bootstrapped: KVPoll.Failed -> prepare_abort 500 */
    item_fail(r, 500, "Prefill bootstrap failed for request rid=%s bootstrap_room=%llu: no decode registered "
              "within %g s (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)", r->rid, (unsigned long long)e->room,
              e->b->w->sgl_bootstrap_timeout);
    return; /* item_fail freed the room */
  }
  if (e->reg && !e->item) {
    req_detach(e->reg);
    boot_reply(e->reg, 504, "no prefill request for bootstrap_room %llu arrived within %g s", (unsigned long long)e->room,
               e->b->w->sgl_bootstrap_timeout);
    e->reg = NULL;
  }
  while (e->npolls) {
    struct evhttp_request *q = e->polls[--e->npolls];
    req_detach(q);
    boot_reply(q, 504, "no forward for bootstrap_room %llu within %g s", (unsigned long long)e->room,
               e->b->w->sgl_bootstrap_timeout);
  }
  room_maybe_free(e);
}

/* ------------------------------------------------------------ items */

static void item_free(wreq *r) {
  eldr__w_req_free(r);
}

/* In one of the engine's queues or batches: the engine frees it at its
 * next turn (it checks `gone`), never we under its feet. */
static int engine_holds(const wreq *r) {
  return r->state == RS_PREFILL_Q || (r->state == RS_PREFILLING && !r->sg.forwarded) || r->state == RS_DECODE_Q ||
         r->state == RS_READY || r->state == RS_RUNNING;
}

static void item_fail(wreq *r, int code, const char *fmt, ...) {
  char msg[640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  eldr_worker *w = r->w;
  if (engine_holds(r)) { /* failed now, answered when the engine lets go of it */
    if (!r->sg.failed) {
      r->sg.failed = 1;
      free(r->sg.err);
      r->sg.err = strdup(msg);
    }
    r->gone = 1;
    return;
  }
  w->m.finished[code >= 500 ? ELDR__FIN_ERROR : ELDR__FIN_ABORT]++;
  if (r->sg.role == 2) w->st.kv_pulls_failed++;
  eldr__sgl_item_fail(r, code, msg);
  item_free(r);
}

void eldr__sgl_item_cleanup(wreq *r) {
  eldr_worker *w = r->w;
  if (r->sg.ev) {
    event_free(r->sg.ev);
    r->sg.ev = NULL;
  }
  if (r->sg.hreq) {
    evhttp_cancel_request(r->sg.hreq);
    r->sg.hreq = NULL;
  }
  if (r->sg.conn) {
    evhttp_connection_free(r->sg.conn);
    r->sg.conn = NULL;
  }
  if (r->state == RS_PULLING) {
    w->n_pulling--;
    r->state = RS_DONE;
  }
  sgl_room *e = r->sg.entry;
  if (e) {
    e->item = NULL;
    r->sg.entry = NULL;
    if (e->reg) { /* the decode waits for KV that will not come (the transfer failed) */
      req_detach(e->reg);
      boot_reply(e->reg, 500, "KV transfer failed for bootstrap_room %llu: the prefill request ended (%s)",
                 (unsigned long long)e->room, r->sg.err ? r->sg.err : "aborted");
      e->reg = NULL;
    }
    room_maybe_free(e);
  }
  free(r->sg.err);
  r->sg.err = NULL;
}

/* The client of r's group left. A waiting item leaves now: the decode's
 * registration is cancelled (its prefill then fails the room, as SGLang's
 * ABORT notification does), a prefill item waiting for its decode goes. */
void eldr__sgl_item_client_gone(wreq *r) {
  if (!engine_holds(r)) {
    r->w->st.requests_cancelled++;
    item_free(r);
  }
}

static void prefill_enqueue(wreq *r) {
  r->state = RS_PREFILL_Q;
  r->qnext = NULL;
  rqueue *q = &r->w->prefill_q;
  if (q->tail) q->tail->qnext = r;
  else q->head = r;
  q->tail = r;
  q->n++;
  eldr__w_prefill_try(r->w);
}

static void transfer_done(evutil_socket_t fd, short what, void *arg);

/* The KV goes to the decode: eldr_latency_kv_transfer x scale. */
static void transfer_start(wreq *r) {
  eldr_worker *w = r->w;
  r->sg.transferring = 1;
  if (!r->sg.ev && !(r->sg.ev = evtimer_new(w->base, transfer_done, r))) {
    item_fail(r, 500, "out of memory");
    return;
  }
  struct timeval tv;
  eldr__w_tv_of(eldr_latency_kv_transfer(&w->lm, r->n_prompt) * w->scale, &tv);
  evtimer_add(r->sg.ev, &tv);
}

/* process_disagg_prefill_inflight_queue: KVPoll.Success. The decode gets
 * the first token, the prefill's item is done (its blocks stay in the
 * prefix cache: release_kv_cache). */
static void transfer_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  wreq *r = arg;
  eldr_worker *w = r->w;
  sgl_room *e = r->sg.entry;
  if (!e || !e->reg) {
    item_fail(r, 500, "KV transfer failed for bootstrap_room %llu: the decode aborted it", (unsigned long long)r->sg.room);
    return;
  }
  char tok[64];
  eldr__w_token_text(r, 0, 0, tok, sizeof tok);
  req_detach(e->reg);
  eldr__w_send_json(e->reg, 200, "OK",
                    json_pack("{s:I,s:s,s:I}", "room", (json_int_t)e->room, "first_token", tok, "tokens",
                              (json_int_t)r->n_prompt));
  e->reg = NULL;
  w->st.kv_pulls_served++;
  r->emitted = 1;
  w->st.generation_tokens++;
  eldr__w_observe_first(r);
  eldr__sgl_token(r, 0, 1);
  r->state = RS_PREFILLING; /* its blocks go back to the prefill pool */
  eldr__w_reply_done(r);
  item_free(r);
  eldr__w_prefill_try(w);
}

/* The prefill's forward ended for r (prefill_done): --exact publishes the
 * counts; the KV goes once the decode has registered. */
void eldr__sgl_forward_done(wreq *r) {
  eldr_worker *w = r->w;
  r->sg.forwarded = 1;
  sgl_room *e = r->sg.entry;
  if (!e) {
    item_fail(r, 500, "KV transfer failed for bootstrap_room %llu: its room is gone", (unsigned long long)r->sg.room);
    return;
  }
  if (w->sgl_exact && !e->counts) {
    json_t *kv = json_object();
    if (kv && eldr_compact_emit(kv, r->psel, r->n_prompt, &w->shape, w->re_ids, 0) == 0) {
      json_t *o = json_pack("{s:I,s:O}", "room", (json_int_t)e->room, ELDR_COMPACT_KEY,
                            json_object_get(kv, ELDR_COMPACT_KEY));
      e->counts = o ? json_dumps(o, JSON_COMPACT) : NULL;
      json_decref(o);
    }
    json_decref(kv);
    while (e->npolls) {
      struct evhttp_request *q = e->polls[--e->npolls];
      req_detach(q);
      if (!e->counts) {
        boot_reply(q, 500, "out of memory");
        continue;
      }
      struct evbuffer *b = evbuffer_new();
      if (b) evbuffer_add(b, e->counts, strlen(e->counts));
      evhttp_add_header(evhttp_request_get_output_headers(q), "Content-Type", "application/json");
      evhttp_send_reply(q, 200, "OK", b);
      if (b) evbuffer_free(b);
    }
  }
  if (r->sg.registered) transfer_start(r);
  /* else (--exact): the KV waits for the decode, within the bootstrap timeout */
}

/* The decode's registration arrived, or r's request did (whichever came
 * second): the item leaves the bootstrap queue. */
static void registered(wreq *r) {
  r->sg.registered = 1;
  if (r->w->sgl_exact) {
    if (r->sg.forwarded && !r->sg.transferring) transfer_start(r);
  } else if (r->state == RS_NEW) {
    prefill_enqueue(r);
  }
}

/* ------------------------------------------------------------ the server */

static void reg_closed(struct evhttp_connection *c, void *arg) {
  (void)c;
  sgl_room *e = arg;
  e->reg = NULL; /* the decode left: its request was aborted */
  if (e->item) {
    wreq *r = e->item;
    item_fail(r, 500, "KV transfer failed for request rid=%s bootstrap_room=%llu: the decode aborted it",
              r->rid, (unsigned long long)e->room);
    return;
  }
  room_maybe_free(e);
}

static void poll_closed(struct evhttp_connection *c, void *arg) {
  sgl_room *e = arg;
  for (int i = 0; i < e->npolls; i++)
    if (evhttp_request_get_connection(e->polls[i]) == c) {
      e->polls[i] = e->polls[--e->npolls];
      break;
    }
  room_maybe_free(e);
}

static int body_json(struct evhttp_request *req, json_t **out) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t len = evbuffer_get_length(in);
  if (len > SGL_MAX_BOOT_BODY) return 413;
  char buf[SGL_MAX_BOOT_BODY + 1];
  evbuffer_copyout(in, buf, len);
  buf[len] = 0;
  *out = json_loadb(buf, len, 0, NULL);
  return *out && json_is_object(*out) ? 0 : 400;
}

static void handle_register(sgl_boot *b, struct evhttp_request *req) {
  json_t *j = NULL;
  int st = body_json(req, &j);
  json_t *rm = j ? json_object_get(j, "room") : NULL;
  if (!st && (!json_is_integer(rm) || json_integer_value(rm) < 0)) st = 400;
  if (st) {
    json_decref(j);
    boot_reply(req, st, st == 413 ? "registration body over %d bytes" : "registration must be {\"room\": integer in 0..2^63-1}",
               SGL_MAX_BOOT_BODY);
    return;
  }
  uint64_t room = (uint64_t)json_integer_value(rm);
  json_decref(j);
  sgl_room *e = room_get(b, room);
  if (!e) {
    boot_reply(req, 503, "too many rooms (%d) or out of memory", SGL_MAX_ROOMS);
    return;
  }
  if (e->reg) {
    boot_reply(req, 409, "bootstrap_room %llu already has a decode registered", (unsigned long long)room);
    return;
  }
  e->reg = req;
  struct evhttp_connection *c = evhttp_request_get_connection(req);
  if (c) evhttp_connection_set_closecb(c, reg_closed, e);
  if (e->item) registered(e->item);
}

static void handle_counts(sgl_boot *b, struct evhttp_request *req) {
  if (!b->w->sgl_exact) {
    boot_reply(req, 404, "this prefill does not publish expert counts (it runs without --exact)");
    return;
  }
  const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
  const char *q = u ? evhttp_uri_get_query(u) : NULL;
  const char *rs = NULL; /* "room=<digits>" among the query's parameters */
  for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL)
    if (!strncmp(p, "room=", 5)) rs = p + 5;
  char *end = NULL;
  unsigned long long room = rs ? strtoull(rs, &end, 10) : 0;
  int ok = rs && *rs >= '0' && *rs <= '9' && end && (!*end || *end == '&') && end - rs <= 19 && room <= SGL_MAX_ROOM;
  if (!ok) {
    boot_reply(req, 400, "expert_counts needs ?room=<integer in 0..2^63-1>");
    return;
  }
  sgl_room *e = room_get(b, room);
  if (!e) {
    boot_reply(req, 503, "too many rooms (%d) or out of memory", SGL_MAX_ROOMS);
    return;
  }
  if (e->counts) {
    struct evbuffer *o = evbuffer_new();
    if (o) evbuffer_add(o, e->counts, strlen(e->counts));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 200, "OK", o);
    if (o) evbuffer_free(o);
    return;
  }
  if (e->npolls >= SGL_MAX_COUNT_POLLS) {
    boot_reply(req, 429, "bootstrap_room %llu already has %d count polls", room, SGL_MAX_COUNT_POLLS);
    return;
  }
  e->polls[e->npolls++] = req;
  struct evhttp_connection *c = evhttp_request_get_connection(req);
  if (c) evhttp_connection_set_closecb(c, poll_closed, e);
}

static void on_boot(struct evhttp_request *req, void *arg) {
  sgl_boot *b = arg;
  const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
  const char *path = u ? evhttp_uri_get_path(u) : NULL;
  if (!path) path = "";
  enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
  if (!strcmp(path, "/health")) {
    evhttp_send_reply(req, 200, "OK", NULL);
  } else if (!strcmp(path, "/route")) {
    if (cmd != EVHTTP_REQ_GET) {
      boot_reply(req, 405, "the emulator's /route answers GET only");
      return;
    }
    /* CommonKVBootstrapServer._handle_route_get: the rank's address */
    eldr__w_send_json(req, 200, "OK",
                      json_pack("{s:s,s:i,s:i,s:i,s:i}", "rank_ip", b->w->host, "rank_port", (int)b->port,
                                "prefill_attn_tp_size", 1, "prefill_dp_size", 1, "prefill_pp_size", 1));
  } else if (!strcmp(path, "/eldr/kv/register")) {
    if (cmd != EVHTTP_REQ_POST) boot_reply(req, 405, "%s allows POST only", path);
    else handle_register(b, req);
  } else if (!strcmp(path, "/eldr/expert_counts")) {
    if (cmd != EVHTTP_REQ_GET) boot_reply(req, 405, "%s allows GET only", path);
    else handle_counts(b, req);
  } else {
    boot_reply(req, 404, "no route for %s on the bootstrap server", path);
  }
}

/* The rooms' waiting peers that left (eldr__sgl_peer_closed). */
void eldr__sgl_boot_sweep(eldr_worker *w) {
  sgl_boot *b = w->boot;
  for (size_t i = 0; b && i < b->n;) {
    sgl_room *e = b->rooms[i];
    size_t n0 = b->n;
    if (e->reg && eldr__sgl_peer_closed(e->reg)) {
      struct evhttp_connection *c = evhttp_request_get_connection(e->reg);
      req_detach(e->reg);
      reg_closed(c, e); /* the decode left: the room's item fails (may free e) */
      if (c) evhttp_connection_free(c); /* and its unanswered registration with it */
    } else {
      for (int k = 0; k < e->npolls; k++)
        if (eldr__sgl_peer_closed(e->polls[k])) {
          struct evhttp_connection *c = evhttp_request_get_connection(e->polls[k]);
          req_detach(e->polls[k]);
          poll_closed(c, e); /* may free e */
          if (c) evhttp_connection_free(c);
          break;
        }
    }
    if (b->n == n0 && i < b->n && b->rooms[i] == e) i++;
  }
}

int eldr__sgl_boot_new(eldr_worker *w, uint16_t port, eldr_diag *d) {
  sgl_boot *b = calloc(1, sizeof *b);
  if (!b) return ELDR_ENOMEM;
  b->w = w;
  b->http = evhttp_new(w->base);
  if (!b->http) {
    free(b);
    return ELDR_ENOMEM;
  }
  evhttp_set_max_body_size(b->http, SGL_MAX_BOOT_BODY);
  evhttp_set_timeout(b->http, (int)(w->sgl_bootstrap_timeout + w->sgl_waiting_timeout + 60));
  evhttp_set_allowed_methods(b->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT);
  evhttp_set_gencb(b->http, on_boot, b);
  struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(b->http, w->host, port);
  if (!bs) {
    int e = errno;
    evhttp_free(b->http);
    free(b);
    return eldr_diag_fail(d, ELDR_EIO, "worker: cannot listen on the bootstrap port %s:%u: %s", w->host,
                          (unsigned)port, e ? strerror(e) : "in use");
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET) b->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6) b->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  }
  w->boot = b;
  return 0;
}

uint16_t eldr__sgl_boot_port(const eldr_worker *w) { return w->boot ? w->boot->port : 0; }

size_t eldr__sgl_rooms(const eldr_worker *w) { return w->boot ? w->boot->n : 0; }

void eldr__sgl_boot_free(eldr_worker *w) {
  sgl_boot *b = w->boot;
  if (!b) return;
  while (b->n) room_free(b->rooms[b->n - 1]);
  free(b->rooms);
  evhttp_free(b->http);
  free(b);
  w->boot = NULL;
}

/* ------------------------------------------------------------ decode side */

static void kv_arrived(evutil_socket_t fd, short what, void *arg);

static struct evhttp_request *client_req(wreq *r, void (*cb)(struct evhttp_request *, void *)) {
  struct evhttp_request *q = evhttp_request_new(cb, r);
  if (!q) return NULL;
  char hostport[300];
  snprintf(hostport, sizeof hostport, "%.255s:%u", r->sg.boot_host, (unsigned)r->sg.boot_port);
  evhttp_add_header(evhttp_request_get_output_headers(q), "Host", hostport);
  return q;
}

static void reg_reply(struct evhttp_request *req, void *arg) {
  wreq *r = arg;
  r->sg.hreq = NULL;
  int code = req ? evhttp_request_get_response_code(req) : 0;
  if (code == 200) {
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    char buf[1024];
    if (len >= sizeof buf) len = sizeof buf - 1;
    evbuffer_copyout(in, buf, len);
    buf[len] = 0;
    json_t *j = json_loads(buf, 0, NULL);
    json_t *t = j ? json_object_get(j, "first_token") : NULL;
    if (json_is_string(t)) snprintf(r->sg.first_tok, sizeof r->sg.first_tok, "%s", json_string_value(t));
    json_decref(j);
  } else {
    char msg[600];
    if (!code)
      snprintf(msg, sizeof msg,
               "KV transfer failed for bootstrap_room %llu: the prefill's bootstrap server %.255s:%u did not answer "
               "(gone, or no KV within %g s: SGLANG_DISAGGREGATION_WAITING_TIMEOUT)",
               (unsigned long long)r->sg.room, r->sg.boot_host, (unsigned)r->sg.boot_port, r->w->sgl_waiting_timeout);
    else
      snprintf(msg, sizeof msg, "KV transfer failed for bootstrap_room %llu: the prefill answered %d",
               (unsigned long long)r->sg.room, code);
    free(r->sg.err);
    r->sg.err = strdup(msg);
    r->sg.failed = 1;
  }
  struct timeval tv = {0, 0};
  evtimer_add(r->sg.ev, &tv); /* out of the connection's callback */
}

/* DecodeTransferQueue: the KV is there (or failed). Token 0 is the
 * prefill's; the rest are the decode batch's. */
static void kv_arrived(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  wreq *r = arg;
  eldr_worker *w = r->w;
  if (r->sg.conn) {
    evhttp_connection_free(r->sg.conn);
    r->sg.conn = NULL;
  }
  if (r->state == RS_PULLING) {
    w->n_pulling--;
    r->state = RS_READY;
  }
  if (r->sg.failed) {
    item_fail(r, 500, "%s", r->sg.err ? r->sg.err : "KV transfer failed");
    eldr__w_decode_admit(w);
    return;
  }
  if (r->gone) {
    item_free(r);
    eldr__w_decode_admit(w);
    return;
  }
  r->emitted = 1;
  w->st.generation_tokens++;
  eldr__w_observe_first(r);
  eldr__sgl_token(r, 0, r->n_out <= 1);
  if (r->n_out <= 1) {
    r->state = RS_DONE;
    eldr__w_reply_done(r);
    item_free(r);
    eldr__w_decode_admit(w);
    return;
  }
  eldr__w_ready(r);
}

/* From decode_admit: r has its KV blocks; it registers for its room. */
int eldr__sgl_register(wreq *r) {
  eldr_worker *w = r->w;
  if (!r->sg.conn) return -1;
  struct timeval tv;
  eldr__w_tv_of(w->sgl_waiting_timeout, &tv);
  evhttp_connection_set_timeout_tv(r->sg.conn, &tv);
  if (!r->sg.ev && !(r->sg.ev = evtimer_new(w->base, kv_arrived, r))) return -1;
  struct evhttp_request *q = client_req(r, reg_reply);
  if (!q) return -1;
  char body[200];
  int n = snprintf(body, sizeof body, "{\"room\":%llu,\"tokens\":%u,\"engine\":\"%s\"}", (unsigned long long)r->sg.room,
                   r->n_prompt, w->engine_id);
  evhttp_add_header(evhttp_request_get_output_headers(q), "Content-Type", "application/json");
  evbuffer_add(evhttp_request_get_output_buffer(q), body, (size_t)n);
  r->sg.hreq = q;
  if (evhttp_make_request(r->sg.conn, q, EVHTTP_REQ_POST, "/eldr/kv/register") < 0) {
    r->sg.hreq = NULL;
    return -1;
  }
  r->sg.reg_sent = 1;
  return 0;
}

static void handshake_done(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  wreq *r = arg;
  eldr_worker *w = r->w;
  event_free(r->sg.ev);
  r->sg.ev = NULL;
  if (r->sg.failed) {
    item_fail(r, 500, "%s", r->sg.err ? r->sg.err : "bootstrap handshake failed");
    return;
  }
  if (r->gone) {
    item_free(r);
    return;
  }
  r->sg.handshaken = 1;
  r->state = RS_DECODE_Q;
  rqueue *q = &w->decode_q;
  r->qnext = NULL;
  if (q->tail) q->tail->qnext = r;
  else q->head = r;
  q->tail = r;
  q->n++;
  eldr__w_decode_admit(w);
}

static void handshake_reply(struct evhttp_request *req, void *arg) {
  wreq *r = arg;
  r->sg.hreq = NULL;
  int code = req ? evhttp_request_get_response_code(req) : 0;
  if (code != 200) {
    char msg[600];
    snprintf(msg, sizeof msg,
             "KV transfer failed for bootstrap_room %llu: the bootstrap server %.255s:%u %s", (unsigned long long)r->sg.room,
             r->sg.boot_host, (unsigned)r->sg.boot_port, code ? "refused the handshake" : "is unreachable");
    free(r->sg.err);
    r->sg.err = strdup(msg);
    r->sg.failed = 1;
  }
  struct timeval tv = {0, 0};
  evtimer_add(r->sg.ev, &tv);
}

/* The item enters the engine (sgl.h). */
void eldr__sgl_item_start(wreq *r) {
  eldr_worker *w = r->w;
  r->state = RS_NEW;
  if (r->sg.role == 0) {
    prefill_enqueue(r);
    return;
  }
  if (r->sg.role == 1) {
    sgl_room *e = room_get(w->boot, r->sg.room);
    if (!e) {
      item_fail(r, 503, "too many bootstrap rooms (%d) or out of memory", SGL_MAX_ROOMS);
      return;
    }
    if (e->item) {
      item_fail(r, 400, "bootstrap_room %llu is already in use by request %s", (unsigned long long)r->sg.room, e->item->rid);
      return;
    }
    e->item = r;
    r->sg.entry = e;
    if (w->sgl_exact) prefill_enqueue(r); /* the patch: the forward does not wait for the decode */
    if (e->reg) registered(r);
    return;
  }
  /* decode: handshake with the prefill's bootstrap server at once */
  r->sg.conn = evhttp_connection_base_new(w->base, NULL, r->sg.boot_host, r->sg.boot_port);
  r->sg.ev = evtimer_new(w->base, handshake_done, r);
  struct evhttp_request *q = r->sg.conn && r->sg.ev ? client_req(r, handshake_reply) : NULL;
  if (!q) {
    item_fail(r, 500, "out of memory");
    return;
  }
  struct timeval tv;
  eldr__w_tv_of(w->pull_timeout, &tv);
  evhttp_connection_set_timeout_tv(r->sg.conn, &tv);
  evhttp_connection_set_retries(r->sg.conn, 0);
  evhttp_connection_set_max_headers_size(r->sg.conn, 8192);
  evhttp_connection_set_max_body_size(r->sg.conn, 4096);
  r->sg.hreq = q;
  if (evhttp_make_request(r->sg.conn, q, EVHTTP_REQ_GET, "/route?engine_rank=0&target_dp_group=0") < 0) {
    r->sg.hreq = NULL;
    item_fail(r, 500, "cannot start the bootstrap handshake");
  }
}

/* item_fail, for the rest of the worker */
void eldr__sgl_fail(wreq *r, int code, const char *msg) { item_fail(r, code, "%s", msg); }
