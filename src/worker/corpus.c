/* corpus.c — words of real text for the emulated worker (see corpus.h). */
#include "worker/corpus.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct eldr__corpus {
  char *text;
  uint32_t *off; /* word i = text[off[i] .. off[i] + len[i]) */
  uint8_t *len;
  size_t n;
};

/* Valid UTF-8 with no control bytes (so '"' and '\\' are the only escapes). */
static int word_ok(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x20 || c == 0x7f) return 0;
    size_t k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 9;
    if (k == 9 || (k && c < 0xc2) || i + k >= n) return 0; /* need s[i..i+k] */
    for (size_t j = 1; j <= k; j++)
      if ((s[i + j] & 0xc0) != 0x80) return 0;
    if (k == 2 && ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0))) return 0;
    if (k == 3 && ((c == 0xf0 && s[i + 1] < 0x90) || c > 0xf4 || (c == 0xf4 && s[i + 1] >= 0x90))) return 0;
    i += k + 1;
  }
  return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int eldr__corpus_load(const char *dir, eldr__corpus **out, eldr_diag *d) {
  *out = NULL;
  DIR *dp = opendir(dir);
  if (!dp) return eldr_diag_fail(d, ELDR_EIO, "corpus: cannot open directory '%s'", dir);
  char *names[64];
  size_t nn = 0;
  struct dirent *de;
  while ((de = readdir(dp)) && nn < 64) {
    size_t l = strlen(de->d_name);
    if (l > 4 && !strcmp(de->d_name + l - 4, ".txt")) names[nn++] = strdup(de->d_name);
  }
  closedir(dp);
  qsort(names, nn, sizeof *names, cmp_str);
  eldr__corpus *c = calloc(1, sizeof *c);
  char *buf = malloc(ELDR__CORPUS_MAX_BYTES + 1);
  size_t used = 0;
  int rc = 0;
  if (!c || !buf) rc = ELDR_ENOMEM;
  for (size_t i = 0; i < nn && rc == 0 && used < ELDR__CORPUS_MAX_BYTES; i++) {
    if (!names[i]) continue;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    used += fread(buf + used, 1, ELDR__CORPUS_MAX_BYTES - used, f);
    if (used < ELDR__CORPUS_MAX_BYTES) buf[used++] = '\n';
    fclose(f);
  }
  for (size_t i = 0; i < nn; i++) free(names[i]);
  if (rc == 0) {
    /* at most one word per two bytes */
    c->off = malloc((used / 2 + 1) * sizeof *c->off);
    c->len = malloc((used / 2 + 1) * sizeof *c->len);
    if (!c->off || !c->len) rc = ELDR_ENOMEM;
  }
  for (size_t i = 0; rc == 0 && i < used;) {
    while (i < used && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r')) i++;
    size_t s = i;
    while (i < used && !(buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\t' || buf[i] == '\r')) i++;
    if (i > s && i - s <= ELDR__CORPUS_MAX_WORD && word_ok((const unsigned char *)buf + s, i - s)) {
      c->off[c->n] = (uint32_t)s;
      c->len[c->n] = (uint8_t)(i - s);
      c->n++;
    }
  }
  if (rc == 0 && c->n == 0)
    rc = eldr_diag_fail(d, ELDR_EIO, "corpus: no words in any *.txt file of '%s'", dir);
  if (rc < 0) {
    if (c) {
      free(c->off);
      free(c->len);
      free(c);
    }
    free(buf);
    return rc;
  }
  c->text = buf;
  *out = c;
  return 0;
}

void eldr__corpus_free(eldr__corpus *c) {
  if (!c) return;
  free(c->text);
  free(c->off);
  free(c->len);
  free(c);
}

const char *eldr__corpus_word(const eldr__corpus *c, uint64_t i, size_t *len) {
  size_t k = (size_t)(i % c->n);
  *len = c->len[k];
  return c->text + c->off[k];
}
