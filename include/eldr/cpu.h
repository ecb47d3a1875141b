/* eldr/cpu.h — the one CPU-dispatch module (base layer): which SIMD level
 * every vector path of every layer may use.
 *
 * The level is the widest of ELDR_CPU_* that the CPU has, found once, then
 * capped by the environment (read once, any value but "" or "0" counts):
 *   ELDR_NO_SIMD=1     the portable C paths only, on any architecture
 *   ELDR_NO_AVX512=1   no AVX-512 path: AVX2 at most (x86-64)
 * On aarch64 the level is NEON (Advanced SIMD, part of every aarch64 CPU)
 * unless ELDR_NO_SIMD is set.
 * so a machine with AVX-512 runs, and tests, what a machine without it runs.
 *
 * A path built for a level lives in its own file, named for the level
 * (core/counts_avx2.c beside core/counts_avx512.c, ...), compiled with
 * __attribute__((target(...))) so that the rest of the build stays
 * portable, and is called only where eldr_cpu_has(level) is true. Every
 * path has a portable twin that gives the same results; the tests compare
 * them level by level (eldr_cpu_set).
 *
 * Levels are ordered within one architecture: eldr_cpu_has(l) is true when
 * the level in use is l or wider on the same architecture (PORTABLE is
 * every architecture's lowest). Adding an architecture's levels (aarch64
 * SVE beside NEON, ...) is: their enumerators below, their detection in
 * cpu.c under #if, their switch if any, and the paths' files.
 *
 * Beside the level, eldr_cpu_count: how many CPUs the process may use.
 *
 * Errors: none. Threads: every function may be called from any thread; the
 * level is one relaxed atomic (detection may run twice at start, with the
 * same answer). eldr_cpu_set is for tests and benchmarks: call it while no
 * other thread is inside a vector path (a path already running finishes on
 * the level it started with; nothing is left half switched).
 */
#ifndef ELDR_CPU_H
#define ELDR_CPU_H

typedef enum eldr_cpu_level {
  ELDR_CPU_PORTABLE = 0, /* plain C: every build, every CPU */
  ELDR_CPU_AVX2 = 1,     /* x86-64: AVX2 (with AVX, POPCNT) */
  ELDR_CPU_AVX512 = 2,   /* x86-64: AVX2 and AVX-512 F, BW, VL, VBMI */
  ELDR_CPU_NEON = 3,     /* aarch64: Advanced SIMD (every aarch64 CPU) */
} eldr_cpu_level;

/* Optional features beside the level, reported only where the level that
 * needs them is in use (eldr_cpu_feature). */
typedef enum eldr_cpu_feature_id {
  ELDR_CPU_VPOPCNTDQ = 1, /* AVX-512 VPOPCNTDQ (needs ELDR_CPU_AVX512) */
} eldr_cpu_feature_id;

/* The level the vector paths use now. */
eldr_cpu_level eldr_cpu_level_now(void);

/* The level in use is `level` or wider on the same architecture. */
int eldr_cpu_has(eldr_cpu_level level);

/* Beside eldr_cpu_has: the CPU has feature f and the level it needs is in
 * use. */
int eldr_cpu_feature(eldr_cpu_feature_id f);

/* The widest level this CPU has (before the environment's switches). */
eldr_cpu_level eldr_cpu_detected(void);

/* The widest level the environment allows on this CPU: eldr_cpu_detected()
 * capped by ELDR_NO_SIMD / ELDR_NO_AVX512. The level in use starts here. */
eldr_cpu_level eldr_cpu_allowed(void);

/* Testing and benchmark hook, the only one: use at most `level` from now
 * on (capped by eldr_cpu_allowed(): the switches hold); returns the level
 * in use before. eldr_cpu_set(eldr_cpu_allowed()) restores the default. */
eldr_cpu_level eldr_cpu_set(eldr_cpu_level level);

/* "portable", "avx2", "avx512", "neon". */
const char *eldr_cpu_level_name(eldr_cpu_level level);

/* The CPUs this process may run on (>= 1): its affinity mask (what
 * `taskset`, `docker --cpuset-cpus` and a Kubernetes static CPU policy
 * set), capped by its cgroup's CPU quota rounded up (cgroup v2 cpu.max, v1
 * cpu.cfs_quota_us / cpu.cfs_period_us: `docker --cpus`, Kubernetes CPU
 * limits). Read from the kernel and /sys/fs/cgroup on each call; 1 when
 * nothing can be read. For thread-count defaults, not for the vector
 * level. */
int eldr_cpu_count(void);

#endif
