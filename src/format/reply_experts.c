/* reply_experts.c — routed_experts of a whole vLLM reply, every layout (see
 * eldr/reply_experts.h): the reply's choices, the prompt / generated split,
 * the layer plan, the id checks and counting. The JSON is a jansson tree or
 * the byte scanner's spans (one reader over both, the jv_* accessors of
 * reply_experts_int.h); each routed_experts value is read by
 * reply_values.c, and both share reply_check.c's buffers, shape checks,
 * layer plan and id checks. */
#include "eldr/reply_experts.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/jscan.h"
#include "eldr/routed_experts.h"
#include "reply_experts_int.h"
#include "reply_layers_int.h"

static const char *const layout_names[] = {"none", "npy", "v021-lists", "v021-base64", "lists", "compact"};

const char *eldr_re_layout_name(eldr_re_layout l) {
  return (unsigned)l < sizeof layout_names / sizeof *layout_names ? layout_names[l] : "unknown";
}

int eldr_re_layout_parse(const char *s, eldr_re_layout *out) {
  for (int i = 1; i < (int)(sizeof layout_names / sizeof *layout_names); i++)
    if (s && !strcmp(s, layout_names[i])) {
      *out = (eldr_re_layout)i;
      return 0;
    }
  return -1;
}

static const char *const reason_names[ELDR_RE__N] = {
    "ok",           "not_json",        "wrong_object",       "no_choices",  "bad_type",
    "bad_base64",   "bad_npy",         "unknown_dtype",      "unknown_encoding",
    "bad_shape",    "shape_mismatch",  "length_mismatch",    "rows_exceed_tokens",
    "negative_id",  "id_out_of_range", "too_large",          "out_of_memory", "bad_counts"};

const char *eldr_re_reason_name(eldr_re_reason r) {
  return (unsigned)r < ELDR_RE__N ? reason_names[r] : "unknown";
}

/* The view without its first k rows (its first_token moves with them). */
static void view_skip(eldr_re_view *v, size_t k) {
  if (!k) return;
  v->data = (const uint8_t *)v->data + k * v->layers * v->top_k * eldr_sel_dtype_size(v->dtype);
  v->rows -= k;
  v->first_token += k;
}

static int64_t int_field(jv o, const char *k) {
  jv x = jv_get(o, k);
  return jv_type(x) == JV_INTEGER && jv_int(x) >= 0 ? jv_int(x) : -1;
}

/* Generated tokens of a choice: its token_ids' length, or the usage's
 * completion_tokens when there is one choice; -1 when unknown. */
static int64_t gen_tokens(jv usage, jv token_ids, size_t nchoices) {
  if (jv_type(token_ids) == JV_ARRAY) return (int64_t)jv_len(token_ids);
  return nchoices == 1 ? int_field(usage, "completion_tokens") : -1;
}

/* npy layout: cut the one array into prompt rows and generated rows. The
 * rows end at the last forwarded token (P + G - 1). */
static int split_npy(rctx *c, const eldr_re_view *all, int64_t P, int64_t G, eldr_re_choice *ch) {
  size_t R = all->rows, gen = eldr__re_gen_rows(R, P, G);
  if (P >= 0 && G >= 0) {
    if (R - gen > (size_t)P)
      return FAILF(c, ELDR_RE_ROWS_EXCEED_TOKENS, ELDR_ESHAPE,
                   "choices[%lld].routed_experts: %zu rows, but %lld prompt + %lld generated tokens "
                   "have at most %lld",
                   (long long)ch->index, R, (long long)P, (long long)G, (long long)(P + G - 1));
  }
  const size_t rowb = all->layers * all->top_k * eldr_sel_dtype_size(all->dtype);
  ch->prompt = *all;
  ch->prompt.rows = R - gen;
  ch->prompt.first_token = P >= 0 ? (size_t)P - ch->prompt.rows : 0;
  if (ch->prompt.rows == 0) ch->prompt.data = NULL;
  ch->generated = *all;
  ch->generated.rows = gen;
  ch->generated.data = gen ? (const uint8_t *)all->data + (R - gen) * rowb : NULL;
  return 0;
}

static const char *api_object(eldr_re_api a) {
  return a == ELDR_RE_CHAT ? "chat.completion" : "text_completion";
}

static int read_body(rctx *c, jv root) {
  eldr_reply_experts *out = c->out;
  static const char *const rkeys[4] = {"object", "choices", "usage", "prompt_routed_experts"};
  jv rf[4];
  jv_getn(root, rkeys, 4, rf);
  const jv obj = rf[0], choices = rf[1], usage = rf[2], pre = rf[3];
  if (jv_type(obj) == JV_STRING) {
    const char *os;
    size_t on;
    int rc = eldr__re_jv_str(c, "reply", obj, &os, &on);
    if (rc) return rc;
    const size_t an = strlen(api_object(c->o.api)); /* the endpoint's object, or its stream chunk's */
    if (!str_is(os, on, api_object(c->o.api)) &&
        !(on == an + 6 && !memcmp(os, api_object(c->o.api), an) && !memcmp(os + an, ".chunk", 6)))
      return FAILF(c, ELDR_RE_WRONG_OBJECT, ELDR_EPARSE, "reply object '%.*s' is not %s", (int)(on < 40 ? on : 40),
                   os, api_object(c->o.api));
  }
  if (jv_type(choices) != JV_ARRAY)
    return fail(c, ELDR_RE_NO_CHOICES, ELDR_EPARSE, "reply", "'choices' missing or not a list");
  const size_t nc = jv_len(choices);
  out->prompt_tokens = int_field(usage, "prompt_tokens");
  out->choices = calloc(nc ? nc : 1, sizeof *out->choices);
  if (!out->choices) return fail(c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, "reply", "out of memory");
  out->nchoices = nc;
  const int64_t P = out->prompt_tokens;
  eldr_re_layout lay = ELDR_RE_LAYOUT_NONE, vl = ELDR_RE_LAYOUT_NONE;
  /* the split layouts: the prompt's rows, shared by every choice */
  eldr_re_view prompt;
  const bool has_prompt_key = jv_type(pre) != JV_ABSENT;
  /* counting: the first choice's prompt rows are counted where they are
   * range-checked, so no separate pass reads them */
  uint32_t *counts = c->o.counts && c->o.num_layers && c->o.top_k && c->o.num_experts ? c->o.counts : NULL;
  int rc = eldr__re_read_value(c, "prompt_routed_experts", pre, &prompt, &vl, !counts);
  if (rc) return rc;
  /* c->skip: the prompt's rows the caller holds are not counted, and left
   * out of the first choice's view (the other choices share them: checked) */
  const size_t k0 = counts && prompt.data && nc ? eldr__re_skip_rows(c, prompt.rows, 0, P) : 0;
  if (counts && prompt.data) {
    if ((rc = eldr__re_check_rows(c, "prompt_routed_experts", &prompt, 0, k0, NULL)) ||
        (rc = eldr__re_check_rows(c, "prompt_routed_experts", &prompt, k0, prompt.rows - k0, counts)))
      return rc;
    out->counted = nc > 0;
  }
  if (prompt.data || jv_type(pre) == JV_ARRAY) {
    if (vl == ELDR_RE_LAYOUT_NPY)
      return fail(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, "prompt_routed_experts",
                  "must be a list or an encoding/dtype/shape/data object");
    if (P >= 0 && prompt.rows > (size_t)P)
      return FAILF(c, ELDR_RE_ROWS_EXCEED_TOKENS, ELDR_ESHAPE,
                   "prompt_routed_experts: %zu rows for %lld prompt tokens", prompt.rows,
                   (long long)P);
    prompt.first_token = P >= 0 ? (size_t)P - prompt.rows : 0;
    if (!prompt.rows) prompt.data = NULL;
    lay = vl;
  }
  jv_iter ci;
  jv ch;
  jv_elems(choices, &ci);
  for (size_t i = 0; i < nc && jv_next(&ci, &ch); i++) {
    eldr_re_choice *oc = &out->choices[i];
    oc->index = (int64_t)i;
    if (jv_type(ch) != JV_OBJECT)
      return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE, "choices[%zu] is not an object", i);
    static const char *const ckeys[3] = {"index", "routed_experts", "token_ids"};
    jv cf[3];
    jv_getn(ch, ckeys, 3, cf);
    if (jv_type(cf[0]) == JV_INTEGER) oc->index = jv_int(cf[0]);
    char what[48];
    snprintf(what, sizeof what, "choices[%zu].routed_experts", i);
    eldr_re_view v;
    vl = ELDR_RE_LAYOUT_NONE;
    /* the first choice of a whole-sequence layout: counted below */
    const int count0 = counts && i == 0 && !has_prompt_key;
    const int64_t G = gen_tokens(usage, cf[2], nc);
    c->sk_on = count0 && c->skip;
    c->sk_done = 0;
    c->sk_P = P;
    c->sk_G = G;
    rc = eldr__re_read_value(c, what, cf[1], &v, &vl, !count0);
    c->sk_on = 0;
    if (rc) return rc;
    /* c->skip: the prompt's rows the caller holds are left out (read_npy
     * did already; any other layout here) */
    if (count0 && v.data && !c->sk_done && G >= 0) { /* (an unknown G splits by the row count: kept) */
      view_skip(&v, eldr__re_skip_rows(c, v.rows, eldr__re_gen_rows(v.rows, P, G), P));
      v.first_token = 0; /* a whole-sequence array: the split below places its rows */
    }
    if (count0 && v.data) { /* its prompt rows counted, the generated ones checked */
      size_t pr = v.rows - eldr__re_gen_rows(v.rows, P, G);
      if ((rc = eldr__re_check_rows(c, what, &v, 0, pr, counts)) ||
          (rc = eldr__re_check_rows(c, what, &v, pr, v.rows - pr, NULL)))
        return rc;
      out->counted = 1;
    }
    if (vl != ELDR_RE_LAYOUT_NONE && lay != ELDR_RE_LAYOUT_NONE && vl != lay)
      return FAILF(c, ELDR_RE_BAD_TYPE, ELDR_EPARSE,
                   "%s is %s but the reply's other routed_experts are %s", what,
                   eldr_re_layout_name(vl), eldr_re_layout_name(lay));
    /* without a prompt_routed_experts key (npy, or the lists of vLLM PR
     * #38939) the choice's array covers the whole sequence */
    if (vl == ELDR_RE_LAYOUT_V021_LISTS && !has_prompt_key) vl = ELDR_RE_LAYOUT_LISTS;
    if (vl != ELDR_RE_LAYOUT_NONE && (vl == ELDR_RE_LAYOUT_NPY || !has_prompt_key)) {
      if ((rc = split_npy(c, &v, P, gen_tokens(usage, cf[2], nc), oc))) return rc;
    } else {
      oc->prompt = prompt;
      if (i == 0) view_skip(&oc->prompt, k0);
      oc->generated = v;
      if (!v.rows) oc->generated.data = NULL;
    }
    if (lay == ELDR_RE_LAYOUT_NONE) lay = vl;
    if (oc->prompt.data && oc->generated.data &&
        (oc->prompt.layers != oc->generated.layers || oc->prompt.top_k != oc->generated.top_k))
      return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                   "%s: %zu layers x top-%zu, but prompt_routed_experts are %zu x top-%zu", what,
                   oc->generated.layers, oc->generated.top_k, oc->prompt.layers,
                   oc->prompt.top_k);
  }
  out->layout = lay;
  /* counted: the first choice has prompt rows, and they went through counts */
  out->counted = out->counted && nc && out->choices[0].prompt.data != NULL;
  return 0;
}

/* The read of an object value (tree or span) into out. */
static int read_root_skip(jv root, const eldr_re_opts *opts, size_t skip, eldr_reply_experts *out,
                          eldr_re_reason *why, eldr_diag *d) {
  if (why) *why = ELDR_RE_OK;
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "reply_experts: argument missing");
  memset(out, 0, sizeof *out);
  out->prompt_tokens = -1;
  rctx c = {.out = out, .why = ELDR_RE_OK, .d = d, .skip = skip};
  if (opts) c.o = *opts;
  if (c.o.scratch) c.o.scratch->used = 0;
  int rc = jv_type(root) == JV_OBJECT ? read_body(&c, root)
                                      : fail(&c, ELDR_RE_NOT_JSON, ELDR_EPARSE, "reply", "not a JSON object");
  if (!rc && c.nkeep) { /* the model layers the views hold */
    uint32_t *ids = eldr__re_own(&c, c.nkeep * sizeof *ids);
    if (ids) {
      memcpy(ids, c.keep, c.nkeep * sizeof *ids);
      out->layer_ids = ids;
    } else {
      rc = fail(&c, ELDR_RE_NO_MEMORY, ELDR_ENOMEM, "reply", "out of memory");
    }
  }
  if (rc) {
    eldr_reply_experts_free(out);
    out->prompt_tokens = -1;
  }
  if (c.o.scratch) c.o.scratch->used = 0; /* the next read starts at slot 0 again */
  if (why) *why = c.why;
  return rc;
}

static int read_root(jv root, const eldr_re_opts *opts, eldr_reply_experts *out, eldr_re_reason *why,
                     eldr_diag *d) {
  return read_root_skip(root, opts, 0, out, why, d);
}

static int not_json(eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d, const char *msg, int col) {
  if (out) {
    memset(out, 0, sizeof *out);
    out->prompt_tokens = -1;
  }
  if (why) *why = ELDR_RE_NOT_JSON;
  return col >= 0 ? eldr_diag_fail(d, ELDR_EPARSE, "reply is not JSON: %s (column %d)", msg, col)
                  : eldr_diag_fail(d, ELDR_EPARSE, "reply is not JSON: %s", msg);
}

int eldr_reply_experts_read(const char *body, size_t len, const eldr_re_opts *opts,
                            eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d) {
  json_error_t je;
  memset(&je, 0, sizeof je);
  json_t *root = body || !len ? json_loadb(body ? body : "", len, 0, &je) : NULL;
  if (!root) return not_json(out, why, d, je.text[0] ? je.text : "body missing", je.column);
  int rc = eldr_reply_experts_from_json(root, opts, out, why, d);
  json_decref(root);
  return rc;
}

int eldr_reply_experts_from_json(const void *root, const eldr_re_opts *opts,
                                 eldr_reply_experts *out, eldr_re_reason *why, eldr_diag *d) {
  return read_root((jv){(json_t *)root, NULL, {0, 0, ELDR_JS_NONE}, NULL}, opts, out, why, d);
}

int eldr_reply_experts_scan(const char *body, size_t len, const eldr_re_opts *opts, eldr_reply_experts *out,
                            eldr_re_reason *why, eldr_diag *d) {
  eldr_js_span root;
  eldr_diag sd;
  sd.msg[0] = '\0';
  if (!body || eldr_js_scan(body, len, NULL, 0, NULL, &root, &sd))
    return not_json(out, why, d, body ? sd.msg : "body missing", -1);
  return read_root((jv){NULL, body, root, NULL}, opts, out, why, d);
}

int eldr_reply_experts_scanned(const char *doc, size_t len, const eldr_re_opts *opts, eldr_js_span known,
                               eldr_reply_experts *out,
                               eldr_re_reason *why, eldr_diag *d) {
  return eldr_reply_experts_scanned_skip(doc, len, opts, known, 0, out, why, d);
}

int eldr_reply_experts_scanned_skip(const char *doc, size_t len, const eldr_re_opts *opts, eldr_js_span known,
                                    size_t skip_tokens, eldr_reply_experts *out, eldr_re_reason *why,
                                    eldr_diag *d) {
  size_t a = 0, b = len; /* the top-level value: the document less its surrounding whitespace */
  while (a < b && (doc[a] == ' ' || doc[a] == '\t' || doc[a] == '\n' || doc[a] == '\r')) a++;
  while (b > a && (doc[b - 1] == ' ' || doc[b - 1] == '\t' || doc[b - 1] == '\n' || doc[b - 1] == '\r')) b--;
  const eldr_js_type t = a < b && doc[a] == '{' ? ELDR_JS_OBJECT : ELDR_JS_NULL; /* only an object is read */
  const int k = known.type == ELDR_JS_STRING && known.len >= 2 && known.off >= a && known.off + known.len <= b;
  return read_root_skip((jv){NULL, doc, {a, b - a, t}, k ? &known : NULL}, opts,
                        opts && opts->counts ? skip_tokens : 0, out, why, d);
}

void eldr_re_scratch_trim(eldr_re_scratch *s, size_t keep) {
  if (!s) return;
  for (size_t i = 0; i < ELDR_RE_SCRATCH_SLOTS; i++)
    if (s->slot[i].cap > keep || !keep) {
      free(s->slot[i].p);
      s->slot[i].p = NULL;
      s->slot[i].cap = 0;
    }
}

void eldr_re_scratch_free(eldr_re_scratch *s) {
  eldr_re_scratch_trim(s, 0);
  if (s) s->used = 0;
}

void eldr_reply_experts_free(eldr_reply_experts *r) {
  if (!r) return;
  for (size_t i = 0; i < r->nbufs; i++) free(r->bufs[i]);
  free(r->bufs);
  free(r->choices);
  memset(r, 0, sizeof *r);
}
