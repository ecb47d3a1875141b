/* engines.c — see engines.h. */
#include "support/engines.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "support/fixture.h"
#include "support/proc.h"
#include "worker/wtest.h"

static pid_t engines[ENG_MAX];
static int n_engines;

int eng_start(const char *role, const char *scale, const char *max_seqs, pid_t *pid) {
  if (n_engines >= ENG_MAX) fail_msg("engines: more than %d", ENG_MAX);
  char *argv[] = {(char *)eldr_test_binary(), "worker", "--role", (char *)role, "--port", "0", "--time-scale",
                  (char *)scale, "--max-num-seqs", (char *)max_seqs, NULL};
  char line[256];
  pid_t p = wt_spawn(argv, line, sizeof line, 20);
  if (p <= 0) fail_msg("engines: cannot start eldr worker --role %s", role);
  engines[n_engines++] = p;
  *pid = p;
  int port = wt_port_of(line);
  if (port <= 0) fail_msg("engines: eldr worker printed no port: %s", line);
  return port;
}

const char *eng_url(int port, char *buf, size_t cap) {
  snprintf(buf, cap, "http://127.0.0.1:%d", port);
  return buf;
}

void eng_stop_all(void) {
  for (int i = 0; i < n_engines; i++)
    if (engines[i] > 0) {
      kill(engines[i], SIGCONT);
      wt_kill(engines[i]);
      engines[i] = 0;
    }
  n_engines = 0;
}

void eng_stream_post(int port, const char *prompt, int max_tokens, double timeout_s, eng_stream *o) {
  memset(o, 0, sizeof *o);
  char body[256];
  snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"stream\":true}", prompt, max_tokens);
  tc_resp r;
  o->status = tc_post_within(port, "/v1/completions", body, NULL, timeout_s, &r) == 0 ? r.status : -1;
  o->t_end = fx_now();
  if (o->status < 0) return;
  for (const char *p = r.body; (p = strstr(p, "\"text\":\"")) != NULL; p += 8) o->tokens += p[8] != '"';
  const char *e = strstr(r.body, "\"eldr_engine_id\":\"eldr-decode-");
  if (e) o->engine = atoi(e + 30);
  const char *x = strstr(r.body, "data: {\"error\"");
  o->done = !x && strstr(r.body, "data: [DONE]") != NULL;
  if (o->status == 200 && x) {
    o->status = strstr(x, "\"code\":504") ? 504 : 502;
    snprintf(o->err, sizeof o->err, "%.180s", x);
  } else if (o->status != 200) {
    snprintf(o->err, sizeof o->err, "%.180s", r.body);
  }
  tc_free(&r);
}
