/* eldr/latency.h — the MoE decode step-latency model (roofline per layer)
 * and the prefill / KV-transfer time models, with presets from public specs.
 *
 * Per MoE layer: bytes = union_experts * expert_bytes + dense/attention/
 * shared-expert bytes (loaded once) + KV-cache reads for the batch's context;
 * time = max(bytes / HBM bandwidth, flops / compute peak) + per-layer
 * overhead; step = sum over layers (+ dense layers) + per-step overhead.
 *
 * Pure computation, no allocation in the step function (called per step by
 * the simulator and by the emulated worker).
 */
#ifndef ELDR_LATENCY_H
#define ELDR_LATENCY_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"

typedef struct eldr_latency_model {
  char model[64], hardware[64];
  eldr_shape shape;           /* MoE layers, experts, top_k */
  /* model */
  double expert_bytes;        /* bytes of one routed expert's weights (one layer) */
  double dense_bytes_per_layer;   /* attention + shared expert + norms per MoE layer */
  double other_layer_bytes;   /* dense (non-MoE) layers' bytes in total, + embeddings/head per step */
  double kv_bytes_per_token;  /* KV-cache bytes per context token per layer */
  double flops_per_token_per_layer; /* active FLOPs per token per MoE layer */
  /* hardware (whole decode worker) */
  double hbm_bw;              /* bytes/s, effective */
  double peak_flops;          /* FLOP/s, effective */
  double layer_overhead_s;
  double step_overhead_s;
  /* prefill / transfer */
  double prefill_flops_per_token; /* whole model */
  double prefill_efficiency;
  double kv_transfer_bw;      /* bytes/s between prefill and decode */
  double kv_bytes_per_token_total; /* all layers */
} eldr_latency_model;

/* Fill m from a model preset ("qwen3-30b-a3b", "gpt-oss-120b",
 * "qwen3-235b-a22b", "llama4-maverick", "olmoe-1b-7b") on a hardware preset
 * ("mi300x", "h200", "h100"). ELDR_ENOTFOUND names the unknown preset. */
int eldr_latency_preset(const char *model, const char *hardware, eldr_latency_model *m,
                        eldr_diag *d);

/* Override fields from a JSON file of {"field": number, ...}. */
int eldr_latency_load_overrides(const char *path, eldr_latency_model *m, eldr_diag *d);

/* Seconds for one decode step: batch members, union_per_layer[l] = distinct
 * experts the batch selects at MoE layer l (L entries), ctx_tokens = total
 * context tokens of the batch (KV reads). */
double eldr_latency_step(const eldr_latency_model *m, size_t batch,
                         const uint32_t *union_per_layer, double ctx_tokens);

/* Seconds to prefill `tokens` prompt tokens (compute bound). */
double eldr_latency_prefill(const eldr_latency_model *m, size_t tokens);

/* Seconds to transfer the KV cache of `tokens` tokens. */
double eldr_latency_kv_transfer(const eldr_latency_model *m, size_t tokens);

#endif
