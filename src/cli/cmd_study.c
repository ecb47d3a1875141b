/* cmd_study.c — `eldr study NAME --out DIR`: one paper result per command
 * (the logic is in src/sim/study*.c). Writes DIR/NAME.csv, NAME.json,
 * NAME.md (the summary paragraph and the exact command) and NAME.png (with
 * gnuplot; its script is kept as NAME.gp), and prints the summary. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "eldr/clock.h"
#include "eldr/fit.h"
#include "eldr/latency.h"
#include "eldr/plot.h"
#include "eldr/preset_files.h"
#include "eldr/provenance.h"
#include "eldr/study.h"
#include "eldr/trace.h"
#include "eldr/tracegen.h"

static const char STUDY_HELP[] =
    "usage: eldr study NAME --out DIR [options]\n"
    "\n"
    "One result of the ELDR paper, measured honestly: the artifact is fitted on one\n"
    "part of a seeded split (or on --trace, serving --serve-trace) and only unseen\n"
    "requests are served; every gain is reported raw and net of the replay control\n"
    "(eldr-permuted); numbers are means over --seeds with their sd.\n"
    "Writes DIR/NAME.csv, NAME.json, NAME.md (summary + command) and NAME.png.\n"
    "\n"
    "NAME\n"
    "  fig2      step-latency model: step time vs distinct experts and batch (also\n"
    "            with the fitted per-layer overhead set to 0)\n"
    "  fig3      prefill->decode Pearson vs random-pair and same-domain pairings\n"
    "  fig4      distinct experts per batching rule (random, domain, cluster)\n"
    "  fig11     mean TPOT vs load, every policy\n"
    "  fig15     balanced vs vanilla K-means\n"
    "  fig16     the locality band tau\n"
    "  table2    8 / 16 / 24 decoders\n"
    "  rho-gain  each representation's rho against its net gain (Spearman)\n"
    "  crossover every preset and hardware: locality's step-time gain vs batch size\n"
    "            1..4096, where it falls under 1%% (no trace; checks the roofline on a\n"
    "            real MoE FFN on this CPU unless --no-cpu)\n"
    "\n"
    "workload\n"
    "  -t, --trace FILE        expert trace (JSONL)   [generate --workload instead]\n"
    "      --serve-trace FILE  serve this trace; fit on all of --trace  [none]\n"
    "      --fit-fraction F    fitted share of the seeded split        [0.5]\n"
    "  -w, --workload W        generated: realistic | task | language (paper-shaped)\n"
    "                          | custom:FILE                           [realistic]\n"
    "      --gen-requests N    requests to generate                    [600]\n"
    "      --gen-seed N        seed of the generated trace             [" ELDR_SEED_DEFAULT_STR "]\n"
    "      --max-decode-tokens T  cap generated output lengths         [128]\n"
    "cluster and model\n"
    "  -m, --model M           model preset (shape and latency) [from the trace; qwen3-30b-a3b]\n"
    "      --hardware H        mi300x | h200 | h100   [mi300x; h200 for llama4-maverick]\n"
    "      --latency FILE      JSON overrides of the latency model's fields  [none]\n"
    "      --prefill P         prefill workers                         [8]\n"
    "      --decode D          decode workers (table2: 8, 16, 24)      [16]\n"
    "      --max-batch B       decode batch limit per worker           [64]\n"
    "runs\n"
    "      --requests N        arrivals per simulation                 [2000]\n"
    "      --load X            share of estimated capacity (one-rate studies) [0.95]\n"
    "      --seeds LIST        split/fit/arrival seeds                 [1,2,3]\n"
    "      --tau X             ELDR locality band                      [0.1]\n"
    "      --restarts N        K-means restarts                        [4]\n"
    "output\n"
    "  -o, --out DIR           output directory (created)              (required)\n"
    "      --no-plot           skip the PNG\n"
    "      --no-cpu            crossover: skip the CPU measurement\n"
    "  -q, --quiet             no progress on stderr\n"
    "  -h, --help              this help\n";

static void progress(void *ctx, const char *what) {
  (void)ctx;
  fprintf(stderr, "study: %s\n", what);
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

static void csv_cell(FILE *f, json_t *v) {
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    if (strpbrk(s, ",\"\n")) {
      fputc('"', f);
      for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
      }
      fputc('"', f);
    } else {
      fputs(s, f);
    }
  } else if (json_is_integer(v)) {
    fprintf(f, "%lld", (long long)json_integer_value(v));
  } else if (json_is_real(v)) {
    fprintf(f, "%.6g", json_real_value(v));
  } /* null: empty cell */
}

static int write_csv(const char *path, json_t *res) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  json_t *cols = json_object_get(res, "columns"), *rows = json_object_get(res, "rows");
  for (size_t i = 0; i < json_array_size(cols); i++)
    fprintf(f, "%s%s", i ? "," : "", json_string_value(json_array_get(cols, i)));
  fputc('\n', f);
  for (size_t r = 0; r < json_array_size(rows); r++) {
    json_t *row = json_array_get(rows, r);
    for (size_t i = 0; i < json_array_size(row); i++) {
      if (i) fputc(',', f);
      csv_cell(f, json_array_get(row, i));
    }
    fputc('\n', f);
  }
  return fclose(f);
}

static long col_index(json_t *res, const char *name) {
  json_t *cols = json_object_get(res, "columns");
  for (size_t i = 0; name && i < json_array_size(cols); i++)
    if (!strcmp(json_string_value(json_array_get(cols, i)), name)) return (long)i;
  return -1;
}

static void gp_value(FILE *f, json_t *v) {
  if (json_is_number(v))
    fprintf(f, "%.6g", json_number_value(v));
  else if (json_is_string(v))
    fprintf(f, "\"%s\"", json_string_value(v));
  else
    fputs("NaN", f);
}

/* What a column is called in a legend (the CSV keeps its column name). */
static const char *series_label(const char *col) {
  static const char *const names[][2] = {
      {"gain_pct", "ELDR vs the best baseline"},
      {"control_pct", "replay control (eldr-permuted) alone"},
      {"net_pct", "ELDR net of the replay control"},
      {"tpot_ms", "mean TPOT"},
      {"distinct", "distinct experts"},
      {"step_ms", "step time"},
      {"median_pearson", "median Pearson"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(col, names[i][0])) return names[i][1];
  return col;
}

/* A cell as legend text. */
static void cell_text(json_t *v, char *buf, size_t cap) {
  if (json_is_string(v))
    snprintf(buf, cap, "%s", json_string_value(v));
  else
    snprintf(buf, cap, "%g", json_number_value(v));
}

#define GP_MAX_GROUPS 64

/* The gnuplot script (house style of eldr/plot.h): inline data blocks, one
 * per series group. plot.group is a column (a line per value) or two
 * columns (a line per pair: the first picks the dash, the second the
 * colour; plot.group_format the legend's format of each). The title is
 * plot.title (else the study's name); a legend with more than one series
 * goes under the plot, where it covers no data, and a single series has
 * none (the axis label names it). */
static int write_gp(FILE *f, const char *png, json_t *res) {
  json_t *plot = json_object_get(res, "plot"), *rows = json_object_get(res, "rows");
  const char *kind = json_string_value(json_object_get(plot, "kind"));
  long xc = col_index(res, json_string_value(json_object_get(plot, "x")));
  json_t *g = json_object_get(plot, "group"), *gfmt = json_object_get(plot, "group_format");
  long gc[2] = {-1, -1};
  size_t ngc = 0;
  if (json_is_string(g)) gc[ngc++] = col_index(res, json_string_value(g));
  for (size_t i = 0; json_is_array(g) && i < json_array_size(g) && i < 2; i++)
    gc[ngc++] = col_index(res, json_string_value(json_array_get(g, i)));
  json_t *ys = json_object_get(plot, "y");
  if (xc < 0 || !json_array_size(ys) || (ngc && (gc[0] < 0 || (ngc > 1 && gc[1] < 0)))) return -1;
  const char *title = json_string_value(json_object_get(plot, "title"));
  if (eldr_plot_header(f, png, title ? title : json_string_value(json_object_get(res, "study")), NULL))
    return -1;
  fputs("set xlabel ", f);
  eldr_plot_quote(f, json_string_value(json_object_get(plot, "xlabel")));
  fputs("\nset ylabel ", f);
  eldr_plot_quote(f, json_string_value(json_object_get(plot, "ylabel")));
  fputs("\n", f);
  json_t *lx = json_object_get(plot, "logx");
  if (json_is_integer(lx)) fprintf(f, "set logscale x %lld\n", (long long)json_integer_value(lx));
  json_t *hl = json_object_get(plot, "hline"); /* a reference level */
  if (json_is_number(hl))
    fprintf(f, "set arrow from graph 0, first %g to graph 1, first %g nohead dt 3 lc rgb '#999999'\n",
            json_number_value(hl), json_number_value(hl));
  /* the groups (value tuples) in first-seen order, and each column's values' order */
  char *groups[GP_MAX_GROUPS][2];
  size_t ng = 0, style[GP_MAX_GROUPS][2];
  char *vals[2][GP_MAX_GROUPS];
  size_t nvals[2] = {0, 0};
  for (size_t r = 0; r < json_array_size(rows); r++) {
    char buf[2][64] = {"all", ""};
    size_t vi[2] = {0, 0};
    for (size_t c = 0; c < ngc; c++) {
      cell_text(json_array_get(json_array_get(rows, r), (size_t)gc[c]), buf[c], sizeof buf[c]);
      while (vi[c] < nvals[c] && strcmp(vals[c][vi[c]], buf[c])) vi[c]++;
      if (vi[c] == nvals[c] && nvals[c] < GP_MAX_GROUPS) vals[c][nvals[c]++] = strdup(buf[c]);
    }
    size_t k = 0;
    while (k < ng && (strcmp(groups[k][0], buf[0]) || strcmp(groups[k][1], buf[1]))) k++;
    if (k == ng && ng < GP_MAX_GROUPS) {
      groups[ng][0] = strdup(buf[0]);
      groups[ng][1] = strdup(buf[1]);
      style[ng][0] = vi[0];
      style[ng][1] = vi[1];
      ng++;
    }
  }
  int bars = !strcmp(kind, "bars");
  for (size_t k = 0; k < ng; k++) {
    fprintf(f, "$d%zu << EOD\n", k);
    for (size_t r = 0; r < json_array_size(rows); r++) {
      json_t *row = json_array_get(rows, r);
      int match = 1;
      for (size_t c = 0; c < ngc; c++) {
        char buf[64];
        cell_text(json_array_get(row, (size_t)gc[c]), buf, sizeof buf);
        match &= !strcmp(buf, groups[k][c]);
      }
      if (!match) continue;
      gp_value(f, json_array_get(row, (size_t)xc));
      for (size_t y = 0; y < json_array_size(ys); y++) {
        fputc(' ', f);
        gp_value(f, json_array_get(row, (size_t)col_index(res, json_string_value(json_array_get(ys, y)))));
      }
      fputc('\n', f);
    }
    fprintf(f, "EOD\n");
  }
  const size_t nseries = ng * json_array_size(ys);
  fputs(nseries > 1 ? "set key below\n" : "unset key\n", f);
  if (bars) fprintf(f, "set style data histograms\nset style fill solid 0.6\nset boxwidth 0.8\nset yrange [0:*]\n");
  fprintf(f, "plot ");
  int first = 1;
  for (size_t k = 0; k < ng; k++) {
    for (size_t y = 0; y < json_array_size(ys); y++) {
      const char *yn = series_label(json_string_value(json_array_get(ys, y)));
      char lab[160] = "", part[96];
      for (size_t c = 0; c < ngc; c++) {
        const char *fmt = json_is_array(gfmt) ? json_string_value(json_array_get(gfmt, c)) : NULL;
        snprintf(part, sizeof part, fmt ? fmt : "%s", groups[k][c]);
        size_t len = strlen(lab);
        snprintf(lab + len, sizeof lab - len, "%s%s", c ? ", " : "", part);
      }
      char title_s[300];
      if (ngc && json_array_size(ys) > 1)
        snprintf(title_s, sizeof title_s, "%s: %s", lab, yn);
      else
        snprintf(title_s, sizeof title_s, "%s", ngc ? lab : yn);
      if (!first) fprintf(f, ", ");
      first = 0;
      if (bars) {
        fprintf(f, "$d%zu using %zu:xtic(1) title ", k, y + 2);
      } else {
        /* two group columns: the second's value sets the colour, the first's the dash */
        size_t lt = ngc == 2 ? style[k][1] + 1 : (ngc ? k : y) + 1;
        size_t dt = ngc == 2 ? style[k][0] + 1 : 1;
        fprintf(f, "$d%zu using 1:%zu with %s lt %zu dt %zu title ", k, y + 2,
                !strcmp(kind, "points") ? "points pt 7" : "linespoints", lt, dt);
      }
      eldr_plot_quote(f, title_s);
    }
  }
  fputc('\n', f);
  for (size_t k = 0; k < ng; k++) free(groups[k][0]), free(groups[k][1]);
  for (size_t c = 0; c < 2; c++)
    for (size_t i = 0; i < nvals[c]; i++) free(vals[c][i]);
  return ferror(f) ? -1 : 0;
}

/* The crossover study's CPU check: a real MoE FFN layer (`eldr bench
 * moe-layer`'s, Qwen3-30B-A3B's expert shape halved, fp32, one thread) at
 * 8, 32 and 128 active experts over batches 1..1024. */
typedef struct cpu_points {
  eldr_study_cpu c;
  double *buf; /* 3 * n: experts, batch, ms */
} cpu_points;

static void measure_cpu(const char *cmd, int quiet, cpu_points *p) {
  static const long ex[] = {8, 32, 128}, bs[] = {1, 4, 16, 64, 256, 1024};
  enum { NE = 3, NB = 6, H = 1024, NI = 384, E = 128, K = 8 };
  double res[NE * NB];
  if (!quiet) fprintf(stderr, "study: crossover: a real MoE FFN layer on this CPU (bench moe-layer)\n");
  int rc = cli_moe_layer_measure(H, NI, E, K, ex, NE, bs, NB, 1, 0.05, 1, !quiet, res);
  if (rc == ELDR_EUNSUPPORTED) {
    fprintf(stderr, "eldr %s: crossover: built without OpenBLAS: no CPU check\n", cmd);
    return;
  }
  if (rc) cli_fail(cmd, "out of memory (the CPU check's MoE layer)");
  p->buf = malloc(3 * NE * NB * sizeof *p->buf);
  if (!p->buf) cli_fail(cmd, "out of memory");
  double *e = p->buf, *b = e + NE * NB, *ms = b + NE * NB;
  size_t n = 0;
  for (size_t i = 0; i < NE; i++)
    for (size_t j = 0; j < NB; j++)
      if (!isnan(res[i * NB + j])) e[n] = (double)ex[i], b[n] = (double)bs[j], ms[n++] = 1e3 * res[i * NB + j];
  p->c = (eldr_study_cpu){H, NI, K, n, e, b, ms};
}

static size_t parse_seeds(const char *cmd, const char *val, uint64_t **out) {
  size_t n = 1;
  for (const char *p = val; *p; p++) n += *p == ',';
  if (n > 64) cli_usage_error(cmd, "--seeds: at most 64 seeds");
  uint64_t *s = calloc(n, sizeof *s);
  if (!s) cli_fail(cmd, "out of memory");
  char *copy = strdup(val);
  if (!copy) cli_fail(cmd, "out of memory");
  size_t k = 0;
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    s[k++] = cli_parse_u64(cmd, "--seeds", tok);
  free(copy);
  if (k != n) cli_usage_error(cmd, "--seeds: empty entry in '%s'", val);
  *out = s;
  return n;
}

int eldr_cmd_study(int argc, char **argv) {
  const char *cmd = "study";
  const char *trace_path = NULL, *serve_path = NULL, *workload = "realistic", *model = NULL,
             *hardware = NULL, *lat_path = NULL, *out_dir = NULL;
  long gen_n = 600, max_dec = 128;
  uint64_t gen_seed = ELDR_SEED_DEFAULT, *seeds = NULL;
  int quiet = 0, no_plot = 0, no_cpu = 0;
  eldr_study_opts o;
  eldr_study_opts_default(&o);
  static const struct option lo[] = {
      {"trace", required_argument, 0, 't'},     {"serve-trace", required_argument, 0, 1},
      {"fit-fraction", required_argument, 0, 2}, {"workload", required_argument, 0, 'w'},
      {"gen-requests", required_argument, 0, 3}, {"gen-seed", required_argument, 0, 4},
      {"max-decode-tokens", required_argument, 0, 5}, {"model", required_argument, 0, 'm'},
      {"hardware", required_argument, 0, 6},     {"latency", required_argument, 0, 7},
      {"prefill", required_argument, 0, 8},      {"decode", required_argument, 0, 9},
      {"max-batch", required_argument, 0, 10},   {"requests", required_argument, 0, 11},
      {"load", required_argument, 0, 12},        {"seeds", required_argument, 0, 13},
      {"tau", required_argument, 0, 14},         {"restarts", required_argument, 0, 15},
      {"out", required_argument, 0, 'o'},        {"no-plot", no_argument, 0, 16},
      {"quiet", no_argument, 0, 'q'},            {"help", no_argument, 0, 'h'},
      {"no-cpu", no_argument, 0, 17},
      {0, 0, 0, 0}};
  /* the command line as typed (getopt_long permutes argv), so every
   * number in the outputs can be regenerated */
  size_t cl = 16;
  for (int i = 0; i < argc; i++) cl += strlen(argv[i]) + 1;
  char *line = malloc(cl);
  if (!line) cli_fail(cmd, "out of memory");
  strcpy(line, "eldr");
  for (int i = 0; i < argc; i++) strcat(strcat(line, " "), argv[i]);
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":t:w:m:o:qh", lo, NULL)) != -1) {
    switch (c) {
    case 't': trace_path = optarg; break;
    case 1: serve_path = optarg; break;
    case 2: o.fit_fraction = cli_parse_double(cmd, "--fit-fraction", optarg, 1e-6, 1 - 1e-6); break;
    case 'w': workload = optarg; break;
    case 3: gen_n = cli_parse_long(cmd, "--gen-requests", optarg, 4, 10000000); break;
    case 4: gen_seed = cli_parse_u64(cmd, "--gen-seed", optarg); break;
    case 5: max_dec = cli_parse_long(cmd, "--max-decode-tokens", optarg, 0, 1000000); break;
    case 'm': model = optarg; break;
    case 6: hardware = optarg; break;
    case 7: lat_path = optarg; break;
    case 8: o.n_prefill = (size_t)cli_parse_long(cmd, "--prefill", optarg, 1, 4096); break;
    case 9: o.n_decode = (size_t)cli_parse_long(cmd, "--decode", optarg, 1, 4096); break;
    case 10: o.max_batch = (size_t)cli_parse_long(cmd, "--max-batch", optarg, 1, 65536); break;
    case 11: o.n_requests = (size_t)cli_parse_long(cmd, "--requests", optarg, 1, 100000000); break;
    case 12: o.load = cli_parse_double(cmd, "--load", optarg, 1e-3, 10); break;
    case 13: free(seeds); o.n_seeds = parse_seeds(cmd, optarg, &seeds); o.seeds = seeds; break;
    case 14: o.tau = cli_parse_double(cmd, "--tau", optarg, 0, 2); break;
    case 15: o.restarts = (int)cli_parse_long(cmd, "--restarts", optarg, 1, 1000); break;
    case 'o': out_dir = optarg; break;
    case 16: no_plot = 1; break;
    case 17: no_cpu = 1; break;
    case 'q': quiet = 1; break;
    case 'h': fputs(STUDY_HELP, stdout); free(line); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind >= argc) cli_usage_error(cmd, "NAME is required (see --help)");
  if (optind + 1 < argc) cli_usage_error(cmd, "one NAME only ('%s' is extra)", argv[optind + 1]);
  const char *name = argv[optind];
  size_t known = 0;
  while (eldr_study_names[known] && strcmp(eldr_study_names[known], name)) known++;
  if (!eldr_study_names[known])
    cli_usage_error(cmd, "unknown study '%s' (fig2 fig3 fig4 fig11 fig15 fig16 table2 rho-gain crossover)", name);
  if (!out_dir) cli_usage_error(cmd, "--out DIR is required");
  cli_check_outdir(cmd, "--out", out_dir); /* before the minutes of work */
  if (serve_path && !trace_path) cli_usage_error(cmd, "--serve-trace needs --trace");
  if (!quiet) o.progress = progress;

  eldr_diag d = {{0}};
  eldr_trace *t = NULL, *ts = NULL;
  int rc;
  const int crossover = !strcmp(name, "crossover"); /* the model alone: no trace */
  cpu_points cp = {0};
  if (crossover) {
    if (trace_path || serve_path) cli_usage_error(cmd, "crossover takes no trace");
    if (!no_cpu) measure_cpu(cmd, quiet, &cp);
    o.cpu = cp.c.n ? &cp.c : NULL;
  } else if (trace_path) {
    if ((rc = eldr_trace_load(trace_path, &t, &d))) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    cli_trace_require_tokens(cmd, trace_path, t, "the studies replay per-token selections");
  } else {
    const char *m = model ? model : "qwen3-30b-a3b";
    eldr_shape s;
    char canon[128];
    if ((rc = eldr_tracegen_model_shape(m, &s, canon, sizeof canon, &d)))
      cli_usage_error(cmd, "--model: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen *g = NULL;
    if ((rc = eldr_tracegen_new(&s, canon, workload, gen_seed, &g, &d)))
      cli_usage_error(cmd, "--workload: %s", eldr_diag_msg(&d, rc));
    eldr_tracegen_set_lengths(g, 0, (uint32_t)max_dec, 0);
    if (!quiet) fprintf(stderr, "study: generating %ld %s requests for %s\n", gen_n, workload, canon);
    rc = eldr_tracegen_generate(g, (size_t)gen_n, &t, &d);
    eldr_tracegen_free(g);
    if (rc) cli_fail(cmd, "trace generation: %s", eldr_diag_msg(&d, rc));
  }
  if (serve_path) {
    if ((rc = eldr_trace_load(serve_path, &ts, &d))) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    cli_trace_require_tokens(cmd, serve_path, ts, "the studies replay per-token selections");
    char why[256];
    if (eldr_provenance_mismatch(t->model, t->generator, ts->model, ts->generator, why, sizeof why))
      fprintf(stderr, "eldr study: warning: --serve-trace is not from --trace's source: %s\n", why);
  }
  o.trace = t;
  o.serve = ts;
  const char *preset = model ? model : crossover ? "qwen3-30b-a3b" : cli_latency_preset_for_model(t->model);
  if (!preset && lat_path && !hardware) { /* a model outside the presets: the complete file is the model */
    if ((rc = eldr_latency_load_full(lat_path, &o.lm, &d)))
      cli_usage_error(cmd, "--latency: %s (without --model the file must be a complete model)",
                      eldr_diag_msg(&d, rc));
  } else {
    if (!preset)
      cli_usage_error(cmd, "--model is required: no latency preset for '%s' (or a complete --latency FILE)",
                      t->model);
    if (!hardware) hardware = cli_hardware_default(preset);
    if ((rc = eldr_latency_preset(preset, hardware, &o.lm, &d)))
      cli_usage_error(cmd, "%s", eldr_diag_msg(&d, rc));
    if (lat_path && (rc = eldr_latency_load_overrides(lat_path, &o.lm, &d)))
      cli_fail(cmd, "--latency: %s", eldr_diag_msg(&d, rc));
  }

  if (mkdir(out_dir, 0777) && errno != EEXIST)
    cli_fail(cmd, "--out: cannot create '%s': %s", out_dir, strerror(errno));
  double t0 = eldr_clock_now();
  json_t *res = NULL;
  rc = eldr_study_run(name, &o, &res, &d);
  if (rc) cli_fail(cmd, "%s: %s", name, eldr_diag_msg(&d, rc));
  json_object_set_new(res, "seconds", json_real(eldr_clock_now() - t0));
  json_object_set_new(res, "trace", json_string(trace_path ? trace_path : workload));
  if (serve_path) json_object_set_new(res, "serve_trace", json_string(serve_path));
  json_object_set_new(res, "command", json_string(line));

  char path[4096], png[4096];
  snprintf(path, sizeof path, "%s/%s.json", out_dir, name);
  if (json_dump_file(res, path, JSON_INDENT(2) | JSON_REAL_PRECISION(6)))
    cli_fail(cmd, "cannot write '%s'", path);
  snprintf(path, sizeof path, "%s/%s.csv", out_dir, name);
  if (write_csv(path, res)) cli_fail(cmd, "cannot write '%s'", path);
  const char *summary = json_string_value(json_object_get(res, "summary"));
  size_t ml = strlen(summary) + strlen(line) + 256;
  char *md = malloc(ml);
  if (!md) cli_fail(cmd, "out of memory");
  snprintf(md, ml, "%s\n\nPaper: %s\n\n`%s`\n", summary,
           json_string_value(json_object_get(res, "paper")), line);
  snprintf(path, sizeof path, "%s/%s.md", out_dir, name);
  if (write_text(path, md)) cli_fail(cmd, "cannot write '%s'", path);
  if (!no_plot) {
    snprintf(path, sizeof path, "%s/%s.gp", out_dir, name);
    snprintf(png, sizeof png, "%s/%s.png", out_dir, name);
    char *gp = NULL;
    size_t gl = 0;
    FILE *mf = open_memstream(&gp, &gl);
    if (!mf) cli_fail(cmd, "out of memory");
    int werr = write_gp(mf, png, res);
    if (fclose(mf) || werr) cli_fail(cmd, "cannot build the gnuplot script");
    if (write_text(path, gp)) cli_fail(cmd, "cannot write '%s'", path);
    eldr_diag pd = {{0}};
    int prc = eldr_plot_run(gp, gl, &pd);
    free(gp);
    if (prc == ELDR_ENOTFOUND)
      fprintf(stderr, "eldr study: gnuplot is not installed: no %s (script %s)\n", png, path);
    else if (prc)
      cli_fail(cmd, "gnuplot on '%s': %s", path, eldr_diag_msg(&pd, prc));
  }
  printf("%s\n", summary);
  free(md);
  free(line);
  json_decref(res);
  eldr_trace_free(ts);
  eldr_trace_free(t);
  free(seeds);
  free(cp.buf);
  return 0;
}
