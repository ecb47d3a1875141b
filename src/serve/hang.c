/* hang.c — the hang detector: a worker is hung only when none of its legs
 * in flight made progress for hang_window AND a health probe does not
 * answer within health_timeout (its own short bound).
 *
 * Progress is any byte from the worker on any leg of any loop (the slot's
 * progress_ns, stamped by proxy.c's leg callbacks), or a leg started while
 * none was in flight (the clock starts when work arrives). A request
 * waiting in an engine's queue makes no progress, but its engine's other
 * streams do, or its engine answers the probe: it is never a hang, and it
 * is never answered 504 for it (only its own queue timeout,
 * decode_first_byte_timeout / decode_idle_timeout, may end that one
 * request; proxy.c). A stopped process (SIGSTOP) still accepts TCP
 * connections in its kernel, so only an answer tells: with the defaults
 * (window 5 s, probe 2 s, a tick every 0.5 s) it is ejected within 7.5 s of
 * its last byte, and every leg on it ends then (eldr__worker_hung).
 *
 * Loop 0 ticks (it runs the health checks); a probe is a health check
 * marked as one (workers.c), started at once or the one in flight taken
 * over. Verdicts end the legs of every loop (hung_gen, ev_hung). */
#include <stdio.h>

#include "serve_types.h"

/* The detector's tick: at most this, and a quarter of the window. */
#define HANG_TICK_MAX_S 0.5

static int64_t ns_of(double s) { return (int64_t)(s * 1e9); }

int eldr__hang_progressing(const worker *w) {
  const eldr__slot *sl = w->slot;
  double win = w->s->cfg.hang_window_s;
  return win > 0 && sl->inflight && eldr__now_ns() - atomic_load(&sl->progress_ns) < ns_of(win);
}

void eldr__hang_tick(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  double win = s->cfg.hang_window_s;
  if (!(win > 0)) return;
  int64_t now = eldr__now_ns();
  for (int role = 0; role < 2; role++)
    for (size_t i = 0; i < s->nw[role]; i++) {
      worker *w = s->w[role][i];
      eldr__slot *sl = w->slot;
      if (w->hc_hang || !atomic_load(&sl->inflight)) continue; /* a probe out, or no work to progress */
      int64_t p = atomic_load(&sl->progress_ns), a = atomic_load(&sl->answered_ns);
      if (now - (p > a ? p : a) < ns_of(win)) continue; /* progressed, or answered, within the window */
      w->hc_hang = 1;
      w->hc_progress = p;
      if (eldr__health_check(w) != 0) w->hc_hang = 0; /* no address or socket: the next tick tries again */
    }
}

void eldr__hang_schedule(eldr_server *s) {
  if (!s->ev_hang) return;
  event_del(s->ev_hang);
  double win = s->loop == 0 ? s->cfg.hang_window_s : 0; /* loop 0 probes for all */
  if (!(win > 0)) return;
  double tick = win / 4 < HANG_TICK_MAX_S ? win / 4 : HANG_TICK_MAX_S;
  struct timeval tv = eldr__tv_of(tick);
  if (event_add(s->ev_hang, &tv)) eldr__logf(s, "the hang detector could not be scheduled (every %g s)", tick);
}

int eldr__hang_probe_done(worker *w, int ok, const char *why) {
  if (!w->hc_hang) return 0;
  w->hc_hang = 0;
  eldr_server *s = w->s;
  eldr__slot *sl = w->slot;
  s->m.hang_probes[!ok]++;
  if (ok) return 0; /* answered: alive, whatever its queue; an ordinary good check */
  int64_t now = eldr__now_ns(), p = atomic_load(&sl->progress_ns);
  uint32_t legs = atomic_load(&sl->inflight);
  if (p != w->hc_progress || !legs || w->retired) return 0; /* it moved meanwhile, or nothing is cut */
  sl->hangs++;
  char msg[256];
  snprintf(msg, sizeof msg, "hung: %u leg%s in flight, no byte from it for %.1f s, and its health probe failed (%s)",
           legs, legs == 1 ? "" : "s", (double)(now - p) * 1e-9, why);
  eldr__logf(s, "%s worker %s %s: ejected, its legs ended", eldr__role_name[w->role], w->url, msg);
  eldr__worker_hung(w, msg);
  return 1;
}
