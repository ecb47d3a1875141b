/* accept.c — the listener on and off: the back-off after accept() errors,
 * and the file descriptor reserve that keeps a new client waiting in the
 * kernel's listen backlog, instead of accepted and then answered 502,
 * while the router could not open that client's upstream legs.
 *
 * The reserve. Linux hands out the lowest free descriptor, so when the next
 * free one is among the last R below RLIMIT_NOFILE (read once, at start),
 * at most R are free. The connection whose accept brought the router there
 * is served (the reserve is for its legs), and its loop's listener goes off
 * until a client connection of that loop closes, or the loop's timer (10 ms
 * doubling to 1 s while it lasts: other loops' closes and finished legs free
 * descriptors too) finds room again. R = 4 per event loop + 4:
 *   - per loop, the one connection each loop may still accept before it sees
 *     the reserve itself (each loop pauses only its own listener: a
 *     connection and everything it does stay on its loop, as the accept
 *     back-off does), and that connection's legs: prefill and decode (the
 *     SGLang flows open both at once) and one more for a retry or resend on
 *     a fresh connection or a hang probe;
 *   - 4 for what runs beside the requests: loop 0's health checks and
 *     scrapes, DNS lookups, a record or access log file opened.
 * R is at most a quarter of the limit, so that a small limit still serves,
 * and a loop with no client connection open resumes whatever the count (its
 * next connection pauses it again: one at a time, rather than none when the
 * router's own descriptors took all but the reserve). A limit that is
 * unlimited or above 2^21 never pauses.
 *
 * What the check sees: an accepted descriptor at or above limit - R - 1 costs
 * nothing to detect (its number says so). A hole below (a connection that
 * closed while higher descriptors stay open) hides how full the table is:
 * for 10 s after a pause ("tight"), every accept and every resume asks the
 * kernel for the next free descriptor (a dup and a close: two system calls),
 * so a client that takes a hole does not let the next one eat the reserve.
 * Outside that window a table full of holes can still be emptied without a
 * pause: the legs then fail as before, 502 "out of file descriptors".
 *
 * Threads: each loop's state (eldr_server fd_* and accept_* fields) is its
 * own and touched on its thread only; the metrics are atomics (ctr). */
#include <event2/listener.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/resource.h>
#include <unistd.h>

#include "serve_types.h"

#define FD_RESERVE_PER_LOOP 4
#define FD_RESERVE_SHARED 4
#define FD_TIGHT_S 10.0

/* accept() failed with something other than a transient error: typically
 * EMFILE/ENFILE (fds exhausted), which stays until some connection closes.
 * Listening on would spin the loop at 100% CPU on the ready socket; so the
 * listener is off for a delay that doubles from 10 ms to 1 s while the
 * errors last (the pending connections wait in the kernel's backlog), and
 * the log says so at most once per ACCEPT_LOG_S with the count in between.
 * The reserve's pause uses the same delays and log period. */
#define ACCEPT_DELAY_MIN_S 0.01
#define ACCEPT_DELAY_MAX_S 1.0
#define ACCEPT_LOG_S 10.0

static double next_delay(double d) {
  d = d > 0 ? d * 2 : ACCEPT_DELAY_MIN_S;
  return d > ACCEPT_DELAY_MAX_S ? ACCEPT_DELAY_MAX_S : d;
}

void eldr__accept_error_cb(struct evconnlistener *l, void *arg) {
  eldr_server *s = arg;
  int err = EVUTIL_SOCKET_ERROR();
  s->m.accept_errors++;
  evconnlistener_disable(l);
  double d = next_delay(s->accept_delay_s);
  s->accept_delay_s = d;
  struct timeval tv = eldr__tv_of(d);
  if (evtimer_add(s->ev_accept, &tv)) evconnlistener_enable(l); /* cannot wait: keep accepting */
  double now = eldr__now_s();
  if (now - s->accept_log_t >= ACCEPT_LOG_S) {
    eldr__logf(s, "accept failed: %s (%llu more since the last such line); new connections wait %g s "
                  "(up to %g s while it lasts)",
               evutil_socket_error_to_string(err), (unsigned long long)s->accept_suppressed, d,
               ACCEPT_DELAY_MAX_S);
    s->accept_log_t = now;
    s->accept_suppressed = 0;
  } else {
    s->accept_suppressed++;
  }
}

/* ---- the reserve ------------------------------------------------------------ */

void eldr__fd_reserve_init(eldr_server *s, int nloops) {
  s->fd_pause_at = INT_MAX; /* never */
  s->fd_reserve = 0;
  s->fd_limit = 0;
  s->fd_log_t = -1e9;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 21)) return;
  long lim = (long)rl.rlim_cur;
  long r = (long)FD_RESERVE_PER_LOOP * (nloops > 0 ? nloops : 1) + FD_RESERVE_SHARED;
  if (r > lim / 4) r = lim / 4;
  s->fd_limit = (int)lim;
  s->fd_reserve = (int)r;
  if (r > 0) s->fd_pause_at = (int)(lim - r);
}

/* The descriptor the process would get next (the lowest free), or INT_MAX
 * when there is none: a dup of the listening socket, closed at once. */
static int next_free_fd(const eldr_server *s) {
  int q = fcntl(evconnlistener_get_fd(s->lis), F_DUPFD_CLOEXEC, 0);
  if (q < 0) return INT_MAX;
  close(q);
  return q;
}

/* Room for one more client: the next free descriptor is below the reserve,
 * or this loop has no client connection (the router's own descriptors took
 * the rest: one connection at a time is served rather than none). */
static int fd_room(const eldr_server *s) { return !s->conns || next_free_fd(s) < s->fd_pause_at; }

static void fd_pause(eldr_server *s) {
  evconnlistener_disable(s->lis);
  s->fd_paused = 1;
  s->m.accept_paused_loops = 1;
  s->m.accept_pauses++;
  double now = eldr__now_s();
  s->fd_tight_until = now + FD_TIGHT_S;
  s->fd_delay_s = next_delay(0);
  struct timeval tv = eldr__tv_of(s->fd_delay_s);
  evtimer_add(s->ev_accept, &tv); /* failing: the close of the connection just accepted resumes it */
  if (now - s->fd_log_t >= ACCEPT_LOG_S) {
    eldr__logf(s, "accept paused on loop %d: at most %d of the %d file descriptors (RLIMIT_NOFILE) free, kept "
                  "for the upstream legs of the connections open (%llu more pauses since the last such line); "
                  "new connections wait in the listen backlog until one closes",
               s->loop, s->fd_reserve, s->fd_limit, (unsigned long long)s->fd_suppressed);
    s->fd_log_t = now;
    s->fd_suppressed = 0;
  } else {
    s->fd_suppressed++;
  }
}

static void fd_resume(eldr_server *s) {
  s->fd_paused = 0;
  s->m.accept_paused_loops = 0;
  s->fd_delay_s = 0;
  evtimer_del(s->ev_accept);
  evconnlistener_enable(s->lis);
}

void eldr__fd_reserve_accepted(eldr_server *s, int fd) {
  if (!s->lis || s->fd_paused) return;
  int shortage = fd >= s->fd_pause_at - 1; /* the next free one is above fd */
  if (!shortage && s->fd_tight_until > 0) {
    if (eldr__now_s() < s->fd_tight_until) shortage = next_free_fd(s) >= s->fd_pause_at;
    else s->fd_tight_until = 0;
  }
  if (shortage) fd_pause(s);
}

void eldr__fd_reserve_stop(eldr_server *s) {
  s->fd_paused = 0;
  s->m.accept_paused_loops = 0;
}

void eldr__fd_reserve_closed(eldr_server *s) {
  if (s->fd_paused && s->lis && fd_room(s)) fd_resume(s);
}

/* The timer: after an accept error, the listener back on; after a reserve
 * pause, back on if there is room, else asked again later. */
void eldr__accept_resume(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  if (!s->lis) return;
  if (!s->fd_paused) {
    evconnlistener_enable(s->lis);
    return;
  }
  if (fd_room(s)) {
    fd_resume(s);
    return;
  }
  s->fd_delay_s = next_delay(s->fd_delay_s);
  struct timeval tv = eldr__tv_of(s->fd_delay_s);
  if (evtimer_add(s->ev_accept, &tv)) fd_resume(s); /* cannot wait: accept (the legs may fail, 502) */
}
