/* sgl_rig.h — the rig of the router's SGLang flow tests (test_serve_sglang,
 * test_serve_sglang_generate): emulated SGLang engines in process, an
 * artifact of their model, the router in --pd sglang or sglang-exact.
 * Ownership: the rig's (sf_free / rig_end); the artifact's path is the
 * caller's to unlink and free. One test thread. */
#ifndef ELDR_TESTS_SGL_RIG_H
#define ELDR_TESTS_SGL_RIG_H

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/latency.h"
#include "eldr/serve.h"
#include "eldr/tracegen.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "worker/wtest.h"

#define MODEL "qwen3-30b-a3b"

/* The emulated engines' configuration: SGLang, fast, long bootstrap and
 * waiting timeouts (a leg left waiting would show as a slow test). */
static inline eldr_worker_config engine_cfg(void) {
  eldr_worker_config c;
  eldr_worker_config_default(&c);
  c.engine = ELDR_WORKER_ENGINE_SGLANG;
  c.model = MODEL;
  c.time_scale = 0.01;
  c.bootstrap_port = 0;
  c.bootstrap_timeout = 30;
  c.waiting_timeout = 30;
  c.return_routed_experts = 1;
  return c;
}

static inline int engine_port(const sf_rig *g, int slot) { return ((wt_worker *)g->engine[slot])->port; }
static inline int boot_port(const sf_rig *g) { return eldr_worker_bootstrap_port(((wt_worker *)g->engine[0])->w); }

/* An artifact of the model's MoE layers telling the halves of its experts
 * apart (what the decision needs to run on a signature); with_latency: the
 * model's H200 latency coefficients (the footprint policy's). */
static inline char *artifact_of(int with_latency) {
  eldr_shape sh;
  char canon[64];
  uint32_t ids[ELDR_MAX_LAYERS];
  assert_int_equal(eldr_tracegen_model_shape(MODEL, &sh, canon, sizeof canon, NULL), 0);
  eldr_tracegen_layer_ids(MODEL, &sh, ids);
  eldr_artifact *a = sf_halves_artifact(canon, &sh, ids, 0, NULL);
  if (with_latency) {
    eldr_latency_model m;
    eldr_diag d = {{0}};
    if (eldr_latency_preset(MODEL, "h200", &m, &d)) fail_msg("latency preset: %s", d.msg);
    if (eldr_artifact_set_latency(a, &m, &d)) fail_msg("set latency: %s", d.msg);
  }
  return sf_artifact_save(a, with_latency ? "sglserve_lat" : "sglserve");
}

static inline char *artifact_for_model(void) { return artifact_of(0); }

/* Engines (1 prefill, nd decode; the last decode slot may be replaced by a
 * fixture), the router in --pd sglang with the ELDR policy and an artifact. */
static inline void rig_start(sf_rig *g, int nd, char **art) {
  eldr_worker_config c = engine_cfg();
  sf_start_engines(g, 1, &c, nd, &c);
  *art = artifact_for_model();
  g->c.threads = 1;
  g->c.policy = ELDR_POLICY_ELDR;
  g->c.artifact = strdup(*art);
  g->c.pd = ELDR_PD_SGLANG;
  g->c.bootstrap_port = boot_port(g);
}

static inline double worker_busy(int port) {
  double run = wt_metric(port, "vllm:num_requests_running{engine=\"0\",model_name=\"" MODEL "\"}");
  double wait = wt_metric(port, "vllm:num_requests_waiting{engine=\"0\",model_name=\"" MODEL "\"}");
  if (run != run || wait != wait) fail_msg("worker %d: no running/waiting series", port);
  return run + wait;
}

/* Wait until the worker has nothing running or waiting; 0 or -1. */
static inline int worker_idle(int port, double timeout_s) {
  double end = wt_now() + timeout_s;
  while (wt_now() < end) {
    if (worker_busy(port) <= 0) return 0;
    usleep(20000);
  }
  return -1;
}

#define LONG_PROMPT \
  "The mixture of experts routes every token to a few experts per layer, and a decode step loads the union of " \
  "what its batch selects from memory; requests that share their experts share that traffic, which is what a " \
  "router that knows the experts of each prompt can exploit when it picks the decoder of every request."

/* --pd sglang-exact in front of a prefill engine with --exact (the
 * emulated contrib/sglang-eldr-exact patch): the decode leg waits for the
 * prefill's forward-end counts and the decoder is chosen on them; nd decode
 * engines; ps: the prefill engine's time scale. */
static inline void exact_rig_start(sf_rig *g, int nd, int exact, double ps, char **art) {
  eldr_worker_config pc = engine_cfg(), dc = engine_cfg();
  pc.sglang_exact = exact;
  pc.time_scale = ps;
  sf_start_engines(g, 1, &pc, nd, &dc);
  *art = artifact_for_model();
  g->c.threads = 1;
  g->c.policy = ELDR_POLICY_ELDR;
  g->c.artifact = strdup(*art);
  g->c.pd = ELDR_PD_SGLANG_EXACT;
  g->c.bootstrap_port = boot_port(g);
}

static inline void rig_end(sf_rig *g, char *art) {
  sf_free(g);
  unlink(art);
  free(art);
}

#endif
