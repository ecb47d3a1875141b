/* test_reply_layers.c — the layer axis of vLLM's routed_experts (docs/vllm.md,
 * "The layer axis"): the capturer fixtures of every model preset
 * (tests/fixtures/vllm/capturer_*.json: a row per hidden layer, the dense
 * layers' rows 0) read onto the preset's MoE layers by both readers, every
 * id at its position; dense rows of -1; the dense-layer rule without layer
 * ids; the record reader's preset fallback; what cannot be mapped; the
 * emitter's all-layers form read back in every layout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"
#include "eldr/tracegen.h"
#include "support/proc.h"

static const char *const PRESETS[] = {"llama4-maverick", "deepseek-v3",  "qwen3-30b-a3b",
                                      "qwen3-235b-a22b", "gpt-oss-120b", "olmoe-1b-7b"};
#define NPRESETS (sizeof PRESETS / sizeof *PRESETS)
enum { PP = 20 }; /* the fixtures' prompt tokens (gen_fixtures.py) */

typedef struct preset {
  eldr_shape s;
  uint32_t ids[ELDR_MAX_LAYERS];
  uint32_t hidden;
} preset;

static void preset_get(const char *name, preset *p) {
  assert_int_equal(eldr_tracegen_model_shape(name, &p->s, NULL, 0, NULL), 0);
  eldr_tracegen_layer_ids(name, &p->s, p->ids);
  p->hidden = p->ids[p->s.num_layers - 1] + 1;
}

/* gen_fixtures.py's preset_id: MoE layer i, slot k of token t */
static int64_t want_id(const preset *p, size_t t, size_t i, size_t k) {
  const size_t h = p->s.num_experts / 2;
  return (int64_t)(h + (3 * t + 5 * i + k) % h);
}

static char *capturer(const char *name) {
  char f[128];
  snprintf(f, sizeof f, "capturer_%s.json", name);
  return eldr_test_vllm_fixture(f);
}

/* v holds the preset's MoE layers of the fixture, row t at position t */
static void expect_moe(const preset *p, const eldr_re_view *v, size_t rows, const char *what) {
  assert_non_null(v->data);
  if (v->rows != rows || v->layers != p->s.num_layers || v->top_k != p->s.top_k)
    fail_msg("%s: view (%zu, %zu, %zu), want (%zu, %u, %u)", what, v->rows, v->layers, v->top_k, rows,
             p->s.num_layers, p->s.top_k);
  for (size_t t = 0; t < rows; t++)
    for (size_t i = 0; i < v->layers; i++)
      for (size_t k = 0; k < v->top_k; k++) {
        const int64_t got = eldr_sel_load(v->data, v->dtype, (t * v->layers + i) * v->top_k + k);
        if (got != want_id(p, t, i, k))
          fail_msg("%s: row %zu MoE layer %zu slot %zu: %lld, want %lld", what, t, i, k, (long long)got,
                   (long long)want_id(p, t, i, k));
      }
}

/* Each fixture with the artifact's layers (the preset's ids), by the tree
 * reader and the span reader, counted in the same pass. */
static void test_capturer_fixtures(void **st) {
  (void)st;
  for (size_t i = 0; i < NPRESETS; i++) {
    preset p;
    preset_get(PRESETS[i], &p);
    char *body = capturer(PRESETS[i]);
    const int chat = strstr(body, "\"chat.completion\"") != NULL;
    uint32_t *counts = calloc(eldr_shape_cells(&p.s), sizeof *counts);
    eldr_re_opts o = {chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, p.s.num_layers, p.s.top_k, p.s.num_experts,
                      NULL, NULL, counts, p.ids, 0, NULL};
    for (int scan = 0; scan < 2; scan++) {
      memset(counts, 0, eldr_shape_cells(&p.s) * sizeof *counts);
      eldr_reply_experts r;
      eldr_re_reason why;
      eldr_diag d = {{0}};
      int rc = scan ? eldr_reply_experts_scan(body, strlen(body), &o, &r, &why, &d)
                    : eldr_reply_experts_read(body, strlen(body), &o, &r, &why, &d);
      if (rc) fail_msg("%s: %s (%s)", PRESETS[i], d.msg, eldr_re_reason_name(why));
      assert_int_equal(r.array_layers, p.hidden);
      if (p.hidden != p.s.num_layers) { /* cut down to the MoE layers */
        assert_non_null(r.layer_ids);
        assert_memory_equal(r.layer_ids, p.ids, p.s.num_layers * sizeof *p.ids);
      } else {
        assert_null(r.layer_ids); /* every layer MoE: read as it is */
      }
      expect_moe(&p, &r.choices[0].prompt, PP, PRESETS[i]);
      assert_int_equal(r.choices[0].generated.rows, 0);
      assert_true(r.counted);
      /* every MoE layer's row of counts: PP tokens x top_k, upper half only */
      for (uint32_t l = 0; l < p.s.num_layers; l++) {
        uint64_t sum = 0;
        for (uint32_t e = 0; e < p.s.num_experts; e++) {
          sum += counts[l * p.s.num_experts + e];
          if (e < p.s.num_experts / 2) assert_int_equal(counts[l * p.s.num_experts + e], 0);
        }
        assert_int_equal(sum, (uint64_t)PP * p.s.top_k);
      }
      eldr_reply_experts_free(&r);
    }
    free(counts);
    free(body);
  }
}

/* Without layer ids: drop_dense finds the dense layers where the rule can
 * (top_k >= 2: a row of zeros repeats an id); top-1 zeros stay (ambiguous).
 * The record reader (eldr_reply_experts_moe_rows) takes the layers from the
 * preset the reply's model names, so every preset comes out MoE-only. */
static void test_drop_dense_and_records(void **st) {
  (void)st;
  for (size_t i = 0; i < NPRESETS; i++) {
    preset p;
    preset_get(PRESETS[i], &p);
    char *body = capturer(PRESETS[i]);
    const eldr_re_api api = strstr(body, "\"chat.completion\"") ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS;
    eldr_re_opts o = {api, 0, 0, p.s.num_experts, NULL, NULL, NULL, NULL, 1, NULL};
    eldr_reply_experts r;
    eldr_diag d = {{0}};
    if (eldr_reply_experts_read(body, strlen(body), &o, &r, NULL, &d)) fail_msg("%s: %s", PRESETS[i], d.msg);
    if (p.s.top_k >= 2 || p.hidden == p.s.num_layers) {
      expect_moe(&p, &r.choices[0].prompt, PP, PRESETS[i]);
      if (p.hidden != p.s.num_layers) assert_memory_equal(r.layer_ids, p.ids, p.s.num_layers * sizeof *p.ids);
    } else {
      assert_int_equal(r.choices[0].prompt.layers, p.hidden); /* top-1 zeros: kept */
    }
    eldr_reply_experts_free(&r);
    /* the record reader, with no artifact and with the preset's as one */
    json_t *root = json_loads(body, 0, NULL);
    assert_non_null(root);
    for (int art = 0; art < 2; art++) {
      uint32_t ids[ELDR_MAX_LAYERS];
      assert_int_equal(eldr_reply_experts_moe_rows(root, api, p.s.num_experts, art ? &p.s : NULL, art ? p.ids : NULL,
                                                   &r, ids),
                       0);
      expect_moe(&p, &r.choices[0].prompt, PP, PRESETS[i]);
      assert_memory_equal(ids, p.ids, p.s.num_layers * sizeof *ids);
      eldr_reply_experts_free(&r);
    }
    json_decref(root);
    free(body);
  }
}

/* A reply of rows x La x K int32 ids as an npy string. */
static char *reply_i4(const int32_t *w, size_t rows, size_t La, size_t K) {
  char d[160];
  int dl = snprintf(d, sizeof d, "{'descr': '<i4', 'fortran_order': False, 'shape': (%zu, %zu, %zu), }", rows, La, K);
  size_t hl = (size_t)dl + 1, pad = (64 - (10 + hl) % 64) % 64, n = rows * La * K, total = 10 + hl + pad + 4 * n;
  uint8_t *b = malloc(total);
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (uint8_t)(hl + pad);
  b[9] = (uint8_t)((hl + pad) >> 8);
  memcpy(b + 10, d, (size_t)dl);
  memset(b + 10 + dl, ' ', pad);
  b[10 + dl + pad] = '\n';
  memcpy(b + 10 + hl + pad, w, 4 * n); /* little-endian host */
  char *txt = malloc(eldr_b64_encoded_len(total) + 1);
  eldr_b64_encode(b, total, txt);
  char *out = malloc(strlen(txt) + 200);
  sprintf(out, "{\"object\":\"text_completion\",\"usage\":{\"prompt_tokens\":%zu},\"choices\":[{\"routed_experts\":\"%s\"}]}",
          rows, txt);
  free(b);
  free(txt);
  return out;
}

/* Dense rows of -1 (other builds): never read through the layer ids, found
 * by drop_dense (a negative id is no expert), an error only when read. */
static void test_dense_minus_one(void **st) {
  (void)st;
  preset p;
  preset_get("llama4-maverick", &p); /* top-1: -1 is unambiguous where 0 is not */
  const size_t rows = 5, La = p.hidden, K = p.s.top_k;
  int32_t *w = malloc(rows * La * K * sizeof *w);
  for (size_t t = 0; t < rows; t++)
    for (size_t l = 0; l < La; l++) w[t * La + l] = -1;
  for (size_t t = 0; t < rows; t++)
    for (size_t i = 0; i < p.s.num_layers; i++) w[t * La + p.ids[i]] = (int32_t)want_id(&p, t, i, 0);
  char *body = reply_i4(w, rows, La, K);
  eldr_reply_experts r;
  eldr_re_reason why;
  eldr_re_opts mapped = {ELDR_RE_COMPLETIONS, p.s.num_layers, K, p.s.num_experts, NULL, NULL, NULL, p.ids, 0, NULL};
  assert_int_equal(eldr_reply_experts_scan(body, strlen(body), &mapped, &r, &why, NULL), 0);
  expect_moe(&p, &r.choices[0].prompt, rows, "-1 fill, by layer ids");
  eldr_reply_experts_free(&r);
  eldr_re_opts drop = {ELDR_RE_COMPLETIONS, 0, 0, p.s.num_experts, NULL, NULL, NULL, NULL, 1, NULL};
  assert_int_equal(eldr_reply_experts_read(body, strlen(body), &drop, &r, &why, NULL), 0);
  expect_moe(&p, &r.choices[0].prompt, rows, "-1 fill, drop_dense");
  eldr_reply_experts_free(&r);
  eldr_re_opts all = {ELDR_RE_COMPLETIONS, 0, 0, p.s.num_experts, NULL, NULL, NULL, NULL, 0, NULL};
  assert_int_not_equal(eldr_reply_experts_read(body, strlen(body), &all, &r, &why, NULL), 0);
  assert_int_equal(why, ELDR_RE_NEGATIVE_ID);
  free(body);
  free(w);
}

/* What cannot be mapped: shape_mismatch naming the layers. */
static void test_unmappable(void **st) {
  (void)st;
  preset p;
  preset_get("deepseek-v3", &p);
  char *body = capturer("deepseek-v3"); /* (20, 61, 8) */
  eldr_reply_experts r;
  eldr_re_reason why;
  eldr_diag d = {{0}};
  /* no layer ids: only an array of exactly L layers */
  eldr_re_opts o = {ELDR_RE_COMPLETIONS, p.s.num_layers, 8, 256, NULL, NULL, NULL, NULL, 0, NULL};
  assert_int_not_equal(eldr_reply_experts_scan(body, strlen(body), &o, &r, &why, &d), 0);
  assert_int_equal(why, ELDR_RE_SHAPE_MISMATCH);
  /* ids past the array's layers */
  uint32_t far[58];
  for (uint32_t l = 0; l < 58; l++) far[l] = 10 + l;
  o.layer_ids = far;
  assert_int_not_equal(eldr_reply_experts_scan(body, strlen(body), &o, &r, &why, &d), 0);
  assert_int_equal(why, ELDR_RE_SHAPE_MISMATCH);
  assert_non_null(strstr(d.msg, "model layers 10..67"));
  /* ids out of order */
  uint32_t bad[58];
  memcpy(bad, p.ids, sizeof bad);
  bad[5] = bad[4];
  o.layer_ids = bad;
  assert_int_not_equal(eldr_reply_experts_scan(body, strlen(body), &o, &r, &why, &d), 0);
  assert_int_equal(why, ELDR_RE_SHAPE_MISMATCH);
  /* top-k differs */
  o.layer_ids = p.ids;
  o.top_k = 4;
  assert_int_not_equal(eldr_reply_experts_scan(body, strlen(body), &o, &r, &why, &d), 0);
  assert_int_equal(why, ELDR_RE_SHAPE_MISMATCH);
  free(body);
}

/* The emitter's all-layers form in every layout reads back onto the MoE
 * layers; read as it is, the dense rows are 0. */
static void test_emit_all_layers(void **st) {
  (void)st;
  const eldr_re_layout lays[] = {ELDR_RE_LAYOUT_NPY, ELDR_RE_LAYOUT_V021_LISTS, ELDR_RE_LAYOUT_V021_BASE64,
                                 ELDR_RE_LAYOUT_LISTS};
  for (int pi = 0; pi < 2; pi++) {
    preset p;
    preset_get(pi ? "deepseek-v3" : "llama4-maverick", &p);
    const size_t P = 6, G = 3, LK = (size_t)p.s.num_layers * p.s.top_k;
    uint16_t *pr = malloc(P * LK * sizeof *pr), *ge = malloc(G * LK * sizeof *ge);
    for (size_t t = 0; t < P + G; t++)
      for (size_t i = 0; i < p.s.num_layers; i++)
        for (size_t k = 0; k < p.s.top_k; k++)
          (t < P ? pr + t * LK : ge + (t - P) * LK)[i * p.s.top_k + k] = (uint16_t)want_id(&p, t, i, k);
    for (size_t li = 0; li < 4; li++) {
      json_t *body = json_pack("{s:s,s:{s:I,s:I},s:[{}]}", "object", "text_completion", "usage", "prompt_tokens",
                               (json_int_t)P, "completion_tokens", (json_int_t)(G + 1), "choices");
      assert_int_equal(eldr_reply_experts_emit_layers(body, json_array_get(json_object_get(body, "choices"), 0),
                                                      lays[li], pr, P, ge, G, &p.s, p.ids, p.hidden),
                       0);
      char *txt = json_dumps(body, JSON_COMPACT);
      eldr_re_opts o = {ELDR_RE_COMPLETIONS, p.s.num_layers, p.s.top_k, p.s.num_experts, NULL, NULL, NULL, p.ids, 0, NULL};
      eldr_reply_experts r;
      eldr_diag d = {{0}};
      if (eldr_reply_experts_scan(txt, strlen(txt), &o, &r, NULL, &d))
        fail_msg("%s: %s", eldr_re_layout_name(lays[li]), d.msg);
      assert_int_equal(r.array_layers, p.hidden);
      expect_moe(&p, &r.choices[0].prompt, P, eldr_re_layout_name(lays[li]));
      const eldr_re_view *g = &r.choices[0].generated;
      assert_int_equal(g->rows, G);
      for (size_t t = 0; t < G; t++)
        assert_int_equal(eldr_sel_load(g->data, g->dtype, t * LK), want_id(&p, P + t, 0, 0));
      eldr_reply_experts_free(&r);
      eldr_re_opts any = {.api = ELDR_RE_COMPLETIONS};
      assert_int_equal(eldr_reply_experts_scan(txt, strlen(txt), &any, &r, NULL, &d), 0);
      const eldr_re_view *v = &r.choices[0].prompt;
      assert_int_equal(v->layers, p.hidden);
      assert_null(r.layer_ids);
      for (size_t k = 0; k < p.s.top_k; k++) /* layer 0 is dense in both presets */
        assert_int_equal(eldr_sel_load(v->data, v->dtype, k), 0);
      eldr_reply_experts_free(&r);
      free(txt);
      json_decref(body);
    }
    free(pr);
    free(ge);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capturer_fixtures),
      cmocka_unit_test(test_drop_dense_and_records),
      cmocka_unit_test(test_dense_minus_one),
      cmocka_unit_test(test_unmappable),
      cmocka_unit_test(test_emit_all_layers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
