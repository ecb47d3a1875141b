/* plot.c — the gnuplot launcher and the house style (see eldr/plot.h). */
#include "eldr/plot.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "eldr/child.h"

const char *eldr_plot_terminal(const char *out_path) {
  const char *dot = out_path ? strrchr(out_path, '.') : NULL;
  if (dot && !strcmp(dot, ".png")) return "pngcairo size 900,600 noenhanced";
  if (dot && !strcmp(dot, ".svg")) return "svg size 900,600 noenhanced";
  return NULL;
}

void eldr_plot_quote(FILE *f, const char *s) {
  fputc('\'', f);
  for (const char *c = s; *c; c++) {
    if (*c == '\'') fputc('\'', f);
    if (*c == '\n') { /* a newline would end the command */
      fputc(' ', f);
      continue;
    }
    fputc(*c, f);
  }
  fputc('\'', f);
}

void eldr_plot_output(FILE *f, const char *out_path, const char *title) {
  fputs("set output ", f);
  eldr_plot_quote(f, out_path);
  fputc('\n', f);
  if (title) {
    fputs("set title ", f);
    eldr_plot_quote(f, title);
    fputc('\n', f);
  }
}

int eldr_plot_header(FILE *f, const char *out_path, const char *title, eldr_diag *d) {
  const char *term = eldr_plot_terminal(out_path);
  if (!term) return eldr_diag_fail(d, ELDR_EINVAL, "'%s' must end in .png or .svg", out_path);
  fprintf(f, "set terminal %s\nset grid\nset key top left\n", term);
  /* the house palette: dark, distinct colours on white (Okabe-Ito without its
   * yellow, which gnuplot's default line type 5 is and which is hard to see) */
  static const char *const colours[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7",
                                        "#56b4e9", "#e69f00", "#000000", "#999999"};
  for (size_t i = 0; i < sizeof colours / sizeof colours[0]; i++)
    fprintf(f, "set linetype %zu linecolor rgb '%s' linewidth 2 pointtype %zu\n", i + 1, colours[i],
            i + 5);
  fputs("set linetype cycle 8\n", f);
  eldr_plot_output(f, out_path, title);
  return 0;
}

int eldr_plot_run(const char *script, size_t len, eldr_diag *d) {
  char *argv[] = {"gnuplot", NULL};
  eldr_child_opts o;
  eldr_child_opts_default(&o);
  o.stdin_pipe = 1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid;
  int fd = -1;
  int rc = eldr_child_spawn(argv, &o, &pid, &fd, d);
  if (rc) return rc;
  /* gnuplot may be gone (not installed: exec fails) before the script is
   * written: take EPIPE as an error, and let its exit status say why */
  struct sigaction ign, old;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &old);
  int werr = 0;
  for (size_t off = 0; off < len;) {
    ssize_t k = write(fd, script + off, len - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      werr = errno ? errno : EIO;
      break;
    }
    off += (size_t)k;
  }
  close(fd);
  sigaction(SIGPIPE, &old, NULL);
  int code = -1;
  if (eldr_child_wait(pid, -1, &code)) return eldr_diag_fail(d, ELDR_EIO, "gnuplot: lost the child");
  if (code == 127) return eldr_diag_fail(d, ELDR_ENOTFOUND, "gnuplot not found (install the gnuplot package)");
  if (code != 0) return eldr_diag_fail(d, ELDR_EIO, "gnuplot failed (exit status %d)", code);
  if (werr) return eldr_diag_fail(d, ELDR_EIO, "gnuplot: writing the script: %s", strerror(werr));
  return 0;
}
