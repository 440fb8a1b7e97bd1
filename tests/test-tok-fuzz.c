/*
 * test-tok-fuzz.c — deterministic fuzzing of the tokenizer (design §3:
 * parsers get a fuzz target). Runs in CI, also under ASan+UBSan.
 *
 * 1. Mutated tokenizer.json files (byte flips, cut ranges, repeated ranges,
 *    inserted JSON punctuation) must load or fail with a message; whatever
 *    loads must encode and decode without crashing.
 * 2. Random texts (ASCII, multi-byte UTF-8, emoji, combining marks, special
 *    token text, invalid bytes) through real tokenizers: ids in range,
 *    streaming decode equals whole decode with complete-UTF-8 chunks, and
 *    for Llama 3 (no normalizer) decode(encode(x)) is x with invalid
 *    sequences replaced by U+FFFD. Several threads share one tokenizer.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "tokenizer/tokenizer.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static char tmpdir[256];

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = fread(b, 1, (size_t)l, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static void write_all(const char *path, const char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

static void fuzz_load(void) {
    char p[600], d[600], q[700];
    snprintf(p, sizeof p, "%s/models/stories260k/tokenizer.json", shared_dir());
    size_t n;
    char *orig = read_all(p, &n);
    if (!orig) { CHECK(0, "read %s", p); return; }
    snprintf(d, sizeof d, "%s/mut", tmpdir);
    snprintf(q, sizeof q, "mkdir -p '%s'", d);
    if (system(q) != 0) return;
    snprintf(q, sizeof q, "%s/tokenizer.json", d);
    int loaded = 0, failed_clean = 0, bad = 0, iters = 300;
    char *buf = malloc(n * 2 + 64);
    for (int it = 0; it < iters; it++) {
        memcpy(buf, orig, n);
        size_t m = n;
        int k = 1 + (int)(rnd() % 4);
        for (int j = 0; j < k; j++) {
            size_t at = rnd() % m;
            switch (rnd() % 4) {
            case 0: buf[at] ^= (char)(1u << (rnd() % 8)); break;
            case 1: { size_t len = rnd() % 64; if (at + len > m) len = m - at;
                      memmove(buf + at, buf + at + len, m - at - len); m -= len; break; }
            case 2: { size_t len = rnd() % 64; if (at + len > m) len = m - at;
                      if (m + len <= n * 2) { memmove(buf + at + len, buf + at, m - at); m += len; } break; }
            default: { const char *ins = "{}[],:\"\\0123456789-e.tfn "; char c = ins[rnd() % strlen(ins)];
                       buf[at] = c; break; }
            }
        }
        write_all(q, buf, m);
        cinfer_tokenizer *t = NULL;
        char err[512] = "";
        cinfer_status st = cinfer_tokenizer_load(d, &t, err, sizeof err);
        if (st == CINFER_OK && t) {
            loaded++;
            int32_t *ids = NULL;
            int nids = 0;
            const char *txt = "Once upon a time, \xe6\x97\xa5\xe6\x9c\xac <s> \xff!";
            if (cinfer_tokenize(t, txt, strlen(txt), 1, 1, &ids, &nids) == CINFER_OK) {
                char *out = NULL;
                for (int i = 0; i < nids; i++)
                    if (ids[i] < 0 || ids[i] >= cinfer_tokenizer_n_vocab(t)) bad++;
                cinfer_detokenize(t, ids, nids, 0, &out);
                free(out);
            }
            free(ids);
        } else if (st != CINFER_OK && !t && err[0]) failed_clean++;
        else bad++;
        cinfer_tokenizer_free(t);
    }
    CHECK(bad == 0 && loaded + failed_clean == iters,
          "%d mutated tokenizer.json files: %d loaded and encoded, %d failed with a message, %d bad",
          iters, loaded, failed_clean, bad);
    free(buf);
    free(orig);
}

static const char *const pieces[] = {
    "a", "the ", " ", "  ", "\n", "\r\n", "\t", "Hello", "123", "4567", "'s", "'LL", "!?", "...", "\xc3\xa9",
    "e\xcc\x81", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xf0\x9f\x87\xaf\xf0\x9f\x87\xb5",
    "\xe2\x80\x8d", "\xe2\x96\x81", "\xc4\xa0", "<s>", "</s>", "<|im_start|>", "<|eot_id|>", "<start_of_turn>",
    "<0x41>", "\xff", "\xc3", "\xe4\xbd", "\xed\xa0\x80", "\x00", "\xc2\xa0", "\xe3\x80\x80", "<b>", "<unused3>",
};

static size_t rand_text(char *o, size_t cap) {
    size_t n = 0;
    int k = (int)(rnd() % 24);
    for (int i = 0; i < k; i++) {
        const char *p = pieces[rnd() % (sizeof pieces / sizeof *pieces)];
        size_t l = strcmp(p, "\x00") ? strlen(p) : 1;
        if (n + l >= cap) break;
        memcpy(o + n, p, l);
        n += l;
    }
    o[n] = 0;
    return n;
}

typedef struct job { const cinfer_tokenizer *t; uint64_t seed; int bad; } job;

static void *encode_many(void *arg) {
    job *j = arg;
    char txt[512];
    uint64_t s = j->seed;
    for (int it = 0; it < 40; it++) {
        size_t n = 0;
        for (int k = 0; k < 40; k++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            const char *p = pieces[(s >> 20) % (sizeof pieces / sizeof *pieces)];
            size_t l = strlen(p);
            if (n + l >= sizeof txt) break;
            memcpy(txt + n, p, l);
            n += l;
        }
        int32_t *a, *b;
        int na, nb;
        if (cinfer_tokenize(j->t, txt, n, 1, 1, &a, &na) || cinfer_tokenize(j->t, txt, n, 1, 1, &b, &nb)) { j->bad++; continue; }
        if (na != nb || memcmp(a, b, sizeof *a * (size_t)na)) j->bad++;
        free(a);
        free(b);
    }
    return NULL;
}

static int place(const char *src, const char *dst) {
    char cmd[3400], gz[1500];
    if (access(src, R_OK) == 0) snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    else {
        snprintf(gz, sizeof gz, "%s.gz", src);
        if (access(gz, R_OK) != 0) return 0;
        snprintf(cmd, sizeof cmd, "gzip -dc '%s' > '%s'", gz, dst);
    }
    return system(cmd) == 0;
}

static void fuzz_text(const char *name, int exact_roundtrip) {
    char dir[600], a[1400], b[1400];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    snprintf(a, sizeof a, "mkdir -p '%s'", dir);
    if (system(a) != 0) return;
    if (!strcmp(name, "stories260k")) snprintf(a, sizeof a, "%s/models/stories260k/tokenizer.json", shared_dir());
    else snprintf(a, sizeof a, "%s/tokenizers/%s/tokenizer.json", shared_dir(), name);
    snprintf(b, sizeof b, "%s/tokenizer.json", dir);
    if (!place(a, b)) { CHECK(0, "%s: set up", name); return; }
    cinfer_tokenizer *t = NULL;
    char err[512];
    if (cinfer_tokenizer_load(dir, &t, err, sizeof err)) { CHECK(0, "%s: load: %s", name, err); return; }
    int iters = 400, bad_ids = 0, bad_stream = 0, bad_rt = 0, bad_chunk = 0;
    char txt[1024];
    for (int it = 0; it < iters; it++) {
        size_t n = rand_text(txt, sizeof txt);
        int32_t *ids;
        int nids;
        if (cinfer_tokenize(t, txt, n, rnd() % 2, rnd() % 2, &ids, &nids)) { bad_ids++; continue; }
        for (int i = 0; i < nids; i++) bad_ids += ids[i] < 0 || ids[i] >= cinfer_tokenizer_n_vocab(t);
        char *whole = NULL;
        cinfer_detokenize(t, ids, nids, 0, &whole);
        cinfer_detok_stream *s = cinfer_detok_stream_new(t, 0);
        size_t cap = 4096, len = 0;
        char *acc = calloc(1, cap);
        for (int i = 0; i <= nids; i++) {
            const char *p = i < nids ? cinfer_detok_stream_push(s, ids[i]) : cinfer_detok_stream_flush(s);
            size_t l = strlen(p);
            for (size_t k = 0; k < l;) {
                int u = tok_utf8_next((const unsigned char *)p + k, l - k);
                if (u <= 0) { bad_chunk++; break; }
                k += (size_t)u;
            }
            if (len + l + 1 < cap) { memcpy(acc + len, p, l + 1); len += l; }
        }
        cinfer_detok_stream_free(s);
        /* the C API's text is NUL-terminated: texts holding a NUL are not comparable */
        if (!memchr(txt, 0, n) && (!whole || strcmp(acc, whole))) bad_stream++;
        if (exact_roundtrip && !memchr(txt, 0, n)) {
            int32_t *r;
            int nr;
            cinfer_tokenize(t, txt, n, 0, 1, &r, &nr);
            char *out = NULL;
            cinfer_detokenize(t, r, nr, 0, &out);
            size_t sn;
            char *san = tok_utf8_sanitize(txt, n, &sn);
            if (!out || strlen(out) != sn || memcmp(out, san, sn)) bad_rt++;
            free(san);
            free(out);
            free(r);
        }
        free(acc);
        free(whole);
        free(ids);
    }
    CHECK(bad_ids == 0, "%s: %d random texts encode to in-range ids", name, iters);
    CHECK(bad_stream == 0 && bad_chunk == 0, "%s: streaming equals whole decode, chunks complete UTF-8 (%d, %d bad)",
          name, bad_stream, bad_chunk);
    if (exact_roundtrip) CHECK(bad_rt == 0, "%s: decode(encode(x)) == x for random text (%d bad)", name, bad_rt);
    pthread_t th[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){t, 0x1234567ULL * (uint64_t)(i + 1), 0};
        pthread_create(&th[i], NULL, encode_many, &jobs[i]);
    }
    int bad_thr = 0;
    for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); bad_thr += jobs[i].bad; }
    CHECK(bad_thr == 0, "%s: 4 threads encoding with one tokenizer agree", name);
    cinfer_tokenizer_free(t);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cinfer-tokfuzz-XXXXXX");
    if (!mkdtemp(tmpdir)) { printf("FAIL mkdtemp\n"); return 1; }
    fuzz_load();
    fuzz_text("stories260k", 0);
    fuzz_text("llama3", 1);
    fuzz_text("qwen3", 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) return 1;
    return CHECK_DONE();
}
