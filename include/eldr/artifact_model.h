/* eldr/artifact_model.h — the routing artifact in memory (core layer):
 * everything the online router needs, fitted offline by `eldr fit`; its
 * constructor and validator. The JSON codec (parse, load, dump, save) and
 * the file layout are eldr/artifact.h in the format layer.
 *
 * Validation (eldr_artifact_validate, also run by the codec): unknown
 * version, wrong dimensions, NaN/inf, negative IDF, centroids with
 * |norm - 1| > 1e-3, mask out of range or empty, tau outside [0, 2],
 * fit.rho outside [-1, 1] (NaN: not measured), repeated layer ids.
 * Errors: ELDR_EVERSION, ELDR_ESHAPE, ELDR_ERANGE, ELDR_EINVAL,
 * ELDR_EUNSUPPORTED, each naming the field.
 *
 * Ownership: an eldr_artifact owns its arrays; eldr_artifact_free() releases.
 * Threads: not locked; a validated artifact may be read from any thread.
 */
#ifndef ELDR_ARTIFACT_MODEL_H
#define ELDR_ARTIFACT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/latency.h"
#include "eldr/signature.h"
#include "eldr/watch.h"

#define ELDR_ARTIFACT_VERSION 1

/* What chose an artifact's representation, IDF and layer mask (fit.chosen_by). */
typedef enum eldr_fit_evidence {
  ELDR_FIT_BY_UNKNOWN = 0,   /* an artifact written before it was recorded */
  ELDR_FIT_BY_RHO,           /* "rho": the signature quality on decode selections */
  ELDR_FIT_BY_NAMED,         /* "named": the user named representation and layers */
  ELDR_FIT_BY_PREFILL_ONLY,  /* "prefill_only": no decode selections; the defaults,
                                accepted by the user (eldr fit --prefill-only) */
} eldr_fit_evidence;

/* "unknown", "rho", "named", "prefill_only". */
const char *eldr_fit_evidence_name(int e);

typedef struct eldr_artifact {
  int version;
  char *model;          /* owned */
  eldr_shape shape;
  uint32_t *layer_ids;  /* owned, L entries */
  eldr_repr repr;
  int idf_enabled;
  float *idf;           /* owned, L*E, NULL when IDF is off */
  uint8_t *mask;        /* owned, L flags */
  size_t k;             /* centroids = decoders */
  size_t dim;           /* |mask| * E */
  float *centroids;     /* owned, k*dim */
  double tau;
  /* fit metadata */
  size_t fit_n;
  uint64_t fit_seed;
  double fit_rho;
  int fit_balanced;
  int fit_chosen_by;     /* eldr_fit_evidence: what chose repr, IDF and mask */
  size_t fit_decode_n;   /* requests of the fit carrying decode selections
                            (SIZE_MAX: not recorded, an older artifact) */
  size_t *cluster_sizes; /* owned, k entries */
  char *created;         /* owned, may be NULL */
  char *trace;           /* owned, may be NULL */
  char *trace_generator; /* owned, may be NULL: the fitted trace's generator */
  struct eldr_artifact_placement *placement; /* owned, NULL when absent */
  eldr_latency_model *latency; /* owned, NULL when the artifact carries no coefficients */
  float *fp_prior;             /* owned, fp_n_priors * L*E: the footprint profile's priors
                                  (eldr/fp_prior.h): row 0 global, row 1 + c cluster c's;
                                  NULL when absent */
  size_t fp_n_priors;          /* 1 (global only) or 1 + k */
  double fp_prior_tokens;      /* their weight in pseudo-tokens (> 0 with a prior) */
  eldr_drift_ref *drift_ref;   /* owned, fit.drift_ref (eldr/watch.h); NULL in artifacts
                                  written before it (drift then unknown) */
  uint64_t text_hash;          /* XXH3-64 of the JSON text it was parsed from (0: built in memory) */
} eldr_artifact;

/* The expert-parallel placement files an artifact names (its "placement"
 * section, eldr/artifact.h): file names next to the artifact. */
typedef struct eldr_artifact_placement {
  uint32_t ep_size, redundant;
  char *global;      /* owned file name */
  char **decoders;   /* owned, k file names */
} eldr_artifact_placement;

/* Attach (replacing any) placement names: global and k decoder names are
 * copied. ELDR_ERANGE for ep_size 0, E + redundant not a multiple of
 * ep_size, an empty name or one with '/' (a is unchanged); ELDR_ENOMEM. */
int eldr_artifact_set_placement(eldr_artifact *a, uint32_t ep_size, uint32_t redundant,
                                const char *global, const char *const *decoders, eldr_diag *d);

/* The path of a placement file named by the artifact at artifact_path: the
 * artifact's directory + name, into out (cap bytes). ELDR_ERANGE when it
 * does not fit. */
int eldr_artifact_placement_path(const char *artifact_path, const char *name, char *out,
                                 size_t cap, eldr_diag *d);

/* Allocate an artifact with zeroed arrays for the given shape, k and mask
 * (copied); dim is derived. idf allocated when idf_enabled. NULL on error.
 * model NULL -> ""; layer_ids NULL -> 0..L-1; mask NULL -> all layers.
 * NULL also for an invalid shape, k == 0 or an empty mask. version is
 * ELDR_ARTIFACT_VERSION; tau, rho, seed and sizes start at 0. */
eldr_artifact *eldr_artifact_new(const char *model, const eldr_shape *shape,
                                 const uint32_t *layer_ids, eldr_repr repr, int idf_enabled,
                                 const uint8_t *mask, size_t k);
void eldr_artifact_free(eldr_artifact *a);

/* Validate an in-memory artifact (same checks as load). Returns 0 or the
 * error of the first problem, with the field named in d. */
int eldr_artifact_validate(const eldr_artifact *a, eldr_diag *d);

/* Set (copy) or clear (m NULL) the latency-model section (the footprint
 * policy's coefficients). Errors as validate (m's own checks, a shape other
 * than the artifact's); a unchanged on error. */
int eldr_artifact_set_latency(eldr_artifact *a, const eldr_latency_model *m, eldr_diag *d);

/* Set (copy) or clear (prior NULL) the footprint section: n_priors (1, or
 * 1 + k with the clusters') rows of L*E rates in [0, 1], each layer
 * summing to K within 1e-3, and their weight (> 0, < 1e9). ELDR_ERANGE /
 * ELDR_ENOMEM; a unchanged on error. */
int eldr_artifact_set_fp_prior(eldr_artifact *a, const float *prior, size_t n_priors,
                               double tokens, eldr_diag *d);

/* A sigspec borrowing the artifact's idf and mask. */
void eldr_artifact_sigspec(const eldr_artifact *a, eldr_sigspec *spec);

#endif
