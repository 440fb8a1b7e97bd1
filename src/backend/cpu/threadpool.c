/*
 * threadpool.c — a fixed pool of worker threads for the CPU ops. The caller
 * is worker 0; workers 1..n-1 wait on a condition variable for a generation
 * counter to change, run their share, and report completion. No allocation
 * per call.
 */
#include <pthread.h>
#include <stdlib.h>
#include "backend/cpu/cpu.h"

struct cpu_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;
    int pending, quit;
    cpu_task_fn fn;
    void *arg;
};

typedef struct { cpu_pool *p; int i; } worker_arg;

static void *worker(void *a_) {
    worker_arg *a = a_;
    cpu_pool *p = a->p;
    int i = a->i;
    free(a);
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->quit) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->gen;
        cpu_task_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, i, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

cpu_pool *cpu_pool_new(int n) {
    if (n < 1) n = 1;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
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
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p->n; }

void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
