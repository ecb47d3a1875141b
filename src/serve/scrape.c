/* scrape.c — load from the engines themselves: every scrape_interval each
 * listed, resolved worker's GET /metrics (vLLM's Prometheus text) is read
 * over the router's own upstream client, bounded in size and time, and
 * vllm:num_requests_running + vllm:num_requests_waiting (summed over the
 * engine's series) become the worker's scraped load. A decision then uses
 * scraped + (this replica's in-flight legs now - at the scrape), never less
 * than this replica's own in-flight legs: replicas in front of the same
 * engines see each other's load within one interval, and their own
 * decisions since immediately. Loop 0 scrapes; what it read is published
 * in the worker's slot, which every loop's decisions read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

#define SCRAPE_MAX (2u << 20) /* largest /metrics reply read */

/* Sum of the values of every series of `name` in Prometheus text; -1 when
 * the metric is absent. */
static double prom_sum(const char *text, size_t len, const char *name) {
  size_t nl = strlen(name);
  double sum = -1;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    if ((size_t)(eol - p) > nl && !memcmp(p, name, nl) && (p[nl] == '{' || p[nl] == ' ')) {
      const char *v = eol;
      while (v > p && v[-1] != ' ' && v[-1] != '}') v--; /* the value: last field */
      char buf[64];
      size_t vl = (size_t)(eol - v);
      if (vl && vl < sizeof buf) {
        memcpy(buf, v, vl);
        buf[vl] = 0;
        char *e;
        double x = strtod(buf, &e);
        if (e != buf && x >= 0 && x < 1e12) sum = (sum < 0 ? 0 : sum) + x;
      }
    }
    p = eol + 1;
  }
  return sum;
}

/* w's scrape state into its slot (loop 0's workers; tests' workers have none). */
static void publish(worker *w) {
  if (!w->slot) return;
  w->slot->scraped = w->scraped;
  w->slot->inflight_at_scrape = w->inflight_at_scrape;
  w->slot->scrape_valid = w->scrape_valid;
}

void eldr__scrape_parse(worker *w, const char *text, size_t len) {
  double run = prom_sum(text, len, "vllm:num_requests_running");
  double wait = prom_sum(text, len, "vllm:num_requests_waiting");
  double kv = prom_sum(text, len, "vllm:kv_cache_usage_perc");
  if (run < 0 && wait < 0) {
    w->scrape_valid = 0;
    w->s->m.scrapes[1]++;
    publish(w);
    return;
  }
  /* each value is below 1e12, but a hostile page may repeat a series many
   * times: clamp the sum before converting it (no engine queues 1e9) */
  double tot = (run > 0 ? run : 0) + (wait > 0 ? wait : 0) + 0.5;
  w->scraped = tot < 1e9 ? (uint32_t)tot : (uint32_t)1e9;
  w->scraped_kv = kv;
  w->scrape_valid = 1;
  w->s->m.scrapes[0]++;
  publish(w);
}

uint32_t eldr__worker_load_at(const worker *w, uint32_t inflight) {
  const eldr__slot *sl = w->slot;
  if (w->role == ROLE_DECODE && eldr__bus_up(w->s && w->s->grp ? w->s->grp->bus : NULL)) /* the fleet's own counts */
    return inflight + eldr__bus_peer_load(w);
  if (!(sl ? sl->scrape_valid : w->scrape_valid)) return inflight;
  uint32_t scraped = sl ? sl->scraped : w->scraped, at = sl ? sl->inflight_at_scrape : w->inflight_at_scrape;
  int64_t l = (int64_t)scraped + (int64_t)inflight - (int64_t)at;
  return l > (int64_t)inflight ? (uint32_t)l : inflight;
}

uint32_t eldr__worker_load(const worker *w) {
  return eldr__worker_load_at(w, w->slot ? w->slot->inflight : w->inflight);
}

static void sc_head(void *arg, int status, const char *ctype) {
  (void)ctype;
  ((worker *)arg)->sc_status = status;
}

static void sc_data(void *arg, const char *p, size_t n) {
  worker *w = arg;
  if (w->sc_n + n > SCRAPE_MAX) { /* too large: given up at done */
    w->sc_n = SCRAPE_MAX + 1;
    return;
  }
  if (w->sc_n + n > w->sc_cap) {
    size_t cap = w->sc_cap ? w->sc_cap : 16384;
    while (cap < w->sc_n + n) cap *= 2;
    char *b = realloc(w->sc_buf, cap);
    if (!b) {
      w->sc_n = SCRAPE_MAX + 1;
      return;
    }
    w->sc_buf = b;
    w->sc_cap = cap;
  }
  memcpy(w->sc_buf + w->sc_n, p, n);
  w->sc_n += n;
}

static void sc_done(void *arg, int err) {
  worker *w = arg;
  if (err || w->sc_status != 200 || w->sc_n > SCRAPE_MAX) {
    w->scrape_valid = 0;
    w->s->m.scrapes[1]++;
    publish(w);
  } else {
    eldr__scrape_parse(w, w->sc_buf, w->sc_n);
  }
  w->sc_n = 0;
  if (w->sc_cap > (256u << 10)) { /* a large reply's buffer does not stay */
    free(w->sc_buf);
    w->sc_buf = NULL;
    w->sc_cap = 0;
  }
}

static const eldr_up_cbs sc_cbs = {sc_head, sc_data, sc_done};

void eldr__scrape_stop(worker *w) {
  eldr_up_free(w->sc); /* an exchange in flight ends without a callback */
  w->sc = NULL;
  free(w->sc_buf);
  w->sc_buf = NULL;
  w->sc_n = w->sc_cap = 0;
  w->scrape_valid = 0;
}

void eldr__scrape_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      worker *w = s->w[role][i];
      if (!w->addrlen) continue;
      if (w->sc && eldr_up_active(w->sc)) { /* the last one took a whole interval */
        eldr_up_abort(w->sc);
        w->scrape_valid = 0;
        w->s->m.scrapes[1]++;
        publish(w);
        w->sc_n = 0;
      }
      if (!w->sc) {
        w->sc = eldr_up_new(s->base, (struct sockaddr *)&w->addr, w->addrlen);
        if (!w->sc) continue;
        eldr_up_set_connect_timeout(w->sc, s->cfg.connect_timeout_s);
      }
      char req[400];
      int n = snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n", w->hosthdr);
      struct iovec iov = {req, (size_t)n};
      w->sc_status = 0;
      w->sc_n = 0;
      if (eldr_up_request(w->sc, &iov, 1, &sc_cbs, w) == 0) w->inflight_at_scrape = w->slot->inflight;
    }
}

void eldr__scrape_schedule(eldr_server *s, double old_interval) {
  if (s->loop) { /* loop 0 scrapes for all */
    event_del(s->ev_scrape);
    return;
  }
  double si = s->cfg.scrape_interval_s;
  if (si == old_interval && (si <= 0 || evtimer_pending(s->ev_scrape, NULL))) return;
  event_del(s->ev_scrape);
  struct timeval tv = eldr__tv_of(si);
  if (si > 0 && event_add(s->ev_scrape, &tv)) eldr__logf(s, "scrapes could not be scheduled (every %g s)", si);
  if (!(si > 0))
    for (worker *w = s->all_workers; w; w = w->next_all) {
      w->scrape_valid = 0;
      publish(w);
    }
}
