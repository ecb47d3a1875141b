/* bench_record.c — what `eldr serve --record` costs, for the qwen3-30b-a3b
 * shape (48 MoE layers x 128 experts, top-8).
 *
 * Usage: bench_record [prompt_tokens] [generated_tokens]   (default 1024 256)
 *
 * Both are the CPU time of the thread doing the work (a loaded machine's
 * waits left out); the writer thread's capacity is about 1 / format_us.
 *
 *   loop_us      the event loop's share per recorded request with a layer
 *                mask: an item that takes over the prefill reply's parsed
 *                tree and the decode reply's buffer (nothing copied), then
 *                eldr__rec_submit into a queue with room
 *   format_us    the writer thread's work per record: the prompt's rows out
 *                of the prefill tree (base64 .npy) and counted, the decode
 *                reply parsed and its generated rows counted, the line
 *                formatted (eldr__rec_format)
 *   line_bytes   the record's size on disk
 * Median of 5 timing rounds for the two per-record figures.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eldr/clock.h"
#include "eldr/reply_experts.h"
#include "eldr/rng.h"
#include "serve/record.h"

/* CPU time of the calling thread: the figures do not count the time other
 * processes of a loaded machine hold the core. */
static double thread_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static const eldr_shape SH = {48, 128, 8};

/* rows x L x K distinct-per-row ids. */
static uint16_t *random_rows(size_t rows, eldr_rng *g) {
  size_t LK = SH.num_layers * SH.top_k;
  uint16_t *v = malloc(rows * LK * sizeof *v);
  for (size_t t = 0; t < rows; t++)
    for (size_t l = 0; l < SH.num_layers; l++) {
      uint16_t base = (uint16_t)(eldr_rng_below(g, SH.num_experts));
      for (size_t k = 0; k < SH.top_k; k++) v[(t * SH.num_layers + l) * SH.top_k + k] = (uint16_t)((base + k * 13) % SH.num_experts);
    }
  return v;
}

/* The prefill reply a vLLM prefill worker sends: the prompt's rows as .npy. */
static json_t *prefill_tree(const uint16_t *prompt, size_t P) {
  json_t *b = json_pack("{s:s,s:[{s:i,s:s}],s:{s:I,s:i}}", "object", "text_completion", "choices", "index", 0,
                        "text", "x", "usage", "prompt_tokens", (json_int_t)P, "completion_tokens", 1);
  eldr_reply_experts_emit(b, json_array_get(json_object_get(b, "choices"), 0), ELDR_RE_LAYOUT_NPY, prompt, P, NULL,
                          0, &SH);
  return b;
}

/* What the router builds for a recorded request: the item, with the
 * prefill reply's tree and the decode reply's buffer handed over. */
static eldr__rec_item *make_item(json_t *tree, char *body, size_t blen) {
  eldr__rec_item *it = eldr__rec_item_new(&SH, NULL);
  it->prefill_root = tree;
  it->experts = SH.num_experts;
  it->decode_body = body;
  it->decode_len = blen;
  it->bytes += blen + blen / 2;
  snprintf(it->id, sizeof it->id, "6f1c1a2e-6d55-4a31-9b8a-0c7f2f3e4d5a");
  snprintf(it->model, sizeof it->model, "qwen3-30b-a3b");
  it->policy = "eldr";
  it->reason = "locality";
  it->status = 200;
  return it;
}

static char *dup_body(const char *b, size_t n) {
  char *p = malloc(n);
  memcpy(p, b, n);
  return p;
}

int main(int argc, char **argv) {
  size_t P = argc > 1 ? (size_t)atol(argv[1]) : 1024;
  size_t G = argc > 2 ? (size_t)atol(argv[2]) : 256;
  if (!P || !G) {
    fprintf(stderr, "usage: bench_record [prompt_tokens>0] [generated_tokens>0]\n");
    return 2;
  }
  eldr_rng g;
  eldr_rng_seed(&g, 1);
  uint16_t *prompt = random_rows(P, &g), *gen = random_rows(G - 1, &g);
  /* the decode reply a patched vLLM decode instance sends (npy, whole sequence) */
  json_t *body = json_pack("{s:s,s:[{s:i,s:s}],s:{s:I,s:I}}", "object", "text_completion", "choices", "index", 0,
                           "text", "generated text", "usage", "prompt_tokens", (json_int_t)P, "completion_tokens",
                           (json_int_t)G);
  eldr_reply_experts_emit(body, json_array_get(json_object_get(body, "choices"), 0), ELDR_RE_LAYOUT_NPY, prompt, P,
                          gen, G - 1, &SH);
  char *btxt = json_dumps(body, JSON_COMPACT);
  size_t blen = strlen(btxt);
  json_decref(body);

  char dir[128];
  snprintf(dir, sizeof dir, "/tmp/bench_record_%d", (int)getpid());
  eldr__rec_limits lim = {1, 256u << 20, 3600};
  double loop[5], fmt[5];
  size_t line_bytes = 0;
  for (int round = 0; round < 5; round++) {
    /* the loop's share: items into a queue with room (the writer stalled, then drained) */
    eldr__rec *r;
    eldr_diag d = {{0}};
    if (eldr__rec_new(dir, &lim, 64, 0, &r, &d)) {
      fprintf(stderr, "%s\n", d.msg);
      return 1;
    }
    eldr__rec_set_slow(r, 0.05);
    json_t *trees[32];
    char *bodies[32];
    for (int i = 0; i < 32; i++) { /* what the request already holds */
      trees[i] = prefill_tree(prompt, P);
      bodies[i] = dup_body(btxt, blen);
    }
    double t0 = thread_cpu();
    for (int i = 0; i < 32; i++) eldr__rec_submit(r, make_item(trees[i], bodies[i], blen));
    loop[round] = (thread_cpu() - t0) / 32 * 1e6;
    eldr__rec_set_slow(r, 0);
    eldr__rec_free(r);
    /* the writer's work */
    eldr__rec_item *it = make_item(prefill_tree(prompt, P), dup_body(btxt, blen), blen);
    t0 = thread_cpu();
    for (int i = 0; i < 8; i++) {
      char *line;
      size_t len;
      eldr__rec_format(it, &line, &len);
      line_bytes = len;
      free(line);
    }
    fmt[round] = (thread_cpu() - t0) / 8 * 1e6;
    eldr__rec_item_free(it);
  }
  qsort(loop, 5, sizeof *loop, cmp_double);
  qsort(fmt, 5, sizeof *fmt, cmp_double);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) return 1;
  printf("shape 48x128 top-8, prompt %zu tokens, %zu generated, decode reply %zu bytes\n", P, G, blen);
  printf("loop_us %.1f  format_us %.1f  line_bytes %zu  (one writer thread: about %.0f records/s)\n", loop[2],
         fmt[2], line_bytes, 1e6 / fmt[2]);
  free(btxt);
  free(prompt);
  free(gen);
  return 0;
}
