/* dnstcp.c — a name's A and AAAA records over TCP (RFC 7766), on the loop:
 * what a DNS group falls back to when the UDP answer evdns read was cut
 * (TC set: the server had more than fits 512 bytes, and libevent 2.1's
 * evdns neither sends EDNS0 nor retries over TCP) or full to evdns's cap
 * of 32 addresses per family (MAX_V4_ADDRS / MAX_V6_ADDRS in its evdns.c,
 * which drops the rest silently). One connection per type, both at once,
 * the whole lookup bounded by a deadline; replies read by dnsmsg.c. */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "serve_types.h"

typedef struct dnsleg {
  eldr__dnstcp *t;
  struct bufferevent *bev;
  uint16_t id, qtype;
  int rc;             /* ELDR__DNS_*, -1 while running */
  eldr__dns_addrs *res;
} dnsleg;

struct eldr__dnstcp {
  dnsleg leg[2];      /* A, AAAA */
  struct event *deadline;
  eldr__dnstcp_done done;
  void *arg;
  char err[128];
  int left;
};

static void tcp_free(eldr__dnstcp *t) {
  for (int k = 0; k < 2; k++) {
    if (t->leg[k].bev) bufferevent_free(t->leg[k].bev);
    free(t->leg[k].res);
  }
  if (t->deadline) event_free(t->deadline);
  free(t);
}

static void leg_end(dnsleg *l, int rc, const char *why) {
  eldr__dnstcp *t = l->t;
  if (l->rc >= 0) return;
  l->rc = rc;
  if (why && !t->err[0]) snprintf(t->err, sizeof t->err, "%s", why);
  if (l->bev) {
    bufferevent_free(l->bev);
    l->bev = NULL;
  }
  if (--t->left) return;
  int rcs[2] = {t->leg[0].rc, t->leg[1].rc};
  const eldr__dns_addrs *res[2] = {t->leg[0].res, t->leg[1].res};
  t->done(t->arg, rcs, res, t->err[0] ? t->err : NULL);
  tcp_free(t);
}

static void on_read(struct bufferevent *bev, void *arg) {
  dnsleg *l = arg;
  struct evbuffer *in = bufferevent_get_input(bev);
  size_t have = evbuffer_get_length(in);
  if (have < 2) return;
  uint8_t lb[2];
  evbuffer_copyout(in, lb, 2);
  size_t need = (size_t)lb[0] << 8 | lb[1];
  if (have < need + 2) return;
  const uint8_t *m = evbuffer_pullup(in, (ev_ssize_t)(need + 2));
  int rc = m ? eldr__dns_answer(m + 2, need, l->id, l->qtype, l->res) : ELDR__DNS_MALFORMED;
  leg_end(l, rc, rc == ELDR__DNS_MALFORMED ? "malformed reply over TCP" : NULL);
}

static void on_event(struct bufferevent *bev, short what, void *arg) {
  (void)bev;
  dnsleg *l = arg;
  if (what & BEV_EVENT_CONNECTED) return;
  leg_end(l, ELDR__DNS_FAILED, what & BEV_EVENT_EOF ? "the nameserver closed the TCP connection without a reply"
                                                    : "TCP connection to the nameserver failed");
}

static void on_deadline(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr__dnstcp *t = arg;
  for (int k = 0; k < 2; k++) leg_end(&t->leg[k], ELDR__DNS_FAILED, "no reply over TCP in time");
}

eldr__dnstcp *eldr__dnstcp_start(struct event_base *base, const struct sockaddr *ns, socklen_t nslen, const char *name,
                                 double timeout_s, eldr__dnstcp_done done, void *arg) {
  eldr__dnstcp *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->done = done;
  t->arg = arg;
  t->left = 2;
  uint16_t ids[2] = {0, 0};
  if (getrandom(ids, sizeof ids, 0) != sizeof ids) ids[0] = 0x5a5a, ids[1] = 0xa5a5;
  t->deadline = evtimer_new(base, on_deadline, t);
  int ok = t->deadline != NULL;
  for (int k = 0; k < 2 && ok; k++) {
    dnsleg *l = &t->leg[k];
    l->t = t;
    l->rc = -1;
    l->qtype = k ? ELDR__DNS_AAAA : ELDR__DNS_A;
    l->id = ids[k];
    uint8_t q[2 + 300];
    size_t qn = eldr__dns_query(q + 2, sizeof q - 2, l->id, name, l->qtype);
    l->res = calloc(1, sizeof *l->res);
    l->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS); /* never from inside start */
    ok = qn && l->res && l->bev;
    if (!ok) break;
    q[0] = (uint8_t)(qn >> 8), q[1] = (uint8_t)qn;
    bufferevent_setcb(l->bev, on_read, NULL, on_event, l);
    bufferevent_setwatermark(l->bev, EV_READ, 0, 65537);
    ok = bufferevent_write(l->bev, q, qn + 2) == 0 && bufferevent_enable(l->bev, EV_READ) == 0 &&
         bufferevent_socket_connect(l->bev, (struct sockaddr *)ns, (int)nslen) == 0;
  }
  struct timeval tv = eldr__tv_of(timeout_s);
  if (!ok || evtimer_add(t->deadline, &tv)) {
    tcp_free(t);
    return NULL;
  }
  return t;
}

void eldr__dnstcp_cancel(eldr__dnstcp *t) {
  if (t) tcp_free(t);
}
