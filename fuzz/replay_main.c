/* replay_main.c — runs a libFuzzer target over files without libFuzzer, so
 * that ctest replays every seed corpus with any compiler (and under
 * ASan/UBSan in the sanitizer build). Arguments: files or directories. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
    fclose(f);
    free(buf);
    fprintf(stderr, "replay: cannot read %s\n", path);
    return 1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)(n > 0 ? n : 0));
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
    if (S_ISDIR(st.st_mode)) {
      DIR *d = opendir(argv[i]);
      if (!d) return 1;
      struct dirent *e;
      while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
        bad |= run_file(path);
        files++;
      }
      closedir(d);
    } else {
      bad |= run_file(argv[i]);
      files++;
    }
  }
  printf("replayed %d inputs\n", files);
  if (files == 0) {
    fprintf(stderr, "replay: no inputs (empty corpus)\n");
    return 1;
  }
  return bad;
}
