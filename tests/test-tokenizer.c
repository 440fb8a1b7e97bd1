/*
 * test-tokenizer.c — encode/decode parity with Hugging Face `tokenizers`
 * (Tokenizer.from_file) on real tokenizer files, from the golden ids in
 * tests/fixtures/tokenizer/<name>.json (made by
 * tests/reference/make_tokenizer_fixtures.py on the GPU machine).
 *
 * For each tokenizer (stories260k, llama2, qwen3, llama3, gemma3): every
 * hard string encodes to the reference ids with and without the
 * post-processor's BOS/EOS and with specials as plain text; decodes to the
 * reference text (with and without skip_special); streaming decode equals
 * whole decode; whole Austen chapters match id for id; in the release build
 * the six novels match by id count and FNV-1a hash. The gzipped tokenizer
 * files of ../shared are unpacked into a temporary directory first.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "tokenizer/tokenizer.h"  /* tok_utf8_sanitize: the reference text of invalid UTF-8 */

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static char tmpdir[256];

static int sh(const char *cmd) {
    int rc = system(cmd);
    return rc == 0;
}

/* copies SRC or gunzips SRC.gz into DST */
static int place(const char *src, const char *dst) {
    char cmd[2048];
    if (access(src, R_OK) == 0) snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    else {
        char gz[1100];
        snprintf(gz, sizeof gz, "%s.gz", src);
        if (access(gz, R_OK) != 0) return 0;
        snprintf(cmd, sizeof cmd, "gzip -dc '%s' > '%s'", gz, dst);
    }
    return sh(cmd);
}

static int setup(const char *name, char *dir, size_t n) {
    const char *sd = shared_dir();
    char src[1024], dst[1024];
    snprintf(dir, n, "%s/%s", tmpdir, name);
    snprintf(dst, sizeof dst, "mkdir -p '%s'", dir);
    if (!sh(dst)) return 0;
    if (!strcmp(name, "stories260k")) snprintf(src, sizeof src, "%s/models/stories260k", sd);
    else snprintf(src, sizeof src, "%s/tokenizers/%s", sd, name);
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/tokenizer.json", src);
    snprintf(b, sizeof b, "%s/tokenizer.json", dir);
    if (!place(a, b)) return 0;
    snprintf(a, sizeof a, "%s/tokenizer_config.json", src);
    snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
    place(a, b);
    return 1;
}

static unsigned char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    unsigned char *o = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        o[i] = (unsigned char)v;
    }
    o[l] = 0;
    *n = l;
    return o;
}

/* returns -1 when equal, else the first differing index */
static long cmp_ids(const int32_t *a, int na, json_t *ref) {
    int nr = (int)json_array_size(ref);
    int m = na < nr ? na : nr;
    for (int i = 0; i < m; i++)
        if (a[i] != (int32_t)json_integer_value(json_array_get(ref, (size_t)i))) return i;
    return na == nr ? -1 : m;
}

static void show_diff(const cinfer_tokenizer *t, const int32_t *a, int na, json_t *ref, long at) {
    int nr = (int)json_array_size(ref);
    printf("    first mismatch at %ld (got %d ids, want %d)\n    got: ", at, na, nr);
    for (long i = at > 3 ? at - 3 : 0; i < at + 6 && i < na; i++) printf("%d[%s] ", a[i], cinfer_token_piece(t, a[i]));
    printf("\n    want:");
    for (long i = at > 3 ? at - 3 : 0; i < at + 6 && i < nr; i++) {
        int id = (int)json_integer_value(json_array_get(ref, (size_t)i));
        printf("%d[%s] ", id, cinfer_token_piece(t, id));
    }
    printf("\n");
}

static uint64_t fnv64(const int32_t *ids, int n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xff;
            h *= 0x100000001b3ULL;
        }
    return h;
}

static int n_bad_chunks, n_held;  /* chunks that were not complete UTF-8; pushes that held bytes back */

static int valid_utf8(const char *p) {
    size_t n = strlen(p);
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_next((const unsigned char *)p + i, n - i);
        if (l <= 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

static char *stream_decode(const cinfer_tokenizer *t, const int32_t *ids, int n, int skip) {
    cinfer_detok_stream *s = cinfer_detok_stream_new(t, skip);
    size_t cap = 64, len = 0;
    char *o = malloc(cap);
    o[0] = 0;
    for (int i = 0; i <= n; i++) {
        const char *p = i < n ? cinfer_detok_stream_push(s, ids[i]) : cinfer_detok_stream_flush(s);
        if (!p) break;
        if (!valid_utf8(p)) n_bad_chunks++;
        if (i < n && !*p) n_held++;
        size_t l = strlen(p);
        while (len + l + 1 > cap) { cap *= 2; o = realloc(o, cap); }
        memcpy(o + len, p, l + 1);
        len += l;
    }
    cinfer_detok_stream_free(s);
    return o;
}

static char *read_range(const char *file, long start, long len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/data/austen/%s", shared_dir(), file);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc((size_t)len + 1);
    fseek(f, start, SEEK_SET);
    size_t got = fread(b, 1, (size_t)len, f);
    fclose(f);
    b[got] = 0;
    return b;
}

static void run_one(const char *name) {
    char dir[512], fx[512];
    if (!setup(name, dir, sizeof dir)) { CHECK(0, "%s: set up tokenizer files", name); return; }
    snprintf(fx, sizeof fx, "tests/fixtures/tokenizer/%s.json", name);
    json_error_t je;
    json_t *root = json_load_file(fx, JSON_ALLOW_NUL, &je);
    if (!root) { CHECK(0, "%s: load fixture %s: %s", name, fx, je.text); return; }
    cinfer_tokenizer *t = NULL;
    char err[512] = "";
    cinfer_status st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
    CHECK(st == CINFER_OK, "%s: load (%s)", name, err);
    if (st) { json_decref(root); return; }
    CHECK(cinfer_tokenizer_n_vocab(t) == (int)json_integer_value(json_object_get(root, "n_vocab")),
          "%s: n_vocab %d", name, cinfer_tokenizer_n_vocab(t));
    json_t *cases = json_object_get(root, "cases");
    int ok_enc = 0, ok_sp = 0, ok_plain = 0, ok_dec = 0, ok_skip = 0, ok_stream = 0, ok_rt = 0, n_rt = 0;
    size_t nc = json_array_size(cases);
    for (size_t i = 0; i < nc; i++) {
        json_t *c = json_array_get(cases, i);
        size_t n;
        unsigned char *txt = unhex(json_string_value(json_object_get(c, "hex")), &n);
        int32_t *ids;
        int nids;
        const char *show = n > 40 ? "(long)" : (const char *)txt;
        /* the C API's text is NUL-terminated: a NUL inside decoded text ends it */
        int has_nul = memchr(txt, 0, n) != NULL;
        struct { const char *key; int add, parse; int *ok; } modes[] = {
            {"ids", 0, 1, &ok_enc}, {"ids_special", 1, 1, &ok_sp}, {"ids_plain", 0, 0, &ok_plain}};
        for (int m = 0; m < 3; m++) {
            st = cinfer_tokenize(t, (const char *)txt, n, modes[m].add, modes[m].parse, &ids, &nids);
            json_t *ref = json_object_get(c, modes[m].key);
            long d = st ? 0 : cmp_ids(ids, nids, ref);
            if (d < 0) (*modes[m].ok)++;
            else {
                printf("  %s case %zu %s mismatch: \"%s\"\n", name, i, modes[m].key, show);
                if (!st) show_diff(t, ids, nids, ref, d);
            }
            free(ids);
        }
        /* decode the reference ids */
        json_t *ref = json_object_get(c, "ids_special");
        int nr = (int)json_array_size(ref);
        int32_t *rid = malloc(sizeof(int32_t) * (size_t)(nr + 1));
        for (int k = 0; k < nr; k++) rid[k] = (int32_t)json_integer_value(json_array_get(ref, (size_t)k));
        for (int skip = 0; skip < 2; skip++) {
            char *out = NULL;
            st = cinfer_detokenize(t, rid, nr, skip, &out);
            const char *want = json_string_value(json_object_get(c, skip ? "decoded_skip" : "decoded"));
            if (!st && !strcmp(out, want)) { if (skip) ok_skip++; else ok_dec++; }
            else printf("  %s case %zu decode(skip=%d) mismatch: got \"%s\" want \"%s\"\n", name, i, skip,
                        out ? (strlen(out) > 80 ? "(long)" : out) : "(null)", strlen(want) > 80 ? "(long)" : want);
            char *so = stream_decode(t, rid, nr, skip);
            if ((out && !strcmp(so, out)) || has_nul) ok_stream++;
            else printf("  %s case %zu stream(skip=%d) differs from whole decode\n", name, i, skip);
            free(so);
            free(out);
        }
        free(rid);
        if (json_is_true(json_object_get(c, "roundtrip"))) {
            n_rt++;
            json_t *r0 = json_object_get(c, "ids");
            int n0 = (int)json_array_size(r0);
            int32_t *i0 = malloc(sizeof(int32_t) * (size_t)(n0 + 1));
            for (int k = 0; k < n0; k++) i0[k] = (int32_t)json_integer_value(json_array_get(r0, (size_t)k));
            st = cinfer_tokenize(t, (const char *)txt, n, 0, 1, &ids, &nids);
            char *out = NULL;
            if (!st) st = cinfer_detokenize(t, ids, nids, 0, &out);
            size_t sn;
            char *san = tok_utf8_sanitize((const char *)txt, n, &sn);
            if (has_nul || (!st && strlen(out) == sn && !memcmp(out, san, sn))) ok_rt++;
            else printf("  %s case %zu: decode(encode(x)) != x\n", name, i);
            free(san);
            free(out);
            free(ids);
            free(i0);
        }
        free(txt);
    }
    CHECK(ok_enc == (int)nc, "%s: %d/%zu hard strings encode like HF (no BOS/EOS)", name, ok_enc, nc);
    CHECK(ok_sp == (int)nc, "%s: %d/%zu hard strings encode like HF (with BOS/EOS)", name, ok_sp, nc);
    CHECK(ok_plain == (int)nc, "%s: %d/%zu hard strings encode like HF (specials as text)", name, ok_plain, nc);
    CHECK(ok_dec == (int)nc, "%s: %d/%zu decodes equal HF", name, ok_dec, nc);
    CHECK(ok_skip == (int)nc, "%s: %d/%zu decodes (skip_special) equal HF", name, ok_skip, nc);
    CHECK(ok_stream == 2 * (int)nc, "%s: %d/%zu streaming decodes equal whole decodes", name, ok_stream, 2 * nc);
    CHECK(n_bad_chunks == 0, "%s: every streamed chunk is complete UTF-8 (%d were not)", name, n_bad_chunks);
    {
        /* a char split over tokens (byte fallback, or byte-level pieces) is held back, then completed */
        const char *txt = "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xea\xaf\x8d";
        int32_t *ids;
        int nids;
        n_held = 0;
        if (!cinfer_tokenize(t, txt, strlen(txt), 0, 1, &ids, &nids)) {
            char *so = stream_decode(t, ids, nids, 0), *whole = NULL;
            cinfer_detokenize(t, ids, nids, 0, &whole);
            CHECK(whole && !strcmp(so, whole) && n_held > 0 && n_bad_chunks == 0,
                  "%s: streaming %d ids of CJK+emoji holds partial chars (%d pushes held) and equals whole decode",
                  name, nids, n_held);
            free(so);
            free(whole);
            free(ids);
        }
    }
    CHECK(ok_rt == n_rt, "%s: %d/%d decode(encode(x)) == x where HF round-trips", name, ok_rt, n_rt);

    json_t *chs = json_object_get(root, "chapters");
    for (size_t i = 0; i < json_array_size(chs); i++) {
        json_t *c = json_array_get(chs, i);
        const char *file = json_string_value(json_object_get(c, "file"));
        long start = (long)json_integer_value(json_object_get(c, "start"));
        long len = (long)json_integer_value(json_object_get(c, "len"));
        char *txt = read_range(file, start, len);
        int32_t *ids = NULL;
        int nids = 0;
        st = txt ? cinfer_tokenize(t, txt, (size_t)len, 0, 1, &ids, &nids) : CINFER_EIO;
        json_t *ref = json_object_get(c, "ids");
        long d = st ? 0 : cmp_ids(ids, nids, ref);
        CHECK(d < 0, "%s: %s bytes %ld+%ld (%zu ids) match HF", name, file, start, len, json_array_size(ref));
        if (d >= 0 && !st) show_diff(t, ids, nids, ref, d);
        if (!st && d < 0) {
            char *out = NULL;
            cinfer_detokenize(t, ids, nids, 0, &out);
            CHECK(out && !strcmp(out, txt), "%s: %s chapter decodes back to its text", name, file);
            free(out);
        }
        free(ids);
        free(txt);
    }
    if (!SANITIZED) {
        json_t *nov = json_object_get(root, "novels");
        for (size_t i = 0; i < json_array_size(nov); i++) {
            json_t *c = json_array_get(nov, i);
            const char *file = json_string_value(json_object_get(c, "file"));
            char path[1024];
            snprintf(path, sizeof path, "%s/data/austen/%s", shared_dir(), file);
            FILE *f = fopen(path, "rb");
            if (!f) { CHECK(0, "%s: open %s", name, path); continue; }
            fseek(f, 0, SEEK_END);
            long len = ftell(f);
            fclose(f);
            char *txt = read_range(file, 0, len);
            int32_t *ids = NULL;
            int nids = 0;
            st = cinfer_tokenize(t, txt, (size_t)len, 0, 1, &ids, &nids);
            char hx[32];
            snprintf(hx, sizeof hx, "%016llx", st ? 0ULL : (unsigned long long)fnv64(ids, nids));
            int want_n = (int)json_integer_value(json_object_get(c, "n"));
            CHECK(!st && nids == want_n && !strcmp(hx, json_string_value(json_object_get(c, "fnv"))),
                  "%s: whole %s: %d ids (want %d), hash %s", name, file, nids, want_n, hx);
            free(ids);
            free(txt);
        }
    }
    cinfer_tokenizer_free(t);
    json_decref(root);
}

int main(int argc, char **argv) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cinfer-tok-XXXXXX");
    if (!mkdtemp(tmpdir)) { printf("FAIL mkdtemp\n"); return 1; }
    const char *names[] = {"stories260k", "llama2", "qwen3", "llama3", "gemma3"};
    for (int i = 0; i < 5; i++) {
        if (argc > 1 && strcmp(argv[1], names[i])) continue;
        run_one(names[i]);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    sh(cmd);
    return CHECK_DONE();
}
