/* fuzz_worker_request.c — the emulated worker's request parsing
 * (eldr__worker_check_request, the code path of POST /v1/completions and
 * /v1/chat/completions). Input: fuzz_body.h's split (the first byte picks
 * the API; the rest is the body, read in place, so ASan catches a read past
 * it). Checks: never crashes, never reads out of bounds, an error carries a
 * 4xx/500 status and a message. The worker (with a one-record trace, so the
 * eldr_trace_id path is reached) is built once; its loop never runs. */
#include <event2/event.h>
#include <stdint.h>
#include <stdlib.h>

#include "eldr/tracegen.h"
#include "eldr/worker.h"
#include "fuzz_body.h"
#include "worker/worker_internal.h"

static eldr_worker *worker(void) {
  static eldr_worker *w;
  static struct event_base *base;
  static eldr_trace *t;
  if (w) return w;
  eldr_shape sh;
  if (eldr_tracegen_model_shape("olmoe-1b-7b", &sh, NULL, 0, NULL) < 0) abort();
  t = eldr_trace_new("olmoe", &sh, NULL);
  uint16_t *sel = calloc((size_t)sh.num_layers * sh.top_k * 2, sizeof *sel);
  for (size_t i = 0; i < (size_t)sh.num_layers * sh.top_k * 2; i++) sel[i] = (uint16_t)(i % sh.num_experts);
  if (!t || !sel || eldr_trace_append(t, "a/1", "a", NULL, -1, sel, 1, sel, 1, NULL) < 0) abort();
  free(sel);
  base = event_base_new();
  eldr_worker_config c;
  eldr_worker_config_default(&c);
  c.model = "olmoe-1b-7b";
  c.port = 0;
  c.trace = t;
  c.kv_blocks = 64;
  if (!base || eldr_worker_new(base, &c, &w, NULL) < 0) abort();
  return w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_worker *w = worker();
  eldr_fuzz_body in;
  if (eldr_fuzz_body_split(data, size, &in)) return 0;
  char err[320];
  int st = eldr__worker_check_request(w, in.body, in.len, (int)in.api, err, sizeof err);
  if (st != 0 && ((st < 400 || st > 599) || !err[0])) abort();
  return 0;
}
