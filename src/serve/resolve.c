/* resolve.c — name resolution on the loop (libevent's evdns): a worker URL
 * whose host is a name resolves without blocking, and is retried every
 * dns_interval while it does not (an error naming the host is logged);
 * DNS groups (--prefill-dns/--decode-dns NAME:PORT) take every A and AAAA
 * address of NAME as a worker and re-resolve it every dns_interval: new
 * addresses join the lists, removed ones drain through the same worker
 * retirement a reload uses. Loop thread only. */
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
    forget(&g->t);
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
    w->s->m.dns_errors++;
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
      s->m.dns_updates++;
      eldr__logf_process(s, "%s_dns %s: %zu addresses (%zu added, %zu draining)", eldr__role_name[g->role], g->spec,
                 n, added, removed);
    }
  }
  for (size_t i = 0; i < nold; i++) free(old[i]);
  free(old);
}

static void group_resolved(void *owner, int err, struct evutil_addrinfo *ai) {
  dns_group *g = owner;
  g->t = NULL;
  /* no such name / no records: the group is empty (a headless Service
   * with no ready endpoints); any other error keeps what we have */
  if (err && err != EVUTIL_EAI_NONAME && err != EVUTIL_EAI_NODATA) {
    g->s->m.dns_errors++;
    eldr__logf_process(g->s, "%s_dns %s: cannot resolve '%s': %s; keeping %zu addresses, retrying in %g s",
               eldr__role_name[g->role], g->spec, g->host, evutil_gai_strerror(err), g->n,
               g->s->cfg.dns_interval_s);
    if (ai) evutil_freeaddrinfo(ai);
    return;
  }
  if (err || !ai) {
    g->s->m.dns_errors++;
    eldr__logf_process(g->s, "%s_dns %s: '%s' has no address (%s)", eldr__role_name[g->role], g->spec, g->host,
               err ? evutil_gai_strerror(err) : "empty answer");
  }
  size_t cap = 0, n = 0;
  for (struct evutil_addrinfo *p = ai; p; p = p->ai_next) cap++;
  char **urls = calloc(cap ? cap : 1, sizeof *urls);
  for (struct evutil_addrinfo *p = ai; p && urls; p = p->ai_next) {
    char ip[INET6_ADDRSTRLEN], url[INET6_ADDRSTRLEN + 32];
    const void *a = p->ai_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)p->ai_addr)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)p->ai_addr)->sin_addr;
    if ((p->ai_family != AF_INET && p->ai_family != AF_INET6) || !evutil_inet_ntop(p->ai_family, a, ip, sizeof ip))
      continue;
    snprintf(url, sizeof url, p->ai_family == AF_INET6 ? "http://[%s]:%d" : "http://%s:%d", ip, g->port);
    int dup = 0;
    for (size_t i = 0; i < n; i++) dup |= !strcmp(urls[i], url);
    if (!dup && !(urls[n++] = strdup(url))) n--;
  }
  if (ai) evutil_freeaddrinfo(ai);
  if (!urls) return;
  if (n) qsort(urls, n, sizeof *urls, cmp_str);
  group_set(g, urls, n);
}

static void group_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  dns_group *g = arg;
  if (!g->t) lookup(g->s, g->host, g->port, g, &g->t, group_resolved);
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
    forget(&g->t);
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
