/* cmd_rho.c — `eldr rho`: quality rho of a signature on any trace. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/artifact.h"
#include "eldr/fit.h"
#include "eldr/quality.h"
#include "eldr/signature.h"
#include "eldr/trace.h"

static const char RHO_HELP[] =
    "usage: eldr rho --trace T [--artifact A | --representation R [--idf on|off] [--layers all|LIST]]\n"
    "\n"
    "Spearman rank correlation, over request pairs, between the cosine distance of\n"
    "prefill signatures and that of decode patterns (decode counts, all layers).\n"
    "With --artifact the artifact's representation, IDF weights and layer mask are\n"
    "used unchanged (held-out evaluation); otherwise IDF is computed on T itself.\n"
    "Counts-form requests without decode_counts are skipped (a note says how many).\n"
    "\n"
    "  -t, --trace T           trace: JSONL file (per-token or counts form), directory\n"
    "                          of *.jsonl or glob; repeat for more        (required)\n"
    "  -a, --artifact FILE     routing artifact        [none: the options below]\n"
    "      --representation R  count|binary|gate|logit                     [count]\n"
    "      --idf M             on|off                                      [on]\n"
    "      --layers L          all | comma list of MoE layer ids           [all]\n"
    "      --max-pairs N       request pairs (0 = all)                     [200000]\n"
    "      --seed N            pair-sampling seed                          [0]\n"
    "      --known-fraction F  prefill signatures of the first F of each prompt's\n"
    "                          tokens (what is known before its prefill ends) [all]\n"
    "      --json              JSON output\n"
    "  -h, --help              this help\n";

int eldr_cmd_rho(int argc, char **argv) {
  const char *cmd = "rho";
  const char *art_path = NULL, *layers = "all";
  cli_trace_inputs tin = {0};
  eldr_repr repr = ELDR_REPR_COUNT;
  int idf_on = 1, json = 0, repr_given = 0;
  size_t max_pairs = 200000;
  uint64_t seed = 0;
  double known = -1;
  static const struct option lo[] = {
      {"trace", required_argument, 0, 't'}, {"artifact", required_argument, 0, 'a'},
      {"representation", required_argument, 0, 1}, {"idf", required_argument, 0, 2},
      {"layers", required_argument, 0, 3}, {"max-pairs", required_argument, 0, 4},
      {"seed", required_argument, 0, 5},   {"json", no_argument, 0, 6},
      {"known-fraction", required_argument, 0, 7},
      {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":t:a:h", lo, NULL)) != -1) {
    switch (c) {
    case 't': cli_trace_add(cmd, &tin, optarg); break;
    case 'a': art_path = optarg; break;
    case 1:
      if (eldr_repr_parse(optarg, &repr))
        cli_usage_error(cmd, "--representation: unknown '%s' (count|binary|gate|logit)", optarg);
      repr_given = 1;
      break;
    case 2:
      if (!strcmp(optarg, "on")) idf_on = 1;
      else if (!strcmp(optarg, "off")) idf_on = 0;
      else cli_usage_error(cmd, "--idf: unknown '%s' (on|off)", optarg);
      repr_given = 1;
      break;
    case 3: layers = optarg; repr_given = 1; break;
    case 4: max_pairs = (size_t)cli_parse_long(cmd, "--max-pairs", optarg, 0, 1L << 40); break;
    case 5: seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 6: json = 1; break;
    case 7: known = cli_parse_double(cmd, "--known-fraction", optarg, 0, 1); break;
    case 'h': fputs(RHO_HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s' (see --help)", argv[optind]);
  if (!tin.n) cli_usage_error(cmd, "--trace is required (see --help)");
  if (art_path && repr_given)
    cli_usage_error(cmd, "--artifact fixes the representation: drop --representation/--idf/--layers");

  cli_trace_expand(cmd, &tin);
  const char *trace_path = tin.label;
  eldr_diag d = {{0}};
  eldr_trace *t = cli_trace_load(cmd, &tin);
  int rc;
  const eldr_shape *s = &t->shape;
  const size_t LE = eldr_shape_cells(s);

  eldr_artifact *a = NULL;
  if (art_path) {
    rc = eldr_artifact_load(art_path, &a, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    if (a->shape.num_layers != s->num_layers || a->shape.num_experts != s->num_experts ||
        a->shape.top_k != s->top_k)
      cli_fail(cmd, "artifact %s is for %u layers x %u experts top-%u, trace %s has %u x %u top-%u",
               art_path, a->shape.num_layers, a->shape.num_experts, a->shape.top_k, trace_path,
               s->num_layers, s->num_experts, s->top_k);
  }

  /* requests with prefill selections (and, in the counts form, known decode
   * selections: rho compares prefill with decode) */
  size_t n = 0, no_decode = 0;
  for (size_t i = 0; i < t->n; i++) {
    const eldr_request *r = &t->req[i];
    if (!r->n_prefill) continue;
    if (eldr_request_is_counts(r) && !r->decode_counts) no_decode++;
    else n++;
  }
  if (no_decode)
    fprintf(stderr, "eldr %s: note: %zu counts-form requests without decode_counts skipped\n", cmd,
            no_decode);
  if (n < 2) cli_fail(cmd, "%s: %zu requests with prefill selections; rho needs at least 2", trace_path, n);
  uint32_t *pre = calloc(n * LE, sizeof *pre);
  uint32_t *dec = calloc(n * LE, sizeof *dec);
  float *decpat = calloc(n * LE, sizeof *decpat);
  float *idf = calloc(LE, sizeof *idf);
  float *gates = calloc(LE, sizeof *gates);
  uint8_t *mask = calloc(s->num_layers, 1);
  if (!pre || !dec || !decpat || !idf || !gates || !mask) cli_fail(cmd, "out of memory");
  size_t j = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (!t->req[i].n_prefill || (eldr_request_is_counts(&t->req[i]) && !t->req[i].decode_counts))
      continue;
    if (known >= 0 && eldr_request_is_counts(&t->req[i]))
      cli_fail(cmd, "%s: request '%s' is in counts form: --known-fraction needs per-token prefill rows",
               trace_path, t->req[i].id);
    if (known >= 0)
      (void)eldr_trace_request_prefix_counts(t, &t->req[i], known, pre + j * LE);
    else
      eldr_trace_request_counts(t, &t->req[i], 0, pre + j * LE);
    eldr_trace_request_counts(t, &t->req[i], 1, dec + j * LE);
    j++;
  }
  eldr_quality_decode_patterns(s, dec, n, decpat);

  eldr_sigspec spec;
  if (a) {
    eldr_artifact_sigspec(a, &spec);
  } else {
    if (!strcmp(layers, "all")) {
      memset(mask, 1, s->num_layers);
    } else {
      long *ids = NULL;
      size_t m = cli_parse_long_list(cmd, "--layers", layers, 0, 1L << 30, &ids);
      for (size_t i = 0; i < m; i++) {
        size_t l = 0;
        while (l < s->num_layers && t->layer_ids[l] != (uint32_t)ids[i]) l++;
        if (l == s->num_layers) cli_usage_error(cmd, "--layers: layer %ld is not a MoE layer of the trace", ids[i]);
        mask[l] = 1;
      }
      free(ids);
    }
    if (idf_on) eldr_idf_compute(s, pre, n, idf);
    spec = (eldr_sigspec){.shape = *s, .repr = repr, .idf = idf_on ? idf : NULL, .mask = mask};
  }
  size_t dim = eldr_signature_dim(&spec);
  float *sigs = calloc(n * dim, sizeof *sigs);
  if (!sigs) cli_fail(cmd, "out of memory");
  size_t empty = 0;
  j = 0;
  for (size_t i = 0; i < t->n; i++) {
    const eldr_request *r = &t->req[i];
    if (!r->n_prefill || (eldr_request_is_counts(r) && !r->decode_counts)) continue;
    const float *g = NULL;
    if (spec.repr == ELDR_REPR_GATE || spec.repr == ELDR_REPR_LOGIT) {
      if (eldr_request_is_counts(r))
        cli_fail(cmd, "%s: request '%s' is in the counts form (no per-token prefill_gates); "
                 "representation %s needs the per-token form", trace_path, r->id,
                 eldr_repr_name(spec.repr));
      if (known >= 0) cli_fail(cmd, "--known-fraction: representation %s is not supported (count or binary)", eldr_repr_name(spec.repr));
      if (!r->prefill_gates) cli_fail(cmd, "%s: request '%s' has no prefill_gates, needed by representation %s", trace_path, r->id, eldr_repr_name(spec.repr));
      memset(gates, 0, LE * sizeof *gates);
      for (size_t tok = 0; tok < r->n_prefill; tok++)
        for (size_t l = 0; l < s->num_layers; l++)
          for (size_t k = 0; k < s->top_k; k++) {
            size_t q = (tok * s->num_layers + l) * s->top_k + k;
            gates[l * s->num_experts + r->prefill[q]] += r->prefill_gates[q];
          }
      g = gates;
    }
    rc = eldr_signature_build(&spec, pre + j * LE, g, sigs + j * dim);
    if (rc == ELDR_EEMPTY) empty++;
    else if (rc) cli_fail(cmd, "signature of '%s': %s", r->id, eldr_strerror(rc));
    j++;
  }
  eldr_pairs_opts po = {.max_pairs = max_pairs, .seed = seed};
  double rho = 0;
  rc = eldr_quality_rho(sigs, dim, decpat, LE, n, &po, &rho);
  if (rc) cli_fail(cmd, "rho: %s", eldr_strerror(rc));
  size_t masked = 0;
  for (size_t l = 0; l < s->num_layers; l++) masked += spec.mask ? spec.mask[l] != 0 : 1;
  size_t pairs = n * (n - 1) / 2;
  if (max_pairs && pairs > max_pairs) pairs = max_pairs;
  char name[32];
  snprintf(name, sizeof name, "%s%s", eldr_repr_name(spec.repr), spec.idf ? "-idf" : "");
  if (json) {
    json_t *o = json_pack("{s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:f}", "trace", trace_path,
                          "representation", eldr_repr_name(spec.repr), "idf", spec.idf != NULL,
                          "mask_size", (json_int_t)masked, "requests", (json_int_t)n, "pairs",
                          (json_int_t)pairs, "empty_signatures", (json_int_t)empty, "rho", rho);
    if (art_path) json_object_set_new(o, "artifact", json_string(art_path));
    char *js = json_dumps(o, 0);
    puts(js);
    free(js);
    json_decref(o);
  } else
    printf("rho %.4f   (%s, %zu of %u layers%s, %zu requests, %zu pairs%s)\n", rho, name, masked,
           s->num_layers, a ? ", from artifact" : "", n, pairs, empty ? ", some empty signatures" : "");
  free(sigs);
  free(mask);
  free(gates);
  free(idf);
  free(decpat);
  free(dec);
  free(pre);
  eldr_artifact_free(a);
  eldr_trace_free(t);
  cli_trace_inputs_free(&tin);
  return 0;
}
