/* sglpd.c — SGLang's prefill/decode flow in the router (--pd sglang;
 * serve_types.h, "sglpd.c"; docs/sglang.md). What SGLang's gateway does
 * (sgl-model-gateway pd_router.rs: select_pd_pair, inject_bootstrap_into_value,
 * execute_dual_dispatch_internal), with the decoder chosen by eldr:
 *
 *   arrival   the prefill worker by prefix hash and load (as the vLLM flow);
 *             the decoder at once, on the signature predicted from the
 *             signature cache when eldr_predict_usable says so, else by load
 *             (r->arrival says which; metric eldr_sglang_decisions_total)
 *             --pd sglang-exact: the decoder once the prefill published the
 *             first item's counts at its forward's end (sglexact.c's poll of
 *             its bootstrap server, ARR_EXACT), or at the poll's end without
 *             them (timeout, 404, error: r->exact says which) as above
 *   bodies    the client's JSON with bootstrap_host (the prefill's host),
 *             bootstrap_port (the worker's own, else cfg.bootstrap_port) and a fresh random
 *             bootstrap_room per item (sglbody.c); the prefill's also asks
 *             for the prompt's routed experts and one whole reply
 *   legs      both sent in the same loop turn (sglang-exact: the decode leg
 *             when the decoder is chosen): the decode leg is r->L (relayed
 *             to the client, streamed or whole, with every bound of the vLLM
 *             flow's decode leg), the prefill leg is r->pd->P, its own
 *             connection, deadline (prefill_timeout) and reply buffer
 *   prefill   its reply's routed experts (SGLang's sglext form) complete the
 *   reply     signature cache (the blocks it computed are stored) and replace
 *             the footprint's predicted contribution with the true counts
 *             (eldr_footprint_replace). A decode that answered first waits
 *             for it (the gateway joins both replies), bounded by its deadline.
 *   errors    a prefill that fails (connection, HTTP status, timeout) before
 *             the decode answered aborts the decode leg (the decode worker
 *             sees its client leave and drops the room, so nothing waits for
 *             KV that will not come) and answers the client: its own 4xx as
 *             it sent it, else 502 / 504 naming the prefill; a started stream
 *             ends with an SSE error event. A decode that fails answers the
 *             client as in the vLLM flow, and the prefill leg is aborted with
 *             the request. A prefill that fails while sglang-exact waits for
 *             its counts ends the poll; no decode leg is ever sent.
 *
 *   routes    /v1/completions, /v1/chat/completions and SGLang's native
 *             /generate alike (path_of: the legs go to the client's route);
 *             a whole /generate reply gets the prefill's input log
 *             probabilities in front of the decode's (eldr__sglpd_reply)
 *
 * Ownership: r->pd is r's (eldr__sglpd_free, from eldr__rq_free); the
 * prefill leg holds one in-flight reference on its worker while it runs.
 * Loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve_types.h"

struct eldr__sglpd {
  leg P;                 /* the prefill leg: w/up while in flight */
  int held;              /* the decode's reply waits for the prefill's */
  eldr__sglx *x;         /* sglang-exact: the counts poll, while the decoder waits for it */
  int exact;             /* sglang-exact: the decoder was chosen on the true counts */
  uint32_t items;
  uint64_t rooms[ELDR__SGL_MAX_ITEMS];
};

static const char *path_of(const rq *r) {
  return r->req.api == ELDR__API_CHAT ? "/v1/chat/completions" : r->req.api == ELDR__API_GENERATE ? "/generate"
                                                                                                 : "/v1/completions";
}

/* The prefill leg's exchange is over or dropped: its worker reference and
 * connection given back (an exchange in flight is aborted). */
static void p_release(rq *r) {
  leg *P = &r->pd->P;
  if (P->deadline) event_del(P->deadline);
  if (P->up && eldr_up_resent(P->up)) r->s->m.resends[LEG_PREFILL]++;
  if (P->up && eldr_up_active(P->up)) eldr_up_abort(P->up);
  if (P->w) eldr__worker_put(P->w, P->up);
  P->w = NULL;
  P->up = NULL;
}

void eldr__sglpd_free(rq *r) {
  eldr__sglpd *pd = r->pd;
  if (!pd) return;
  if (pd->P.w) r->s->m.sgl_prefill[SPF_ABANDONED]++; /* the request ended first (decode failed, client left) */
  if (pd->x) { /* the client left while the decoder waited for the counts */
    eldr__sglx_free(pd->x);
    pd->x = NULL;
    r->s->m.sgl_exact[SGX_ABORTED]++;
  }
  p_release(r);
  if (pd->P.deadline) event_free(pd->P.deadline);
  free(pd->P.buf);
  free(pd);
  r->pd = NULL;
}

int eldr__sglpd_hold(rq *r) {
  eldr__sglpd *pd = r->pd;
  if (!pd || !pd->P.w) return 0; /* its prefill answered already */
  pd->held = 1;
  return 1;
}

/* The prefill failed: the decode leg aborted and the client answered, or,
 * when the decode answered already, its reply relayed (it stands: the KV
 * arrived). Frees r. */
static void p_failed(rq *r, int status, int outcome, const char *why) {
  eldr__sglpd *pd = r->pd;
  eldr_server *s = r->s;
  s->m.sgl_prefill[outcome == OUT_TIMEOUT ? SPF_TIMEOUT : SPF_FAILED]++;
  int code = pd->P.status;
  p_release(r);
  int unsent = pd->x != NULL; /* sglang-exact: the decoder was not chosen yet */
  if (unsent) {
    eldr__sglx_free(pd->x);
    pd->x = NULL;
    r->exact = SGX_ABORTED;
    s->m.sgl_exact[SGX_ABORTED]++;
  }
  eldr__logf(s, "request %s: prefill leg failed (%s)%s", r->reqid, why,
             pd->held ? "; the decode had answered: its reply stands"
             : unsent ? "; no decode leg was sent (its counts poll ended)"
                      : "; decode leg aborted");
  if (pd->held) {
    pd->held = 0;
    eldr__decode_finish(r);
    return;
  }
  int started = r->L.started;
  eldr__leg_release(r); /* the decode worker sees us leave: SGLang aborts the room */
  char msg[300];
  snprintf(msg, sizeof msg, "prefill failed (%s): %s", unsent ? "no decode leg was sent" : "the decode leg was aborted", why);
  if (started) {
    eldr__abort_stream(r, status, status == 504 ? "timeout" : "upstream_error", msg);
    return;
  }
  if (code >= 400 && code < 500 && pd->P.n) { /* the prefill refused the request itself: its answer */
    r->L.status = code;
    eldr__rq_finish_metrics(r, OUT_CLIENT_ERROR);
    eldr__send_body(r->c, code, pd->P.ctype[0] ? pd->P.ctype : "application/json", pd->P.buf, pd->P.n, NULL);
    return;
  }
  eldr__client_upstream_error(r, status, outcome, "%s", msg);
}

/* A 200 from the prefill: its rows complete the cache and the footprint. */
static void p_complete(rq *r) {
  eldr__sglpd *pd = r->pd;
  eldr_server *s = r->s;
  r->al_pf = eldr__now_s();
  eldr__sigres res;
  double t0 = eldr__now_s();
  eldr__sigpath_extract_sglang(&s->sp, pd->P.buf, pd->P.n, &r->prompt, &res);
  eldr__histo_add(&s->m.sig, eldr__now_s() - t0);
  if (r->rec) eldr__record_sglang_prefill(r, pd->P.buf, pd->P.n);
  if (res.fallback == FB_NONE) {
    s->m.sgl_prefill[SPF_OK]++;
    s->re_seen_t = t0;
    eldr__sigpath_defer(&s->sp, &res); /* the blocks it computed, for the next arrivals */
    if (r->fps && r->fp_ticket != ELDR_FP_NO_TICKET && r->fps->fp && !pd->exact) { /* exact: true already */
      uint32_t pt = r->prompt.ntok > UINT32_MAX ? UINT32_MAX : (uint32_t)r->prompt.ntok;
      eldr_fp_request fr = {.counts = res.counts, .n_tokens = res.n_tokens, .ctx_tokens = pt, .sig = res.sig};
      int err = 0;
      uint64_t t = eldr_footprint_replace(r->fps->fp, r->fp_ticket, &fr, &err);
      if (t != ELDR_FP_NO_TICKET) {
        r->fp_ticket = t;
        s->m.fp_replaced++;
      }
    }
  } else {
    s->m.sgl_prefill[SPF_NO_EXPERTS]++;
    if (res.fallback != ELDR__FB_NO_ARTIFACT && res.fallback != ELDR__FB_NO_ROUTED_EXPERTS)
      s->m.fallback[res.fallback]++;
    if (res.reason > 0 && res.reason < ELDR_RE__N) s->m.re_rejected[res.reason]++;
    if (res.diag.msg[0]) eldr__logf(s, "request %s: prefill's routed experts not read: %s", r->reqid, res.diag.msg);
  }
  p_release(r);
  if (pd->x) { /* sglang-exact: the prefill answered before any decode had its room: a
                * disaggregated engine never does (its KV waits for the decode), and
                * a decode sent now would wait for KV that will not come */
    eldr__sglx_free(pd->x);
    pd->x = NULL;
    r->exact = SGX_ABORTED;
    s->m.sgl_exact[SGX_ABORTED]++;
    eldr__logf(s, "request %s: the prefill answered before its decode leg was sent", r->reqid);
    eldr__client_upstream_error(r, 502, OUT_UPSTREAM_ERROR,
                                "the prefill worker answered before a decode took its KV (is it a disaggregated "
                                "prefill?): no decode leg was sent");
    return;
  }
  if (pd->held) {
    pd->held = 0;
    eldr__decode_finish(r); /* frees r */
  }
}

static void p_head_cb(void *arg, int status, const char *ctype) {
  rq *r = arg;
  leg *P = &r->pd->P;
  P->status = status;
  if (P->w) eldr__slot_progress(P->w->slot);
  eldr__copy(P->ctype, sizeof P->ctype, ctype);
}

static void p_data_cb(void *arg, const char *p, size_t n) {
  rq *r = arg;
  leg *P = &r->pd->P;
  if (P->w) eldr__slot_progress(P->w->slot);
  if (P->n + n > MAX_REPLY || (P->n + n + 1 > P->cap && P->cap >= MAX_REPLY)) {
    P->w->slot->err_status++;
    eldr__worker_failed(P->w, "reply too large");
    p_failed(r, 502, OUT_UPSTREAM_ERROR, "prefill reply too large");
    return;
  }
  if (P->n + n + 1 > P->cap) {
    size_t cap = P->cap ? P->cap : 4096;
    while (cap < P->n + n + 1) cap *= 2;
    char *q = realloc(P->buf, cap);
    if (!q) {
      p_failed(r, 502, OUT_UPSTREAM_ERROR, "out of memory for the prefill's reply");
      return;
    }
    P->buf = q;
    P->cap = cap;
  }
  memcpy(P->buf + P->n, p, n);
  P->n += n;
  P->buf[P->n] = 0;
}

static void p_done_cb(void *arg, int err) {
  rq *r = arg;
  leg *P = &r->pd->P;
  worker *w = P->w;
  if (P->deadline) event_del(P->deadline);
  if (err) {
    if (w && err != ELDR_ENOMEM) {
      if (err == ELDR_ETIMEOUT) w->slot->err_timeout++;
      else w->slot->err_connect++;
      eldr__worker_failed(w, err == ELDR_EPARSE ? "malformed reply" : err == ELDR_ETIMEOUT ? "connect timeout" : "connection failed");
    }
    p_failed(r, err == ELDR_ETIMEOUT ? 504 : 502, err == ELDR_ETIMEOUT ? OUT_TIMEOUT : OUT_UPSTREAM_ERROR,
             err == ELDR_ENOMEM     ? "no socket for the prefill worker"
             : err == ELDR_EPARSE   ? "malformed HTTP reply from the prefill worker"
             : err == ELDR_ETIMEOUT ? "connect to the prefill worker timed out"
                                    : "connection to the prefill worker failed");
    return;
  }
  if (P->status >= 500) {
    w->slot->err_status++;
    eldr__worker_failed(w, "5xx reply");
  } else {
    w->slot->fails = 0;
    w->slot->probed = 1;
  }
  if (P->status != 200) {
    char why[64];
    snprintf(why, sizeof why, "prefill worker answered HTTP %d", P->status);
    p_failed(r, P->status >= 500 ? 502 : P->status, P->status >= 500 ? OUT_UPSTREAM_ERROR : OUT_CLIENT_ERROR, why);
    return;
  }
  p_complete(r);
}

static const eldr_up_cbs p_cbs = {p_head_cb, p_data_cb, p_done_cb};

static void p_deadline_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  rq *r = arg;
  worker *w = r->pd->P.w;
  if (!w) return;
  w->slot->err_timeout++;
  eldr__worker_failed(w, "timeout");
  char why[96];
  snprintf(why, sizeof why, "prefill timed out after %g s", r->s->cfg.prefill_timeout_s);
  p_failed(r, 504, OUT_TIMEOUT, why);
}

/* The decoder, chosen now: on the predicted signature when it is usable. */
static int decide_at_arrival(rq *r) {
  eldr_server *s = r->s;
  uint32_t pt = r->prompt.ntok > UINT32_MAX ? UINT32_MAX : (uint32_t)r->prompt.ntok;
  r->arrival = ARR_NO_PREDICTION;
  if (s->cfg.policy != ELDR_POLICY_ELDR && s->cfg.policy != ELDR_POLICY_FOOTPRINT) return eldr__decide_on(r, NULL, pt);
  eldr__sigres res;
  eldr_prediction pred;
  double t0 = eldr__now_s();
  int use = eldr__sigpath_predict(&s->sp, &r->prompt, s->cfg.predict_threshold, &res, &pred);
  eldr__histo_add(&s->m.sig, eldr__now_s() - t0);
  r->confidence = pred.confidence;
  r->arrival = use ? ARR_PREDICTED : pred.known_tokens ? ARR_BELOW_THRESHOLD : ARR_NO_PREDICTION;
  s->m.arrival[r->arrival]++;
  return eldr__decide_on(r, &res, pt);
}

/* The decoder on the prefill's true counts (sglang-exact). */
static int decide_exact(rq *r, const eldr__sigres *res) {
  eldr_server *s = r->s;
  r->arrival = ARR_EXACT;
  r->confidence = 1;
  s->m.arrival[ARR_EXACT]++;
  uint32_t pt = r->prompt.ntok > UINT32_MAX ? UINT32_MAX : (uint32_t)r->prompt.ntok;
  return eldr__decide_on(r, res, pt);
}

/* The decoder chosen (on exact, the true counts, when given; else at
 * arrival): k, or < 0 with the client answered (r freed). */
static int pick_decoder(rq *r, const eldr__sigres *exact) {
  int k = exact ? decide_exact(r, exact) : decide_at_arrival(r);
  if (k == ELDR_ENOMEM) {
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return -1;
  }
  if (k < 0) {
    r->decision = DEC_NONE;
    eldr__client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy decode worker"); /* frees the prefill leg */
  }
  return k;
}

/* The decode leg sent to decoder k (the client answered on failure). */
static void decode_leg(rq *r, int k) {
  eldr_server *s = r->s;
  r->ntried = 0;
  if (eldr__leg_start(r, s->w[ROLE_DECODE][k], LEG_DECODE, "POST", path_of(r), r->b.db.p, r->b.db.n) != 0)
    eldr__client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "could not send to decode worker"); /* frees the prefill leg */
}

int eldr__sglpd_reply(rq *r, const char *body, size_t n, const char **out, size_t *on) {
  eldr__sglpd *pd = r->pd;
  if (!pd || r->req.api != ELDR__API_GENERATE || pd->P.w || pd->P.status != 200 || !pd->P.n) return 1;
  eldr_diag d = {{0}};
  int rc = eldr__sgl_merge_logprobs(pd->P.buf, pd->P.n, body, n, &r->b.fix, &d);
  if (rc < 0) eldr__logf(r->s, "request %s: input log probabilities not merged: %s", r->reqid, d.msg);
  if (rc) return 1;
  *out = r->b.fix.p;
  *on = r->b.fix.n;
  return 0;
}

void eldr__sglpd_counts(rq *r, int result, const eldr__sigres *res) {
  eldr__sglpd *pd = r->pd;
  eldr__sglx_free(pd->x);
  pd->x = NULL;
  r->exact = result;
  r->s->m.sgl_exact[result]++;
  pd->exact = res != NULL;
  int k = pick_decoder(r, res);
  if (k >= 0) decode_leg(r, k);
}

void eldr__sglpd_start(rq *r) {
  eldr_server *s = r->s;
  eldr_diag d = {{0}};
  uint32_t items = 0;
  int rc = eldr__sgl_items(r->req.raw, r->req.raw_len, r->req.api, &items, &d);
  if (rc) {
    s->m.bad[rc == ELDR_EPARSE ? BAD_JSON : BAD_FIELD]++;
    eldr__rq_finish_metrics(r, OUT_CLIENT_ERROR);
    eldr__send_error(r->c, 400, "invalid_request_error", "%s", eldr_diag_msg(&d, rc));
    return;
  }
  eldr__sglpd *pd = calloc(1, sizeof *pd);
  if (!pd || !(pd->P.deadline = evtimer_new(s->base, p_deadline_cb, r))) {
    free(pd);
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return;
  }
  r->pd = pd;
  r->exact = -1;
  pd->items = items;
  /* a fresh room per item in [0, 2^63 - 1], as the gateway's generate_room_id */
  size_t want = items * sizeof *pd->rooms;
  if (getrandom(pd->rooms, want, 0) != (ssize_t)want) {
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "no random bytes for the bootstrap rooms");
    return;
  }
  for (uint32_t i = 0; i < items; i++) pd->rooms[i] &= (uint64_t)INT64_MAX;
  size_t n;
  if (eldr__fill_loads(s, ROLE_PREFILL, r, &n)) {
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "out of memory");
    return;
  }
  int pk = eldr_policy_prefill(r->prompt.prefix_hash, s->keys, s->loads, s->healthy, n, s->cfg.prefill_guard);
  if (pk < 0) {
    eldr__client_upstream_error(r, 503, OUT_UPSTREAM_ERROR, "no healthy prefill worker");
    return;
  }
  worker *pw = s->w[ROLE_PREFILL][pk];
  /* sglang-exact, with a policy that routes on signatures and an artifact to
   * read the counts against: the decode leg waits for the first item's
   * counts; else the decoder now, before any leg */
  int sig_policy = s->cfg.policy == ELDR_POLICY_ELDR || s->cfg.policy == ELDR_POLICY_FOOTPRINT;
  int exact = s->cfg.pd == ELDR_PD_SGLANG_EXACT && sig_policy && s->sp.conf.art;
  if (s->cfg.pd == ELDR_PD_SGLANG_EXACT && !exact && !s->logged_exact++)
    eldr__logf(s, "--pd sglang-exact with %s: no counts are polled, decoders are chosen as in --pd sglang (logged once)",
               sig_policy ? "no artifact loaded" : "a policy that routes on no signature");
  int k = exact ? 0 : pick_decoder(r, NULL);
  if (k < 0) return;
  int bport = eldr_serve_config_boot_port(&s->cfg, pw->url);
  rc = eldr__sgl_leg_body(r->req.raw, r->req.raw_len, r->req.api, pw->host, bport, pd->rooms, items, &r->b.db, &d);
  if (!rc) rc = eldr__sgl_prefill_body(r->req.raw, r->req.raw_len, r->req.api, pw->host, bport, pd->rooms, items, &r->b.pb, &d);
  if (rc) {
    eldr__client_upstream_error(r, 500, OUT_UPSTREAM_ERROR, "%s", eldr_diag_msg(&d, rc));
    return;
  }
  /* both legs now (sglang-exact: the decode's once the counts came): the
   * prefill's first (the decode pick's reservation is the decode leg's to take) */
  leg *P = &pd->P;
  P->kind = LEG_PREFILL;
  if (eldr__leg_send(r, P, pw, 0, "POST", path_of(r), r->b.pb.p, r->b.pb.n, &p_cbs) != 0) {
    eldr__client_upstream_error(r, 502, OUT_UPSTREAM_ERROR, "could not send to prefill worker");
    return;
  }
  P->t_end = eldr__now_s() + s->cfg.prefill_timeout_s;
  struct timeval tv = eldr__tv_of(s->cfg.prefill_timeout_s);
  event_add(P->deadline, &tv);
  if (exact) {
    const char *why = NULL;
    pd->x = eldr__sglx_start(r, pw, bport, pd->rooms[0], &why);
    if (pd->x) return;
    eldr__logf(s, "request %s: no expert counts poll (%s): the decoder chosen on the prediction or load", r->reqid, why);
    eldr__sglpd_counts(r, SGX_FAILED, NULL);
    return;
  }
  decode_leg(r, k);
}
