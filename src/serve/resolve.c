/* resolve.c — name resolution on the loop (libevent's evdns): a worker URL
 * whose host is a name resolves without blocking, and is retried every
 * dns_interval while it does not (an error naming the host is logged);
 * DNS groups (--prefill-dns/--decode-dns NAME:PORT) take every A and AAAA
 * address of NAME as a worker and re-resolve it every dns_interval: new
 * addresses join the lists, removed ones drain through the same worker
 * retirement a reload uses. Every loop resolves for itself, on its own
 * resolver and timers; loop 0's outcomes stand for the process in the log
 * and in the dns_errors / dns_updates counters (process_count), so one
 * failed resolution is one error whatever --threads is. Loop thread
 * only. */
#include <arpa/inet.h>
#include <event2/dns.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

/* One evdns_getaddrinfo in flight. The owner forgets it by clearing
 * t->owner (and cancelling); evdns always calls back once, which frees it. */
struct dns_ticket {
  void *owner;
  void (*done)(void *owner, int err, struct evutil_addrinfo *ai);
  struct evdns_getaddrinfo_request *req;
};

static void ticket_cb(int err, struct evutil_addrinfo *ai, void *arg) {
  dns_ticket *t = arg;
  if (t->owner) t->done(t->owner, err, ai);
  else if (ai) evutil_freeaddrinfo(ai);
  free(t);
}

/* Start a lookup; *slot holds the ticket while it is in flight (done must
 * clear it). May call done before returning. */
static int lookup(eldr_server *s, const char *host, int port, void *owner, dns_ticket **slot,
                  void (*done)(void *, int, struct evutil_addrinfo *)) {
  dns_ticket *t = calloc(1, sizeof *t);
  if (!t) return ELDR_ENOMEM;
  t->owner = owner;
  t->done = done;
  *slot = t;
  struct evutil_addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = EVUTIL_AI_NUMERICSERV;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct evdns_getaddrinfo_request *req = evdns_getaddrinfo(s->dns, host, ps, &hints, ticket_cb, t);
  if (req) t->req = req; /* else it already called back and t is gone */
  return 0;
}

static void forget(dns_ticket **slot) {
  dns_ticket *t = *slot;
  if (!t) return;
  *slot = NULL;
  t->owner = NULL;
  if (t->req) evdns_getaddrinfo_cancel(t->req);
}

static void group_forget(dns_group *g);

/* A DNS counter of the process: every loop looks up the same names at the
 * same interval, so only loop 0 counts (as only it logs,
 * eldr__logf_process); /metrics sums every loop's counters. */
static void process_count(const eldr_server *s, ctr *c) {
  if (s->loop == 0) (*c)++;
}

int eldr__dns_init(eldr_server *s, const char *server, eldr_diag *d) {
  s->dns = evdns_base_new(s->base, server ? 0 : EVDNS_BASE_INITIALIZE_NAMESERVERS);
  if (!s->dns) return eldr_diag_fail(d, ELDR_EIO, "cannot set up the DNS resolver (/etc/resolv.conf)");
  if (server) {
    if (evdns_base_nameserver_ip_add(s->dns, server))
      return eldr_diag_fail(d, ELDR_EINVAL, "dns_server '%s' must be IP[:PORT]", server);
    evdns_base_load_hosts(s->dns, NULL);
  }
  /* bounded: a name that gets no answer fails within about 2 x 2 s */
  evdns_base_set_option(s->dns, "timeout:", "2");
  evdns_base_set_option(s->dns, "attempts:", "2");
  return 0;
}

void eldr__dns_free(eldr_server *s) {
  while (s->groups) {
    dns_group *g = s->groups;
    s->groups = g->next;
    group_forget(g);
    if (g->timer) event_free(g->timer);
    for (size_t i = 0; i < g->n; i++) free(g->urls[i]);
    free(g->urls);
    free(g->spec);
    free(g);
  }
  if (s->dns) evdns_base_free(s->dns, 1); /* pending lookups call back and free their tickets */
  s->dns = NULL;
}

/* ---- a worker URL with a host name ---------------------------------------- */

static void worker_resolve(worker *w);

static void worker_resolved(void *owner, int err, struct evutil_addrinfo *ai) {
  worker *w = owner;
  w->dns = NULL;
  if (!err && ai && ai->ai_addrlen <= sizeof w->addr) {
    memcpy(&w->addr, ai->ai_addr, ai->ai_addrlen);
    w->addrlen = (socklen_t)ai->ai_addrlen;
    eldr__logf_process(w->s, "%s worker %s: '%s' resolved", eldr__role_name[w->role], w->url, w->host);
  } else {
    process_count(w->s, &w->s->m.dns_errors);
    eldr__logf_process(w->s, "%s worker %s: cannot resolve '%s': %s; retrying in %g s", eldr__role_name[w->role],
               w->url, w->host, err ? evutil_gai_strerror(err) : "no usable address",
               w->s->cfg.dns_interval_s);
    struct timeval tv = eldr__tv_of(w->s->cfg.dns_interval_s);
    if (!w->retired) evtimer_add(w->dns_timer, &tv);
  }
  if (ai) evutil_freeaddrinfo(ai);
}

static void worker_retry_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  worker_resolve(arg);
}

static void worker_resolve(worker *w) {
  if (w->dns || w->retired) return;
  if (lookup(w->s, w->host, w->port, w, &w->dns, worker_resolved)) {
    struct timeval tv = eldr__tv_of(w->s->cfg.dns_interval_s);
    evtimer_add(w->dns_timer, &tv);
  }
}

int eldr__worker_resolve_start(worker *w) {
  struct evutil_addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = EVUTIL_AI_NUMERICHOST | EVUTIL_AI_NUMERICSERV;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", w->port);
  if (evutil_getaddrinfo(w->host, ps, &hints, &ai) == 0 && ai) { /* an address: no lookup */
    int ok = ai->ai_addrlen <= sizeof w->addr;
    if (ok) {
      memcpy(&w->addr, ai->ai_addr, ai->ai_addrlen);
      w->addrlen = (socklen_t)ai->ai_addrlen;
    }
    evutil_freeaddrinfo(ai);
    return ok ? 0 : ELDR_EINVAL;
  }
  /* not picked until it resolves (eldr__worker_up) */
  w->dns_timer = evtimer_new(w->s->base, worker_retry_cb, w);
  if (!w->dns_timer) return ELDR_ENOMEM;
  worker_resolve(w);
  return 0;
}

void eldr__worker_resolve_stop(worker *w) {
  forget(&w->dns);
  if (w->dns_timer) {
    event_free(w->dns_timer);
    w->dns_timer = NULL;
  }
}

/* ---- DNS groups ------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int listed(char *const *v, size_t n, char *const *x) {
  return n && bsearch(x, v, n, sizeof *v, cmp_str) != NULL;
}

/* Install the group's new address list and rebuild the worker lists. */
static void group_set(dns_group *g, char **urls, size_t n) {
  eldr_server *s = g->s;
  size_t added = 0, removed = 0;
  for (size_t i = 0; i < n; i++)
    added += !listed(g->urls, g->n, &urls[i]);
  for (size_t i = 0; i < g->n; i++)
    removed += !listed(urls, n, &g->urls[i]);
  char **old = g->urls;
  size_t nold = g->n;
  g->urls = urls;
  g->n = n;
  if (added || removed) {
    worker_plan p;
    eldr_diag d = {{0}};
    int rc = eldr__workers_plan(s, &s->cfg, &p, &d);
    if (rc) { /* keep the old list, try again next time */
      g->urls = old;
      g->n = nold;
      old = urls;
      nold = n;
      eldr__logf_process(s, "%s_dns %s: cannot update the workers: %s", eldr__role_name[g->role], g->spec,
                 eldr_diag_msg(&d, rc));
    } else {
      eldr__workers_commit(s, &p);
      process_count(s, &s->m.dns_updates);
      eldr__logf_process(s, "%s_dns %s: %zu addresses (%zu added, %zu draining)", eldr__role_name[g->role], g->spec,
                 n, added, removed);
    }
  }
  for (size_t i = 0; i < nold; i++) free(old[i]);
  free(old);
}

/* One lookup of a group's name: A and AAAA over UDP (evdns's low-level
 * queries: unlike its getaddrinfo, which reports a NOERROR answer without
 * records as EAI_FAIL, they tell "no records" and "no such name" from a
 * failure), then over TCP when an answer was cut (TC) or full to evdns's
 * limit of 32 addresses per family (dnstcp.c). The group forgets it by
 * clearing q->g; it frees itself when its last callback has run. */
/* evdns (libevent 2.1) keeps at most this many addresses of one family
 * from an answer (MAX_V4_ADDRS, MAX_V6_ADDRS in evdns.c) */
#define EVDNS_LIMIT 32
#define EVDNS_CAP ELDR__DNS_MAX_ADDRS

typedef struct group_query group_query;
typedef struct famref {
  group_query *q;
  int k; /* 0: A, 1: AAAA */
} famref;

struct group_query {
  dns_group *g;
  int pending;                  /* UDP callbacks to come */
  struct evdns_request *req[2]; /* A, AAAA */
  famref fam[2];
  int rc[2];                    /* ELDR__DNS_* per family */
  size_t n[2];
  uint8_t addr[2][EVDNS_CAP][16];
  eldr__dnstcp *tcp;
};

static void query_free(group_query *q) {
  eldr__dnstcp_cancel(q->tcp);
  free(q);
}

static void group_forget(dns_group *g) {
  group_query *q = g->q;
  if (!q) return;
  g->q = NULL;
  q->g = NULL;
  if (q->tcp) { /* the UDP part is over */
    query_free(q);
    return;
  }
  for (int k = 0; k < 2; k++) /* each calls back with DNS_ERR_CANCEL, which frees q at the last */
    if (q->req[k]) evdns_cancel_request(g->s->dns, q->req[k]);
}

/* The answers are in: install them, or keep the current list on a failure. */
static void group_answer(dns_group *g, group_query *q, const char *tcp_err) {
  eldr_server *s = g->s;
  static const char *const rcname[] = {"ok", "no records", "no such name", "server failure", "truncated", "malformed"};
  int usable = 1;
  for (int k = 0; k < 2; k++) usable &= q->rc[k] == ELDR__DNS_OK || q->rc[k] == ELDR__DNS_NODATA || q->rc[k] == ELDR__DNS_NXDOMAIN;
  if (!usable) { /* says nothing about the name: keep what we have */
    process_count(s, &s->m.dns_errors);
    eldr__logf_process(s, "%s_dns %s: cannot resolve '%s' (A: %s, AAAA: %s%s%s); keeping %zu addresses, retrying in %g s",
               eldr__role_name[g->role], g->spec, g->host, rcname[q->rc[0]], rcname[q->rc[1]], tcp_err ? "; " : "",
               tcp_err ? tcp_err : "", g->n, s->cfg.dns_interval_s);
    return;
  }
  size_t total = q->n[0] + q->n[1];
  if (!total) {
    process_count(s, &s->m.dns_errors);
    eldr__logf_process(s, "%s_dns %s: '%s' has no address (%s)", eldr__role_name[g->role], g->spec, g->host,
               q->rc[0] == ELDR__DNS_NXDOMAIN && q->rc[1] == ELDR__DNS_NXDOMAIN ? "no such name"
                                                                                : "no A or AAAA records");
  }
  char **urls = calloc(total ? total : 1, sizeof *urls);
  if (!urls) return;
  size_t n = 0;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < q->n[k]; i++) {
      char ip[INET6_ADDRSTRLEN], url[INET6_ADDRSTRLEN + 32];
      if (!evutil_inet_ntop(k ? AF_INET6 : AF_INET, q->addr[k][i], ip, sizeof ip)) continue;
      snprintf(url, sizeof url, k ? "http://[%s]:%d" : "http://%s:%d", ip, g->port);
      if ((urls[n] = strdup(url))) n++;
    }
  if (n) qsort(urls, n, sizeof *urls, cmp_str);
  size_t u = 0; /* one worker per address */
  for (size_t i = 0; i < n; i++) {
    if (u && !strcmp(urls[u - 1], urls[i])) {
      free(urls[i]);
      continue;
    }
    urls[u++] = urls[i];
  }
  group_set(g, urls, u);
}

static int rc_of(int result, int count) {
  switch (result) {
  case DNS_ERR_NONE: return count > 0 ? ELDR__DNS_OK : ELDR__DNS_NODATA;
  case DNS_ERR_NODATA: return ELDR__DNS_NODATA;
  case DNS_ERR_NOTEXIST: return ELDR__DNS_NXDOMAIN;
  case DNS_ERR_TRUNCATED: return ELDR__DNS_TRUNCATED;
  default: return ELDR__DNS_FAILED;
  }
}

static void tcp_done(void *arg, const int *rc, const eldr__dns_addrs *const *res, const char *err) {
  group_query *q = arg;
  q->tcp = NULL;
  dns_group *g = q->g;
  if (!g) { /* forgotten meanwhile (cannot happen: forgetting cancels), for safety */
    free(q);
    return;
  }
  g->q = NULL;
  for (int k = 0; k < 2; k++) {
    int ok = rc[k] == ELDR__DNS_OK || rc[k] == ELDR__DNS_NODATA || rc[k] == ELDR__DNS_NXDOMAIN;
    if (!ok) continue; /* the UDP answer stands (cut, or failed) */
    q->rc[k] = rc[k];
    q->n[k] = 0;
    if (res[k]->n > EVDNS_CAP && !g->logged_cut++)
      eldr__logf_process(g->s, "%s_dns %s: %zu %s addresses (over TCP: the UDP answer was cut)", eldr__role_name[g->role],
                 g->spec, res[k]->n, k ? "AAAA" : "A");
    q->n[k] = res[k]->n; /* EVDNS_CAP is ELDR__DNS_MAX_ADDRS: room for all */
    memcpy(q->addr[k], res[k]->addr, res[k]->n * sizeof res[k]->addr[0]);
  }
  group_answer(g, q, err);
  free(q);
}

static void udp_done(group_query *q) {
  dns_group *g = q->g;
  if (!g) {
    query_free(q);
    return;
  }
  int cut = 0;
  for (int k = 0; k < 2; k++) cut |= q->rc[k] == ELDR__DNS_TRUNCATED || q->n[k] >= EVDNS_LIMIT;
  if (cut) { /* the same name over TCP to the first nameserver, which has the whole answer */
    struct sockaddr_storage ns;
    int nl = evdns_base_get_nameserver_addr(g->s->dns, 0, (struct sockaddr *)&ns, sizeof ns);
    if (nl > 0 && (size_t)nl <= sizeof ns &&
        (q->tcp = eldr__dnstcp_start(g->s->base, (struct sockaddr *)&ns, (socklen_t)nl, g->host, 4, tcp_done, q)))
      return;
    eldr__logf_process(g->s, "%s_dns %s: the answer was cut (%zu A, %zu AAAA%s) and no TCP query could be made: using it",
               eldr__role_name[g->role], g->spec, q->n[0], q->n[1], q->n[0] >= EVDNS_LIMIT || q->n[1] >= EVDNS_LIMIT ?
               ", evdns keeps at most 32 per family" : "");
  }
  g->q = NULL;
  group_answer(g, q, NULL);
  free(q);
}

static void udp_cb(int result, char type, int count, int ttl, void *addresses, void *arg) {
  (void)ttl;
  famref *f = arg;
  group_query *q = f->q;
  int k = f->k;
  q->req[k] = NULL;
  q->rc[k] = rc_of(result, count);
  size_t alen = k ? 16 : 4;
  if (result == DNS_ERR_NONE && addresses && type == (k ? DNS_IPv6_AAAA : DNS_IPv4_A))
    for (int i = 0; i < count && q->n[k] < EVDNS_CAP; i++)
      memcpy(q->addr[k][q->n[k]++], (const uint8_t *)addresses + (size_t)i * alen, alen);
  if (--q->pending == 0) udp_done(q);
}

static void group_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  dns_group *g = arg;
  if (g->q) return; /* one lookup at a time */
  group_query *q = calloc(1, sizeof *q);
  if (!q) return;
  q->g = g;
  g->q = q;
  q->pending = 2;
  for (int k = 0; k < 2; k++) {
    q->fam[k] = (famref){q, k};
    q->rc[k] = ELDR__DNS_FAILED;
  }
  /* the search list applies as to any lookup (flags 0); each calls back
   * once, on the loop */
  q->req[0] = evdns_base_resolve_ipv4(g->s->dns, g->host, 0, udp_cb, &q->fam[0]);
  if (!q->req[0]) q->pending--;
  q->req[1] = evdns_base_resolve_ipv6(g->s->dns, g->host, 0, udp_cb, &q->fam[1]);
  if (!q->req[1]) q->pending--;
  if (!q->pending) udp_done(q); /* neither could be sent: a failure, the list kept */
}

static dns_group *group_new(eldr_server *s, int role, const char *spec) {
  dns_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->s = s;
  g->role = role;
  g->spec = strdup(spec);
  g->timer = event_new(s->base, -1, EV_PERSIST, group_tick, g);
  eldr_diag d = {{0}};
  if (!g->spec || !g->timer || eldr_serve_parse_hostport(spec, g->host, sizeof g->host, &g->port, &d)) {
    if (g->timer) event_free(g->timer);
    free(g->spec);
    free(g);
    return NULL;
  }
  return g;
}

const dns_group *eldr__dns_group_find(const eldr_server *s, int role, const char *spec) {
  for (const dns_group *g = s->groups; g; g = g->next)
    if (g->role == role && !strcmp(g->spec, spec)) return g;
  return NULL;
}

void eldr__dns_sync(eldr_server *s) {
  /* groups the configuration no longer names (their workers are already
   * retired: the committed plan did not list them) */
  for (dns_group **pp = &s->groups; *pp;) {
    dns_group *g = *pp;
    char **specs = g->role ? s->cfg.decode_dns : s->cfg.prefill_dns;
    size_t n = g->role ? s->cfg.n_decode_dns : s->cfg.n_prefill_dns, keep = 0;
    for (size_t i = 0; i < n; i++) keep |= !strcmp(specs[i], g->spec);
    if (keep) {
      pp = &g->next;
      continue;
    }
    *pp = g->next;
    group_forget(g);
    event_free(g->timer);
    for (size_t i = 0; i < g->n; i++) free(g->urls[i]);
    free(g->urls);
    free(g->spec);
    free(g);
  }
  struct timeval tv = eldr__tv_of(s->cfg.dns_interval_s);
  for (int role = 0; role < 2; role++) {
    char **specs = role ? s->cfg.decode_dns : s->cfg.prefill_dns;
    size_t n = role ? s->cfg.n_decode_dns : s->cfg.n_prefill_dns;
    for (size_t i = 0; i < n; i++) {
      if (eldr__dns_group_find(s, role, specs[i])) continue;
      dns_group *g = group_new(s, role, specs[i]);
      if (!g) {
        eldr__logf(s, "%s_dns %s: out of memory; not resolved", eldr__role_name[role], specs[i]);
        continue;
      }
      g->next = s->groups;
      s->groups = g;
      group_tick(-1, 0, g); /* first lookup now */
    }
  }
  for (dns_group *g = s->groups; g; g = g->next) { /* at the (maybe new) interval */
    event_del(g->timer);
    event_add(g->timer, &tv);
  }
}
