/*
 * tier-entry.c — encode and verify one entry of the persistent prefix tier
 * (layout in tier.h). The decoder treats the bytes as hostile: every length,
 * count and offset is checked before use, and nothing is trusted until the
 * header hash and every tensor hash agree.
 */
#include <jansson.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include "engine/tier.h"
#include "util.h"

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }

static uint64_t header_hash(const uint8_t *pre16, const char *h, size_t hl) {
    XXH3_state_t *x = XXH3_createState();
    if (!x) return 0;
    XXH3_64bits_reset(x);
    XXH3_64bits_update(x, pre16, 16);
    XXH3_64bits_update(x, h, hl);
    uint64_t v = XXH3_64bits_digest(x);
    XXH3_freeState(x);
    return v;
}

cinfer_status tier_entry_encode(const cinfer_snapshot *s, const char *config, const int32_t *tokens, int n,
                                void **buf, size_t *len, char *err, size_t n_err) {
    *buf = NULL;
    *len = 0;
    json_error_t je;
    json_t *snap = json_loads(s->header, 0, &je), *toks = json_array(), *tens = json_array();
    size_t off = 0;
    cinfer_status st = snap && toks && tens ? CINFER_OK : CINFER_ENOMEM;
    for (int i = 0; !st && i < n; i++) if (json_array_append_new(toks, json_integer(tokens[i]))) st = CINFER_ENOMEM;
    for (int i = 0; !st && i < s->n_tensors; i++) {
        const cinfer_tensor *t = &s->tensors[i];
        char hx[17];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)XXH3_64bits(t->data, t->bytes));
        json_t *e = json_pack("{s:s, s:s, s:[I,I,I,I], s:I, s:I, s:s}", "name", t->name, "dtype", t->dtype, "shape",
                              (json_int_t)t->shape[0], (json_int_t)t->shape[1], (json_int_t)t->shape[2],
                              (json_int_t)t->shape[3], "offset", (json_int_t)off, "bytes", (json_int_t)t->bytes, "xxh3", hx);
        if (!e || json_array_append_new(tens, e)) st = CINFER_ENOMEM;
        off += t->bytes;
    }
    json_t *root = st ? NULL : json_pack("{s:s, s:i, s:s, s:I, s:O, s:O, s:O}", "format", "cinfer-tier-entry", "version", 1,
                                         "config", config, "created", (json_int_t)time(NULL), "tokens", toks, "snapshot",
                                         snap, "tensors", tens);
    char *h = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    json_decref(snap);
    json_decref(toks);
    json_decref(tens);
    if (!h) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
    size_t hl = strlen(h);
    uint8_t *b = malloc(TIER_PRE + hl + off + 1);
    if (!b) { free(h); return cf_err(err, n_err, CINFER_ENOMEM, "out of memory"); }
    memcpy(b, TIER_MAGIC, 8);
    put32(b + 8, (uint32_t)hl);
    put32(b + 12, 0);
    put64(b + 16, header_hash(b, h, hl));
    memcpy(b + TIER_PRE, h, hl);
    free(h);
    size_t o = TIER_PRE + hl;
    for (int i = 0; i < s->n_tensors; i++) {
        memcpy(b + o, s->tensors[i].data, s->tensors[i].bytes);
        o += s->tensors[i].bytes;
    }
    *buf = b;
    *len = o;
    return CINFER_OK;
}

void tier_entry_clear(tier_entry *e) {
    free(e->config);
    free(e->tokens);
    free(e->snap.header);
    free(e->snap.tensors);
    memset(e, 0, sizeof *e);
}

/* the snapshot dtypes: float K/V (or scales and biases) and packed codes */
static int dtype_size(const char *d) {
    return !strcmp(d, "f32") || !strcmp(d, "u32") ? 4 : !strcmp(d, "f16") || !strcmp(d, "bf16") ? 2 : 0;
}
static const char *dtype_static(const char *d) {
    return !strcmp(d, "f32") ? "f32" : !strcmp(d, "u32") ? "u32" : !strcmp(d, "f16") ? "f16" : "bf16";
}

/* the "tensors" list against the data block [data, data+dlen) */
static cinfer_status tensors_decode(json_t *tens, const uint8_t *data, size_t dlen, tier_entry *e, char *err, size_t n_err) {
    size_t nt = json_array_size(tens), off = 0;
    if (!json_is_array(tens) || nt > 4096) return cf_err(err, n_err, CINFER_EFORMAT, "header: bad tensor list");
    if (!(e->snap.tensors = calloc(nt + 1, sizeof *e->snap.tensors))) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++) {
        const char *name, *dt, *hx;
        json_int_t sh[4], o, by;
        if (json_unpack(json_array_get(tens, i), "{s:s, s:s, s:[IIII], s:I, s:I, s:s}", "name", &name, "dtype", &dt, "shape",
                        &sh[0], &sh[1], &sh[2], &sh[3], "offset", &o, "bytes", &by, "xxh3", &hx) ||
            strlen(name) >= sizeof e->snap.tensors[0].name || !dtype_size(dt))
            return cf_err(err, n_err, CINFER_EFORMAT, "header: tensor %zu: bad entry", i);
        size_t el = (size_t)dtype_size(dt);
        for (int d = 0; d < 4; d++)
            if (sh[d] < 0 || !cf_mul_ok(el, (size_t)sh[d], &el)) return cf_err(err, n_err, CINFER_EFORMAT, "header: tensor %s: bad shape", name);
        if (o != (json_int_t)off || by < 0 || (size_t)by != el || (size_t)by > dlen - off)
            return cf_err(err, n_err, CINFER_EFORMAT, "tensor %s: %lld bytes at %lld do not fit the data (%zu bytes; truncated?)", name,
                          (long long)by, (long long)o, dlen);
        char want[17];
        snprintf(want, sizeof want, "%016llx", (unsigned long long)XXH3_64bits(data + off, (size_t)by));
        if (strcmp(want, hx)) return cf_err(err, n_err, CINFER_EFORMAT, "tensor %s: checksum mismatch", name);
        cinfer_tensor *t = &e->snap.tensors[e->snap.n_tensors++];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->dtype = dtype_static(dt);
        t->ndim = 4;
        for (int d = 0; d < 4; d++) t->shape[d] = sh[d];
        t->data = (void *)(data + off);
        t->bytes = (size_t)by;
        off += (size_t)by;
    }
    if (off != dlen) return cf_err(err, n_err, CINFER_EFORMAT, "%zu bytes follow the last tensor", dlen - off);
    return CINFER_OK;
}

cinfer_status tier_entry_decode(const void *buf, size_t len, tier_entry *e, char *err, size_t n_err) {
    memset(e, 0, sizeof *e);
    const uint8_t *b = buf;
    if (len < TIER_PRE || memcmp(b, TIER_MAGIC, 8)) return cf_err(err, n_err, CINFER_EFORMAT, "not a cinfer cache entry (bad magic or too short)");
    size_t hl = get32(b + 8);
    if (get32(b + 12) || hl > len - TIER_PRE) return cf_err(err, n_err, CINFER_EFORMAT, "header length %zu exceeds the file (truncated?)", hl);
    if (header_hash(b, (const char *)b + TIER_PRE, hl) != get64(b + 16)) return cf_err(err, n_err, CINFER_EFORMAT, "header checksum mismatch");
    json_error_t je;
    json_t *root = json_loadb((const char *)b + TIER_PRE, hl, JSON_REJECT_DUPLICATES, &je), *toks = NULL, *snap = NULL, *tens = NULL;
    const char *fmt = NULL, *cfg = NULL;
    int ver = 0;
    json_int_t created;
    cinfer_status st = CINFER_OK;
    if (!root || json_unpack(root, "{s:s, s:i, s:s, s:I, s:o, s:o, s:o}", "format", &fmt, "version", &ver, "config", &cfg,
                             "created", &created, "tokens", &toks, "snapshot", &snap, "tensors", &tens) ||
        strcmp(fmt, "cinfer-tier-entry") || ver != 1 || !json_is_array(toks) || !json_is_object(snap) ||
        json_array_size(toks) > (1u << 24))
        st = cf_err(err, n_err, CINFER_EFORMAT, "header is not a version 1 cinfer-tier-entry object");
    if (!st) {
        e->n_tokens = (int)json_array_size(toks);
        e->config = strdup(cfg);
        e->tokens = malloc(sizeof *e->tokens * ((size_t)e->n_tokens + 1));
        e->snap.header = json_dumps(snap, JSON_COMPACT);
        if (!e->config || !e->tokens || !e->snap.header) st = cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
    }
    for (int i = 0; !st && i < e->n_tokens; i++) {
        json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            st = cf_err(err, n_err, CINFER_EFORMAT, "header: token %d is not an id", i);
        else e->tokens[i] = (int32_t)json_integer_value(v);
    }
    if (!st) st = tensors_decode(tens, b + TIER_PRE + hl, len - TIER_PRE - hl, e, err, n_err);
    json_decref(root);
    if (st) tier_entry_clear(e);
    return st;
}
