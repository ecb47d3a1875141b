/* loops.c — what the router's event loops share (docs/architecture.md,
 * "Threads"): the group of loops and its threads, the workers' slots,
 * whose in-flight counts every loop's decisions read and reserve, and the
 * artifact each start or reload loads once for all of them (eldr__art). Each loop
 * is a whole eldr_server (server.c) on its own thread with its own
 * SO_REUSEPORT listener, connections and upstream pools. */
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

void (*eldr__lead_hook)(eldr_server *leader);

eldr__art *eldr__art_wrap(eldr_artifact *a) {
  eldr__art *r = malloc(sizeof *r);
  if (!r) {
    eldr_artifact_free(a);
    return NULL;
  }
  atomic_init(&r->refs, 1);
  r->a = a;
  return r;
}

eldr__art *eldr__art_ref(eldr__art *r) {
  if (r) atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
  return r;
}

void eldr__art_put(eldr__art *r) {
  if (!r || atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1) return;
  eldr_artifact_free(r->a);
  free(r);
}

eldr__group *eldr__group_new(int n) {
  eldr__group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->n = n;
  g->loops = calloc((size_t)n, sizeof *g->loops);
  if (!g->loops || pthread_mutex_init(&g->mu, NULL)) {
    free(g->loops);
    free(g);
    return NULL;
  }
  if (pthread_mutex_init(&g->logmu, NULL)) {
    pthread_mutex_destroy(&g->mu);
    free(g->loops);
    free(g);
    return NULL;
  }
  if (eldr__sigshare_init(&g->sigshare)) {
    pthread_mutex_destroy(&g->mu);
    pthread_mutex_destroy(&g->logmu);
    free(g->loops);
    free(g);
    return NULL;
  }
  return g;
}

void eldr__group_free(eldr__group *g) {
  if (!g) return;
  while (g->slots) { /* every worker is gone: none left in practice */
    eldr__slot *sl = g->slots;
    g->slots = sl->next;
    free(sl);
  }
  eldr__sigshare_free(&g->sigshare);
  eldr__watchcore_put(g->watch);
  pthread_mutex_destroy(&g->mu);
  pthread_mutex_destroy(&g->logmu);
  free(g->loops);
  free(g);
}

eldr__slot *eldr__slot_get(eldr__group *g, int role, const char *url) {
  pthread_mutex_lock(&g->mu);
  eldr__slot *sl = g->slots;
  while (sl && (sl->role != role || strcmp(sl->url, url))) sl = sl->next;
  if (!sl) {
    size_t n = strlen(url);
    sl = calloc(1, sizeof *sl + n + 1);
    if (sl) {
      memcpy(sl->url, url, n + 1);
      sl->key = eldr_policy_worker_key(url);
      sl->role = role;
      sl->healthy = 1;
      sl->next = g->slots;
      g->slots = sl;
    }
  }
  if (sl) sl->refs++;
  pthread_mutex_unlock(&g->mu);
  return sl;
}

void eldr__slot_put(eldr__group *g, eldr__slot *sl) {
  if (!sl) return;
  pthread_mutex_lock(&g->mu);
  if (--sl->refs == 0) {
    for (eldr__slot **p = &g->slots; *p; p = &(*p)->next)
      if (*p == sl) {
        *p = sl->next;
        break;
      }
    free(sl);
  }
  pthread_mutex_unlock(&g->mu);
}

int eldr__slot_reserve(eldr__slot *sl, uint32_t seen) {
  return atomic_compare_exchange_strong(&sl->inflight, &seen, seen + 1);
}

static void *loop_main(void *arg) {
  eldr_server *s = arg;
  event_base_dispatch(s->base);
  return NULL;
}

int eldr__group_run(eldr__group *g) {
  pthread_t *th = calloc((size_t)g->n, sizeof *th);
  if (!th) return ELDR_ENOMEM;
  int started = 1, rc = 0;
  for (; started < g->n; started++)
    if (pthread_create(&th[started], NULL, loop_main, g->loops[started])) {
      eldr__logf(g->loops[0], "cannot start event loop %d of %d: stopping", started, g->n);
      rc = ELDR_EIO;
      break;
    }
  if (!rc && event_base_dispatch(g->loops[0]->base) < 0) rc = ELDR_EIO;
  for (int i = 1; i < started; i++) {
    eldr__loop_stop(g->loops[i]);
    pthread_join(th[i], NULL);
  }
  free(th);
  return rc;
}
