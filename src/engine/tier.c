/*
 * tier.c — the persistent prefix tier: a directory of entries (tier.h) named
 *   <config 16 hex>-<tokens 8 hex>-<XXH3-64 of the token ids, 16 hex>.ckv
 * where config hashes the model and tokenizer fingerprints and the cache
 * configuration (KV dtype, max_kv_size, each layer's window and shape). A
 * lookup lists the directory, keeps the names of this configuration whose
 * token hash equals the hash of the prompt's prefix of that length, and
 * tries them longest first: read, verify every checksum, compare the stored
 * tokens, restore. A corrupt entry is reported, unlinked and skipped.
 * Writes are atomic (cf_write_atomic); "<dir>/.lock" (flock) is held shared
 * while reading and exclusive while evicting and sweeping the temporaries of
 * dead writers. Recency is the file's mtime, touched on every hit; eviction
 * removes the least recent entries until the directory fits max_bytes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "engine/engine.h"
#include "engine/tier.h"
#include "util.h"

struct cinfer_tier {
    char *dir;
    const cinfer_model *m;
    size_t max_bytes;
    void (*log)(const char *msg, void *user);
    void *log_user;
    char model_fp[33], tok_fp[33];
    int lock_fd;
    char err[512];
};

static void tlog(cinfer_tier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tlog(cinfer_tier *t, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (t->log) t->log(msg, t->log_user);
    else fprintf(stderr, "cinfer: %s\n", msg);
}

static cinfer_status tfail(cinfer_tier *t, cinfer_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cinfer_status tfail(cinfer_tier *t, cinfer_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->err, sizeof t->err, fmt, ap);
    va_end(ap);
    return s;
}

const char *cinfer_tier_error(const cinfer_tier *t) { return t ? t->err : "no tier"; }

static void lock(cinfer_tier *t, int op) { while (flock(t->lock_fd, op) && errno == EINTR) {} }

/* removes "<dir>/.tmp.<pid>.*" files whose writer is gone (a crash mid-write) */
static void sweep_temporaries(cinfer_tier *t) {
    DIR *d = opendir(t->dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        long pid;
        if (strncmp(de->d_name, ".tmp.", 5) || sscanf(de->d_name + 5, "%ld.", &pid) != 1 || pid <= 0) continue;
        if (pid == (long)getpid() || !(kill((pid_t)pid, 0) && errno == ESRCH)) continue;
        char *p = cf_path(t->dir, de->d_name);
        if (p) unlink(p);
        free(p);
    }
    if (d) closedir(d);
}

cinfer_status cinfer_tier_open(const char *dir, const cinfer_model *m, const cinfer_tier_opts *opts, cinfer_tier **out,
                               char *err, size_t err_len) {
    *out = NULL;
    if (!dir || !*dir || !m) return cf_err(err, err_len, CINFER_EINVAL, "cache dir: no directory or model");
    if (mkdir(dir, 0755) && errno != EEXIST) return cf_err(err, err_len, CINFER_EIO, "%s: cannot create: %s", dir, strerror(errno));
    cinfer_tier *t = calloc(1, sizeof *t);
    char *lp = cf_path(dir, ".lock");
    if (!t || !lp || !(t->dir = strdup(dir))) {
        free(lp);
        if (t) free(t->dir);
        free(t);
        return cf_err(err, err_len, CINFER_ENOMEM, "out of memory");
    }
    t->m = m;
    if (opts) t->max_bytes = opts->max_bytes, t->log = opts->log, t->log_user = opts->log_user;
    t->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    free(lp);
    if (t->lock_fd < 0) {
        cinfer_status s = cf_err(err, err_len, CINFER_EIO, "%s: cannot open its lock file: %s", dir, strerror(errno));
        cinfer_tier_free(t);
        return s;
    }
    int memo_hit;
    if (tier_fingerprints(m, dir, t->model_fp, t->tok_fp, &memo_hit)) {
        cinfer_tier_free(t);
        return cf_err(err, err_len, CINFER_EIO, "%s: cannot fingerprint the model", dir);
    }
    lock(t, LOCK_EX);
    sweep_temporaries(t);
    lock(t, LOCK_UN);
    *out = t;
    return CINFER_OK;
}

void cinfer_tier_free(cinfer_tier *t) {
    if (!t) return;
    if (t->lock_fd >= 0) close(t->lock_fd);
    free(t->dir);
    free(t);
}

/* the configuration string an entry must match, and its hash */
static uint64_t config_of(const cinfer_tier *t, const cinfer_ctx *c, char *cfg, size_t n) {
    int o = snprintf(cfg, n, "model=%s;tokenizer=%s;kv=%s;max_kv=%d;layers=", t->model_fp, t->tok_fp,
                     be_dtype_name(c->kv_dt), c->max_kv);
    for (int l = 0; l < c->m->cfg.n_layer && o > 0 && (size_t)o < n; l++) {
        int keep, w = kv_group_window(c->layer_group[l], &keep);
        o += snprintf(cfg + o, n - (size_t)o, "%s%d/%d/%d/%d", l ? "," : "", c->layer_cache[l]->n_kv,
                      c->layer_cache[l]->head_dim, w, keep);
        if (c->kvq_bits && c->kvq_bits[l] && o > 0 && (size_t)o < n)   /* the layer's KV quantization: bits, group */
            o += snprintf(cfg + o, n - (size_t)o, "/q%dg%d", c->kvq_bits[l], c->kvq_group[l]);
    }
    return XXH3_64bits(cfg, strlen(cfg));
}

typedef struct cand { int n; uint64_t h; char name[64]; } cand;

static int by_len_desc(const void *a, const void *b) { return ((const cand *)b)->n - ((const cand *)a)->n; }

/* reads a whole file through an open descriptor; NULL on failure */
static uint8_t *slurp(int fd, size_t *len) {
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) return NULL;
    size_t n = (size_t)sb.st_size, got = 0;
    uint8_t *b = malloc(n + 1);
    while (b && got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (b && got != n) { free(b); return NULL; }
    *len = n;
    return b;
}

/* tries one candidate: 1 restored, 0 not usable (reported and removed when corrupt) */
static int try_entry(cinfer_tier *t, cinfer_ctx *c, int seq, const cand *cd, const char *cfg, const int32_t *ids) {
    char *p = cf_path(t->dir, cd->name), err[400];
    int fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1, ok = 0;
    size_t len = 0;
    uint8_t *buf = fd >= 0 ? slurp(fd, &len) : NULL;
    tier_entry e;
    cinfer_status st = CINFER_EIO;
    if (fd < 0) goto out;   /* evicted meanwhile */
    if (!buf) { tlog(t, "cache entry %s: unreadable; removed", p); unlink(p); goto out; }
    if ((st = tier_entry_decode(buf, len, &e, err, sizeof err))) {
        tlog(t, "cache entry %s is corrupt (%s); removed, the prefix will be recomputed", p, err);
        unlink(p);
        goto out;
    }
    if (strcmp(e.config, cfg) || e.n_tokens != cd->n || memcmp(e.tokens, ids, sizeof *ids * (size_t)cd->n)) {
        tlog(t, "cache entry %s does not hold what its name says; removed", p);
        unlink(p);
    } else if ((st = cinfer_seq_restore(c, seq, &e.snap)) == CINFER_ENOMEM) {
        tlog(t, "cache entry %s does not fit the memory left (%s); kept, the prefix is recomputed", p, cinfer_ctx_error(c));
        cinfer_seq_free(c, seq);
    } else if (st || cinfer_seq_len(c, seq) != cd->n) {
        tlog(t, "cache entry %s does not fit this context (%s); removed", p, st ? cinfer_ctx_error(c) : "token count");
        cinfer_seq_free(c, seq);
        unlink(p);
    } else {
        ok = 1;
        futimens(fd, NULL);   /* recency for eviction */
    }
    tier_entry_clear(&e);
out:
    if (fd >= 0) close(fd);
    free(buf);
    free(p);
    return ok;
}

cinfer_status cinfer_tier_lookup(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, int max_len,
                                 int *n_cached) {
    return cinfer_tier_lookup_longer(t, c, seq, ids, n, 0, max_len, n_cached);
}

cinfer_status cinfer_tier_lookup_longer(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, int min_len,
                                        int max_len, int *n_cached) {
    *n_cached = 0;
    if (seq < 0 || seq >= c->n_seq || n < 0 || (n && !ids)) return tfail(t, CINFER_EINVAL, "lookup: bad sequence or prompt");
    cinfer_seq_free(c, seq);
    char cfg[8192], pre[20];
    snprintf(pre, sizeof pre, "%016llx-", (unsigned long long)config_of(t, c, cfg, sizeof cfg));
    if (max_len > n) max_len = n;
    cand *cs = NULL;
    int nc = 0, cap = 0;
    lock(t, LOCK_SH);
    DIR *d = opendir(t->dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        cand cd;
        unsigned long long h;
        unsigned nt;
        size_t nl = strlen(de->d_name);
        if (strncmp(de->d_name, pre, 17) || nl != 17 + 8 + 1 + 16 + 4 || strcmp(de->d_name + nl - 4, ".ckv") ||
            sscanf(de->d_name + 17, "%8x-%16llx", &nt, &h) != 2 || nt == 0 || nt > (unsigned)max_len ||
            (int)nt <= min_len)
            continue;
        if (nc == cap) {
            cand *ncs = realloc(cs, sizeof *cs * (size_t)(cap = cap ? cap * 2 : 16));
            if (!ncs) break;
            cs = ncs;
        }
        cd.n = (int)nt;
        cd.h = h;
        memcpy(cd.name, de->d_name, nl + 1);   /* nl checked above */
        cs[nc++] = cd;
    }
    if (d) closedir(d);
    if (nc) qsort(cs, (size_t)nc, sizeof *cs, by_len_desc);
    for (int i = 0; i < nc && !*n_cached; i++)
        if (XXH3_64bits(ids, sizeof *ids * (size_t)cs[i].n) == cs[i].h && try_entry(t, c, seq, &cs[i], cfg, ids))
            *n_cached = cs[i].n;
    lock(t, LOCK_UN);
    free(cs);
    if (!*n_cached) cinfer_seq_free(c, seq);
    return CINFER_OK;
}

typedef struct ent { time_t mt; long ns; size_t sz; char name[64]; } ent;

static int by_age(const void *a, const void *b) {
    const ent *x = a, *y = b;
    return x->mt != y->mt ? (x->mt < y->mt ? -1 : 1) : x->ns != y->ns ? (x->ns < y->ns ? -1 : 1) : 0;
}

/* removes the least recently used entries until the directory fits; keep is never removed */
static void evict(cinfer_tier *t, const char *keep) {
    if (!t->max_bytes) return;
    ent *es = NULL;
    int ne = 0, cap = 0;
    size_t total = 0;
    DIR *d = opendir(t->dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t nl = strlen(de->d_name);
        struct stat sb;
        if (nl < 5 || nl >= 64 || de->d_name[0] == '.' || strcmp(de->d_name + nl - 4, ".ckv")) continue;
        char *p = cf_path(t->dir, de->d_name);
        int ok = p && !stat(p, &sb);
        free(p);
        if (!ok) continue;
        if (ne == cap) {
            ent *n2 = realloc(es, sizeof *es * (size_t)(cap = cap ? cap * 2 : 32));
            if (!n2) break;
            es = n2;
        }
        es[ne] = (ent){sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec, (size_t)sb.st_size, ""};
        memcpy(es[ne].name, de->d_name, nl + 1);   /* nl < 64 checked above */
        total += es[ne++].sz;
    }
    if (d) closedir(d);
    if (ne) qsort(es, (size_t)ne, sizeof *es, by_age);
    for (int i = 0; i < ne && total > t->max_bytes; i++) {
        if (!strcmp(es[i].name, keep)) continue;
        char *p = cf_path(t->dir, es[i].name);
        if (p && !unlink(p)) total -= es[i].sz;
        free(p);
    }
    free(es);
}

struct cinfer_tier_pending {
    char cfg[8192], name[64];
    int32_t *ids;
    int n;
    cinfer_snapshot *snap;
};

void cinfer_tier_pending_free(cinfer_tier_pending *p) {
    if (!p) return;
    cinfer_snapshot_free(p->snap);
    free(p->ids);
    free(p);
}

cinfer_status cinfer_tier_capture(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, cinfer_tier_pending **out) {
    *out = NULL;
    if (seq < 0 || seq >= c->n_seq || n < 1 || !ids || cinfer_seq_len(c, seq) != n)
        return tfail(t, CINFER_EINVAL, "store: sequence %d holds %d tokens, %d ids given", seq, cinfer_seq_len(c, seq), n);
    cinfer_tier_pending *p = calloc(1, sizeof *p);
    if (!p || !(p->ids = malloc(sizeof *ids * (size_t)n))) { free(p); return tfail(t, CINFER_ENOMEM, "out of memory"); }
    snprintf(p->name, sizeof p->name, "%016llx-%08x-%016llx.ckv", (unsigned long long)config_of(t, c, p->cfg, sizeof p->cfg),
             (unsigned)n, (unsigned long long)XXH3_64bits(ids, sizeof *ids * (size_t)n));
    memcpy(p->ids, ids, sizeof *ids * (size_t)n);
    p->n = n;
    char *path = cf_path(t->dir, p->name);
    int have = path && cf_file_exists(path);
    if (have) utimensat(AT_FDCWD, path, NULL, 0);   /* already stored: only its recency changes */
    free(path);
    if (have) { cinfer_tier_pending_free(p); return CINFER_OK; }
    cinfer_status st = cinfer_seq_snapshot(c, seq, &p->snap);
    if (st) { cinfer_tier_pending_free(p); return tfail(t, st, "store: %s", cinfer_ctx_error(c)); }
    *out = p;
    return CINFER_OK;
}

cinfer_status cinfer_tier_commit(cinfer_tier *t, cinfer_tier_pending *p) {
    if (!p) return CINFER_OK;
    char err[512], cfg[8192];
    snprintf(cfg, sizeof cfg, "model=%s;tokenizer=%s;", t->model_fp, t->tok_fp);
    if (strncmp(p->cfg, cfg, strlen(cfg))) {   /* captured through a tier of another model */
        cinfer_tier_pending_free(p);
        return tfail(t, CINFER_EINVAL, "store: the entry was captured for another model");
    }
    void *buf = NULL;
    size_t len = 0;
    char *path = cf_path(t->dir, p->name);
    cinfer_status st = path ? tier_entry_encode(p->snap, p->cfg, p->ids, p->n, &buf, &len, err, sizeof err) : CINFER_ENOMEM;
    if (st) tfail(t, st, "store: %s", path ? err : "out of memory");
    else if (!(t->max_bytes && len > t->max_bytes)) {   /* an entry that could never fit is not stored */
        if ((st = cf_write_atomic(path, buf, len, err, sizeof err))) tfail(t, st, "store: %s", err);
        else {
            lock(t, LOCK_EX);
            evict(t, p->name);
            lock(t, LOCK_UN);
        }
    }
    free(buf);
    free(path);
    cinfer_tier_pending_free(p);
    return st;
}

cinfer_status cinfer_tier_store(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n) {
    cinfer_tier_pending *p;
    cinfer_status st = cinfer_tier_capture(t, c, seq, ids, n, &p);
    return st ? st : cinfer_tier_commit(t, p);
}

/* feeds ids[from..to) into seq in prefill_step steps */
static cinfer_status feed(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int from, int to) {
    for (int done = from; done < to;) {
        int k = to - done < c->prefill_step ? to - done : c->prefill_step;
        cinfer_status st = cinfer_forward_seqs(c, ids + done, 1, k, &seq, NULL, NULL, NULL, 0, NULL);
        if (st) return tfail(t, st, "prefill: %s", cinfer_ctx_error(c));
        done += k;
    }
    return CINFER_OK;
}

static void store_soft(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n) {
    if (cinfer_tier_store(t, c, seq, ids, n))
        tlog(t, "could not store a cache entry in %s (%s); continuing without it", t->dir, t->err);
}

cinfer_status cinfer_tier_prefill(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, int *n_cached) {
    *n_cached = 0;
    if (n < 1 || !ids) return tfail(t, CINFER_EINVAL, "prefill: empty prompt");
    cinfer_status st = cinfer_tier_lookup(t, c, seq, ids, n, n - 1, n_cached);
    /* a checkpoint at a block boundary serves later prompts that share only a prefix of this one */
    int ck = (n - 1) / CINFER_TIER_BLOCK * CINFER_TIER_BLOCK;
    if (!st && ck > *n_cached && ck < n - 1 && !(st = feed(t, c, seq, ids, *n_cached, ck))) store_soft(t, c, seq, ids, ck);
    if (!st && (st = feed(t, c, seq, ids, ck > *n_cached ? ck : *n_cached, n - 1))) return st;
    if (!st && n - 1 > *n_cached) store_soft(t, c, seq, ids, n - 1);
    return st;
}
