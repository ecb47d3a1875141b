/* latency.c — the MoE decode step-latency model, prefill and KV-transfer
 * models, presets derived from public model configs and hardware spec sheets
 * (every number and its source: docs/sim.md). */
#include "eldr/latency.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- model architectures (from each model's public config.json) --------- */
typedef struct arch {
  const char *name;
  uint32_t moe_layers, dense_layers, experts, top_k;
  double hidden, moe_inter, dense_inter, shared_inter;
  double q_heads, kv_heads, head_dim, vocab;
  double expert_dtype, dense_dtype, head_dtype, kv_dtype; /* bytes per element */
  int fp8;          /* compute runs at the FP8 peak */
  uint32_t gpus;    /* GPUs per worker as deployed */
  double attn_params;   /* attention params per layer when not q/kv-head shaped (MLA), else 0 */
  double attn_ctx_flops;/* attention FLOPs per context token per layer (MLA), else 0 */
  double sliding_window, sliding_fraction; /* sliding-window attention (0: none) */
} arch;

static const arch ARCHS[] = {
    /* Qwen/Qwen3-30B-A3B: 48 layers all MoE, 128 experts top-8, hidden 2048,
     * moe_intermediate_size 768, 32 q / 4 kv heads x 128, vocab 151936, bf16. */
    {"qwen3-30b-a3b", 48, 0, 128, 8, 2048, 768, 0, 0, 32, 4, 128, 151936, 2, 2, 2, 2, 0, 1, 0, 0, 0, 0},
    /* openai/gpt-oss-120b: 36 layers all MoE, 128 experts top-4, hidden 2880,
     * intermediate 2880, 64 q / 8 kv heads x 64, vocab 201088; experts MXFP4
     * (4.25 bits/param incl. scales), rest bf16; sliding_window 128 on
     * alternating layers (layer_types: even layers sliding_attention). */
    {"gpt-oss-120b", 36, 0, 128, 4, 2880, 2880, 0, 0, 64, 8, 64, 201088, 4.25 / 8, 2, 2, 2, 0,
     1, 0, 0, 128, 0.5},
    /* Qwen/Qwen3-235B-A22B: 94 layers all MoE, 128 experts top-8, hidden 4096,
     * moe_intermediate_size 1536, 64 q / 4 kv heads x 128, vocab 151936,
     * bf16, one worker = 8 GPUs with TP8 attention / EP8 experts. */
    {"qwen3-235b-a22b", 94, 0, 128, 8, 4096, 1536, 0, 0, 64, 4, 128, 151936, 2, 2, 2, 2, 0, 8, 0, 0, 0, 0},
    /* meta-llama/Llama-4-Maverick-17B-128E-Instruct(-FP8): 48 layers, MoE every
     * other layer (24 MoE + 24 dense), 128 routed experts top-1 + 1 shared
     * expert, hidden 5120, intermediate_size 8192 (experts), intermediate_size_mlp
     * 16384 (dense), 40 q / 8 kv heads x 128, vocab 202048; FP8 routed experts
     * only: attention, shared expert, router and dense layers stay bf16 (Meta's
     * fp8_mixed quantizes "only routed experts, not shared" and skips
     * non-MoE blocks: meta-llama/llama-models,
     * models/llama4/quantization/loader.py), bf16 KV, one worker = 8 GPUs. */
    {"llama4-maverick", 24, 24, 128, 1, 5120, 8192, 16384, 8192, 40, 8, 128, 202048, 1, 2, 2, 2, 1,
     8, 0, 0, 0, 0},
    /* allenai/OLMoE-1B-7B-0924: 16 layers all MoE, 64 experts top-8, hidden
     * 2048, intermediate 1024, 16 q / 16 kv heads x 128, vocab 50304, bf16. */
    {"olmoe-1b-7b", 16, 0, 64, 8, 2048, 1024, 0, 0, 16, 16, 128, 50304, 2, 2, 2, 2, 0, 1, 0, 0, 0, 0},
    /* deepseek-ai/DeepSeek-V3: 61 layers, first_k_dense_replace 3 (58 MoE +
     * 3 dense), 256 routed experts top-8 + 1 shared expert, hidden 7168,
     * moe_intermediate_size 2048, intermediate_size 18432 (dense), vocab
     * 129280, FP8 weights (bf16 head). MLA attention: 128 heads, q_lora_rank
     * 1536, kv_lora_rank 512, qk_nope 128 + qk_rope 64, v_head 128 ->
     * params 7168*1536 + 1536*128*192 + 7168*576 + 512*128*256 + 128*128*7168;
     * KV cache (512 + 64) bf16 per token per layer (kv_heads 1 x head_dim 288
     * x 2 x 2 bytes); absorbed attention 2*128*(576+512) FLOPs per context
     * token. One worker = 8 GPUs. */
    {"deepseek-v3", 58, 3, 256, 8, 7168, 2048, 18432, 2048, 128, 1, 288, 129280, 1, 1, 2, 2, 1, 8,
     7168.0 * 1536 + 1536.0 * 128 * 192 + 7168.0 * 576 + 512.0 * 128 * 256 + 128.0 * 128 * 7168,
     2.0 * 128 * (576 + 512), 0, 0},
};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])

/* ---- hardware (per GPU, vendor spec sheets) ------------------------------ */
typedef struct hw {
  const char *name;
  double bw;          /* HBM bytes/s */
  double bf16, fp8;   /* dense FLOP/s (no sparsity) */
  double layer_overhead_s; /* per transformer layer, single-GPU worker */
  double link_bw;     /* GPU-to-GPU bytes/s per direction (NVLink / Infinity Fabric) */
} hw;

static const hw HWS[] = {
    /* AMD Instinct MI300X: 5.3 TB/s HBM3, 1307.4 TFLOPS bf16, 2614.9 fp8;
     * 7 Infinity Fabric links, 896 GB/s peer bandwidth (both directions).
     * layer overhead calibrated to the 4.7x ratio (docs/sim.md). */
    {"mi300x", 5.3e12, 1307.4e12, 2614.9e12, 23e-6, 448e9},
    /* NVIDIA H200 SXM: 4.8 TB/s HBM3e, 989.4 TFLOPS bf16, 1978.9 fp8;
     * NVLink 900 GB/s (both directions). */
    {"h200", 4.8e12, 989.4e12, 1978.9e12, 15e-6, 450e9},
    /* NVIDIA H100 SXM: 3.35 TB/s HBM3, 989.4 TFLOPS bf16, 1978.9 fp8; NVLink 900 GB/s. */
    {"h100", 3.35e12, 989.4e12, 1978.9e12, 15e-6, 450e9},
};
#define N_HWS (sizeof HWS / sizeof HWS[0])

/* Deployment assumptions (docs/sim.md). */
#define BW_EFFICIENCY 0.80       /* achievable fraction of spec HBM bandwidth */
#define DECODE_FLOP_EFFICIENCY 0.50
#define PREFILL_EFFICIENCY 0.40  /* prefill MFU */
#define MULTI_GPU_EFFICIENCY 0.85 /* TP/EP scaling of aggregate bandwidth/FLOPs */
#define COLLECTIVE_S 30e-6       /* per layer on a multi-GPU worker: two collectives */
#define STEP_OVERHEAD_S 1.0e-3   /* scheduler + sampling per decode step */
#define NIC_BW 50e9              /* one 400 Gb/s RDMA NIC per GPU */
#define KV_HANDOFF_S 0.5e-3      /* fixed handoff latency per KV transfer */
#define A2A_LATENCY_S 15e-6      /* one EP all-to-all (dispatch or combine), fixed part */
#define A2A_EFFICIENCY 0.80      /* achievable fraction of the link bandwidth in all-to-all */

const char *eldr_latency_model_name(size_t i) { return i < N_ARCHS ? ARCHS[i].name : NULL; }
const char *eldr_latency_hardware_name(size_t i) { return i < N_HWS ? HWS[i].name : NULL; }

static void names_list(char *buf, size_t cap, int models) {
  buf[0] = 0;
  size_t n = models ? N_ARCHS : N_HWS;
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", models ? ARCHS[i].name : HWS[i].name);
  }
}

static int find_preset(const char *model, const char *hardware, const arch **ap, const hw **hp,
                       eldr_diag *d) {
  if (!model || !hardware) return eldr_diag_fail(d, ELDR_EINVAL, "latency preset: NULL argument");
  const arch *a = NULL;
  const hw *h = NULL;
  for (size_t i = 0; i < N_ARCHS; i++)
    if (!strcmp(ARCHS[i].name, model)) a = &ARCHS[i];
  for (size_t i = 0; i < N_HWS; i++)
    if (!strcmp(HWS[i].name, hardware)) h = &HWS[i];
  char names[256];
  if (!a) {
    names_list(names, sizeof names, 1);
    return eldr_diag_fail(d, ELDR_ENOTFOUND, "unknown model preset '%s' (known: %s)", model, names);
  }
  if (!h) {
    names_list(names, sizeof names, 0);
    return eldr_diag_fail(d, ELDR_ENOTFOUND, "unknown hardware preset '%s' (known: %s)", hardware,
                          names);
  }
  *ap = a;
  *hp = h;
  return 0;
}

static void fill_preset(const arch *a, const hw *h, uint32_t gpus, eldr_latency_model *m);

int eldr_latency_preset(const char *model, const char *hardware, eldr_latency_model *m,
                        eldr_diag *d) {
  const arch *a;
  const hw *h;
  if (!m) return eldr_diag_fail(d, ELDR_EINVAL, "latency preset: NULL argument");
  int rc = find_preset(model, hardware, &a, &h, d);
  if (rc < 0) return rc;
  fill_preset(a, h, a->gpus, m);
  return 0;
}

int eldr_latency_preset_ep(const char *model, const char *hardware, uint32_t tp, uint32_t ep,
                           eldr_latency_model *m, eldr_diag *d) {
  const arch *a;
  const hw *h;
  if (!m) return eldr_diag_fail(d, ELDR_EINVAL, "latency preset: NULL argument");
  if (tp < 1 || tp > 64 || ep < 1 || ep > 64)
    return eldr_diag_fail(d, ELDR_ERANGE, "latency preset: TP %u x EP %u: each must be in [1, 64]",
                          tp, ep);
  int rc = find_preset(model, hardware, &a, &h, d);
  if (rc < 0) return rc;
  if (a->experts % ep)
    return eldr_diag_fail(d, ELDR_ERANGE, "latency preset: %u experts of '%s' do not split over EP %u",
                          a->experts, a->name, ep);
  uint32_t g = tp > ep ? tp : ep;
  fill_preset(a, h, g, m);
  /* the TP all-reduce stays in the per-layer overhead; the EP all-to-all is
   * modelled explicitly (eldr_latency_a2a) */
  m->layer_overhead_s = h->layer_overhead_s + (tp > 1 ? COLLECTIVE_S / 2 : 0.0);
  m->tp = tp;
  m->ep = ep;
  m->rank_hbm_bw = h->bw * BW_EFFICIENCY;
  m->rank_flops = (a->fp8 ? h->fp8 : h->bf16) * DECODE_FLOP_EFFICIENCY;
  m->expert_flops_per_token = 2.0 * 3.0 * a->hidden * a->moe_inter;
  m->a2a_latency_s = ep > 1 ? A2A_LATENCY_S : 0.0;
  m->a2a_bw = h->link_bw * A2A_EFFICIENCY;
  /* dispatch in the weight dtype (FP8 for FP8 models), combine in bf16 */
  m->a2a_bytes_per_token = a->hidden * ((a->fp8 ? 1.0 : 2.0) + 2.0);
  return 0;
}

/* The model a on g GPUs of h, aggregate (no EP fields). */
static void fill_preset(const arch *a, const hw *h, uint32_t gpus, eldr_latency_model *m) {
  memset(m, 0, sizeof *m);
  snprintf(m->model, sizeof m->model, "%s", a->name);
  snprintf(m->hardware, sizeof m->hardware, "%s", h->name);
  m->shape.num_layers = a->moe_layers;
  m->shape.num_experts = a->experts;
  m->shape.top_k = a->top_k;

  double expert_params = 3.0 * a->hidden * a->moe_inter; /* SwiGLU gate, up, down */
  double attn_params = a->attn_params > 0 ? a->attn_params
                                          : 2.0 * a->hidden * a->q_heads * a->head_dim +
                                                2.0 * a->hidden * a->kv_heads * a->head_dim;
  double shared_params = 3.0 * a->hidden * a->shared_inter;
  double router_params = a->hidden * a->experts;
  double dense_mlp_params = 3.0 * a->hidden * a->dense_inter;
  double head_params = a->vocab * a->hidden;

  m->expert_bytes = expert_params * a->expert_dtype;
  m->dense_bytes_per_layer = (attn_params + shared_params + router_params) * a->dense_dtype;
  m->other_layer_bytes =
      a->dense_layers * (attn_params + dense_mlp_params) * a->dense_dtype + head_params * a->head_dtype;
  m->kv_bytes_per_token = 2.0 * a->kv_heads * a->head_dim * a->kv_dtype;
  m->kv_bytes_per_token_total = m->kv_bytes_per_token * (a->moe_layers + a->dense_layers);
  m->flops_per_token_per_layer =
      2.0 * (a->top_k * expert_params + attn_params + shared_params + router_params);
  m->attn_flops_per_ctx_token =
      a->attn_ctx_flops > 0 ? a->attn_ctx_flops : 4.0 * a->q_heads * a->head_dim;
  m->other_flops_per_token = 2.0 * (a->dense_layers * (attn_params + dense_mlp_params) + head_params);
  m->n_dense_layers = a->dense_layers;
  m->prefill_flops_per_token = a->moe_layers * m->flops_per_token_per_layer + m->other_flops_per_token;
  /* the routed experts run as their own grouped GEMM: their FLOPs per token
   * and expert (SwiGLU: 2 x 3 matrices) give that kernel its roofline */
  m->expert_flops_per_token = 2.0 * expert_params;

  double g = gpus;
  double par = g > 1 ? MULTI_GPU_EFFICIENCY : 1.0;
  double peak = a->fp8 ? h->fp8 : h->bf16;
  m->hbm_bw_peak = h->bw;
  m->flops_peak = peak;
  m->hbm_bw = g * h->bw * BW_EFFICIENCY * par;
  m->peak_flops = g * peak * DECODE_FLOP_EFFICIENCY * par;
  m->layer_overhead_s = h->layer_overhead_s + (g > 1 ? COLLECTIVE_S : 0.0);
  m->step_overhead_s = STEP_OVERHEAD_S;
  m->prefill_efficiency = PREFILL_EFFICIENCY * par;
  m->kv_transfer_bw = g * NIC_BW;
  m->kv_transfer_latency_s = KV_HANDOFF_S;
  m->gpus_per_worker = g;
  m->tp = g;
  m->ep = g;
  m->weight_bytes_per_param = a->expert_dtype;
  m->sliding_window = a->sliding_window;
  m->sliding_layer_fraction = a->sliding_fraction;
}

/* ---- overrides ----------------------------------------------------------- */
typedef struct field {
  const char *name;
  size_t off;
} field;

#define F(x) {#x, offsetof(eldr_latency_model, x)}
static const field FIELDS[] = {
    F(expert_bytes),          F(dense_bytes_per_layer),   F(other_layer_bytes),
    F(kv_bytes_per_token),    F(flops_per_token_per_layer), F(hbm_bw),
    F(peak_flops),            F(layer_overhead_s),        F(step_overhead_s),
    F(prefill_flops_per_token), F(prefill_efficiency),    F(kv_transfer_bw),
    F(kv_bytes_per_token_total), F(other_flops_per_token), F(attn_flops_per_ctx_token),
    F(n_dense_layers),        F(gpus_per_worker),         F(tp),
    F(ep),                    F(weight_bytes_per_param),  F(hbm_bw_peak),
    F(flops_peak),            F(kv_transfer_latency_s),   F(rank_hbm_bw),
    F(rank_flops),            F(expert_flops_per_token),  F(a2a_latency_s),
    F(a2a_bw),                F(a2a_bytes_per_token),     F(sliding_window),
    F(sliding_layer_fraction),
};
#undef F
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

int eldr_latency_validate(const eldr_latency_model *m, eldr_diag *d) {
  if (!m) return eldr_diag_fail(d, ELDR_EINVAL, "latency model: NULL");
  int rc = eldr_shape_validate(&m->shape, d);
  if (rc < 0) return rc;
  for (size_t i = 0; i < N_FIELDS; i++) {
    double v = *(const double *)((const char *)m + FIELDS[i].off);
    if (!isfinite(v) || v < 0 || v > 1e30)
      return eldr_diag_fail(d, ELDR_ERANGE, "latency model: field '%s' = %g must be in [0, 1e30]",
                            FIELDS[i].name, v);
  }
  if (m->hbm_bw <= 0) return eldr_diag_fail(d, ELDR_ERANGE, "latency model: hbm_bw must be > 0");
  if (m->peak_flops <= 0) return eldr_diag_fail(d, ELDR_ERANGE, "latency model: peak_flops must be > 0");
  if (m->prefill_efficiency <= 0 || m->prefill_efficiency > 1)
    return eldr_diag_fail(d, ELDR_ERANGE, "latency model: prefill_efficiency must be in (0, 1]");
  if (m->kv_transfer_bw <= 0)
    return eldr_diag_fail(d, ELDR_ERANGE, "latency model: kv_transfer_bw must be > 0");
  if (m->sliding_layer_fraction > 1)
    return eldr_diag_fail(d, ELDR_ERANGE, "latency model: sliding_layer_fraction must be in [0, 1]");
  return 0;
}

/* Parse {"field": value} into *m (unchanged on error). full: every field,
 * the shape and the names must be present (the artifact's latency section). */
static int parse_fields(const char *json, size_t len, eldr_latency_model *m, int full,
                        eldr_diag *d) {
  if (!json || !m) return eldr_diag_fail(d, ELDR_EINVAL, "latency overrides: NULL argument");
  size_t seen = 0;
  json_error_t err;
  json_t *root = json_loadb(json, len, 0, &err);
  if (!root)
    return eldr_diag_fail(d, ELDR_EPARSE, "latency overrides: line %d: %s", err.line, err.text);
  int rc = 0;
  eldr_latency_model tmp = *m;
  if (!json_is_object(root)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "latency overrides: top level must be an object");
    goto out;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "model") || !strcmp(key, "hardware")) {
      if (!json_is_string(val)) {
        rc = eldr_diag_fail(d, ELDR_EPARSE, "latency overrides: field '%s' must be a string", key);
        goto out;
      }
      char *dst = !strcmp(key, "model") ? tmp.model : tmp.hardware;
      snprintf(dst, sizeof tmp.model, "%s", json_string_value(val));
      seen++;
      continue;
    }
    if (!json_is_number(val)) {
      rc = eldr_diag_fail(d, ELDR_EPARSE, "latency overrides: field '%s' must be a number", key);
      goto out;
    }
    double v = json_number_value(val);
    if (!isfinite(v) || v < 0) {
      rc = eldr_diag_fail(d, ELDR_ERANGE, "latency overrides: field '%s' = %g must be >= 0", key, v);
      goto out;
    }
    if (!strcmp(key, "num_layers") || !strcmp(key, "num_experts") || !strcmp(key, "top_k")) {
      if (!json_is_integer(val) || v > 1e6) {
        rc = eldr_diag_fail(d, ELDR_EPARSE, "latency overrides: field '%s' must be an integer", key);
        goto out;
      }
      uint32_t *dst = !strcmp(key, "num_layers")    ? &tmp.shape.num_layers
                      : !strcmp(key, "num_experts") ? &tmp.shape.num_experts
                                                    : &tmp.shape.top_k;
      *dst = (uint32_t)v;
      seen++;
      continue;
    }
    size_t i = 0;
    for (; i < N_FIELDS; i++)
      if (!strcmp(FIELDS[i].name, key)) break;
    if (i == N_FIELDS) {
      rc = eldr_diag_fail(d, ELDR_ENOTFOUND, "latency overrides: unknown field '%s'", key);
      goto out;
    }
    *(double *)((char *)&tmp + FIELDS[i].off) = v;
    seen++;
  }
  if (full && seen != N_FIELDS + 5) {
    rc = eldr_diag_fail(d, ELDR_EPARSE,
                        "latency model: %zu of the %zu fields present (all of model, hardware, "
                        "num_layers, num_experts, top_k and the %zu numbers are required)",
                        seen, (size_t)N_FIELDS + 5, (size_t)N_FIELDS);
    goto out;
  }
  rc = eldr_latency_validate(&tmp, d);
  if (rc == 0) *m = tmp;
out:
  json_decref(root);
  return rc;
}

int eldr_latency_parse_overrides(const char *json, size_t len, eldr_latency_model *m,
                                 eldr_diag *d) {
  return parse_fields(json, len, m, 0, d);
}

int eldr_latency_parse_full(const char *json, size_t len, eldr_latency_model *m, eldr_diag *d) {
  eldr_latency_model tmp;
  memset(&tmp, 0, sizeof tmp);
  int rc = parse_fields(json, len, &tmp, 1, d);
  if (rc == 0 && m) *m = tmp;
  return rc;
}

char *eldr_latency_dump(const eldr_latency_model *m) {
  if (!m || eldr_latency_validate(m, NULL) < 0) return NULL;
  json_t *o = json_object();
  if (!o) return NULL;
  int bad = json_object_set_new(o, "model", json_string(m->model));
  bad |= json_object_set_new(o, "hardware", json_string(m->hardware));
  bad |= json_object_set_new(o, "num_layers", json_integer(m->shape.num_layers));
  bad |= json_object_set_new(o, "num_experts", json_integer(m->shape.num_experts));
  bad |= json_object_set_new(o, "top_k", json_integer(m->shape.top_k));
  for (size_t i = 0; i < N_FIELDS; i++)
    bad |= json_object_set_new(o, FIELDS[i].name,
                               json_real(*(const double *)((const char *)m + FIELDS[i].off)));
  char *s = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(o);
  return s;
}

/* ---- the model ----------------------------------------------------------- */
static inline double roofline(double bytes, double flops, const eldr_latency_model *m) {
  double tb = bytes / m->hbm_bw, tf = flops / m->peak_flops;
  return tb > tf ? tb : tf;
}

/* Dense layers, embeddings and LM head, their KV reads, their overheads. */
static double other_layers(const eldr_latency_model *m, size_t batch, double ctx_tokens) {
  double other_kv =
      ctx_tokens * (m->kv_bytes_per_token_total - (double)m->shape.num_layers * m->kv_bytes_per_token);
  if (other_kv < 0) other_kv = 0;
  double dense_ctx = m->kv_bytes_per_token > 0 ? other_kv / m->kv_bytes_per_token : 0;
  return roofline(m->other_layer_bytes + other_kv,
                  (double)batch * m->other_flops_per_token + dense_ctx * m->attn_flops_per_ctx_token,
                  m) +
         m->n_dense_layers * m->layer_overhead_s;
}

/* One MoE layer's time, the overhead aside. Two kernels, each on its own
 * roofline: the routed experts' grouped GEMM (the union's weights against
 * batch * K tokens of expert FLOPs) and the rest (attention, shared expert,
 * router, the KV reads). While both are memory-bound this is the layer's
 * bytes over the bandwidth, computed exactly as the single roofline of the
 * whole layer always was (so such steps keep their bits); once a kernel is
 * compute-bound the two add. A model without expert_flops_per_token (an
 * older latency section) keeps the single roofline of the whole layer. */
static inline double layer_time(const eldr_latency_model *m, double u, double batch, double ctx,
                                double inv_bw) {
  const double kv = ctx * m->kv_bytes_per_token;
  const double bytes = (u * m->expert_bytes + m->dense_bytes_per_layer + kv) * inv_bw;
  const double flops = batch * m->flops_per_token_per_layer + ctx * m->attn_flops_per_ctx_token;
  if (!(m->expert_flops_per_token > 0)) {
    const double tf = flops / m->peak_flops;
    return bytes > tf ? bytes : tf;
  }
  const double ef = batch * (double)m->shape.top_k * m->expert_flops_per_token;
  const double te_b = u * m->expert_bytes * inv_bw, te_f = ef / m->peak_flops;
  const double tr_b = (m->dense_bytes_per_layer + kv) * inv_bw,
               tr_f = (flops > ef ? flops - ef : 0) / m->peak_flops;
  if (te_b >= te_f && tr_b >= tr_f) return bytes;
  return (te_b > te_f ? te_b : te_f) + (tr_b > tr_f ? tr_b : tr_f);
}

double eldr_latency_moe_layer(const eldr_latency_model *m, size_t batch, uint32_t n_active,
                              double ctx_tokens) {
  return layer_time(m, (double)n_active, (double)batch, ctx_tokens, 1.0 / m->hbm_bw) +
         m->layer_overhead_s;
}

/* Context tokens whose KV MoE layer l reads: all of ctx_tokens on a full
 * attention layer; on a sliding-window layer at most window tokens of each
 * member (exact when every member's context is at least the window, the
 * common case in decode). ctx_win is that bound, precomputed by the caller. */
static inline double layer_ctx(const eldr_latency_model *m, uint32_t l, double ctx_tokens,
                               double ctx_win) {
  const double f = m->sliding_layer_fraction;
  if (f <= 0 || ctx_win >= ctx_tokens) return ctx_tokens;
  double x = (double)l * f;
  return x - floor(x) < f ? ctx_win : ctx_tokens;
}

static inline double window_ctx(const eldr_latency_model *m, size_t batch, double ctx_tokens) {
  return m->sliding_window > 0 ? (double)batch * m->sliding_window : ctx_tokens;
}

double eldr_latency_step_f(const eldr_latency_model *m, size_t batch, const double *union_per_layer,
                           double ctx_tokens) {
  const uint32_t L = m->shape.num_layers;
  double t = m->step_overhead_s;
  const double win = window_ctx(m, batch, ctx_tokens);
  double inv_bw = 1.0 / m->hbm_bw;
  if (m->sliding_layer_fraction <= 0 || win >= ctx_tokens) {
    /* every layer reads all of ctx_tokens */
    for (uint32_t l = 0; l < L; l++)
      t += layer_time(m, union_per_layer[l], (double)batch, ctx_tokens, inv_bw) + m->layer_overhead_s;
    return t + other_layers(m, batch, ctx_tokens);
  }
  for (uint32_t l = 0; l < L; l++)
    t += layer_time(m, union_per_layer[l], (double)batch, layer_ctx(m, l, ctx_tokens, win), inv_bw) +
         m->layer_overhead_s;
  return t + other_layers(m, batch, ctx_tokens);
}

double eldr_latency_a2a(const eldr_latency_model *m, size_t batch, uint32_t R) {
  if (R <= 1) return 0.0;
  double dests = m->shape.top_k < R - 1 ? (double)m->shape.top_k : (double)(R - 1);
  double bytes = (double)batch / R * dests * m->a2a_bytes_per_token;
  return 2.0 * m->a2a_latency_s + (m->a2a_bw > 0 ? bytes / m->a2a_bw : 0.0);
}

/* The non-expert part of one MoE layer (attention, shared expert, router,
 * KV reads) over the whole worker. */
static double layer_dense_part(const eldr_latency_model *m, size_t batch, double ctx_tokens) {
  double routed = (double)m->shape.top_k * m->expert_flops_per_token;
  double per_tok = m->flops_per_token_per_layer > routed ? m->flops_per_token_per_layer - routed : 0;
  return roofline(m->dense_bytes_per_layer + ctx_tokens * m->kv_bytes_per_token,
                  (double)batch * per_tok + ctx_tokens * m->attn_flops_per_ctx_token, m);
}

static double slowest_rank(const eldr_latency_model *m, const uint32_t *rex, const uint32_t *rtk,
                           uint32_t R) {
  double worst = 0;
  double eb = m->rank_hbm_bw > 0 ? m->expert_bytes / m->rank_hbm_bw : 0;
  double ef = m->rank_flops > 0 ? m->expert_flops_per_token / m->rank_flops : 0;
  for (uint32_t r = 0; r < R; r++) {
    double t = (double)rex[r] * eb + (double)rtk[r] * ef;
    if (t > worst) worst = t;
  }
  return worst;
}

double eldr_latency_moe_layer_ep(const eldr_latency_model *m, size_t batch,
                                 const uint32_t *rank_experts, const uint32_t *rank_tokens,
                                 uint32_t R, double ctx_tokens) {
  return layer_dense_part(m, batch, ctx_tokens) + slowest_rank(m, rank_experts, rank_tokens, R) +
         eldr_latency_a2a(m, batch, R) + m->layer_overhead_s;
}

double eldr_latency_step_ep(const eldr_latency_model *m, size_t batch, const uint32_t *rank_experts,
                            const uint32_t *rank_tokens, uint32_t R, double ctx_tokens) {
  const uint32_t L = m->shape.num_layers;
  if (R <= 1) { /* one rank: the aggregate step model itself (one model, not two) */
    double u[ELDR_MAX_LAYERS];
    for (uint32_t l = 0; l < L && l < ELDR_MAX_LAYERS; l++) u[l] = (double)rank_experts[l];
    return eldr_latency_step_f(m, batch, u, ctx_tokens);
  }
  const double win = window_ctx(m, batch, ctx_tokens);
  double t = m->step_overhead_s + (double)L * (eldr_latency_a2a(m, batch, R) + m->layer_overhead_s);
  for (uint32_t l = 0; l < L; l++)
    t += layer_dense_part(m, batch, layer_ctx(m, l, ctx_tokens, win)) +
         slowest_rank(m, rank_experts + (size_t)l * R, rank_tokens + (size_t)l * R, R);
  return t + other_layers(m, batch, ctx_tokens);
}

double eldr_latency_step(const eldr_latency_model *m, size_t batch,
                         const uint32_t *union_per_layer, double ctx_tokens) {
  double u[ELDR_MAX_LAYERS];
  const uint32_t L = m->shape.num_layers <= ELDR_MAX_LAYERS ? m->shape.num_layers : ELDR_MAX_LAYERS;
  for (uint32_t l = 0; l < L; l++) u[l] = (double)union_per_layer[l];
  return eldr_latency_step_f(m, batch, u, ctx_tokens);
}

double eldr_latency_expected_union(const eldr_shape *s, size_t batch) {
  double E = s->num_experts, K = s->top_k;
  if (E <= 0) return 0;
  return E * (1.0 - pow(1.0 - K / E, (double)batch));
}

double eldr_latency_prefill(const eldr_latency_model *m, size_t tokens) {
  if (tokens == 0) return m->step_overhead_s;
  double flops = (double)tokens * m->prefill_flops_per_token;
  double pf = m->flops_peak * (m->gpus_per_worker > 0 ? m->gpus_per_worker : 1.0) *
              m->prefill_efficiency;
  if (pf <= 0) pf = m->peak_flops;
  double compute = flops / pf;
  /* a prefill also reads every weight once (all experts are touched by a long prompt) */
  double weights = (double)m->shape.num_layers *
                       (eldr_latency_expected_union(&m->shape, tokens) * m->expert_bytes +
                        m->dense_bytes_per_layer) +
                   m->other_layer_bytes;
  double mem = weights / m->hbm_bw;
  return (compute > mem ? compute : mem) + m->step_overhead_s +
         ((double)m->shape.num_layers + m->n_dense_layers) * m->layer_overhead_s;
}

double eldr_latency_kv_transfer(const eldr_latency_model *m, size_t tokens) {
  return m->kv_transfer_latency_s + (double)tokens * m->kv_bytes_per_token_total / m->kv_transfer_bw;
}
