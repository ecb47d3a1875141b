/* test_record_crash.c — `eldr serve --record` as a process: kill -9 while
 * requests stream through it leaves every record it wrote readable (whole
 * lines, files closed by rotation end in a newline, at most a torn last
 * line in the last file), every request answered before the recorder
 * caught up is there; recording without an artifact (--record-experts);
 * the --record flags survive a SIGHUP that re-reads the config file. */
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "eldr/artifact.h"
#include "eldr/trace.h"
#include "support/fixture.h"
#include "support/serve_fixture.h"
#include "support/proc.h"

/* the router process: killed by the teardown when a test failed */
static sf_child child;

static int kill_child(void **st) {
  (void)st;
  sf_child_kill(&child);
  return 0;
}

/* One prefill and one decode emulated engine (decode replies carry
 * routed_experts). */
static void workers_start(sf_rig *w) {
  eldr_worker_config pc, dc;
  eldr_worker_config_default(&pc);
  pc.time_scale = 0.01;
  dc = pc;
  dc.routed_experts_decode = 1;
  sf_start_engines(w, 1, &pc, 1, &dc);
}

static void fresh_dir(char *buf, size_t cap, const char *tag) {
  snprintf(buf, cap, "/tmp/eldr_test_recx_%d_%s", (int)getpid(), tag);
  assert_int_equal(eldr_test_rmtree(buf), 0);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The records of dir: complete lines parsed and checked, their ids kept;
 * *torn = 1 when the last file ends in a partial line. */
typedef struct readback {
  char (*ids)[48];
  size_t n, cap, files;
  int torn;
} readback;

static void read_dir(const char *dir, readback *rb) {
  DIR *dd = opendir(dir);
  assert_non_null(dd);
  char *names[4096];
  size_t nf = 0;
  struct dirent *de;
  while ((de = readdir(dd)) && nf < 4096) {
    size_t l = strlen(de->d_name);
    if (l > 6 && !strcmp(de->d_name + l - 6, ".jsonl")) names[nf++] = strdup(de->d_name);
  }
  closedir(dd);
  qsort(names, nf, sizeof *names, cmp_str);
  rb->files = nf;
  rb->torn = 0;
  for (size_t f = 0; f < nf; f++) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, names[f]);
    size_t len;
    char *text = eldr_test_slurp(path, &len);
    assert_non_null(text);
    char *s = text, *end = text + len;
    while (s < end) {
      char *e = memchr(s, '\n', (size_t)(end - s));
      if (!e) { /* a torn last line: only the file being written at the kill */
        assert_int_equal(f, nf - 1);
        rb->torn = 1;
        break;
      }
      json_t *o = json_loadb(s, (size_t)(e - s), 0, NULL);
      if (!o) fail_msg("%s: a complete line that is not JSON", path);
      assert_string_equal(json_string_value(json_object_get(o, "form")), "counts");
      json_int_t pt = json_integer_value(json_object_get(o, "prefill_tokens"));
      assert_true(pt > 0);
      json_t *row = json_array_get(json_object_get(o, "prefill_counts"), 47);
      json_int_t sum = 0;
      for (size_t i = 0; i < json_array_size(row); i++) sum += json_integer_value(json_array_get(row, i));
      assert_int_equal(sum, pt * 8);
      assert_true(rb->n < rb->cap);
      snprintf(rb->ids[rb->n++], 48, "%s", json_string_value(json_object_get(o, "id")));
      json_decref(o);
      s = e + 1;
    }
    free(text);
    free(names[f]);
  }
}

static int has_id(const readback *rb, const char *id) {
  for (size_t i = 0; i < rb->n; i++)
    if (!strcmp(rb->ids[i], id)) return 1;
  return 0;
}

typedef struct load_job {
  int port;
  atomic_int stop; /* set by the main thread, read by the client thread */
  int sent;
} load_job;

static void *load_main(void *arg) {
  load_job *j = arg;
  while (!atomic_load(&j->stop)) {
    tc_resp r;
    if (tc_post(j->port, "/v1/completions", "{\"prompt\":\"load while the router dies\",\"max_tokens\":4}", NULL, &r) == 0)
      tc_free(&r);
    j->sent++;
  }
  return NULL;
}

/* What the trace reader (the one `eldr fit` uses) reads back from dir. */
typedef struct visit_ctx {
  size_t n;
} visit_ctx;

static int visit(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  visit_ctx *v = ud;
  assert_int_equal(index, v->n);
  assert_int_equal(t->shape.num_layers, 48);
  assert_int_equal(t->shape.num_experts, 128);
  assert_non_null(r->prefill_counts);
  assert_true(r->n_prefill > 0);
  v->n++;
  return 0;
}

static size_t reader_count(const char *dir, eldr_trace_read_info *info) {
  const char *in[1] = {dir};
  char **paths;
  size_t np;
  eldr_diag d = {{0}};
  if (eldr_trace_inputs_expand(in, 1, &paths, &np, &d)) fail_msg("%s", d.msg);
  visit_ctx v = {0};
  memset(info, 0, sizeof *info);
  if (eldr_trace_foreach_inputs(paths, np, visit, &v, info, &d)) fail_msg("%s", d.msg);
  eldr_trace_inputs_free(paths, np);
  assert_int_equal(info->requests, v.n);
  return v.n;
}

/* The engines' id of a request: the decode worker answers "cmpl-<id>". */
static void engine_id(const char *body, char *out, size_t cap) {
  json_t *o = json_loads(body, 0, NULL);
  assert_non_null(o);
  const char *id = json_string_value(json_object_get(o, "id"));
  assert_non_null(id);
  assert_memory_equal(id, "cmpl-", 5);
  snprintf(out, cap, "%s", id + 5);
  json_decref(o);
}

static void test_kill9(void **st) {
  (void)st;
  sf_rig w;
  workers_start(&w);
  char dir[256];
  fresh_dir(dir, sizeof dir, "kill9");
  /* no artifact: --record-experts gives the shape; small files: rotation */
  const char *args[] = {"--port", "0", "--quiet", "--health-interval", "0", "--prefill", w.purl[0], "--decode",
                        w.durl[0], "--record", dir, "--record-experts", "128", "--record-max-bytes", "200000", NULL};
  sf_child_start(&child, 0, args);
  int port = child.port;
  enum { N = 30 };
  char ids[N][48];
  for (int i = 0; i < N; i++) {
    char body[128];
    snprintf(body, sizeof body, "{\"prompt\":\"request %d of the crash test\",\"max_tokens\":%d}", i, 2 + i % 5);
    tc_resp r;
    assert_int_equal(tc_post(port, "/v1/completions", body, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    engine_id(r.body, ids[i], sizeof ids[i]);
    tc_free(&r);
  }
  /* every answered request recorded (the writer caught up) */
  assert_int_equal(rt_wait_metric(port, "eldr_record_written_total", N, 20), 0);
  assert_true(rt_metric(port, "eldr_record_files_total") >= 2);
  /* then requests in flight from four clients, and kill -9 mid-stream */
  load_job jobs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    jobs[i].port = port;
    atomic_init(&jobs[i].stop, 0);
    jobs[i].sent = 0;
    pthread_create(&th[i], NULL, load_main, &jobs[i]);
  }
  assert_int_equal(rt_wait_metric(port, "eldr_record_written_total", N + 20, 20), 0);
  int status = sf_child_kill(&child);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  for (int i = 0; i < 4; i++) {
    atomic_store(&jobs[i].stop, 1);
    pthread_join(th[i], NULL);
  }
  readback rb = {calloc(100000, 48), 0, 100000, 0, 0};
  read_dir(dir, &rb);
  print_message("after kill -9: %zu records in %zu files, torn last line: %s\n", rb.n, rb.files, rb.torn ? "yes" : "no");
  assert_true(rb.files >= 2);
  assert_true(rb.n >= N + 20); /* at least what /metrics said was written */
  for (int i = 0; i < N; i++)
    if (!has_id(&rb, ids[i])) fail_msg("request %s answered before the kill is not in the records", ids[i]);
  for (size_t i = 1; i < rb.n; i++) /* ids are unique */
    for (size_t j = i < 200 ? 0 : i - 200; j < i; j++) assert_string_not_equal(rb.ids[i], rb.ids[j]);
  /* the trace reader reads every complete record (a torn last line: skipped) */
  eldr_trace_read_info info;
  assert_int_equal(reader_count(dir, &info), rb.n);
  assert_int_equal(info.files, rb.files);
  assert_int_equal(info.torn, (size_t)rb.torn);
  /* a write cut mid-line (what kill -9 during write(2) leaves): skipped with a note */
  if (!rb.torn) {
    DIR *dd = opendir(dir);
    char last[256] = "";
    struct dirent *de;
    while ((de = readdir(dd)))
      if (strstr(de->d_name, ".jsonl") && strcmp(de->d_name, last) > 0) snprintf(last, sizeof last, "%s", de->d_name);
    closedir(dd);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, last);
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs("{\"id\":\"torn\",\"model\":\"qwen3-30b-a3b\",\"num_experts\":128,\"top_k\":8,\"layers\":[0,1,", f);
    fclose(f);
    assert_int_equal(reader_count(dir, &info), rb.n);
    assert_int_equal(info.torn, 1);
    assert_non_null(strstr(info.note, last));
  }
  /* and `eldr fit` refits on the directory as it was left */
  char art[300], out[4096], err[4096];
  snprintf(art, sizeof art, "%s.json", dir);
  const char *fa[] = {"fit", "--trace", dir, "--decoders", "2", "--layers", "all", "--representation", "count",
                      "-q", "-o", art, NULL};
  assert_int_equal(eldr_test_run_captured(eldr_test_binary(), dir, fa, out, sizeof out, err, sizeof err), 0);
  assert_non_null(strstr(err, "torn"));
  eldr_artifact *a = NULL;
  eldr_diag ad = {{0}};
  assert_int_equal(eldr_artifact_load(art, &a, &ad), 0);
  assert_int_equal(a->fit_n, rb.n);
  assert_int_equal(a->k, 2);
  eldr_artifact_free(a);
  unlink(art);
  free(rb.ids);
  sf_free(&w);
  assert_int_equal(eldr_test_rmtree(dir), 0);
}

/* --record-sample given on the command line still holds after SIGHUP
 * re-read a config file that does not name it. */
static void test_sighup_keeps_flags(void **st) {
  (void)st;
  sf_rig w;
  workers_start(&w);
  char dir[256], cfg[300];
  fresh_dir(dir, sizeof dir, "hup");
  snprintf(cfg, sizeof cfg, "%s.json", dir);
  FILE *f = fopen(cfg, "w");
  assert_non_null(f);
  fprintf(f, "{\"prefill\":[\"%s\"],\"decode\":[\"%s\"],\"health_interval\":0,\"record_experts\":128}\n", w.purl[0],
          w.durl[0]);
  fclose(f);
  const char *args[] = {"--port", "0", "--quiet", "--config", cfg, "--record", dir, "--record-sample", "0.5", NULL};
  sf_child_start(&child, 0, args);
  int port = child.port;
  assert_int_equal(kill(child.pid, SIGHUP), 0);
  assert_int_equal(rt_wait_metric(port, "eldr_reloads_total{result=\"ok\"}", 1, 10), 0);
  for (int i = 0; i < 6; i++) {
    tc_resp r;
    assert_int_equal(tc_post(port, "/v1/completions", "{\"prompt\":\"after the reload\",\"max_tokens\":2}", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    tc_free(&r);
  }
  assert_int_equal(rt_wait_metric(port, "eldr_record_written_total", 3, 10), 0);
  assert_int_equal(rt_metric(port, "eldr_record_sampled_out_total"), 3);
  sf_child_stop(&child); /* SIGTERM: a clean stop (exit 0) closes the file */
  readback rb = {calloc(16, 48), 0, 16, 0, 0};
  read_dir(dir, &rb);
  assert_int_equal(rb.n, 3);
  assert_int_equal(rb.torn, 0);
  free(rb.ids);
  sf_free(&w);
  assert_int_equal(eldr_test_rmtree(dir), 0);
  assert_int_equal(eldr_test_rmtree(cfg), 0);
}

/* Bad values are refused with exit status 2 naming the flag; a directory
 * this machine refuses with 1, at the start and in the check alike. */
static void test_bad_flags(void **st) {
  (void)st;
  char err[1024], out[256], dir[256];
  fresh_dir(dir, sizeof dir, "flags");
  assert_int_equal(mkdir(dir, 0755), 0);
  const char *a1[] = {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--record-sample",
                      "0", NULL};
  assert_int_equal(eldr_test_run_captured(eldr_test_binary(), dir, a1, out, sizeof out, err, sizeof err), 2);
  assert_non_null(strstr(err, "--record-sample"));
  const char *a2[] = {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--record",
                      "/proc/no/such", "--record-experts", "128", "--port", "0", NULL};
  assert_int_equal(eldr_test_run_captured(eldr_test_binary(), dir, a2, out, sizeof out, err, sizeof err), 1);
  assert_non_null(strstr(err, "/proc/no/such"));
  /* without an artifact the expert count must be given */
  const char *a3[] = {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--record", dir,
                      NULL};
  assert_int_equal(eldr_test_run_captured(eldr_test_binary(), dir, a3, out, sizeof out, err, sizeof err), 2);
  assert_non_null(strstr(err, "--record-experts"));
  /* --check-config=resolve: the directory must be writable where it runs
   * (exit 1, as the start's above: this machine's, not a wrong value) */
  const char *a4[] = {"serve", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2", "--record",
                      "/proc/self/rec", "--record-experts", "128", "--check-config=resolve", NULL};
  assert_int_equal(eldr_test_run_captured(eldr_test_binary(), dir, a4, out, sizeof out, err, sizeof err), 1);
  assert_non_null(strstr(err, "/proc/self/rec"));
  assert_int_equal(eldr_test_rmtree(dir), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_kill9, kill_child),
      cmocka_unit_test_teardown(test_sighup_keeps_flags, kill_child),
      cmocka_unit_test(test_bad_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
