/* test_artifact.c — routing artifact: round trip, validation, files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/error.h"
#include "eldr/rng.h"

enum { L = 3, E = 4, K = 3 };

/* L=3 layers x E=4 experts, mask {0, 2} (dim 8), K=3 centroids, IDF on. */
static eldr_artifact *make_valid(uint64_t seed) {
  const eldr_shape shape = {L, E, 2};
  const uint32_t ids[L] = {1, 3, 5};
  const uint8_t mask[L] = {1, 0, 1};
  eldr_artifact *a = eldr_artifact_new("test/model", &shape, ids, ELDR_REPR_BINARY, 1, mask, K);
  assert_non_null(a);
  assert_int_equal(a->dim, 2 * E);
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  for (size_t i = 0; i < L * E; i++) a->idf[i] = (float)(eldr_rng_uniform(&r) * 3.0);
  a->idf[5] = 0.0f;
  for (size_t c = 0; c < K; c++) {
    float *row = a->centroids + c * a->dim;
    double ss = 0;
    for (size_t j = 0; j < a->dim; j++) {
      row[j] = (float)eldr_rng_uniform(&r);
      ss += (double)row[j] * row[j];
    }
    for (size_t j = 0; j < a->dim; j++) row[j] = (float)(row[j] / sqrt(ss));
  }
  a->tau = 0.1;
  a->fit_n = 259;
  a->fit_seed = 42;
  a->fit_rho = 0.6180339887498949;
  a->fit_balanced = 1;
  a->cluster_sizes[0] = 87;
  a->cluster_sizes[1] = 86;
  a->cluster_sizes[2] = 86;
  a->created = strdup("2026-11-29T08:00:00Z");
  a->trace = strdup("llama4-mmlu-dev.jsonl");
  return a;
}

static void assert_same(const eldr_artifact *a, const eldr_artifact *b) {
  assert_int_equal(a->version, b->version);
  assert_string_equal(a->model, b->model);
  assert_memory_equal(&a->shape, &b->shape, sizeof a->shape);
  assert_memory_equal(a->layer_ids, b->layer_ids, L * sizeof *a->layer_ids);
  assert_int_equal(a->repr, b->repr);
  assert_int_equal(a->idf_enabled, b->idf_enabled);
  if (a->idf_enabled) assert_memory_equal(a->idf, b->idf, L * E * sizeof(float));
  else assert_null(b->idf);
  assert_memory_equal(a->mask, b->mask, a->shape.num_layers);
  assert_int_equal(a->k, b->k);
  assert_int_equal(a->dim, b->dim);
  /* bit-identical floats */
  assert_memory_equal(a->centroids, b->centroids, a->k * a->dim * sizeof(float));
  assert_memory_equal(&a->tau, &b->tau, sizeof a->tau);
  assert_int_equal(a->fit_n, b->fit_n);
  assert_true(a->fit_seed == b->fit_seed);
  if (isnan(a->fit_rho)) assert_true(isnan(b->fit_rho));
  else assert_memory_equal(&a->fit_rho, &b->fit_rho, sizeof a->fit_rho);
  assert_int_equal(a->fit_balanced, b->fit_balanced);
  assert_memory_equal(a->cluster_sizes, b->cluster_sizes, a->k * sizeof(size_t));
  if (a->created) assert_string_equal(a->created, b->created);
  else assert_null(b->created);
  if (a->trace) assert_string_equal(a->trace, b->trace);
  else assert_null(b->trace);
}

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/eldr_test_artifact.XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  DIR *dir = opendir(tmpdir);
  if (dir) {
    struct dirent *e;
    while ((e = readdir(dir))) {
      if (e->d_name[0] == '.') continue;
      char p[512];
      snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
      unlink(p);
    }
    closedir(dir);
  }
  rmdir(tmpdir);
  return 0;
}

static int count_files(void) {
  DIR *dir = opendir(tmpdir);
  assert_non_null(dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)))
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n;
}

static void test_round_trip(void **state) {
  (void)state;
  eldr_artifact *a = make_valid(1);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_validate(a, &d), 0);
  char *s = eldr_artifact_dump(a);
  assert_non_null(s);
  eldr_artifact *b = NULL;
  int rc = eldr_artifact_parse(s, strlen(s), &b, &d);
  if (rc) fail_msg("parse: %s", d.msg);
  assert_same(a, b);
  eldr_artifact_free(b);
  free(s);

  /* through a file, twice (the second save replaces the first) */
  char path[512];
  snprintf(path, sizeof path, "%s/a.json", tmpdir);
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  a->tau = 0.25;
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  assert_int_equal(count_files(), 1); /* no temporary left behind */
  rc = eldr_artifact_load(path, &b, &d);
  if (rc) fail_msg("load: %s", d.msg);
  assert_same(a, b);
  eldr_artifact_free(b);

  /* edge values: IDF off, seed above INT64_MAX, rho unknown, no strings,
   * awkward floats (subnormal, tiny, 1 - ulp) */
  eldr_artifact_free(a);
  const eldr_shape shape = {L, E, 1};
  a = eldr_artifact_new(NULL, &shape, NULL, ELDR_REPR_COUNT, 0, NULL, 2);
  assert_non_null(a);
  assert_null(a->idf);
  assert_int_equal(a->dim, L * E);
  assert_string_equal(a->model, "");
  a->centroids[0] = 1.0f;
  a->centroids[a->dim] = nextafterf(1.0f, 0.0f);
  a->centroids[a->dim + 1] = 1e-30f;
  a->centroids[a->dim + 2] = 1e-44f; /* subnormal */
  a->centroids[a->dim + 3] = 0.01f;
  a->tau = 1.0 / 3.0;
  a->fit_seed = UINT64_MAX - 5;
  a->fit_rho = NAN;
  s = eldr_artifact_dump(a);
  assert_non_null(s);
  assert_non_null(strstr(s, "\"rho\":null"));
  assert_non_null(strstr(s, "\"18446744073709551610\""));
  rc = eldr_artifact_parse(s, strlen(s), &b, &d);
  if (rc) fail_msg("parse: %s", d.msg);
  assert_same(a, b);
  for (size_t l = 0; l < L; l++) assert_int_equal(b->layer_ids[l], l);
  eldr_artifact_free(b);
  free(s);
  eldr_artifact_free(a);

  /* many random artifacts: bit-identical through save/load */
  for (uint64_t seed = 10; seed < 40; seed++) {
    a = make_valid(seed);
    assert_int_equal(eldr_artifact_save(path, a, &d), 0);
    assert_int_equal(eldr_artifact_load(path, &b, &d), 0);
    assert_same(a, b);
    eldr_artifact_free(b);
    eldr_artifact_free(a);
  }
}

static void test_new_and_sigspec(void **state) {
  (void)state;
  const eldr_shape bad = {0, E, 1}, good = {L, E, 2};
  const uint8_t none[L] = {0, 0, 0};
  assert_null(eldr_artifact_new("m", &bad, NULL, ELDR_REPR_COUNT, 0, NULL, 2));
  assert_null(eldr_artifact_new("m", &good, NULL, ELDR_REPR_COUNT, 0, NULL, 0));
  assert_null(eldr_artifact_new("m", &good, NULL, ELDR_REPR_COUNT, 0, none, 2));
  assert_null(eldr_artifact_new("m", NULL, NULL, ELDR_REPR_COUNT, 0, NULL, 2));
  eldr_artifact_free(NULL);
  eldr_artifact *a = make_valid(3);
  eldr_sigspec spec;
  eldr_artifact_sigspec(a, &spec);
  assert_memory_equal(&spec.shape, &a->shape, sizeof spec.shape);
  assert_int_equal(spec.repr, ELDR_REPR_BINARY);
  assert_ptr_equal(spec.idf, a->idf);
  assert_ptr_equal(spec.mask, a->mask);
  a->idf_enabled = 0;
  eldr_artifact_sigspec(a, &spec);
  assert_null(spec.idf);
  eldr_artifact_free(a);
}

/* ---- JSON-level errors: mutate a valid document, expect (code, field) ---- */

static json_t *fresh(void) {
  eldr_artifact *a = make_valid(7);
  char *s = eldr_artifact_dump(a);
  assert_non_null(s);
  json_error_t err;
  json_t *root = json_loads(s, 0, &err);
  assert_non_null(root);
  free(s);
  eldr_artifact_free(a);
  return root;
}

static void expect_text(const char *text, int want, const char *field) {
  eldr_artifact *a = (eldr_artifact *)1;
  eldr_diag d = {{0}};
  int rc = eldr_artifact_parse(text, strlen(text), &a, &d);
  if (rc != want || !strstr(d.msg, field))
    fail_msg("want %d naming '%s', got %d: '%s'", want, field, rc, d.msg);
  assert_null(a);
}

static void expect(json_t *root, int want, const char *field) {
  char *s = json_dumps(root, JSON_COMPACT);
  assert_non_null(s);
  expect_text(s, want, field);
  free(s);
  json_decref(root);
}

static json_t *sub(json_t *root, const char *key) { return json_object_get(root, key); }

static void test_parse_errors(void **state) {
  (void)state;
  json_t *r;
  /* the unmodified document parses */
  r = fresh();
  char *s = json_dumps(r, 0);
  eldr_artifact *a;
  assert_int_equal(eldr_artifact_parse(s, strlen(s), &a, NULL), 0);
  eldr_artifact_free(a);
  free(s);
  json_decref(r);

  expect_text("", ELDR_EEMPTY, "empty");
  expect_text("{\"format\":", ELDR_EPARSE, "JSON line 1");
  expect_text("[1,2]", ELDR_EPARSE, "top level");
  expect_text("{\"format\":\"eldr-artifact\",\"format\":\"x\"}", ELDR_EPARSE, "duplicate");

  r = fresh(); json_object_del(r, "format"); expect(r, ELDR_EPARSE, "format");
  r = fresh(); json_object_set_new(r, "format", json_string("onnx")); expect(r, ELDR_EPARSE, "format");
  r = fresh(); json_object_set_new(r, "format", json_integer(1)); expect(r, ELDR_EPARSE, "format");
  r = fresh(); json_object_del(r, "version"); expect(r, ELDR_EPARSE, "version");
  r = fresh(); json_object_set_new(r, "version", json_integer(2)); expect(r, ELDR_EVERSION, "version");
  r = fresh(); json_object_set_new(r, "version", json_integer(0)); expect(r, ELDR_EVERSION, "version");
  r = fresh(); json_object_set_new(r, "version", json_string("1")); expect(r, ELDR_EPARSE, "version");

  r = fresh(); json_object_del(r, "model"); expect(r, ELDR_EPARSE, "model");
  r = fresh(); json_object_del(sub(r, "model"), "name"); expect(r, ELDR_EPARSE, "model.name");
  r = fresh(); json_object_set_new(sub(r, "model"), "num_layers", json_integer(0));
  expect(r, ELDR_ERANGE, "num_layers");
  r = fresh(); json_object_set_new(sub(r, "model"), "num_layers", json_integer(-3));
  expect(r, ELDR_ERANGE, "model.num_layers");
  r = fresh(); json_object_set_new(sub(r, "model"), "num_experts", json_real(4.5));
  expect(r, ELDR_EPARSE, "model.num_experts");
  r = fresh(); json_object_set_new(sub(r, "model"), "top_k", json_integer(5));
  expect(r, ELDR_ERANGE, "top_k");
  r = fresh(); json_array_remove(json_object_get(sub(r, "model"), "layer_ids"), 0);
  expect(r, ELDR_ESHAPE, "model.layer_ids");
  r = fresh(); json_array_set_new(json_object_get(sub(r, "model"), "layer_ids"), 2, json_integer(1));
  expect(r, ELDR_ERANGE, "model.layer_ids[2]");
  r = fresh(); json_array_set_new(json_object_get(sub(r, "model"), "layer_ids"), 1, json_integer(-1));
  expect(r, ELDR_ERANGE, "model.layer_ids[1]");
  /* num_experts changed: every E-derived length no longer matches */
  r = fresh(); json_object_set_new(sub(r, "model"), "num_experts", json_integer(5));
  expect(r, ELDR_ESHAPE, "idf.weights");

  r = fresh(); json_object_set_new(r, "representation", json_string("histogram"));
  expect(r, ELDR_EPARSE, "representation");
  r = fresh(); json_object_del(r, "representation"); expect(r, ELDR_EPARSE, "representation");

  r = fresh(); json_object_del(sub(r, "idf"), "enabled"); expect(r, ELDR_EPARSE, "idf.enabled");
  r = fresh(); json_object_set_new(sub(r, "idf"), "enabled", json_integer(1));
  expect(r, ELDR_EPARSE, "idf.enabled");
  r = fresh(); json_object_del(sub(r, "idf"), "weights"); expect(r, ELDR_EPARSE, "idf.weights");
  r = fresh(); json_array_append_new(json_object_get(sub(r, "idf"), "weights"), json_real(1));
  expect(r, ELDR_ESHAPE, "idf.weights");
  r = fresh(); json_array_set_new(json_object_get(sub(r, "idf"), "weights"), 7, json_real(-0.5));
  expect(r, ELDR_ERANGE, "idf.weights[7]");
  r = fresh(); json_array_set_new(json_object_get(sub(r, "idf"), "weights"), 4, json_real(1e39));
  expect(r, ELDR_ERANGE, "idf.weights[4]");
  r = fresh(); json_array_set_new(json_object_get(sub(r, "idf"), "weights"), 2, json_string("x"));
  expect(r, ELDR_EPARSE, "idf.weights[2]");
  r = fresh(); json_object_set_new(sub(r, "idf"), "enabled", json_false());
  expect(r, ELDR_EPARSE, "idf.weights");

  r = fresh(); json_object_set_new(r, "layer_mask", json_array()); expect(r, ELDR_ERANGE, "layer_mask");
  r = fresh(); json_object_set_new(r, "layer_mask", json_pack("[i,i]", 0, 3));
  expect(r, ELDR_ERANGE, "layer_mask[1]");
  r = fresh(); json_object_set_new(r, "layer_mask", json_pack("[i,i]", -1, 2));
  expect(r, ELDR_ERANGE, "layer_mask[0]");
  r = fresh(); json_object_set_new(r, "layer_mask", json_pack("[i,i]", 2, 0));
  expect(r, ELDR_ERANGE, "layer_mask[1]");
  r = fresh(); json_object_set_new(r, "layer_mask", json_pack("[i,i]", 0, 0));
  expect(r, ELDR_ERANGE, "layer_mask[1]");
  r = fresh(); json_object_set_new(r, "layer_mask", json_pack("[i,s]", 0, "2"));
  expect(r, ELDR_EPARSE, "layer_mask[1]");
  /* three layers in the mask: centroids are now too short */
  r = fresh(); json_object_set_new(r, "layer_mask", json_pack("[i,i,i]", 0, 1, 2));
  expect(r, ELDR_ESHAPE, "centroids[0]");

  r = fresh(); json_object_set_new(r, "centroids", json_array()); expect(r, ELDR_ESHAPE, "centroids");
  r = fresh(); json_object_del(r, "centroids"); expect(r, ELDR_EPARSE, "centroids");
  r = fresh(); json_array_remove(json_array_get(sub(r, "centroids"), 1), 0);
  expect(r, ELDR_ESHAPE, "centroids[1]");
  r = fresh(); json_array_set_new(sub(r, "centroids"), 2, json_integer(1));
  expect(r, ELDR_EPARSE, "centroids[2]");
  r = fresh(); json_array_set_new(json_array_get(sub(r, "centroids"), 0), 3, json_null());
  expect(r, ELDR_EPARSE, "centroids[0][3]");
  r = fresh(); json_array_set_new(json_array_get(sub(r, "centroids"), 2), 0, json_real(5.0));
  expect(r, ELDR_ERANGE, "centroids[2]");
  {
    r = fresh();
    json_t *row = json_array_get(sub(r, "centroids"), 1);
    for (size_t j = 0; j < json_array_size(row); j++)
      json_array_set_new(row, j, json_real(json_real_value(json_array_get(row, j)) * 1.01));
    expect(r, ELDR_ERANGE, "centroids[1]: L2 norm");
  }
  r = fresh(); json_object_set_new(r, "tau", json_real(2.5)); expect(r, ELDR_ERANGE, "tau");
  r = fresh(); json_object_set_new(r, "tau", json_real(-0.01)); expect(r, ELDR_ERANGE, "tau");
  r = fresh(); json_object_set_new(r, "tau", json_string("0.1")); expect(r, ELDR_EPARSE, "tau");
  r = fresh(); json_object_del(r, "tau"); expect(r, ELDR_EPARSE, "tau");

  r = fresh(); json_object_del(r, "fit"); expect(r, ELDR_EPARSE, "fit");
  r = fresh(); json_object_set_new(sub(r, "fit"), "k", json_integer(4)); expect(r, ELDR_ESHAPE, "fit.k");
  r = fresh(); json_array_remove(json_object_get(sub(r, "fit"), "cluster_sizes"), 0);
  expect(r, ELDR_ESHAPE, "fit.cluster_sizes");
  r = fresh(); json_array_set_new(json_object_get(sub(r, "fit"), "cluster_sizes"), 1, json_integer(-1));
  expect(r, ELDR_EPARSE, "fit.cluster_sizes[1]");
  r = fresh(); json_object_set_new(sub(r, "fit"), "rho", json_real(1.5)); expect(r, ELDR_ERANGE, "fit.rho");
  r = fresh(); json_object_set_new(sub(r, "fit"), "rho", json_string("high"));
  expect(r, ELDR_EPARSE, "fit.rho");
  r = fresh(); json_object_set_new(sub(r, "fit"), "seed", json_integer(-1)); expect(r, ELDR_ERANGE, "fit.seed");
  r = fresh(); json_object_set_new(sub(r, "fit"), "seed", json_string("12a")); expect(r, ELDR_EPARSE, "fit.seed");
  r = fresh(); json_object_set_new(sub(r, "fit"), "seed", json_string("18446744073709551616"));
  expect(r, ELDR_ERANGE, "fit.seed");
  r = fresh(); json_object_set_new(sub(r, "fit"), "n", json_integer(-2)); expect(r, ELDR_ERANGE, "fit.n");
  r = fresh(); json_object_set_new(sub(r, "fit"), "balanced", json_string("yes"));
  expect(r, ELDR_EPARSE, "fit.balanced");
  r = fresh(); json_object_set_new(sub(r, "fit"), "created", json_integer(5));
  expect(r, ELDR_EPARSE, "fit.created");

  /* optional and unknown fields are fine */
  r = fresh();
  json_object_del(sub(r, "fit"), "created");
  json_object_set_new(sub(r, "fit"), "trace", json_null());
  json_object_set_new(r, "comment", json_string("ignored"));
  s = json_dumps(r, 0);
  eldr_diag d = {{0}};
  if (eldr_artifact_parse(s, strlen(s), &a, &d)) fail_msg("%s", d.msg);
  assert_null(a->created);
  assert_null(a->trace);
  eldr_artifact_free(a);
  free(s);
  json_decref(r);
}

/* ---- in-memory validation (what JSON cannot carry: NaN, inf) ------------ */

static void expect_invalid(eldr_artifact *a, int want, const char *field) {
  eldr_diag d = {{0}};
  int rc = eldr_artifact_validate(a, &d);
  if (rc != want || !strstr(d.msg, field))
    fail_msg("want %d naming '%s', got %d: '%s'", want, field, rc, d.msg);
  assert_null(eldr_artifact_dump(a));
  char path[512];
  snprintf(path, sizeof path, "%s/invalid.json", tmpdir);
  assert_int_equal(eldr_artifact_save(path, a, NULL), want);
  assert_int_equal(access(path, F_OK), -1);
  eldr_artifact_free(a);
}

static void test_validate(void **state) {
  (void)state;
  eldr_artifact *a;
  assert_int_equal(eldr_artifact_validate(NULL, NULL), ELDR_EINVAL);
  a = make_valid(5); a->centroids[a->dim + 2] = NAN; expect_invalid(a, ELDR_ERANGE, "centroids[1][2]");
  a = make_valid(5); a->centroids[3] = INFINITY; expect_invalid(a, ELDR_ERANGE, "centroids[0][3]");
  a = make_valid(5); a->idf[6] = NAN; expect_invalid(a, ELDR_ERANGE, "idf.weights[6]");
  a = make_valid(5); a->idf[0] = -INFINITY; expect_invalid(a, ELDR_ERANGE, "idf.weights[0]");
  a = make_valid(5); a->idf[11] = -1e-3f; expect_invalid(a, ELDR_ERANGE, "idf.weights[11]");
  a = make_valid(5); a->tau = NAN; expect_invalid(a, ELDR_ERANGE, "tau");
  a = make_valid(5); a->tau = 2.0001; expect_invalid(a, ELDR_ERANGE, "tau");
  a = make_valid(5); a->fit_rho = INFINITY; expect_invalid(a, ELDR_ERANGE, "fit.rho");
  a = make_valid(5); a->version = 2; expect_invalid(a, ELDR_EVERSION, "version");
  a = make_valid(5); a->repr = (eldr_repr)9; expect_invalid(a, ELDR_EUNSUPPORTED, "representation");
  a = make_valid(5); a->dim = 12; expect_invalid(a, ELDR_ESHAPE, "centroids");
  a = make_valid(5); a->k = 0; expect_invalid(a, ELDR_ESHAPE, "centroids");
  a = make_valid(5); memset(a->mask, 0, L); expect_invalid(a, ELDR_ERANGE, "layer_mask");
  a = make_valid(5); a->mask[1] = 1; expect_invalid(a, ELDR_ESHAPE, "layer_mask");
  a = make_valid(5); a->layer_ids[2] = 1; expect_invalid(a, ELDR_ERANGE, "model.layer_ids[2]");
  a = make_valid(5); a->shape.top_k = 0; expect_invalid(a, ELDR_ERANGE, "top_k");
  a = make_valid(5); free(a->idf); a->idf = NULL; expect_invalid(a, ELDR_EINVAL, "idf.weights");
  a = make_valid(5);
  for (size_t j = 0; j < a->dim; j++) a->centroids[a->dim + j] *= 0.998f;
  expect_invalid(a, ELDR_ERANGE, "centroids[1]: L2 norm");
  /* within tolerance */
  a = make_valid(5);
  for (size_t j = 0; j < a->dim; j++) a->centroids[j] *= 1.0005f;
  assert_int_equal(eldr_artifact_validate(a, NULL), 0);
  eldr_artifact_free(a);
}

/* The optional "placement" section: names round-trip, bad names and shapes
 * are errors naming the field, paths resolve next to the artifact. */
static void test_placement_section(void **state) {
  (void)state;
  eldr_artifact *a = make_valid(3);
  eldr_diag d = {{0}};
  const char *names[K] = {"a.placement.decoder-0.json", "a.placement.decoder-1.json",
                          "a.placement.decoder-2.json"};
  assert_int_equal(eldr_artifact_set_placement(a, 2, 0, "a.placement.global.json", names, &d), 0);
  char *s = eldr_artifact_dump(a);
  assert_non_null(s);
  assert_non_null(strstr(s, "\"placement\":{\"ep_size\":2"));
  eldr_artifact *b = NULL;
  assert_int_equal(eldr_artifact_parse(s, strlen(s), &b, &d), 0);
  assert_non_null(b->placement);
  assert_int_equal(b->placement->ep_size, 2);
  assert_string_equal(b->placement->global, "a.placement.global.json");
  assert_string_equal(b->placement->decoders[2], "a.placement.decoder-2.json");
  eldr_artifact_free(b);
  /* a decoder name with a slash; E + redundant not a multiple of the ranks */
  char *bad = strdup(s);
  char *at = strstr(bad, "a.placement.decoder-1.json");
  at[1] = '/';
  assert_int_equal(eldr_artifact_parse(bad, strlen(bad), &b, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "placement.decoders[1]"));
  free(bad);
  assert_int_equal(eldr_artifact_set_placement(a, 3, 0, "g.json", names, &d), ELDR_ERANGE);
  assert_non_null(strstr(d.msg, "redundant_experts"));
  assert_int_equal(a->placement->ep_size, 2); /* unchanged on error */
  char path[64];
  assert_int_equal(eldr_artifact_placement_path("dir/x/art.json", "p.json", path, sizeof path, &d), 0);
  assert_string_equal(path, "dir/x/p.json");
  assert_int_equal(eldr_artifact_placement_path("art.json", "p.json", path, sizeof path, &d), 0);
  assert_string_equal(path, "p.json");
  assert_int_equal(eldr_artifact_placement_path("art.json", "p.json", path, 4, &d), ELDR_ERANGE);
  free(s);
  eldr_artifact_free(a);
}

static void test_files(void **state) {
  (void)state;
  eldr_artifact *a = (eldr_artifact *)1;
  eldr_diag d = {{0}};
  char path[512];
  snprintf(path, sizeof path, "%s/does-not-exist.json", tmpdir);
  assert_int_equal(eldr_artifact_load(path, &a, &d), ELDR_EIO);
  assert_null(a);
  assert_non_null(strstr(d.msg, path));
  assert_non_null(strstr(d.msg, "No such file"));

  /* a directory is not an artifact */
  assert_true(eldr_artifact_load(tmpdir, &a, &d) < 0);
  assert_non_null(strstr(d.msg, tmpdir));

  /* parse errors from a file name the file and the field */
  snprintf(path, sizeof path, "%s/v2.json", tmpdir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("{\"format\": \"eldr-artifact\", \"version\": 2}\n", f);
  fclose(f);
  assert_int_equal(eldr_artifact_load(path, &a, &d), ELDR_EVERSION);
  assert_non_null(strstr(d.msg, path));
  assert_non_null(strstr(d.msg, "version"));
  snprintf(path, sizeof path, "%s/empty.json", tmpdir);
  f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(eldr_artifact_load(path, &a, &d), ELDR_EEMPTY);
  assert_non_null(strstr(d.msg, path));

  /* saving into a missing directory fails cleanly and names the path */
  eldr_artifact *v = make_valid(2);
  snprintf(path, sizeof path, "%s/no/such/dir/a.json", tmpdir);
  assert_int_equal(eldr_artifact_save(path, v, &d), ELDR_EIO);
  assert_non_null(strstr(d.msg, path));

  /* a failed save leaves the previous file intact */
  snprintf(path, sizeof path, "%s/keep.json", tmpdir);
  assert_int_equal(eldr_artifact_save(path, v, &d), 0);
  v->tau = 7.0; /* invalid */
  assert_int_equal(eldr_artifact_save(path, v, &d), ELDR_ERANGE);
  assert_int_equal(eldr_artifact_load(path, &a, &d), 0);
  assert_true(a->tau == 0.1);
  eldr_artifact_free(a);
  eldr_artifact_free(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_new_and_sigspec),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_validate),
      cmocka_unit_test(test_files),
      cmocka_unit_test(test_placement_section),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
