/* eldr/artifact.h — the routing artifact file codec (JSON; format layer).
 * The in-memory artifact and its validator are eldr/artifact_model.h (core
 * layer), included here.
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
 *           "cluster_sizes": [K ints], "created": str, "trace": str,
 *           "trace_generator": str},
 *   "placement": {"ep_size": R, "redundant_experts": N,           (optional)
 *                 "format": "sglang-init-expert-location",
 *                 "global": "FILE", "decoders": [K "FILE"]},
 *   "latency": {eldr_latency_dump: every field of the step-latency model}
 *                                                                 (optional)
 * }
 *
 * "placement" names the expert-parallel placements `eldr fit --ep-size`
 * wrote next to the artifact (eldr/placement_io.h): file names relative to
 * the artifact's directory, without '/', one per decoder (decoder i starts
 * its engine with decoders[i]) plus the all-traffic one
 * (eldr_artifact_set_placement, eldr_artifact_placement_path).
 *
 * "latency" is optional (absent or null: no coefficients; the footprint
 * policy then falls back to JSQ and says so). When present it must be
 * complete (eldr_latency_parse_full), validate, and have the model's shape.
 *
 * Validated on load: unknown version, missing/mistyped fields, wrong
 * dimensions, NaN/inf, negative IDF, centroids with |norm - 1| > 1e-3, mask
 * out of range or unsorted, tau out of range — each an error naming the field.
 *
 * Details: "fit.rho" may be null (not measured; NaN in memory), otherwise in
 * [-1, 1]. "fit.seed" is an integer >= 0, or a decimal string for seeds
 * above INT64_MAX (written so). "fit.created", "fit.trace" and "fit.trace_generator" (the
 * fitted trace's generator string, eldr/trace_model.h; absent for real data) are optional
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
 * Ownership: a parsed or loaded artifact belongs to the caller
 * (eldr_artifact_free). Threads: any thread; no state.
 */
#ifndef ELDR_ARTIFACT_H
#define ELDR_ARTIFACT_H

#include <stddef.h>

#include "eldr/artifact_model.h"
#include "eldr/error.h"

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

#endif
