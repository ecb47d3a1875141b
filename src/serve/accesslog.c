/* accesslog.c — optional JSON access log (--access-log FILE|-): one line
 * per completion request when it ends, written with one fwrite to a
 * line-buffered stream opened at start. TTFT is measured at the router from
 * the request's arrival to the first byte of the decode reply; TPOT from
 * there to the last byte over the SSE events relayed after the first (a
 * non-streaming reply has none); prefill_ms from the arrival to the end of
 * its prefill (the decode leg's start), so a client can time its tokens
 * from there (TPOT from prefill end). Loop thread only. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "serve_types.h"

int eldr__access_log_open(eldr_server *s, const char *path, eldr_diag *d) {
  if (!path) return 0;
  if (!strcmp(path, "-")) {
    s->access_log = stdout;
    return 0;
  }
  s->access_log = fopen(path, "a");
  if (!s->access_log) return eldr_diag_fail(d, ELDR_EIO, "access log %s: %s", path, strerror(errno));
  setvbuf(s->access_log, NULL, _IOLBF, 0);
  return 0;
}

void eldr__access_log_close(eldr_server *s) {
  if (s->access_log && s->access_log != stdout) fclose(s->access_log);
  s->access_log = NULL;
}

void eldr__al_decision(rq *r, const worker *w, double similarity) {
  r->al_sim = similarity;
  eldr__copy(r->al_decoder, sizeof r->al_decoder, w ? w->url : "");
}

void eldr__al_data(rq *r, const char *p, size_t n) {
  double t = eldr__now_s();
  if (r->al_first <= 0) r->al_first = t;
  r->al_last = t;
  /* SSE events: "data:" at the start of a line (split across reads: rare, undercounted) */
  for (size_t i = 0; i + 5 <= n; i++)
    if (!memcmp(p + i, "data:", 5) && (i == 0 || p[i - 1] == '\n')) r->al_events++;
}

void eldr__access_log(rq *r, int outcome, int status) {
  static const char *const dec_name[DEC__N] = {"locality", "load", "none"};
  static const char *const out_name[OUT__N] = {"ok", "client_error", "upstream_error", "timeout",
                                               "cancelled", "stream_aborted"};
  eldr_server *s = r->s;
  if (!s->access_log || r->is_models) return;
  double now = eldr__now_s();
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  json_t *o = json_object();
  if (!o) return;
  json_object_set_new(o, "ts", json_string(ts));
  /* id: as echoed to the client (its X-Request-Id, else the engines' id) */
  json_object_set_new(o, "id", json_string(r->client_reqid[0] ? r->client_reqid : r->reqid));
  json_object_set_new(o, "engine_id", json_string(r->reqid));
  json_object_set_new(o, "policy", json_string(eldr_policy_name(s->cfg.policy)));
  json_object_set_new(o, "decision", json_string(dec_name[r->decision]));
  json_object_set_new(o, "decoder", r->al_decoder[0] ? json_string(r->al_decoder) : json_null());
  if (r->pd) { /* --pd sglang: how the decoder was chosen at arrival */
    static const char *const arr[ARR__N] = {"predicted", "below_threshold", "none", "exact"};
    json_object_set_new(o, "signature", json_string(arr[r->arrival]));
    if (r->exact >= 0 && r->exact < SGX__N) json_object_set_new(o, "exact", json_string(eldr__sgx_name[r->exact]));
    json_object_set_new(o, "confidence", r->confidence >= 0 ? json_real(r->confidence) : json_null());
  }
  json_object_set_new(o, "similarity", r->decision == DEC_LOCALITY ? json_real(r->al_sim) : json_null());
  json_object_set_new(o, "ttft_ms", r->al_first > 0 ? json_real((r->al_first - r->t0) * 1e3) : json_null());
  json_object_set_new(o, "tpot_ms", r->al_events > 1 ? json_real((r->al_last - r->al_first) * 1e3 / (r->al_events - 1))
                                                      : json_null());
  json_object_set_new(o, "prefill_ms", r->al_pf > 0 ? json_real((r->al_pf - r->t0) * 1e3) : json_null());
  json_object_set_new(o, "e2e_ms", json_real((now - r->t0) * 1e3));
  json_object_set_new(o, "status", json_integer(status));
  json_object_set_new(o, "outcome", json_string(out_name[outcome]));
  char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
  json_decref(o);
  if (!line) return;
  size_t n = strlen(line);
  line[n] = '\n'; /* one write per line: the NUL becomes the newline */
  fwrite(line, 1, n + 1, s->access_log);
  free(line);
}
