/* drain.c — graceful shutdown (eldr_server_drain; the first SIGTERM or
 * SIGINT of `eldr serve`), as vLLM's online-serving shutdown semantics ask
 * (vllm-project/vllm RFC #24885: stop accepting at once, let requests in
 * flight finish within a bounded wait, then exit; a second signal exits at
 * once):
 *
 *   1. the group is marked draining: GET /health answers 503
 *      {"status":"draining",...} at once (metrics.c), so a load balancer
 *      still probing an open connection takes the replica out;
 *   2. every loop closes its listener, after accepting what the kernel
 *      already completed (a connection in the backlog of a closed listener
 *      would be reset); those connections get DRAIN_FRESH_S to send their
 *      request, which is then served;
 *   3. idle keep-alive connections are closed; every response from now on
 *      carries Connection: close and its connection closes after it;
 *   4. loop 0 checks every DRAIN_TICK_S: once no client connection is open
 *      on any loop, or shutdown_timeout has passed (the rest is cut, and
 *      logged), every loop stops and eldr_server_run returns 0.
 *
 * Threads: eldr_server_drain from any thread (an atomic flag, then
 * event_active on each loop); each loop drains its own connections on its
 * own thread; the check runs on loop 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <event2/listener.h>
#include <signal.h>
#include <sys/socket.h>

#include "serve_types.h"

/* Connections accepted from the backlog at drain time: this long to send a
 * request before they are closed. */
#define DRAIN_FRESH_S 1.0
/* How often loop 0 checks whether the drain is over. */
#define DRAIN_TICK_S 0.05

int eldr__draining(const eldr_server *s) { return s->grp && atomic_load(&s->grp->draining) != 0; }

/* Loop 0's check: done when no connection is open anywhere, or at the deadline. */
static void drain_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  eldr__group *g = s->grp;
  size_t open = 0;
  for (int i = 0; i < g->n; i++) open += atomic_load(&g->loops[i]->nconns); /* (connections refused at the limit close by themselves) */
  double now = eldr__now_s();
  if (open && now < atomic_load(&g->drain_deadline)) {
    struct timeval tv = eldr__tv_of(DRAIN_TICK_S);
    evtimer_add(s->ev_drain_tick, &tv);
    return;
  }
  if (open)
    eldr__logf(s, "shutdown timeout (%g s): %zu client connection%s still busy are closed now",
               s->cfg.shutdown_timeout_s, open, open == 1 ? "" : "s");
  else
    eldr__logf(s, "drained in %.2f s: the %zu connection%s busy at the signal finished (%zu idle ones closed); stopping",
               now - atomic_load(&g->drain_start), atomic_load(&g->drain_busy),
               atomic_load(&g->drain_busy) == 1 ? "" : "s", atomic_load(&g->drain_idle));
  eldr_server_stop(s);
}

/* This loop's part: close its listener (after taking what its backlog
 * holds) and its idle connections; from now on responses close theirs. */
static void drain_loop(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  hconn *next;
  size_t idle = 0, busy = 0;
  for (hconn *c = s->conns; c; c = next) { /* idle keep-alive: nothing in flight, nothing read */
    next = c->next;
    c->keep_alive = 0; /* a response in progress closes its connection */
    if (c->state == C_HEAD && !c->r && c->in.n == c->inoff && !c->in_process) {
      eldr__conn_free(c);
      idle++;
    } else {
      busy++;
    }
  }
  atomic_fetch_add(&s->grp->drain_idle, idle);
  atomic_fetch_add(&s->grp->drain_busy, busy);
  if (s->lis) {
    evconnlistener_disable(s->lis);
    evutil_socket_t lfd = evconnlistener_get_fd(s->lis);
    for (int k = 0; k < 4096; k++) { /* what the kernel completed is served, not reset */
      struct sockaddr_storage sa;
      socklen_t sl = sizeof sa;
      int cfd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (cfd < 0) {
        if (errno == EINTR) continue;
        break; /* EAGAIN: the backlog is empty (or an error: nothing more to take) */
      }
      hconn *before = s->conns;
      eldr__accept_cb(s->lis, cfd, (struct sockaddr *)&sa, (int)sl, s);
      if (s->conns != before && s->conns) { /* a short leash to send its request */
        struct timeval tv = eldr__tv_of(DRAIN_FRESH_S);
        evtimer_add(s->conns->deadline, &tv);
      }
    }
    evconnlistener_free(s->lis);
    s->lis = NULL;
    if (s->ev_accept) evtimer_del(s->ev_accept);
    eldr__fd_reserve_stop(s);
  }
  if (s->loop == 0) drain_tick(-1, 0, s);
}

int eldr__drain_init(eldr_server *s) {
  s->ev_drain = event_new(s->base, -1, 0, drain_loop, s);
  s->ev_drain_tick = s->loop == 0 ? evtimer_new(s->base, drain_tick, s) : NULL;
  return s->ev_drain && (s->loop != 0 || s->ev_drain_tick) ? 0 : ELDR_ENOMEM;
}

void eldr_server_drain(eldr_server *s) {
  if (!s) return;
  eldr__group *g = s->grp;
  s = g->loops[0];
  if (atomic_exchange(&g->draining, 1)) { /* the second time: at once */
    size_t open = 0;
    for (int i = 0; i < g->n; i++) open += atomic_load(&g->loops[i]->nconns);
    eldr__logf(s, "second stop signal: stopping now (%zu client connection%s cut)", open, open == 1 ? "" : "s");
    eldr_server_stop(s);
    return;
  }
  double now = eldr__now_s();
  atomic_store(&g->drain_start, now);
  atomic_store(&g->drain_deadline, now + s->cfg.shutdown_timeout_s);
  size_t open = 0;
  for (int i = 0; i < g->n; i++) open += atomic_load(&g->loops[i]->nconns);
  eldr__logf(s, "draining: /health answers 503, the listener is closed, requests in flight on the %zu open client "
                "connection%s finish within %g s (--shutdown-timeout); a second signal stops at once",
             open, open == 1 ? "" : "s", s->cfg.shutdown_timeout_s);
  for (int i = 0; i < g->n; i++)
    if (g->loops[i]->ev_drain) event_active(g->loops[i]->ev_drain, EV_TIMEOUT, 0);
}

/* SIGTERM / SIGINT on loop 0 (cfg.handle_signals). */
void eldr__drain_signal(evutil_socket_t fd, short ev, void *arg) {
  (void)ev;
  eldr_server *s = arg;
  if (!atomic_load(&s->grp->draining)) eldr__logf(s, "%s received", fd == SIGINT ? "SIGINT" : "SIGTERM");
  eldr_server_drain(s);
}
