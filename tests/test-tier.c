/*
 * test-tier.c — the persistent prefix tier (--cache-dir) on stories260k:
 *   - longest-prefix lookup restores exactly the state a fresh prefill makes;
 *   - a flipped byte in every region of an entry (each preamble byte, header
 *     bytes, the first/middle/last byte of each tensor) and truncations at
 *     every region boundary are detected: reported, removed, a miss;
 *   - a mutation fuzz of the entry decoder: no mutated entry is accepted;
 *   - crash safety: this binary re-executed as a writer (--writer) is killed
 *     with SIGKILL at seeded random moments while it stores entries, >= 200
 *     times; every entry the tier then accepts is complete and equals a fresh
 *     prefill of its tokens, and the temporaries of the dead are swept;
 *   - two processes (--mixed) looking up and storing in one directory with a
 *     size limit: every hit matches a fresh prefill, the directory ends under
 *     its limit; LRU order of eviction.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "engine/tier.h"
#include "model-copy.h"
#include "util.h"

enum { NTOK = 96, NBASE = 320 };

typedef struct env {
    cinfer_model *m;
    cinfer_ctx *c;
    int32_t base[NBASE];
    int logged;           /* tier messages seen */
    char last[768];
} env;

static void on_log(const char *msg, void *user) {
    env *e = user;
    e->logged++;
    snprintf(e->last, sizeof e->last, "%s", msg);
}

static int env_init(env *e) {
    char dir[512], err[512];
    memset(e, 0, sizeof *e);
    snprintf(dir, sizeof dir, "%s/models/stories260k", shared_dir());
    cinfer_load_opts lo = {0};
    lo.n_threads = 1;
    cinfer_ctx_opts co = {0};
    co.max_seqs = 2;
    co.kv_memory = 16u << 20;
    co.kv_page = 16;
    co.n_threads = 1;
    if (cinfer_model_load(dir, &lo, &e->m, err, sizeof err) || cinfer_ctx_new(e->m, &co, &e->c, err, sizeof err)) {
        fprintf(stderr, "setup: %s\n", err);
        return 0;
    }
    for (int i = 0; i < NBASE; i++) e->base[i] = 3 + (i * 7919 + 13) % 500;
    return 1;
}

static void env_free(env *e) {
    cinfer_ctx_free(e->c);
    cinfer_model_free(e->m);
}

static cinfer_tier *open_tier(env *e, const char *dir, size_t max_bytes) {
    cinfer_tier_opts o = {max_bytes, on_log, e};
    cinfer_tier *t = NULL;
    char err[512];
    if (cinfer_tier_open(dir, e->m, &o, &t, err, sizeof err)) fprintf(stderr, "tier: %s\n", err);
    return t;
}

/* seq 1 := a fresh one-chunk prefill of base[0..n) */
static int fresh(env *e, int n) {
    int s = 1;
    cinfer_seq_free(e->c, 1);
    return !cinfer_forward_seqs(e->c, e->base, 1, n, &s, NULL, NULL, NULL, 0, NULL);
}

/* largest |a - b| between seq 0 and seq 1 (f32 KV); -1 when headers differ */
static double seq_diff(env *e) {
    cinfer_snapshot *x = NULL, *y = NULL;
    double d = -1;
    if (!cinfer_seq_snapshot(e->c, 0, &x) && !cinfer_seq_snapshot(e->c, 1, &y) && !strcmp(x->header, y->header) &&
        x->n_tensors == y->n_tensors) {
        d = 0;
        for (int i = 0; i < x->n_tensors && d >= 0; i++) {
            if (x->tensors[i].bytes != y->tensors[i].bytes) { d = -1; break; }
            const float *a = x->tensors[i].data, *b = y->tensors[i].data;
            for (size_t j = 0; j < x->tensors[i].bytes / 4; j++) if (fabs(a[j] - b[j]) > d) d = fabs(a[j] - b[j]);
        }
    }
    cinfer_snapshot_free(x);
    cinfer_snapshot_free(y);
    return d;
}

/* seq 0 := prefill of base[0..n) in one chunk, stored */
static int store(env *e, cinfer_tier *t, int n) {
    cinfer_seq_free(e->c, 0);
    return !cinfer_eval(e->c, e->base, n, 0, NULL) && !cinfer_tier_store(t, e->c, 0, e->base, n);
}

static int count_files(const char *dir, const char *prefix, const char *suffix, size_t *bytes) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (bytes) *bytes = 0;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name), sl = strlen(suffix);
        if (strncmp(de->d_name, prefix, strlen(prefix)) || l < sl || strcmp(de->d_name + l - sl, suffix)) continue;
        n++;
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (bytes && !stat(p, &sb)) *bytes += (size_t)sb.st_size;
    }
    if (d) closedir(d);
    return n;
}

/* the single .ckv file of dir */
static int entry_path(const char *dir, char *out, size_t n) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int found = 0;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".ckv") && de->d_name[0] != '.') { snprintf(out, n, "%s/%s", dir, de->d_name); found++; }
    if (d) closedir(d);
    return found == 1;
}

static void write_file(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    if (f) { if (n) fwrite(b, 1, n, f); fclose(f); }
}

static void test_basic(env *e, const char *root) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/basic", root);
    cinfer_tier *t = open_tier(e, dir, 0);
    CHECK(t && store(e, t, 20) && store(e, t, 50), "store prefixes of 20 and 50 tokens");
    int nc = -1;
    CHECK(!cinfer_tier_lookup(t, e->c, 0, e->base, 80, 80, &nc) && nc == 50 && fresh(e, 50) && seq_diff(e) == 0,
          "an 80-token prompt restores the 50-token entry, equal to a fresh prefill (got %d)", nc);
    CHECK(!cinfer_tier_lookup(t, e->c, 0, e->base, 80, 49, &nc) && nc == 20 && fresh(e, 20) && seq_diff(e) == 0,
          "capped at 49 tokens: the 20-token entry (got %d)", nc);
    int32_t other[40];
    memcpy(other, e->base, sizeof other);
    other[30] ^= 1;
    CHECK(!cinfer_tier_lookup(t, e->c, 0, other, 40, 40, &nc) && nc == 20, "a prompt that leaves the 50 at token 30 gets 20 (got %d)", nc);
    /* tier_prefill: feeds the rest and stores n-1 */
    cinfer_seq_free(e->c, 0);
    CHECK(!cinfer_tier_prefill(t, e->c, 0, e->base, 70, &nc) && nc == 50 && cinfer_seq_len(e->c, 0) == 69 &&
          count_files(dir, "", ".ckv", NULL) == 3, "prefill of 70: 50 from disk, 19 fed, a 69-token entry stored");
    /* a checkpoint at the block boundary serves a prompt that shares only a prefix */
    int32_t *alt = malloc(sizeof(int32_t) * 300);
    memcpy(alt, e->base, sizeof(int32_t) * 300);
    alt[280] ^= 1;
    cinfer_seq_free(e->c, 0);
    int nc2 = -1;
    CHECK(!cinfer_tier_prefill(t, e->c, 0, e->base, 300, &nc) && nc == 69 && count_files(dir, "", ".ckv", NULL) == 5 &&
          !cinfer_tier_prefill(t, e->c, 0, alt, 300, &nc2) && nc2 == CINFER_TIER_BLOCK,
          "prefill of 300 stores a %d-token checkpoint and 299; a prompt leaving it at 280 restores the checkpoint (got %d, %d)",
          CINFER_TIER_BLOCK, nc, nc2);
    free(alt);
    cinfer_tier_free(t);
    /* another configuration (f16 KV) never sees these entries */
    cinfer_ctx_opts co = {0};
    co.kv_dtype = "f16";
    co.max_seqs = 1;
    co.kv_memory = 8u << 20;
    cinfer_ctx *h = NULL;
    char err[256];
    t = open_tier(e, dir, 0);
    CHECK(!cinfer_ctx_new(e->m, &co, &h, err, sizeof err) && !cinfer_tier_lookup(t, h, 0, e->base, 80, 80, &nc) && nc == 0,
          "an f16 context misses the f32 entries (got %d)", nc);
    cinfer_ctx_free(h);
    /* a window (--max-kv-size 32, keep 4): its own configuration; the restored state continues as the live one */
    co.kv_dtype = "f32";
    co.max_kv_size = 32;
    cinfer_ctx *w = NULL, *w2 = NULL;
    float la[512], lb[512];
    int32_t next = 77;
    int ok = !cinfer_ctx_new(e->m, &co, &w, err, sizeof err) && !cinfer_ctx_new(e->m, &co, &w2, err, sizeof err) &&
             !cinfer_eval(w, e->base, 60, 0, NULL) && !cinfer_tier_store(t, w, 0, e->base, 60) &&
             !cinfer_tier_lookup(t, w2, 0, e->base, 70, 70, &nc) && nc == 60 && !cinfer_eval(w, &next, 1, 0, la) &&
             !cinfer_eval(w2, &next, 1, 0, lb) && !memcmp(la, lb, sizeof la);
    CHECK(ok, "a --max-kv-size 32 state (60 tokens, older ones dropped) restores and continues identically (got %d)", nc);
    cinfer_ctx_free(w);
    cinfer_ctx_free(w2);
    cinfer_tier_free(t);
}

/* every region of one entry, flipped and truncated */
static void test_corruption(env *e, const char *root) {
    char dir[600], path[1400];
    snprintf(dir, sizeof dir, "%s/corrupt", root);
    cinfer_tier *t = open_tier(e, dir, 0);
    char *orig = NULL;
    size_t len = 0;
    if (!t || !store(e, t, 40) || !entry_path(dir, path, sizeof path) || cf_read_file(path, &orig, &len, NULL, 0)) {
        CHECK(0, "corruption setup");
        cinfer_tier_free(t);
        return;
    }
    tier_entry te;
    CHECK(!tier_entry_decode(orig, len, &te, NULL, 0), "the entry decodes");
    size_t hl = (uint8_t)orig[8] | (size_t)(uint8_t)orig[9] << 8 | (size_t)(uint8_t)orig[10] << 16;
    size_t at[512];
    int na = 0;
    for (size_t i = 0; i < TIER_PRE; i++) at[na++] = i;                        /* preamble */
    for (int k = 0; k < 48; k++) at[na++] = TIER_PRE + (hl - 1) * k / 47;      /* header */
    size_t data = TIER_PRE + hl;
    for (int i = 0; i < te.snap.n_tensors; i++) {                              /* each tensor */
        size_t o = (size_t)((char *)te.snap.tensors[i].data - orig), b = te.snap.tensors[i].bytes;
        at[na++] = o, at[na++] = o + b / 2, at[na++] = o + b - 1;
    }
    int n_flip = na, missed = 0, kept = 0, silent = 0;
    size_t cuts[256];
    int nc_ = 0;
    size_t marks[] = {0, 7, 8, 16, 23, 24, TIER_PRE + hl / 2, data - 1, data, len - 1};
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) cuts[nc_++] = marks[i];
    for (int i = 0; i < te.snap.n_tensors; i++) {
        size_t o = (size_t)((char *)te.snap.tensors[i].data - orig);
        cuts[nc_++] = o + 1, cuts[nc_++] = o + te.snap.tensors[i].bytes / 2;
    }
    char *b = malloc(len + 1);
    for (int k = 0; k < n_flip + nc_; k++) {
        memcpy(b, orig, len);
        size_t L = len;
        if (k < n_flip) b[at[k]] ^= (char)(1 << (k % 8));
        else L = cuts[k - n_flip];
        write_file(path, b, L);
        int before = e->logged, nc = -1;
        cinfer_tier_lookup(t, e->c, 0, e->base, 60, 60, &nc);
        missed += nc != 0;
        kept += cf_file_exists(path);
        silent += e->logged == before;
    }
    CHECK(!missed && !kept && !silent, "%d flipped bytes (preamble, header, each tensor's first/middle/last) and %d truncations: "
          "all detected, reported, removed (missed %d, kept %d, unreported %d); last report: %s", n_flip, nc_, missed, kept, silent, e->last);
    /* recomputed: the next prefill stores it again */
    int nc = -1;
    cinfer_seq_free(e->c, 0);
    CHECK(!cinfer_tier_prefill(t, e->c, 0, e->base, 41, &nc) && nc == 0 && cf_file_exists(path), "recomputed and stored again");
    /* mutation fuzz of the decoder: nothing mutated is accepted */
    uint64_t r = 12345;
    int accepted = 0, n = 3000;
    for (int it = 0; it < n; it++) {
        memcpy(b, orig, len);
        size_t L = len;
        for (int j = 0; j < 1 + it % 5; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (r >> 20) % (it % 3 ? len : TIER_PRE + hl);
            b[pos] = (char)(r >> 45);
        }
        if (it % 7 == 0) L = (size_t)(r >> 11) % len;
        if (L == len && !memcmp(b, orig, len)) continue;
        tier_entry x;
        if (!tier_entry_decode(b, L, &x, NULL, 0)) { accepted++; tier_entry_clear(&x); }
    }
    CHECK(!accepted, "%d mutated entries through the decoder: %d accepted", n, accepted);
    tier_entry_clear(&te);
    free(b);
    free(orig);
    cinfer_tier_free(t);
}

/* ------------------------------------------------- child processes */

static int child_main(const char *mode, const char *dir, unsigned seed, size_t max_bytes, int ready_fd) {
    env e;
    if (!env_init(&e)) return 3;
    cinfer_tier *t = open_tier(&e, dir, max_bytes);
    if (!t) return 3;
    if (ready_fd >= 0) { if (write(ready_fd, "r", 1) != 1) return 3; close(ready_fd); }
    int bad = 0;
    for (int it = 0; !strcmp(mode, "--writer") || it < 60; it++) {
        seed = seed * 1103515245u + 12345u;
        int n = 2 + (int)((seed >> 8) % (NTOK - 2)), nc = 0;
        if (!strcmp(mode, "--writer")) { store(&e, t, n); continue; }
        if (cinfer_tier_lookup(t, e.c, 0, e.base, n, n, &nc)) bad++;
        if (nc && (!fresh(&e, nc) || seq_diff(&e) != 0)) bad++;
        if (nc < n) store(&e, t, n);
    }
    cinfer_tier_free(t);
    env_free(&e);
    return bad ? 1 : 0;
}

static pid_t spawn(const char *self, const char *mode, const char *dir, unsigned seed, size_t max_bytes, int *ready) {
    int p[2] = {-1, -1};
    if (ready && pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char s[32], mb[32], fd[16];
        snprintf(s, sizeof s, "%u", seed);
        snprintf(mb, sizeof mb, "%zu", max_bytes);
        snprintf(fd, sizeof fd, "%d", p[1]);
        if (p[0] >= 0) close(p[0]);
        execl(self, self, mode, dir, s, mb, fd, (char *)NULL);
        _exit(127);
    }
    if (ready) { close(p[1]); *ready = p[0]; }
    return pid;
}

static void test_crash(env *e, const char *self, const char *root) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/crash", root);
    mkdir(dir, 0755);
    uint64_t r = 20261201;   /* the seed */
    int kills = 0, tmp_seen = 0;
    for (int k = 0; k < 200; k++) {
        int ready = -1;
        pid_t pid = spawn(self, "--writer", dir, (unsigned)k * 2654435761u, 0, &ready);
        char c;
        int up = pid > 0 && read(ready, &c, 1) == 1;
        close(ready);
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        struct timespec ts = {0, (long)((r >> 33) % 8000000)};   /* 0..8 ms into the writing loop */
        if (up) nanosleep(&ts, NULL);
        if (pid > 0 && !kill(pid, SIGKILL)) kills++;
        int st;
        if (pid > 0) waitpid(pid, &st, 0);
        tmp_seen += count_files(dir, ".tmp.", ".ckv", NULL) > 0;
    }
    int left = count_files(dir, ".tmp.", ".ckv", NULL);
    cinfer_tier *t = open_tier(e, dir, 0);   /* sweeps the temporaries of the dead */
    int swept = left - count_files(dir, ".tmp.", ".ckv", NULL), n_ent = count_files(dir, "", ".ckv", NULL), good = 0, bad = 0;
    for (int n = 2; t && n < NTOK; n++) {   /* every entry the tier accepts */
        int nc = 0;
        if (cinfer_tier_lookup(t, e->c, 0, e->base, n, n, &nc) || nc != n) continue;
        if (fresh(e, n) && seq_diff(e) == 0) good++;
        else bad++;
    }
    CHECK(kills >= 200 && good > 0 && !bad && good == n_ent - left && swept == left,
          "%d SIGKILLs mid-write (seed 20261201): %d entries accepted, all equal a fresh prefill (%d differ); "
          "a temporary was left after %d kills, %d left at the end and all swept", kills, good, bad, tmp_seen, left);
    cinfer_tier_free(t);
}

static void test_concurrent(env *e, const char *self, const char *root) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/shared", root);
    mkdir(dir, 0755);
    /* an entry of n tokens: 5 layers x K,V x 4 heads x n x 8 floats + header */
    size_t limit = 8 * (size_t)(5 * 2 * 4 * 60 * 8 * 4);
    pid_t a = spawn(self, "--mixed", dir, 1, limit, NULL), b = spawn(self, "--mixed", dir, 2, limit, NULL);
    int sa = -1, sb = -1;
    waitpid(a, &sa, 0);
    waitpid(b, &sb, 0);
    size_t bytes = 0;
    int n = count_files(dir, "", ".ckv", &bytes);
    CHECK(WIFEXITED(sa) && !WEXITSTATUS(sa) && WIFEXITED(sb) && !WEXITSTATUS(sb),
          "two processes x 60 lookups/stores in one directory: every hit equals a fresh prefill (exit %d, %d)", sa, sb);
    CHECK(bytes <= limit && n > 0, "size limit kept: %d entries, %zu bytes <= %zu", n, bytes, limit);
    (void)e;
}

static void test_lru(env *e, const char *root) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/lru", root);
    size_t one = 0;
    cinfer_tier *t = open_tier(e, dir, 0);
    store(e, t, 30);
    count_files(dir, "", ".ckv", &one);
    cinfer_tier_free(t);
    t = open_tier(e, dir, one * 2 + one / 2);   /* room for two entries of about this size */
    struct timespec ms = {0, 20000000};
    nanosleep(&ms, NULL);
    store(e, t, 31);
    nanosleep(&ms, NULL);
    int nc = 0;
    cinfer_tier_lookup(t, e->c, 0, e->base, 30, 30, &nc);   /* 30 becomes the most recent */
    nanosleep(&ms, NULL);
    store(e, t, 32);
    int has30 = 0, has31 = 0, has32 = 0;
    cinfer_tier_lookup(t, e->c, 0, e->base, 30, 30, &has30);
    cinfer_tier_lookup(t, e->c, 0, e->base, 31, 31, &has31);
    cinfer_tier_lookup(t, e->c, 0, e->base, 32, 32, &has32);
    CHECK(nc == 30 && has30 == 30 && has31 != 31 && has32 == 32, "LRU: the entry used least recently (31) is the one evicted");
    cinfer_tier_free(t);
}

/* the fingerprint memo of a tier directory: the first open computes and writes it, a repeat open takes it
 * (equal to a fresh computation); a shard rewritten in place with its size and mtime put back is seen
 * (ctime) and fingerprinted anew; a garbled memo is a miss */
static void test_fp_memo(const char *root) {
    char md[200], dir[300], p[400], mfp[33], tfp[33], m2[33], t2[33], want[33], cmd[1600];
    copy_model(root, "fpmodel", NULL, NULL, md, sizeof md);
    snprintf(dir, sizeof dir, "%s/fpdir", root);
    mkdir(dir, 0755);
    sleep(2);   /* files changed within the last second are not memoised */
    cinfer_model *m = NULL;
    char err[512];
    int hit1 = -1, hit2 = -1, hit3 = -1, hit4 = -1;
    if (cinfer_model_load(md, NULL, &m, err, sizeof err)) { CHECK(0, "load the copy: %s", err); return; }
    int ok = !tier_fingerprints(m, dir, mfp, tfp, &hit1) && !tier_fingerprints(m, dir, m2, t2, &hit2) &&
             !cinfer_model_fingerprint(m, want);
    CHECK(ok && hit1 == 0 && hit2 == 1 && !strcmp(mfp, m2) && !strcmp(tfp, t2) && !strcmp(mfp, want),
          "fingerprint memo: computed on the first open (hit %d), taken on the second (hit %d), equal to a fresh one", hit1, hit2);
    double t0 = cf_now();
    for (int i = 0; i < 100; i++) tier_fingerprints(m, dir, m2, t2, &hit2);
    double per = (cf_now() - t0) / 100;
    t0 = cf_now();
    cinfer_model_fingerprint(m, want);
    printf("# memo hit %.1f us, full fingerprint %.1f us (stories260k)\n", per * 1e6, (cf_now() - t0) * 1e6);
    cinfer_model_free(m);
    /* one weight byte changed in place, the size and the mtime put back */
    snprintf(p, sizeof p, "%s/model.safetensors", md);
    struct stat sb;
    stat(p, &sb);
    int fd = open(p, O_RDWR);
    unsigned char b = 0;
    ok = fd >= 0 && pread(fd, &b, 1, sb.st_size - 1) == 1 && (b ^= 1, pwrite(fd, &b, 1, sb.st_size - 1) == 1);
    if (fd >= 0) close(fd);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    ok = ok && !utimensat(AT_FDCWD, p, ts, 0);
    sleep(2);
    m = NULL;
    ok = ok && !cinfer_model_load(md, NULL, &m, err, sizeof err) && !tier_fingerprints(m, dir, m2, t2, &hit3) &&
         !cinfer_model_fingerprint(m, want);
    CHECK(ok && hit3 == 0 && strcmp(m2, mfp) && !strcmp(m2, want) && !strcmp(t2, tfp),
          "a shard changed in place (same size and mtime): the memo misses (hit %d), the fingerprint changes", hit3);
    snprintf(cmd, sizeof cmd, "for f in %s/.fp-*; do printf 'garbage' > $f; done", dir);
    ok = ok && !system(cmd) && !tier_fingerprints(m, dir, m2, t2, &hit4);
    CHECK(ok && hit4 == 0 && !strcmp(m2, want), "a garbled memo is a miss, recomputed (hit %d)", hit4);
    cinfer_model_free(m);
}

int main(int argc, char **argv) {
    if (argc == 6) return child_main(argv[1], argv[2], (unsigned)strtoul(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), atoi(argv[5]));
    env e;
    if (!env_init(&e)) { CHECK(0, "load stories260k"); return CHECK_DONE(); }
    char root[] = "/tmp/cinfer-tier-XXXXXX";
    CHECK(mkdtemp(root) != NULL, "temp dir %s", root);
    test_basic(&e, root);
    test_corruption(&e, root);
    test_lru(&e, root);
    test_fp_memo(root);
    test_concurrent(&e, argv[0], root);
    double t0 = cf_now();
    test_crash(&e, argv[0], root);
    printf("# crash loop: %.1f s\n", cf_now() - t0);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) printf("# could not remove %s\n", root);
    env_free(&e);
    return CHECK_DONE();
}
