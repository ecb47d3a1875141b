/* test_writefile.c — eldr/writefile.h: whole or not at all; a device or a
 * FIFO written in place, never renamed over. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/readfile.h"
#include "eldr/writefile.h"

static char dir[64];

static int setup(void **st) {
  (void)st;
  snprintf(dir, sizeof dir, "/tmp/eldr-writefile-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **st) {
  (void)st;
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      unlink(p);
    }
  if (d) closedir(d);
  return rmdir(dir);
}

static size_t entries(void) {
  DIR *d = opendir(dir);
  size_t n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static void expect_text(const char *path, const char *want) {
  char *buf = NULL;
  size_t len = 0;
  assert_int_equal(eldr_read_file(path, 1 << 20, NULL, &buf, &len, NULL), 0);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(buf, want, len);
  free(buf);
}

/* A new file, then replaced; an aborted write leaves the old one; no
 * temporary file stays behind; the mode is 0644. */
static void test_whole_or_nothing(void **st) {
  (void)st;
  char path[128];
  snprintf(path, sizeof path, "%s/out.json", dir);
  assert_int_equal(eldr_write_file(path, "first\n", 6, NULL), 0);
  expect_text(path, "first\n");
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0644);
  assert_int_equal(eldr_write_file(path, "second", 6, NULL), 0);
  expect_text(path, "second");
  eldr_outfile o;
  assert_int_equal(eldr_outfile_open(&o, path, NULL), 0);
  assert_non_null(o.tmp);
  fputs("half a fil", o.f);
  expect_text(path, "second"); /* a reader sees the old file while it is written */
  assert_int_equal(eldr_outfile_close(&o, 0, NULL), 0);
  expect_text(path, "second");
  assert_int_equal(entries(), 1);
}

/* eldr_outfile_write puts its chunks after what the stream buffered, and
 * the file appears whole at close. */
static void test_chunks_after_stream(void **st) {
  (void)st;
  char path[128];
  snprintf(path, sizeof path, "%s/out.json", dir);
  eldr_outfile o;
  assert_int_equal(eldr_outfile_open(&o, path, NULL), 0);
  fputs("head,", o.f);
  assert_int_equal(eldr_outfile_write(&o, "chunk1,", 7, NULL), 0);
  assert_int_equal(eldr_outfile_write(&o, "", 0, NULL), 0);
  assert_int_equal(eldr_outfile_write(&o, "chunk2", 6, NULL), 0);
  assert_int_equal(eldr_outfile_close(&o, 1, NULL), 0);
  expect_text(path, "head,chunk1,chunk2");
  assert_int_equal(entries(), 1);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_outfile_write(&o, "x", 1, &d), ELDR_EINVAL); /* closed */
}

/* A missing directory: an error naming the path, nothing created. */
static void test_errors(void **st) {
  (void)st;
  char path[128];
  snprintf(path, sizeof path, "%s/no/such/dir/out.json", dir);
  eldr_diag d = {{0}};
  assert_int_equal(eldr_write_file(path, "x", 1, &d), ELDR_EIO);
  assert_non_null(strstr(d.msg, path));
  assert_int_equal(eldr_write_file(NULL, "x", 1, &d), ELDR_EINVAL);
  assert_int_equal(entries(), 0);
}

/* A FIFO (as /dev/null, not a regular file) is written in place: it stays
 * a FIFO and its reader gets the bytes. */
static void test_fifo_in_place(void **st) {
  (void)st;
  char path[128];
  snprintf(path, sizeof path, "%s/fifo", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  int rd = open(path, O_RDONLY | O_NONBLOCK); /* a reader, so the writer's open does not block */
  assert_true(rd >= 0);
  assert_int_equal(eldr_write_file(path, "through", 7, NULL), 0);
  char buf[16] = {0};
  assert_int_equal(read(rd, buf, sizeof buf), 7);
  assert_memory_equal(buf, "through", 7);
  close(rd);
  struct stat sb;
  assert_int_equal(lstat(path, &sb), 0);
  assert_true(S_ISFIFO(sb.st_mode));
  assert_int_equal(entries(), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_whole_or_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chunks_after_stream, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fifo_in_place, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
