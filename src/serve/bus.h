/* bus.h — the fleet bus: every decoder's in-flight state shared by the
 * event loops of this router and, over NATS (--bus nats://HOST:PORT), by
 * every router replica (serve-private; docs/serve.md "A fleet of routers").
 *
 * What is shared, per decoder (id: XXH64 of its URL): requests in flight,
 * their prompt tokens, and footprint's per-(layer, expert) fixed-point
 * weights (eldr/footprint.h), added on route and removed on end. Nothing of
 * a request's content travels (busmsg.h lists every field).
 *
 * Threads:
 *   - each event loop (loop thread) pushes its routes and ends into its own
 *     bounded single-producer ring (eldr__bus_route / eldr__bus_end, never
 *     blocking: a full ring drops the event, counted, and its end with it),
 *     and reads the others' state in its decisions: counts lock-free
 *     (atomics), footprint weights by eldr__bus_pull, which applies what
 *     changed since its last pull to its footprint under a trylock (never
 *     waits: a busy lock is tried again at the next decision);
 *   - the hub thread (one per router, bus.c) drains the rings, keeps every
 *     source's sums (each loop's, each peer replica's) and their total under
 *     the bus mutex, publishes deltas, periodic snapshots and hellos, applies
 *     what peers sent, expires peers gone silent;
 *   - libnats's own threads (connection reader, flusher, subscription
 *     delivery) only hand received messages to the hub through a bounded
 *     queue (a full queue drops them; the gap in the sender's sequence makes
 *     the hub ask for a snapshot) and report connection changes (atomics);
 *     nothing of a loop runs on them.
 * Consistency: each source's sums are exact integers; a peer's deltas are
 * applied in its sequence order; a gap (lost message, reconnect) drops to
 * "resync" until the peer's next snapshot (sent every snapshot interval and
 * at once on a hello) replaces its sums. A peer silent for peer_timeout, or
 * every peer while the connection is down, is expired: its contributions
 * leave every decision.
 * Ownership: the group owns the bus (eldr__bus_new / _free); each loop owns
 * its view (s->bv). Errors: creation fails on ENOMEM or an unusable URL;
 * nothing later fails a request: the bus degrades to this replica's own view
 * plus scraping, and says so in /health, /eldr/status and /metrics. */
#ifndef ELDR_SERVE_BUS_H
#define ELDR_SERVE_BUS_H

#include <stdint.h>
#include <stdio.h>

#include "eldr/error.h"

typedef struct eldr__bus eldr__bus;
typedef struct eldr__busview eldr__busview;
struct eldr_server;
struct evbuffer;
struct rq;
struct worker;

/* The bus of a group of nloops loops, for footprint shape (L, E) (0, 0:
 * counts only). url NULL: in-process only (the loops share, no NATS).
 * Starts the hub thread (which connects in the background). */
typedef struct eldr__bus_opts {
  const char *url, *subject, *replica;
  double snapshot_s, peer_timeout_s;
  int nloops;
  uint32_t L, E;
} eldr__bus_opts;
int eldr__bus_new(const eldr__bus_opts *o, eldr__bus **out, eldr_diag *d);
/* A bye to the peers, the hub stopped, everything freed. NULL: no-op. */
void eldr__bus_free(eldr__bus *b);
/* The loop's view (loop thread): 0 or ELDR_ENOMEM. */
int eldr__busview_new(eldr__bus *b, int loop, eldr__busview **out);
void eldr__busview_free(eldr__busview *v);

/* Loop thread. r's decode leg started on w (its footprint ticket, if any,
 * holds the weights): the event goes to the hub. */
void eldr__bus_route(struct rq *r, struct worker *w);
/* r's decode leg ended: the same contributions removed (no-op when its
 * route was not published). Call before its footprint ticket ends. */
void eldr__bus_end(struct rq *r);
/* Apply the other loops' and replicas' footprint changes to s->fps. */
void eldr__bus_pull(struct eldr_server *s);
/* s committed a new configuration: the view starts over (nothing applied
 * to the new footprint yet). */
void eldr__busview_stale(eldr__busview *v);
/* Requests in flight on w from peer replicas (0 unless the bus is up). */
uint32_t eldr__bus_peer_load(const struct worker *w);
/* The bus is connected (decisions use its counts instead of scraping). */
int eldr__bus_up(const eldr__bus *b);

/* Any thread: "off", "connecting", "up", "down" (with fallback), and the
 * JSON object of /eldr/status's "bus" (a json_t *), /metrics lines. */
const char *eldr__bus_state(const eldr__bus *b);
void *eldr__bus_status_json(eldr__bus *b);
void eldr__bus_metrics(eldr__bus *b, struct evbuffer *o);

#endif
