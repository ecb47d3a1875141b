/* engines.c — see engines.h. */
#include "support/engines.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

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
