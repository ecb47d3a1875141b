/* test_record_serve.c — serve --record behind the real router with emulated
 * workers (qwen3-30b-a3b shape, decode replies with routed_experts): what a
 * record holds (prompt counts over every layer, generated counts, the
 * decision, similarities, TTFT/TPOT, status), sampling, the prompt's counts
 * completed from the signature cache when the worker returns only the
 * computed rows, and a writer that cannot keep up: records dropped and
 * counted in /metrics while requests are served without waiting. */
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
#include "serve/serve_types.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "support/proc.h"

static const eldr_shape QWEN = {48, 128, 8};

typedef struct env {
  sf_rig s; /* one prefill and two decode emulated engines, the router */
  char dir[256];
  char *artifact;
} env;

/* An artifact for the emulator's shape with 2 centroids (lower / upper half
 * of the experts) over the layers of mask (NULL: all). */
static char *artifact_masked(const uint8_t *mask, const char *tag) {
  eldr_artifact *a = eldr_artifact_new("qwen3-30b-a3b", &QWEN, NULL, ELDR_REPR_COUNT, 0, mask, 2);
  assert_non_null(a);
  size_t per = a->dim / 2;
  for (size_t c = 0; c < 2; c++)
    for (size_t j = 0; j < a->dim; j++)
      a->centroids[c * a->dim + j] = (j % QWEN.num_experts) / 64 == c ? 1.0f / sqrtf((float)per) : 0.0f;
  a->cluster_sizes[0] = a->cluster_sizes[1] = 1;
  a->tau = 0.1;
  a->fit_n = 2;
  a->fit_balanced = 1;
  char *path = malloc(256);
  snprintf(path, 256, "/tmp/eldr_test_recs_%d_%s.json", (int)getpid(), tag);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_artifact_save(path, a, &d), 0);
  eldr_artifact_free(a);
  return path;
}

/* layout: the workers' routed_experts layout (0: npy); no_artifact: record
 * with record_experts instead. */
static int layout = 0, no_artifact = 0;

static void env_start(env *e, const uint8_t *mask, int computed_only, double sample, size_t queue, const char *tag) {
  memset(e, 0, sizeof *e);
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  if (layout) pc.routed_experts_layout = (eldr_re_layout)layout;
  pc.time_scale = 0.01;
  pc.routed_experts_computed_only = computed_only;
  dc = pc;
  dc.routed_experts_decode = 1;
  sf_start_engines(&e->s, 1, &pc, 2, &dc);
  snprintf(e->dir, sizeof e->dir, "/tmp/eldr_test_recs_%d_%s", (int)getpid(), tag);
  assert_int_equal(eldr_test_rmtree(e->dir), 0);
  e->artifact = artifact_masked(mask, tag);
  eldr_serve_config *c = &e->s.c;
  c->policy = ELDR_POLICY_ELDR;
  if (no_artifact) c->record_experts = 128;
  else c->artifact = strdup(e->artifact);
  c->record_dir = strdup(e->dir);
  c->record_sample = sample;
  c->record_queue = queue;
  sf_run(&e->s);
}

static void env_stop(env *e) {
  sf_free(&e->s); /* the recorder writes what is queued and closes */
  unlink(e->artifact);
  free(e->artifact);
}

static void env_clean(env *e) {
  assert_int_equal(eldr_test_rmtree(e->dir), 0);
}

/* Every record line of dir (one file expected), parsed; n lines. */
static json_t **records(const char *dir, size_t *n) {
  DIR *dd = opendir(dir);
  assert_non_null(dd);
  struct dirent *de;
  char path[512] = "";
  int files = 0;
  while ((de = readdir(dd)))
    if (strstr(de->d_name, ".jsonl")) {
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      files++;
    }
  closedir(dd);
  assert_int_equal(files, 1);
  char *text = eldr_test_slurp(path, NULL);
  assert_non_null(text);
  json_t **v = calloc(64, sizeof *v);
  *n = 0;
  for (char *s = text, *e; *s && *n < 64; s = e + 1) {
    e = strchr(s, '\n');
    assert_non_null(e);
    v[*n] = json_loadb(s, (size_t)(e - s), 0, NULL);
    assert_non_null(v[*n]);
    (*n)++;
  }
  free(text);
  return v;
}

static int64_t ival(json_t *o, const char *k) { return (int64_t)json_integer_value(json_object_get(o, k)); }


static void test_records(void **st) {
  (void)st;
  uint8_t mask[48] = {0};
  mask[5] = mask[27] = mask[41] = 1; /* a layer mask, as `eldr fit` chooses */
  env e;
  env_start(&e, mask, 0, 0.5, 64, "mask");
  const char *comp = "/v1/completions", *chat = "/v1/chat/completions";
  const char *body[8] = {
      "{\"prompt\":\"one two three four five six\",\"max_tokens\":6}",
      "{\"prompt\":\"the capital of france is a city with a long history\",\"max_tokens\":6}",
      "{\"prompt\":\"stream this\",\"max_tokens\":5,\"stream\":true}",
      "{\"prompt\":\"stream this too please\",\"max_tokens\":5,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}",
      "{\"messages\":[{\"role\":\"user\",\"content\":\"what is an expert\"}],\"max_tokens\":4}",
      "{\"prompt\":\"seven\",\"max_tokens\":3}",
      "{\"prompt\":\"eight nine ten eleven twelve\",\"max_tokens\":7}",
  };
  /* the client's X-Request-Id on two of the recorded requests (the 2nd and 6th) */
  for (int i = 0; i < 8; i++)
    sf_post_ok(e.s.r.port, i == 4 || i == 5 ? chat : comp, body[i],
               i == 1 ? "X-Request-Id: client-\"one\"\r\n" : i == 5 ? "X-Request-Id: client-5\r\n" : NULL, NULL);
  /* every other request (a stride of 0.5): 2, 4, 6, 8 */
  assert_int_equal(rt_wait_metric(e.s.r.port, "eldr_record_written_total", 4, 10), 0);
  assert_int_equal(rt_metric(e.s.r.port, "eldr_record_sampled_out_total"), 4);
  assert_int_equal(rt_metric(e.s.r.port, "eldr_record_dropped_total{reason=\"queue_full\"}"), 0);
  assert_int_equal(rt_metric(e.s.r.port, "eldr_record_files_total"), 1);
  env_stop(&e);
  size_t n;
  json_t **v = records(e.dir, &n);
  assert_int_equal(n, 4);
  const int want_out[4] = {6, 5, 4, 7};
  for (size_t i = 0; i < n; i++) {
    json_t *o = v[i], *sv = json_object_get(o, "serve");
    assert_string_equal(json_string_value(json_object_get(o, "form")), "counts");
    assert_string_equal(json_string_value(json_object_get(o, "model")), "qwen3-30b-a3b");
    assert_int_equal(ival(o, "num_experts"), 128);
    assert_int_equal(ival(o, "top_k"), 8);
    assert_int_equal(json_array_size(json_object_get(o, "layers")), 48);
    /* the whole prompt (the worker returns every prompt row), every layer */
    assert_true(ival(o, "prefill_tokens") > 0);
    assert_int_equal(ival(o, "prefill_tokens"), ival(sv, "prompt_tokens"));
    sf_check_counts(json_object_get(o, "prefill_counts"), &QWEN, ival(o, "prefill_tokens"));
    if (i == 1) { /* streamed: no generated rows; usage from the stream; a TPOT */
      assert_null(json_object_get(o, "decode_counts")); /* absent: unknown */
      assert_int_equal(ival(o, "decode_tokens"), want_out[i]);
      assert_true(json_real_value(json_object_get(sv, "tpot_ms")) >= 0);
      assert_true(json_is_real(json_object_get(sv, "tpot_ms")));
    } else { /* whole reply: the generated tokens' rows (the last was never forwarded) */
      assert_int_equal(ival(o, "decode_tokens"), want_out[i] - 1);
      sf_check_counts(json_object_get(o, "decode_counts"), &QWEN, want_out[i] - 1);
      assert_true(json_is_null(json_object_get(sv, "tpot_ms")));
    }
    assert_int_equal(ival(sv, "output_tokens"), want_out[i]);
    assert_string_equal(json_string_value(json_object_get(sv, "policy")), "eldr");
    assert_string_equal(json_string_value(json_object_get(sv, "reason")), "locality");
    int64_t k = ival(sv, "decoder_index");
    assert_true(k == 0 || k == 1);
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", e.s.dport[k]);
    assert_string_equal(json_string_value(json_object_get(sv, "decoder")), hp);
    assert_int_equal(ival(sv, "centroid"), k);
    json_t *sims = json_object_get(sv, "similarity");
    assert_int_equal(json_array_size(sims), 2);
    for (int c = 0; c < 2; c++) {
      double x = json_number_value(json_array_get(sims, (size_t)c));
      assert_true(x >= -1.0001 && x <= 1.0001);
    }
    assert_int_equal(ival(sv, "status"), 200);
    /* the client's id beside the engines' (a UUID in "id"), null when none was sent */
    const char *want_cid = i == 0 ? "client-\"one\"" : i == 2 ? "client-5" : NULL;
    json_t *cid = json_object_get(sv, "client_request_id");
    if (want_cid) assert_string_equal(json_string_value(cid), want_cid);
    else assert_true(json_is_null(cid));
    assert_int_equal(strlen(json_string_value(json_object_get(o, "id"))), 36);
    assert_int_equal(strlen(json_string_value(json_object_get(sv, "artifact"))), 16);
    assert_true(json_real_value(json_object_get(sv, "time")) > 1.7e9);
    /* arrival (seconds since the recorder started): present and in record
     * order (an absent key reads as 0 and would pass a bare >= check) */
    json_t *arr = json_object_get(o, "arrival");
    assert_true(json_is_number(arr));
    assert_true(json_number_value(arr) >= 0);
    if (i) assert_true(json_number_value(arr) >= json_number_value(json_object_get(v[i - 1], "arrival")));
  }
  /* only now: the loop reads the previous record (v[i - 1]) */
  for (size_t i = 0; i < n; i++) json_decref(v[i]);
  free(v);
  env_clean(&e);
}

/* A worker that returns only the rows it computed past its prefix cache:
 * the record's prompt counts are completed from the signature cache (every
 * layer in the mask here), so they cover the whole prompt. */
static void test_cache_completed(void **st) {
  (void)st;
  env e;
  env_start(&e, NULL, 1, 1, 64, "cache");
  char bodyb[2048];
  int n = snprintf(bodyb, sizeof bodyb, "{\"prompt\":\"");
  for (int i = 0; i < 60; i++) n += snprintf(bodyb + n, sizeof bodyb - (size_t)n, "word%d ", i);
  snprintf(bodyb + n, sizeof bodyb - (size_t)n, "\",\"max_tokens\":3}");
  sf_post_ok(e.s.r.port, "/v1/completions", bodyb, NULL, NULL);
  sf_post_ok(e.s.r.port, "/v1/completions", bodyb, NULL, NULL); /* prefix-cached at the worker now */
  assert_int_equal(rt_wait_metric(e.s.r.port, "eldr_record_written_total", 2, 10), 0);
  assert_true(rt_metric(e.s.r.port, "eldr_sigcache_hits_total") > 0);
  env_stop(&e);
  size_t nr;
  json_t **v = records(e.dir, &nr);
  assert_int_equal(nr, 2);
  for (size_t i = 0; i < nr; i++) {
    json_t *sv = json_object_get(v[i], "serve");
    assert_int_equal(ival(v[i], "prefill_tokens"), ival(sv, "prompt_tokens"));
    sf_check_counts(json_object_get(v[i], "prefill_counts"), &QWEN, ival(v[i], "prefill_tokens"));
  }
  /* the same prompt: the same counts */
  assert_true(json_equal(json_object_get(v[0], "prefill_counts"), json_object_get(v[1], "prefill_counts")));
  json_decref(v[0]);
  json_decref(v[1]);
  free(v);
  env_clean(&e);
}

/* The writer stalls (a slow disk): the router serves at full speed, the
 * queue stays at its bound, the rest is dropped and counted in /metrics. */
static void test_writer_behind(void **st) {
  (void)st;
  env e;
  env_start(&e, NULL, 0, 1, 2, "behind");
  /* every batch: a 60 s stall, ended early by set_slow(0) below */
  eldr__rec_set_slow(e.s.r.srv->rec, 60.0);
  const char *body = "{\"prompt\":\"a slow disk\",\"max_tokens\":2}";
  sf_post_ok(e.s.r.port, "/v1/completions", body, NULL, NULL);
  /* A record is submitted when the router frees the request, which can be
   * after the client read its reply: once no connection but the scrape's
   * is open, every request so far was freed and its record submitted. */
  assert_int_equal(rt_wait_metric_le(e.s.r.port, "eldr_connections_open", 1, 10), 0);
  /* the writer took the first record, alone, and stalls */
  assert_int_equal(rt_wait_metric_le(e.s.r.port, "eldr_record_queue_depth", 0, 10), 0);
  double t0 = fx_now();
  for (int i = 0; i < 10; i++) sf_post_ok(e.s.r.port, "/v1/completions", body, NULL, NULL);
  double took = fx_now() - t0;
  assert_true(took < 60.0); /* no request waited for the writer's stall */
  assert_int_equal(rt_wait_metric_le(e.s.r.port, "eldr_connections_open", 1, 10), 0); /* all 11 submitted */
  assert_int_equal(rt_metric(e.s.r.port, "eldr_record_queue_depth"), 2);
  assert_int_equal(rt_metric(e.s.r.port, "eldr_record_dropped_total{reason=\"queue_full\"}"), 8);
  assert_int_equal(rt_metric(e.s.r.port, "eldr_record_written_total"), 0);
  assert_true(rt_metric(e.s.r.port, "eldr_record_queue_bytes") > 0);
  eldr__rec_set_slow(e.s.r.srv->rec, 0);
  env_stop(&e); /* the stalled batch and the two queued are written */
  size_t n;
  json_t **v = records(e.dir, &n);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < n; i++) json_decref(v[i]);
  free(v);
  env_clean(&e);
}

/* The JSON-list layout of vLLM 0.21 (prompt rows in prompt_routed_experts,
 * generated rows per choice), with a layer mask (the decoded rows are
 * copied at the decision) and without an artifact (read on the loop with
 * record_experts): the same records as with .npy. */
static void test_list_layouts(void **st) {
  (void)st;
  uint8_t mask[48] = {0};
  mask[3] = mask[40] = 1;
  layout = ELDR_RE_LAYOUT_V021_LISTS;
  for (no_artifact = 0; no_artifact < 2; no_artifact++) {
    env e;
    env_start(&e, mask, 0, 1, 64, no_artifact ? "lists0" : "lists1");
    sf_post_ok(e.s.r.port, "/v1/completions", "{\"prompt\":\"a prompt in lists\",\"max_tokens\":4}", NULL, NULL);
    sf_post_ok(e.s.r.port, "/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"lists in chat\"}],\"max_tokens\":3}", NULL, NULL);
    assert_int_equal(rt_wait_metric(e.s.r.port, "eldr_record_written_total", 2, 10), 0);
    env_stop(&e);
    size_t n;
    json_t **v = records(e.dir, &n);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
      json_t *sv = json_object_get(v[i], "serve");
      assert_int_equal(ival(v[i], "prefill_tokens"), ival(sv, "prompt_tokens"));
      sf_check_counts(json_object_get(v[i], "prefill_counts"), &QWEN, ival(v[i], "prefill_tokens"));
      assert_int_equal(ival(v[i], "decode_tokens"), ival(sv, "output_tokens") - 1);
      sf_check_counts(json_object_get(v[i], "decode_counts"), &QWEN, ival(v[i], "decode_tokens"));
      assert_string_equal(json_string_value(json_object_get(sv, "reason")), no_artifact ? "no_artifact" : "locality");
      json_decref(v[i]);
    }
    free(v);
    env_clean(&e);
  }
  layout = 0;
  no_artifact = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_records),
      cmocka_unit_test(test_cache_completed),
      cmocka_unit_test(test_writer_behind),
      cmocka_unit_test(test_list_layouts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
