/* eldr/latency.h — the MoE decode step-latency model (roofline per layer)
 * and the prefill / KV-transfer time models, with presets from public specs.
 *
 * Per MoE layer: bytes = union_experts * expert_bytes + dense/attention/
 * shared-expert bytes (loaded once) + KV-cache reads for the batch's context;
 * time = max(bytes / HBM bandwidth, flops / compute peak) + per-layer
 * overhead; step = sum over layers (+ dense layers) + per-step overhead.
 *
 * A preset describes a whole decode worker as deployed (GPUs per worker,
 * TP/EP degree, weight dtype): bandwidth and FLOP/s are the worker's
 * effective aggregate. Every number, its source and the assumptions are
 * listed in docs/sim.md; every field can be overridden from a JSON file.
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
  /* additions (all overridable) */
  double other_flops_per_token;    /* FLOPs per token outside the MoE layers (dense layers, LM head) */
  double attn_flops_per_ctx_token; /* attention score/value FLOPs per context token per layer */
  double n_dense_layers;           /* non-MoE transformer layers (each pays layer_overhead_s) */
  double gpus_per_worker;          /* descriptive: GPUs in one decode/prefill worker */
  double tp, ep;                   /* descriptive: tensor / expert parallel degree */
  double weight_bytes_per_param;   /* descriptive: routed-expert weight dtype size */
  double hbm_bw_peak;              /* descriptive: per-GPU spec-sheet bandwidth, bytes/s */
  double flops_peak;               /* descriptive: per-GPU spec-sheet dense FLOP/s of the dtype */
  double kv_transfer_latency_s;    /* fixed handoff latency added to each KV transfer */
  /* expert parallelism (eldr_latency_step_ep; 0 in the aggregate presets) */
  double rank_hbm_bw;              /* bytes/s of one EP rank (one GPU), effective */
  double rank_flops;               /* FLOP/s of one EP rank, effective */
  double expert_flops_per_token;   /* FLOPs of one token through one routed expert */
  double a2a_latency_s;            /* fixed cost of one all-to-all (dispatch or combine) */
  double a2a_bw;                   /* bytes/s one rank sends during an all-to-all */
  double a2a_bytes_per_token;      /* dispatch + combine bytes of one token to one rank */
  double sliding_window;           /* tokens a sliding-window attention layer attends (0: none) */
  double sliding_layer_fraction;   /* share of MoE layers with sliding-window attention, in [0, 1]:
                                      layer l slides when frac(l * f) < f (f = 0.5: even layers) */
} eldr_latency_model;

/* Fill m from a model preset ("qwen3-30b-a3b", "gpt-oss-120b",
 * "qwen3-235b-a22b", "llama4-maverick", "olmoe-1b-7b", "deepseek-v3") on a hardware preset
 * ("mi300x", "h200", "h100"). ELDR_ENOTFOUND names the unknown preset. */
int eldr_latency_preset(const char *model, const char *hardware, eldr_latency_model *m,
                        eldr_diag *d);

/* A TP x EP decode worker: the model on max(tp, ep) GPUs of the hardware,
 * attention (and shared experts) tensor-parallel over tp, routed experts
 * spread over ep ranks; fills the EP fields for eldr_latency_step_ep.
 * tp, ep in [1, 64]. Numbers and sources: docs/sim.md. */
int eldr_latency_preset_ep(const char *model, const char *hardware, uint32_t tp, uint32_t ep,
                           eldr_latency_model *m, eldr_diag *d);

/* Names of the presets: index i < count, else NULL. */
const char *eldr_latency_model_name(size_t i);
const char *eldr_latency_hardware_name(size_t i);

/* Override fields from a JSON text of {"field": number, ...} (field names as
 * in the struct; "model"/"hardware" take strings, "num_layers", "num_experts",
 * "top_k" set the shape). Unknown fields, non-numbers and negative values are
 * errors naming the field; m is unchanged on error. (From a file:
 * eldr_latency_load_overrides, eldr/preset_files.h.) */
int eldr_latency_parse_overrides(const char *json, size_t len, eldr_latency_model *m,
                                 eldr_diag *d);

/* A complete model from JSON (every field of eldr_latency_dump present; a
 * missing one is ELDR_EPARSE naming the count), validated. */
int eldr_latency_parse_full(const char *json, size_t len, eldr_latency_model *m, eldr_diag *d);
/* The whole model as compact JSON (malloc'd, caller frees; 17 significant
 * digits, so parse_full gives it back bit-identical). NULL when m does not
 * validate or on allocation failure. */
char *eldr_latency_dump(const eldr_latency_model *m);

/* Check the model is usable (shape valid, bandwidths/peaks > 0, finite). */
int eldr_latency_validate(const eldr_latency_model *m, eldr_diag *d);

/* Seconds for one decode step: batch members, union_per_layer[l] = distinct
 * experts the batch selects at MoE layer l (L entries), ctx_tokens = total
 * context tokens of the batch (KV reads). */
double eldr_latency_step(const eldr_latency_model *m, size_t batch,
                         const uint32_t *union_per_layer, double ctx_tokens);
/* The same step time with fractional (expected) unions per layer: the one
 * implementation; eldr_latency_step converts and calls it. The footprint
 * policy predicts with it. */
double eldr_latency_step_f(const eldr_latency_model *m, size_t batch, const double *union_per_layer,
                           double ctx_tokens);

/* Seconds for one MoE layer (roofline + layer overhead) with n_active
 * distinct experts, batch tokens and ctx_tokens of context. */
double eldr_latency_moe_layer(const eldr_latency_model *m, size_t batch, uint32_t n_active,
                              double ctx_tokens);

/* Expert parallelism over R ranks. For one MoE layer, rank_experts[r] =
 * distinct physical experts the batch touches on rank r and rank_tokens[r] =
 * token-expert pairs dispatched to it (eldr/placement.h's tally):
 *   t = roofline(attention/shared bytes + KV reads over the worker, their FLOPs)
 *     + max_r (rank_experts[r] * expert_bytes / rank_hbm_bw
 *              + rank_tokens[r] * expert_flops_per_token / rank_flops)
 *     + eldr_latency_a2a(batch) + layer_overhead_s. */
double eldr_latency_moe_layer_ep(const eldr_latency_model *m, size_t batch,
                                 const uint32_t *rank_experts, const uint32_t *rank_tokens,
                                 uint32_t R, double ctx_tokens);
/* A whole step: layer l's counters at [l * R, (l + 1) * R); plus the dense
 * layers, head and step overhead as in eldr_latency_step. R <= 1 is the
 * aggregate model: eldr_latency_step_f with union_per_layer[l] =
 * rank_experts[l] (so EP size 1 and the footprint policy's prediction are
 * the same step model). */
double eldr_latency_step_ep(const eldr_latency_model *m, size_t batch, const uint32_t *rank_experts,
                            const uint32_t *rank_tokens, uint32_t R, double ctx_tokens);
/* Dispatch + combine of one MoE layer: 2 * a2a_latency_s + each rank's
 * share of the batch (batch / R tokens) sent to min(top_k, R - 1) other ranks
 * at a2a_bytes_per_token each, over a2a_bw. 0 when R <= 1. */
double eldr_latency_a2a(const eldr_latency_model *m, size_t batch, uint32_t R);

/* Expected distinct experts per layer when batch tokens each pick top_k of
 * num_experts uniformly: E * (1 - (1 - K/E)^B). */
double eldr_latency_expected_union(const eldr_shape *s, size_t batch);

/* Seconds to prefill `tokens` prompt tokens (compute bound). */
double eldr_latency_prefill(const eldr_latency_model *m, size_t tokens);

/* Seconds to transfer the KV cache of `tokens` tokens. */
double eldr_latency_kv_transfer(const eldr_latency_model *m, size_t tokens);

#endif
