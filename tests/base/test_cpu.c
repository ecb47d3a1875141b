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

static eldr_cpu_level min_level(eldr_cpu_level a, eldr_cpu_level b) { return a < b ? a : b; }

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
    execl("/proc/self/exe", "test_cpu", "--probe", (char *)NULL);
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
      {NULL, "1", min_level(cpu, ELDR_CPU_AVX2)},
      {"0", "true", min_level(cpu, ELDR_CPU_AVX2)},
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
  const eldr_cpu_level all[3] = {ELDR_CPU_PORTABLE, ELDR_CPU_AVX2, ELDR_CPU_AVX512};
  for (int i = 0; i < 3; i++) {
    const eldr_cpu_level before = eldr_cpu_level_now();
    assert_int_equal(eldr_cpu_set(all[i]), before);
    const eldr_cpu_level now = eldr_cpu_level_now();
    assert_int_equal(now, min_level(all[i], cap)); /* x86 levels and portable: one order */
    assert_true(eldr_cpu_has(ELDR_CPU_PORTABLE));
    for (int j = 0; j < 3; j++) assert_int_equal(eldr_cpu_has(all[j]), all[j] <= now);
    if (now < ELDR_CPU_AVX512) assert_false(eldr_cpu_feature(ELDR_CPU_VPOPCNTDQ));
  }
  eldr_cpu_set((eldr_cpu_level)99); /* unknown: the portable paths */
  assert_int_equal(eldr_cpu_level_now(), ELDR_CPU_PORTABLE);
  assert_false(eldr_cpu_has((eldr_cpu_level)99));
  eldr_cpu_set(cap);
  assert_int_equal(eldr_cpu_level_now(), cap);
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_PORTABLE), "portable");
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_AVX2), "avx2");
  assert_string_equal(eldr_cpu_level_name(ELDR_CPU_AVX512), "avx512");
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
