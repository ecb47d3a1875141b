/* proc.h — run a program (usually the eldr binary) from a test, as a user
 * would: stdout and stderr to files, exit status back.
 *
 * Ownership: paths and argv are the caller's; eldr_test_slurp returns a
 * malloc'd NUL-terminated buffer the caller frees. Failures to spawn or to
 * wait abort the test through cmocka. */
#ifndef ELDR_TEST_PROC_H
#define ELDR_TEST_PROC_H

#include <stddef.h>

/* Run argv[0] with argv (NULL-terminated) and stdout/stderr written to
 * out_path/err_path (truncated; NULL = /dev/null). Returns the exit status,
 * or 128 + signal number when it was killed. */
int eldr_test_run(const char *const *argv, const char *out_path, const char *err_path);

/* eldr_test_run with argv = {binary, args[0], args[1], ...} (args
 * NULL-terminated, at most 62 entries). */
int eldr_test_run_args(const char *binary, const char *const *args, const char *out_path,
                       const char *err_path);

/* Run binary with args, its stdout and stderr through
 * dir/stdout and dir/stderr (left there), into out and err (NUL-terminated,
 * truncated). Returns what eldr_test_run returns. */
int eldr_test_run_captured(const char *binary, const char *dir, const char *const *args, char *out, size_t out_cap,
                           char *err, size_t err_cap);

/* The eldr binary a test runs: $ELDR_BINARY when set and not empty, else
 * the build's (ELDR_BINARY, compiled in). */
const char *eldr_test_binary(void);

/* Run eldr_test_binary() with the arguments first, ... (NULL-terminated, at
 * most 62) as eldr_test_run does. */
int eldr_test_eldr(const char *out_path, const char *err_path, const char *first, ...);

/* Remove path and everything below it (files, directories; links are not
 * followed). 0, also when path does not exist; -1 when something could not
 * be removed. */
int eldr_test_rmtree(const char *path);

/* Write text to path (created or truncated); fails the test when it cannot. */
void eldr_test_write(const char *path, const char *text);

/* Read a whole file; NULL when it cannot be read. *len (optional) = bytes. */
char *eldr_test_slurp(const char *path, size_t *len);

/* tests/fixtures/vllm/NAME of the source tree, read whole (malloc'd,
 * NUL-terminated); fails the test when it cannot be read. */
char *eldr_test_vllm_fixture(const char *name);

/* Read a file into buf (cap bytes, NUL-terminated, truncated); "" on error. */
void eldr_test_read_into(const char *path, char *buf, size_t cap);

#endif
