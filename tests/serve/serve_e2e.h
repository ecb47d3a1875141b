/* serve_e2e.h — what test_serve.c and test_serve_edge.c share: their
 * router settings over a fixture rig, the routed_experts and artifact they
 * build, and JSON checks of replies and of what a fixture worker received.
 * Included by those two test programs only (static inline: each gets its
 * own copy of these few lines, no test support library needed). */
#ifndef ELDR_TESTS_SERVE_E2E_H
#define ELDR_TESTS_SERVE_E2E_H

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "eldr/sigcache.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"

static const eldr_shape SH = {4, 8, 2};

/* routed_experts of n tokens all choosing experts {e0, e0+1} on every layer */
static inline char *routed(size_t n, const eldr_shape *s, int e0) { return sf_routed(s, n, e0); }

/* Artifact with 2 centroids: experts 0-3 and experts 4-7 of every layer. */
static inline char *make_artifact(const eldr_shape *s, const char *tag) { return fx_artifact(s, tag); }

/* This file's router settings over a rig's configuration. */
static inline void tune(eldr_serve_config *c) {
  c->header_timeout_s = 2;
  c->retries = 2;
  c->policy = ELDR_POLICY_JSQ;
}

/* np prefill and nd decode fixture workers and a router config over them. */
static inline void rig(sf_rig *g, int np, const fx_behaviour *pb, int nd, const fx_behaviour *db) {
  sf_start(g, np, pb, nd, db);
  tune(&g->c);
}

/* A fresh config over the rig's workers (after sf_stop). */
static inline void reconfig(sf_rig *g) {
  sf_config(g);
  tune(&g->c);
}

/* A config over other workers than a rig's: health checks off, tuned. */
static inline void base_cfg(eldr_serve_config *c) {
  eldr_serve_config_default(c);
  c->health_interval_s = 0;
  tune(c);
}

static inline json_t *jbody(const tc_resp *r) {
  json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
  if (!j) fail_msg("not JSON (status %d): %s", r->status, r->body);
  return j;
}

static inline json_t *jrec(fx_worker *w, const char *path, long i, fx_record *rec) {
  assert_int_equal(fx_get(w, path, i, rec), 0);
  json_t *j = json_loadb(rec->body, rec->body_len, 0, NULL);
  assert_non_null(j);
  return j;
}

static inline void expect_error(const tc_resp *r, int status, const char *word) {
  if (r->status != status) fail_msg("status %d, expected %d: %s", r->status, status, r->body);
  json_t *j = jbody(r);
  json_t *e = json_object_get(j, "error");
  assert_true(json_is_object(e));
  const char *msg = json_string_value(json_object_get(e, "message"));
  assert_non_null(msg);
  if (word && !strstr(msg, word)) fail_msg("message '%s' lacks '%s'", msg, word);
  assert_int_equal(json_integer_value(json_object_get(e, "code")), status);
  json_decref(j);
}

#define SERIES(...) (snprintf(series, sizeof series, __VA_ARGS__), series)

#endif
