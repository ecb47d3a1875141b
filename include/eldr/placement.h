/* eldr/placement.h — expert-parallel (EP) expert placement: which physical
 * expert slot on which EP rank holds which logical expert, per MoE layer.
 *
 * A decode worker with expert parallelism over R ranks holds P = E + N
 * physical expert slots per MoE layer (N redundant replicas of hot experts);
 * slot p sits on rank p / (P / R) (SGLang's convention). A placement is the
 * map phys[l * P + p] = logical expert of slot p at MoE layer l — SGLang's
 * `physical_to_logical_map` (its JSON writer/reader: eldr/placement_io.h).
 *
 * Layouts:
 *  - linear: slot p holds logical p mod E (the engines' default, "trivial");
 *  - greedy (after METRO / the ELDR paper): per layer, the experts in
 *    decreasing estimated activation (ties: lower id) each go to the least
 *    loaded rank that still has a free slot (ties: lower rank), so every rank
 *    holds exactly P / R slots. With N > 0 redundant slots, the N extra slots
 *    first go one at a time to the expert with the highest activation per
 *    copy (ties: lower id); copies of one expert are placed on distinct ranks
 *    when a rank without it has a free slot, and each copy carries an equal
 *    share of the expert's activation.
 * Estimating the activation: eldr_placement_activation sums each calibration
 * request's decode selections (prefill when it has none) into its cluster
 * (nearest artifact centroid of its prefill signature) and into a global row.
 *
 * The EP tally (eldr_ep_tally) turns a decode batch's selections into what
 * the EP latency model needs per (layer, rank): the distinct physical experts
 * touched and the token-expert pairs dispatched there. A token's selection of
 * a replicated expert goes to copy (member index mod copies).
 *
 * Pure computation. Ownership: an eldr_placement owns its arrays
 * (eldr_placement_free); a tally owns its buffers (eldr_ep_tally_free).
 * Not thread-safe per object; distinct objects may be used concurrently.
 */
#ifndef ELDR_PLACEMENT_H
#define ELDR_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact_model.h"
#include "eldr/error.h"
#include "eldr/trace_model.h"

#define ELDR_PLACEMENT_MAX_RANKS 256

typedef struct eldr_placement {
  uint32_t num_layers;   /* MoE layers (rows) */
  uint32_t num_experts;  /* logical experts E */
  uint32_t ep_size;      /* EP ranks R */
  uint32_t num_physical; /* P = E + redundant, a multiple of R */
  uint16_t *phys;        /* owned, L * P: logical expert of each physical slot */
  /* derived by eldr_placement_index (called by every constructor and the reader) */
  uint32_t max_copies;   /* most copies of one logical expert in any layer */
  uint8_t *ncopies;      /* owned, L * E */
  uint16_t *copies;      /* owned, L * E * max_copies physical slots */
} eldr_placement;

/* Slots per rank. */
static inline uint32_t eldr_placement_per_rank(const eldr_placement *p) {
  return p->num_physical / p->ep_size;
}

/* *out = a placement with phys zeroed (not yet indexed). ELDR_ERANGE when
 * the shape is out of range, R is 0 or > ELDR_PLACEMENT_MAX_RANKS, or
 * E + redundant is not a multiple of R; ELDR_ENOMEM. */
int eldr_placement_alloc(uint32_t layers, uint32_t experts, uint32_t ep_size, uint32_t redundant,
                         eldr_placement **out, eldr_diag *d);
void eldr_placement_free(eldr_placement *p);

/* Check every logical expert has at least one slot in every layer, ids are
 * < E, copies of an expert sit on distinct slots, then build ncopies/copies.
 * ELDR_ERANGE naming the layer and expert on a bad map. */
int eldr_placement_index(eldr_placement *p, eldr_diag *d);

/* The engines' default contiguous layout. */
int eldr_placement_linear(uint32_t layers, uint32_t experts, uint32_t ep_size,
                          uint32_t redundant, eldr_placement **out, eldr_diag *d);

/* The greedy layout from act (L * E non-negative activations). */
int eldr_placement_greedy(const double *act, uint32_t layers, uint32_t experts, uint32_t ep_size,
                          uint32_t redundant, eldr_placement **out, eldr_diag *d);

/* Rank loads of layer l under activation act (L * E): loads (R entries)
 * receive the summed activation each rank serves (a replicated expert's
 * activation split equally over its copies). */
void eldr_placement_rank_loads(const eldr_placement *p, const double *act, uint32_t l,
                               double *loads);

/* Busiest-rank share of the activation, averaged over layers weighted by the
 * layer's total (1/R = perfectly even, 1 = all on one rank). NaN when act is
 * all zero. */
double eldr_placement_busiest_share(const eldr_placement *p, const double *act);

/* Per-cluster and global activation from calibration requests idx[0..n)
 * of t: act receives (a->k + 1) * L * E doubles (zeroed here): row block c
 * for cluster c (nearest centroid of the request's prefill signature under
 * a), block a->k for all requests. Decode selections when the request has
 * any, else prefill. Requests without a valid signature count only in the
 * global block. ELDR_ESHAPE if a's shape differs from t's, ELDR_ENOMEM. */
int eldr_placement_activation(const eldr_trace *t, const size_t *idx, size_t n,
                              const eldr_artifact *a, double *act, eldr_diag *d);

/* Which placement a decoder runs. */
typedef enum eldr_placement_kind {
  ELDR_PLACEMENT_LINEAR = 0,   /* engines' default contiguous layout */
  ELDR_PLACEMENT_GLOBAL,       /* greedy on all calibration traffic */
  ELDR_PLACEMENT_PER_DECODER,  /* greedy on the decoder's own cluster */
} eldr_placement_kind;
/* "linear", "global", "per-decoder"; parse: ELDR_EINVAL if unknown. */
const char *eldr_placement_kind_name(eldr_placement_kind k);
int eldr_placement_kind_parse(const char *s, eldr_placement_kind *out);

/* Greedy placements from eldr_placement_activation's act ((k + 1) blocks of
 * L * E): out[c] for cluster c < k, out[k] the global one (k + 1 entries,
 * caller's array; each freed with eldr_placement_free). On error none is
 * left allocated. */
int eldr_placement_fit_all(const double *act, size_t k, uint32_t layers, uint32_t experts,
                           uint32_t ep_size, uint32_t redundant, eldr_placement **out,
                           eldr_diag *d);

/* ---- EP tally of one decode step --------------------------------------- */
typedef struct eldr_ep_tally {
  uint32_t L, K, R, P;
  uint32_t *rank_experts; /* owned, L * R: distinct physical experts touched */
  uint32_t *rank_tokens;  /* owned, L * R: token-expert pairs dispatched */
  uint32_t *stamp;        /* owned, L * P */
  uint32_t step;
  /* running totals over steps (for the busiest-rank share of traffic) */
  double busiest_tokens, all_tokens;
} eldr_ep_tally;

/* Buffers for placements of L layers, top_k K, R ranks, P slots. */
int eldr_ep_tally_init(eldr_ep_tally *t, uint32_t L, uint32_t K, uint32_t R, uint32_t P,
                       eldr_diag *d);
void eldr_ep_tally_free(eldr_ep_tally *t);
/* Start a step (zero the per-rank counters). */
void eldr_ep_tally_begin(eldr_ep_tally *t);
/* Add one batch member's token: sel holds L * K logical expert ids. */
void eldr_ep_tally_add(eldr_ep_tally *t, const eldr_placement *p, const uint16_t *sel,
                       uint32_t member);
/* End a step: add its busiest-rank tokens and all tokens to the totals. */
void eldr_ep_tally_end(eldr_ep_tally *t);

#endif
