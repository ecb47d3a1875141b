/* eldr/plot.h — figures with gnuplot: one launcher and one style.
 *
 * A figure is a gnuplot script the caller builds in memory (open_memstream
 * or any FILE*): eldr_plot_header() writes the house style (terminal chosen
 * by the output's extension, size, grid, key, title), eldr_plot_quote()
 * writes a path or label as a gnuplot string with any quote escaped, and
 * eldr_plot_run() starts `gnuplot` (found on PATH; fork + exec with an argv,
 * no shell) and feeds it the script through a pipe on its stdin.
 *
 * Errors: ELDR_ENOTFOUND (gnuplot is not installed), ELDR_EIO (it failed,
 * or the pipe broke; d holds one line). A broken pipe is reported, never a
 * SIGPIPE death.
 * Ownership: the script is borrowed. Threads: any thread; no globals (the
 * SIGPIPE disposition is changed for the duration of the write).
 */
#ifndef ELDR_PLOT_H
#define ELDR_PLOT_H

#include <stddef.h>
#include <stdio.h>

#include "eldr/error.h"

/* The gnuplot terminal for an output path ("pngcairo ..." for .png,
 * "svg ..." for .svg), or NULL for any other extension. */
const char *eldr_plot_terminal(const char *out_path);

/* s as a single-quoted gnuplot string ('' inside for a quote). */
void eldr_plot_quote(FILE *f, const char *s);

/* The house style: terminal for out_path (.png or .svg, else ELDR_EINVAL),
 * set output, title (may be NULL), grid, key top left, labels verbatim
 * (noenhanced). Returns 0 or ELDR_EINVAL. */
int eldr_plot_header(FILE *f, const char *out_path, const char *title, eldr_diag *d);

/* Switch to the next figure of the same script (png/svg by extension). */
void eldr_plot_output(FILE *f, const char *out_path, const char *title);

/* Run gnuplot on script[0..len). */
int eldr_plot_run(const char *script, size_t len, eldr_diag *d);

#endif
