/* test_compact_plugin.c — the vLLM plugin's compact counts
 * (contrib/vllm-eldr-counts) against eldr's reader: its selftest (stdlib
 * Python, no vLLM) hooks a stand-in of vLLM's Scheduler and writes, for
 * Llama-4 Maverick's and DeepSeek-V3's layouts, a prefill reply with both
 * the routed_experts npy (every hidden layer, as vLLM's capturer) and the
 * plugin's kv_transfer_params.eldr_expert_counts of the same prompt; the
 * counts eldr reads from each must be equal, layer by layer. Skipped
 * without python3. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/reply_compact.h"
#include "eldr/reply_experts.h"
#include "eldr/tracegen.h"
#include "support/proc.h"

static void test_plugin_counts(void **st) {
  (void)st;
  const char *py = !access("/usr/bin/python3", X_OK) ? "/usr/bin/python3"
                   : !access("/usr/local/bin/python3", X_OK) ? "/usr/local/bin/python3" : NULL;
  if (!py) skip();
  char dir[] = "/tmp/eldr_test_plugin_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char script[512];
  snprintf(script, sizeof script, "%s/contrib/vllm-eldr-counts/selftest.py", ELDR_SOURCE_DIR);
  const char *argv[] = {py, "-B", script, dir, NULL};
  char out[256];
  snprintf(out, sizeof out, "%s/selftest.out", dir);
  int rc = eldr_test_run(argv, out, out);
  char text[2048];
  eldr_test_read_into(out, text, sizeof text);
  if (rc) fail_msg("selftest exited %d: %s", rc, text);
  static const char *const presets[2] = {"llama4-maverick", "deepseek-v3"};
  for (int i = 0; i < 2; i++) {
    eldr_shape s;
    uint32_t ids[ELDR_MAX_LAYERS];
    assert_int_equal(eldr_tracegen_model_shape(presets[i], &s, NULL, 0, NULL), 0);
    eldr_tracegen_layer_ids(presets[i], &s, ids);
    char path[512];
    snprintf(path, sizeof path, "%s/plugin_%s.json", dir, presets[i]);
    char *body = eldr_test_slurp(path, NULL);
    assert_non_null(body);
    const size_t cells = eldr_shape_cells(&s);
    uint32_t *a = calloc(cells, sizeof *a), *b = calloc(cells, sizeof *b);
    /* the npy rows, onto the preset's MoE layers */
    eldr_re_opts o = {ELDR_RE_COMPLETIONS, s.num_layers, s.top_k, s.num_experts, NULL, NULL, a, ids, 0, NULL};
    eldr_reply_experts r;
    eldr_diag d = {{0}};
    if (eldr_reply_experts_scan(body, strlen(body), &o, &r, NULL, &d)) fail_msg("%s rows: %s", presets[i], d.msg);
    assert_true(r.counted);
    eldr_reply_experts_free(&r);
    /* the plugin's counts */
    static const eldr_js_path p[1] = {{{"kv_transfer_params", ELDR_COMPACT_KEY, NULL}}};
    eldr_js_span f;
    assert_int_equal(eldr_js_scan(body, strlen(body), p, 1, &f, NULL, NULL), 0);
    eldr_compact_opts co = {s.num_layers, ids, s.num_experts, s.top_k, NULL};
    eldr_compact_info ci;
    if (eldr_compact_read(body, f, &co, b, NULL, &ci, NULL, &d)) fail_msg("%s counts: %s", presets[i], d.msg);
    assert_int_equal(ci.tokens, 23);
    assert_int_equal(ci.rows, s.num_layers); /* the plugin sends the MoE layers only */
    for (size_t c = 0; c < cells; c++)
      if (a[c] != b[c]) fail_msg("%s layer %zu expert %zu: rows %u, plugin %u", presets[i], c / s.num_experts,
                                 c % s.num_experts, a[c], b[c]);
    free(a);
    free(b);
    free(body);
    unlink(path);
  }
  unlink(out);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_plugin_counts)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
