/* engines.h — `eldr worker` engines as separate processes for the serve
 * tests that stop, continue or outlive them (SIGSTOP hangs, rolling
 * restarts): each is the eldr binary a user runs, on its own port.
 *
 * Ownership: the engines started are kept in a table (at most ENG_MAX) and
 * eng_stop_all SIGCONTs, SIGTERMs (SIGKILL after 3 s) and reaps every one;
 * call it from a cmocka teardown so a failed test leaves none behind.
 * Errors: a start that fails fails the calling test (fail_msg).
 * Threads: the test's thread only. */
#ifndef ELDR_TEST_ENGINES_H
#define ELDR_TEST_ENGINES_H

#include <sys/types.h>

#define ENG_MAX 16

/* `eldr worker --role ROLE --port 0 --time-scale SCALE --max-num-seqs SEQS`;
 * its port (read from the line it prints); *pid its process. */
int eng_start(const char *role, const char *scale, const char *max_seqs, pid_t *pid);
/* "http://127.0.0.1:PORT" into buf (cap >= 32). */
const char *eng_url(int port, char *buf, size_t cap);
/* Stop and reap every engine started. */
void eng_stop_all(void);

/* One streamed completion through a router, read to its end. */
typedef struct eng_stream {
  int status;   /* HTTP status; 504 / 502 for a stream ended by an error event; -1: no answer */
  int tokens;   /* token events (non-empty "text") */
  int done;     /* "data: [DONE]" and no error event */
  int engine;   /* the decoder's port from eldr_engine_id ("eldr-decode-<port>"), 0 unknown */
  double t_end; /* fx_now() when the answer was complete */
  char err[200];
} eng_stream;
/* POST /v1/completions {"prompt": prompt, "max_tokens": n, "stream": true}
 * to 127.0.0.1:port, the answer awaited up to timeout_s. */
void eng_stream_post(int port, const char *prompt, int max_tokens, double timeout_s, eng_stream *out);

#endif
