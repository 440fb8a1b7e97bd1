/*
 * quant-config.c — reader of config.json's quantization block (quant-config.h).
 */
#include <jansson.h>
#include <string.h>
#include "io/quant-config.h"
#include "quant/affine.h"
#include "util.h"

static cinfer_status params(const quant_config *q, const char *what, json_t *o, int *bits, int *group, char *err,
                            size_t n) {
    json_t *m = json_object_get(o, "mode"), *b = json_object_get(o, "bits"), *g = json_object_get(o, "group_size");
    if (m && !json_is_null(m) && (!json_is_string(m) || strcmp(json_string_value(m), "affine")))
        return cf_err(err, n, CINFER_EUNSUPPORTED, "%s: %s.%s has mode '%s' (only 'affine' is supported; not mxfp4/mxfp8/nvfp4)",
                      q->file, q->key, what, json_is_string(m) ? json_string_value(m) : "(not a string)");
    if (b && !json_is_null(b)) {
        if (!json_is_integer(b)) return cf_err(err, n, CINFER_EFORMAT, "%s: %s.%s: bits is not an integer", q->file, q->key, what);
        *bits = (int)json_integer_value(b);
    }
    if (g && !json_is_null(g)) {
        if (!json_is_integer(g)) return cf_err(err, n, CINFER_EFORMAT, "%s: %s.%s: group_size is not an integer", q->file, q->key, what);
        *group = (int)json_integer_value(g);
    }
    if (!aq_valid(*bits, 32))
        return cf_err(err, n, CINFER_EUNSUPPORTED, "%s: %s.%s has bits %d (supported: 2, 3, 4, 5, 6, 8)", q->file, q->key, what, *bits);
    if (!aq_valid(2, *group))
        return cf_err(err, n, CINFER_EUNSUPPORTED, "%s: %s.%s has group_size %d (supported: 32, 64, 128)", q->file, q->key, what,
                      *group);
    return CINFER_OK;
}

static cinfer_status parse(quant_config *q, json_t *blk, char *err, size_t n) {
    json_t *qm = json_object_get(blk, "quant_method");
    if (json_is_string(qm) && strcmp(json_string_value(qm), "mlx"))
        return cf_err(err, n, CINFER_EUNSUPPORTED, "%s: %s.quant_method '%s' is not supported (MLX affine checkpoints only)",
                      q->file, q->key, json_string_value(qm));
    q->bits = 4;
    q->group = 64;
    cinfer_status st = params(q, "(global)", blk, &q->bits, &q->group, err, n);
    if (st) return st;
    q->mods = calloc(json_object_size(blk) + 1, sizeof *q->mods);
    if (!q->mods) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(blk, key, v) {
        if (!strcmp(key, "bits") || !strcmp(key, "group_size") || !strcmp(key, "mode") || !strcmp(key, "quant_method"))
            continue;
        qc_module *m = &q->mods[q->n];
        m->bits = q->bits;
        m->group = q->group;
        if (json_is_false(v)) m->skip = 1;
        else if (json_is_object(v)) { if ((st = params(q, key, v, &m->bits, &m->group, err, n))) return st; }
        else if (!json_is_true(v))
            return cf_err(err, n, CINFER_EFORMAT, "%s: %s has unknown key '%s' (neither bits/group_size/mode nor a module entry)",
                          q->file, q->key, key);
        if (!(m->path = strdup(key))) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
        q->n++;
    }
    return CINFER_OK;
}

cinfer_status qc_load(const char *dir, quant_config **out, char *err, size_t n) {
    *out = NULL;
    char *path = cf_path(dir, "config.json"), *txt = NULL;
    size_t len;
    if (!path) return cf_err(err, n, CINFER_ENOMEM, "out of memory");
    cinfer_status st = cf_read_file(path, &txt, &len, err, n);
    json_t *root = st ? NULL : json_loadb(txt, len, 0, NULL);
    free(txt);
    if (!st && !json_is_object(root)) st = cf_err(err, n, CINFER_EFORMAT, "%s: not a JSON object", path);
    json_t *blk = NULL;
    const char *key = "quantization";
    if (!st) {
        blk = json_object_get(root, key);
        if (!blk || json_is_null(blk)) blk = json_object_get(root, key = "quantization_config");
        if (blk && !json_is_null(blk) && !json_is_object(blk)) st = cf_err(err, n, CINFER_EFORMAT, "%s: %s is not an object", path, key);
    }
    if (!st && blk && json_is_object(blk)) {
        quant_config *q = calloc(1, sizeof *q);
        if (!q) st = cf_err(err, n, CINFER_ENOMEM, "out of memory");
        else {
            snprintf(q->file, sizeof q->file, "%s", path);
            q->key = key;
            st = parse(q, blk, err, n);
            if (st) qc_free(q);
            else *out = q;
        }
    }
    json_decref(root);
    free(path);
    return st;
}

void qc_free(quant_config *q) {
    if (!q) return;
    for (int i = 0; i < q->n; i++) free(q->mods[i].path);
    free(q->mods);
    free(q);
}

qc_module *qc_find(quant_config *q, const char *path) {
    for (int i = 0; q && i < q->n; i++)
        if (!strcmp(q->mods[i].path, path)) { q->mods[i].used = 1; return &q->mods[i]; }
    return NULL;
}

const qc_module *qc_unused(const quant_config *q) {
    for (int i = 0; q && i < q->n; i++)
        if (!q->mods[i].used) return &q->mods[i];
    return NULL;
}
