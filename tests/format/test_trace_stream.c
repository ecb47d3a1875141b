/* test_trace_stream.c — several trace inputs (directory, glob, files), the
 * torn-last-line rule, and the streaming reader: it visits every request of
 * a file far larger than what it holds in memory at any time. */
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "support/trace_expect.h"

#include "support/proc.h"

#include "eldr/trace.h"

#define ASSERT_MSG(d, sub) eldr_test_msg_has(&(d), (sub))

static char dir[256];

static const char *path_in(const char *name) {
  static char buf[8][512];
  static int i;
  char *p = buf[i++ & 7];
  snprintf(p, 512, "%s/%s", dir, name);
  return p;
}

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/eldr_test_tstream_%ld", (long)getpid());
  mkdir(dir, 0755);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return eldr_test_rmtree(dir);
}

#define HEAD "\"model\":\"m\",\"num_experts\":4,\"top_k\":2,\"layers\":[1,3]"
#define TOK(id, dom)                                                                               \
  "{\"id\":\"" id "\",\"domain\":\"" dom "\"," HEAD                                                \
  ",\"prefill\":[[[0,1],[2,3]]],\"decode\":[[[1,0],[2,3]]]}"
#define CNT(id, dom)                                                                               \
  "{\"id\":\"" id "\",\"domain\":\"" dom "\"," HEAD                                                \
  ",\"form\":\"counts\",\"prefill_tokens\":1,\"decode_tokens\":0,"                                 \
  "\"prefill_counts\":[[1,1,0,0],[0,0,1,1]],\"serve\":{\"decoder\":\"h:1\"}}"

typedef struct seen {
  size_t n;
  char ids[64][16];
  size_t idx_sum;
  int stop_at;
  int steal;
} seen;

static int collect(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  seen *s = ud;
  assert_int_equal(t->n, 0);
  assert_int_equal(t->shape.num_experts, 4);
  if (s->n < 64) snprintf(s->ids[s->n], 16, "%s", r->id);
  s->idx_sum += index;
  s->n++;
  if (s->steal && r->prefill_counts) { /* take an array: the reader must not free it */
    free(r->prefill_counts);
    r->prefill_counts = NULL;
  }
  if (s->stop_at && (int)s->n == s->stop_at) return 7;
  return 0;
}

static void test_torn_last_line(void **state) {
  (void)state;
  const char *torn = CNT("c3", "x");
  char text[2048];
  /* two complete lines, then the third cut short mid-way (no newline) */
  snprintf(text, sizeof text, "%s\n%s\n%.*s", TOK("t1", "x"), CNT("c2", "y"),
           (int)strlen(torn) - 9, torn);
  const char *p = path_in("torn.jsonl");
  eldr_test_write(p, text);
  char *paths[1] = {(char *)p};
  eldr_trace *t = NULL;
  eldr_trace_read_info info;
  eldr_diag d = {{0}};
  if (eldr_trace_load_inputs(paths, 1, &t, &info, &d)) fail_msg("%s", d.msg);
  assert_int_equal(t->n, 2);
  assert_int_equal(info.torn, 1);
  assert_int_equal(info.requests, 2);
  assert_non_null(strstr(info.note, "torn.jsonl:3: last line"));
  assert_non_null(strstr(info.note, "torn write"));
  eldr_trace_free(t);
  /* the streaming reader skips it too, and eldr_trace_foreach hands the note back in d */
  seen s = {0};
  assert_int_equal(eldr_trace_foreach(p, collect, &s, &d), 0);
  assert_int_equal(s.n, 2);
  ASSERT_MSG(d, "torn.jsonl:3: last line");
  /* the strict whole-file loader still refuses it */
  assert_int_equal(eldr_trace_load(p, &t, &d), ELDR_EPARSE);
  ASSERT_MSG(d, ":3:");

  /* a complete last line without a newline is read, no note */
  snprintf(text, sizeof text, "%s\n%s", TOK("t1", "x"), CNT("c2", "y"));
  eldr_test_write(p, text);
  memset(&s, 0, sizeof s);
  assert_int_equal(eldr_trace_foreach(p, collect, &s, &d), 0);
  assert_int_equal(s.n, 2);
  assert_string_equal(d.msg, "");
  /* a complete but invalid last line is an error, not a torn write */
  snprintf(text, sizeof text, "%s\n{\"id\":\"z\"," HEAD ",\"prefill\":[[[0,9],[2,3]]],\"decode\":[]}",
           TOK("t1", "x"));
  eldr_test_write(p, text);
  assert_int_equal(eldr_trace_foreach(p, collect, &s, &d), ELDR_ERANGE);
  ASSERT_MSG(d, "torn.jsonl:2: field 'prefill'");
  assert_int_equal(eldr_trace_load_inputs(paths, 1, &t, &info, &d), ELDR_ERANGE);
  /* a cut line followed by a newline (not the last) is an error */
  snprintf(text, sizeof text, "%.*s\n%s\n", (int)strlen(torn) - 9, torn, TOK("t1", "x"));
  eldr_test_write(p, text);
  assert_int_equal(eldr_trace_foreach(p, collect, &s, &d), ELDR_EPARSE);
  ASSERT_MSG(d, "torn.jsonl:1:");
  /* only a torn line: empty */
  snprintf(text, sizeof text, "%.*s", (int)strlen(torn) - 9, torn);
  eldr_test_write(p, text);
  assert_int_equal(eldr_trace_load_inputs(paths, 1, &t, &info, &d), ELDR_EEMPTY);
  assert_int_equal(eldr_trace_foreach(p, collect, &s, &d), ELDR_EEMPTY);
}

static void test_inputs_expand(void **state) {
  (void)state;
  char sub[512];
  snprintf(sub, sizeof sub, "%s/rec", dir);
  mkdir(sub, 0755);
  eldr_test_write(path_in("rec/b.jsonl"), CNT("b1", "y") "\n" CNT("b2", "z") "\n");
  eldr_test_write(path_in("rec/a.jsonl"), TOK("a1", "x") "\n");
  eldr_test_write(path_in("rec/notes.txt"), "not a trace\n");
  eldr_test_write(path_in("rec/.hidden.jsonl"), "junk\n");
  mkdir(path_in("rec/deeper.jsonl"), 0755); /* a directory is not a file */
  eldr_test_write(path_in("single.jsonl"), TOK("s1", "z") "\n");
  const char *in[2] = {sub, path_in("single.jsonl")};
  char **paths = NULL;
  size_t n = 0;
  eldr_diag d = {{0}};
  if (eldr_trace_inputs_expand(in, 2, &paths, &n, &d)) fail_msg("%s", d.msg);
  assert_int_equal(n, 3);
  assert_string_equal(paths[0], path_in("rec/a.jsonl"));
  assert_string_equal(paths[1], path_in("rec/b.jsonl"));
  assert_string_equal(paths[2], path_in("single.jsonl"));

  /* loaded as one trace: order kept, domains re-interned in order of first appearance */
  eldr_trace *t = NULL;
  eldr_trace_read_info info;
  if (eldr_trace_load_inputs(paths, n, &t, &info, &d)) fail_msg("%s", d.msg);
  assert_int_equal(t->n, 4);
  assert_int_equal(info.files, 3);
  assert_string_equal(t->req[1].id, "b1");
  assert_string_equal(t->domains[t->req[3].domain], "z");
  assert_int_equal(t->req[3].domain, t->req[2].domain);
  assert_int_equal(t->n_domains, 3);
  assert_string_equal(t->req[1].serve, "{\"decoder\":\"h:1\"}");
  eldr_trace_free(t);
  /* streamed: same requests, indices 0..3 */
  seen s = {0};
  assert_int_equal(eldr_trace_foreach_inputs(paths, n, collect, &s, &info, &d), 0);
  assert_int_equal(s.n, 4);
  assert_string_equal(s.ids[2], "b2");
  assert_int_equal(s.idx_sum, 0 + 1 + 2 + 3);
  /* a visitor may stop the read, and may take arrays */
  memset(&s, 0, sizeof s);
  s.stop_at = 2;
  s.steal = 1;
  assert_int_equal(eldr_trace_foreach_inputs(paths, n, collect, &s, &info, &d), 7);
  assert_int_equal(s.n, 2);
  eldr_trace_inputs_free(paths, n);

  /* a glob */
  char pat[600];
  snprintf(pat, sizeof pat, "%s/*.jsonl", sub);
  const char *g[1] = {pat};
  if (eldr_trace_inputs_expand(g, 1, &paths, &n, &d)) fail_msg("%s", d.msg);
  assert_int_equal(n, 2);
  assert_string_equal(paths[1], path_in("rec/b.jsonl"));
  eldr_trace_inputs_free(paths, n);

  /* errors name the input */
  const char *bad1[1] = {path_in("missing.jsonl")};
  assert_int_equal(eldr_trace_inputs_expand(bad1, 1, &paths, &n, &d), ELDR_ENOTFOUND);
  ASSERT_MSG(d, "missing.jsonl: no such file");
  assert_null(paths);
  snprintf(pat, sizeof pat, "%s/*.nothing", sub);
  assert_int_equal(eldr_trace_inputs_expand(g, 1, &paths, &n, &d), ELDR_ENOTFOUND);
  ASSERT_MSG(d, "no file matches");
  const char *bad2[1] = {path_in("rec/deeper.jsonl")};
  assert_int_equal(eldr_trace_inputs_expand(bad2, 1, &paths, &n, &d), ELDR_ENOTFOUND);
  ASSERT_MSG(d, "holds no *.jsonl");
  assert_int_equal(eldr_trace_inputs_expand(NULL, 0, &paths, &n, &d), ELDR_EINVAL);

  /* inputs that disagree on the shape: the second file and line are named */
  eldr_test_write(path_in("other.jsonl"),
             "{\"id\":\"o\",\"model\":\"m\",\"num_experts\":4,\"top_k\":2,\"layers\":[1,2],"
             "\"prefill\":[],\"decode\":[]}\n");
  char *two[2] = {(char *)path_in("single.jsonl"), (char *)path_in("other.jsonl")};
  assert_int_equal(eldr_trace_load_inputs(two, 2, &t, &info, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "other.jsonl: shape");
  assert_int_equal(eldr_trace_foreach_inputs(two, 2, collect, &s, &info, &d), ELDR_ESHAPE);
  ASSERT_MSG(d, "other.jsonl:1: field 'layers'");
}

/* Bytes the program has allocated now (glibc; 0 where it is not counted,
 * e.g. under ASan's allocator). */
static size_t heap_in_use(void) { return mallinfo2().uordblks; }

typedef struct peak {
  size_t base, max, n;
  uint64_t tokens;
} peak;

static int watch_heap(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  peak *p = ud;
  size_t h = heap_in_use();
  if (h > p->max) p->max = h;
  p->n++;
  p->tokens += r->n_prefill;
  return 0;
}

/* A 40 MB file is visited request by request while the heap stays within a
 * few MiB: the reader holds one block and one request, never the file. */
static void test_foreach_bounded(void **state) {
  (void)state;
  const char *p = path_in("big.jsonl");
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  const size_t N = 60000;
  char line[1024];
  size_t bytes = 0;
  for (size_t i = 0; i < N; i++) {
    int m = snprintf(line, sizeof line, "{\"id\":\"r%zu\",\"domain\":\"d%zu\"," HEAD
                     ",\"form\":\"counts\",\"prefill_tokens\":%zu,\"decode_tokens\":0,"
                     "\"prefill_counts\":[[%zu,%zu,0,0],[0,0,%zu,%zu]],"
                     "\"prompt\":\"%0500zu\"}\n",
                     i, i % 5, i % 7 + 1, i % 7 + 1, i % 7 + 1, i % 7 + 1, i % 7 + 1, i);
    fwrite(line, 1, (size_t)m, f);
    bytes += (size_t)m;
  }
  fclose(f);
  assert_true(bytes > 36u << 20);
  peak pk = {.base = heap_in_use()};
  pk.max = pk.base;
  eldr_diag d = {{0}};
  if (eldr_trace_foreach(p, watch_heap, &pk, &d)) fail_msg("%s", d.msg);
  assert_int_equal(pk.n, N);
  uint64_t want = 0;
  for (size_t i = 0; i < N; i++) want += i % 7 + 1;
  assert_true(pk.tokens == want);
  if (pk.base) { /* glibc counts: the growth is the 1 MiB block and one request */
    const size_t grew = pk.max - pk.base;
    if (grew > (4u << 20)) fail_msg("heap grew by %zu bytes for a %zu-byte file", grew, bytes);
  }
  unlink(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_torn_last_line),
      cmocka_unit_test(test_inputs_expand),
      cmocka_unit_test(test_foreach_bounded),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
