/* test_cpu.c — eldr/cpu.h: the environment's switches (read once per
 * process, so each case runs this program again as a child with its own
 * environment and reads what the child's module says), the order of the
 * levels, and the one hook (eldr_cpu_set) capped by the CPU and the
 * switches. Every assertion holds on any CPU: what the switches must give
 * is computed from what the CPU has (eldr_cpu_detected). eldr_cpu_count
 * follows the affinity mask (a child pinned to one CPU counts one). */
#define _GNU_SOURCE /* sched_setaffinity */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eldr/cpu.h"

/* The test's own copy of the levels' order: architecture (0: every one) and
 * rank within it. */
static int arch_of(eldr_cpu_level l) { return l == ELDR_CPU_PORTABLE ? 0 : l == ELDR_CPU_NEON ? 2 : 1; }
static int rank_of(eldr_cpu_level l) { return l == ELDR_CPU_AVX512 ? 2 : l == ELDR_CPU_PORTABLE ? 0 : 1; }

/* What ELDR_NO_AVX512 leaves of the CPU's level: AVX2 for AVX-512, else the same. */
static eldr_cpu_level no_avx512(eldr_cpu_level cpu) { return cpu == ELDR_CPU_AVX512 ? ELDR_CPU_AVX2 : cpu; }

/* The level eldr_cpu_set(want) gives under cap: want on cap's architecture
 * at cap's rank or below, cap when want is wider on it, else portable. */
static eldr_cpu_level set_gives(eldr_cpu_level want, eldr_cpu_level cap) {
  if (arch_of(want) == 0 || arch_of(want) != arch_of(cap)) return ELDR_CPU_PORTABLE;
  return rank_of(want) <= rank_of(cap) ? want : cap;
}

/* This program run with ELDR_NO_SIMD and ELDR_NO_AVX512 set to the given
 * values (NULL: unset): its "detected allowed now" levels. */
static void probe(const char *no_simd, const char *no_avx512, int out[3]) {
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    if (no_simd) setenv("ELDR_NO_SIMD", no_simd, 1);
    else unsetenv("ELDR_NO_SIMD");
    if (no_avx512) setenv("ELDR_NO_AVX512", no_avx512, 1);
    else unsetenv("ELDR_NO_AVX512");
    /* under an emulator (a cross build's tests): this program through it */
    const char *emu = getenv("ELDR_TEST_EMULATOR");
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (emu && *emu && n > 0) {
      self[n] = 0;
      execl(emu, emu, self, "--probe", (char *)NULL);
    } else {
      execl("/proc/self/exe", "test_cpu", "--probe", (char *)NULL);
    }
    _exit(127);
  }
  close(fd[1]);
  char buf[64] = {0};
  size_t n = 0;
  ssize_t r;
  while (n < sizeof buf - 1 && (r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
  close(fd[0]);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(sscanf(buf, "%d %d %d", &out[0], &out[1], &out[2]), 3);
}

static void test_switches(void **state) {
  (void)state;
  const eldr_cpu_level cpu = eldr_cpu_detected();
  const struct {
    const char *no_simd, *no_avx512;
    eldr_cpu_level want;
  } cases[] = {
      {NULL, NULL, cpu},
      {"", "", cpu},
      {"0", "0", cpu},
      {"1", NULL, ELDR_CPU_PORTABLE},
      {"yes", "1", ELDR_CPU_PORTABLE},
      {NULL, "1", no_avx512(cpu)},
      {"0", "true", no_avx512(cpu)},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int got[3];
    probe(cases[i].no_simd, cases[i].no_avx512, got);
    assert_int_equal(got[0], cpu); /* the CPU is the CPU, whatever the switches */
    if (got[1] != (int)cases[i].want || got[2] != (int)cases[i].want)
      fail_msg("ELDR_NO_SIMD=%s ELDR_NO_AVX512=%s: allowed %d, in use %d; want %d",
               cases[i].no_simd ? cases[i].no_simd : "(unset)",
               cases[i].no_avx512 ? cases[i].no_avx512 : "(unset)", got[1], got[2], cases[i].want);
  }
}

/* eldr_cpu_has: a level covers the ones below it; the hook goes down and
 * back up, never above what is allowed, and returns the level before. */
static void test_set_and_has(void **state) {
  (void)state;
  const eldr_cpu_level cap = eldr_cpu_allowed();
  assert_int_equal(eldr_cpu_level_now(), cap);
  const eldr_cpu_level all[4] = {ELDR_CPU_PORTABLE, ELDR_CPU_AVX2, ELDR_CPU_AVX512, ELDR_CPU_NEON};
  for (int i = 0; i < 4; i++) {
    const eldr_cpu_level before = eldr_cpu_level_now();
    assert_int_equal(eldr_cpu_set(all[i]), before);
    const eldr_cpu_level now = eldr_cpu_level_now();
    assert_int_equal(now, set_gives(all[i], cap));
    assert_true(eldr_cpu_has(ELDR_CPU_PORTABLE));
    for (int j = 0; j < 4; j++)
      assert_int_equal(eldr_cpu_has(all[j]), arch_of(all[j]) == 0 ||
                                                 (arch_of(all[j]) == arch_of(now) && rank_of(all[j]) <= rank_of(now)));
    if (now != ELDR_CPU_AVX512) assert_false(eldr_cpu_feature(ELDR_CPU_VPOPCNTDQ));
  }
  eldr_cpu_set((eldr_cpu_level)99); /* unknown: the portable paths */
  assert_int_equal(eldr_cpu_level_now(), ELDR_CPU_PORTABLE);
  assert_false(eldr_cpu_has((eldr_cpu_level)99));
  eldr_cpu_set(cap);
  assert_int_equal(eldr_cpu_level_now(), cap);
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_PORTABLE), "portable");
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_AVX2), "avx2");
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_AVX512), "avx512");
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_NEON), "neon");
  assert_string_equal(eldr_cpu_level_name((eldr_cpu_level)99), "unknown");
}

/* A child pinned to the first CPU it may use counts 1; this process counts
 * at most its mask's CPUs (the cgroup quota may lower it) and at least 1. */
static void test_count_follows_affinity(void **state) {
  (void)state;
  cpu_set_t set;
  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  const int n = eldr_cpu_count();
  assert_true(n >= 1 && n <= CPU_COUNT(&set));
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, &set)) {
        CPU_SET(c, &one);
        break;
      }
    if (sched_setaffinity(0, sizeof one, &one)) _exit(3);
    char b[16];
    int k = snprintf(b, sizeof b, "%d", eldr_cpu_count());
    _exit(write(fd[1], b, (size_t)k) == k ? 0 : 4);
  }
  close(fd[1]);
  char b[16] = {0};
  assert_true(read(fd[0], b, sizeof b - 1) > 0);
  close(fd[0]);
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(atoi(b), 1);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--probe")) {
    printf("%d %d %d\n", (int)eldr_cpu_detected(), (int)eldr_cpu_allowed(), (int)eldr_cpu_level_now());
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_switches),
      cmocka_unit_test(test_set_and_has),
      cmocka_unit_test(test_count_follows_affinity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
