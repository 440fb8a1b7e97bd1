/*
 * serve-tier.c — the on-disk second level of the server's prefix cache
 * (--cache-dir): the persistent tier generate and chat use (cinfer_tier_*).
 *
 * The engine thread looks a prompt up here when memory holds a shorter
 * prefix of it than the tier may (cinfer_tier_lookup_longer: only a longer
 * entry is read), and, once a prompt is prefilled, copies its state
 * (cinfer_tier_capture: a memory copy of the sequence's K/V). Everything slow
 * — encoding, checksums, the write, fsync, rename, eviction — runs on a
 * writer thread of its own (cinfer_tier_commit through its own tier handle),
 * so storing never holds up the running sequences. The writer's queue is
 * bounded (WQ_CAP captures); a capture that finds it full is dropped (the
 * prompt is simply not stored). Closing drains the queue, so every prompt
 * captured before SIGTERM is on disk when the server exits.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "serve-prefix.h"

enum { WQ_CAP = 8 };

struct srv_tier {
    cinfer_tier *rd, *wr;          /* the engine's handle, the writer's */
    pthread_t th;
    int started, stop, n, quiet;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cinfer_tier_pending *q[WQ_CAP];
    long stored, dropped;
};

static void tier_log(const char *msg, void *user) { (void)user; fprintf(stderr, "cinfer serve: --cache-dir: %s\n", msg); }

static void *writer(void *arg) {
    srv_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->n && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->n) break;   /* stopping and drained */
        cinfer_tier_pending *p = t->q[0];
        for (int i = 1; i < t->n; i++) t->q[i - 1] = t->q[i];
        t->n--;
        pthread_mutex_unlock(&t->mu);
        if (cinfer_tier_commit(t->wr, p)) fprintf(stderr, "cinfer serve: --cache-dir: %s\n", cinfer_tier_error(t->wr));
        pthread_mutex_lock(&t->mu);
        t->stored++;
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

srv_tier *stier_open(const char *dir, size_t max_bytes, const cinfer_model *m, int quiet) {
    srv_tier *t = calloc(1, sizeof *t);
    char err[512] = "";
    cinfer_tier_opts to = {max_bytes, tier_log, NULL};
    if (!t) return NULL;
    t->quiet = quiet;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (cinfer_tier_open(dir, m, &to, &t->rd, err, sizeof err) || cinfer_tier_open(dir, m, &to, &t->wr, err, sizeof err) ||
        pthread_create(&t->th, NULL, writer, t)) {
        fprintf(stderr, "cinfer serve: --cache-dir: %s\n", *err ? err : "cannot start the writer thread");
        stier_close(t);
        return NULL;
    }
    t->started = 1;
    return t;
}

void stier_close(srv_tier *t) {
    if (!t) return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->th, NULL);
        if (!t->quiet) fprintf(stderr, "cinfer serve: --cache-dir: %ld prompts stored, %ld dropped (writer busy)\n", t->stored, t->dropped);
    }
    for (int i = 0; i < t->n; i++) cinfer_tier_pending_free(t->q[i]);
    cinfer_tier_free(t->rd);
    cinfer_tier_free(t->wr);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

int stier_lookup(srv_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, int min_len, int max_len) {
    int got = 0;
    if (!t || max_len <= min_len) return 0;
    if (cinfer_tier_lookup_longer(t->rd, c, seq, ids, n, min_len, max_len, &got)) {
        fprintf(stderr, "cinfer serve: --cache-dir: %s\n", cinfer_tier_error(t->rd));
        return 0;
    }
    return got;
}

void stier_store(srv_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n) {
    if (!t || n < 1) return;
    pthread_mutex_lock(&t->mu);
    int full = t->n == WQ_CAP;
    if (full) t->dropped++;
    pthread_mutex_unlock(&t->mu);
    cinfer_tier_pending *p = NULL;
    if (full) return;
    if (cinfer_tier_capture(t->rd, c, seq, ids, n, &p)) {
        fprintf(stderr, "cinfer serve: --cache-dir: %s\n", cinfer_tier_error(t->rd));
        return;
    }
    if (!p) return;   /* already stored */
    pthread_mutex_lock(&t->mu);
    t->q[t->n++] = p;   /* only this thread adds: room is still there */
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}
