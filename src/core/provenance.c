/* provenance.c — fitted vs served trace source check (eldr/provenance.h). */
#include "eldr/provenance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int eldr_provenance_parse(const char *gen, char *workload, size_t wcap,
                          unsigned long long *seed) {
  if (!gen || !workload || !wcap || !seed) return -1;
  const char *p = strchr(gen, ' ');
  int have_w = 0, have_s = 0;
  while (p && *p) {
    while (*p == ' ') p++;
    const char *e = strchr(p, ' ');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n > 9 && !strncmp(p, "workload=", 9)) {
      size_t m = n - 9 < wcap - 1 ? n - 9 : wcap - 1;
      memcpy(workload, p + 9, m);
      workload[m] = 0;
      have_w = 1;
    } else if (n > 5 && !strncmp(p, "seed=", 5)) {
      char *end = NULL;
      *seed = strtoull(p + 5, &end, 10);
      have_s = end == p + n;
    }
    p = e;
  }
  return have_w && have_s ? 0 : -1;
}

int eldr_provenance_mismatch(const char *fit_model, const char *fit_gen, const char *serve_model,
                             const char *serve_gen, char *why, size_t cap) {
  if (why && cap) why[0] = 0;
  if (fit_model && serve_model && fit_model[0] && serve_model[0] &&
      strcmp(fit_model, serve_model)) {
    if (why) snprintf(why, cap, "model differs: fitted '%.60s', served '%.60s'", fit_model, serve_model);
    return 1;
  }
  if (!fit_gen && !serve_gen) return 0;
  if (!fit_gen || !serve_gen) {
    if (why)
      snprintf(why, cap, "fitted on %s data, served %s data (%.80s)", fit_gen ? "generated" : "real",
               serve_gen ? "generated" : "real", fit_gen ? fit_gen : serve_gen);
    return 1;
  }
  if (!strcmp(fit_gen, serve_gen)) return 0;
  char wf[64], ws[64];
  unsigned long long sf = 0, ss = 0;
  if (!eldr_provenance_parse(fit_gen, wf, sizeof wf, &sf) &&
      !eldr_provenance_parse(serve_gen, ws, sizeof ws, &ss)) {
    if (strcmp(wf, ws)) {
      if (why) snprintf(why, cap, "generator workload differs: fitted '%s', served '%s'", wf, ws);
    } else if (why) {
      snprintf(why, cap,
               "generator seed differs: fitted %llu, served %llu (one seed's domains mean "
               "nothing for the other's requests)",
               sf, ss);
    }
    return 1;
  }
  if (why) snprintf(why, cap, "generator differs: fitted '%.80s', served '%.80s'", fit_gen, serve_gen);
  return 1;
}
