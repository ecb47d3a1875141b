/* sgl_gen.c — the emulated SGLang engine's native /generate replies (sgl.h):
 * an item as SGLang's tokenizer manager builds it (tokenizer_manager.py,
 * _handle_batch_output: text, meta_info), its input log probabilities, and
 * the route's error body (http_server.py, generate_request). Pure over the
 * group; the worker's event loop. */
#include "worker/worker_impl.h"

/* /generate's errors (http_server.py, generate_request's ValueError):
 * {"error": {"message": ...}} with the status. */
void eldr__sgl_gen_error(struct evhttp_request *req, int code, const char *msg) {
  json_t *e = json_pack("{s:{s:s}}", "error", "message", msg);
  eldr__w_send_json(req, code, code >= 500 ? "Internal Server Error" : code == 404 ? "Not Found" : "Bad Request",
                    e ? e : json_object());
}

/* meta_info.input_token_logprobs of prompt p: [logprob, token id, null] per
 * prompt token (the text is null without return_text_in_logprobs), the
 * first token's logprob null (nothing precedes it). A PD prefill computes
 * them; a PD decode never ran the prompt and sends none ([]), which the
 * gateway's merge_logprobs_in_json puts after the prefill's. The values
 * are the emulator's: a hash of the token and its predecessor. */
static json_t *input_logprobs(const sgl_group *g, uint32_t p) {
  json_t *a = json_array();
  if (!a || g->w->role == ELDR_WORKER_DECODE || !g->lp_ids || !g->lp_ids[p]) return a;
  for (uint32_t t = 0; t < g->lp_n[p]; t++) {
    uint32_t id = g->lp_ids[p][t];
    uint64_t h = ((uint64_t)(t ? g->lp_ids[p][t - 1] : 0) << 32 | id) * 0x9e3779b97f4a7c15ull;
    json_t *lp = t ? json_real(-(double)(h >> 54) / 64.0 - 1.0 / 128) : json_null(); /* exact in binary */
    json_array_append_new(a, json_pack("[o,I,n]", lp, (json_int_t)id));
  }
  return a;
}

/* One item of a /generate reply (tokenizer_manager.py, _handle_batch_output's
 * out_dict: text, meta_info with id, finish_reason (FINISH_LENGTH's
 * {"type": "length", "length": max_new_tokens}, FINISH_MATCHED_TOKEN's
 * {"type": "stop", "matched": ...}; null while streaming), prompt_tokens,
 * completion_tokens, cached_tokens; routed_experts, from the capturer, the
 * first item's only here). Its text is the whole output so far (SGLang's
 * default, without --incremental-streaming-output). */
json_t *eldr__sgl_gen_item(const sgl_group *g, uint32_t i, int final) {
  char id[100];
  if (g->as_list) snprintf(id, sizeof id, "%s_%u", g->rid, i);
  else snprintf(id, sizeof id, "%s", g->rid);
  json_t *fin = !final ? json_null()
                : g->capped[i] ? json_pack("{s:s,s:I}", "type", "length", "length", (json_int_t)g->emitted[i])
                               : json_pack("{s:s,s:n}", "type", "stop", "matched");
  json_t *meta = json_pack("{s:s,s:o,s:I,s:I,s:i,s:s}", "id", id, "finish_reason", fin, "prompt_tokens",
                           (json_int_t)g->n_prompt[i % g->nprompts], "completion_tokens", (json_int_t)g->emitted[i],
                           "cached_tokens", 0, "weight_version", "default");
  if (meta && final && i == 0 && g->return_re && g->re_b64)
    json_object_set_new(meta, "routed_experts", json_string(g->re_b64));
  if (meta && final && g->return_lp) json_object_set_new(meta, "input_token_logprobs", input_logprobs(g, i % g->nprompts));
  json_t *o = meta ? json_pack("{s:s,s:o}", "text", g->texts[i] ? g->texts[i] : "", "meta_info", meta) : NULL;
  if (o && g->stream && g->as_list) json_object_set_new(o, "index", json_integer(i)); /* a batch's stream */
  return o;
}

