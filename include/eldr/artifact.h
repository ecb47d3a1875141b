/* eldr/artifact.h — the routing artifact (JSON): everything the online
 * router needs, fitted offline by `eldr fit`.
 *
 * {
 *   "format": "eldr-artifact", "version": 1,
 *   "model": {"name": str, "num_layers": L, "num_experts": E, "top_k": K,
 *             "layer_ids": [L ints]},
 *   "representation": "count"|"binary"|"gate"|"logit",
 *   "idf": {"enabled": bool, "weights": [L*E numbers] (only when enabled)},
 *   "layer_mask": [ascending layer indices in [0, L)],
 *   "centroids": [[dim numbers] x K]   (dim = |mask| * E, unit L2 norm),
 *   "tau": number in [0, 2],
 *   "fit": {"n": int, "k": K, "rho": number, "seed": int, "balanced": bool,
 *           "cluster_sizes": [K ints], "created": str, "trace": str}
 * }
 *
 * Validated on load: unknown version, missing/mistyped fields, wrong
 * dimensions, NaN/inf, negative IDF, centroids with |norm - 1| > 1e-3, mask
 * out of range or unsorted, tau out of range — each an error naming the field.
 *
 * Details: "fit.rho" may be null (not measured; NaN in memory), otherwise in
 * [-1, 1]. "fit.seed" is an integer >= 0, or a decimal string for seeds
 * above INT64_MAX (written so). "fit.created" and "fit.trace" are optional
 * (omitted when NULL). "model.layer_ids" must be distinct. "idf.weights"
 * must be absent (or null) when IDF is off. Unknown keys are ignored.
 * Numbers are written with 17 significant digits: save -> load gives
 * bit-identical floats and doubles.
 * Errors: ELDR_EPARSE (JSON syntax, missing or mistyped field, wrong
 * "format", unknown representation), ELDR_EVERSION (version other than 1),
 * ELDR_ESHAPE (an array of the wrong length), ELDR_ERANGE (a value out of its
 * range, NaN/inf, negative IDF, unnormalised centroid, bad mask), ELDR_EIO
 * (file), ELDR_ENOMEM.
 *
 * Ownership: an eldr_artifact owns its arrays; eldr_artifact_free() releases.
 */
#ifndef ELDR_ARTIFACT_H
#define ELDR_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/counts.h"
#include "eldr/error.h"
#include "eldr/signature.h"

#define ELDR_ARTIFACT_VERSION 1

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
  size_t *cluster_sizes; /* owned, k entries */
  char *created;         /* owned, may be NULL */
  char *trace;           /* owned, may be NULL */
} eldr_artifact;

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

/* Parse len bytes of JSON into a new validated artifact (*out, caller frees
 * with eldr_artifact_free; NULL on error). ELDR_EEMPTY for len == 0. */
int eldr_artifact_parse(const char *json, size_t len, eldr_artifact **out, eldr_diag *d);
/* Read and parse a file; every message starts with the path. A file that
 * cannot be opened or read is ELDR_EIO. */
int eldr_artifact_load(const char *path, eldr_artifact **out, eldr_diag *d);
/* Serialise (malloc'd NUL-terminated compact JSON, caller frees). NULL on
 * error, including an artifact that does not validate. */
char *eldr_artifact_dump(const eldr_artifact *a);
/* Write to path atomically (temp file "<path>.tmp.XXXXXX" in the same
 * directory, fsync, rename). Validates first (errors as validate); ELDR_EIO
 * with the path and the system error when writing fails. */
int eldr_artifact_save(const char *path, const eldr_artifact *a, eldr_diag *d);

/* A sigspec borrowing the artifact's idf and mask. */
void eldr_artifact_sigspec(const eldr_artifact *a, eldr_sigspec *spec);

#endif
