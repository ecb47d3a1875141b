/* cpu.c — the one CPU-dispatch module (see eldr/cpu.h): detection once,
 * the environment's switches once, one level every vector path reads; and
 * the CPUs the process may use (affinity, cgroup quota). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "eldr/cpu.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_X86 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && (defined(__GNUC__) || defined(__clang__))
#define CPU_ARM 1
#endif

/* Each level's architecture (0: every one) and rank within it. */
enum { ARCH_ANY = 0, ARCH_X86 = 1, ARCH_ARM = 2 };
static const struct {
  int arch, rank;
  const char *name;
} LEVELS[] = {
    [ELDR_CPU_PORTABLE] = {ARCH_ANY, 0, "portable"},
    [ELDR_CPU_AVX2] = {ARCH_X86, 1, "avx2"},
    [ELDR_CPU_AVX512] = {ARCH_X86, 2, "avx512"},
    [ELDR_CPU_NEON] = {ARCH_ARM, 1, "neon"},
};
#define NLEVELS (sizeof LEVELS / sizeof LEVELS[0])

static int known(eldr_cpu_level l) { return (unsigned)l < NLEVELS; }

/* -1 until found; then the level (the benign race of two first callers
 * stores the same value). state: the level in use in bits 0..7 and, from
 * bit 8, bit l set when eldr_cpu_has(l): one word, so that the dispatch of
 * a path is one load and the two never disagree. */
static int detected = -1, allowed = -1, state = -1;
static int vpopcntdq = -1;

static eldr_cpu_level detect(void) {
#ifdef CPU_X86
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("popcnt")) return ELDR_CPU_PORTABLE;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi"))
    return ELDR_CPU_AVX512;
  return ELDR_CPU_AVX2;
#elif defined(CPU_ARM)
  return ELDR_CPU_NEON; /* Advanced SIMD is part of the aarch64 architecture */
#else
  return ELDR_CPU_PORTABLE; /* no vector level for this architecture yet */
#endif
}

eldr_cpu_level eldr_cpu_detected(void) {
  int d = __atomic_load_n(&detected, __ATOMIC_RELAXED);
  if (d < 0) {
    d = (int)detect();
    __atomic_store_n(&detected, d, __ATOMIC_RELAXED);
  }
  return (eldr_cpu_level)d;
}

/* The environment variable is set to anything but "" or "0". */
static int env_says_no(const char *name) {
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

eldr_cpu_level eldr_cpu_allowed(void) {
  int a = __atomic_load_n(&allowed, __ATOMIC_RELAXED);
  if (a < 0) {
    eldr_cpu_level l = eldr_cpu_detected();
    if (env_says_no("ELDR_NO_SIMD")) l = ELDR_CPU_PORTABLE;
    if (l == ELDR_CPU_AVX512 && env_says_no("ELDR_NO_AVX512")) l = ELDR_CPU_AVX2;
    a = (int)l;
    __atomic_store_n(&allowed, a, __ATOMIC_RELAXED);
  }
  return (eldr_cpu_level)a;
}

/* a within b's reach: PORTABLE, or the same architecture at b's rank or below */
static int covers(eldr_cpu_level b, eldr_cpu_level a) {
  if (!known(a) || !known(b)) return 0;
  if (LEVELS[a].arch == ARCH_ANY) return 1;
  return LEVELS[a].arch == LEVELS[b].arch && LEVELS[a].rank <= LEVELS[b].rank;
}

static int use(eldr_cpu_level l) {
  int m = 0;
  for (unsigned i = 0; i < NLEVELS; i++)
    if (covers(l, (eldr_cpu_level)i)) m |= 1 << i;
  const int st = m << 8 | (int)l;
  __atomic_store_n(&state, st, __ATOMIC_RELAXED);
  return st;
}

static int state_now(void) {
  int st = __atomic_load_n(&state, __ATOMIC_RELAXED);
  return st >= 0 ? st : use(eldr_cpu_allowed());
}

eldr_cpu_level eldr_cpu_level_now(void) { return (eldr_cpu_level)(state_now() & 0xff); }

int eldr_cpu_has(eldr_cpu_level level) { return known(level) && (state_now() >> (8 + level) & 1); }

eldr_cpu_level eldr_cpu_set(eldr_cpu_level level) {
  const eldr_cpu_level was = eldr_cpu_level_now(), cap = eldr_cpu_allowed();
  eldr_cpu_level l = ELDR_CPU_PORTABLE;
  if (covers(cap, level)) l = level;
  else if (known(level) && LEVELS[level].arch == LEVELS[cap].arch) l = cap; /* wider than allowed */
  use(l);
  return was;
}

static int cpu_vpopcntdq(void) {
  int v = __atomic_load_n(&vpopcntdq, __ATOMIC_RELAXED);
  if (v < 0) {
    v = 0;
#ifdef CPU_X86
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx512vpopcntdq") ? 1 : 0;
#endif
    __atomic_store_n(&vpopcntdq, v, __ATOMIC_RELAXED);
  }
  return v;
}

int eldr_cpu_feature(eldr_cpu_feature_id f) {
  switch (f) {
  case ELDR_CPU_VPOPCNTDQ: return eldr_cpu_has(ELDR_CPU_AVX512) && cpu_vpopcntdq();
  }
  return 0;
}

const char *eldr_cpu_level_name(eldr_cpu_level level) {
  return known(level) ? LEVELS[level].name : "unknown";
}

/* ---- the CPUs the process may use --------------------------------------- */

/* The first line of a small file, NUL-terminated; 0 or -1. */
static int read_line(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  const int ok = fgets(buf, (int)cap, f) != NULL;
  fclose(f);
  return ok ? 0 : -1;
}

/* The process's cgroup path for a v1 controller ("cpu") or, with
 * controller NULL, the v2 one ("0::/path"), into path; 0 or -1. */
static int cgroup_path(const char *controller, char *path, size_t cap) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return -1;
  char line[512];
  int rc = -1;
  while (rc && fgets(line, sizeof line, f)) {
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = 0;
    const char *ctl = c1 + 1, *p = c2 + 1;
    int match = 0;
    if (!controller) {
      match = !strncmp(line, "0:", 2) && !*ctl;
    } else { /* "cpu,cpuacct" lists several */
      for (const char *t = ctl; *t;) {
        size_t n = strcspn(t, ",");
        if (n == strlen(controller) && !strncmp(t, controller, n)) match = 1;
        t += n + (t[n] == ',');
      }
    }
    if (!match) continue;
    snprintf(path, cap, "%.*s", (int)strcspn(p, "\n"), p);
    rc = 0;
  }
  fclose(f);
  return rc;
}

/* ceil(quota / period), or 0 when there is no quota. */
static int quota_cpus(double quota, double period) {
  if (!(quota > 0) || !(period > 0)) return 0;
  const double q = quota / period;
  const int n = (int)q;
  return n + (q > n);
}

/* The cgroup CPU quota in CPUs (rounded up), 0 when none is set. Its own
 * cgroup's file, then the mount's root (inside a container the two are the
 * same directory). */
static int cgroup_cpus(void) {
  char cg[384], file[512], line[128];
  if (!cgroup_path(NULL, cg, sizeof cg)) { /* v2: "max 100000" or "200000 100000" */
    const char *const dirs[2] = {cg, ""};
    for (int i = 0; i < 2; i++) {
      snprintf(file, sizeof file, "/sys/fs/cgroup%s/cpu.max", dirs[i]);
      if (read_line(file, line, sizeof line)) continue;
      if (!strncmp(line, "max", 3)) return 0;
      double q = 0, p = 0;
      return sscanf(line, "%lf %lf", &q, &p) == 2 ? quota_cpus(q, p) : 0;
    }
  }
  if (!cgroup_path("cpu", cg, sizeof cg)) { /* v1 */
    const char *const roots[2] = {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
    for (int r = 0; r < 2; r++) {
      const char *const dirs[2] = {cg, ""};
      for (int i = 0; i < 2; i++) {
        char q[64], p[64];
        snprintf(file, sizeof file, "%s%s/cpu.cfs_quota_us", roots[r], dirs[i]);
        if (read_line(file, q, sizeof q)) continue;
        snprintf(file, sizeof file, "%s%s/cpu.cfs_period_us", roots[r], dirs[i]);
        if (read_line(file, p, sizeof p)) continue;
        return quota_cpus(atof(q), atof(p));
      }
    }
  }
  return 0;
}

int eldr_cpu_count(void) {
  int n = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n < 1) {
    const long on = sysconf(_SC_NPROCESSORS_ONLN);
    n = on > 0 ? (int)on : 1;
  }
  const int q = cgroup_cpus();
  return q > 0 && q < n ? q : n;
}
