/* fuzz_worker_request_sglang.c — the emulated worker's request checks as
 * an SGLang engine (`eldr worker --engine sglang`: src/worker/sgl_req.c,
 * reached through eldr__worker_check_request): batches of prompts, n, and
 * the bootstrap fields (scalar or arrays, a prefill's and a decode's
 * rules), the body a PD router or any client sends. Input: fuzz_body.h's
 * split (the first byte picks the API; the rest is the body, read in
 * place, so ASan catches a read past it). Checks: never crashes, never
 * reads out of bounds, nothing leaks (LeakSanitizer), an error carries a
 * 4xx/500 status and a message. The workers (a prefill, whose bootstrap
 * server binds a free port, and a decode) are built once; their loop
 * never runs. */
#include <event2/event.h>
#include <stdint.h>
#include <stdlib.h>

#include "eldr/worker.h"
#include "fuzz_body.h"
#include "worker/worker_internal.h"

static eldr_worker *worker(eldr_worker_role role) {
  static eldr_worker *w[2];
  static struct event_base *base;
  int i = role == ELDR_WORKER_DECODE;
  if (w[i]) return w[i];
  if (!base && !(base = event_base_new())) abort();
  eldr_worker_config c;
  eldr_worker_config_default(&c);
  c.model = "olmoe-1b-7b";
  c.port = 0;
  c.kv_blocks = 64;
  c.engine = ELDR_WORKER_ENGINE_SGLANG;
  c.role = role;
  c.bootstrap_port = 0;
  if (eldr_worker_new(base, &c, &w[i], NULL) < 0) abort();
  return w[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_fuzz_body in;
  if (eldr_fuzz_body_split(data, size, &in)) return 0;
  const eldr_worker_role roles[2] = {ELDR_WORKER_PREFILL, ELDR_WORKER_DECODE};
  for (int k = 0; k < 2; k++) {
    char err[320];
    err[0] = 0;
    int st = eldr__worker_check_request(worker(roles[k]), in.body, in.len, (int)in.api, err, sizeof err);
    if (st != 0 && ((st < 400 || st > 599) || !err[0])) abort();
  }
  return 0;
}
