/*
 * bench-tokenizer.c — encode throughput (MB/s, one thread) of cinfer's
 * tokenizer on Pride and Prejudice, next to HF `tokenizers` measured on the
 * same text by tests/reference/make_tokenizer_fixtures.py on the GPU
 * machine (figures in tests/fixtures/tokenizer/hf-throughput.json), plus
 * load time of each tokenizer.json.
 *
 *   build/bench/bench-tokenizer [--text FILE] [--reps N] [NAME ...]
 *
 * NAME is one of stories260k llama2 qwen3 llama3 gemma3 (default: all);
 * gzipped files from ../shared are unpacked into a temporary directory.
 * Two figures per tokenizer, as HF's: the whole book in one encode call,
 * and the book's paragraphs (split on blank lines) one call each.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "cinfer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *shared(void) {
    const char *s = getenv("CINFER_SHARED");
    return s ? s : "../shared";
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

int main(int argc, char **argv) {
    const char *names[] = {"stories260k", "llama2", "qwen3", "llama3", "gemma3"};
    const char *text_path = NULL;
    int reps = 3, only[5] = {0}, any_only = 0;
    char tp[1024];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc) text_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: bench-tokenizer [--text FILE] [--reps N] [stories260k|llama2|qwen3|llama3|gemma3 ...]\n");
            return 0;
        } else {
            int ok = 0;
            for (int k = 0; k < 5; k++)
                if (!strcmp(argv[i], names[k])) { only[k] = 1; any_only = ok = 1; }
            if (!ok) { fprintf(stderr, "bench-tokenizer: unknown argument '%s'\n", argv[i]); return 2; }
        }
    }
    if (!text_path) {
        snprintf(tp, sizeof tp, "%s/data/austen/pride-and-prejudice.txt", shared());
        text_path = tp;
    }
    size_t n;
    char *text = read_all(text_path, &n);
    if (!text) { fprintf(stderr, "bench-tokenizer: cannot read %s\n", text_path); return 1; }
    json_t *hf = json_load_file("tests/fixtures/tokenizer/hf-throughput.json", 0, NULL);
    json_t *hfr = json_object_get(hf, "results");
    char tmp[] = "/tmp/cinfer-tokbench-XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    printf("text: %s (%zu bytes), best of %d, 1 thread\n", text_path, n, reps);
    printf("HF tokenizers %s on \"%s\" (from hf-throughput.json)\n\n",
           json_string_value(json_object_get(hf, "tokenizers")) ? json_string_value(json_object_get(hf, "tokenizers")) : "?",
           json_string_value(json_object_get(hf, "cpu")) ? json_string_value(json_object_get(hf, "cpu")) : "?");
    printf("%-12s %8s %8s %10s %10s %10s %10s\n", "tokenizer", "load_s", "ids", "whole MB/s", "HF whole", "paras MB/s", "HF paras");
    for (int k = 0; k < 5; k++) {
        if (any_only && !only[k]) continue;
        char dir[1200], a[1400], b[1400], src[1100];
        snprintf(dir, sizeof dir, "%s/%s", tmp, names[k]);
        snprintf(a, sizeof a, "mkdir -p '%s'", dir);
        if (system(a) != 0) return 1;
        if (k == 0) snprintf(src, sizeof src, "%s/models/stories260k", shared());
        else snprintf(src, sizeof src, "%s/tokenizers/%s", shared(), names[k]);
        snprintf(a, sizeof a, "%s/tokenizer.json", src);
        snprintf(b, sizeof b, "%s/tokenizer.json", dir);
        if (!place(a, b)) { fprintf(stderr, "bench-tokenizer: no %s\n", a); continue; }
        snprintf(a, sizeof a, "%s/tokenizer_config.json", src);
        snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
        place(a, b);
        cinfer_tokenizer *t;
        char err[512];
        double t0 = now();
        if (cinfer_tokenizer_load(dir, &t, err, sizeof err)) { fprintf(stderr, "%s\n", err); continue; }
        double load_s = now() - t0;
        double best = 1e9, best_p = 1e9;
        int nids = 0;
        for (int r = 0; r < reps; r++) {
            int32_t *ids;
            t0 = now();
            cinfer_tokenize(t, text, n, 0, 1, &ids, &nids);
            double dt = now() - t0;
            if (dt < best) best = dt;
            free(ids);
            /* paragraphs: split on "\n\n" as the HF script does */
            t0 = now();
            size_t p = 0;
            while (p <= n) {
                const char *e = strstr(text + p, "\n\n");
                size_t q = e ? (size_t)(e - text) : n;
                int m;
                cinfer_tokenize(t, text + p, q - p, 0, 1, &ids, &m);
                free(ids);
                p = q + 2;
            }
            dt = now() - t0;
            if (dt < best_p) best_p = dt;
        }
        json_t *h = json_object_get(hfr, names[k]);
        printf("%-12s %8.3f %8d %10.2f %10.2f %10.2f %10.2f\n", names[k], load_s, nids, n / best / 1e6,
               json_real_value(json_object_get(h, "whole_MBps")), n / best_p / 1e6,
               json_real_value(json_object_get(h, "paragraphs_MBps")));
        cinfer_tokenizer_free(t);
    }
    snprintf(tp, sizeof tp, "rm -rf '%s'", tmp);
    if (system(tp) != 0) return 1;
    json_decref(hf);
    free(text);
    return 0;
}
