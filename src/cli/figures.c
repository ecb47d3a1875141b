/* figures.c — the figures of eldr sim, eldr demo and eldr trace stats (see
 * figures.h). */
#include "figures.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "eldr/plot.h"

/* A script under construction (open_memstream). */
typedef struct script {
  FILE *f;
  char *buf;
  size_t len;
} script;

static int script_open(script *s, eldr_diag *d) {
  memset(s, 0, sizeof *s);
  s->f = open_memstream(&s->buf, &s->len);
  return s->f ? 0 : eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
}

/* Close the script, optionally save a copy, run gnuplot on it. */
static int script_run(script *s, const char *save_path, eldr_diag *d) {
  int rc = ferror(s->f) ? ELDR_ENOMEM : 0;
  if (fclose(s->f)) rc = ELDR_ENOMEM;
  if (rc) {
    free(s->buf);
    return eldr_diag_fail(d, rc, "out of memory");
  }
  if (save_path) {
    FILE *g = fopen(save_path, "w");
    if (!g || fwrite(s->buf, 1, s->len, g) != s->len || fclose(g)) {
      free(s->buf);
      return eldr_diag_fail(d, ELDR_EIO, "cannot write '%s'", save_path);
    }
  }
  rc = eldr_plot_run(s->buf, s->len, d);
  free(s->buf);
  return rc;
}

static double ms(double x) { return x * 1e3; }

/* "<dir>/<name>" into buf; ELDR_EINVAL when it does not fit. */
static int join(char *buf, size_t cap, const char *dir, const char *name, eldr_diag *d) {
  if ((size_t)snprintf(buf, cap, "%s/%s", dir, name) >= cap)
    return eldr_diag_fail(d, ELDR_EINVAL, "path too long: '%s'", dir);
  return 0;
}

static int sim_data(const char *path, const eldr_sweep_row *rows, size_t nrows,
                    const eldr_sweep_variant *vs, size_t nv, const double *rates, size_t nr,
                    eldr_diag *d) {
  /* one block per variant: rate p50 p99 (ms) */
  FILE *f = fopen(path, "w");
  if (!f) return eldr_diag_fail(d, ELDR_EIO, "cannot write '%s'", path);
  for (size_t v = 0; v < nv; v++) {
    fprintf(f, "# %s\n", vs[v].label);
    for (size_t i = 0; i < nr; i++) {
      const eldr_sweep_row *r = eldr_sweep_find(rows, nrows, rates[i], vs[v].label);
      if (r) fprintf(f, "%g %g %g\n", rates[i], ms(r->r.tpot_p50), ms(r->r.tpot_p99));
    }
    fprintf(f, "\n\n");
  }
  return fclose(f) ? eldr_diag_fail(d, ELDR_EIO, "cannot write '%s'", path) : 0;
}

static int tau_data(const char *path, const eldr_sweep_row *rows, size_t nrows,
                    const double *rates, size_t nr, const double *taus, size_t ntaus,
                    eldr_diag *d) {
  /* one block per rate: tau p50 p99 (ms) */
  FILE *g = fopen(path, "w");
  if (!g) return eldr_diag_fail(d, ELDR_EIO, "cannot write '%s'", path);
  for (size_t i = 0; i < nr; i++) {
    fprintf(g, "# rate %g\n", rates[i]);
    for (size_t k = 0; k < ntaus; k++) {
      char lab[48];
      snprintf(lab, sizeof lab, "eldr(tau=%g)", taus[k]);
      const eldr_sweep_row *r = eldr_sweep_find(rows, nrows, rates[i], lab);
      if (r) fprintf(g, "%g %g %g\n", taus[k], ms(r->r.tpot_p50), ms(r->r.tpot_p99));
    }
    fprintf(g, "\n\n");
  }
  return fclose(g) ? eldr_diag_fail(d, ELDR_EIO, "cannot write '%s'", path) : 0;
}

/* "plot" clause: '<data>' index i using 1:col with linespoints title '<t>' */
static void series(FILE *f, int first, const char *data, size_t index, int col, const char *title) {
  fputs(first ? "plot " : ", ", f);
  eldr_plot_quote(f, data);
  fprintf(f, " index %zu using 1:%d with linespoints title ", index, col);
  eldr_plot_quote(f, title);
}

int fig_sim(const char *dir, const eldr_sweep_row *rows, size_t nrows,
            const eldr_sweep_variant *vs, size_t nv, const double *rates, size_t nr,
            const double *taus, size_t ntaus, int vanilla, const char *title, eldr_diag *d) {
  if (mkdir(dir, 0777) && errno != EEXIST)
    return eldr_diag_fail(d, ELDR_EIO, "cannot create '%s': %s", dir, strerror(errno));
  char dat[4096], tdat[4096], gp[4096], png[4096];
  int rc;
  if ((rc = join(dat, sizeof dat, dir, "tpot_vs_rate.dat", d)) ||
      (rc = join(tdat, sizeof tdat, dir, "tau_sweep.dat", d)) ||
      (rc = join(gp, sizeof gp, dir, "plot.gp", d)) ||
      (rc = join(png, sizeof png, dir, "balanced_vs_vanilla.png", d))) /* the longest name */
    return rc;
  if ((rc = sim_data(dat, rows, nrows, vs, nv, rates, nr, d))) return rc;
  if (ntaus && (rc = tau_data(tdat, rows, nrows, rates, nr, taus, ntaus, d))) return rc;
  script s;
  if ((rc = script_open(&s, d))) return rc;
  FILE *f = s.f;
  join(png, sizeof png, dir, "tpot_p50_vs_rate.png", d);
  eldr_plot_header(f, png, title, d);
  fputs("set xlabel 'arrival rate (requests/s)'\n", f);
  for (int p99 = 0; p99 < 2; p99++) {
    if (p99) {
      join(png, sizeof png, dir, "tpot_p99_vs_rate.png", d);
      eldr_plot_output(f, png, title);
    }
    fprintf(f, "set ylabel '%s TPOT (ms)'\n", p99 ? "p99" : "median");
    int first = 1;
    for (size_t v = 0; v < nv; v++) {
      if (!vs[v].is_headline) continue;
      series(f, first, dat, v, p99 ? 3 : 2, vs[v].label);
      first = 0;
    }
    fputs(first ? "plot NaN notitle\n" : "\n", f);
  }
  if (ntaus) {
    join(png, sizeof png, dir, "tau_sweep.png", d);
    char tt[512];
    snprintf(tt, sizeof tt, "%s: ELDR locality band tau", title ? title : "eldr sim");
    eldr_plot_output(f, png, tt);
    fputs("set xlabel 'tau'\nset ylabel 'median TPOT (ms)'\nset key outside right\n", f);
    for (size_t i = 0; i < nr; i++) {
      char t[64];
      snprintf(t, sizeof t, "rate %g", rates[i]);
      series(f, i == 0, tdat, i, 2, t);
    }
    fputs("\nset xlabel 'arrival rate (requests/s)'\nset key top left\n", f);
  }
  if (vanilla) {
    join(png, sizeof png, dir, "balanced_vs_vanilla.png", d);
    char tt[512];
    snprintf(tt, sizeof tt, "%s: balanced vs vanilla K-means", title ? title : "eldr sim");
    eldr_plot_output(f, png, tt);
    fputs("set ylabel 'TPOT (ms)'\n", f);
    size_t vb = nv, vv = nv;
    for (size_t v = 0; v < nv; v++) {
      if (!strcmp(vs[v].label, "eldr")) vb = v;
      if (!strcmp(vs[v].label, "eldr-vanilla")) vv = v;
    }
    if (vb < nv && vv < nv) {
      series(f, 1, dat, vb, 2, "balanced p50");
      series(f, 0, dat, vb, 3, "balanced p99");
      series(f, 0, dat, vv, 2, "vanilla p50");
      series(f, 0, dat, vv, 3, "vanilla p99");
      fputc('\n', f);
    } else {
      fputs("plot NaN notitle\n", f);
    }
  }
  return script_run(&s, gp, d);
}

int fig_demo(const char *out, const char *title, size_t n, const char *const *policies,
             const double *p50, const double *mean, const double *p99, eldr_diag *d) {
  script s;
  int rc = script_open(&s, d);
  if (rc) return rc;
  FILE *f = s.f;
  if ((rc = eldr_plot_header(f, out, title, d))) {
    fclose(f);
    free(s.buf);
    return rc;
  }
  fputs("$tpot << EOD\n", f);
  for (size_t k = 0; k < n; k++) fprintf(f, "%s %.4f %.4f %.4f\n", policies[k], p50[k], p99[k], mean[k]);
  fputs("EOD\n"
        "set style data histograms\nset style histogram clustered gap 1\n"
        "set style fill solid 0.8 border -1\nset ylabel 'TPOT (ms, model time)'\n"
        "set yrange [0:*]\nset grid noxtics ytics\n"
        "set key outside bottom center horizontal reverse Left samplen 2\n"
        "plot $tpot using 2:xtic(1) title 'TPOT p50', '' using 4 title 'TPOT mean', "
        "'' using 3 title 'TPOT p99'\n",
        f);
  return script_run(&s, NULL, d);
}

int fig_trace_stats(const char *out, const eldr_tracestats *st, eldr_diag *d) {
  script s;
  int rc = script_open(&s, d);
  if (rc) return rc;
  FILE *p = s.f;
  if ((rc = eldr_plot_header(p, out, "Distinct experts per layer per decode step", d))) {
    fclose(p);
    free(s.buf);
    return rc;
  }
  fputs("set xlabel 'batch size'\nset ylabel 'distinct experts (mean)'\nset logscale x 2\n", p);
  for (int rule = 0; rule < ELDR_BATCH__COUNT; rule++) {
    fprintf(p, "$%s << EOD\n", eldr_tracestats_rule_name(rule));
    for (size_t i = 0; i < st->n_batch; i++)
      if (!isnan(st->batch[i].distinct[rule]))
        fprintf(p, "%zu %.6f\n", st->batch[i].size, st->batch[i].distinct[rule]);
    fprintf(p, "EOD\n");
  }
  fprintf(p, "plot $random using 1:2 with linespoints title 'random'");
  for (int rule = 1; rule < ELDR_BATCH__COUNT; rule++) {
    int any = 0;
    for (size_t i = 0; i < st->n_batch; i++) any |= !isnan(st->batch[i].distinct[rule]);
    if (any)
      fprintf(p, ", $%s using 1:2 with linespoints title 'same %s'",
              eldr_tracestats_rule_name(rule), eldr_tracestats_rule_name(rule));
  }
  fprintf(p, "\n");
  return script_run(&s, NULL, d);
}
