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
 */
#include <string.h>
#include <xxhash.h>
#include "engine/engine.h"
#include "util.h"

enum { FP_SLICES = 4 };

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
