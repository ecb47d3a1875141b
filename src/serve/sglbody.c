/* sglbody.c — the body both legs of an SGLang prefill/decode request carry
 * (serve_internal.h, eldr__sgl_leg_body): the client's JSON with the
 * bootstrap fields the router sets, as SGLang's gateway does
 * (sgl-model-gateway pd_router.rs, inject_bootstrap_into_value; docs/
 * sglang.md "The gateway's PD router"), with one difference said there:
 * a room per item (B prompts x n samples), never fewer. Pure; jansson. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

static const char *const k_boot[3] = {"bootstrap_host", "bootstrap_port", "bootstrap_room"};

/* B: the prompts of a completion's batch (an array of strings or of
 * token-id arrays), 1 for one prompt (a string, or one array of ids). */
static int batch_of(json_t *root, eldr__api api, uint32_t *b, eldr_diag *d) {
  *b = 1;
  if (api == ELDR__API_CHAT) return 0;
  if (api == ELDR__API_GENERATE) { /* GenerateReqInput: a list of texts, or of id lists */
    json_t *t = json_object_get(root, "text"), *ids = json_object_get(root, "input_ids");
    json_t *p = json_is_array(t) ? t : json_is_array(ids) && json_is_array(json_array_get(ids, 0)) ? ids : NULL;
    if (!p) return 0;
    size_t n = json_array_size(p);
    if (!n) return eldr_diag_fail(d, ELDR_EINVAL, "'%s' must not be an empty array", p == t ? "text" : "input_ids");
    *b = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    return 0;
  }
  json_t *p = json_object_get(root, "prompt");
  if (!json_is_array(p)) return 0;
  size_t n = json_array_size(p);
  if (!n) return eldr_diag_fail(d, ELDR_EINVAL, "'prompt' must not be an empty array");
  json_t *e0 = json_array_get(p, 0);
  if (json_is_string(e0) || json_is_array(e0)) *b = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
  return 0;
}

static int items_of(json_t *root, eldr__api api, uint32_t *items, eldr_diag *d) {
  uint32_t b = 1;
  json_int_t n = 1;
  if (!json_is_object(root)) return eldr_diag_fail(d, ELDR_EINVAL, "request body must be a JSON object");
  json_t *nv = json_object_get(root, "n");
  if (api == ELDR__API_GENERATE) { /* sampling_params.n (of the first entry: SGLang takes one n per request) */
    json_t *sp = json_object_get(root, "sampling_params");
    nv = json_object_get(json_is_array(sp) ? json_array_get(sp, 0) : sp, "n");
  }
  if (nv && !json_is_null(nv) && (!json_is_integer(nv) || (n = json_integer_value(nv)) < 1))
    return eldr_diag_fail(d, ELDR_EINVAL, "'n' must be a positive integer");
  int rc = batch_of(root, api, &b, d);
  if (rc) return rc;
  if ((uint64_t)b * (uint64_t)n > ELDR__SGL_MAX_ITEMS)
    return eldr_diag_fail(d, ELDR_EINVAL, "%u prompts x n %lld = %llu items: an SGLang PD request takes at most %d "
                          "(a bootstrap room each)", b, (long long)n, (unsigned long long)b * (unsigned long long)n,
                          ELDR__SGL_MAX_ITEMS);
  *items = b * (uint32_t)n;
  return 0;
}

static json_t *load(const char *body, size_t len, eldr_diag *d) {
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) eldr_diag_fail(d, ELDR_EPARSE, "request body is not valid JSON: %s", je.text);
  return root;
}

int eldr__sgl_items(const char *body, size_t len, eldr__api api, uint32_t *items, eldr_diag *d) {
  *items = 0;
  json_t *root = load(body, len, d);
  if (!root) return ELDR_EPARSE;
  int rc = items_of(root, api, items, d);
  json_decref(root);
  return rc;
}

/* o written as JSON into out (NUL-terminated, out->n its length): 0, or
 * ELDR_ENOMEM. */
static int put_json(json_t *o, size_t flags, eldr__buf *out, eldr_diag *d) {
  char *s = json_dumps(o, flags);
  size_t sl = s ? strlen(s) : 0; /* a string with \u0000 was refused by the load */
  if (!s || eldr__buf_reserve(out, sl)) {
    free(s);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  memcpy(out->p, s, sl + 1);
  out->n = sl;
  free(s);
  return 0;
}

static int leg_body(const char *body, size_t len, eldr__api api, const char *host, int port, const uint64_t *rooms,
                    uint32_t nrooms, int prefill, eldr__buf *out, eldr_diag *d) {
  uint32_t items = 0;
  json_t *root = load(body, len, d);
  if (!root) return ELDR_EPARSE;
  int rc = items_of(root, api, &items, d);
  if (!rc && (!host || !host[0] || !rooms || nrooms != items))
    rc = eldr_diag_fail(d, ELDR_EINVAL, "SGLang leg body: %u rooms for %u items, or no bootstrap host", nrooms, items);
  for (uint32_t i = 0; !rc && i < nrooms; i++)
    if (rooms[i] > (uint64_t)INT64_MAX) rc = eldr_diag_fail(d, ELDR_EINVAL, "bootstrap_room above 2^63-1");
  if (rc) {
    json_decref(root);
    return rc;
  }
  /* the client's own bootstrap fields never reach a worker */
  for (int k = 0; k < 3; k++) json_object_del(root, k_boot[k]);
  /* the prefill leg: answered whole (its one token is not the client's) and
   * with the prompt's routed experts, which the router reads */
  if (prefill && (json_object_set_new(root, "stream", json_false()) ||
                  json_object_set_new(root, "return_routed_experts", json_true()))) {
    json_decref(root);
    return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  }
  if (prefill) json_object_del(root, "stream_options");
  json_t *v[3] = {NULL, NULL, NULL};
  if (items == 1) {
    v[0] = json_string(host);
    v[1] = port > 0 ? json_integer(port) : json_null();
    v[2] = json_integer((json_int_t)rooms[0]);
  } else {
    for (int k = 0; k < 3; k++) v[k] = json_array();
    for (uint32_t i = 0; v[0] && v[1] && v[2] && i < items; i++) {
      if (json_array_append_new(v[0], json_string(host)) ||
          json_array_append_new(v[1], port > 0 ? json_integer(port) : json_null()) ||
          json_array_append_new(v[2], json_integer((json_int_t)rooms[i]))) {
        rc = ELDR_ENOMEM;
        break;
      }
    }
  }
  for (int k = 0; k < 3; k++) { /* set_new takes v[k] even when it fails */
    if (rc || !v[k] || json_object_set_new(root, k_boot[k], v[k])) {
      if (rc) json_decref(v[k]);
      rc = ELDR_ENOMEM;
    }
  }
  rc = rc ? eldr_diag_fail(d, ELDR_ENOMEM, "out of memory") : put_json(root, JSON_COMPACT, out, d);
  json_decref(root);
  return rc;
}

int eldr__sgl_leg_body(const char *body, size_t len, eldr__api api, const char *host, int port,
                       const uint64_t *rooms, uint32_t nrooms, eldr__buf *out, eldr_diag *d) {
  return leg_body(body, len, api, host, port, rooms, nrooms, 0, out, d);
}

int eldr__sgl_prefill_body(const char *body, size_t len, eldr__api api, const char *host, int port,
                           const uint64_t *rooms, uint32_t nrooms, eldr__buf *out, eldr_diag *d) {
  return leg_body(body, len, api, host, port, rooms, nrooms, 1, out, d);
}

/* One item: the prefill's meta_info.input_token_logprobs in front of the
 * decode's (both arrays): 1 merged, 0 not (either absent or not an array). */
static int merge_item(json_t *pre, json_t *dec) {
  json_t *pl = json_object_get(json_object_get(pre, "meta_info"), "input_token_logprobs");
  json_t *dl = json_object_get(json_object_get(dec, "meta_info"), "input_token_logprobs");
  if (!json_is_array(pl) || !json_is_array(dl)) return 0;
  json_t *m = json_copy(pl); /* shallow: the entries are shared */
  if (!m) return -1;
  if (json_array_extend(m, dl)) {
    json_decref(m);
    return -1;
  }
  return json_object_set_new(json_object_get(dec, "meta_info"), "input_token_logprobs", m) ? -1 : 1; /* takes m */
}

int eldr__sgl_merge_logprobs(const char *pre, size_t pn, const char *dec, size_t dn, eldr__buf *out, eldr_diag *d) {
  json_t *p = json_loadb(pre, pn, 0, NULL), *q = p ? json_loadb(dec, dn, 0, NULL) : NULL;
  int rc = 0;
  if (json_is_object(p) && json_is_object(q)) {
    rc = merge_item(p, q);
  } else if (json_is_array(p) && json_is_array(q) && json_array_size(p) == json_array_size(q)) {
    for (size_t i = 0; rc >= 0 && i < json_array_size(q); i++) {
      int k = merge_item(json_array_get(p, i), json_array_get(q, i));
      rc = k < 0 ? k : rc + k;
    }
  }
  rc = rc > 0 ? put_json(q, JSON_COMPACT | JSON_PRESERVE_ORDER, out, d)
       : rc < 0 ? eldr_diag_fail(d, ELDR_ENOMEM, "out of memory")
                : 1;
  json_decref(p);
  json_decref(q);
  return rc;
}
