/*
 * fingerprint.c — model and tokenizer fingerprints (XXH3-128, 32 hex digits)
 * that key saved cache state. The model's covers config.json, each shard's
 * safetensors header (names, dtypes, shapes, offsets, metadata) and a sample
 * of every tensor's bytes: FP_SLICES slices of 64 bytes spread over the
 * tensor, first and last included (the whole tensor when it is smaller):
 * fine-tuning moves nearly every weight, so this tells two fine-tunes of one
 * base apart, while touching only a few pages per tensor of the mapped
 * weights (each a page fault, with readahead, when they are not cached yet:
 * so few slices). The tokenizer's covers tokenizer.json and
 * tokenizer_config.json as bytes.
 *
 * A tier directory memoises both (tier_fingerprints): a file ".fp-<hash of
 * the key>" holding the key — for config.json, the tokenizer files and each
 * shard: path, device, inode, size, mtime and ctime in ns — and the two
 * fingerprints. A repeat open costs a stat per file and one small read; any
 * change to a file changes its ctime (which no user call can set back), so
 * its key, so the memo is not found and the fingerprints are recomputed. A
 * file changed within the last FP_SETTLE seconds is not memoised (it could
 * change again within one timestamp tick unseen).
 */
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include "engine/engine.h"
#include "engine/tier.h"
#include "util.h"

enum { FP_SLICES = 4, FP_SETTLE = 1 };

/* asynchronous readahead of the pages under [p, p+n) of a mapping (a hint: failures are ignored) */
static void prefetch(const uint8_t *p, size_t n) {
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(pg - 1);
    madvise((void *)a, (uintptr_t)p + n - a, MADV_WILLNEED);
}

static void hex128(XXH128_hash_t h, char out[33]) { snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64); }

/* hashes a file's bytes (or a marker when it is absent) */
static cinfer_status hash_file(XXH3_state_t *x, const char *dir, const char *name) {
    char *p = cf_path(dir, name), *buf = NULL;
    size_t len = 0;
    if (!p) return CINFER_ENOMEM;
    XXH3_128bits_update(x, name, strlen(name) + 1);
    cinfer_status st = cf_file_exists(p) ? cf_read_file(p, &buf, &len, NULL, 0) : CINFER_OK;
    if (!st) XXH3_128bits_update(x, buf ? buf : "(absent)", buf ? len : 8);
    free(buf);
    free(p);
    return st;
}

cinfer_status cinfer_model_fingerprint(const cinfer_model *m, char out[33]) {
    XXH3_state_t *x = XXH3_createState();
    if (!x) return CINFER_ENOMEM;
    XXH3_128bits_reset(x);
    XXH3_128bits_update(x, "cinfer-model-fp-1", 17);
    cinfer_status st = hash_file(x, m->dir, "config.json");
    for (int f = 0; !st && f < m->st.n_files; f++) {
        const uint8_t *b = m->st.maps[f];
        if (!b || m->st.map_len[f] < 8) continue;
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
        if (hl <= m->st.map_len[f] - 8) XXH3_128bits_update(x, b, 8 + hl);
    }
    /* ask for every sampled page first (asynchronous readahead), so a cold page cache serves the reads
     * in parallel instead of one page fault after another (3.2-3.6 s -> see BENCHMARKS.md on a 2.2 GB shard) */
    for (int i = 0; i < m->st.n; i++) {
        const st_tensor *t = &m->st.t[i];
        for (int k = 0; k < FP_SLICES && t->nbytes > FP_SLICES * 64; k++) prefetch((const uint8_t *)t->data + (t->nbytes - 64) * k / (FP_SLICES - 1), 64);
    }
    for (int i = 0; !st && i < m->st.n; i++) {
        const st_tensor *t = &m->st.t[i];
        XXH3_128bits_update(x, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(x, &t->nbytes, sizeof t->nbytes);
        const uint8_t *d = t->data;
        if (t->nbytes <= FP_SLICES * 64) { XXH3_128bits_update(x, d, t->nbytes); continue; }
        for (int k = 0; k < FP_SLICES; k++) XXH3_128bits_update(x, d + (t->nbytes - 64) * k / (FP_SLICES - 1), 64);
    }
    if (!st) hex128(XXH3_128bits_digest(x), out);
    XXH3_freeState(x);
    return st;
}

cinfer_status cinfer_tokenizer_fingerprint(const cinfer_model *m, char out[33]) {
    XXH3_state_t *x = XXH3_createState();
    if (!x) return CINFER_ENOMEM;
    XXH3_128bits_reset(x);
    XXH3_128bits_update(x, "cinfer-tok-fp-1", 15);
    cinfer_status st = hash_file(x, m->dir, "tokenizer.json");
    if (!st) st = hash_file(x, m->dir, "tokenizer_config.json");
    if (!st) hex128(XXH3_128bits_digest(x), out);
    XXH3_freeState(x);
    return st;
}

/* ------------------------------------------------------------ the memo */

/* a growing key string */
typedef struct { char *s; size_t n, cap; int racy; } fp_key;

static int key_add(fp_key *k, const char *path, time_t now) {
    struct stat sb;
    char line[64 + 4096];
    int ok = !stat(path, &sb);
    int l = ok ? snprintf(line, sizeof line, "%s|%llu|%llu|%lld|%lld.%09ld|%lld.%09ld\n", path, (unsigned long long)sb.st_dev,
                          (unsigned long long)sb.st_ino, (long long)sb.st_size, (long long)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec,
                          (long long)sb.st_ctim.tv_sec, sb.st_ctim.tv_nsec)
               : snprintf(line, sizeof line, "%s|absent\n", path);
    /* a file changed within the last FP_SETTLE seconds may change again within one timestamp tick, unseen */
    if (ok && (sb.st_mtim.tv_sec >= now - FP_SETTLE || sb.st_ctim.tv_sec >= now - FP_SETTLE)) k->racy = 1;
    if (l < 0 || (size_t)l >= sizeof line) return 0;
    if (k->n + (size_t)l + 1 > k->cap) {
        char *s2 = realloc(k->s, k->cap = (k->n + (size_t)l + 1) * 2);
        if (!s2) return 0;
        k->s = s2;
    }
    memcpy(k->s + k->n, line, (size_t)l + 1);
    k->n += (size_t)l;
    return 1;
}

cinfer_status tier_fingerprints(const cinfer_model *m, const char *dir, char model_fp[33], char tok_fp[33], int *hit) {
    static const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json"};
    fp_key k = {NULL, 0, 0, 0};
    time_t now = time(NULL);
    int ok = 1;
    *hit = 0;
    for (int i = 0; ok && i < 3; i++) {
        char *p = cf_path(m->dir, files[i]);
        ok = p && key_add(&k, p, now);
        free(p);
    }
    for (int f = 0; ok && f < m->st.n_files; f++) ok = m->st.paths[f] && key_add(&k, m->st.paths[f], now);
    char name[40], *path = NULL, *memo = NULL;
    size_t len = 0;
    if (ok) {
        snprintf(name, sizeof name, ".fp-%016llx", (unsigned long long)XXH3_64bits(k.s, k.n));
        path = cf_path(dir, name);
    }
    /* the memo: "cinfer-fp-memo-1\n" key "model_fp tok_fp\n" */
    if (path && cf_file_exists(path) && !cf_read_file(path, &memo, &len, NULL, 0) && len == 17 + k.n + 66 &&
        !memcmp(memo, "cinfer-fp-memo-1\n", 17) && !memcmp(memo + 17, k.s, k.n) && memo[17 + k.n + 32] == ' ' &&
        memo[len - 1] == '\n' && strspn(memo + 17 + k.n, "0123456789abcdef") == 32 &&
        strspn(memo + 17 + k.n + 33, "0123456789abcdef") == 32) {
        memcpy(model_fp, memo + 17 + k.n, 32);
        memcpy(tok_fp, memo + 17 + k.n + 33, 32);
        model_fp[32] = tok_fp[32] = 0;
        *hit = 1;
    }
    free(memo);
    cinfer_status st = CINFER_OK;
    if (!*hit) {
        st = cinfer_model_fingerprint(m, model_fp);
        if (!st) st = cinfer_tokenizer_fingerprint(m, tok_fp);
        /* a memo is an optimisation: one that cannot be written is skipped */
        size_t ml = 17 + k.n + 66;
        char *b = !st && path && !k.racy ? malloc(ml + 1) : NULL;
        if (b) {
            snprintf(b, ml + 1, "cinfer-fp-memo-1\n%s%s %s\n", k.s, model_fp, tok_fp);
            cf_write_atomic(path, b, ml, NULL, 0);
        }
        free(b);
    }
    free(path);
    free(k.s);
    return st;
}
