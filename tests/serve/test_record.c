/* test_record.c — serve --record's writer (src/serve/record.c): the line in
 * the counts form (counts given, raw rows counted, the decode reply's
 * generated rows and usage), the bounded queue with a writer that cannot
 * keep up (drops counted, submit never blocks, memory bounded), rotation by
 * size (sorted names = write order), by age and by model shape, and a write
 * cut short (RLIMIT_FSIZE) cut back to whole lines. */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/reply_experts.h"
#include "serve/record.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "support/proc.h"

static const eldr_shape SH = {2, 4, 2}; /* L, E, K */

/* A fresh empty directory under /tmp (path in buf). */
static void fresh_dir(char *buf, size_t cap, const char *tag) {
  snprintf(buf, cap, "/tmp/eldr_test_record_%d_%s", (int)getpid(), tag);
  assert_int_equal(eldr_test_rmtree(buf), 0);
}

static void rm_dir(const char *dir) {
  assert_int_equal(eldr_test_rmtree(dir), 0);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The *.jsonl files of dir, sorted (names malloc'd, NULL-terminated). */
static char **list_files(const char *dir, size_t *n) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  char **v = calloc(1024, sizeof *v);
  *n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && *n < 1023) {
    size_t l = strlen(e->d_name);
    if (l > 6 && !strcmp(e->d_name + l - 6, ".jsonl")) {
      char *p = malloc(strlen(dir) + l + 2);
      sprintf(p, "%s/%s", dir, e->d_name);
      v[(*n)++] = p;
    }
  }
  closedir(d);
  qsort(v, *n, sizeof *v, cmp_str);
  return v;
}

static void free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* Every line of every file parsed, in order; the ids into ids[] (cap).
 * Each file must end in a newline. Returns the number of lines. */
static size_t read_all(const char *dir, char ids[][48], size_t cap, size_t *nfiles, uint64_t max_file) {
  size_t nf;
  char **files = list_files(dir, &nf);
  size_t n = 0;
  for (size_t f = 0; f < nf; f++) {
    size_t len;
    char *text = eldr_test_slurp(files[f], &len);
    assert_non_null(text);
    assert_true(len > 0);
    assert_int_equal(text[len - 1], '\n');
    if (max_file) assert_true(len <= max_file);
    for (char *s = text, *e; *s; s = e + 1) {
      e = strchr(s, '\n');
      assert_non_null(e);
      json_t *o = json_loadb(s, (size_t)(e - s), 0, NULL);
      assert_non_null(o);
      assert_string_equal(json_string_value(json_object_get(o, "form")), "counts");
      if (n < cap) snprintf(ids[n], 48, "%s", json_string_value(json_object_get(o, "id")));
      n++;
      json_decref(o);
    }
    free(text);
  }
  free_list(files, nf);
  if (nfiles) *nfiles = nf;
  return n;
}

static eldr__rec_item *item_counts(const char *id, const eldr_shape *s, uint32_t tokens) {
  eldr__rec_item *it = eldr__rec_item_new(s, NULL);
  assert_non_null(it);
  snprintf(it->id, sizeof it->id, "%s", id);
  snprintf(it->model, sizeof it->model, "test-model");
  size_t cells = eldr_shape_cells(s);
  it->prefill_counts = calloc(cells, sizeof *it->prefill_counts);
  /* token t selects experts t % E and (t + 1) % E in every layer */
  for (uint32_t t = 0; t < tokens; t++)
    for (uint32_t l = 0; l < s->num_layers; l++)
      for (uint32_t k = 0; k < s->top_k; k++) it->prefill_counts[l * s->num_experts + (t + k) % s->num_experts]++;
  it->prefill_tokens = tokens;
  it->bytes += cells * 4;
  return it;
}

/* The length of the line of item_counts(id, &SH, tokens). */
static size_t line_len(const char *id, uint32_t tokens) {
  char *line;
  size_t len;
  eldr__rec_item *probe = item_counts(id, &SH, tokens);
  assert_int_equal(eldr__rec_format(probe, &line, &len), 0);
  free(line);
  eldr__rec_item_free(probe);
  return len;
}

static json_t *line_json(eldr__rec_item *it) {
  char *line;
  size_t len;
  assert_int_equal(eldr__rec_format(it, &line, &len), 0);
  assert_int_equal(line[len - 1], '\n');
  json_t *o = json_loadb(line, len, 0, NULL);
  assert_non_null(o);
  free(line);
  return o;
}

static void test_format(void **st) {
  (void)st;
  /* counts given, no decode body: decode_counts null, serve fields */
  eldr__rec_item *it = item_counts("r1", &SH, 5);
  it->arrival = 1.5;
  it->time = 1700000000.25;
  snprintf(it->decoder, sizeof it->decoder, "10.0.0.3:8200");
  it->decoder_index = 1;
  it->policy = "eldr";
  it->reason = "locality";
  it->centroid = 1;
  it->sims = malloc(2 * sizeof *it->sims);
  it->sims[0] = 0.25f;
  it->sims[1] = 0.75f;
  it->nsims = 2;
  it->ttft_ms = 12.5;
  it->status = 200;
  it->prompt_tokens = 5;
  it->output_tokens = 9;
  snprintf(it->artifact, sizeof it->artifact, "abc");
  json_t *o = line_json(it);
  assert_string_equal(json_string_value(json_object_get(o, "id")), "r1");
  assert_string_equal(json_string_value(json_object_get(o, "model")), "test-model");
  assert_int_equal(json_integer_value(json_object_get(o, "num_experts")), 4);
  assert_int_equal(json_integer_value(json_object_get(o, "top_k")), 2);
  assert_int_equal(json_array_size(json_object_get(o, "layers")), 2);
  assert_true(json_real_value(json_object_get(o, "arrival")) == 1.5);
  assert_int_equal(json_integer_value(json_object_get(o, "prefill_tokens")), 5);
  sf_check_counts(json_object_get(o, "prefill_counts"), &SH, 5);
  assert_null(json_object_get(o, "decode_counts")); /* absent: unknown */
  assert_int_equal(json_integer_value(json_object_get(o, "decode_tokens")), 9); /* the output's, no counts */
  json_t *sv = json_object_get(o, "serve");
  assert_string_equal(json_string_value(json_object_get(sv, "decoder")), "10.0.0.3:8200");
  assert_int_equal(json_integer_value(json_object_get(sv, "decoder_index")), 1);
  assert_string_equal(json_string_value(json_object_get(sv, "policy")), "eldr");
  assert_string_equal(json_string_value(json_object_get(sv, "reason")), "locality");
  assert_int_equal(json_integer_value(json_object_get(sv, "centroid")), 1);
  assert_true(json_real_value(json_array_get(json_object_get(sv, "similarity"), 1)) == 0.75);
  assert_true(json_real_value(json_object_get(sv, "ttft_ms")) == 12.5);
  assert_true(json_is_null(json_object_get(sv, "tpot_ms")));
  assert_int_equal(json_integer_value(json_object_get(sv, "status")), 200);
  assert_string_equal(json_string_value(json_object_get(sv, "artifact")), "abc");
  assert_true(json_real_value(json_object_get(sv, "time")) == 1700000000.25);
  assert_int_equal(json_integer_value(json_object_get(sv, "output_tokens")), 9);
  assert_true(json_is_null(json_object_get(sv, "client_request_id"))); /* none sent */
  json_decref(o);
  /* the client's X-Request-Id: visible ASCII, quotes and backslashes escaped;
   * the longest one the parser accepts (255 bytes) is kept whole */
  snprintf(it->client_id, sizeof it->client_id, "req-\"7\"\\x");
  o = line_json(it);
  sv = json_object_get(o, "serve");
  assert_string_equal(json_string_value(json_object_get(sv, "client_request_id")), "req-\"7\"\\x");
  assert_string_equal(json_string_value(json_object_get(o, "id")), "r1"); /* id stays the engines' */
  json_decref(o);
  memset(it->client_id, 'z', sizeof it->client_id - 1);
  it->client_id[sizeof it->client_id - 1] = 0;
  o = line_json(it);
  assert_int_equal(strlen(json_string_value(json_object_get(json_object_get(o, "serve"), "client_request_id"))), 255);
  json_decref(o);
  eldr__rec_item_free(it);

  /* raw prompt rows (host u16) counted by the writer, a decode reply in the
   * npy layout: prompt rows then generated rows, split by usage */
  it = eldr__rec_item_new(&SH, NULL);
  snprintf(it->id, sizeof it->id, "r2");
  uint16_t rows[3 * 2 * 2] = {0, 1, 2, 3, 0, 1, 2, 3, 1, 2, 1, 3};
  it->prefill_raw = malloc(sizeof rows);
  memcpy(it->prefill_raw, rows, sizeof rows);
  it->prefill_dtype = ELDR_SEL_U16;
  it->prefill_rows = 3;
  json_t *body = json_pack("{s:s,s:[{s:i,s:s}],s:{s:i,s:i}}", "object", "text_completion", "choices", "index", 0,
                           "text", "abc", "usage", "prompt_tokens", 3, "completion_tokens", 3);
  uint16_t gen[2 * 2 * 2] = {3, 2, 3, 2, 0, 3, 1, 0};
  assert_int_equal(eldr_reply_experts_emit(body, json_array_get(json_object_get(body, "choices"), 0), ELDR_RE_LAYOUT_NPY,
                                           rows, 3, gen, 2, &SH),
                   0);
  it->decode_body = json_dumps(body, JSON_COMPACT);
  it->decode_len = strlen(it->decode_body);
  json_decref(body);
  o = line_json(it);
  assert_int_equal(json_integer_value(json_object_get(o, "prefill_tokens")), 3);
  sf_check_counts(json_object_get(o, "prefill_counts"), &SH, 3);
  /* layer 0 of the prompt (rows [t][l][k]): {0,1},{0,1},{1,2} */
  json_t *l0 = json_array_get(json_object_get(o, "prefill_counts"), 0);
  assert_int_equal(json_integer_value(json_array_get(l0, 1)), 3);
  assert_int_equal(json_integer_value(json_array_get(l0, 3)), 0);
  assert_int_equal(json_integer_value(json_object_get(o, "decode_tokens")), 2);
  sf_check_counts(json_object_get(o, "decode_counts"), &SH, 2);
  json_t *d0 = json_array_get(json_object_get(o, "decode_counts"), 0); /* layer 0: {3,2},{0,3} */
  assert_int_equal(json_integer_value(json_array_get(d0, 3)), 2);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "serve"), "output_tokens")), 3);
  json_decref(o);
  eldr__rec_item_free(it);

  /* nothing to count: not a line */
  it = eldr__rec_item_new(&SH, NULL);
  char *line = NULL;
  size_t len = 0;
  assert_int_equal(eldr__rec_format(it, &line, &len), ELDR_EEMPTY);
  assert_null(line);
  eldr__rec_item_free(it);
}

static void wait_written(eldr__rec *r, uint64_t n) {
  double t0 = fx_now();
  eldr__rec_stats st;
  for (;;) {
    eldr__rec_stats_get(r, &st);
    if (st.written + st.dropped[ELDR__REC_WRITE_ERROR] >= n) return;
    assert_true(fx_now() - t0 < 10);
    usleep(2000);
  }
}

/* A writer that cannot keep up: submit never waits for it, the queue holds
 * at most its bound, the rest is dropped and counted; what was accepted is
 * written. */
static void test_bounded_queue(void **st) {
  (void)st;
  char dir[256];
  fresh_dir(dir, sizeof dir, "bounded");
  eldr__rec_limits lim = {1, 0, 0};
  eldr__rec *r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__rec_new(dir, &lim, 4, 0, &r, &d), 0);
  eldr__rec_set_slow(r, 1.5); /* every batch: a 1.5 s stall */
  enum { N = 200 };
  int accepted = 0;
  size_t maxq = 0;
  /* the first record: the writer takes it and stalls */
  assert_int_equal(eldr__rec_submit(r, item_counts("q0", &SH, 3)), 0);
  accepted = 1;
  for (double t = fx_now();;) {
    eldr__rec_stats s;
    eldr__rec_stats_get(r, &s);
    if (s.queued == 0) break;
    assert_true(fx_now() - t < 10);
    usleep(1000);
  }
  double t0 = fx_now();
  for (int i = 1; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "q%d", i);
    accepted += eldr__rec_submit(r, item_counts(id, &SH, 3)) == 0;
    eldr__rec_stats s;
    eldr__rec_stats_get(r, &s);
    if (s.queued > maxq) maxq = s.queued;
  }
  double took = fx_now() - t0;
  /* 200 submits behind a writer stalled 1.5 s per batch: none waited for it */
  assert_true(took < 1.5);
  assert_true(maxq <= 4);
  /* the stalled writer holds the first, the queue four more */
  assert_int_equal(accepted, 5);
  assert_int_equal(maxq, 4);
  eldr__rec_stats s;
  eldr__rec_stats_get(r, &s);
  assert_int_equal(s.dropped[ELDR__REC_QUEUE_FULL], N - accepted);
  eldr__rec_set_slow(r, 0);
  eldr__rec_free(r); /* writes what was queued */
  char ids[8][48];
  assert_int_equal(read_all(dir, ids, 8, NULL, 0), (size_t)accepted);
  assert_string_equal(ids[0], "q0");

  /* the byte bound: items whose memory would pass it are dropped */
  fresh_dir(dir, sizeof dir, "bounded");
  eldr__rec_item *probe = item_counts("p", &SH, 1);
  size_t one = probe->bytes;
  eldr__rec_item_free(probe);
  assert_int_equal(eldr__rec_new(dir, &lim, 1000, 3 * one, &r, &d), 0);
  eldr__rec_set_slow(r, 1.5);
  accepted = 0;
  for (int i = 0; i < 50; i++) accepted += eldr__rec_submit(r, item_counts("b", &SH, 1)) == 0;
  eldr__rec_stats_get(r, &s);
  assert_true(s.queued_bytes <= 3 * one);
  assert_true(accepted <= 6);
  assert_int_equal(s.dropped[ELDR__REC_QUEUE_FULL], 50 - accepted);
  eldr__rec_set_slow(r, 0);
  eldr__rec_free(r);
  rm_dir(dir);
}

/* Rotation by size: no file passes max_bytes, names sort in write order. */
static void test_rotation_size(void **st) {
  (void)st;
  char dir[256];
  fresh_dir(dir, sizeof dir, "size");
  size_t len = line_len("x0000", 2);
  eldr__rec_limits lim = {1, 3 * len + len / 2, 0}; /* three lines per file */
  eldr__rec *r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__rec_new(dir, &lim, 1024, 0, &r, &d), 0);
  enum { N = 20 };
  for (int i = 0; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "x%04d", i);
    assert_int_equal(eldr__rec_submit(r, item_counts(id, &SH, 2)), 0);
  }
  wait_written(r, N);
  eldr__rec_stats s;
  eldr__rec_stats_get(r, &s);
  assert_int_equal(s.written, N);
  assert_int_equal(s.files, (N + 2) / 3);
  eldr__rec_free(r);
  char ids[N][48];
  size_t nf;
  assert_int_equal(read_all(dir, ids, N, &nf, lim.max_bytes), N);
  assert_int_equal(nf, (N + 2) / 3);
  for (int i = 0; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "x%04d", i);
    assert_string_equal(ids[i], id);
  }
  rm_dir(dir);
}

/* Rotation by age, and a new file when the model shape changes. */
static void test_rotation_age_and_shape(void **st) {
  (void)st;
  char dir[256];
  fresh_dir(dir, sizeof dir, "age");
  eldr__rec_limits lim = {1, 0, 0.2};
  eldr__rec *r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__rec_new(dir, &lim, 16, 0, &r, &d), 0);
  assert_int_equal(eldr__rec_submit(r, item_counts("a1", &SH, 1)), 0);
  assert_int_equal(eldr__rec_submit(r, item_counts("a2", &SH, 1)), 0);
  wait_written(r, 2);
  usleep(300 * 1000); /* past max_seconds: the file is finished */
  assert_int_equal(eldr__rec_submit(r, item_counts("a3", &SH, 1)), 0);
  wait_written(r, 3);
  eldr__rec_stats s;
  eldr__rec_stats_get(r, &s);
  assert_int_equal(s.files, 2);
  /* another shape (a reload to another artifact): another file */
  eldr_shape other = {3, 4, 2};
  assert_int_equal(eldr__rec_submit(r, item_counts("a4", &other, 1)), 0);
  wait_written(r, 4);
  eldr__rec_stats_get(r, &s);
  assert_int_equal(s.files, 3);
  eldr__rec_free(r);
  char ids[4][48];
  size_t nf;
  assert_int_equal(read_all(dir, ids, 4, &nf, 0), 4);
  assert_int_equal(nf, 3);
  assert_string_equal(ids[2], "a3");
  rm_dir(dir);
}

/* A write cut short (the file size limit, as a full disk would): the torn
 * part is cut back, the record counted as a write error; the writer then
 * leaves the disk alone for its backoff (the next record is dropped and
 * counted too), and after it the next record goes to a new file; every
 * file holds whole lines only. */
static void test_short_write_cut_back(void **st) {
  (void)st;
  char dir[256];
  fresh_dir(dir, sizeof dir, "short");
  size_t len = line_len("s00", 2);
  struct rlimit old, lim1;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  lim1 = old;
  lim1.rlim_cur = (rlim_t)(2 * len + len / 2); /* the third line is torn */
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim1), 0);
  eldr__rec_limits lim = {1, 0, 0};
  eldr__rec *r;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__rec_new(dir, &lim, 16, 0, &r, &d), 0);
  for (int i = 0; i < 4; i++) {
    char id[16];
    snprintf(id, sizeof id, "s%02d", i);
    assert_int_equal(eldr__rec_submit(r, item_counts(id, &SH, 2)), 0);
    wait_written(r, (uint64_t)i + 1);
  }
  eldr__rec_stats s;
  eldr__rec_stats_get(r, &s);
  assert_int_equal(s.written, 2);
  assert_int_equal(s.dropped[ELDR__REC_WRITE_ERROR], 2); /* the torn one, and one in the backoff */
  assert_true(s.errors >= 1);
  assert_true(s.write_errors >= 1);
  assert_non_null(strstr(s.last_error, "write"));
  assert_true(s.paused);
  for (double t0 = fx_now(); s.paused; eldr__rec_stats_get(r, &s)) { /* the backoff ends (1 s) */
    assert_true(fx_now() - t0 < 10);
    usleep(2000);
  }
  assert_int_equal(eldr__rec_submit(r, item_counts("s04", &SH, 2)), 0);
  wait_written(r, 5);
  eldr__rec_stats_get(r, &s);
  assert_int_equal(s.written, 3);
  assert_non_null(strstr(s.last_error, "writing to")); /* the notice that it writes again */
  eldr__rec_free(r);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, prev);
  char ids[4][48];
  size_t nf;
  assert_int_equal(read_all(dir, ids, 4, &nf, 0), 3); /* whole lines only */
  assert_int_equal(nf, 2);
  assert_string_equal(ids[2], "s04");
  rm_dir(dir);
}

static void test_bad_directory(void **st) {
  (void)st;
  eldr__rec_limits lim = {1, 0, 0};
  eldr__rec *r = NULL;
  eldr_diag d = {{0}};
  assert_int_equal(eldr__rec_new("/proc/no/such/dir", &lim, 4, 0, &r, &d), ELDR_EIO);
  assert_null(r);
  assert_non_null(strstr(d.msg, "/proc/no/such/dir"));
  assert_int_equal(eldr__rec_new("/etc/hostname", &lim, 4, 0, &r, &d), ELDR_EIO);
  assert_non_null(strstr(d.msg, "not a directory"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_format),
      cmocka_unit_test(test_bounded_queue),
      cmocka_unit_test(test_rotation_size),
      cmocka_unit_test(test_rotation_age_and_shape),
      cmocka_unit_test(test_short_write_cut_back),
      cmocka_unit_test(test_bad_directory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
