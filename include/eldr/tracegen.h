/* eldr/tracegen.h — synthetic expert traces for real model shapes.
 *
 * A generative model: per-domain, per-layer expert preference vectors; a
 * global popularity skew (generalist experts); request-level variation
 * inside a domain; drift from prefill to decode; prompt and output lengths
 * of chat serving. Presets: workload "task" (sharp domains) and "language"
 * (soft domains, heavy traffic skew). Deterministic for a seed.
 *
 * The model (docs/trace.md has the calibration and the sources):
 *   logit(d, l, e)   = pop_sd * G(l, e) + boost * [e generalist at l]
 *                      + domain_sd * D(d, l, e)            (G, D ~ N(0, 1))
 *   request r of d:  R(l, e) = logit(d, l, e) + request_sd * N(0, 1)
 *   prefill:         P = R + prefill_sd * N(0, 1)     decode: Q = R + decode_sd * N(0, 1)
 *   decode segment s >= 1 (tokens [T 2^(s-1), T 2^s)): Q_s = Q_(s-1) + decode_drift_sd * N(0, 1),
 *   and segment s samples from softmax((1 + decode_sharpen / 2^s) Q_s)
 *   every token and layer picks top_k distinct experts by sampling without
 *   replacement from softmax(P) (prefill) or softmax(Q) (decode).
 * Prompt / output lengths are log-normal (median, sigma), clipped to [min, max].
 * Request i depends only on (seed, i): generating a prefix of a trace gives
 * the same first requests.
 *
 * Ownership: eldr_tracegen objects own their tables; traces produced are
 * new eldr_trace objects owned by the caller. A generator is not
 * thread-safe for eldr_tracegen_request/request_into/generate (it uses
 * scratch space; one generator per thread, as trace gen -j does);
 * eldr_tracegen_from_text is const and allocates its own scratch.
 */
#ifndef ELDR_TRACEGEN_H
#define ELDR_TRACEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/trace_model.h"

/* Model shape preset: "qwen3-30b-a3b", "gpt-oss-120b", "qwen3-235b-a22b",
 * "llama4-maverick", "olmoe-1b-7b", "deepseek-v3", or "custom:L,E,K".
 * canonical (optional, canonical_cap bytes) receives the model name written
 * into traces: the Hugging Face name of the preset (e.g. "Qwen3-30B-A3B"),
 * or "custom-L-E-K". Unknown name / bad custom shape: ELDR_EINVAL /
 * ELDR_ERANGE with a message. */
int eldr_tracegen_model_shape(const char *name, eldr_shape *shape, char *canonical,
                              size_t canonical_cap, eldr_diag *d);

/* MoE layer ids of a preset (e.g. Llama-4-Maverick: odd layers 1..47);
 * 0..L-1 for the others and for custom shapes. ids has shape->num_layers
 * entries. model_name may be a preset key or a canonical name. */
void eldr_tracegen_layer_ids(const char *model_name, const eldr_shape *shape, uint32_t *ids);

/* The preset a served model name belongs to: its last path component
 * starts with the preset's Hugging Face name, case aside (e.g.
 * "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8" is llama4-maverick),
 * or equals its key. Fills shape, its MoE layer ids (shape->num_layers
 * entries, ids capacity ELDR_MAX_LAYERS) and *hidden, the model's hidden
 * layers (the last MoE layer id + 1: the layer rows vLLM's routed_experts
 * carry). ELDR_ENOTFOUND (no message) when no preset matches. */
int eldr_tracegen_served_layers(const char *served, eldr_shape *shape, uint32_t *ids, uint32_t *hidden);

#define ELDR_TRACEGEN_MAX_DOMAINS 64
#define ELDR_TRACEGEN_NAME_MAX 48

/* Log-normal length distribution, clipped to [min, max]. */
typedef struct eldr_tracegen_length {
  double median; /* exp(mu) */
  double sigma;  /* sd of log length */
  uint32_t min, max;
} eldr_tracegen_length;

/* A workload: the parameters of the model above. */
typedef struct eldr_tracegen_workload {
  char name[ELDR_TRACEGEN_NAME_MAX];
  size_t n_domains; /* 1..ELDR_TRACEGEN_MAX_DOMAINS */
  char domain_names[ELDR_TRACEGEN_MAX_DOMAINS][ELDR_TRACEGEN_NAME_MAX];
  double domain_weight[ELDR_TRACEGEN_MAX_DOMAINS]; /* traffic share (normalised on use) */
  double pop_sd;           /* global popularity logit sd */
  uint32_t generalists;    /* generalist experts per layer */
  double generalist_boost; /* logit added to them */
  double domain_sd;        /* domain preference logit sd */
  double request_sd;       /* request variation logit sd */
  double prefill_sd;       /* prefill-only noise */
  double decode_sd;        /* decode-only noise (prefill->decode drift) */
  /* Drift over decode steps: the decode tokens come in segments of
   * drift_tokens, 2 x, 4 x, ... tokens (doubling: [0, T), [T, 2T), [2T, 4T),
   * ...); each segment after the first adds decode_drift_sd * N(0, 1) to
   * the request's decode logits (a random walk), so a request's experts
   * wander from its prompt's as it generates. 0: none (one decode
   * distribution, the earlier model). */
  double decode_drift_sd;
  uint32_t drift_tokens;   /* the first segment's tokens (>= 1; 16 when 0) */
  /* Early decode tokens are more alike across requests (formulaic openings)
   * than later ones: segment s's logits are multiplied by 1 + decode_sharpen
   * / 2^s (an inverse temperature falling back to 1: sharper, so fewer
   * distinct experts, at the start). 0: none. Needs the segments: with
   * decode_sharpen > 0 they are used even at decode_drift_sd 0. */
  double decode_sharpen;
  eldr_tracegen_length prompt, output;
} eldr_tracegen_workload;

/* Fill a preset workload: "realistic" (the default of demo and sim
 * --generate: calibrated to measured traces, see docs/trace.md), or the
 * paper-shaped presets "task" and "language" (tuned to the paper's published,
 * sharper statistics). ELDR_ENOTFOUND if unknown. */
int eldr_tracegen_workload_preset(const char *name, eldr_tracegen_workload *w, eldr_diag *d);

/* Set the sds of the "realistic" preset for a model shape (top_k, experts):
 * eldr_tracegen_new does this for workload "realistic"; the preset alone
 * holds the top-8 / 128-expert values. */
void eldr_tracegen_realistic_for_shape(eldr_tracegen_workload *w, uint32_t top_k,
                                       uint32_t num_experts);

/* Parse a JSON workload description (see docs/trace.md): every field of
 * eldr_tracegen_workload, optional fields default to the "task" preset;
 * "base": "task"|"language" picks the defaults. Errors name the field. */
int eldr_tracegen_workload_parse(const char *json, size_t len, eldr_tracegen_workload *w,
                                 eldr_diag *d);

/* Check ranges (sd >= 0 and finite, weights > 0, lengths 1 <= min <= max,
 * generalists < E given; names non-empty and distinct). */
int eldr_tracegen_workload_validate(const eldr_tracegen_workload *w, eldr_diag *d);

typedef struct eldr_tracegen eldr_tracegen;

/* Build a generator for a model shape and a workload (copied). model_name
 * is written into traces (NULL: "custom"); layer ids follow
 * eldr_tracegen_layer_ids. (By workload name, "custom:FILE" included:
 * eldr_tracegen_new, eldr/preset_files.h.) */
int eldr_tracegen_new_workload(const eldr_shape *shape, const char *model_name,
                               const eldr_tracegen_workload *w, uint64_t seed,
                               eldr_tracegen **out, eldr_diag *d);
void eldr_tracegen_free(eldr_tracegen *g);

/* Length overrides: force_decode > 0 makes every output exactly that long;
 * max_decode / max_prompt > 0 cap the drawn lengths. 0 = off. */
void eldr_tracegen_set_lengths(eldr_tracegen *g, uint32_t force_decode, uint32_t max_decode,
                               uint32_t max_prompt);

/* Number of domains. */
size_t eldr_tracegen_domains(const eldr_tracegen *g);
const eldr_tracegen_workload *eldr_tracegen_get_workload(const eldr_tracegen *g);
const eldr_shape *eldr_tracegen_shape(const eldr_tracegen *g);
const char *eldr_tracegen_model(const eldr_tracegen *g);
const uint32_t *eldr_tracegen_layer_ids_of(const eldr_tracegen *g);

/* One generated request; the arrays are owned by the generator and valid
 * until the next call on g. */
typedef struct eldr_tracegen_req {
  int domain;
  uint32_t n_prefill, n_decode;
  const uint16_t *prefill; /* n_prefill * L * K */
  const uint16_t *decode;  /* n_decode * L * K */
} eldr_tracegen_req;

/* Generate request number index (a pure function of seed and index). */
int eldr_tracegen_request(eldr_tracegen *g, size_t index, eldr_tracegen_req *out, eldr_diag *d);

/* Caller-owned selection buffers, grown (eldr_grow) as requests need; the
 * caller frees prefill and decode. Zero-initialise before first use. */
typedef struct eldr_tracegen_bufs {
  uint16_t *prefill, *decode;
  size_t prefill_cap, decode_cap; /* in tokens */
} eldr_tracegen_bufs;

/* eldr_tracegen_request written straight into b (no copy; the same
 * selections): out's arrays are b's. ELDR_ENOMEM (b keeps its old
 * buffers) when a buffer cannot grow. */
int eldr_tracegen_request_into(eldr_tracegen *g, size_t index, eldr_tracegen_bufs *b,
                               eldr_tracegen_req *out, eldr_diag *d);

/* Request index's selections with the domain request domain_index would
 * draw and exactly n_prefill prompt and n_decode output tokens (the
 * length overrides of eldr_tracegen_set_lengths do not apply): a request
 * whose lengths come from elsewhere (a Mooncake trace, eldr/mooncake.h),
 * in the domain of the conversation it continues. Otherwise as
 * eldr_tracegen_request_into (the same buffers and errors). */
int eldr_tracegen_request_sized(eldr_tracegen *g, size_t index, size_t domain_index, uint32_t n_prefill,
                                uint32_t n_decode, eldr_tracegen_bufs *b, eldr_tracegen_req *out,
                                eldr_diag *d);

/* An empty trace with g's model, shape, layer ids and every domain label
 * interned in order and the generator string (for streaming writes with eldr_trace_write_request).
 * NULL on allocation failure. */
eldr_trace *eldr_tracegen_trace_header(const eldr_tracegen *g);

/* The generator string written into traces (eldr_trace.generator):
 * "eldr-tracegen workload=<name> seed=<seed>". The domain tables depend on
 * exactly these two (and the model shape), so two traces with different
 * strings have unrelated domains. */
void eldr_tracegen_provenance(const eldr_tracegen *g, char *buf, size_t cap);

/* Request id written for request index of domain: "<domain>/<index>". */
void eldr_tracegen_request_id(const eldr_tracegen *g, size_t index, int domain, char *buf,
                              size_t cap);

/* Generate n requests into a new trace (requests 0..n-1, the same trace as
 * n calls of eldr_tracegen_request). Uses one thread per online core (at
 * most 16) from 256 requests up, each with its own scratch; g is only read
 * meanwhile, so do not use g from another thread during the call. */
int eldr_tracegen_generate(eldr_tracegen *g, size_t n, eldr_trace **out, eldr_diag *d);

/* Domain chosen for a text by the built-in stable classifier: hand-written
 * scores (keyword lists and character classes) for seven style archetypes
 * - 0 code, 1 maths/LaTeX, 2 narrative prose, 3 web text (the default),
 * 4 encyclopedic, 5 chat questions, 6 non-English script - the highest
 * wins, folded onto n_domains as archetype % n_domains. Deterministic;
 * depends on nothing but the text (no training data). */
int eldr_tracegen_text_domain(const char *text, size_t len, size_t n_domains);

/* Generate one request's selections deterministically from a prompt text
 * (domain chosen from the text's hash / content), with n_prefill prompt
 * tokens and n_decode output tokens. *prefill and *decode are malloc'd
 * (n * L * K each); caller frees. *domain receives the domain index. */
int eldr_tracegen_from_text(const eldr_tracegen *g, const char *text, size_t len,
                            uint32_t n_prefill, uint32_t n_decode, uint16_t **prefill,
                            uint16_t **decode, int *domain, eldr_diag *d);

#endif
