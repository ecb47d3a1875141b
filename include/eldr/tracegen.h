/* eldr/tracegen.h — synthetic expert traces for real model shapes.
 *
 * A generative model: per-domain, per-layer expert preference vectors; a
 * global popularity skew (generalist experts); request-level variation
 * inside a domain; drift from prefill to decode; prompt and output lengths
 * of chat serving. Presets: workload "task" (sharp domains) and "language"
 * (soft domains, heavy traffic skew). Deterministic for a seed.
 *
 * Ownership: eldr_tracegen objects own their tables; traces produced are
 * new eldr_trace objects owned by the caller.
 */
#ifndef ELDR_TRACEGEN_H
#define ELDR_TRACEGEN_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/trace.h"

/* Model shape preset: "qwen3-30b-a3b", "gpt-oss-120b", "qwen3-235b-a22b",
 * "llama4-maverick", "olmoe-1b-7b", or "custom:L,E,K". */
int eldr_tracegen_model_shape(const char *name, eldr_shape *shape, char *canonical,
                              size_t canonical_cap, eldr_diag *d);

typedef struct eldr_tracegen eldr_tracegen;

/* Build a generator for a model shape and workload ("task", "language", or
 * "custom:FILE" with a JSON workload description). */
int eldr_tracegen_new(const eldr_shape *shape, const char *model_name, const char *workload,
                      uint64_t seed, eldr_tracegen **out, eldr_diag *d);
void eldr_tracegen_free(eldr_tracegen *g);

/* Number of domains and a domain's name (owned by g). */
size_t eldr_tracegen_domains(const eldr_tracegen *g);
const char *eldr_tracegen_domain_name(const eldr_tracegen *g, size_t i);

/* Generate n requests into a new trace. */
int eldr_tracegen_generate(eldr_tracegen *g, size_t n, eldr_trace **out, eldr_diag *d);

/* Generate one request's selections deterministically from a prompt text
 * (domain chosen from the text's hash / content), with n_prefill prompt
 * tokens and n_decode output tokens. *prefill and *decode are malloc'd
 * (n * L * K each); caller frees. *domain receives the domain index. */
int eldr_tracegen_from_text(const eldr_tracegen *g, const char *text, size_t len,
                            uint32_t n_prefill, uint32_t n_decode, uint16_t **prefill,
                            uint16_t **decode, int *domain, eldr_diag *d);

#endif
