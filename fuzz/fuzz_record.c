/* fuzz_record.c — libFuzzer target for what serve --record reads from a
 * worker: the decode reply body a record carries (parsed on the writer
 * thread for its generated rows and usage: src/serve/record.c) and the
 * usage scan of a streamed decode reply.
 *
 * The input is the decode reply of a request of shape L=2, E=4, K=2 with
 * a 3-token prompt (completions and chat). The line must come out as one
 * JSON object ending in a newline whose decode_counts, when present, hold
 * rows summing to decode_tokens * K; the usage scan must return the input's
 * last well-formed completion_tokens or the previous value. Else abort. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/record.h"

static void check_line(const char *line, size_t len) {
  if (!len || line[len - 1] != '\n') abort();
  json_t *o = json_loadb(line, len - 1, 0, NULL);
  if (!o) abort();
  json_t *dc = json_object_get(o, "decode_counts");
  json_int_t dt = json_integer_value(json_object_get(o, "decode_tokens"));
  if (dc && !json_is_null(dc)) {
    if (json_array_size(dc) != 2) abort();
    for (size_t l = 0; l < 2; l++) {
      json_t *row = json_array_get(dc, l);
      json_int_t sum = 0;
      for (size_t e = 0; e < json_array_size(row); e++) sum += json_integer_value(json_array_get(row, e));
      if (json_array_size(row) != 4 || sum != dt * 2) abort();
    }
  }
  json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const eldr_shape sh = {2, 4, 2};
  for (int chat = 0; chat < 2; chat++) {
    eldr__rec_item *it = eldr__rec_item_new(&sh, NULL);
    if (!it) return 0;
    it->prefill_counts = calloc(8, sizeof *it->prefill_counts);
    it->decode_body = malloc(size ? size : 1);
    if (!it->prefill_counts || !it->decode_body) {
      eldr__rec_item_free(it);
      return 0;
    }
    for (int l = 0; l < 2; l++) it->prefill_counts[l * 4] = it->prefill_counts[l * 4 + 1] = 3;
    it->prefill_tokens = 3;
    memcpy(it->decode_body, data, size);
    it->decode_len = size;
    it->chat = chat;
    char *line = NULL;
    size_t len = 0;
    int rc = eldr__rec_format(it, &line, &len);
    if (rc == 0) check_line(line, len);
    else if (rc != ELDR_ENOMEM) abort();
    free(line);
    eldr__rec_item_free(it);
  }
  int64_t v = eldr__rec_scan_usage((const char *)data, size, -7);
  if (v < -7 || (v != -7 && v < 0)) abort();
  return 0;
}
