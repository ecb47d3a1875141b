/* test_serve_presets.c — vLLM's routed_experts on every model shape, through
 * the real router over loopback: the layer axis of the capturer's tensor
 * (a row per hidden layer, dense layers' rows 0; tests/fixtures/vllm/
 * capturer_*.json, written from vLLM's source) and the MoE-only form of
 * older builds both map onto an artifact's MoE layers and give the same
 * locality decision; a dense fill of -1 is ignored as well; the recorder and
 * `eldr fit` give the same artifact from records of either form. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "eldr/tracegen.h"
#include "support/fixture.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

#define LOCALITY "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"

static const char *const PRESETS[] = {"llama4-maverick", "deepseek-v3",  "qwen3-30b-a3b",
                                      "qwen3-235b-a22b", "gpt-oss-120b", "olmoe-1b-7b"};
#define NPRESETS (sizeof PRESETS / sizeof *PRESETS)

/* An artifact of a preset's MoE layers (its layer ids) with 2 centroids:
 * centroid 0 the lower half of every layer's experts, 1 the upper half. */
static char *preset_artifact(const char *preset, const char *tag) {
  eldr_shape s;
  char canon[64];
  assert_int_equal(eldr_tracegen_model_shape(preset, &s, canon, sizeof canon, NULL), 0);
  uint32_t ids[ELDR_MAX_LAYERS];
  eldr_tracegen_layer_ids(preset, &s, ids);
  char name[96];
  snprintf(name, sizeof name, "presets_%s", tag);
  return sf_artifact_save(sf_halves_artifact(canon, &s, ids, 0, NULL), name);
}

static char *fixture(const char *preset) {
  char name[128];
  snprintf(name, sizeof name, "capturer_%s.json", preset);
  return eldr_test_vllm_fixture(name);
}

/* base64 of a .npy '<i4' array (format 1.0) of rows x L x K ids. */
static char *npy_i4(const int32_t *ids, size_t rows, size_t L, size_t K) {
  char d[160];
  int dl = snprintf(d, sizeof d, "{'descr': '<i4', 'fortran_order': False, 'shape': (%zu, %zu, %zu), }", rows, L, K);
  size_t hl = (size_t)dl + 1, pad = (64 - (10 + hl) % 64) % 64, n = rows * L * K;
  size_t total = 10 + hl + pad + 4 * n;
  uint8_t *b = malloc(total);
  assert_non_null(b);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (uint8_t)((hl + pad) & 0xff);
  b[9] = (uint8_t)((hl + pad) >> 8);
  memcpy(b + 10, d, (size_t)dl);
  memset(b + 10 + dl, ' ', pad);
  b[10 + dl + pad] = '\n';
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 4; k++) b[10 + hl + pad + 4 * i + (size_t)k] = (uint8_t)((uint32_t)ids[i] >> (8 * k));
  char *out = malloc(eldr_b64_encoded_len(total) + 1);
  assert_non_null(out);
  eldr_b64_encode(b, total, out);
  free(b);
  return out;
}

/* The fixture reply with its routed_experts replaced: MoE-only rows
 * (moe_only), or the all-layers rows with every dense id -1 (as int32). */
static char *variant(const char *reply, const char *preset, int moe_only) {
  json_t *j = json_loads(reply, 0, NULL);
  assert_non_null(j);
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  const char *b64 = json_string_value(json_object_get(ch, "routed_experts"));
  uint16_t *sel;
  size_t rows;
  eldr_shape as;
  assert_int_equal(eldr_routed_experts_decode(b64, strlen(b64), NULL, &sel, &rows, &as, NULL), 0);
  eldr_shape s;
  assert_int_equal(eldr_tracegen_model_shape(preset, &s, NULL, 0, NULL), 0);
  uint32_t ids[ELDR_MAX_LAYERS];
  eldr_tracegen_layer_ids(preset, &s, ids);
  const size_t La = as.num_layers, L = s.num_layers, K = s.top_k;
  assert_int_equal(La, ids[L - 1] + 1);
  char *enc = NULL;
  if (moe_only) {
    uint16_t *m = malloc(rows * L * K * sizeof *m);
    for (size_t t = 0; t < rows; t++)
      for (size_t l = 0; l < L; l++) memcpy(m + (t * L + l) * K, sel + (t * La + ids[l]) * K, K * sizeof *m);
    assert_int_equal(eldr_routed_experts_encode(m, rows, &s, ELDR_SEL_U16, &enc, NULL), 0);
    free(m);
  } else {
    int32_t *w = malloc(rows * La * K * sizeof *w);
    uint8_t moe[ELDR_MAX_LAYERS] = {0};
    for (size_t l = 0; l < L; l++) moe[ids[l]] = 1;
    for (size_t i = 0; i < rows * La * K; i++) w[i] = moe[i / K % La] ? sel[i] : -1;
    enc = npy_i4(w, rows, La, K);
    free(w);
  }
  free(sel);
  json_object_set_new(ch, "routed_experts", json_string(enc));
  free(enc);
  char *out = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  return out;
}

/* POST the kind of request the reply answers; the decoder port that served it. */
static int post_served_by(int port, const char *reply) {
  json_t *j = json_loads(reply, 0, NULL);
  const int chat = !strcmp(json_string_value(json_object_get(j, "object")), "chat.completion");
  json_decref(j);
  tc_resp r;
  assert_int_equal(tc_post(port, chat ? "/v1/chat/completions" : "/v1/completions",
                           chat ? "{\"messages\":[{\"role\":\"user\",\"content\":\"a b c\"}],\"max_tokens\":2}"
                                : "{\"prompt\":\"a b c\",\"max_tokens\":2}",
                           NULL, &r),
                   0);
  if (r.status != 200) fail_msg("status %d: %s", r.status, r.body);
  int by = sf_served_by(&r);
  tc_free(&r);
  return by;
}

/* Each preset's capturer fixture, its MoE-only form and its -1-filled form
 * as the prefill's reply: a locality decision every time, to the decoder of
 * the upper-half centroid (the fixtures' MoE rows pick upper-half experts;
 * a reader that took the dense rows' zeros would lean the other way). */
static void test_capturer_presets(void **st) {
  (void)st;
  for (size_t i = 0; i < NPRESETS; i++) {
    char *art = preset_artifact(PRESETS[i], PRESETS[i]);
    sf_rig g;
    sf_start(&g, 1, NULL, 2, NULL);
    g.c.header_timeout_s = 5;
    g.c.policy = ELDR_POLICY_ELDR;
    g.c.artifact = strdup(art);
    sf_run(&g);
    char *reply = fixture(PRESETS[i]);
    char *forms[3] = {reply, variant(reply, PRESETS[i], 1), variant(reply, PRESETS[i], 0)};
    static const char *const names[3] = {"all layers (vLLM's capturer)", "MoE layers only", "dense rows -1"};
    for (int f = 0; f < 3; f++) {
      fx_behaviour b = fx_defaults();
      b.raw_reply = forms[f];
      fx_set(g.p[0], &b);
      int by = post_served_by(g.r.port, forms[f]);
      if (rt_metric(g.r.port, LOCALITY) != f + 1)
        fail_msg("%s, %s: not a locality decision\n%s", PRESETS[i], names[f], rt_log_text(&g.r));
      if (by != g.dport[1])
        fail_msg("%s, %s: served by %d, the upper-half centroid's decoder is %d", PRESETS[i], names[f], by,
                 g.dport[1]);
      fx_behaviour none = fx_defaults();
      fx_set(g.p[0], &none);
    }
    for (int k = 1; k < ELDR_RE__N; k++) {
      char series[160];
      snprintf(series, sizeof series, "eldr_routed_experts_rejected_total{reason=\"%s\"}",
               eldr_re_reason_name((eldr_re_reason)k));
      if (rt_metric(g.r.port, series) > 0) fail_msg("%s: %s", PRESETS[i], series);
    }
    sf_free(&g);
    for (int f = 0; f < 3; f++) free(forms[f]);
    unlink(art);
    free(art);
  }
}

/* An artifact of another model's layers: what cannot be mapped is refused,
 * counted as shape_mismatch, and the request still served. */
static void test_unmappable(void **st) {
  (void)st;
  char *art = preset_artifact("deepseek-v3", "unmappable"); /* 58 MoE layers at 3..60 */
  sf_rig g;
  sf_start(&g, 1, NULL, 2, NULL);
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(art);
  sf_run(&g);
  char *reply = fixture("qwen3-30b-a3b"); /* 48 layers, top-8: fewer rows than layer 60 */
  fx_behaviour b = fx_defaults();
  b.raw_reply = reply;
  fx_set(g.p[0], &b);
  post_served_by(g.r.port, reply);
  assert_int_equal(rt_metric(g.r.port, "eldr_routed_experts_rejected_total{reason=\"shape_mismatch\"}"), 1);
  assert_int_equal(rt_metric(g.r.port, "eldr_fallback_total{reason=\"shape_mismatch\"}"), 1);
  sf_free(&g);
  free(reply);
  unlink(art);
  free(art);
}

/* ---- records and fit from either form -------------------------------------- */

/* Record n requests through emulated llama4-maverick engines replying in
 * one layer form (moe_only), with an artifact of the preset's layers or
 * without one (the recorder then takes the layers from the model's preset);
 * fit the directory; the artifact's path (malloc'd). */
static char *record_and_fit(int moe_only, int with_artifact, const char *tag) {
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.model = "llama4-maverick";
  pc.time_scale = 0.001;
  pc.routed_experts_moe_only = moe_only;
  dc = pc;
  dc.routed_experts_decode = 1;
  sf_rig g;
  sf_start_engines(&g, 1, &pc, 2, &dc);
  char dir[256], out[256];
  snprintf(dir, sizeof dir, "/tmp/eldr_test_presets_%d_%s", (int)getpid(), tag);
  snprintf(out, sizeof out, "/tmp/eldr_test_presets_%d_%s_fit.json", (int)getpid(), tag);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  char *art = preset_artifact("llama4-maverick", tag);
  g.c.policy = ELDR_POLICY_ELDR;
  if (with_artifact) g.c.artifact = strdup(art);
  else g.c.record_experts = 128;
  g.c.record_dir = strdup(dir);
  sf_run(&g);
  const int n = 24;
  for (int i = 0; i < n; i++) {
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"request %d talks about topic %d in %d words\",\"max_tokens\":%d}", i,
             i % 4, 20 + i, 3 + i % 5);
    tc_resp r;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    tc_free(&r);
  }
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_record_written_total", n, 20), 0);
  sf_free(&g);
  char err[4096];
  int rc = eldr_test_eldr(NULL, "/tmp/eldr_test_presets_fit.err", "fit", "--trace", dir, "--decoders", "2", "-o", out,
                          "--created", "2026-01-01T00:00:00Z", "--restarts", "2", "-q", NULL);
  eldr_test_read_into("/tmp/eldr_test_presets_fit.err", err, sizeof err);
  if (rc) fail_msg("eldr fit on %s exited %d: %s", dir, rc, err);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  unlink(art);
  free(art);
  return strdup(out);
}

static eldr_artifact *load(const char *path) {
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  if (eldr_artifact_load(path, &a, &d)) fail_msg("%s: %s", path, d.msg);
  return a;
}

static void same_artifact(const eldr_artifact *a, const eldr_artifact *b, const char *what) {
  if (memcmp(&a->shape, &b->shape, sizeof a->shape) || a->repr != b->repr || a->idf_enabled != b->idf_enabled ||
      a->k != b->k || a->dim != b->dim)
    fail_msg("%s: shape, representation, IDF or dimension differ", what);
  if (memcmp(a->layer_ids, b->layer_ids, a->shape.num_layers * sizeof *a->layer_ids) ||
      memcmp(a->mask, b->mask, a->shape.num_layers))
    fail_msg("%s: layer ids or mask differ", what);
  if (memcmp(a->centroids, b->centroids, a->k * a->dim * sizeof *a->centroids))
    fail_msg("%s: centroids differ", what);
  if (a->idf && memcmp(a->idf, b->idf, eldr_shape_cells(&a->shape) * sizeof *a->idf)) fail_msg("%s: IDF differs", what);
}

static void test_record_fit_either_form(void **st) {
  (void)st;
  char *p_all = record_and_fit(0, 1, "all_art"), *p_moe = record_and_fit(1, 1, "moe_art"),
       *p_none = record_and_fit(0, 0, "all_noart");
  eldr_artifact *a = load(p_all), *b = load(p_moe), *c = load(p_none);
  assert_int_equal(a->shape.num_layers, 24); /* the MoE layers, at 1, 3, ..., 47 */
  for (uint32_t l = 0; l < 24; l++) assert_int_equal(a->layer_ids[l], 2 * l + 1);
  same_artifact(a, b, "all-layers vs MoE-only records");
  same_artifact(a, c, "records with vs without an artifact");
  eldr_artifact_free(a);
  eldr_artifact_free(b);
  eldr_artifact_free(c);
  unlink(p_all);
  unlink(p_moe);
  unlink(p_none);
  free(p_all);
  free(p_moe);
  free(p_none);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capturer_presets),
      cmocka_unit_test(test_unmappable),
      cmocka_unit_test(test_record_fit_either_form),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
