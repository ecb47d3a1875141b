/* sim_toy.h — the simulator tests' toy latency model (test_sim.c,
 * test_sim_pd.c): each distinct expert of a layer costs exactly 1 s, a step
 * costs 0.5 s more (so does every prefill batch), a KV transfer 0.25 s, and
 * nothing else costs anything (FLOPs are free). */
#ifndef ELDR_TESTS_SIM_TOY_H
#define ELDR_TESTS_SIM_TOY_H

#include <stdio.h>
#include <string.h>

#include "eldr/latency.h"

static inline void toy_model(eldr_latency_model *m, uint32_t L, uint32_t E, uint32_t K) {
  memset(m, 0, sizeof *m);
  snprintf(m->model, sizeof m->model, "toy");
  m->shape = (eldr_shape){L, E, K};
  m->expert_bytes = 1;
  m->hbm_bw = 1;
  m->peak_flops = 1e30;
  m->prefill_efficiency = 1;
  m->flops_peak = 1e30;
  m->gpus_per_worker = 1;
  m->step_overhead_s = 0.5; /* every step (and every prefill batch) pays 0.5 s */
  m->kv_transfer_bw = 1e30;
  m->kv_transfer_latency_s = 0.25;
}

#endif
