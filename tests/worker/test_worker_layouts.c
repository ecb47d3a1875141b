/* test_worker_layouts.c — the emulated worker's routed_experts in each
 * --routed-experts-layout, read back by the reply reader over real HTTP,
 * ids equal to the worker's own prompt selections; a bad layout name is a
 * usage error (exit 2). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "eldr/reply_experts.h"
#include "eldr/tracegen.h"
#include "support/proc.h"
#include "worker/wtest.h"

static char *post(int port, const char *path, json_t *body, int *status, size_t *len) {
  char *s = json_dumps(body, JSON_COMPACT);
  wt_resp r;
  int rc = wt_http(port, "POST", path, s, 10.0, &r);
  free(s);
  assert_int_equal(rc, 0);
  *status = r.status;
  *len = r.len;
  return r.body; /* taken over from r */
}

static void test_each_layout_reads_back(void **state) {
  (void)state;
  const eldr_re_layout lays[] = {ELDR_RE_LAYOUT_NPY, ELDR_RE_LAYOUT_V021_LISTS,
                                 ELDR_RE_LAYOUT_V021_BASE64, ELDR_RE_LAYOUT_LISTS};
  for (size_t li = 0; li < 4; li++) {
    eldr_worker_config cfg;
    eldr_worker_config_default(&cfg);
    cfg.role = ELDR_WORKER_PREFILL;
    cfg.time_scale = 0.01;
    cfg.routed_experts_layout = lays[li];
    wt_worker ww;
    eldr_diag d = {{0}};
    if (wt_worker_start(&ww, &cfg, &d) < 0) fail_msg("worker: %s", d.msg);
    eldr_shape sh;
    assert_int_equal(eldr_tracegen_model_shape(cfg.model, &sh, NULL, 0, NULL), 0);
    const char *prompt = "the quick brown fox jumps over the lazy dog and keeps running far away";
    for (int chat = 0; chat < 2; chat++) {
      json_t *b = chat ? json_pack("{s:[{s:s,s:s}],s:i,s:b,s:{s:b}}", "messages", "role", "user",
                                   "content", prompt, "max_tokens", 1, "stream", 0,
                                   "kv_transfer_params", "do_remote_decode", 1)
                       : json_pack("{s:s,s:i,s:b,s:{s:b}}", "prompt", prompt, "max_tokens", 1,
                                   "stream", 0, "kv_transfer_params", "do_remote_decode", 1);
      int status;
      size_t len;
      char *body = post(ww.port, chat ? "/v1/chat/completions" : "/v1/completions", b, &status, &len);
      json_decref(b);
      assert_int_equal(status, 200);
      eldr_re_opts o = {chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, sh.num_layers, sh.top_k,
                        sh.num_experts, NULL, NULL, NULL, NULL, 0, NULL};
      eldr_reply_experts r;
      eldr_re_reason why;
      if (eldr_reply_experts_read(body, len, &o, &r, &why, &d))
        fail_msg("%s %s: %s (%s)", eldr_re_layout_name(lays[li]), chat ? "chat" : "completions",
                 d.msg, eldr_re_reason_name(why));
      assert_int_equal(r.layout, lays[li]);
      assert_int_equal(r.nchoices, 1);
      const eldr_re_view *v = &r.choices[0].prompt;
      assert_true(r.prompt_tokens > 0);
      assert_int_equal(v->rows + v->first_token, (size_t)r.prompt_tokens);
      assert_int_equal(r.choices[0].generated.rows, 0);
      if (!chat) {
        uint16_t *sel = NULL;
        size_t n = 0;
        assert_int_equal(eldr_worker_prompt_selections(ww.w, prompt, strlen(prompt), NULL, &sel, &n, &d), 0);
        assert_int_equal(n, (size_t)r.prompt_tokens);
        const size_t LK = (size_t)sh.num_layers * sh.top_k, isz = eldr_sel_dtype_size(v->dtype);
        for (size_t i = 0; i < v->rows * LK; i++) {
          const uint8_t *q = (const uint8_t *)v->data + i * isz;
          uint32_t e = isz == 1 ? q[0] : (uint32_t)(q[0] | q[1] << 8); /* u1, u2, i2 (ids >= 0) */
          if (v->dtype == ELDR_SEL_U16) { /* lists: host order */
            uint16_t h;
            memcpy(&h, q, 2);
            e = h;
          }
          if (e != sel[v->first_token * LK + i])
            fail_msg("%s: element %zu is %u, the worker selected %u", eldr_re_layout_name(lays[li]),
                     i, e, sel[v->first_token * LK + i]);
        }
        free(sel);
      }
      eldr_reply_experts_free(&r);
      free(body);
    }
    wt_worker_stop(&ww);
  }
}

/* --routed-experts-layers: vLLM's all-layers rows by default (Maverick: 48
 * rows, the dense layers' 0), the MoE rows with moe; both read onto the
 * preset's MoE layers give the worker's own selections. */
static void test_layer_forms(void **state) {
  (void)state;
  for (int moe_only = 0; moe_only < 2; moe_only++) {
    eldr_worker_config cfg;
    eldr_worker_config_default(&cfg);
    cfg.role = ELDR_WORKER_PREFILL;
    cfg.model = "llama4-maverick";
    cfg.time_scale = 0.01;
    cfg.routed_experts_moe_only = moe_only;
    wt_worker ww;
    eldr_diag d = {{0}};
    if (wt_worker_start(&ww, &cfg, &d) < 0) fail_msg("worker: %s", d.msg);
    eldr_shape sh;
    uint32_t ids[ELDR_MAX_LAYERS];
    assert_int_equal(eldr_tracegen_model_shape(cfg.model, &sh, NULL, 0, NULL), 0);
    eldr_tracegen_layer_ids(cfg.model, &sh, ids);
    const char *prompt = "layers of a model with dense and moe layers interleaved";
    json_t *b = json_pack("{s:s,s:i,s:{s:b}}", "prompt", prompt, "max_tokens", 1, "kv_transfer_params",
                          "do_remote_decode", 1);
    int status;
    size_t len;
    char *body = post(ww.port, "/v1/completions", b, &status, &len);
    json_decref(b);
    assert_int_equal(status, 200);
    eldr_re_opts o = {ELDR_RE_COMPLETIONS, sh.num_layers, sh.top_k, sh.num_experts, NULL, NULL, NULL, ids, 0, NULL};
    eldr_reply_experts r;
    if (eldr_reply_experts_read(body, len, &o, &r, NULL, &d)) fail_msg("%s", d.msg);
    assert_int_equal(r.array_layers, moe_only ? 24 : 48);
    const eldr_re_view *v = &r.choices[0].prompt;
    assert_int_equal(v->layers, 24);
    uint16_t *sel = NULL;
    size_t n = 0;
    assert_int_equal(eldr_worker_prompt_selections(ww.w, prompt, strlen(prompt), NULL, &sel, &n, &d), 0);
    assert_int_equal(n, v->rows);
    for (size_t i = 0; i < v->rows * 24; i++) assert_int_equal(eldr_sel_load(v->data, v->dtype, i), sel[i]);
    free(sel);
    eldr_reply_experts_free(&r);
    /* read as it is: the dense rows (even layers) are 0 */
    eldr_re_opts any = {.api = ELDR_RE_COMPLETIONS};
    assert_int_equal(eldr_reply_experts_read(body, len, &any, &r, NULL, &d), 0);
    if (!moe_only)
      for (size_t t = 0; t < r.choices[0].prompt.rows; t++)
        for (size_t l = 0; l < 48; l += 2) assert_int_equal(eldr_sel_load(r.choices[0].prompt.data, ELDR_SEL_U8, t * 48 + l), 0);
    eldr_reply_experts_free(&r);
    free(body);
    wt_worker_stop(&ww);
  }
}

static void test_bad_layout_flag(void **state) {
  (void)state;
  const char *bin = eldr_test_binary();
  const char *args[] = {"worker", "--routed-experts-layout", "v020", "--port", "0", NULL};
  char err[] = "/tmp/eldr_layout_flag_XXXXXX";
  int fd = mkstemp(err);
  assert_true(fd >= 0);
  close(fd);
  int rc = eldr_test_run_args(bin, args, NULL, err);
  char buf[512] = {0};
  eldr_test_read_into(err, buf, sizeof buf);
  unlink(err);
  if (rc != 2 || !strstr(buf, "--routed-experts-layout") || !strstr(buf, "v020"))
    fail_msg("exit %d, stderr '%s'", rc, buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_layout_reads_back),
      cmocka_unit_test(test_layer_forms),
      cmocka_unit_test(test_bad_layout_flag),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
