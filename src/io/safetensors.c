/*
 * safetensors.c — reader for safetensors files (see safetensors.h).
 * Layout: u64 LE header length N, N bytes of JSON {name: {dtype, shape,
 * data_offsets:[begin,end]}, "__metadata__": {...}}, then the data block;
 * offsets are relative to the data block. Checks: N fits in the file, each
 * [begin,end] lies inside the data block, end-begin == prod(shape)*elsize
 * (computed with overflow checks), and a shard index names files inside dir.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/safetensors.h"
#include "util.h"

size_t st_dtype_size(const char *d) {
    static const struct { const char *n; size_t s; } tab[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"U32", 4},
        {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
        {"U64", 8},
    };
    for (size_t i = 0; i < sizeof tab / sizeof *tab; i++)
        if (!strcmp(tab[i].n, d)) return tab[i].s;
    return 0;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static cinfer_status parse_header(const char *path, const char *json, size_t jlen, const uint8_t *data,
                                  size_t data_len, int file, st_set *s, char *err, size_t n) {
    json_error_t je;
    json_t *root = json_loadb(json, jlen, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return cf_err(err, n, CINFER_EFORMAT, "%s: header is not a JSON object (%s)", path,
                      root ? "wrong type" : je.text);
    }
    size_t count = json_object_size(root);
    st_tensor *nt = realloc(s->t, (s->n + count) * sizeof *nt);
    if (!nt) { json_decref(root); return cf_err(err, n, CINFER_ENOMEM, "%s: out of memory", path); }
    s->t = nt;
    const char *key;
    json_t *v;
    cinfer_status st = CINFER_OK;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) { st = cf_err(err, n, CINFER_EFORMAT, "%s: __metadata__ is not an object", path); break; }
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) break;
            if (mk) { st = cf_err(err, n, CINFER_EFORMAT, "%s: __metadata__ value '%s' is not a string", path, mk); break; }
            free(s->metadata);
            if (!(s->metadata = json_dumps(v, JSON_COMPACT))) { st = cf_err(err, n, CINFER_ENOMEM, "out of memory"); break; }
            continue;
        }
        json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
               *off = json_object_get(v, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2) {
            st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s': header entry lacks dtype/shape/data_offsets", path, key);
            break;
        }
        st_tensor *t = &s->t[s->n];
        memset(t, 0, sizeof *t);
        snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dt));
        size_t es = st_dtype_size(json_string_value(dt));
        if (!es) { st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s': unknown dtype '%s'", path, key, json_string_value(dt)); break; }
        t->ndim = (int)json_array_size(sh);
        if (t->ndim > ST_MAX_DIMS) { st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s': %d dims", path, key, t->ndim); break; }
        size_t elems = 1;
        int bad = 0;
        for (int i = 0; i < t->ndim; i++) {
            json_t *d = json_array_get(sh, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0) { bad = 1; break; }
            t->shape[i] = json_integer_value(d);
            if (!cf_mul_ok(elems, (size_t)t->shape[i], &elems)) { bad = 2; break; }
        }
        size_t bytes = 0;
        if (!bad && !cf_mul_ok(elems, es, &bytes)) bad = 2;
        if (bad) { st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s': %s", path, key, bad == 1 ? "bad shape" : "shape overflows"); break; }
        json_t *b0 = json_array_get(off, 0), *b1 = json_array_get(off, 1);
        if (!json_is_integer(b0) || !json_is_integer(b1)) { st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s': bad data_offsets", path, key); break; }
        json_int_t beg = json_integer_value(b0), end = json_integer_value(b1);
        if (beg < 0 || end < beg || (uint64_t)end > data_len) {
            st = cf_err(err, n, CINFER_EFORMAT,
                        "%s: tensor '%s': data_offsets [%lld, %lld] outside the %zu-byte data block (truncated file?)",
                        path, key, (long long)beg, (long long)end, data_len);
            break;
        }
        if ((size_t)(end - beg) != bytes) {
            st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s': %lld bytes in the file but shape x dtype needs %zu",
                        path, key, (long long)(end - beg), bytes);
            break;
        }
        t->name = strdup(key);
        if (!t->name) { st = cf_err(err, n, CINFER_ENOMEM, "out of memory"); break; }
        t->data = data + beg;
        t->nbytes = bytes;
        if ((uintptr_t)t->data % es) {
            t->owned = malloc(bytes ? bytes : 1);
            if (!t->owned) { free(t->name); st = cf_err(err, n, CINFER_ENOMEM, "out of memory"); break; }
            memcpy(t->owned, t->data, bytes);
            t->data = t->owned;
        }
        t->file = file;
        s->total_bytes += bytes;
        s->n++;
    }
    json_decref(root);
    return st;
}

/* parses one file image (map: the mmap to release on close, NULL for a caller's buffer) */
static cinfer_status add_image(const char *path, const uint8_t *base, size_t len, void *map, st_set *s, char *err, size_t n) {
    if (len < 8) {
        if (map) munmap(map, len);
        return cf_err(err, n, CINFER_EFORMAT, "%s: truncated (%zu bytes, no header)", path, len);
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > len - 8 || hlen > (1u << 30)) {
        if (map) munmap(map, len);
        return cf_err(err, n, CINFER_EFORMAT, "%s: header length %llu exceeds the file (%zu bytes): truncated or not safetensors",
                      path, (unsigned long long)hlen, len);
    }
    char **np = realloc(s->paths, (s->n_files + 1) * sizeof *np);
    if (np) s->paths = np;
    void **nm = realloc(s->maps, (s->n_files + 1) * sizeof *nm);
    if (nm) s->maps = nm;
    size_t *nl = realloc(s->map_len, (s->n_files + 1) * sizeof *nl);
    if (nl) s->map_len = nl;
    char *pcopy = np && nm && nl ? strdup(path) : NULL;
    if (!pcopy) { if (map) munmap(map, len); return cf_err(err, n, CINFER_ENOMEM, "out of memory"); }
    int fi = s->n_files++;
    s->paths[fi] = pcopy;
    s->maps[fi] = map;
    s->map_len[fi] = len;
    cinfer_status st = parse_header(path, (const char *)base + 8, hlen, base + 8 + hlen, len - 8 - hlen, fi, s, err, n);
    if (st) return st;
    qsort(s->t, s->n, sizeof *s->t, cmp_tensor);
    for (int i = 1; i < s->n; i++)
        if (!strcmp(s->t[i].name, s->t[i - 1].name))
            return cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s' appears in two files", path, s->t[i].name);
    return CINFER_OK;
}

cinfer_status st_open_file(const char *path, st_set *s, char *err, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return cf_err(err, n, CINFER_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) { close(fd); return cf_err(err, n, CINFER_EIO, "%s: cannot stat", path); }
    size_t len = (size_t)sb.st_size;
    if (len < 8) { close(fd); return cf_err(err, n, CINFER_EFORMAT, "%s: truncated (%zu bytes, no header)", path, len); }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return cf_err(err, n, CINFER_EIO, "%s: mmap failed: %s", path, strerror(errno));
    return add_image(path, map, len, map, s, err, n);
}

cinfer_status st_open_mem(const char *name, const void *buf, size_t len, st_set *s, char *err, size_t n) {
    return add_image(name, buf, len, NULL, s, err, n);
}

static int shard_name_ok(const char *f) {
    return f[0] && !strchr(f, '/') && strcmp(f, ".") && strcmp(f, "..");
}

cinfer_status st_open_dir(const char *dir, st_set *s, char *err, size_t n) {
    memset(s, 0, sizeof *s);
    char *one = cf_path(dir, "model.safetensors");
    char *idx = cf_path(dir, "model.safetensors.index.json");
    cinfer_status st = CINFER_OK;
    if (!one || !idx) { st = cf_err(err, n, CINFER_ENOMEM, "out of memory"); goto out; }
    if (cf_file_exists(one)) {
        st = st_open_file(one, s, err, n);
        goto out;
    }
    if (!cf_file_exists(idx)) {
        st = cf_err(err, n, CINFER_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto out;
    }
    json_error_t je;
    json_t *root = json_load_file(idx, 0, &je);
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        st = cf_err(err, n, CINFER_EFORMAT, "%s: %s", idx, root ? "no \"weight_map\" object" : je.text);
        json_decref(root);
        goto out;
    }
    /* open each distinct shard once, in order of first mention */
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *f = json_string_value(v);
        if (!f || !shard_name_ok(f)) { st = cf_err(err, n, CINFER_EFORMAT, "%s: bad shard name for '%s'", idx, key); break; }
        char *p = cf_path(dir, f);
        int seen = 0;
        for (int i = 0; p && i < s->n_files; i++) seen |= !strcmp(s->paths[i], p);
        if (p && !seen) st = st_open_file(p, s, err, n);
        free(p);
        if (st) break;
    }
    if (!st) json_object_foreach(wm, key, v) {
        if (!st_find(s, key)) { st = cf_err(err, n, CINFER_EFORMAT, "%s: tensor '%s' is listed but not in its shard %s", idx, key, json_string_value(v)); break; }
    }
    json_decref(root);
out:
    free(one);
    free(idx);
    if (st) st_close(s);
    return st;
}

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->t[i].owned);
    }
    for (int i = 0; i < s->n_files; i++) {
        if (s->maps[i]) munmap(s->maps[i], s->map_len[i]);
        free(s->paths[i]);
    }
    free(s->t);
    free(s->paths);
    free(s->maps);
    free(s->map_len);
    free(s->metadata);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_find(const st_set *s, const char *name) {
    size_t lo = 0, hi = (size_t)s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(s->t[mid].name, name);
        if (!c) return &s->t[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}
