/* server.c — the eldr router's lifecycle: create (artifact, workers,
 * listening socket, timers, signals), run, stop, reload, free. The parts:
 * conn.c (clients), proxy.c (requests), workers.c, metrics.c, sigpath.c
 * (serve_types.h says which does what). cfg.threads loops: each is one
 * eldr_server with its own event loop and SO_REUSEPORT listener; loop 0 is
 * the handle, owns the group (loops.c) and the signals, and leads reloads. */
#include <unistd.h>
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "busmsg.h"
#include "eldr/cpu.h"
#include "serve_types.h"

static void vlogf(eldr_server *s, const char *fmt, va_list ap) {
  if (!s->cfg.log) return;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  if (s->grp) pthread_mutex_lock(&s->grp->logmu);
  s->cfg.log(s->cfg.log_ctx, line);
  if (s->grp) pthread_mutex_unlock(&s->grp->logmu);
}

void eldr__logf(eldr_server *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlogf(s, fmt, ap);
  va_end(ap);
}

void eldr__logf_process(eldr_server *s, const char *fmt, ...) {
  if (s->loop != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vlogf(s, fmt, ap);
  va_end(ap);
}

/* ---- memory ------------------------------------------------------------------ */

/* The heap is trimmed this long after a large request ended: a burst of
 * them costs one trim (a few ms over a large heap), at most 5 per second. */
#define TRIM_DELAY_S 0.2

void eldr__mem_note(eldr_server *s, size_t bytes) {
  s->trim_bytes += bytes;
  if (!s->ev_trim || evtimer_pending(s->ev_trim, NULL)) return;
  struct timeval tv = eldr__tv_of(TRIM_DELAY_S); /* coalesces a burst of large requests */
  evtimer_add(s->ev_trim, &tv);
}

static void mem_trim(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  s->trim_bytes = 0;
  s->m.mem_trims++;
  /* glibc keeps freed heap (and raises its mmap threshold after large
   * frees): hand the free pages back to the OS */
  malloc_trim(0);
}

/* The loop's buffer pool freed a buffer: the heap is trimmed soon. */
static void pool_freed(void *arg, size_t bytes) { eldr__mem_note(arg, bytes); }

/* max_connections, or half the fd limit when 0. */
static size_t resolve_max_conns(const eldr_serve_config *c) {
  if (c->max_connections) return c->max_connections;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1u << 21))
    return 1u << 20;
  size_t n = (size_t)rl.rlim_cur / 2;
  return n ? n : 1;
}

/* ---- artifact, workers, reload --------------------------------------------- */

/* Load and check an artifact against what the server knows (every loop's
 * observed shape): done once per start or reload, by the leading loop. */
static int load_artifact(eldr_server *s, const char *path, eldr__art **out, eldr_diag *d) {
  *out = NULL;
  if (!path) return 0;
  eldr_artifact *a = NULL;
  int rc = eldr_artifact_load(path, &a, d);
  if (rc) return rc;
  if ((rc = eldr__artifact_servable(a, path, d))) {
    eldr_artifact_free(a);
    return rc;
  }
  for (int i = 0; i < s->grp->n; i++) { /* the shape any loop saw */
    const eldr_server *x = s->grp->loops[i];
    int L = x ? x->sp.observed_L : 0, K = x ? x->sp.observed_K : 0;
    if (L && (!eldr_re_layers_fit((size_t)L, a->shape.num_layers, a->layer_ids) || (int)a->shape.top_k != K)) {
      rc = eldr_diag_fail(d, ELDR_ESHAPE,
                          "artifact %s is for %u MoE layers (model layers %u..%u) x top-%u but the workers' "
                          "routed_experts are %d layers x top-%d: refused",
                          path, a->shape.num_layers, a->layer_ids[0], a->layer_ids[a->shape.num_layers - 1],
                          a->shape.top_k, L, K);
      eldr_artifact_free(a);
      return rc;
    }
  }
  if (!(*out = eldr__art_wrap(a))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for artifact %s", path);
  return 0;
}

/* Everything a reload replaces, built off to the side (stage_build), then
 * swapped in by stage_commit, which cannot fail, or dropped. */
typedef struct stage {
  eldr_serve_config cfg;
  eldr__art *art;
  eldr_policy pol;
  eldr__fpstate *fps;
  eldr__sigconf sig;
  worker_plan wp;
  eldr__watchst *watch;
} stage;

static void stage_drop(eldr_server *s, stage *st) {
  eldr__watchst_free(st->watch);
  eldr__workers_drop(&st->wp);
  eldr__sigconf_drop(&s->sp, &st->sig);
  eldr__fps_put(st->fps);
  eldr__art_put(st->art);
  eldr_serve_config_free(&st->cfg);
}

/* base: the configuration to start from; reread: apply the config file
 * (cfg.config_path) and then the command-line overrides over it. lead: this
 * loop loads and validates the artifact; else it takes a reference on
 * `given`, the one the leading loop loaded for the same configuration
 * (NULL: none), and never opens the file. */
static int stage_build(eldr_server *s, const eldr_serve_config *base, int reread, int lead, eldr__art *given,
                       stage *st, eldr_diag *d) {
  memset(st, 0, sizeof *st);
  int rc = eldr_serve_config_copy(&st->cfg, base);
  if (rc) return eldr_diag_fail(d, rc, "out of memory for the configuration");
  eldr_serve_config *c = &st->cfg;
  if (reread && c->config_path && (rc = eldr_serve_config_load(c, c->config_path, d))) goto fail;
  if (reread && c->overrides && (rc = eldr_serve_config_parse(c, c->overrides, strlen(c->overrides), d))) {
    eldr_diag_prefix(d, "command-line flags");
    goto fail;
  }
  if ((rc = eldr_serve_config_validate(c, d))) goto fail;
  if (lead && (rc = load_artifact(s, c->artifact, &st->art, d))) goto fail;
  if (!lead) st->art = eldr__art_ref(given);
  const eldr_artifact *a = st->art ? st->art->a : NULL;
  double tau = c->tau >= 0 ? c->tau : a ? a->tau : 0.1;
  if ((rc = eldr_policy_init(&st->pol, c->policy, tau, c->seed, a ? a->centroids : NULL, a ? a->k : 0,
                             a ? a->dim : 0, 1))) {
    rc = eldr_diag_fail(d, rc, "policy %s cannot be initialised (tau %g)", eldr_policy_name(c->policy), tau);
    goto fail;
  }
  if ((rc = eldr__sigconf_build(&s->sp, a, eldr__sigcache_capacity(a, c->sigcache_rows, c->sig_cache_mb), &st->sig, d)))
    goto fail;
  if ((rc = eldr__workers_plan(s, c, &st->wp, d))) goto fail;
  if ((rc = eldr__fps_new(st->art, c, st->wp.nw[1], &st->fps, d))) goto fail;
  eldr_policy_attach_footprint(&st->pol, st->fps ? st->fps->fp : NULL);
  if ((rc = eldr__watchst_new(s, a, c, &st->watch, d))) goto fail;
  return 0;
fail:
  stage_drop(s, st);
  return rc;
}

static void stage_commit(eldr_server *s, stage *st) {
  double old_health = s->cfg.health_interval_s, old_scrape = s->cfg.scrape_interval_s;
  eldr_serve_config_free(&s->cfg);
  s->cfg = st->cfg;
  eldr__sigpath_commit(&s->sp, &st->sig);
  eldr__art_put(s->artref);
  s->artref = st->art;
  s->art = s->artref ? s->artref->a : NULL;
  atomic_store(&s->art_hash, s->art ? s->art->text_hash : 0);
  s->pol = st->pol;
  size_t nl = s->grp ? (size_t)s->grp->n : 1; /* each loop takes its share */
  s->max_conns = (resolve_max_conns(&s->cfg) + nl - 1) / nl;
  eldr__fps_put(s->fps); /* the old generation lives on while its tickets do */
  s->fps = st->fps;
  eldr__busview_stale(s->bv); /* the new footprint starts without the others' weights */
  s->logged_fp = 0;
  eldr__watch_commit(s, st->watch);
  if (s->cfg.policy == ELDR_POLICY_FOOTPRINT && !s->fps) /* every loop commits the same */
    eldr__logf_process(s, "footprint: %s: it runs as JSQ",
               !s->art ? "no artifact" : !s->art->latency
                   ? "the artifact carries no latency coefficients (refit with `eldr fit --model M --hardware H`)"
                   : "no decode workers listed yet");
  eldr__workers_commit(s, &st->wp);
  s->logged_shape_mismatch = 0;
  /* health checks at the new interval; without them nothing re-admits an
   * ejected worker (and nothing ejects one): re-admit them all */
  double hi = s->loop == 0 ? s->cfg.health_interval_s : 0; /* loop 0 checks for all */
  if (hi != old_health || !evtimer_pending(s->ev_health, NULL)) {
    event_del(s->ev_health);
    struct timeval tv = eldr__tv_of(hi);
    if (hi > 0 && event_add(s->ev_health, &tv))
      eldr__logf(s, "health checks could not be scheduled (every %g s)", hi);
  }
  if (!(s->cfg.health_interval_s > 0))
    for (int role = 0; role < 2; role++)
      for (size_t i = 0; i < s->nw[role]; i++) {
        s->w[role][i]->slot->healthy = 1; /* picked once resolved */
        s->w[role][i]->slot->fails = 0;
      }
  memset(st, 0, sizeof *st);
  eldr__dns_sync(s);
  eldr__scrape_schedule(s, old_scrape);
  eldr__hang_schedule(s);
  eldr__record_commit(s);
  const eldr_artifact *a = s->art;
  if (a && a->k != s->nw[ROLE_DECODE] && s->nw[ROLE_DECODE]) {
    size_t n = s->nw[ROLE_DECODE];
    if (n > a->k)
      eldr__logf_process(s, "artifact has %zu centroids for %zu decode workers: decoder i uses centroid i %% %zu "
                    "(decoders sharing a centroid split its traffic by load)", a->k, n, a->k);
    else
      eldr__logf_process(s, "artifact has %zu centroids for %zu decode workers: decoder i serves centroids i, i + %zu, ... "
                    "(its similarity is the best of theirs)", a->k, n, n);
  }
}

/* A loop committed a reload (loop 0 on SIGHUP, any loop on POST
 * /admin/reload): every other loop builds the same configuration (the file
 * is not re-read) on its own thread. Reloads are numbered under the group
 * mutex after they commit; a loop takes a configuration only if it is newer
 * than the one it runs, so two reloads racing on two loops end with every
 * loop on the later one. */
static void reload_followers(eldr_server *s) {
  eldr__group *g = s->grp;
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  uint64_t gen = s->cfg_gen = ++g->reload_gen;
  pthread_mutex_unlock(&g->mu);
  atomic_store(&s->run_gen, gen);
  for (int i = 0; i < g->n; i++) {
    eldr_server *f = g->loops[i];
    if (f == s) continue;
    eldr_serve_config *c = malloc(sizeof *c);
    if (!c || eldr_serve_config_copy(c, &s->cfg)) {
      free(c);
      eldr__logf(s, "reload: out of memory: event loop %d keeps its configuration", i);
      continue;
    }
    eldr__art *art = eldr__art_ref(s->artref), *old_art = NULL; /* the artifact this loop loaded: not read again */
    pthread_mutex_lock(&g->mu);
    eldr_serve_config *old = NULL;
    if (!f->follow_cfg || f->follow_gen < gen) { /* a newer one replaces one not yet taken */
      old = f->follow_cfg;
      old_art = f->follow_art;
      f->follow_cfg = c;
      f->follow_art = art;
      f->follow_gen = gen;
    } else {
      old = c;
      old_art = art;
    }
    pthread_mutex_unlock(&g->mu);
    if (old) eldr_serve_config_free(old);
    free(old);
    eldr__art_put(old_art);
    event_active(f->ev_reload, EV_TIMEOUT, 0);
  }
}

/* Build the configuration another loop committed, if it is newer than this
 * loop's. 1 when one was pending (taken or stale), else 0. */
static int follow_reload(eldr_server *s) {
  eldr__group *g = s->grp;
  pthread_mutex_lock(&g->mu);
  eldr_serve_config *c = s->follow_cfg;
  eldr__art *art = s->follow_art;
  uint64_t gen = s->follow_gen;
  s->follow_cfg = NULL;
  s->follow_art = NULL;
  int stale = c && gen <= s->cfg_gen;
  if (c && !stale) s->cfg_gen = gen;
  pthread_mutex_unlock(&g->mu);
  if (!c) return 0;
  if (!stale) {
    eldr_diag d = {{0}};
    stage st;
    int rc = stage_build(s, c, 0, 0, art, &st, &d);
    if (rc) eldr__logf(s, "reload: event loop %d keeps its configuration: %s", s->loop, eldr_diag_msg(&d, rc));
    else {
      stage_commit(s, &st);
      atomic_store(&s->run_gen, gen);
    }
  }
  eldr__art_put(art);
  eldr_serve_config_free(c);
  free(c);
  return 1;
}

int eldr__reload_now(eldr_server *s, eldr_diag *d) {
  stage st;
  int rc = stage_build(s, &s->cfg, 1, 1, NULL, &st, d);
  if (rc) {
    s->m.reloads_err++;
    eldr__logf(s, "reload failed, keeping the running configuration: %s", eldr_diag_msg(d, rc));
    return rc;
  }
  if ((st.cfg.bus || s->cfg.bus) && (!st.cfg.bus || !s->cfg.bus || strcmp(st.cfg.bus, s->cfg.bus)))
    eldr__logf(s, "reload: bus changes need a restart");
  if ((st.cfg.dns_server || s->cfg.dns_server) &&
      (!st.cfg.dns_server || !s->cfg.dns_server || strcmp(st.cfg.dns_server, s->cfg.dns_server)))
    eldr__logf(s, "reload: dns_server changes need a restart");
  if (st.cfg.port != s->cfg.port || strcmp(st.cfg.host, s->cfg.host))
    eldr__logf(s, "reload: listen address changes need a restart (still %s:%d)", s->cfg.host, s->port);
  stage_commit(s, &st);
  if (eldr__lead_hook) eldr__lead_hook(s);
  reload_followers(s);
  s->m.reloads_ok++;
  eldr__logf(s, "reloaded: %zu prefill, %zu decode workers, artifact %s, policy %s", s->nw[0], s->nw[1],
             s->art ? s->cfg.artifact : "none", eldr_policy_name(s->cfg.policy));
  return 0;
}

/* ev_reload (another loop's reload to follow, or eldr_server_reload) and
 * SIGHUP (loop 0 only) */
static void reload_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  eldr_server *s = arg;
  follow_reload(s);
  if (!(ev & EV_SIGNAL) && !atomic_exchange(&s->reload_req, 0)) return;
  eldr_diag d = {{0}};
  eldr__reload_now(s, &d);
}

static void stop_cb(evutil_socket_t fd, short ev, void *arg) {
  (void)fd;
  (void)ev;
  eldr_server *s = arg;
  event_base_loopexit(s->base, NULL);
}

/* ---- loops and the public API ---------------------------------------------- */

static void loop_free(eldr_server *s);

/* With SO_REUSEPORT a second router (same user) could bind the port too
 * and silently take half the connections: the loops' listeners share it
 * only after a plain bind (SO_REUSEADDR only, as a single loop binds) shows
 * that nobody listens there. 0 or ELDR_EIO naming the address. */
static int port_free(const struct evutil_addrinfo *ai, const char *host, int port, eldr_diag *d) {
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return eldr_diag_fail(d, ELDR_EIO, "cannot listen on %s:%d: %s", host, port, strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(fd, ai->ai_addr, (socklen_t)ai->ai_addrlen) ? errno : 0;
  close(fd);
  if (rc) return eldr_diag_fail(d, ELDR_EIO, "cannot listen on %s:%d: %s", host, port, strerror(rc));
  return 0;
}

/* The listen address host:port (numeric port, passive): 0 with *ai set (the
 * caller frees it), -1 when it does not resolve. */
static int listen_addr(const char *host, int port, struct evutil_addrinfo **ai) {
  struct evutil_addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_NUMERICSERV;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  *ai = NULL;
  return evutil_getaddrinfo(host, portstr, &hints, ai) != 0 || !*ai ? -1 : 0;
}

int eldr__port_check(const char *host, int port, eldr_diag *d) {
  if (port == 0) return 0; /* any free port */
  struct evutil_addrinfo *ai;
  if (listen_addr(host, port, &ai)) return eldr_diag_fail(d, ELDR_EIO, "cannot resolve listen address %s", host);
  const int rc = port_free(ai, host, port, d);
  evutil_freeaddrinfo(ai);
  return rc;
}

/* One loop: its event base, timers, workers, listener on cfg->host:port
 * (SO_REUSEPORT when the server has several loops: the kernel spreads the
 * connections over their listeners), and, for loop 0, the signals. Loops
 * after 0 share loop 0's access log stream (one fwrite per line). */
static int loop_new(const eldr_serve_config *cfg, eldr__group *g, int idx, int port, eldr_server **out,
                    eldr_diag *d) {
  *out = NULL;
  int rc;
  eldr_server *s = calloc(1, sizeof *s);
  if (!s) return ELDR_ENOMEM;
  if ((rc = eldr_serve_config_copy(&s->cfg, cfg))) {
    free(s);
    return rc;
  }
  s->grp = g;
  s->loop = idx;
  g->loops[idx] = s;
  eldr__metrics_init(&s->m);
  /* the changelist coalesces the EV_WRITE add/delete pairs of a loop
   * iteration into at most one epoll_ctl */
  struct event_config *ec = event_config_new();
  if (ec) {
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    s->base = event_base_new_with_config(ec);
    event_config_free(ec);
  }
  if (!s->base) s->base = event_base_new();
  if (!s->base) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "cannot create the event loop");
    goto fail;
  }
  s->ev_health = event_new(s->base, -1, EV_PERSIST, eldr__health_tick, s);
  s->ev_scrape = event_new(s->base, -1, EV_PERSIST, eldr__scrape_tick, s);
  s->ev_accept = evtimer_new(s->base, eldr__accept_resume, s);
  s->ev_trim = evtimer_new(s->base, mem_trim, s);
  s->ev_hang = event_new(s->base, -1, EV_PERSIST, eldr__hang_tick, s);
  s->accept_log_t = -1e9;
  eldr__fd_reserve_init(s, g->n);
  if (!s->ev_health || !s->ev_scrape || !s->ev_accept || !s->ev_trim || !s->ev_hang ||
      (rc = eldr__sigpath_init(&s->sp, s->base)) || (rc = eldr__bufpool_init(&s->bufs, s->base, ELDR__BUFPOOL_IDLE_MAX))) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
    goto fail;
  }
  eldr__conn_spares_init(s);
  s->bufs.on_free = pool_freed;
  s->bufs.on_free_arg = s;
  s->sp.share = &g->sigshare; /* one signature cache for every loop */
  if ((rc = eldr__dns_init(s, cfg->dns_server, d))) goto fail;
  if (idx == 0) {
    if ((rc = eldr__access_log_open(s, cfg->access_log, d))) goto fail;
    if ((rc = eldr__record_start(s, d))) goto fail;
  } else {
    s->access_log = g->loops[0]->access_log; /* borrowed: loop 0 closes it */
    s->rec = g->loops[0]->rec;               /* borrowed (its queue is locked): loop 0 stops it */
  }
  stage st; /* loop 0 loads the artifact; the others take loop 0's */
  if ((rc = stage_build(s, cfg, 0, idx == 0, idx ? g->loops[0]->artref : NULL, &st, d))) goto fail;
  stage_commit(s, &st); /* starts the health checks */
  if (s->cfg.health_interval_s > 0 && idx == 0) event_active(s->ev_health, EV_TIMEOUT, 0); /* first probe now */
  eldr_policy_init(&s->jsq, ELDR_POLICY_JSQ, 0, cfg->seed, NULL, 0, 0, 1);
  /* listen */
  struct evutil_addrinfo *ai;
  if (listen_addr(cfg->host, port, &ai)) {
    rc = eldr_diag_fail(d, ELDR_EINVAL, "cannot resolve listen address %s", cfg->host);
    goto fail;
  }
  unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC;
  if (g->n > 1) flags |= LEV_OPT_REUSEABLE_PORT;
  if (g->n > 1 && idx == 0 && port != 0 && (rc = port_free(ai, cfg->host, port, d))) {
    evutil_freeaddrinfo(ai);
    goto fail;
  }
  s->lis = evconnlistener_new_bind(s->base, eldr__accept_cb, s, flags, 1024, ai->ai_addr, (int)ai->ai_addrlen);
  evutil_freeaddrinfo(ai);
  if (!s->lis) {
    rc = eldr_diag_fail(d, ELDR_EIO, "cannot listen on %s:%d: %s", cfg->host, port, strerror(errno));
    goto fail;
  }
  evconnlistener_set_error_cb(s->lis, eldr__accept_error_cb);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(evconnlistener_get_fd(s->lis), (struct sockaddr *)&ss, &sl);
  s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
  s->ev_stop = event_new(s->base, -1, 0, stop_cb, s);
  s->ev_reload = event_new(s->base, -1, 0, reload_cb, s);
  s->ev_hung = event_new(s->base, -1, 0, eldr__hung_sweep, s);
  if (!s->ev_stop || !s->ev_reload || !s->ev_hung || eldr__drain_init(s)) {
    rc = ELDR_ENOMEM;
    goto fail;
  }
  if (cfg->handle_signals && idx == 0) {
    s->sig_hup = evsignal_new(s->base, SIGHUP, reload_cb, s);
    s->sig_int = evsignal_new(s->base, SIGINT, eldr__drain_signal, s); /* drain; the second stops */
    s->sig_term = evsignal_new(s->base, SIGTERM, eldr__drain_signal, s);
    if (!s->sig_hup || !s->sig_int || !s->sig_term || event_add(s->sig_hup, NULL) ||
        event_add(s->sig_int, NULL) || event_add(s->sig_term, NULL)) {
      rc = ELDR_ENOMEM;
      goto fail;
    }
  }
  *out = s;
  return 0;
fail:
  loop_free(s);
  g->loops[idx] = NULL;
  return rc;
}

/* The fleet bus (bus.h) of s's group and every loop's view of it: its
 * footprint shape is the start's artifact's (a reload to another shape
 * shares counts only); the replica id defaults to HOSTNAME:PORT. */
static int bus_start(eldr_server *s, eldr_diag *d) {
  const eldr_serve_config *c = &s->cfg;
  char id[ELDR__BUS_ID_MAX + 1], host[256] = "eldr";
  if (c->bus_replica_id) snprintf(id, sizeof id, "%s", c->bus_replica_id);
  else {
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(id, sizeof id, "%.50s:%d", host, s->port);
  }
  const eldr_artifact *a = s->art;
  eldr__bus_opts o = {.url = c->bus, .subject = c->bus_subject, .replica = id, .snapshot_s = c->bus_snapshot_s,
                      .peer_timeout_s = c->bus_peer_timeout_s, .nloops = s->grp->n,
                      .L = a ? a->shape.num_layers : 0, .E = a ? a->shape.num_experts : 0};
  int rc = eldr__bus_new(&o, &s->grp->bus, d);
  for (int i = 0; !rc && i < s->grp->n; i++)
    if ((rc = eldr__busview_new(s->grp->bus, i, &s->grp->loops[i]->bv)))
      eldr_diag_fail(d, rc, "bus: out of memory");
  if (!rc)
    eldr__logf(s, "bus %s: replica %s, subject %s.state, every %g s a snapshot, peers expire after %g s", c->bus, id,
               c->bus_subject ? c->bus_subject : "eldr.fleet", c->bus_snapshot_s, c->bus_peer_timeout_s);
  return rc;
}

/* cfg.threads, 0 resolved to the CPUs the process may run on (affinity,
 * cgroup quota: eldr_cpu_count). */
static int resolve_threads(const eldr_serve_config *c) {
  if (c->threads > 0) return c->threads;
  const int n = eldr_cpu_count();
  return n > ELDR_SERVE_MAX_THREADS ? ELDR_SERVE_MAX_THREADS : n;
}

int eldr_server_new(const eldr_serve_config *cfg, eldr_server **out, eldr_diag *d) {
  *out = NULL;
  int rc = eldr_serve_config_validate(cfg, d);
  if (rc) return rc;
  static int threads_on;
  if (!threads_on) {
    evthread_use_pthreads();
    threads_on = 1;
  }
  signal(SIGPIPE, SIG_IGN);
  int n = resolve_threads(cfg);
  eldr__group *g = eldr__group_new(n);
  if (!g) return ELDR_ENOMEM;
  eldr_server *s0 = NULL;
  if ((rc = loop_new(cfg, g, 0, cfg->port, &s0, d))) {
    eldr__group_free(g);
    return rc;
  }
  if (eldr__lead_hook) eldr__lead_hook(s0);
  for (int i = 1; i < n; i++) {
    eldr_server *si;
    if ((rc = loop_new(cfg, g, i, s0->port, &si, d))) {
      eldr_diag_prefix(d, "event loop %d of %d", i + 1, n);
      eldr_server_free(s0);
      return rc;
    }
  }
  if (cfg->bus && (rc = bus_start(s0, d))) {
    eldr_server_free(s0);
    return rc;
  }
  *out = s0;
  return 0;
}

int eldr_server_port(const eldr_server *s) { return s ? s->port : -1; }

int eldr_server_run(eldr_server *s) {
  eldr__logf(s, "listening on %s:%d (%zu prefill, %zu decode workers, policy %s, artifact %s, %d event loop%s)",
        s->cfg.host, s->port, s->nw[0], s->nw[1], eldr_policy_name(s->cfg.policy),
        s->art ? s->cfg.artifact : "none", s->grp->n, s->grp->n == 1 ? "" : "s");
  if (s->sp.conf.cache) {
    eldr_sigcache_stats cs;
    eldr_sigshard_stats_get(s->sp.conf.cache, &cs);
    const eldr_artifact *a = s->art;
    eldr__logf(s, "signature cache: %zu rows of %zu bytes (%zu of %u layers x %u experts), %.1f MiB "
                  "(--sigcache-rows %zu, --sig-cache-mb %zu)",
               cs.capacity, eldr_sigcache_row_bytes(&a->shape, a->mask),
               eldr_sigcache_row_bytes(&a->shape, a->mask) / a->shape.num_experts, a->shape.num_layers,
               a->shape.num_experts, (double)eldr_sigshard_bytes(s->sp.conf.cache) / (1 << 20), s->cfg.sigcache_rows,
               s->cfg.sig_cache_mb);
  }
  if (s->grp->n > 1 && s->cfg.policy == ELDR_POLICY_FOOTPRINT && !s->grp->bus)
    eldr__logf(s, "footprint: each of the %d event loops models only the requests it routed (--threads 1 "
                  "gives it the whole picture)", s->grp->n);
  return eldr__group_run(s->grp);
}

void eldr__loop_stop(eldr_server *s) {
  if (s && s->ev_stop) event_active(s->ev_stop, EV_TIMEOUT, 0);
}

void eldr_server_stop(eldr_server *s) {
  if (!s) return;
  for (int i = 0; i < s->grp->n; i++) eldr__loop_stop(s->grp->loops[i]);
}

void eldr_server_reload(eldr_server *s) {
  if (s && s->ev_reload) { /* loop 0 leads */
    atomic_store(&s->reload_req, 1);
    event_active(s->ev_reload, EV_TIMEOUT, 0);
  }
}

static void loop_free(eldr_server *s) {
  if (!s) return;
  eldr__fd_reserve_stop(s); /* closing connections resume nothing */
  while (s->conns) eldr__conn_free(s->conns);
  if (s->lis) evconnlistener_free(s->lis);
  struct event *evs[] = {s->ev_stop, s->ev_reload, s->ev_health, s->ev_scrape, s->sig_hup,
                         s->sig_int, s->sig_term, s->ev_accept, s->ev_trim, s->ev_hung, s->ev_hang,
                         s->ev_drain, s->ev_drain_tick};
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    if (evs[i]) event_free(evs[i]);
  while (s->all_workers) eldr__worker_free(s->all_workers);
  eldr__dns_free(s);
  if (s->loop) s->access_log = NULL, s->rec = NULL; /* loop 0's */
  eldr__access_log_close(s);
  eldr__record_stop(s); /* after the connections: their requests' records are in */
  eldr__sigpath_free(&s->sp);
  free(s->w[0]);
  free(s->w[1]);
  /* run deferred connection frees */
  if (s->base) {
    for (int i = 0; i < 4; i++) event_base_loop(s->base, EVLOOP_NONBLOCK);
    eldr__rq_pool_free(s); /* their timers belong to the base */
    eldr__bufpool_free(&s->bufs);
    eldr__spares_free(&s->heads);
    eldr__spares_free(&s->inbufs);
    event_base_free(s->base);
  }
  eldr__art_put(s->artref);
  eldr__fps_put(s->fps);
  eldr__watchst_free(s->watch);
  eldr__busview_free(s->bv);
  free(s->loads);
  free(s->keys);
  free(s->seen);
  free(s->healthy);
  if (s->follow_cfg) eldr_serve_config_free(s->follow_cfg);
  free(s->follow_cfg);
  eldr__art_put(s->follow_art);
  eldr_serve_config_free(&s->cfg);
  free(s);
}

void eldr_server_free(eldr_server *s) {
  if (!s) return;
  eldr__group *g = s->grp;
  for (int i = g->n - 1; i >= 1; i--) { /* before loop 0: they borrow its access log */
    loop_free(g->loops[i]);
    g->loops[i] = NULL;
  }
  loop_free(s);
  eldr__bus_free(g->bus); /* after the loops: their last ends are in its rings */
  eldr__group_free(g);
}
