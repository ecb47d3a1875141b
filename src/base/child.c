/* child.c — fork + exec with redirections (see eldr/child.h). */
#include "eldr/child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void eldr_child_opts_default(eldr_child_opts *o) {
  memset(o, 0, sizeof *o);
  o->stdout_fd = -1;
  o->close_fd = -1;
  o->pgid = -1;
}

/* In the child, between fork and exec: async-signal-safe calls only. */
_Noreturn static void child_exec(const char *path, char *const argv[], const eldr_child_opts *o,
                                 const int in[2]) {
  if (o->pgid >= 0) setpgid(0, o->pgid);
  if (o->pdeath_signal > 0) prctl(PR_SET_PDEATHSIG, o->pdeath_signal);
  if (o->default_signals) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
  }
  if (in[0] >= 0) {
    dup2(in[0], 0);
    close(in[0]);
    close(in[1]);
  }
  if (o->stdout_fd >= 0) {
    if (o->stdout_fd != 1) {
      dup2(o->stdout_fd, 1);
      close(o->stdout_fd);
    }
  } else if (o->stdout_path || o->stdout_null) {
    int f = open(o->stdout_path ? o->stdout_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (f >= 0 && f != 1) {
      dup2(f, 1);
      close(f);
    }
  }
  if (o->close_fd >= 0) close(o->close_fd);
  if (o->stderr_path) {
    int f = open(o->stderr_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (f >= 0 && f != 2) {
      dup2(f, 2);
      close(f);
    }
  } else if (o->stderr_to_stdout) {
    dup2(1, 2);
  }
  execv(path, argv);
  _exit(127);
}

/* argv0 looked up on PATH (when it has no '/') into buf, in the parent:
 * execvp is not async-signal-safe. Not found: argv0 itself (exec fails, 127). */
static const char *resolve(const char *argv0, char *buf, size_t cap) {
  if (strchr(argv0, '/')) return argv0;
  const char *path = getenv("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *p = path; *p;) {
    size_t n = strcspn(p, ":");
    int k = n ? snprintf(buf, cap, "%.*s/%s", (int)n, p, argv0) : snprintf(buf, cap, "./%s", argv0);
    if (k > 0 && (size_t)k < cap && access(buf, X_OK) == 0) return buf;
    p += n + (p[n] == ':');
  }
  return argv0;
}

int eldr_child_spawn(char *const argv[], const eldr_child_opts *o, pid_t *pid, int *stdin_fd,
                     eldr_diag *d) {
  eldr_child_opts def;
  if (!o) {
    eldr_child_opts_default(&def);
    o = &def;
  }
  if (!argv || !argv[0] || !pid || (o->stdin_pipe && !stdin_fd))
    return eldr_diag_fail(d, ELDR_EINVAL, "child: no program given");
  char buf[4096];
  const char *path = resolve(argv[0], buf, sizeof buf);
  int in[2] = {-1, -1};
  if (o->stdin_pipe) {
    if (pipe(in) < 0) return eldr_diag_fail(d, ELDR_EIO, "%s: pipe: %s", argv[0], strerror(errno));
    /* neither end leaks into other children (dup2 onto 0 clears the flag) */
    fcntl(in[0], F_SETFD, FD_CLOEXEC);
    fcntl(in[1], F_SETFD, FD_CLOEXEC);
  }
  pid_t p = fork();
  if (p < 0) {
    int e = errno;
    if (in[0] >= 0) {
      close(in[0]);
      close(in[1]);
    }
    return eldr_diag_fail(d, ELDR_EIO, "%s: fork: %s", argv[0], strerror(e));
  }
  if (p == 0) child_exec(path, argv, o, in);
  /* both sides set the group, so it exists before either goes on */
  if (o->pgid >= 0) setpgid(p, o->pgid ? o->pgid : p);
  if (in[0] >= 0) {
    close(in[0]);
    *stdin_fd = in[1];
  }
  *pid = p;
  return 0;
}

static int decode_status(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

int eldr_child_wait(pid_t pid, double timeout_s, int *code) {
  int st = 0;
  if (timeout_s < 0) {
    pid_t r;
    while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
    }
    if (r != pid) return ELDR_EIO;
    if (code) *code = decode_status(st);
    return 0;
  }
  struct timespec t0, now, nap = {0, 5 * 1000 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (code) *code = decode_status(st);
      return 0;
    }
    if (r < 0 && errno != EINTR) return ELDR_EIO;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double el = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) * 1e-9;
    if (el >= timeout_s) return ELDR_ETIMEOUT;
    nanosleep(&nap, NULL);
  }
}

void eldr_child_stop(pid_t pid, double grace_s) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  if (eldr_child_wait(pid, grace_s, NULL) == ELDR_ETIMEOUT) {
    kill(pid, SIGKILL);
    eldr_child_wait(pid, -1, NULL);
  }
}
