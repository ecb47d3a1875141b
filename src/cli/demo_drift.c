/* demo_drift.c — `eldr demo --drift`: the production loop on one machine.
 * The workload's domain mix shifts halfway: the artifact is fitted on
 * half of the domains (mix A), the replayed trace sends mix A and then the
 * other domains (mix B). Under ELDR the router's drift score
 * (GET /eldr/status, docs/serve.md "Watch") rises past its threshold after
 * the shift; the demo then refits on the shifted requests and reloads the
 * router (POST /admin/reload with the token of its config file), and the
 * TPOT gain over JSQ, lost after the shift, comes back. JSQ runs the same
 * schedule for the baseline. Prints a table over time (drift score, TPOT
 * p50 per window, ELDR vs JSQ) and plots it with --plot.
 *
 * What the refit reads: the router's own recording (`eldr serve --record`,
 * counts-form records in DIR/records): the records of requests that arrived
 * after the shift was sent, read back with the streaming trace reader while
 * the router goes on writing (a torn last line is skipped). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "demo_drift.h"
#include "eldr/writefile.h"
#include "eldr/artifact.h"
#include "eldr/clock.h"
#include "eldr/http_fetch.h"
#include "eldr/loadgen.h"
#include "eldr/plot.h"
#include "eldr/preset_files.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"
#include "eldr/watch.h"

#define NWIN 10       /* table windows over the arrivals */
#define MAX_SAMPLES 4096

int demo_save_subset(const eldr_trace *t, const size_t *idx, size_t n, const char *path, eldr_diag *d);

typedef struct sample {
  double t, score; /* score NaN: unknown */
} sample;

typedef struct run {
  const char *policy;
  eldr_loadgen_result r;
  sample s[MAX_SAMPLES];
  size_t ns;
  double t_refit, t_reload; /* seconds since the start (NaN: none) */
  size_t refit_n;
  char reload_hash[24];
} run;

typedef struct ctx {
  const demo_drift_opts *o;
  char fit_path[600], eval_path[600], art_path[600], live_path[600], cfg_path[600], shifted_path[600],
      new_path[600];
  char token[40], auth[80];
  char rec_dir[600];
  double shift_unix;    /* wall time (unix s) the first mix-B request was seen sent (NaN: not yet) */
  eldr_trace *eval;
  size_t n_eval, shift; /* eval requests; the first of mix B */
  char mix_a[256], mix_b[256];
  run runs[2];
} ctx;

/* ---- the load generator on its own thread ------------------------------- */

typedef struct lg_thread {
  eldr_loadgen_config lc;
  eldr_loadgen_result *r;
  eldr_diag d;
  int rc;
  size_t sent;  /* as of the last progress call (about once a second; none at the end) */
  int finished; /* eldr_loadgen_run returned: every request sent and drained */
} lg_thread;

static void lg_progress(void *arg, size_t sent, size_t done, double el) {
  (void)done;
  (void)el;
  __atomic_store_n(&((lg_thread *)arg)->sent, sent, __ATOMIC_RELEASE);
}

static void *lg_main(void *arg) {
  lg_thread *t = arg;
  t->rc = eldr_loadgen_run(&t->lc, t->r, &t->d);
  __atomic_store_n(&t->finished, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* ---- 1. the trace: mix A to fit, mix A then mix B to replay ----------------- */

static void make_traces(ctx *x) {
  const demo_drift_opts *o = x->o;
  eldr_diag d = {{0}};
  eldr_shape sh;
  char canon[64];
  int rc = eldr_tracegen_model_shape(o->model, &sh, canon, sizeof canon, &d);
  if (rc < 0) demo_fail("--model: %s", eldr_diag_msg(&d, rc));
  eldr_tracegen *g = NULL;
  if ((rc = eldr_tracegen_new(&sh, canon, o->workload, o->seed, &g, &d)) < 0)
    demo_fail("--workload: %s", eldr_diag_msg(&d, rc));
  eldr_tracegen_set_lengths(g, 0, (uint32_t)o->max_decode, 0);
  eldr_trace *all = NULL;
  size_t want = (size_t)o->n_fit + x->n_eval;
  rc = eldr_tracegen_generate(g, 4 * want, &all, &d);
  eldr_tracegen_free(g);
  if (rc < 0) demo_fail("trace generation: %s", eldr_diag_msg(&d, rc));
  if (all->n_domains < 2) demo_fail("--workload %s has %zu domain: a mix cannot shift", o->workload, all->n_domains);
  /* mix A: the even domains (in first-seen order), mix B: the odd ones */
  size_t *fit = malloc(all->n * sizeof *fit), *ev = malloc(all->n * sizeof *ev), nf = 0, na = 0, nb = 0;
  size_t *evb = malloc(all->n * sizeof *evb);
  if (!fit || !ev || !evb) demo_fail("out of memory");
  size_t half = x->n_eval / 2;
  for (size_t i = 0; i < all->n; i++) {
    int a = all->req[i].domain >= 0 && all->req[i].domain % 2 == 0;
    if (a && nf < (size_t)o->n_fit) fit[nf++] = i;
    else if (a && na < half) ev[na++] = i;
    else if (!a && nb < x->n_eval - half) evb[nb++] = i;
  }
  if (nf < (size_t)o->n_fit || na < half || nb < x->n_eval - half)
    demo_fail("the generated trace has too few requests of one mix (%zu/%ld, %zu/%zu, %zu/%zu)", nf, o->n_fit, na,
              half, nb, x->n_eval - half);
  memcpy(ev + na, evb, nb * sizeof *ev);
  x->shift = na;
  for (size_t k = 0; k < all->n_domains; k++) {
    char *m = k % 2 ? x->mix_b : x->mix_a;
    size_t l = strlen(m);
    snprintf(m + l, 256 - l, "%s%s", l ? "," : "", all->domains[k]);
  }
  if (demo_save_subset(all, fit, nf, x->fit_path, &d) < 0 || demo_save_subset(all, ev, na + nb, x->eval_path, &d) < 0)
    demo_fail("cannot write the traces: %s", d.msg);
  free(fit);
  free(ev);
  free(evb);
  eldr_trace_free(all);
  if (eldr_trace_load(x->eval_path, &x->eval, &d) < 0) demo_fail("cannot re-read %s: %s", x->eval_path, d.msg);
}

/* `eldr fit` on trace into out. like: an artifact whose representation,
 * IDF and layer mask the fit keeps (the refit: no candidate search, a few
 * seconds less while the load runs), or NULL. */
static void run_fit(ctx *x, const char *trace, const char *out, const char *like) {
  const demo_drift_opts *o = x->o;
  char dbuf[32], sbuf[32], layers[4096] = "";
  snprintf(dbuf, sizeof dbuf, "%ld", o->D);
  snprintf(sbuf, sizeof sbuf, "%llu", (unsigned long long)o->seed);
  char *args[24] = {"fit", "--trace", (char *)trace, "--decoders", dbuf, "-o", (char *)out, "--seed", sbuf, "-q"};
  size_t na = 10;
  eldr_artifact *a = NULL;
  eldr_diag d = {{0}};
  if (like) {
    if (eldr_artifact_load(like, &a, &d)) demo_fail("%s", d.msg);
    for (size_t l = 0, n = 0; l < a->shape.num_layers; l++)
      if (a->mask[l]) n += (size_t)snprintf(layers + n, sizeof layers - n, "%s%u", n ? "," : "", a->layer_ids[l]);
    args[na++] = "--representation";
    args[na++] = (char *)eldr_repr_name(a->repr);
    args[na++] = "--idf";
    args[na++] = a->idf_enabled ? "on" : "off";
    args[na++] = "--layers";
    args[na++] = layers;
  }
  args[na] = NULL;
  int code = -1;
  int rc = eldr_cluster_run(o->cluster, args, NULL, &code, &d);
  eldr_artifact_free(a);
  if (*o->stop) demo_fail("interrupted");
  if (rc) demo_fail("%s", eldr_diag_msg(&d, rc));
  if (code != 0) demo_fail("eldr fit on %s failed (exit %d); see %s", trace, code, o->log_path);
}

static void copy_file(const char *from, const char *to) {
  eldr_outfile o;
  eldr_diag d = {{0}};
  FILE *in = fopen(from, "rb");
  if (!in) demo_fail("cannot copy %s to %s: %s", from, to, strerror(errno));
  if (eldr_outfile_open(&o, to, &d)) demo_fail("%s", d.msg);
  char buf[1 << 16];
  size_t n;
  int ok = 1;
  while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, o.f) == n;
  ok = ok && !ferror(in);
  fclose(in);
  if (eldr_outfile_close(&o, ok, &d) || !ok) demo_fail("cannot write %s: %s", to, d.msg[0] ? d.msg : "read error");
}

/* ---- 2. one policy's run ---------------------------------------------------------- */

/* The router's drift score now (NaN: unknown), and its state. */
static double poll_status(const char *router, char *state, size_t cap) {
  int st = 0;
  char *body = NULL;
  eldr_diag d = {{0}};
  double score = NAN;
  snprintf(state, cap, "none");
  if (eldr_http_fetch(router, "GET", "/eldr/status", NULL, NULL, 5, &st, &body, &d) || st != 200) {
    free(body);
    return NAN;
  }
  json_t *j = json_loads(body, 0, NULL), *dr = json_object_get(j, "drift");
  if (json_is_number(json_object_get(dr, "score"))) score = json_number_value(json_object_get(dr, "score"));
  const char *s = json_string_value(json_object_get(dr, "state"));
  if (s) snprintf(state, cap, "%s", s);
  json_decref(j);
  free(body);
  return score;
}

/* ---- the router's records of the shifted traffic ---------------------------- */

typedef struct rec_pick {
  double since; /* unix s */
  FILE *f;
  size_t n;
} rec_pick;

static int pick_visit(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  (void)index;
  rec_pick *p = ud;
  json_t *sv = r->serve ? json_loads(r->serve, 0, NULL) : NULL;
  double when = json_number_value(json_object_get(sv, "time")); /* 0 when absent */
  json_decref(sv);
  if (when < p->since) return 0;
  if (eldr_trace_write_request(p->f, t, r) != 0) return ELDR_EIO;
  p->n++;
  return 0;
}

/* The records in x->rec_dir of requests that arrived at or after
 * x->shift_unix, written to x->shifted_path: how many (0 on none yet). */
static size_t collect_records(ctx *x) {
  eldr_diag d = {{0}};
  const char *in[1] = {x->rec_dir};
  char **paths = NULL;
  size_t np = 0;
  if (eldr_trace_inputs_expand(in, 1, &paths, &np, &d)) return 0; /* nothing written yet */
  FILE *f = fopen(x->shifted_path, "w");
  if (!f) demo_fail("cannot write %s: %s", x->shifted_path, strerror(errno));
  rec_pick p = {x->shift_unix, f, 0};
  eldr_trace_read_info info;
  memset(&info, 0, sizeof info);
  int rc = eldr_trace_foreach_inputs(paths, np, pick_visit, &p, &info, &d);
  eldr_trace_inputs_free(paths, np);
  if (fclose(f) || (rc && rc != ELDR_EEMPTY))
    demo_fail("reading the router's records in %s: %s", x->rec_dir, rc ? eldr_diag_msg(&d, rc) : "write error");
  return p.n;
}

/* Refit on the router's records of the shifted traffic, swap the file, POST
 * /admin/reload. 0 when fewer than need records are in yet (try later). */
static int refit_and_reload(ctx *x, run *rn, const char *router, size_t need, double t0) {
  size_t n = collect_records(x);
  if (n < need) return 0;
  eldr_diag d = {{0}};
  rn->t_refit = eldr_clock_now() - t0;
  rn->refit_n = n;
  fprintf(stderr, "  eldr   %.1f s: drift past %.2f: refitting on the router's %zu records since the shift (%s)\n",
          rn->t_refit, ELDR_DRIFT_THRESHOLD, n, x->rec_dir);
  run_fit(x, x->shifted_path, x->new_path, x->art_path);
  copy_file(x->new_path, x->live_path);
  int st = 0;
  char *body = NULL;
  int rc = eldr_http_fetch(router, "POST", "/admin/reload", x->auth, "", 30, &st, &body, &d);
  if (rc) demo_fail("POST /admin/reload: %s", eldr_diag_msg(&d, rc));
  json_t *j = json_loads(body, 0, NULL);
  const char *res = json_string_value(json_object_get(j, "result"));
  if (st != 200 || !res || strcmp(res, "ok")) demo_fail("POST /admin/reload answered %d: %s", st, body);
  snprintf(rn->reload_hash, sizeof rn->reload_hash, "%s", json_string_value(json_object_get(j, "hash")) ?: "");
  json_decref(j);
  free(body);
  rn->t_reload = eldr_clock_now() - t0;
  fprintf(stderr, "  eldr   %.1f s: router reloaded (artifact %s)\n", rn->t_reload, rn->reload_hash);
  return 1;
}

static void run_policy(ctx *x, int k) {
  const demo_drift_opts *o = x->o;
  run *rn = &x->runs[k];
  rn->policy = k == 0 ? "eldr" : "jsq";
  rn->t_refit = rn->t_reload = NAN;
  copy_file(x->art_path, x->live_path); /* every run starts from the mix-A artifact */
  eldr_cluster_spec cs = {.n_prefill = (size_t)o->P, .n_decode = (size_t)o->D, .model = o->model,
                          .hardware = o->hardware, .trace_path = x->eval_path, .time_scale = o->scale,
                          .max_num_seqs = (size_t)o->max_seqs, .artifact_path = x->live_path,
                          .policy = rn->policy, .seed = o->seed, .router_config = x->cfg_path};
  eldr_diag d = {{0}};
  char target[64];
  int rc = eldr_cluster_up(o->cluster, &cs, target, sizeof target, &d);
  if (rc) demo_fail("%s", eldr_diag_msg(&d, rc));
  lg_thread lt;
  memset(&lt, 0, sizeof lt);
  eldr_loadgen_config_default(&lt.lc);
  lt.lc.target = target;
  lt.lc.trace = x->eval;
  lt.lc.rate = o->rate / o->scale;
  lt.lc.duration_s = o->duration * 2; /* bounded by max_requests: the trace once, in order */
  lt.lc.max_requests = x->n_eval;
  lt.lc.seed = o->seed;
  lt.lc.drain_s = 120;
  lt.lc.timeout_s = 60;
  lt.lc.stop = o->stop;
  lt.lc.progress = lg_progress;
  lt.lc.progress_ctx = &lt;
  lt.r = &rn->r;
  double t0 = eldr_clock_now();
  pthread_t th;
  if (pthread_create(&th, NULL, lg_main, &lt)) demo_fail("cannot start the load generator thread");
  double tick = o->duration / 40 > 0.1 ? o->duration / 40 : 0.1;
  int done = 0;
  while (!done) {
    struct timespec ts = {(time_t)tick, (long)((tick - (double)(time_t)tick) * 1e9)};
    nanosleep(&ts, NULL);
    /* the last progress call may come before the last request is sent:
     * the run's end is the load generator's return */
    done = __atomic_load_n(&lt.finished, __ATOMIC_ACQUIRE) || __atomic_load_n(&lt.sent, __ATOMIC_ACQUIRE) >= x->n_eval ||
           *o->stop;
    if (k != 0) continue; /* JSQ: no watch */
    char state[16];
    double sc = poll_status(target, state, sizeof state);
    if (rn->ns < MAX_SAMPLES) rn->s[rn->ns++] = (sample){eldr_clock_now() - t0, sc};
    size_t sent = __atomic_load_n(&lt.sent, __ATOMIC_ACQUIRE);
    if (isnan(x->shift_unix) && sent > x->shift) { /* every mix-A request was sent before now */
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      x->shift_unix = (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
    }
    size_t need = (size_t)(8 * o->D) > 40 ? (size_t)(8 * o->D) : 40;
    if (isnan(rn->t_refit) && !strcmp(state, "stale") && sent >= x->shift + need)
      refit_and_reload(x, rn, target, need, t0);
  }
  pthread_join(th, NULL);
  if (lt.rc < 0) demo_fail("load generator: %s", eldr_diag_msg(&lt.d, lt.rc));
  fprintf(stderr, "  %-6s %zu requests, %zu ok\n", rn->policy, rn->r.n, rn->r.ok);
  eldr_cluster_stop_all(o->cluster);
}

/* ---- 3. the table over time ------------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* TPOT p50 (ms of model time) of the ok requests sent in [t0, t1). */
static double tpot_p50(const run *rn, double t0, double t1, double scale) {
  double *v = malloc((rn->r.n + 1) * sizeof *v);
  size_t n = 0;
  for (size_t i = 0; v && i < rn->r.n; i++) {
    const eldr_loadgen_rec *q = &rn->r.recs[i];
    if (q->ok && q->tpot_s >= 0 && q->send_s >= t0 && q->send_s < t1) v[n++] = q->tpot_s / scale * 1e3;
  }
  double m = NAN;
  if (n) {
    qsort(v, n, sizeof *v, cmp_d);
    m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  free(v);
  return m;
}

/* Mean of the known drift samples in [t0, t1). */
static double drift_mean(const run *rn, double t0, double t1) {
  double s = 0;
  size_t n = 0;
  for (size_t i = 0; i < rn->ns; i++)
    if (rn->s[i].t >= t0 && rn->s[i].t < t1 && !isnan(rn->s[i].score)) s += rn->s[i].score, n++;
  return n ? s / (double)n : NAN;
}

typedef struct table {
  double t0[NWIN], t1[NWIN], drift[NWIN], eldr[NWIN], jsq[NWIN];
  double t_shift, span;
} table;

static void build_table(const ctx *x, table *tb) {
  const run *e = &x->runs[0];
  double span = 0;
  for (size_t i = 0; i < e->r.n; i++)
    if (e->r.recs[i].send_s > span) span = e->r.recs[i].send_s;
  span *= 1.0 + 1e-9;
  tb->span = span;
  tb->t_shift = x->shift < e->r.n ? e->r.recs[x->shift].send_s : NAN;
  for (int w = 0; w < NWIN; w++) {
    tb->t0[w] = span * w / NWIN;
    tb->t1[w] = span * (w + 1) / NWIN;
    tb->drift[w] = drift_mean(e, tb->t0[w], tb->t1[w]);
    tb->eldr[w] = tpot_p50(e, tb->t0[w], tb->t1[w], x->o->scale);
    tb->jsq[w] = tpot_p50(&x->runs[1], tb->t0[w], tb->t1[w], x->o->scale);
  }
}

static void num(char *b, size_t cap, const char *fmt, double v) {
  if (isnan(v)) snprintf(b, cap, "-");
  else snprintf(b, cap, fmt, v);
}

static void print_table(const ctx *x, const table *tb) {
  const demo_drift_opts *o = x->o;
  const run *e = &x->runs[0];
  printf("eldr demo --drift: %ldP%ldD %s on %s, %.3g req/s of model time, time scale %g\n", o->P, o->D, o->model,
         o->hardware, o->rate, o->scale);
  printf("mix A (fitted): %s; mix B: %s; the mix shifts at request %zu of %zu (t = %.1f s)\n", x->mix_a, x->mix_b,
         x->shift, x->n_eval, tb->t_shift);
  printf("drift score: max(JS nearest-centroid histogram, KS best similarity beyond its 5%% critical value), "
         "threshold %.2f\n", ELDR_DRIFT_THRESHOLD);
  if (!isnan(e->t_refit))
    printf("refit at t = %.1f s on the router's %zu records (serve --record, %s) of requests that arrived after the "
           "shift; reloaded at t = %.1f s, artifact %s\n",
           e->t_refit, e->refit_n, x->rec_dir, e->t_reload, e->reload_hash);
  else
    printf("no refit: the drift score never passed its threshold after the shift\n");
  printf("\n%-13s %7s %15s %15s %12s  %s\n", "window (s)", "drift", "ELDR TPOT p50", "JSQ TPOT p50", "ELDR vs JSQ", "");
  for (int w = 0; w < NWIN; w++) {
    char dr[16], a[16], b[16], g[16];
    num(dr, sizeof dr, "%.3f", tb->drift[w]);
    num(a, sizeof a, "%.3f ms", tb->eldr[w]);
    num(b, sizeof b, "%.3f ms", tb->jsq[w]);
    num(g, sizeof g, "%+.1f%%", (tb->eldr[w] / tb->jsq[w] - 1) * 100);
    char win[32], note[64] = "";
    snprintf(win, sizeof win, "%5.1f-%5.1f", tb->t0[w], tb->t1[w]);
    if (tb->t_shift >= tb->t0[w] && tb->t_shift < tb->t1[w]) snprintf(note, sizeof note, "<- mix shifts");
    if (!isnan(e->t_reload) && e->t_reload >= tb->t0[w] && e->t_reload < tb->t1[w])
      snprintf(note + strlen(note), sizeof note - strlen(note), "%s<- refit + reload", note[0] ? " " : "");
    printf("%-13s %7s %15s %15s %12s  %s\n", win, dr, a, b, g, note);
  }
  double ph[3][2];
  double edges[4] = {0, tb->t_shift, isnan(e->t_reload) ? tb->span : e->t_reload, tb->span};
  for (int p = 0; p < 3; p++) {
    ph[p][0] = tpot_p50(e, edges[p], edges[p + 1], o->scale);
    ph[p][1] = tpot_p50(&x->runs[1], edges[p], edges[p + 1], o->scale);
  }
  static const char *names[3] = {"mix A, fitted artifact", "mix B, stale artifact", "mix B, refitted artifact"};
  printf("\nphase                       ELDR TPOT p50   JSQ TPOT p50   ELDR vs JSQ\n");
  for (int p = 0; p < 3; p++) {
    char a[16], b[16], g[16];
    num(a, sizeof a, "%.3f ms", ph[p][0]);
    num(b, sizeof b, "%.3f ms", ph[p][1]);
    num(g, sizeof g, "%+.1f%%", (ph[p][0] / ph[p][1] - 1) * 100);
    printf("%-27s %13s %14s %13s\n", names[p], a, b, g);
  }
  printf("(ms of model time; requests: ELDR %zu ok of %zu, JSQ %zu ok of %zu)\n", e->r.ok, e->r.n, x->runs[1].r.ok,
         x->runs[1].r.n);
}

static void print_json(const ctx *x, const table *tb) {
  const run *e = &x->runs[0];
  json_t *w = json_array(), *s = json_array();
  for (int i = 0; i < NWIN; i++)
    json_array_append_new(w, json_pack("{s:f,s:f,s:o,s:o,s:o}", "t0_s", tb->t0[i], "t1_s", tb->t1[i], "drift",
                                       isnan(tb->drift[i]) ? json_null() : json_real(tb->drift[i]), "eldr_tpot_p50_ms",
                                       isnan(tb->eldr[i]) ? json_null() : json_real(tb->eldr[i]), "jsq_tpot_p50_ms",
                                       isnan(tb->jsq[i]) ? json_null() : json_real(tb->jsq[i])));
  for (size_t i = 0; i < e->ns; i++)
    json_array_append_new(s, json_pack("{s:f,s:o}", "t_s", e->s[i].t, "drift",
                                       isnan(e->s[i].score) ? json_null() : json_real(e->s[i].score)));
  json_t *j = json_pack("{s:s,s:s,s:s,s:f,s:o,s:o,s:I,s:f,s:o,s:o}", "model", x->o->model, "mix_a", x->mix_a, "mix_b",
                        x->mix_b, "threshold", ELDR_DRIFT_THRESHOLD, "t_shift_s",
                        isnan(tb->t_shift) ? json_null() : json_real(tb->t_shift), "t_reload_s",
                        isnan(e->t_reload) ? json_null() : json_real(e->t_reload), "refit_requests",
                        (json_int_t)e->refit_n, "time_scale", x->o->scale, "windows", w, "samples", s);
  char *out = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) : NULL;
  printf("%s\n", out ? out : "{}");
  free(out);
  json_decref(j);
}

static int plot(const ctx *x, const table *tb) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return 1;
  eldr_diag d = {{0}};
  const run *e = &x->runs[0];
  int rc = eldr_plot_header(f, x->o->plot, "eldr demo --drift: the mix shifts, the drift score rises; refit + reload", &d);
  if (!rc) {
    fprintf(f, "$drift << EOD\n");
    for (size_t i = 0; i < e->ns; i++) {
      if (i && e->s[i - 1].t < e->t_reload && e->s[i].t >= e->t_reload) fputc('\n', f); /* a new artifact's window */
      if (!isnan(e->s[i].score)) fprintf(f, "%g %g\n", e->s[i].t, e->s[i].score);
    }
    fprintf(f, "EOD\n$tpot << EOD\n");
    for (int w = 0; w < NWIN; w++) fprintf(f, "%g %g %g\n", 0.5 * (tb->t0[w] + tb->t1[w]), tb->eldr[w], tb->jsq[w]);
    fprintf(f, "EOD\nset multiplot layout 2,1\nset xrange [0:%g]\n", tb->span);
    if (!isnan(tb->t_shift))
      fprintf(f, "set arrow 1 from %g, graph 0 to %g, graph 1 nohead dt 2 lc rgb 'gray'\n", tb->t_shift, tb->t_shift);
    if (!isnan(e->t_reload))
      fprintf(f, "set arrow 2 from %g, graph 0 to %g, graph 1 nohead dt 3 lc rgb 'black'\n", e->t_reload, e->t_reload);
    fprintf(f, "set xlabel 'wall seconds since the first request (gray: the mix shifts; black: refit + reload)'\n"
               "set ylabel 'drift score (eldr router)'\n"
               "plot $drift using 1:2 with linespoints title 'eldr_signature_drift', %g with lines dt 4 title 'threshold'\n"
               "unset title\nset ylabel 'TPOT p50 per window (ms, model time)'\n"
               "plot $tpot using 1:2 with linespoints title 'ELDR', $tpot using 1:3 with linespoints title 'JSQ'\n"
               "unset multiplot\n",
            ELDR_DRIFT_THRESHOLD);
  }
  fclose(f);
  if (!rc) rc = eldr_plot_run(buf, len, &d);
  free(buf);
  if (rc) fprintf(stderr, "eldr demo: --plot %s: %s\n", x->o->plot, eldr_diag_msg(&d, rc));
  else fprintf(stderr, "eldr demo: plot written to %s\n", x->o->plot);
  return rc;
}

int demo_drift_run(const demo_drift_opts *o) {
  static ctx x;
  memset(&x, 0, sizeof x);
  x.o = o;
  x.n_eval = (size_t)ceil(o->rate / o->scale * o->duration);
  if (x.n_eval < 200) x.n_eval = 200; /* two windows of the watch in each half */
  snprintf(x.fit_path, sizeof x.fit_path, "%s/fit-mix-a.jsonl", o->dir);
  snprintf(x.eval_path, sizeof x.eval_path, "%s/eval-a-then-b.jsonl", o->dir);
  snprintf(x.art_path, sizeof x.art_path, "%s/artifact-mix-a.json", o->dir);
  snprintf(x.live_path, sizeof x.live_path, "%s/artifact.json", o->dir);
  snprintf(x.new_path, sizeof x.new_path, "%s/artifact-refit.json", o->dir);
  snprintf(x.cfg_path, sizeof x.cfg_path, "%s/router.json", o->dir);
  snprintf(x.shifted_path, sizeof x.shifted_path, "%s/shifted-recorded.jsonl", o->dir);
  /* the router's admin token: random, in its config file only */
  uint8_t rb[16];
  if (getrandom(rb, sizeof rb, 0) != (ssize_t)sizeof rb) demo_fail("no randomness for the admin token");
  for (int i = 0; i < 16; i++) snprintf(x.token + 2 * i, 3, "%02x", rb[i]);
  snprintf(x.auth, sizeof x.auth, "Authorization: Bearer %s\r\n", x.token);
  FILE *f = fopen(x.cfg_path, "w");
  if (!f) demo_fail("cannot write %s: %s", x.cfg_path, strerror(errno));
  snprintf(x.rec_dir, sizeof x.rec_dir, "%s/records", o->dir);
  if (mkdir(x.rec_dir, 0777) && errno != EEXIST) demo_fail("cannot create %s: %s", x.rec_dir, strerror(errno));
  x.shift_unix = NAN;
  json_t *rd = json_string(x.rec_dir);
  char *rds = json_dumps(rd, JSON_ENCODE_ANY);
  fprintf(f, "{\"admin_token\":\"%s\",\"watch_window\":0,\"watch_requests\":%d,\"record\":%s}\n", x.token, 120,
          rds ? rds : "null");
  free(rds);
  json_decref(rd);
  fclose(f);

  fprintf(stderr, "eldr demo --drift: [1/4] generating the traces (%s, workload %s, seed %llu)\n", o->model, o->workload,
          (unsigned long long)o->seed);
  make_traces(&x);
  fprintf(stderr, "eldr demo --drift: [2/4] fitting on %ld requests of mix A (%s)\n", o->n_fit, x.mix_a);
  run_fit(&x, x.fit_path, x.art_path, NULL);
  fprintf(stderr, "eldr demo --drift: [3/4] %zu requests, mix A then mix B (%s), at %.3g req/s wall under eldr\n", x.n_eval,
          x.mix_b, o->rate / o->scale);
  run_policy(&x, 0);
  fprintf(stderr, "eldr demo --drift: [4/4] the same schedule under jsq\n");
  run_policy(&x, 1);
  table tb;
  build_table(&x, &tb);
  if (o->json) print_json(&x, &tb);
  else print_table(&x, &tb);
  int prc = o->plot ? plot(&x, &tb) : 0;
  for (int k = 0; k < 2; k++) eldr_loadgen_result_free(&x.runs[k].r);
  eldr_trace_free(x.eval);
  return prc ? 1 : 0;
}
