/* status.c — the router's watch: every locality decision into a sliding
 * window (eldr/watch.h computes everything), sampled prefill/decode pairs
 * for the live rho, the artifact's identity; shown on GET /eldr/status
 * (JSON) and as eldr_* lines of /metrics; and POST /admin/reload (token from
 * the config file, constant-time compare, the same all-or-nothing reload as
 * SIGHUP). Loop thread only, except the window and pairs (struct
 * eldr__watchcore), which every loop of the group feeds and reads under the
 * core's mutex. */
#include <event2/buffer.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/reply_experts.h"
#include "serve_types.h"

/* Live rho: pairs kept; after the first 2 * RHO_PAIRS requests one request
 * per RHO_SAMPLE_S is sampled; rho
 * recomputed at most this often (it is O(pairs^2 * dim) on the loop). */
#define RHO_PAIRS 64
#define RHO_SAMPLE_S 0.25
#define RHO_RECOMPUTE_S 5.0

/* What the loops share: the window and the pairs, with their sampling
 * state (mu guards everything below it). */
struct eldr__watchcore {
  _Atomic size_t refs;
  uint64_t hash;         /* the artifact text's XXH3-64 */
  size_t k;
  pthread_mutex_t mu;
  eldr_watch *win;       /* decisions */
  eldr_rho_ring *rho;    /* (signature, decode pattern) pairs */
  double rho_pick_t;     /* last sampled pair (monotonic) */
  size_t rho_tries;      /* requests sampled: the first 2 * RHO_PAIRS all are */
  double rho_t, rho_val; /* last computation claimed, and the value of the
                          * latest one finished (NAN: undefined) */
  double rho_val_t;      /* the claim time of rho_val's computation */
  size_t rho_adds, rho_adds_at; /* pairs added, and at the last computation */
};

/* One loop's view: a reference on the core, and the loop's own buffers. */
struct eldr__watchst {
  size_t k;
  struct eldr__watchcore *core;
  float *sims;           /* k: the decision's similarities (eldr_route_req.sims) */
  double *share, *nearest, *cap; /* k each: scratch of a render */
  eldr_rho_ring *rho;    /* the core's pairs as of this loop's last rho
                          * computation (made at the first), computed on
                          * outside the core's lock */
  uint64_t hash;         /* the artifact text's XXH3-64 */
  double created;        /* unix seconds of fit.created (NAN: absent) */
};

static double parse_created(const char *s) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  if (!s || !strptime(s, "%Y-%m-%dT%H:%M:%SZ", &tm)) return NAN;
  return (double)timegm(&tm);
}

void eldr__watchcore_put(struct eldr__watchcore *wc) {
  if (!wc || atomic_fetch_sub(&wc->refs, 1) != 1) return;
  pthread_mutex_destroy(&wc->mu);
  eldr_watch_free(wc->win);
  eldr_rho_ring_free(wc->rho);
  free(wc);
}

static struct eldr__watchcore *core_get(struct eldr__watchcore *wc) {
  if (wc) atomic_fetch_add(&wc->refs, 1);
  return wc;
}

static int core_fits(const struct eldr__watchcore *wc, const eldr_artifact *a, size_t cap) {
  return wc && wc->hash == a->text_hash && wc->k == a->k && eldr_watch_cap(wc->win) == cap;
}

static struct eldr__watchcore *core_new(const eldr_artifact *a, size_t cap) {
  struct eldr__watchcore *wc = calloc(1, sizeof *wc);
  if (!wc) return NULL;
  if (pthread_mutex_init(&wc->mu, NULL)) {
    free(wc);
    return NULL;
  }
  atomic_init(&wc->refs, 1);
  wc->hash = a->text_hash;
  wc->k = a->k;
  wc->win = eldr_watch_new(cap, a->k);
  wc->rho = eldr_rho_ring_new(RHO_PAIRS, a->dim, (size_t)a->shape.num_layers * a->shape.num_experts);
  wc->rho_pick_t = wc->rho_t = wc->rho_val_t = -1e9;
  wc->rho_val = NAN;
  if (!wc->win || !wc->rho) {
    eldr__watchcore_put(wc);
    return NULL;
  }
  return wc;
}

void eldr__watchst_free(eldr__watchst *w) {
  if (!w) return;
  eldr__watchcore_put(w->core);
  eldr_rho_ring_free(w->rho);
  free(w->sims);
  free(w->share);
  free(w->nearest);
  free(w->cap);
  free(w);
}

int eldr__watchst_new(eldr_server *s, const eldr_artifact *a, const eldr_serve_config *c, eldr__watchst **out,
                      eldr_diag *d) {
  *out = NULL;
  if (!a) return 0;
  eldr__watchst *w = calloc(1, sizeof *w);
  if (!w) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the watch");
  w->k = a->k;
  /* the window the other loops feed, else this loop's own, else a new one */
  if (s->grp) {
    pthread_mutex_lock(&s->grp->mu);
    if (core_fits(s->grp->watch, a, c->watch_requests)) w->core = core_get(s->grp->watch);
    pthread_mutex_unlock(&s->grp->mu);
  }
  if (!w->core && s->watch && core_fits(s->watch->core, a, c->watch_requests)) w->core = core_get(s->watch->core);
  if (!w->core) w->core = core_new(a, c->watch_requests);
  w->sims = calloc(a->k, sizeof *w->sims);
  w->share = calloc(a->k, sizeof *w->share);
  w->nearest = calloc(a->k, sizeof *w->nearest);
  w->cap = calloc(a->k, sizeof *w->cap);
  if (!w->core || !w->sims || !w->share || !w->nearest || !w->cap) {
    eldr__watchst_free(w);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the watch (%zu decisions)", c->watch_requests);
  }
  w->hash = a->text_hash;
  w->created = parse_created(a->created);
  *out = w;
  return 0;
}

void eldr__watch_commit(eldr_server *s, eldr__watchst *fresh) {
  /* the same artifact file again (a reload of the config only) built on the
   * running core: the window and the pairs go on */
  eldr__watchst_free(s->watch);
  s->watch = fresh;
  struct eldr__watchcore *wc = fresh ? fresh->core : NULL;
  if (!s->grp) return;
  pthread_mutex_lock(&s->grp->mu);
  if (s->grp->watch != wc) { /* offered to the other loops' next build */
    eldr__watchcore_put(s->grp->watch);
    s->grp->watch = core_get(wc);
  }
  pthread_mutex_unlock(&s->grp->mu);
}

float *eldr__watch_sims(eldr_server *s) { return s->watch ? s->watch->sims : NULL; }

void eldr__watch_decision(rq *r, const eldr_decision *dec, const float *sig) {
  eldr_server *s = r->s;
  eldr__watchst *w = s->watch;
  if (!w || !sig || dec->fallback != ELDR_FALLBACK_NONE || s->cfg.policy != ELDR_POLICY_ELDR) return;
  double now = eldr__now_s();
  struct eldr__watchcore *wc = w->core;
  pthread_mutex_lock(&wc->mu);
  eldr_watch_add(wc->win, now, w->sims, dec->centroid);
  /* a pair for the live rho, when the decode reply brings its rows */
  int pick = (wc->rho_tries < 2 * RHO_PAIRS || now - wc->rho_pick_t >= RHO_SAMPLE_S) && !r->wsig;
  if (pick) {
    wc->rho_pick_t = now;
    wc->rho_tries++;
  }
  pthread_mutex_unlock(&wc->mu);
  size_t dim = s->art->dim;
  if (pick && (r->wsig = malloc(dim * sizeof *r->wsig))) {
    memcpy(r->wsig, sig, dim * sizeof *r->wsig);
    r->wsig_hash = w->hash;
  }
}

void eldr__watch_decode_reply(rq *r, const char *body, size_t len) {
  eldr_server *s = r->s;
  eldr__watchst *w = s->watch;
  if (!r->wsig) return;
  float *sig = r->wsig;
  r->wsig = NULL;
  const eldr_artifact *a = s->art;
  uint32_t *counts = NULL;
  if (w && a && r->wsig_hash == w->hash &&
      (counts = malloc((size_t)a->shape.num_layers * a->shape.num_experts * sizeof *counts)) &&
      eldr_reply_decode_counts(body, len, r->req.api == ELDR__API_CHAT ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS,
                               &a->shape, a->layer_ids, r->pr.prompt_tokens, counts, NULL) > 0) {
    pthread_mutex_lock(&w->core->mu);
    if (eldr_rho_ring_add(w->core->rho, sig, counts) == 0) w->core->rho_adds++;
    pthread_mutex_unlock(&w->core->mu);
  }
  free(counts);
  free(sig);
}

/* The live rho, recomputed when pairs came in and RHO_RECOMPUTE_S passed:
 * the loop that claims the computation copies the pairs under the core's
 * lock and computes on its copy without it (O(pairs^2 * dim): the other
 * loops' decisions do not wait for it). */
static double live_rho(eldr__watchst *w) {
  struct eldr__watchcore *wc = w->core;
  double now = eldr__now_s();
  pthread_mutex_lock(&wc->mu);
  int due = wc->rho_adds != wc->rho_adds_at && now - wc->rho_t >= RHO_RECOMPUTE_S;
  if (due && !w->rho) w->rho = eldr_rho_ring_copy(wc->rho);
  else if (due) eldr_rho_ring_copy_into(w->rho, wc->rho);
  if (due && w->rho) {
    wc->rho_t = now;
    wc->rho_adds_at = wc->rho_adds;
  }
  double val = wc->rho_val;
  pthread_mutex_unlock(&wc->mu);
  if (!due || !w->rho) return val;
  double rho;
  val = eldr_rho_ring_rho(w->rho, &rho) == 0 ? rho : NAN;
  pthread_mutex_lock(&wc->mu);
  if (now >= wc->rho_val_t) { /* not older than the value there */
    wc->rho_val = val;
    wc->rho_val_t = now;
  }
  pthread_mutex_unlock(&wc->mu);
  return val;
}

/* Everything both views show, computed once per render. */
typedef struct view {
  eldr_watch_stats st;
  size_t n_dec;
  double age, rho;
  size_t pairs; /* behind rho */
  char hash[20];
} view;

static void view_get(eldr_server *s, view *v) {
  eldr__watchst *w = s->watch;
  memset(v, 0, sizeof *v);
  v->n_dec = s->nw[ROLE_DECODE];
  v->st.share = w->share;
  v->st.nearest = w->nearest;
  struct eldr__watchcore *wc = w->core;
  pthread_mutex_lock(&wc->mu); /* every loop's decisions, in one window */
  eldr_watch_stats_get(wc->win, eldr__now_s(), s->cfg.watch_window_s, s->art->drift_ref, &v->st);
  v->pairs = eldr_rho_ring_count(wc->rho);
  pthread_mutex_unlock(&wc->mu);
  v->rho = live_rho(w);
  eldr_watch_capacity_share(w->k, v->n_dec, w->cap);
  v->age = isnan(w->created) ? NAN : (double)time(NULL) - w->created;
  snprintf(v->hash, sizeof v->hash, "%016" PRIx64, w->hash);
}

/* Each event loop's running configuration: its reload number and the
 * artifact it routes by (every loop runs the one its leader loaded). */
static json_t *loops_json(const eldr_server *s) {
  json_t *arr = json_array();
  for (int i = 0; s->grp && i < s->grp->n; i++) {
    const eldr_server *x = s->grp->loops[i];
    if (!x) continue;
    uint64_t h = atomic_load(&x->art_hash);
    char hash[20];
    snprintf(hash, sizeof hash, "%016" PRIx64, h);
    json_array_append_new(arr, json_pack("{sisIso}", "loop", i, "reload", (json_int_t)atomic_load(&x->run_gen),
                                         "artifact_hash", h ? json_string(hash) : json_null()));
  }
  return arr;
}

/* A double for Prometheus text (NaN allowed). */
static void num(char *b, size_t cap, double x) {
  if (isnan(x)) snprintf(b, cap, "NaN");
  else snprintf(b, cap, "%.9g", x);
}

void eldr__watch_metrics(eldr_server *s, struct evbuffer *o) {
  eldr__watchst *w = s->watch;
  if (!w || !s->art) return;
  view v;
  view_get(s, &v);
  const eldr_artifact *a = s->art;
  char x[4][40];
  evbuffer_add_printf(o, "# HELP eldr_artifact_info The loaded artifact: XXH3-64 of its file, fit.created, and what "
                         "chose its representation and layers (fit.chosen_by).\n"
                         "# TYPE eldr_artifact_info gauge\n"
                         "eldr_artifact_info{hash=\"%s\",created=\"%s\",k=\"%zu\",chosen_by=\"%s\"} 1\n",
                      v.hash, a->created ? a->created : "", a->k, eldr_fit_evidence_name(a->fit_chosen_by));
  num(x[0], sizeof x[0], v.age);
  evbuffer_add_printf(o, "# HELP eldr_artifact_age_seconds Now minus the artifact's fit.created (NaN without it).\n"
                         "# TYPE eldr_artifact_age_seconds gauge\neldr_artifact_age_seconds %s\n", x[0]);
  evbuffer_add_printf(o, "# HELP eldr_watch_requests Locality decisions in the watch window.\n"
                         "# TYPE eldr_watch_requests gauge\neldr_watch_requests %zu\n", v.st.n);
  evbuffer_add_printf(o, "# HELP eldr_centroid_share Traffic share of each centroid (by the decoder chosen) over the window.\n"
                         "# TYPE eldr_centroid_share gauge\n");
  for (size_t c = 0; c < w->k; c++) evbuffer_add_printf(o, "eldr_centroid_share{centroid=\"%zu\"} %.6g\n", c, w->share[c]);
  evbuffer_add_printf(o, "# HELP eldr_centroid_capacity_share Decode capacity share of each centroid (decoder mapping).\n"
                         "# TYPE eldr_centroid_capacity_share gauge\n");
  for (size_t c = 0; c < w->k; c++)
    evbuffer_add_printf(o, "eldr_centroid_capacity_share{centroid=\"%zu\"} %.6g\n", c, w->cap[c]);
  num(x[0], sizeof x[0], v.st.mean_chosen_sim);
  num(x[1], sizeof x[1], v.st.drift);
  num(x[2], sizeof x[2], v.st.js);
  num(x[3], sizeof x[3], v.st.ks);
  evbuffer_add_printf(o, "# HELP eldr_centroid_similarity_mean Mean similarity of requests to their chosen centroid over the window.\n"
                         "# TYPE eldr_centroid_similarity_mean gauge\neldr_centroid_similarity_mean %s\n"
                         "# HELP eldr_signature_drift max(JS divergence of the nearest-centroid histogram, KS distance of the "
                         "best similarity) against the fit; NaN: unknown.\n# TYPE eldr_signature_drift gauge\n"
                         "eldr_signature_drift %s\n"
                         "# HELP eldr_signature_drift_part The two parts of eldr_signature_drift.\n"
                         "# TYPE eldr_signature_drift_part gauge\neldr_signature_drift_part{stat=\"js_nearest\"} %s\n"
                         "eldr_signature_drift_part{stat=\"ks_similarity\"} %s\n"
                         "# HELP eldr_signature_drift_threshold Above it the artifact is stale: refit and reload.\n"
                         "# TYPE eldr_signature_drift_threshold gauge\neldr_signature_drift_threshold %g\n",
                      x[0], x[1], x[2], x[3], ELDR_DRIFT_THRESHOLD);
  num(x[0], sizeof x[0], v.rho);
  num(x[1], sizeof x[1], a->fit_rho);
  evbuffer_add_printf(o, "# HELP eldr_live_rho rho of the sampled prefill/decode pairs (decoders returning routed_experts).\n"
                         "# TYPE eldr_live_rho gauge\neldr_live_rho %s\n"
                         "# HELP eldr_live_rho_pairs Pairs behind eldr_live_rho.\n# TYPE eldr_live_rho_pairs gauge\n"
                         "eldr_live_rho_pairs %zu\n"
                         "# HELP eldr_artifact_fit_rho rho measured by the fit.\n# TYPE eldr_artifact_fit_rho gauge\n"
                         "eldr_artifact_fit_rho %s\n",
                      x[0], v.pairs, x[1]);
}

static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

void eldr__handle_status(hconn *c) {
  eldr_server *s = c->s;
  json_t *o = json_object();
  if (!o) {
    eldr__send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  json_object_set_new(o, "policy", json_string(eldr_policy_name(s->cfg.policy)));
  json_object_set_new(o, "decoders", json_integer((json_int_t)s->nw[ROLE_DECODE]));
  json_object_set_new(o, "reloads", json_pack("{sIsI}", "ok", (json_int_t)s->m.reloads_ok, "error",
                                              (json_int_t)s->m.reloads_err));
  json_object_set_new(o, "loops", loops_json(s));
  json_t *bus = eldr__bus_status_json(s->grp ? s->grp->bus : NULL), *decs = json_array();
  for (size_t k = 0; s->grp && s->grp->bus && k < s->nw[ROLE_DECODE]; k++) { /* what decisions see */
    const worker *w = s->w[ROLE_DECODE][k];
    json_array_append_new(decs, json_pack("{sssIsI}", "url", w->url, "in_flight", (json_int_t)w->slot->inflight,
                                          "peers_in_flight", (json_int_t)eldr__bus_peer_load(w)));
  }
  json_object_set_new(bus, "decoders", decs);
  json_object_set_new(o, "bus", bus);
  eldr__watchst *w = s->watch;
  if (!w || !s->art) {
    json_object_set_new(o, "artifact", json_null());
    json_object_set_new(o, "drift", json_pack("{sssn}", "state", "unknown", "score"));
  } else {
    const eldr_artifact *a = s->art;
    view v;
    view_get(s, &v);
    json_t *art = json_object(), *cents = json_array();
    json_object_set_new(art, "path", json_string(s->cfg.artifact ? s->cfg.artifact : ""));
    json_object_set_new(art, "hash", json_string(v.hash));
    json_object_set_new(art, "created", a->created ? json_string(a->created) : json_null());
    json_object_set_new(art, "age_seconds", jnum(v.age));
    json_object_set_new(art, "k", json_integer((json_int_t)a->k));
    json_object_set_new(art, "fit_rho", jnum(a->fit_rho));
    json_object_set_new(art, "fit_chosen_by", json_string(eldr_fit_evidence_name(a->fit_chosen_by)));
    json_object_set_new(art, "drift_reference", json_boolean(a->drift_ref != NULL));
    json_object_set_new(o, "artifact", art);
    json_object_set_new(o, "window", json_pack("{sfsI}", "seconds", s->cfg.watch_window_s, "requests", (json_int_t)v.st.n));
    for (size_t k = 0; k < w->k; k++) {
      json_t *e = json_object();
      json_object_set_new(e, "centroid", json_integer((json_int_t)k));
      json_object_set_new(e, "share", json_real(w->share[k]));
      json_object_set_new(e, "capacity_share", json_real(w->cap[k]));
      json_object_set_new(e, "nearest_share", json_real(w->nearest[k]));
      json_object_set_new(e, "fit_nearest_share", a->drift_ref ? json_real(a->drift_ref->nearest_share[k]) : json_null());
      json_array_append_new(cents, e);
    }
    json_object_set_new(o, "centroids", cents);
    json_object_set_new(o, "mean_similarity", jnum(v.st.mean_chosen_sim));
    json_object_set_new(o, "mean_best_similarity", jnum(v.st.mean_best_sim));
    const char *state = isnan(v.st.drift) ? "unknown" : v.st.stale ? "stale" : "ok";
    json_t *dr = json_object();
    json_object_set_new(dr, "state", json_string(state));
    json_object_set_new(dr, "score", jnum(v.st.drift));
    json_object_set_new(dr, "js_nearest", jnum(v.st.js));
    json_object_set_new(dr, "ks_similarity", jnum(v.st.ks));
    json_object_set_new(dr, "threshold", json_real(ELDR_DRIFT_THRESHOLD));
    json_object_set_new(dr, "min_requests", json_integer(ELDR_DRIFT_MIN_SAMPLES));
    json_object_set_new(dr, "why_unknown", !isnan(v.st.drift) ? json_null()
                        : json_string(!a->drift_ref ? "the artifact has no fit.drift_ref (refit with this eldr)"
                                                    : "fewer decisions in the window than min_requests"));
    json_object_set_new(o, "drift", dr);
    json_object_set_new(o, "rho", json_pack("{sosIso}", "live", jnum(v.rho), "pairs",
                                            (json_int_t)v.pairs, "fit", jnum(a->fit_rho)));
  }
  char *txt = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!txt) {
    eldr__send_error(c, 500, "internal_error", "out of memory");
    return;
  }
  eldr__send_body(c, 200, "application/json", txt, strlen(txt), NULL);
  free(txt);
}

/* Equal strings, in time that depends on the lengths only (not on where
 * they differ). */
void eldr__handle_admin_reload(hconn *c) { /* conn.c checked the token (auth.c) */
  eldr_server *s = c->s;
  eldr_diag d = {{0}};
  int rc = eldr__reload_now(s, &d);
  json_t *o = json_object();
  if (o) {
    json_object_set_new(o, "result", json_string(rc ? "error" : "ok"));
    if (rc) {
      json_object_set_new(o, "error", json_string(eldr_diag_msg(&d, rc)));
    } else {
      json_object_set_new(o, "artifact", s->cfg.artifact ? json_string(s->cfg.artifact) : json_null());
      json_object_set_new(o, "policy", json_string(eldr_policy_name(s->cfg.policy)));
      json_object_set_new(o, "prefill", json_integer((json_int_t)s->nw[ROLE_PREFILL]));
      json_object_set_new(o, "decode", json_integer((json_int_t)s->nw[ROLE_DECODE]));
    }
  }
  if (o && !rc && s->watch) {
    char h[20];
    snprintf(h, sizeof h, "%016" PRIx64, s->watch->hash);
    json_object_set_new(o, "hash", json_string(h));
  }
  char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  eldr__send_body(c, rc ? 500 : 200, "application/json", txt ? txt : "{}", txt ? strlen(txt) : 2, NULL);
  free(txt);
}
