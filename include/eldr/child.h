/* eldr/child.h — start a child program with an argv (fork + exec, never a
 * shell), wire its standard streams, and wait for it with a bound.
 *
 * Used by the gnuplot launcher (eldr/plot.h) and the local-cluster
 * supervisor (eldr/cluster.h). Everything the child needs (argv, paths) is
 * prepared by the caller before the fork; between fork and exec the child
 * calls only async-signal-safe functions, so spawning from a process with
 * threads is safe. An exec failure ends the child with status 127
 * (eldr_child_wait reports it as exit code 127: "not found").
 *
 * Ownership: argv and paths are borrowed for the call. A pipe end handed
 * back (*stdin_fd) belongs to the caller, who closes it.
 * Threads: any thread; no globals.
 */
#ifndef ELDR_CHILD_H
#define ELDR_CHILD_H

#include <sys/types.h>

#include "eldr/error.h"

typedef struct eldr_child_opts {
  int stdin_pipe;          /* 1: the child's stdin is a pipe; its write end goes to *stdin_fd */
  int stdout_fd;           /* >= 0: the child's stdout (dup'd); -1: see stdout_path */
  const char *stdout_path; /* with stdout_fd < 0: created/truncated file; NULL: inherited */
  int stdout_null;         /* with stdout_fd < 0 and no stdout_path: /dev/null */
  const char *stderr_path; /* appended to (created); NULL: inherited */
  int stderr_to_stdout;    /* 1: stderr goes where stdout goes (after the redirection) */
  int close_fd;            /* >= 0: closed in the child (the parent's end of a pipe) */
  pid_t pgid;              /* -1: the parent's group; 0: a new group led by the child;
                              > 0: join that group */
  int pdeath_signal;       /* > 0: signal the child gets when its parent dies (Linux) */
  int default_signals;     /* 1: SIGINT, SIGTERM, SIGHUP, SIGPIPE back to SIG_DFL */
} eldr_child_opts;

/* No redirections, the parent's group, no parent-death signal. */
void eldr_child_opts_default(eldr_child_opts *o);

/* Start argv[0] with argv (NULL-terminated); argv[0] without '/' is looked
 * up on PATH. *pid = the child. With o->stdin_pipe, *stdin_fd = the write
 * end of the child's stdin (close-on-exec). Returns 0, ELDR_EINVAL (no
 * argv), ELDR_EIO (pipe/fork failed; d says why). */
int eldr_child_spawn(char *const argv[], const eldr_child_opts *o, pid_t *pid, int *stdin_fd,
                     eldr_diag *d);

/* Wait for pid (EINTR is retried). timeout_s < 0 waits forever; otherwise
 * returns ELDR_ETIMEOUT when it is still running after timeout_s (it is not
 * killed). *code = exit status, or 128 + signal when killed by a signal.
 * Returns 0 or ELDR_EIO (not our child). */
int eldr_child_wait(pid_t pid, double timeout_s, int *code);

/* SIGTERM, wait up to grace_s, then SIGKILL; always reaps. */
void eldr_child_stop(pid_t pid, double grace_s);

#endif
