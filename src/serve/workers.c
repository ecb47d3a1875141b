/* workers.c — the router's workers: resolved address, pool of idle
 * keep-alive upstream connections, active health checks, failure counting
 * and ejection, and the worker lists a reload replaces. Loop thread only;
 * a worker's slot (in-flight count, counters) is shared with the other
 * loops' worker of the same URL (serve_types.h). */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

const char *const eldr__role_name[2] = {"prefill", "decode"};

/* ---- workers ----------------------------------------------------------------- */

static void health_timeout_cb(evutil_socket_t fd, short ev, void *arg);

/* A worker for url, resolved, with an idle pool of pool_size; not listed in
 * s->all_workers (eldr__workers_commit lists it). Errors name the URL:
 * ELDR_EINVAL (bad URL, does not resolve), ELDR_ENOMEM. */
static int worker_new(eldr_server *s, const char *url, int role, size_t pool_size, worker **out,
                      eldr_diag *d) {
  *out = NULL;
  worker *w = calloc(1, sizeof *w);
  if (!w) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for worker %s", url);
  w->s = s;
  w->id = ++s->next_worker_id;
  w->role = role;
  w->url = strdup(url);
  w->poolcap = pool_size ? pool_size : 1;
  w->pool = calloc(w->poolcap, sizeof *w->pool);
  w->hc_timer = evtimer_new(s->base, health_timeout_cb, w);
  w->slot = eldr__slot_get(s->grp, role, url);
  int rc = 0;
  if (!w->url || !w->pool || !w->hc_timer || !w->slot) rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for worker %s", url);
  else if ((rc = eldr_serve_parse_url(url, w->host, sizeof w->host, &w->port, d))) {
  } else if ((rc = eldr__worker_resolve_start(w))) {
    rc = eldr_diag_fail(d, rc, "%s worker %s: cannot use address '%s'", eldr__role_name[role], url, w->host);
  }
  if (rc) {
    eldr__worker_resolve_stop(w);
    if (w->hc_timer) event_free(w->hc_timer);
    eldr__slot_put(s->grp, w->slot);
    free(w->url);
    free(w->pool);
    free(w);
    return rc;
  }
  snprintf(w->hosthdr, sizeof w->hosthdr, strchr(w->host, ':') ? "[%s]:%d" : "%s:%d", w->host, w->port);
  *out = w;
  return 0;
}

static void unlink_worker(worker *w) {
  for (worker **p = &w->s->all_workers; *p; p = &(*p)->next_all)
    if (*p == w) {
      *p = w->next_all;
      break;
    }
  w->next_all = NULL;
}

void eldr__worker_free(worker *w) {
  if (!w) return;
  unlink_worker(w);
  for (size_t i = 0; i < w->npool; i++) eldr_up_free(w->pool[i]);
  eldr_up_free(w->hc);
  eldr__worker_resolve_stop(w);
  eldr__scrape_stop(w);
  event_free(w->hc_timer);
  eldr__slot_put(w->s->grp, w->slot);
  free(w->pool);
  free(w->url);
  free(w);
}

/* Out of service (a reload dropped it): no new legs; idle connections and
 * the health check closed; freed now when no leg is in flight, else by the
 * eldr__worker_put of its last leg. */
static void worker_retire(worker *w) {
  w->retired = 1;
  for (size_t i = 0; i < w->npool; i++) eldr_up_free(w->pool[i]);
  w->npool = 0;
  evtimer_del(w->hc_timer);
  eldr__worker_resolve_stop(w);
  eldr__scrape_stop(w);
  eldr_up_free(w->hc); /* a health check in flight ends without a callback */
  w->hc = NULL;
  if (!w->inflight) eldr__worker_free(w);
}

void eldr__worker_put(worker *w, eldr_up *u) {
  w->inflight--;
  w->slot->inflight--; /* every loop's decisions see it */
  eldr__pool_give(w, u);
  if (w->retired && !w->inflight) eldr__worker_free(w);
}

eldr_up *eldr__pool_take(worker *w) {
  if (w->npool) return w->pool[--w->npool];
  if (!w->addrlen) return NULL; /* not resolved (never chosen: unhealthy) */
  eldr_up *u = eldr_up_new(w->s->base, (struct sockaddr *)&w->addr, w->addrlen);
  if (u) eldr_up_set_connect_timeout(u, w->s->cfg.connect_timeout_s);
  return u;
}

/* A pooled connection keeps at most this much of request/reply buffers. */
#define POOL_KEEP_BYTES (256u << 10)

void eldr__pool_give(worker *w, eldr_up *u) {
  if (!u) return;
  eldr_up_trim(u, POOL_KEEP_BYTES); /* no-op while active; a large body's buffer goes */
  if (!w->retired && w->npool < w->s->cfg.pool_size && w->npool < w->poolcap && !eldr_up_active(u)) {
    w->pool[w->npool++] = u;
    return;
  }
  eldr_up_free(u); /* deferred by the connection itself inside its callbacks */
}

void eldr__worker_failed(worker *w, const char *why) {
  eldr__slot *sl = w->slot;
  int fails = ++sl->fails;
  /* one loop ejects it (the exchange), for every loop */
  if (w->s->cfg.health_interval_s > 0 && fails >= w->s->cfg.eject_after && atomic_exchange(&sl->healthy, 0)) {
    sl->ejections++;
    eldr__logf(w->s, "%s worker %s ejected after %d consecutive failures (%s)", eldr__role_name[w->role],
          w->url, fails, why);
  }
}

static void health_result(worker *w, int ok, const char *why) {
  evtimer_del(w->hc_timer);
  if (ok) atomic_store(&w->slot->answered_ns, eldr__now_ns());
  if (eldr__hang_probe_done(w, ok, why)) return; /* a hang probe: hang.c decided */
  if (ok) {
    w->slot->fails = 0;
    w->slot->probed = 1;
    if (!w->retired && !atomic_exchange(&w->slot->healthy, 1)) {
      eldr__logf(w->s, "%s worker %s re-admitted", eldr__role_name[w->role], w->url);
    }
  } else if (!eldr__hang_progressing(w)) { /* a slow /health of a worker whose legs progress is no failure */
    eldr__worker_failed(w, why);
  }
}

static void hc_head(void *arg, int status, const char *ctype) {
  (void)ctype;
  ((worker *)arg)->hc_status = status;
}
static void hc_data(void *arg, const char *p, size_t n) {
  (void)arg;
  (void)p;
  (void)n;
}
static void hc_done(void *arg, int err) {
  worker *w = arg;
  if (err == ELDR_ENOMEM) { /* no socket: the router's fds are exhausted, no verdict on w */
    evtimer_del(w->hc_timer);
    w->hc_hang = 0;
    return;
  }
  health_result(w, err == 0 && w->hc_status == 200, err ? "health check failed" : "health check status");
}
static const eldr_up_cbs hc_cbs = {hc_head, hc_data, hc_done};

static void health_timeout_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  worker *w = arg;
  if (!w->hc || !eldr_up_active(w->hc)) return;
  eldr_up_abort(w->hc);
  health_result(w, 0, "health check timed out");
}

int eldr__health_check(worker *w) {
  eldr_server *s = w->s;
  if (!w->addrlen || w->retired) return -1; /* still resolving, or gone */
  if (!w->hc) w->hc = eldr_up_new(s->base, (struct sockaddr *)&w->addr, w->addrlen);
  if (!w->hc) return -1;
  if (eldr_up_active(w->hc)) return 0; /* the one in flight answers */
  char req[400];
  int n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", w->hosthdr);
  struct iovec iov = {req, (size_t)n};
  w->hc_status = 0;
  if (eldr_up_request(w->hc, &iov, 1, &hc_cbs, w) != 0) return -1;
  /* its own short bound, connect included (a stopped process's kernel
   * still accepts: only the answer tells) */
  struct timeval tv = eldr__tv_of(s->cfg.health_timeout_s);
  evtimer_add(w->hc_timer, &tv);
  return 0;
}

void eldr__health_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) (void)eldr__health_check(s->w[role][i]);
}

void eldr__workers_drop(worker_plan *p) {
  for (int role = 0; role < 2; role++) {
    for (size_t i = 0; p->grown[role] && i < p->nw[role]; i++) free(p->grown[role][i]);
    free(p->grown[role]);
    free(p->w[role]);
  }
  while (p->fresh) {
    worker *w = p->fresh;
    p->fresh = w->next_all;
    w->next_all = NULL;
    eldr__worker_free(w);
  }
  memset(p, 0, sizeof *p);
}

static int plan_urls(eldr_server *s, const eldr_serve_config *cfg, char **urls[2], const size_t nn[2],
                     size_t cap, worker_plan *p, eldr_diag *d);

int eldr__workers_plan(eldr_server *s, const eldr_serve_config *cfg, worker_plan *p, eldr_diag *d) {
  memset(p, 0, sizeof *p);
  /* the configured URLs, then the current addresses of its DNS groups */
  size_t nn[2] = {cfg->n_prefill, cfg->n_decode};
  char **urls[2] = {NULL, NULL};
  size_t cap = cfg->pool_size ? cfg->pool_size : 1;
  for (int role = 0; role < 2; role++) {
    char **specs = role ? cfg->decode_dns : cfg->prefill_dns;
    size_t ns = role ? cfg->n_decode_dns : cfg->n_prefill_dns;
    for (size_t i = 0; i < ns; i++) {
      const dns_group *g = eldr__dns_group_find(s, role, specs[i]);
      if (g) nn[role] += g->n;
    }
    if (!(urls[role] = malloc((nn[role] ? nn[role] : 1) * sizeof *urls[role]))) {
      free(urls[0]);
      return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the worker lists");
    }
    size_t k = role ? cfg->n_decode : cfg->n_prefill;
    if (k) memcpy(urls[role], role ? cfg->decode : cfg->prefill, k * sizeof *urls[role]);
    for (size_t i = 0; i < ns; i++) {
      const dns_group *g = eldr__dns_group_find(s, role, specs[i]);
      for (size_t j = 0; g && j < g->n; j++) urls[role][k++] = g->urls[j];
    }
  }
  int rc = plan_urls(s, cfg, urls, nn, cap, p, d);
  free(urls[0]);
  free(urls[1]);
  return rc;
}

static int plan_urls(eldr_server *s, const eldr_serve_config *cfg, char **urls[2], const size_t nn[2],
                     size_t cap, worker_plan *p, eldr_diag *d) {
  for (int role = 0; role < 2; role++) {
    p->nw[role] = nn[role];
    p->w[role] = calloc(nn[role] ? nn[role] : 1, sizeof *p->w[role]);
    p->grown[role] = calloc(nn[role] ? nn[role] : 1, sizeof *p->grown[role]);
    if (!p->w[role] || !p->grown[role]) goto nomem;
    for (size_t i = 0; i < nn[role]; i++) {
      worker *w = NULL;
      for (size_t j = 0; j < s->nw[role] && !w; j++)
        if (!strcmp(s->w[role][j]->url, urls[role][i])) w = s->w[role][j];
      for (size_t j = 0; j < i && w; j++) /* a URL listed twice gets two workers */
        if (p->w[role][j] == w) w = NULL;
      if (!w) {
        int rc = worker_new(s, urls[role][i], role, cfg->pool_size, &w, d);
        if (rc) {
          eldr__workers_drop(p);
          return rc;
        }
        w->next_all = p->fresh;
        p->fresh = w;
      } else if (w->poolcap < cap && !(p->grown[role][i] = calloc(cap, sizeof *w->pool))) {
        goto nomem;
      }
      p->w[role][i] = w;
    }
  }
  return 0;
nomem:
  eldr__workers_drop(p);
  return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the worker lists");
}

void eldr__workers_commit(eldr_server *s, worker_plan *p) {
  size_t cap = s->cfg.pool_size; /* the committed configuration's */
  while (p->fresh) { /* list the new workers */
    worker *w = p->fresh;
    p->fresh = w->next_all;
    w->next_all = s->all_workers;
    s->all_workers = w;
  }
  for (int role = 0; role < 2; role++) {
    for (size_t i = 0; i < p->nw[role]; i++) { /* idle pools to the new size */
      worker *w = p->w[role][i];
      if (p->grown[role][i]) {
        memcpy(p->grown[role][i], w->pool, w->npool * sizeof *w->pool);
        free(w->pool);
        w->pool = p->grown[role][i];
        w->poolcap = cap ? cap : 1;
      }
      while (w->npool > cap) eldr_up_free(w->pool[--w->npool]);
    }
    worker **old = s->w[role];
    size_t nold = s->nw[role];
    s->w[role] = p->w[role];
    s->nw[role] = p->nw[role];
    for (size_t j = 0; j < nold; j++) {
      int kept = 0;
      for (size_t i = 0; i < p->nw[role]; i++) kept |= p->w[role][i] == old[j];
      if (!kept) worker_retire(old[j]);
    }
    free(old);
    free(p->grown[role]);
  }
  memset(p, 0, sizeof *p);
}
