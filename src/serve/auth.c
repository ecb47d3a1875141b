/* auth.c — client authentication at the request head, before the body is
 * read or any other check (411, 413) is answered:
 *   - API keys (cfg.api_keys, vLLM's --api-key): every path starting with
 *     /v1, any method but OPTIONS, needs "Authorization: Bearer <key>" for
 *     one of the keys; else 401 {"error":"Unauthorized"}, vLLM's answer
 *     (AuthenticationMiddleware in vllm/entrypoints/openai/server_utils.py:
 *     the same paths, the same exemption, the same body);
 *   - the admin token (cfg.admin_token) on POST /admin/reload: 401 with
 *     WWW-Authenticate: Bearer and the router's error JSON.
 * Tokens are compared in constant time: every byte of every configured
 * token is compared, whatever the client sent, so the time depends on the
 * configured tokens' lengths only. Refusals are counted
 * (eldr_bad_requests_total{reason="unauthorized"}) and logged at most once
 * per AUTH_LOG_S for the whole router, with the number refused in between:
 * a client hammering wrong keys cannot flood the log.
 * Loop thread; the log's rate state is the group's (its mutex). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve_types.h"

/* At most one log line per this many seconds for refused credentials. */
#define AUTH_LOG_S 10.0

int eldr__token_equal(const char *given, const char *want) {
  size_t lg = strlen(given), lw = strlen(want);
  unsigned char diff = lg != lw;
  for (size_t i = 0; i < lw; i++) diff |= (unsigned char)(given[i < lg ? i : 0] ^ want[i]);
  return lw && lg && !diff;
}

/* The Bearer credential of an Authorization value ("" when another scheme
 * or none): the scheme case-insensitive, one space, the rest. */
static const char *bearer(const char *auth) {
  return strncasecmp(auth, "Bearer ", 7) ? "" : auth + 7;
}

int eldr__auth_check(const hconn *c) {
  const eldr_server *s = c->s;
  const eldr__http_head *h = c->head;
  if (h->method == ELDR__M_OPTIONS) return 0; /* CORS preflights carry no credentials */
  if (s->cfg.n_api_keys && !strncmp(h->path, "/v1", 3)) {
    const char *tok = bearer(h->authorization);
    int ok = 0;
    for (size_t i = 0; i < s->cfg.n_api_keys; i++) ok |= eldr__token_equal(tok, s->cfg.api_keys[i]);
    return ok ? 0 : 1;
  }
  if (s->cfg.admin_token && !strcmp(h->path, "/admin/reload"))
    return eldr__token_equal(bearer(h->authorization), s->cfg.admin_token) ? 0 : 2;
  return 0;
}

/* One line per AUTH_LOG_S for the whole router. */
static void auth_log(hconn *c, int what) {
  eldr_server *s = c->s;
  eldr__group *g = s->grp;
  double now = eldr__now_s();
  int log = 0;
  uint64_t since = 0;
  pthread_mutex_lock(&g->mu);
  if (now - g->auth_log_t >= AUTH_LOG_S || g->auth_log_t == 0) {
    log = 1;
    since = g->auth_refused;
    g->auth_refused = 0;
    g->auth_log_t = now;
  } else {
    g->auth_refused++;
  }
  pthread_mutex_unlock(&g->mu);
  if (log)
    eldr__logf(s, "%s %s refused (401): %s%s (%llu more refusals since the last such line; at most one line per %g s)",
               c->head->method_name, c->head->path, c->head->authorization[0] ? "wrong " : "no ",
               what == 2 ? "admin token" : "API key", (unsigned long long)since, AUTH_LOG_S);
}

void eldr__auth_refuse(hconn *c) {
  eldr_server *s = c->s;
  int what = c->unauth;
  c->unauth = 0;
  s->m.bad[BAD_AUTH]++;
  auth_log(c, what);
  c->state = C_BUSY;
  c->head_only = 0;
  if (what == 1) { /* vLLM's answer, byte for byte */
    static const char body[] = "{\"error\":\"Unauthorized\"}";
    eldr__send_body(c, 401, "application/json", body, sizeof body - 1, NULL);
    return;
  }
  size_t jl = 0;
  char *j = eldr__error_json(401, "unauthorized", "POST /admin/reload needs Authorization: Bearer <admin_token>", &jl);
  eldr__send_body(c, 401, "application/json", j ? j : "{}", j ? jl : 2, "WWW-Authenticate: Bearer\r\n");
  free(j);
}
