/*
 * st-write.c — writes one safetensors image in memory (see st_write_mem in
 * safetensors.h): the layout MLX's save_safetensors produces — tensor entries
 * with data_offsets in the order given, then "__metadata__", the header padded
 * with spaces to a multiple of 8 so every tensor starts 8-byte aligned.
 * Reference: https://github.com/huggingface/safetensors (format section).
 */
#include <jansson.h>
#include <string.h>
#include "io/safetensors.h"
#include "util.h"

cinfer_status st_write_mem(const st_wtensor *t, int n, const char *metadata_json, void **buf, size_t *len,
                           char *err, size_t n_err) {
    *buf = NULL;
    *len = 0;
    json_t *root = json_object(), *meta = NULL;
    if (!root) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
    if (metadata_json && *metadata_json) {
        json_error_t je;
        meta = json_loads(metadata_json, 0, &je);
        const char *k = NULL;
        json_t *v;
        if (meta && json_is_object(meta)) json_object_foreach(meta, k, v) if (!json_is_string(v)) break;
        if (!meta || !json_is_object(meta) || k) {
            json_decref(meta);
            json_decref(root);
            return cf_err(err, n_err, CINFER_EINVAL, "safetensors metadata must be a JSON object of strings");
        }
    }
    size_t off = 0;
    cinfer_status st = CINFER_OK;
    for (int i = 0; i < n && !st; i++) {
        size_t es = st_dtype_size(t[i].dtype), el = 1;
        for (int d = 0; d < t[i].ndim; d++) el *= (size_t)t[i].shape[d];
        if (!es || t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS || el * es != t[i].nbytes || !strcmp(t[i].name, "__metadata__")) {
            st = cf_err(err, n_err, CINFER_EINVAL, "safetensors writer: tensor '%s' has a bad dtype, shape or size", t[i].name);
            break;
        }
        json_t *sh = json_array();
        for (int d = 0; sh && d < t[i].ndim; d++) json_array_append_new(sh, json_integer(t[i].shape[d]));
        json_t *e = json_pack("{s:[I,I], s:s, s:o}", "data_offsets", (json_int_t)off, (json_int_t)(off + t[i].nbytes),
                              "dtype", t[i].dtype, "shape", sh);
        if (!e || json_object_set_new(root, t[i].name, e)) st = cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
        off += t[i].nbytes;
    }
    if (!st && meta && json_object_set(root, "__metadata__", meta)) st = cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
    char *h = st ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(meta);
    json_decref(root);
    if (st) return st;
    if (!h) return cf_err(err, n_err, CINFER_ENOMEM, "out of memory");
    size_t hl = strlen(h), hp = (hl + 7) / 8 * 8;
    uint8_t *b = malloc(8 + hp + off + 1);
    if (!b) { free(h); return cf_err(err, n_err, CINFER_ENOMEM, "out of memory (%zu bytes)", 8 + hp + off); }
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(b + 8, h, hl);
    memset(b + 8 + hl, ' ', hp - hl);
    free(h);
    size_t o = 8 + hp;
    for (int i = 0; i < n; i++) {
        if (t[i].nbytes) memcpy(b + o, t[i].data, t[i].nbytes);
        o += t[i].nbytes;
    }
    *buf = b;
    *len = o;
    return CINFER_OK;
}
