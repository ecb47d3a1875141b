/* test_serve_compact.c — the compact signature form (eldr/reply_compact.h):
 *  - the signature from an engine's counts is the one from its rows, bit for
 *    bit, on the router's own signature path (masked layers, all-layers or
 *    MoE-only rows, prefix completed from the signature cache);
 *  - through the real router over loopback: a prefill reply carrying only
 *    kv_transfer_params.eldr_expert_counts routes by locality, and the
 *    decoder never receives the key (the rest of kv_transfer_params does
 *    reach it);
 *  - the emulated worker's --routed-experts-layout compact, recorded: the
 *    records hold the same counts as with npy replies;
 *  - what cannot be mapped or is not counts is refused with a reason. */
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
#include "eldr/reply_compact.h"
#include "eldr/reply_experts.h"
#include "eldr/routed_experts.h"
#include "eldr/serve.h"
#include "eldr/tracegen.h"
#include "serve/serve_internal.h"
#include "serve/sigpath.h"
#include "support/fixture.h"
#include "support/proc.h"
#include "support/serve_fixture.h"

#define LOCALITY "eldr_requests_total{policy=\"eldr\",decision=\"locality\",outcome=\"ok\"}"

typedef struct preset {
  eldr_shape s;
  uint32_t ids[ELDR_MAX_LAYERS], hidden;
  char canon[64];
} preset;

static void preset_get(const char *name, preset *p) {
  assert_int_equal(eldr_tracegen_model_shape(name, &p->s, p->canon, sizeof p->canon, NULL), 0);
  eldr_tracegen_layer_ids(name, &p->s, p->ids);
  p->hidden = p->ids[p->s.num_layers - 1] + 1;
}

/* An artifact of the preset's MoE layers, IDF on, 2 centroids (lower /
 * upper half of the experts), mask: every third layer (or all). */
static eldr_artifact *artifact(const preset *p, int masked) {
  uint8_t mask[ELDR_MAX_LAYERS];
  for (uint32_t l = 0; l < p->s.num_layers; l++) mask[l] = !masked || l % 3 == 1;
  eldr_artifact *a = sf_halves_artifact(p->canon, &p->s, p->ids, 1, mask);
  for (size_t i = 0; i < eldr_shape_cells(&p->s); i++) a->idf[i] = 0.5f + (float)(i % 7) / 7.0f;
  return a;
}

/* rows x L x K selections, upper half of the experts, distinct per token */
static uint16_t *selections(const preset *p, size_t rows) {
  const size_t L = p->s.num_layers, K = p->s.top_k, h = p->s.num_experts / 2;
  uint16_t *sel = malloc(rows * L * K * sizeof *sel);
  for (size_t t = 0; t < rows; t++)
    for (size_t l = 0; l < L; l++)
      for (size_t k = 0; k < K; k++) sel[(t * L + l) * K + k] = (uint16_t)(h + (7 * t + 3 * l + k) % h);
  return sel;
}

/* A prefill reply: npy (all hidden layers, as vLLM) or compact (rows at
 * the MoE layers, or at every hidden layer with the dense rows' zeros
 * counted, as a plugin that cannot tell dense layers would send). */
static char *reply(const preset *p, const uint16_t *sel, size_t rows, int form) {
  const size_t L = p->s.num_layers, K = p->s.top_k;
  json_t *kv = json_pack("{s:b,s:b,s:[i],s:s,s:s,s:s,s:i,s:i}", "do_remote_prefill", 1, "do_remote_decode", 0,
                         "remote_block_ids", 1, "remote_engine_id", "e0", "remote_request_id", "r0", "remote_host",
                         "127.0.0.1", "remote_port", 1, "tp_size", 1);
  json_t *ch = json_pack("{s:i,s:s,s:s}", "index", 0, "text", "x", "finish_reason", "length");
  json_t *b = json_pack("{s:s,s:s,s:[o],s:{s:I,s:i},s:o}", "id", "cmpl-c", "object", "text_completion", "choices", ch,
                        "usage", "prompt_tokens", (json_int_t)rows, "completion_tokens", 1, "kv_transfer_params", kv);
  uint16_t *all = calloc(rows * p->hidden * K, sizeof *all);
  for (size_t t = 0; t < rows; t++)
    for (size_t l = 0; l < L; l++) memcpy(all + (t * p->hidden + p->ids[l]) * K, sel + (t * L + l) * K, K * 2);
  const eldr_shape hs = {p->hidden, p->s.num_experts, (uint32_t)K};
  uint32_t every[ELDR_MAX_LAYERS];
  for (uint32_t l = 0; l < p->hidden; l++) every[l] = l;
  if (form == 0) assert_int_equal(eldr_reply_experts_emit_layers(NULL, ch, ELDR_RE_LAYOUT_NPY, sel, rows, NULL, 0, &p->s, p->ids, p->hidden), 0);
  else if (form == 1) assert_int_equal(eldr_compact_emit(kv, sel, rows, &p->s, p->ids, 0), 0);
  else assert_int_equal(eldr_compact_emit(kv, all, rows, &hs, every, 0), 0);
  free(all);
  char *s = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  return s;
}

/* The router's signature path on a reply: the signature (copied). */
static float *signature(eldr__sigpath *sp, const char *text, const eldr__prompt *pr, eldr__sigres *res) {
  eldr_reply_prefill r = {0};
  eldr_diag d = {{0}};
  if (eldr_reply_prefill_read(text, strlen(text), 0, &r, &d)) fail_msg("reply: %s", d.msg);
  eldr__sigpath_extract(sp, r.raw, r.raw_len, NULL, 0, r.routed_experts, r.routed_experts_len, r.compact, pr, res);
  if (res->fallback != ELDR__FB_NONE) fail_msg("fell back (%d): %s", res->fallback, res->diag.msg);
  const size_t dim = sp->conf.art->dim;
  float *sig = malloc(dim * sizeof *sig);
  memcpy(sig, res->sig, dim * sizeof *sig);
  eldr_reply_prefill_free(&r);
  return sig;
}

static void test_same_signature(void **st) {
  (void)st;
  const char *const names[2] = {"llama4-maverick", "deepseek-v3"};
  for (int pi = 0; pi < 2; pi++)
    for (int masked = 0; masked < 2; masked++) {
      preset p;
      preset_get(names[pi], &p);
      eldr_artifact *a = artifact(&p, masked);
      eldr__sigpath sp;
      eldr__sigconf conf;
      eldr_diag d = {{0}};
      assert_int_equal(eldr__sigpath_init(&sp, NULL), 0);
      assert_int_equal(eldr__sigconf_build(&sp, a, 0, &conf, &d), 0);
      eldr__sigpath_commit(&sp, &conf);
      const size_t rows = 37;
      uint16_t *sel = selections(&p, rows);
      char *npy = reply(&p, sel, rows, 0), *moe = reply(&p, sel, rows, 1), *every = reply(&p, sel, rows, 2);
      eldr__sigres r0, r1, r2;
      float *s0 = signature(&sp, npy, NULL, &r0);
      float *s1 = signature(&sp, moe, NULL, &r1);
      float *s2 = signature(&sp, every, NULL, &r2);
      assert_memory_equal(s0, s1, a->dim * sizeof *s0);
      assert_memory_equal(s0, s2, a->dim * sizeof *s0);
      assert_int_equal(r1.n_tokens, rows);
      assert_int_equal(sp.compact_reads, 2);
      assert_null(r1.view.data); /* nothing for the block cache: no per-block rows */
      free(s0);
      free(s1);
      free(s2);
      free(npy);
      free(moe);
      free(every);
      free(sel);
      eldr__sigpath_free(&sp);
      eldr_artifact_free(a);
    }
}

/* A compact reply of the computed tokens only (first_token > 0): the
 * prefix comes from the signature cache an earlier npy reply filled, and
 * the signature is the whole prompt's, as with rows. */
static void test_prefix_from_cache(void **st) {
  (void)st;
  preset p;
  preset_get("qwen3-30b-a3b", &p);
  eldr_artifact *a = artifact(&p, 0);
  eldr__sigpath sp;
  eldr__sigconf conf;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__sigpath_init(&sp, NULL), 0);
  assert_int_equal(eldr__sigconf_build(&sp, a, 1024, &conf, &d), 0);
  eldr__sigpath_commit(&sp, &conf);
  const size_t rows = 48; /* 3 blocks */
  char prompt[1024];
  char *all_unused, *tail_unused;
  sf_prefix_prompt(&p.s, prompt, sizeof prompt, &all_unused, &tail_unused);
  free(all_unused);
  free(tail_unused);
  eldr__prompt pr = {0};
  assert_int_equal(eldr__prompt_init(&sp, &pr, prompt, strlen(prompt), NULL, 0), 0);
  assert_int_equal(pr.ntok, rows);
  uint16_t *sel = selections(&p, rows);
  char *npy = reply(&p, sel, rows, 0);
  eldr__sigres r0;
  float *s0 = signature(&sp, npy, &pr, &r0);
  eldr__sigpath_flush(&sp); /* the blocks stored */
  eldr__sigpath_store(&sp, &r0);
  /* the last block's counts alone, first_token 32, usage still 48 */
  json_t *kv = json_object();
  assert_int_equal(eldr_compact_emit(kv, sel + 32 * p.s.num_layers * p.s.top_k, 16, &p.s, p.ids, 32), 0);
  json_t *b = json_pack("{s:s,s:[{s:i}],s:{s:i},s:o}", "object", "text_completion", "choices", "index", 0, "usage",
                        "prompt_tokens", 48, "kv_transfer_params", kv);
  char *tail = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  eldr__sigres r1;
  float *s1 = signature(&sp, tail, &pr, &r1);
  assert_memory_equal(s0, s1, a->dim * sizeof *s0);
  assert_int_equal(r1.n_tokens, 48);
  assert_int_equal(sp.blocks_missing, 0);
  free(s0);
  free(s1);
  free(npy);
  free(tail);
  free(sel);
  eldr__prompt_free(&pr);
  eldr__sigpath_free(&sp);
  eldr_artifact_free(a);
}

/* Through the router: locality by the engine's counts; the decoder never
 * sees the key, and sees the rest of kv_transfer_params. */
static void test_router_compact(void **st) {
  (void)st;
  preset p;
  preset_get("llama4-maverick", &p);
  eldr_artifact *a = artifact(&p, 1);
  char path[256];
  snprintf(path, sizeof path, "/tmp/eldr_test_compact_%d.json", (int)getpid());
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  eldr_artifact_free(a);
  uint16_t *sel = selections(&p, 20);
  char *text = reply(&p, sel, 20, 2);
  fx_behaviour pb = fx_defaults();
  pb.raw_reply = text;
  sf_rig g;
  sf_start(&g, 1, &pb, 2, NULL);
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(path);
  sf_run(&g);
  for (int i = 0; i < 3; i++) {
    tc_resp r;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", "{\"prompt\":\"a b c\",\"max_tokens\":2}", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(sf_served_by(&r), g.dport[1]); /* the upper-half centroid's decoder */
    tc_free(&r);
  }
  assert_int_equal(rt_metric(g.r.port, LOCALITY), 3);
  fx_record rec;
  assert_int_equal(fx_get(g.d[1], "/v1/completions", -1, &rec), 0);
  if (strstr(rec.body, ELDR_COMPACT_KEY)) fail_msg("the decode leg got the compact counts: %s", rec.body);
  assert_non_null(strstr(rec.body, "\"remote_engine_id\":\"e0\""));
  fx_record_free(&rec);
  sf_free(&g);
  free(text);
  free(sel);
  unlink(path);
}

/* Refusals: counts that are no prompt's, layers the artifact has not. */
static void test_refused(void **st) {
  (void)st;
  static const struct {
    const char *obj, *reason;
  } bad[] = {
      {"{\"encoding\":\"base64\",\"dtype\":\"uint16\",\"shape\":[1,2],\"layers\":[0],\"top_k\":1,\"tokens\":1,"
       "\"data\":\"AgAAAA==\"}", "bad_counts"}, /* expert 0 counted twice in 1 token */
      {"{\"encoding\":\"base64\",\"dtype\":\"uint16\",\"shape\":[1,2],\"layers\":[5],\"top_k\":1,\"tokens\":1,"
       "\"data\":\"AQAAAA==\"}", "shape_mismatch"}, /* no row for layer 0 */
      {"{\"encoding\":\"base64\",\"dtype\":\"int8\",\"shape\":[1,2],\"layers\":[0],\"top_k\":1,\"tokens\":1,"
       "\"data\":\"AQAAAA==\"}", "unknown_dtype"},
      {"{\"encoding\":\"base64\",\"dtype\":\"uint16\",\"shape\":[1,2],\"layers\":[0],\"top_k\":1,\"tokens\":1,"
       "\"data\":\"AQAA\"}", "length_mismatch"},
      {"{\"encoding\":\"base64\",\"dtype\":\"uint16\",\"shape\":[2,2],\"layers\":[1,0],\"top_k\":1,\"tokens\":1,"
       "\"data\":\"AQAAAAEAAAA=\"}", "bad_shape"}, /* layers not increasing */
  };
  const eldr_compact_opts o = {1, NULL, 2, 1, NULL};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    eldr_js_span root;
    assert_int_equal(eldr_js_scan(bad[i].obj, strlen(bad[i].obj), NULL, 0, NULL, &root, NULL), 0);
    uint32_t c[2] = {0, 0};
    eldr_compact_info ci;
    eldr_re_reason why;
    eldr_diag d = {{0}};
    assert_int_not_equal(eldr_compact_read(bad[i].obj, root, &o, c, NULL, &ci, &why, &d), 0);
    if (strcmp(eldr_re_reason_name(why), bad[i].reason)) fail_msg("case %zu: %s (%s)", i, eldr_re_reason_name(why), d.msg);
  }
}

/* The emulated worker in the compact layout, recorded: the same records
 * (counts, layers) as with npy replies of the same prompts. */
static char *record(int compact, const char *tag) {
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.model = "llama4-maverick";
  pc.time_scale = 0.001;
  dc = pc;
  if (compact) pc.routed_experts_layout = ELDR_RE_LAYOUT_COMPACT;
  sf_rig g;
  sf_start_engines(&g, 1, &pc, 2, &dc);
  preset p;
  preset_get("llama4-maverick", &p);
  eldr_artifact *a = artifact(&p, 1); /* a mask: the record still holds every layer */
  char path[256], dir[256];
  snprintf(path, sizeof path, "/tmp/eldr_test_compact_%d_%s.json", (int)getpid(), tag);
  snprintf(dir, sizeof dir, "/tmp/eldr_test_compact_%d_%s", (int)getpid(), tag);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  eldr_artifact_free(a);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  g.c.policy = ELDR_POLICY_ELDR;
  g.c.artifact = strdup(path);
  g.c.record_dir = strdup(dir);
  sf_run(&g);
  for (int i = 0; i < 6; i++) {
    char body[200];
    snprintf(body, sizeof body, "{\"prompt\":\"compact request %d about %d things\",\"max_tokens\":2}", i, i * 7);
    tc_resp r;
    assert_int_equal(tc_post(g.r.port, "/v1/completions", body, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    tc_free(&r);
  }
  assert_int_equal(rt_wait_metric(g.r.port, "eldr_record_written_total", 6, 20), 0);
  assert_int_equal(rt_metric(g.r.port, LOCALITY), 6);
  sf_free(&g);
  unlink(path);
  /* the records' prefill counts, one line per request, in order */
  DIR *dd = opendir(dir);
  assert_non_null(dd);
  struct dirent *de;
  char *out = NULL;
  while ((de = readdir(dd)))
    if (strstr(de->d_name, ".jsonl")) {
      char f[512];
      snprintf(f, sizeof f, "%s/%s", dir, de->d_name);
      char *text = eldr_test_slurp(f, NULL);
      json_t *acc = json_array();
      for (char *s = text, *e; s && *s; s = e + 1) {
        e = strchr(s, '\n');
        json_t *o = json_loadb(s, (size_t)(e - s), 0, NULL);
        json_array_append_new(acc, json_pack("[O,O,O]", json_object_get(o, "layers"), json_object_get(o, "prefill_tokens"),
                                             json_object_get(o, "prefill_counts")));
        json_decref(o);
      }
      out = json_dumps(acc, JSON_COMPACT);
      json_decref(acc);
      free(text);
    }
  closedir(dd);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  assert_non_null(out);
  return out;
}

static void test_worker_compact_records(void **st) {
  (void)st;
  char *rows = record(0, "npy"), *compact = record(1, "compact");
  assert_string_equal(rows, compact);
  assert_non_null(strstr(rows, "[1,3,5,7,")); /* the MoE layers' ids */
  free(rows);
  free(compact);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_signature),
      cmocka_unit_test(test_prefix_from_cache),
      cmocka_unit_test(test_router_compact),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_worker_compact_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
