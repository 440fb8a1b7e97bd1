/*
 * threadpool.c — a fixed pool of worker threads for the CPU ops; the caller
 * of cpu_pool_run is worker 0, workers 1..n-1 are threads created once.
 *
 * Decode calls cpu_pool_run a few hundred times per token with only tens of
 * microseconds of work each, so a mutex + condvar round trip (several us of
 * wake-up latency per call) is too slow. Instead:
 *   - a call publishes (fn, arg), sets `pending` = n-1 and bumps the
 *     generation counter `gen` (release);
 *   - idle workers spin on `gen` (with the pause hint) for a while after
 *     their last task, and only then sleep on a futex on `gen`; a call issues
 *     the futex wake only when some worker is asleep (`sleepers` > 0);
 *   - the caller runs its own share, then spins (briefly, then futex-sleeps)
 *     until `pending` reaches 0; the worker that brings it to 0 wakes it if
 *     it went to sleep.
 * Spinning turns into sched_yield() after a few microseconds, so that when
 * threads outnumber free cores (builds running, -t above the core count) the
 * spinner hands its core to the thread it waits for.
 * Between the ops of one decode step the workers never sleep, so a call costs
 * about one cache-line transfer each way. After ~SPIN_NS idle they sleep and
 * take no CPU (the machine is shared with builds and other programs).
 *
 * Invariants: one cpu_pool_run at a time per pool (a context belongs to one
 * thread); no allocation per call. Linux futexes; other systems fall back to
 * sched_yield() in place of the futex sleep.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include "backend/cpu/cpu.h"
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* how long an idle thread spins before it sleeps */
#ifndef SPIN_NS
#define SPIN_NS 2000000LL
#endif
#ifndef YIELD_AFTER
#define YIELD_AFTER 256
#endif

struct cpu_pool {
    int n;
    pthread_t *th;                 /* [n]; th[0] unused (the caller) */
    _Alignas(64) atomic_uint gen;  /* bumped once per call */
    atomic_int sleepers;           /* workers blocked in futex wait on gen */
    atomic_int quit;
    cpu_task_fn fn;                /* published before gen is bumped */
    void *arg;
    _Alignas(64) atomic_int pending;  /* workers not yet done with this call */
    atomic_int caller_sleeps;         /* the caller is (about to be) blocked on pending */
};

typedef struct { cpu_pool *p; int i; } worker_arg;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void fwait(atomic_uint *addr, unsigned val) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
#else
    (void)addr; (void)val;
    sched_yield();
#endif
}

static void fwake(atomic_uint *addr) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

/* one step of a wait loop: pause; after a few microseconds also yield the
 * core (when threads outnumber free cores, the one we wait for may need it);
 * returns 1 once SPIN_NS have passed and the caller should sleep instead */
static int spin_step(unsigned i, long long *t0) {
    CPU_RELAX();
    if ((i & 63) != 63) return 0;
    if (i >= YIELD_AFTER) sched_yield();
    long long t = now_ns();
    if (!*t0) *t0 = t;
    return t - *t0 > SPIN_NS;
}

/* waits until *addr != val: spin for SPIN_NS, then futex sleep */
static void wait_change(atomic_uint *addr, unsigned val, atomic_int *sleepers) {
    long long t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(addr, memory_order_acquire) != val) return;
        if (spin_step(i, &t0)) break;
    }
    for (;;) {
        atomic_fetch_add(sleepers, 1);
        if (atomic_load_explicit(addr, memory_order_acquire) == val) fwait(addr, val);
        atomic_fetch_sub(sleepers, 1);
        if (atomic_load_explicit(addr, memory_order_acquire) != val) return;
    }
}

static void *worker(void *a_) {
    worker_arg *a = a_;
    cpu_pool *p = a->p;
    int i = a->i;
    free(a);
    unsigned seen = 0;   /* gen at creation: a call may bump it before this thread runs */
    for (;;) {
        wait_change(&p->gen, seen, &p->sleepers);
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load(&p->quit)) return NULL;
        p->fn(p->arg, i, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1 &&
            atomic_load(&p->caller_sleeps))
            fwake((atomic_uint *)&p->pending);
    }
}

cpu_pool *cpu_pool_new(int n) {
    if (n < 1) n = 1;
    cpu_pool *p = aligned_alloc(64, (sizeof(cpu_pool) + 63) / 64 * 64);
    if (!p) return NULL;
    p->n = n;
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->quit, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->caller_sleeps, 0);
    p->fn = NULL;
    p->arg = NULL;
    p->th = calloc((size_t)n, sizeof *p->th);
    if (!p->th) { free(p); return NULL; }
    for (int i = 1; i < n; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) { p->n = i; break; }
        a->p = p;
        a->i = i;
        if (pthread_create(&p->th[i], NULL, worker, a)) { free(a); p->n = i; break; }
    }
    return p;
}

void cpu_pool_free(cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->quit, 1);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    fwake(&p->gen);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    free(p->th);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p->n; }

void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1);   /* seq_cst: pairs with the sleepers/gen check in wait_change */
    if (atomic_load(&p->sleepers)) fwake(&p->gen);
    fn(arg, 0, p->n);
    /* wait for the workers: spin, then sleep on pending */
    long long t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        if (spin_step(i, &t0)) break;
    }
    atomic_store(&p->caller_sleeps, 1);
    for (;;) {
        int v = atomic_load_explicit(&p->pending, memory_order_acquire);
        if (v == 0) break;
        fwait((atomic_uint *)&p->pending, (unsigned)v);
    }
    atomic_store(&p->caller_sleeps, 0);
}
