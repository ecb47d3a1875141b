/* eldr/reply_stream.h — routed_experts out of a streamed (SSE) reply, as the
 * router relays it chunk by chunk (docs/vllm.md, "Streams").
 *
 * What vLLM streams (read from its source; docs/vllm.md cites the files):
 * the chunks of /v1/completions and /v1/chat/completions carry no
 * routed_experts at all (CompletionResponseStreamChoice and
 * ChatCompletionResponseStreamChoice have no such field); the stream of the
 * disaggregated /inference/v1/generate endpoint (PR #44638) sets
 * GenerateResponseStreamChoice.routed_experts on the chunk of the output
 * that finished the request, the whole sequence's rows in the npy layout,
 * because the scheduler attaches routed_experts to a request's output only
 * when it stops (Scheduler.update_from_output, _get_routed_experts). A
 * decode worker patched to do the same on the OpenAI endpoints (the
 * emulator's --routed-experts-stream final) sends that final chunk too.
 *
 * An eldr_re_stream is fed the stream's bytes as they arrive, in any
 * split; it assembles events (a blank line ends one; "\r\n" line ends are
 * accepted), joins an event's "data:" lines, and keeps the payload of the
 * last event whose routed_experts is present and not null: a JSON document
 * the readers of eldr/reply_experts.h take (its "object" may be the
 * endpoint's chunk object, e.g. "chat.completion.chunk"). Events larger
 * than max bytes are skipped and counted, so a hostile stream costs at most
 * max bytes (plus the kept payload).
 *
 * Ownership: the stream owns its buffers; eldr_re_stream_take hands the
 * kept payload over (malloc'd, NUL-terminated). Errors: none (out of
 * memory skips the event, counted as dropped). Threads: one stream per
 * thread. */
#ifndef ELDR_REPLY_STREAM_H
#define ELDR_REPLY_STREAM_H

#include <stddef.h>
#include <stdint.h>

typedef struct eldr_re_stream {
  char *ev;              /* the event being assembled */
  size_t n, cap, line;   /* its bytes, capacity, start of its current line */
  int skipping;          /* the current event is over max: dropped up to its end */
  size_t max;            /* bytes an event may have */
  char *kept;            /* the last routed_experts payload (NUL-terminated), or NULL */
  size_t kept_n;
  uint64_t events, dropped; /* events seen; events skipped (over max, or no memory) */
} eldr_re_stream;

/* Start empty; events up to max bytes (0: 64 MiB). */
void eldr_re_stream_init(eldr_re_stream *s, size_t max);
void eldr_re_stream_feed(eldr_re_stream *s, const char *p, size_t n);
/* The kept payload and its length, or NULL. */
const char *eldr_re_stream_kept(const eldr_re_stream *s, size_t *len);
/* The kept payload handed over (the caller frees it), or NULL. */
char *eldr_re_stream_take(eldr_re_stream *s, size_t *len);
void eldr_re_stream_free(eldr_re_stream *s);

#endif
