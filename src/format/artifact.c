/* artifact.c — the routing artifact as JSON (see include/eldr/artifact.h).
 *
 * Parsing goes through jansson; every check names the field with its JSON
 * path ("centroids[3][17]", "idf.weights", "fit.cluster_sizes"). Dimensions
 * are checked against the input before anything large is allocated, so the
 * memory used is bounded by the size of the input. Floats are written with
 * jansson's default 17 significant digits, which round-trips every float
 * (and double) bit for bit. */
#include "eldr/artifact.h"
#include "eldr/writefile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "artifact_internal.h"
#include "eldr/readfile.h"
#include "eldr/watch.h"
#include <xxhash.h>

#define ARTIFACT_FORMAT "eldr-artifact"
/* Largest artifact file accepted by eldr_artifact_load. */
#define ARTIFACT_MAX_BYTES ((size_t)1 << 31)

static int parse_latency(const json_t *root, eldr_artifact *a, eldr_diag *d);
static int parse_drift_ref(const json_t *fit, eldr_artifact *a, eldr_diag *d);
static json_t *drift_ref_json(const eldr_drift_ref *r);
static json_t *latency_json(const eldr_artifact *a);

/* ---- parsing ------------------------------------------------------------ */

/* Field of an object, with a check of its JSON type. */
static int get_field(const json_t *obj, const char *parent, const char *key, json_type type,
                     int optional, json_t **out, eldr_diag *d) {
  json_t *v = json_object_get(obj, key);
  const char *dot = parent[0] ? "." : "";
  *out = NULL;
  if (!v || (optional && json_is_null(v))) {
    if (optional) return ELDR_OK;
    return eldr_diag_fail(d, ELDR_EPARSE, "%s%s%s: missing", parent, dot, key);
  }
  int ok;
  const char *want;
  switch (type) {
  case JSON_OBJECT: ok = json_is_object(v); want = "an object"; break;
  case JSON_ARRAY: ok = json_is_array(v); want = "an array"; break;
  case JSON_STRING: ok = json_is_string(v); want = "a string"; break;
  case JSON_INTEGER: ok = json_is_integer(v); want = "an integer"; break;
  case JSON_REAL: ok = json_is_number(v); want = "a number"; break;
  case JSON_TRUE:
  case JSON_FALSE: ok = json_is_boolean(v); want = "true or false"; break;
  default: ok = 0; want = "?"; break;
  }
  if (!ok) return eldr_diag_fail(d, ELDR_EPARSE, "%s%s%s: must be %s", parent, dot, key, want);
  *out = v;
  return ELDR_OK;
}

/* Integer in [lo, hi]. */
static int get_int(const json_t *obj, const char *parent, const char *key, long long lo,
                   long long hi, long long *out, eldr_diag *d) {
  json_t *v;
  int rc = get_field(obj, parent, key, JSON_INTEGER, 0, &v, d);
  if (rc) return rc;
  long long x = json_integer_value(v);
  if (x < lo || x > hi)
    return eldr_diag_fail(d, ELDR_ERANGE, "%s%s%s: %lld outside [%lld, %lld]", parent,
                          parent[0] ? "." : "", key, x, lo, hi);
  *out = x;
  return ELDR_OK;
}

static int parse_seed(const json_t *fit, uint64_t *out, eldr_diag *d) {
  json_t *v = json_object_get(fit, "seed");
  if (!v) return eldr_diag_fail(d, ELDR_EPARSE, "fit.seed: missing");
  if (json_is_integer(v)) {
    long long x = json_integer_value(v);
    if (x < 0) return eldr_diag_fail(d, ELDR_ERANGE, "fit.seed: %lld is negative", x);
    *out = (uint64_t)x;
    return ELDR_OK;
  }
  if (json_is_string(v)) { /* seeds above INT64_MAX are written as strings */
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > 20 || strspn(s, "0123456789") != n)
      return eldr_diag_fail(d, ELDR_EPARSE, "fit.seed: \"%.40s\" is not a decimal integer", s);
    errno = 0;
    unsigned long long x = strtoull(s, NULL, 10);
    if (errno == ERANGE)
      return eldr_diag_fail(d, ELDR_ERANGE, "fit.seed: %s does not fit 64 bits", s);
    *out = (uint64_t)x;
    return ELDR_OK;
  }
  return eldr_diag_fail(d, ELDR_EPARSE, "fit.seed: must be an integer");
}

/* What parse_root reads before the artifact exists: the shapes are checked
 * whole before anything of their size is allocated. layer_ids and mask are
 * owned (parse_root frees them); the json_t pointers borrow from root. */
typedef struct art_in {
  const char *name;
  eldr_shape shape;
  uint32_t *layer_ids; /* L */
  uint8_t *mask;       /* L */
  eldr_repr repr;
  int idf_on;
  const json_t *weights; /* idf.weights (idf_on) */
  const json_t *cents;   /* centroids: k rows of dim */
  size_t k, dim;
  const json_t *fit, *sizes; /* fit, fit.cluster_sizes */
} art_in;

/* format and version */
static int parse_format(const json_t *root, eldr_diag *d) {
  json_t *v;
  int rc;
  if ((rc = get_field(root, "", "format", JSON_STRING, 0, &v, d))) return rc;
  if (strcmp(json_string_value(v), ARTIFACT_FORMAT) != 0)
    return eldr_diag_fail(d, ELDR_EPARSE, "format: \"%.60s\" is not \"" ARTIFACT_FORMAT "\"",
                          json_string_value(v));
  if ((rc = get_field(root, "", "version", JSON_INTEGER, 0, &v, d))) return rc;
  if (json_integer_value(v) != ELDR_ARTIFACT_VERSION)
    return eldr_diag_fail(d, ELDR_EVERSION, "version: %lld is not supported (this build reads %d)",
                          (long long)json_integer_value(v), ELDR_ARTIFACT_VERSION);
  return ELDR_OK;
}

/* model: name, shape, layer_ids (allocates in->layer_ids and in->mask) */
static int parse_model(const json_t *root, art_in *in, eldr_diag *d) {
  json_t *model, *name, *lids;
  long long x;
  int rc;
  if ((rc = get_field(root, "", "model", JSON_OBJECT, 0, &model, d))) return rc;
  if ((rc = get_field(model, "model", "name", JSON_STRING, 0, &name, d))) return rc;
  in->name = json_string_value(name);
  eldr_shape *shape = &in->shape;
  if ((rc = get_int(model, "model", "num_layers", 0, UINT32_MAX, &x, d))) return rc;
  shape->num_layers = (uint32_t)x;
  if ((rc = get_int(model, "model", "num_experts", 0, UINT32_MAX, &x, d))) return rc;
  shape->num_experts = (uint32_t)x;
  if ((rc = get_int(model, "model", "top_k", 0, UINT32_MAX, &x, d))) return rc;
  shape->top_k = (uint32_t)x;
  if ((rc = eldr_shape_validate(shape, d))) {
    eldr_diag_prefix(d, "model");
    return rc;
  }
  const size_t L = shape->num_layers;
  if ((rc = get_field(model, "model", "layer_ids", JSON_ARRAY, 0, &lids, d))) return rc;
  if (json_array_size(lids) != L)
    return eldr_diag_fail(d, ELDR_ESHAPE, "model.layer_ids: %zu entries, expected num_layers = %zu",
                          json_array_size(lids), L);
  in->layer_ids = malloc(L * sizeof *in->layer_ids);
  in->mask = calloc(L, 1);
  if (!in->layer_ids || !in->mask) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  for (size_t l = 0; l < L; l++) {
    json_t *e = json_array_get(lids, l);
    if (!json_is_integer(e)) return eldr_diag_fail(d, ELDR_EPARSE, "model.layer_ids[%zu]: must be an integer", l);
    long long id = json_integer_value(e);
    if (id < 0 || id > (long long)UINT32_MAX)
      return eldr_diag_fail(d, ELDR_ERANGE, "model.layer_ids[%zu]: %lld out of range", l, id);
    in->layer_ids[l] = (uint32_t)id;
  }
  return ELDR_OK;
}

/* representation, and idf (its weights' count checked) */
static int parse_repr_idf(const json_t *root, art_in *in, eldr_diag *d) {
  json_t *v, *idf, *weights;
  int rc;
  const size_t LE = (size_t)in->shape.num_layers * in->shape.num_experts;
  if ((rc = get_field(root, "", "representation", JSON_STRING, 0, &v, d))) return rc;
  in->repr = ELDR_REPR_COUNT;
  if (eldr_repr_parse(json_string_value(v), &in->repr))
    return eldr_diag_fail(d, ELDR_EPARSE, "representation: unknown \"%.40s\" (count, binary, gate or logit)",
                          json_string_value(v));
  if ((rc = get_field(root, "", "idf", JSON_OBJECT, 0, &idf, d))) return rc;
  if ((rc = get_field(idf, "idf", "enabled", JSON_TRUE, 0, &v, d))) return rc;
  in->idf_on = json_is_true(v);
  if (in->idf_on) {
    if ((rc = get_field(idf, "idf", "weights", JSON_ARRAY, 0, &weights, d))) return rc;
    if (json_array_size(weights) != LE)
      return eldr_diag_fail(d, ELDR_ESHAPE, "idf.weights: %zu values, expected num_layers * num_experts = %zu",
                            json_array_size(weights), LE);
    in->weights = weights;
  } else if (json_object_get(idf, "weights") && !json_is_null(json_object_get(idf, "weights"))) {
    return eldr_diag_fail(d, ELDR_EPARSE, "idf.weights: present while idf.enabled is false");
  }
  return ELDR_OK;
}

/* layer_mask: strictly ascending layer indices into in->mask; in->dim */
static int parse_mask(const json_t *root, art_in *in, eldr_diag *d) {
  json_t *mask_a;
  int rc;
  const size_t L = in->shape.num_layers;
  if ((rc = get_field(root, "", "layer_mask", JSON_ARRAY, 0, &mask_a, d))) return rc;
  if (json_array_size(mask_a) == 0) return eldr_diag_fail(d, ELDR_ERANGE, "layer_mask: empty (no layer selected)");
  long long prev = -1;
  for (size_t i = 0; i < json_array_size(mask_a); i++) {
    json_t *e = json_array_get(mask_a, i);
    if (!json_is_integer(e)) return eldr_diag_fail(d, ELDR_EPARSE, "layer_mask[%zu]: must be an integer", i);
    long long li = json_integer_value(e);
    if (li < 0 || li >= (long long)L)
      return eldr_diag_fail(d, ELDR_ERANGE, "layer_mask[%zu]: %lld outside [0, num_layers = %zu)", i, li, L);
    if (li <= prev)
      return eldr_diag_fail(d, ELDR_ERANGE, "layer_mask[%zu]: %lld not above %lld (must be strictly ascending)",
                            i, li, prev);
    prev = li;
    in->mask[li] = 1;
  }
  in->dim = json_array_size(mask_a) * in->shape.num_experts;
  return ELDR_OK;
}

/* The shapes of centroids (k rows of dim), fit.k and fit.cluster_sizes. */
static int parse_shapes(const json_t *root, art_in *in, eldr_diag *d) {
  json_t *cents, *fit, *sizes;
  int rc;
  if ((rc = get_field(root, "", "centroids", JSON_ARRAY, 0, &cents, d))) return rc;
  const size_t k = json_array_size(cents);
  if (k == 0) return eldr_diag_fail(d, ELDR_ESHAPE, "centroids: empty (k = 0)");
  for (size_t c = 0; c < k; c++) {
    json_t *row = json_array_get(cents, c);
    if (!json_is_array(row)) return eldr_diag_fail(d, ELDR_EPARSE, "centroids[%zu]: must be an array", c);
    if (json_array_size(row) != in->dim)
      return eldr_diag_fail(d, ELDR_ESHAPE, "centroids[%zu]: %zu values, expected |layer_mask| * num_experts = %zu",
                            c, json_array_size(row), in->dim);
  }
  if ((rc = get_field(root, "", "fit", JSON_OBJECT, 0, &fit, d))) return rc;
  long long fit_k;
  if ((rc = get_int(fit, "fit", "k", 1, LLONG_MAX, &fit_k, d))) return rc;
  if ((unsigned long long)fit_k != k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "fit.k: %lld but there are %zu centroids", fit_k, k);
  if ((rc = get_field(fit, "fit", "cluster_sizes", JSON_ARRAY, 0, &sizes, d))) return rc;
  if (json_array_size(sizes) != k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "fit.cluster_sizes: %zu entries, expected k = %zu",
                          json_array_size(sizes), k);
  in->cents = cents;
  in->k = k;
  in->fit = fit;
  in->sizes = sizes;
  return ELDR_OK;
}

/* The values into the artifact: idf weights, centroids, tau. */
static int parse_values(const json_t *root, const art_in *in, eldr_artifact *a, eldr_diag *d) {
  json_t *v;
  int rc;
  const size_t LE = (size_t)in->shape.num_layers * in->shape.num_experts;
  if (in->idf_on && (rc = eldr__artifact_get_floats(in->weights, LE, a->idf, "idf.weights", d))) return rc;
  for (size_t c = 0; c < in->k; c++) {
    char what[40];
    snprintf(what, sizeof what, "centroids[%zu]", c);
    if ((rc = eldr__artifact_get_floats(json_array_get(in->cents, c), in->dim, a->centroids + c * in->dim, what, d))) return rc;
  }
  if ((rc = get_field(root, "", "tau", JSON_REAL, 0, &v, d))) return rc;
  a->tau = json_number_value(v);
  return ELDR_OK;
}

/* fit: n, rho, seed, chosen_by, decode_n, balanced, cluster_sizes and the
 * optional strings (created, trace, trace_generator). */
static int parse_fit(const art_in *in, eldr_artifact *a, eldr_diag *d) {
  const json_t *fit = in->fit;
  json_t *v;
  long long x;
  int rc;
  if ((rc = get_int(fit, "fit", "n", 0, LLONG_MAX, &x, d))) return rc;
  a->fit_n = (size_t)x;
  v = json_object_get(fit, "rho");
  if (!v) return eldr_diag_fail(d, ELDR_EPARSE, "fit.rho: missing");
  if (json_is_null(v)) a->fit_rho = NAN; /* not measured */
  else if (json_is_number(v)) a->fit_rho = json_number_value(v);
  else return eldr_diag_fail(d, ELDR_EPARSE, "fit.rho: must be a number or null");
  if ((rc = parse_seed(fit, &a->fit_seed, d))) return rc;
  /* which evidence chose the fit (optional: older artifacts lack it) */
  if ((rc = get_field(fit, "fit", "chosen_by", JSON_STRING, 1, &v, d))) return rc;
  if (v) {
    for (a->fit_chosen_by = ELDR_FIT_BY_PREFILL_ONLY; a->fit_chosen_by > ELDR_FIT_BY_UNKNOWN; a->fit_chosen_by--)
      if (!strcmp(json_string_value(v), eldr_fit_evidence_name(a->fit_chosen_by))) break;
    if (a->fit_chosen_by == ELDR_FIT_BY_UNKNOWN)
      return eldr_diag_fail(d, ELDR_EPARSE, "fit.chosen_by: '%s' is not rho, named or prefill_only",
                            json_string_value(v));
  }
  if (json_object_get(fit, "decode_n")) {
    if ((rc = get_int(fit, "fit", "decode_n", 0, LLONG_MAX, &x, d))) return rc;
    a->fit_decode_n = (size_t)x;
  }
  if ((rc = get_field(fit, "fit", "balanced", JSON_TRUE, 0, &v, d))) return rc;
  a->fit_balanced = json_is_true(v);
  for (size_t c = 0; c < in->k; c++) {
    json_t *e = json_array_get(in->sizes, c);
    if (!json_is_integer(e) || json_integer_value(e) < 0)
      return eldr_diag_fail(d, ELDR_EPARSE, "fit.cluster_sizes[%zu]: must be an integer >= 0", c);
    a->cluster_sizes[c] = (size_t)json_integer_value(e);
  }
  const char *opt_keys[3] = {"created", "trace", "trace_generator"};
  char **opt_dst[3] = {&a->created, &a->trace, &a->trace_generator};
  for (int i = 0; i < 3; i++) {
    if ((rc = get_field(fit, "fit", opt_keys[i], JSON_STRING, 1, &v, d))) return rc;
    if (v && !(*opt_dst[i] = strdup(json_string_value(v)))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  return ELDR_OK;
}

/* The whole document, in the order of its checks: format, model,
 * representation and idf, layer mask, the shapes; then the artifact is
 * allocated and filled: values, fit, drift reference, placements,
 * latency, footprint priors; last the artifact's own validation. */
static int parse_root(const json_t *root, eldr_artifact **out, eldr_diag *d) {
  art_in in = {0};
  eldr_artifact *a = NULL;
  int rc;
  if (!json_is_object(root)) return eldr_diag_fail(d, ELDR_EPARSE, "top level: must be an object");
  if ((rc = parse_format(root, d))) return rc;
  if ((rc = parse_model(root, &in, d)) || (rc = parse_repr_idf(root, &in, d)) || (rc = parse_mask(root, &in, d)) ||
      (rc = parse_shapes(root, &in, d)))
    goto done;
  a = eldr_artifact_new(in.name, &in.shape, in.layer_ids, in.repr, in.idf_on, in.mask, in.k);
  if (!a) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for %zu centroids of dimension %zu", in.k, in.dim);
    goto done;
  }
  if ((rc = parse_values(root, &in, a, d)) || (rc = parse_fit(&in, a, d)) || (rc = parse_drift_ref(in.fit, a, d)) ||
      (rc = eldr__artifact_placement_parse(root, a, d)) || (rc = parse_latency(root, a, d)) ||
      (rc = eldr__artifact_footprint_parse(root, a, d)) || (rc = eldr_artifact_validate(a, d))) {
    eldr_artifact_free(a);
    a = NULL;
  }
done:
  free(in.mask);
  free(in.layer_ids);
  if (a) *out = a;
  return rc;
}

int eldr_artifact_parse(const char *json, size_t len, eldr_artifact **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "no output pointer");
  *out = NULL;
  if (!json) return eldr_diag_fail(d, ELDR_EINVAL, "no input");
  if (len == 0) return eldr_diag_fail(d, ELDR_EEMPTY, "empty artifact");
  json_error_t err;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
  if (!root)
    return eldr_diag_fail(d, ELDR_EPARSE, "JSON line %d column %d: %s", err.line, err.column,
                          err.text);
  int rc = parse_root(root, out, d);
  json_decref(root);
  if (!rc) (*out)->text_hash = XXH3_64bits(json, len); /* the file's identity (eldr serve) */
  return rc;
}

static int parse_text(const char *text, size_t len, void *out, eldr_diag *d) {
  return eldr_artifact_parse(text, len, out, d);
}

int eldr_artifact_load(const char *path, eldr_artifact **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "no output pointer");
  *out = NULL;
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "no artifact path");
  return eldr_parse_file(path, ARTIFACT_MAX_BYTES, "artifact", parse_text, out, d);
}

/* ---- serialisation ------------------------------------------------------- */

/* json_object_set_new that remembers a failure (value NULL or set failed). */
static void set(json_t *obj, const char *key, json_t *val, int *bad) {
  if (!val || json_object_set_new(obj, key, val) != 0) *bad = 1;
}

char *eldr_artifact_dump(const eldr_artifact *a) {
  if (eldr_artifact_validate(a, NULL) != ELDR_OK) return NULL;
  const size_t L = a->shape.num_layers, E = a->shape.num_experts;
  int bad = 0;
  json_t *root = json_object();
  if (!root) return NULL;
  set(root, "format", json_string(ARTIFACT_FORMAT), &bad);
  set(root, "version", json_integer(a->version), &bad);

  json_t *model = json_object();
  if (model) {
    set(model, "name", json_string(a->model), &bad);
    set(model, "num_layers", json_integer(a->shape.num_layers), &bad);
    set(model, "num_experts", json_integer(a->shape.num_experts), &bad);
    set(model, "top_k", json_integer(a->shape.top_k), &bad);
    json_t *ids = json_array();
    for (size_t l = 0; ids && l < L; l++)
      if (json_array_append_new(ids, json_integer(a->layer_ids[l]))) bad = 1;
    set(model, "layer_ids", ids, &bad);
  }
  set(root, "model", model, &bad);
  set(root, "representation", json_string(eldr_repr_name(a->repr)), &bad);

  json_t *idf = json_object();
  if (idf) {
    set(idf, "enabled", json_boolean(a->idf_enabled), &bad);
    if (a->idf_enabled) set(idf, "weights", eldr__artifact_float_array(a->idf, L * E), &bad);
  }
  set(root, "idf", idf, &bad);

  json_t *mask = json_array();
  for (size_t l = 0; mask && l < L; l++)
    if (a->mask[l] && json_array_append_new(mask, json_integer((json_int_t)l))) bad = 1;
  set(root, "layer_mask", mask, &bad);

  json_t *cents = json_array();
  for (size_t c = 0; cents && c < a->k; c++)
    if (json_array_append_new(cents, eldr__artifact_float_array(a->centroids + c * a->dim, a->dim))) bad = 1;
  set(root, "centroids", cents, &bad);
  set(root, "tau", json_real(a->tau), &bad);

  json_t *fit = json_object();
  if (fit) {
    set(fit, "n", json_integer((json_int_t)a->fit_n), &bad);
    set(fit, "k", json_integer((json_int_t)a->k), &bad);
    set(fit, "rho", isnan(a->fit_rho) ? json_null() : json_real(a->fit_rho), &bad);
    if (a->fit_seed <= (uint64_t)INT64_MAX) {
      set(fit, "seed", json_integer((json_int_t)a->fit_seed), &bad);
    } else {
      char s[24];
      snprintf(s, sizeof s, "%" PRIu64, a->fit_seed);
      set(fit, "seed", json_string(s), &bad);
    }
    set(fit, "balanced", json_boolean(a->fit_balanced), &bad);
    if (a->fit_chosen_by != ELDR_FIT_BY_UNKNOWN)
      set(fit, "chosen_by", json_string(eldr_fit_evidence_name(a->fit_chosen_by)), &bad);
    if (a->fit_decode_n != SIZE_MAX) set(fit, "decode_n", json_integer((json_int_t)a->fit_decode_n), &bad);
    json_t *sizes = json_array();
    for (size_t c = 0; sizes && c < a->k; c++)
      if (json_array_append_new(sizes, json_integer((json_int_t)a->cluster_sizes[c]))) bad = 1;
    set(fit, "cluster_sizes", sizes, &bad);
    if (a->created) set(fit, "created", json_string(a->created), &bad);
    if (a->trace) set(fit, "trace", json_string(a->trace), &bad);
    if (a->trace_generator) set(fit, "trace_generator", json_string(a->trace_generator), &bad);
    if (a->drift_ref) set(fit, "drift_ref", drift_ref_json(a->drift_ref), &bad);
  }
  set(root, "fit", fit, &bad);
  if (!bad && eldr__artifact_placement_dump(root, a) < 0) bad = 1;
  if (a->latency) set(root, "latency", latency_json(a), &bad);
  if (!bad && eldr__artifact_footprint_dump(root, a) < 0) bad = 1;

  char *s = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  return s;
}

int eldr_artifact_save(const char *path, const eldr_artifact *a, eldr_diag *d) {
  if (!path) return eldr_diag_fail(d, ELDR_EINVAL, "no artifact path");
  int rc = eldr_artifact_validate(a, d);
  if (rc) return rc;
  char *text = eldr_artifact_dump(a);
  if (!text)
    return eldr_diag_fail(d, ELDR_EINVAL, "cannot serialise the artifact (model name or "
                          "creation strings not valid UTF-8?)");
  size_t len = strlen(text);
  text[len] = '\n'; /* the dump's NUL: the file ends with a newline */
  rc = eldr_write_file(path, text, len + 1, d);
  free(text);
  return rc;
}

/* ---- the latency-model section (the footprint policy's coefficients) ---- */

/* "latency": absent or null (no coefficients), else a complete model
 * (eldr_latency_parse_full; its messages are prefixed with "latency"). */
static int parse_latency(const json_t *root, eldr_artifact *a, eldr_diag *d) {
  const json_t *v = json_object_get(root, "latency");
  if (!v || json_is_null(v)) return ELDR_OK;
  if (!json_is_object(v)) return eldr_diag_fail(d, ELDR_EPARSE, "latency: must be an object or null");
  char *txt = json_dumps(v, JSON_COMPACT);
  if (!txt) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  eldr_latency_model m;
  int rc = eldr_latency_parse_full(txt, strlen(txt), &m, d);
  free(txt);
  if (rc) {
    eldr_diag_prefix(d, "latency");
    return rc;
  }
  if (!(a->latency = malloc(sizeof *a->latency))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  *a->latency = m;
  return ELDR_OK;
}

static json_t *latency_json(const eldr_artifact *a) {
  char *txt = eldr_latency_dump(a->latency);
  if (!txt) return NULL;
  json_t *o = json_loads(txt, 0, NULL);
  free(txt);
  return o;
}

/* ---- fit.drift_ref (optional: artifacts before it load without it) -------- */

/* n fractions from a JSON array of exactly n numbers. */
static int parse_fractions(const json_t *arr, size_t n, const char *field, double *out, eldr_diag *d) {
  if (!json_is_array(arr) || json_array_size(arr) != n)
    return eldr_diag_fail(d, ELDR_ESHAPE, "fit.drift_ref.%s: must be an array of %zu numbers", field, n);
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(arr, i);
    if (!json_is_number(e))
      return eldr_diag_fail(d, ELDR_EPARSE, "fit.drift_ref.%s[%zu]: must be a number", field, i);
    out[i] = json_number_value(e);
  }
  return 0;
}

static int parse_drift_ref(const json_t *fit, eldr_artifact *a, eldr_diag *d) {
  json_t *v = json_object_get(fit, "drift_ref");
  if (!v || json_is_null(v)) return 0;
  if (!json_is_object(v)) return eldr_diag_fail(d, ELDR_EPARSE, "fit.drift_ref: must be an object");
  eldr_drift_ref *r = eldr_drift_ref_new(a->k);
  if (!r) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  int rc = 0;
  json_t *n = json_object_get(v, "n");
  if (!json_is_integer(n) || json_integer_value(n) < 0)
    rc = eldr_diag_fail(d, ELDR_EPARSE, "fit.drift_ref.n: must be an integer >= 0");
  else r->n = (size_t)json_integer_value(n);
  if (!rc) rc = parse_fractions(json_object_get(v, "nearest_share"), a->k, "nearest_share", r->nearest_share, d);
  if (!rc)
    rc = parse_fractions(json_object_get(v, "similarity_hist"), ELDR_WATCH_SIM_BINS, "similarity_hist", r->sim_hist, d);
  if (!rc) rc = eldr_drift_ref_validate(r, d);
  if (rc) {
    eldr_drift_ref_free(r);
    return rc;
  }
  a->drift_ref = r;
  return 0;
}

static json_t *drift_ref_json(const eldr_drift_ref *r) {
  json_t *o = json_object(), *ns = json_array(), *sh = json_array();
  int bad = !o || !ns || !sh;
  for (size_t c = 0; !bad && c < r->k; c++) bad |= json_array_append_new(ns, json_real(r->nearest_share[c])) != 0;
  for (int b = 0; !bad && b < ELDR_WATCH_SIM_BINS; b++) bad |= json_array_append_new(sh, json_real(r->sim_hist[b])) != 0;
  if (!bad) {
    set(o, "n", json_integer((json_int_t)r->n), &bad);
    set(o, "bins", json_integer(ELDR_WATCH_SIM_BINS), &bad);
    set(o, "nearest_share", ns, &bad);
    set(o, "similarity_hist", sh, &bad);
    ns = sh = NULL;
  }
  json_decref(ns);
  json_decref(sh);
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}
