/* sglexact.c — --pd sglang-exact's wait for the prefill's expert counts
 * (serve_types.h, "sglexact.c"; docs/sglang.md, "--pd sglang-exact"). A
 * prefill with contrib/sglang-eldr-exact (or `eldr worker --engine sglang
 * --exact`) runs its forward without waiting for the decode's registration
 * and, at the forward's end, publishes the prompt's compact per-(layer,
 * expert) counts on its bootstrap server:
 *
 *   GET http://<prefill host>:<bootstrap port>/eldr/expert_counts?room=R
 *   200 {"room": R, "eldr_expert_counts": {...}}   (eldr/reply_compact.h)
 *
 * a long poll, answered when the room's forward ends (404 from a server
 * that does not publish them, or whose room ended without them). The
 * router sends it right after the prefill leg, for the request's first
 * item's room (n > 1 samples share the prompt; a batch's decision is its
 * first prompt's, as the rest of the router's), bounded by
 * cfg.exact_timeout_s (the whole poll, connect included) and
 * ELDR__SGL_COUNTS_MAX reply bytes. Its end goes to eldr__sglpd_counts:
 * the counts, read by the signature path's compact reader, or NULL (the
 * decoder then chosen on the prediction or load) with the SGX_* reason.
 *
 * Ownership: the poll is its request's (r->pd holds it; eldr__sglx_free
 * aborts it); one connection of its own per poll (the bootstrap server is
 * no worker: no pool, no health). Loop thread only, but
 * eldr__sgl_counts_doc, pure, any thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/reply_compact.h"
#include "serve_internal.h"
#include "serve_types.h"

const char *const eldr__sgx_name[SGX__N] = {"exact", "timeout", "not_published", "failed", "bad", "not_read", "aborted"};

struct eldr__sglx {
  rq *r;
  eldr_up *up;
  struct event *deadline;
  uint64_t room;
  double t0;
  int status;
  char *buf;
  size_t n, cap;
};

int eldr__sgl_counts_doc(const char *doc, size_t n, uint64_t room, eldr_js_span *compact, eldr_diag *d) {
  if (n > ELDR__SGL_COUNTS_MAX)
    return eldr_diag_fail(d, ELDR_ERANGE, "expert counts: reply of %zu bytes is over %zu", n, ELDR__SGL_COUNTS_MAX);
  static const eldr_js_path want[2] = {{{"room", NULL}}, {{ELDR_COMPACT_KEY, NULL}}};
  eldr_js_span f[2], root;
  int rc = eldr_js_scan(doc, n, want, 2, f, &root, d);
  if (rc) return rc;
  if (root.type != ELDR_JS_OBJECT) return eldr_diag_fail(d, ELDR_EINVAL, "expert counts: the reply is not a JSON object");
  int64_t got = -1;
  if (f[0].type != ELDR_JS_INTEGER || eldr_js_int(doc, f[0], &got) || got < 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "expert counts: 'room' must be an integer in 0..2^63-1");
  if ((uint64_t)got != room)
    return eldr_diag_fail(d, ELDR_EINVAL, "expert counts: for room %lld, asked for %llu", (long long)got,
                          (unsigned long long)room);
  if (f[1].type != ELDR_JS_OBJECT)
    return eldr_diag_fail(d, ELDR_EINVAL, "expert counts: '" ELDR_COMPACT_KEY "' must be an object");
  *compact = f[1];
  return 0;
}

void eldr__sglx_free(eldr__sglx *x) {
  if (!x) return;
  if (x->deadline) event_free(x->deadline);
  if (x->up) eldr_up_free(x->up); /* aborts an exchange in flight (deferred inside its callback) */
  free(x->buf);
  free(x);
}

/* The poll is over: its result to the flow (which frees x). */
static void x_end(eldr__sglx *x, int result, const char *why) {
  rq *r = x->r;
  eldr_server *s = r->s;
  eldr__histo_add(&s->m.exact_wait, eldr__now_s() - x->t0);
  if (result == SGX_EXACT) {
    eldr_js_span compact;
    eldr_diag d = {{0}};
    if (eldr__sgl_counts_doc(x->buf ? x->buf : "", x->n, x->room, &compact, &d)) {
      eldr__logf(s, "request %s: prefill's expert counts not read (deciding without them): %s", r->reqid, d.msg);
      eldr__sglpd_counts(r, SGX_BAD, NULL);
      return;
    }
    eldr__sigres res;
    double t0 = eldr__now_s();
    eldr__sigpath_extract(&s->sp, x->buf, x->n, NULL, 0, NULL, 0, compact, &r->prompt, &res);
    eldr__histo_add(&s->m.sig, eldr__now_s() - t0);
    if (res.fallback != FB_NONE) {
      if (res.fallback != ELDR__FB_NO_ARTIFACT) s->m.fallback[res.fallback]++;
      if (res.reason > 0 && res.reason < ELDR_RE__N) s->m.re_rejected[res.reason]++;
      eldr__logf(s, "request %s: prefill's expert counts do not fit the artifact (deciding without them): %s", r->reqid,
                 res.diag.msg[0] ? res.diag.msg : "no signature");
      eldr__sglpd_counts(r, SGX_NOT_READ, NULL);
      return;
    }
    s->re_seen_t = t0;
    eldr__sglpd_counts(r, SGX_EXACT, &res);
    return;
  }
  eldr__logf(s, "request %s: no expert counts for bootstrap_room %llu (%s): the decoder chosen on the prediction or load",
             r->reqid, (unsigned long long)x->room, why);
  eldr__sglpd_counts(r, result, NULL);
}

static void x_head_cb(void *arg, int status, const char *ctype) {
  (void)ctype;
  eldr__sglx *x = arg;
  x->status = status;
  long long cl = eldr_up_body_length(x->up);
  if (status == 200 && cl > (long long)ELDR__SGL_COUNTS_MAX) {
    x_end(x, SGX_BAD, "its Content-Length is over the limit");
  }
}

static void x_data_cb(void *arg, const char *p, size_t n) {
  eldr__sglx *x = arg;
  if (x->n + n > ELDR__SGL_COUNTS_MAX) {
    x_end(x, SGX_BAD, "reply over the size limit");
    return;
  }
  if (x->n + n + 1 > x->cap) {
    size_t cap = x->cap ? x->cap : 4096;
    while (cap < x->n + n + 1) cap *= 2;
    char *q = realloc(x->buf, cap);
    if (!q) {
      x_end(x, SGX_FAILED, "out of memory for the reply");
      return;
    }
    x->buf = q;
    x->cap = cap;
  }
  memcpy(x->buf + x->n, p, n);
  x->n += n;
  x->buf[x->n] = 0;
}

static void x_done_cb(void *arg, int err) {
  eldr__sglx *x = arg;
  if (err) {
    x_end(x, err == ELDR_ETIMEOUT ? SGX_TIMEOUT : SGX_FAILED,
          err == ELDR_ETIMEOUT ? "connect timed out" : err == ELDR_EPARSE ? "not an HTTP reply" : "connection failed");
    return;
  }
  if (x->status == 200) {
    x_end(x, SGX_EXACT, "");
    return;
  }
  char why[96];
  snprintf(why, sizeof why, "bootstrap server answered HTTP %d", x->status);
  /* 404: no such route (an unpatched SGLang), or the room ended without counts */
  x_end(x, x->status == 404 ? SGX_NOT_PUBLISHED : SGX_FAILED, why);
}

static const eldr_up_cbs x_cbs = {x_head_cb, x_data_cb, x_done_cb};

static void x_deadline_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr__sglx *x = arg;
  char why[64];
  snprintf(why, sizeof why, "none within %g s", x->r->s->cfg.exact_timeout_s);
  x_end(x, SGX_TIMEOUT, why);
}

eldr__sglx *eldr__sglx_start(rq *r, const worker *pw, int bport, uint64_t room, const char **why) {
  eldr_server *s = r->s;
  *why = "out of memory";
  if (bport <= 0 || bport > 65535) {
    *why = "the prefill has no bootstrap port";
    return NULL;
  }
  struct sockaddr_storage a = pw->addr;
  if (a.ss_family == AF_INET) ((struct sockaddr_in *)&a)->sin_port = htons((uint16_t)bport);
  else if (a.ss_family == AF_INET6) ((struct sockaddr_in6 *)&a)->sin6_port = htons((uint16_t)bport);
  else {
    *why = "the prefill's address is not IP";
    return NULL;
  }
  eldr__sglx *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->r = r;
  x->room = room;
  x->t0 = eldr__now_s();
  x->up = eldr_up_new(s->base, (struct sockaddr *)&a, pw->addrlen);
  x->deadline = evtimer_new(s->base, x_deadline_cb, x);
  if (!x->up || !x->deadline) {
    eldr__sglx_free(x);
    return NULL;
  }
  eldr_up_set_connect_timeout(x->up, s->cfg.exact_timeout_s);
  char head[600];
  int v6 = strchr(pw->host, ':') != NULL; /* an IPv6 literal: bracketed in Host */
  int hn = snprintf(head, sizeof head,
                    "GET /eldr/expert_counts?room=%llu HTTP/1.1\r\nHost: %s%s%s:%d\r\nAccept: application/json\r\n"
                    "X-Request-Id: %s\r\n\r\n",
                    (unsigned long long)room, v6 ? "[" : "", pw->host, v6 ? "]" : "", bport, r->reqid);
  struct iovec iov = {head, (size_t)hn};
  if (hn <= 0 || (size_t)hn >= sizeof head || eldr_up_request(x->up, &iov, 1, &x_cbs, x) != 0) {
    *why = "the poll could not be sent";
    eldr__sglx_free(x);
    return NULL;
  }
  struct timeval tv = eldr__tv_of(s->cfg.exact_timeout_s);
  event_add(x->deadline, &tv);
  return x;
}
