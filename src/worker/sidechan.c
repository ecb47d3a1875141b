/* sidechan.c — the emulated NIXL side channel: held KV blocks and the pull
 * request parser (see sidechan.h). */
#include "worker/sidechan.h"

#include <event2/event.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int eldr__pull_parse(const char *body, size_t len, eldr__pull *out, char *err, size_t errcap) {
  memset(out, 0, offsetof(eldr__pull, ids));
  out->n_ids = 0;
  if (len > ELDR__PULL_MAX_BODY) {
    snprintf(err, errcap, "pull body of %zu bytes exceeds %d", len, ELDR__PULL_MAX_BODY);
    return -1;
  }
  json_error_t je;
  json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  int rc = -1;
  if (!j) {
    snprintf(err, errcap, "pull body is not JSON: %s", je.text);
    return -1;
  }
  json_t *rid = json_object_get(j, "remote_request_id");
  json_t *eng = json_object_get(j, "remote_engine_id");
  json_t *ids = json_object_get(j, "remote_block_ids");
  if (!json_is_object(j)) {
    snprintf(err, errcap, "pull body must be a JSON object");
  } else if (!json_is_string(rid) || json_string_length(rid) == 0 ||
             json_string_length(rid) > ELDR__PULL_MAX_ID ||
             strlen(json_string_value(rid)) != json_string_length(rid)) {
    snprintf(err, errcap, "'remote_request_id' must be a string of 1..%d bytes", ELDR__PULL_MAX_ID);
  } else if (!json_is_string(eng) || json_string_length(eng) > ELDR__PULL_MAX_ID ||
             strlen(json_string_value(eng)) != json_string_length(eng)) {
    snprintf(err, errcap, "'remote_engine_id' must be a string of at most %d bytes", ELDR__PULL_MAX_ID);
  } else if (!json_is_array(ids) || json_array_size(ids) > ELDR__PULL_MAX_IDS) {
    snprintf(err, errcap, "'remote_block_ids' must be an array of at most %d ids", ELDR__PULL_MAX_IDS);
  } else {
    rc = 0;
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
        snprintf(err, errcap, "remote_block_ids[%zu] must be an integer in 0..%d", i, INT32_MAX);
        rc = -1;
        break;
      }
      out->ids[i] = (int32_t)json_integer_value(v);
    }
    if (rc == 0) {
      out->n_ids = json_array_size(ids);
      memcpy(out->rid, json_string_value(rid), json_string_length(rid) + 1);
      memcpy(out->engine, json_string_value(eng), json_string_length(eng) + 1);
    }
  }
  json_decref(j);
  return rc;
}

typedef struct held held;
struct held {
  held *prev, *next;
  eldr__kvhold *h;
  char rid[ELDR__PULL_MAX_ID + 1];
  int32_t *blocks;
  size_t n;
  struct event *timer;
};

struct eldr__kvhold {
  struct event_base *base;
  eldr__kv *kv;
  struct timeval timeout;
  held *head;
  size_t n;
  uint64_t expired;
  void (*on_expire)(void *);
  void *arg;
};

eldr__kvhold *eldr__kvhold_new(struct event_base *base, eldr__kv *kv, double timeout_s,
                               void (*on_expire)(void *), void *arg) {
  eldr__kvhold *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  h->on_expire = on_expire;
  h->arg = arg;
  h->base = base;
  h->kv = kv;
  h->timeout.tv_sec = (time_t)timeout_s;
  h->timeout.tv_usec = (suseconds_t)((timeout_s - (double)h->timeout.tv_sec) * 1e6);
  return h;
}

static void held_drop(held *e) {
  eldr__kvhold *h = e->h;
  if (e->prev) e->prev->next = e->next;
  else h->head = e->next;
  if (e->next) e->next->prev = e->prev;
  h->n--;
  eldr__kv_release(h->kv, e->blocks, e->n);
  free(e->blocks);
  if (e->timer) event_free(e->timer);
  free(e);
}

void eldr__kvhold_free(eldr__kvhold *h) {
  if (!h) return;
  while (h->head) held_drop(h->head);
  free(h);
}

static void held_expire(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  held *e = arg;
  eldr__kvhold *h = e->h;
  h->expired++;
  held_drop(e);
  if (h->on_expire) h->on_expire(h->arg);
}

static held *held_find(eldr__kvhold *h, const char *rid) {
  for (held *e = h->head; e; e = e->next)
    if (!strcmp(e->rid, rid)) return e;
  return NULL;
}

int eldr__kvhold_park(eldr__kvhold *h, const char *rid, int32_t *blocks, size_t n) {
  size_t l = strlen(rid);
  held *e = l <= ELDR__PULL_MAX_ID ? calloc(1, sizeof *e) : NULL;
  if (e) e->timer = evtimer_new(h->base, held_expire, e);
  if (!e || !e->timer) {
    free(e);
    eldr__kv_release(h->kv, blocks, n);
    free(blocks);
    return -1;
  }
  held *old = held_find(h, rid);
  if (old) held_drop(old);
  memcpy(e->rid, rid, l + 1);
  e->h = h;
  e->blocks = blocks;
  e->n = n;
  e->next = h->head;
  if (h->head) h->head->prev = e;
  h->head = e;
  h->n++;
  evtimer_add(e->timer, &h->timeout);
  return 0;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int eldr__kvhold_take(eldr__kvhold *h, const eldr__pull *p) {
  held *e = held_find(h, p->rid);
  if (!e) return 404;
  /* the decode side may read a subset (vLLM skips blocks it has cached
   * itself); every id it names must be one of the request's */
  int32_t *sorted = malloc((e->n ? e->n : 1) * sizeof *sorted);
  if (!sorted) return 500;
  memcpy(sorted, e->blocks, e->n * sizeof *sorted);
  qsort(sorted, e->n, sizeof *sorted, cmp_i32);
  int ok = p->n_ids <= e->n;
  for (size_t i = 0; ok && i < p->n_ids; i++)
    ok = bsearch(&p->ids[i], sorted, e->n, sizeof *sorted, cmp_i32) != NULL;
  free(sorted);
  if (!ok) return 409;
  held_drop(e);
  return 0;
}

size_t eldr__kvhold_count(const eldr__kvhold *h) { return h ? h->n : 0; }
uint64_t eldr__kvhold_expired(const eldr__kvhold *h) { return h ? h->expired : 0; }
