/* workers.c — the router's workers: resolved address, pool of idle
 * keep-alive upstream connections, active health checks, failure counting
 * and ejection, and the worker lists a reload replaces. Loop thread only. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

const char *const eldr__role_name[2] = {"prefill", "decode"};

/* ---- workers ----------------------------------------------------------------- */

static void health_timeout_cb(evutil_socket_t fd, short ev, void *arg);

worker *eldr__worker_new(eldr_server *s, const char *url, int role) {
  worker *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->s = s;
  w->role = role;
  w->healthy = 1;
  w->url = strdup(url);
  w->pool = calloc(s->cfg.pool_size ? s->cfg.pool_size : 1, sizeof *w->pool);
  w->hc_timer = evtimer_new(s->base, health_timeout_cb, w);
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  char port[16];
  if (!w->url || !w->pool || !w->hc_timer ||
      eldr_serve_parse_url(url, w->host, sizeof w->host, &w->port, NULL) ||
      (snprintf(port, sizeof port, "%d", w->port), getaddrinfo(w->host, port, &hints, &ai)) || !ai ||
      ai->ai_addrlen > sizeof w->addr) {
    if (ai) freeaddrinfo(ai);
    if (w->hc_timer) event_free(w->hc_timer);
    free(w->url);
    free(w->pool);
    free(w);
    return NULL;
  }
  memcpy(&w->addr, ai->ai_addr, ai->ai_addrlen);
  w->addrlen = (socklen_t)ai->ai_addrlen;
  freeaddrinfo(ai);
  snprintf(w->hosthdr, sizeof w->hosthdr, strchr(w->host, ':') ? "[%s]:%d" : "%s:%d", w->host, w->port);
  w->next_all = s->all_workers;
  s->all_workers = w;
  return w;
}

void eldr__worker_free(worker *w) {
  for (size_t i = 0; i < w->npool; i++) eldr__up_free(w->pool[i]);
  eldr__up_free(w->hc);
  event_free(w->hc_timer);
  free(w->pool);
  free(w->url);
  free(w);
}

eldr__up *eldr__pool_take(worker *w) {
  if (w->npool) return w->pool[--w->npool];
  eldr__up *u = eldr__up_new(w->s->base, (struct sockaddr *)&w->addr, w->addrlen);
  if (u) eldr__up_set_connect_timeout(u, w->s->cfg.connect_timeout_s);
  return u;
}

void eldr__pool_give(worker *w, eldr__up *u) {
  if (!u) return;
  if (!w->retired && w->npool < w->s->cfg.pool_size && !eldr__up_active(u)) {
    w->pool[w->npool++] = u;
    return;
  }
  eldr__up_free(u); /* deferred by the connection itself inside its callbacks */
}

void eldr__worker_failed(worker *w, const char *why) {
  w->fails++;
  if (w->s->cfg.health_interval_s > 0 && w->healthy && w->fails >= w->s->cfg.eject_after) {
    w->healthy = 0;
    w->ejections++;
    eldr__logf(w->s, "%s worker %s ejected after %d consecutive failures (%s)", eldr__role_name[w->role],
          w->url, w->fails, why);
  }
}

static void health_result(worker *w, int ok, const char *why) {
  evtimer_del(w->hc_timer);
  if (ok) {
    w->fails = 0;
    if (!w->healthy && !w->retired) {
      w->healthy = 1;
      eldr__logf(w->s, "%s worker %s re-admitted", eldr__role_name[w->role], w->url);
    }
  } else {
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
  health_result(w, err == 0 && w->hc_status == 200, err ? "health check failed" : "health check status");
}
static const eldr__up_cbs hc_cbs = {hc_head, hc_data, hc_done};

static void health_timeout_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  worker *w = arg;
  if (!w->hc || !eldr__up_active(w->hc)) return;
  eldr__up_abort(w->hc);
  health_result(w, 0, "health check timed out");
}

void eldr__health_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      worker *w = s->w[role][i];
      if (!w->hc) w->hc = eldr__up_new(s->base, (struct sockaddr *)&w->addr, w->addrlen);
      if (!w->hc || eldr__up_active(w->hc)) continue;
      char req[400];
      int n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", w->hosthdr);
      struct iovec iov = {req, (size_t)n};
      w->hc_status = 0;
      if (eldr__up_request(w->hc, &iov, 1, &hc_cbs, w) == 0) {
        struct timeval tv = eldr__tv_of(s->cfg.connect_timeout_s);
        evtimer_add(w->hc_timer, &tv);
      }
    }
}

int eldr__set_workers(eldr_server *s, const eldr_serve_config *cfg) {
  worker **nv[2] = {NULL, NULL};
  size_t nn[2] = {cfg->n_prefill, cfg->n_decode};
  char **urls[2] = {cfg->prefill, cfg->decode};
  for (int role = 0; role < 2; role++) {
    nv[role] = calloc(nn[role] ? nn[role] : 1, sizeof *nv[role]);
    if (!nv[role]) goto fail;
    for (size_t i = 0; i < nn[role]; i++) {
      worker *w = NULL;
      for (size_t j = 0; j < s->nw[role] && !w; j++)
        if (!strcmp(s->w[role][j]->url, urls[role][i])) w = s->w[role][j];
      for (size_t j = 0; j < i && w; j++) /* a URL listed twice gets two workers */
        if (nv[role][j] == w) w = NULL;
      if (!w) w = eldr__worker_new(s, urls[role][i], role);
      if (!w) goto fail;
      w->retired = 0;
      nv[role][i] = w;
    }
  }
  for (int role = 0; role < 2; role++) {
    for (size_t j = 0; j < s->nw[role]; j++) {
      worker *w = s->w[role][j];
      int kept = 0;
      for (size_t i = 0; i < nn[role]; i++) kept |= nv[role][i] == w;
      if (!kept) {
        w->retired = 1;
        w->healthy = 0;
        for (size_t i = 0; i < w->npool; i++) eldr__up_free(w->pool[i]);
        w->npool = 0;
      }
    }
    free(s->w[role]);
    s->w[role] = nv[role];
    s->nw[role] = nn[role];
  }
  return 0;
fail:
  free(nv[0]);
  free(nv[1]);
  return ELDR_ENOMEM;
}
