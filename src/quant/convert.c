/*
 * convert.c — qconvert (convert.h): read a model directory, cast / quantize /
 * dequantize its tensors, write them in mlx-lm's layout. All output tensors
 * are built in memory, then written shard by shard with atomic writes.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include "backend/backend.h"
#include "io/quant-config.h"
#include "io/safetensors.h"
#include "quant/convert.h"
#include "util.h"

typedef struct otensor {
    char *name;
    const char *dtype;          /* "U32", "BF16", ... */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    void *data;                 /* owned */
    const void *view;           /* or borrowed from the source map */
    size_t nbytes;
} otensor;

typedef struct conv {
    const qconvert_opts *o;
    char *err;
    size_t n;
    st_set st;
    json_t *cfg, *qblock, *qfile;  /* source config, the quantization block written, --quant-config */
    quant_config *src_q;           /* -d: the source's block */
    otensor *out;
    int n_out, cap_out;
    int n_layers, lo_bits, hi_bits;
    int have_dt;
    be_dtype dt;                   /* output float dtype when have_dt */
    int64_t n_params;
} conv;

static const char *st_name(be_dtype t) { return be_traits(t)->st_name; }

static otensor *push(conv *c, const char *name) {
    if (c->n_out == c->cap_out) {
        int cap = c->cap_out ? 2 * c->cap_out : 64;
        otensor *p = realloc(c->out, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        c->out = p;
        c->cap_out = cap;
    }
    otensor *t = &c->out[c->n_out];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return NULL;
    c->n_out++;
    return t;
}

static int dtype_of(const char *s, be_dtype *dt) {
    if (!s) return 0;
    if (!strcmp(s, "float16")) { *dt = BE_F16; return 1; }
    if (!strcmp(s, "bfloat16")) { *dt = BE_BF16; return 1; }
    if (!strcmp(s, "float32")) { *dt = BE_F32; return 1; }
    return 0;
}

/* the quantizable 2-D weights: embeddings, heads and projections (mlx-lm: modules with to_quantized) */
static int quantizable(const st_tensor *t) {
    size_t l = strlen(t->name);
    return t->ndim == 2 && l > 7 && !strcmp(t->name + l - 7, ".weight") && !strstr(t->name, "norm") &&
           (!strcmp(t->dtype, "F32") || !strcmp(t->dtype, "F16") || !strcmp(t->dtype, "BF16"));
}

static int layer_index(const char *path) {
    const char *p = strstr(path, ".layers.");
    return p ? atoi(p + 8) : 0;
}

/* bits and group of module `path` (0: not quantized), and whether config.json gets an entry for it */
static int module_params(conv *c, const char *path, int64_t cols, int *bits, int *group, int *entry) {
    *bits = c->o->bits;
    *group = c->o->group;
    *entry = 0;
    json_t *e = c->qfile ? json_object_get(c->qfile, path) : NULL;
    if (e) {
        json_object_set_new(e, "__used", json_true());
        json_t *b = json_object_get(e, "bits"), *g = json_object_get(e, "group_size");
        if (json_is_integer(b)) *bits = (int)json_integer_value(b);
        if (json_is_integer(g)) *group = (int)json_integer_value(g);
        *entry = 1;
    } else if (c->o->predicate) {
        int L = c->n_layers, i = layer_index(path), more = i < L / 8 || i >= 7 * L / 8 || (i - L / 8) % 3 == 2;
        int hi = (strstr(path, "v_proj") || strstr(path, "down_proj")) && more;
        if (strstr(path, "lm_head")) hi = 1;
        *bits = hi ? c->hi_bits : c->lo_bits;
        *entry = 1;
    }
    return cols % *group == 0;
}

/* row r of a source tensor (any float dtype) as f32, rounded through the output dtype */
static void src_row(conv *c, const st_tensor *t, be_dtype sdt, int64_t r, int64_t cols, float *dst) {
    be_dtype od = c->have_dt ? c->dt : sdt;
    for (int64_t i = 0; i < cols; i++) {
        float v = be_kv_get(t->data, sdt, (size_t)(r * cols + i));
        if (od != sdt) {
            uint32_t tmp = 0;
            be_kv_put(&tmp, od, 0, v);
            v = be_kv_get(&tmp, od, 0);
        }
        dst[i] = v;
    }
}

static cinfer_status quantize_one(conv *c, const st_tensor *t, const char *path, int bits, int group, int entry) {
    be_dtype sdt, od;
    be_dtype_from_st(t->dtype, &sdt);
    od = c->have_dt ? c->dt : sdt;
    int64_t rows = t->shape[0], cols = t->shape[1], ng = cols / group;
    size_t rb = aq_row_bytes(cols, bits), es = be_dtype_size(od);
    char nm[320];
    int ok = 1;
    static const char *sfx[3] = {"weight", "scales", "biases"};
    for (int i = 0; i < 3 && ok; i++) {
        snprintf(nm, sizeof nm, "%s.%s", path, sfx[i]);
        ok = push(c, nm) != NULL;
    }
    otensor *w = ok ? &c->out[c->n_out - 3] : NULL, *s = w ? w + 1 : NULL, *b = w ? w + 2 : NULL;
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!ok || !row || !(w->data = malloc(rb * (size_t)rows)) || !(s->data = malloc(es * (size_t)(rows * ng))) ||
        !(b->data = malloc(es * (size_t)(rows * ng)))) {
        free(row);
        return cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory quantizing '%s'", t->name);
    }
    for (int64_t r = 0; r < rows; r++) {
        src_row(c, t, sdt, r, cols, row);
        aq_quantize_row(row, cols, bits, group, c->o->rounding, od, (uint8_t *)w->data + (size_t)r * rb,
                        (char *)s->data + (size_t)(r * ng) * es, (char *)b->data + (size_t)(r * ng) * es);
    }
    free(row);
    w->dtype = "U32";
    w->ndim = s->ndim = b->ndim = 2;
    w->shape[0] = s->shape[0] = b->shape[0] = rows;
    w->shape[1] = cols * bits / 32;
    s->shape[1] = b->shape[1] = ng;
    s->dtype = b->dtype = st_name(od);
    w->nbytes = rb * (size_t)rows;
    s->nbytes = b->nbytes = es * (size_t)(rows * ng);
    if (entry)
        json_object_set_new(c->qblock, path, json_pack("{s:i,s:i,s:s}", "group_size", group, "bits", bits, "mode", "affine"));
    return CINFER_OK;
}

/* a dense copy of a float tensor in the output dtype (borrowed when unchanged) */
static cinfer_status cast_one(conv *c, const st_tensor *t) {
    otensor *o = push(c, t->name);
    if (!o) return cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
    o->ndim = t->ndim;
    memcpy(o->shape, t->shape, sizeof o->shape);
    be_dtype sdt;
    if (!c->have_dt || !be_dtype_from_st(t->dtype, &sdt) || sdt == c->dt) {
        o->dtype = t->dtype;
        o->view = t->data;
        o->nbytes = t->nbytes;
        return CINFER_OK;
    }
    size_t cnt = t->nbytes / be_dtype_size(sdt);
    if (!(o->data = malloc(cnt * be_dtype_size(c->dt) + 1))) return cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
    for (size_t i = 0; i < cnt; i++) be_kv_put(o->data, c->dt, i, be_kv_get(t->data, sdt, i));
    o->dtype = st_name(c->dt);
    o->nbytes = cnt * be_dtype_size(c->dt);
    return CINFER_OK;
}

/* -d: <path>.weight (packed) + scales + biases -> dense, computed as mx.dequantize (in the scale dtype) */
static cinfer_status dequantize_one(conv *c, const st_tensor *t, const char *path) {
    char nm[320];
    qc_module *e = qc_find(c->src_q, path);
    int bits = e ? e->bits : c->src_q->bits, group = e ? e->group : c->src_q->group;
    snprintf(nm, sizeof nm, "%s.scales", path);
    const st_tensor *s = st_find(&c->st, nm);
    snprintf(nm, sizeof nm, "%s.biases", path);
    const st_tensor *b = st_find(&c->st, nm);
    be_dtype sdt;
    int64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] * 32 / bits : 0;
    if (!s || !b || t->ndim != 2 || !be_dtype_from_st(s->dtype, &sdt) || strcmp(s->dtype, b->dtype) || s->ndim != 2 ||
        cols % group || s->shape[0] != rows || s->shape[1] != cols / group || b->shape[0] != rows || b->shape[1] != cols / group)
        return cf_err(c->err, c->n, CINFER_EFORMAT, "%s: '%s' with its scales/biases does not form a %d-bit group-%d module",
                      c->st.paths[t->file], t->name, bits, group);
    be_dtype od = c->have_dt ? c->dt : sdt;
    otensor *o = push(c, t->name);
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!o || !row || !(o->data = malloc((size_t)(rows * cols) * be_dtype_size(od)))) {
        free(row);
        return cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
    }
    /* mlx-lm casts the float parameters (scales, biases) to --dtype first, then mx.dequantize computes in that dtype */
    size_t rb = aq_row_bytes(cols, bits), ng = (size_t)(cols / group);
    float *sc = malloc(sizeof(float) * ng), *bi = malloc(sizeof(float) * ng);
    for (int64_t r = 0; r < rows && sc && bi; r++) {
        for (size_t g = 0; g < ng; g++) {
            be_kv_put(sc, od, g, be_kv_get(s->data, sdt, (size_t)r * ng + g));
            be_kv_put(bi, od, g, be_kv_get(b->data, sdt, (size_t)r * ng + g));
        }
        aq_dequant_row_mlx((const uint8_t *)t->data + (size_t)r * rb, sc, bi, od, bits, group, cols, row);
        for (int64_t i = 0; i < cols; i++) be_kv_put(o->data, od, (size_t)(r * cols + i), row[i]);
    }
    int oom = !sc || !bi;
    free(sc);
    free(bi);
    free(row);
    if (oom) return cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
    o->dtype = st_name(od);
    o->ndim = 2;
    o->shape[0] = rows;
    o->shape[1] = cols;
    o->nbytes = (size_t)(rows * cols) * be_dtype_size(od);
    return CINFER_OK;
}

static int cmp_out(const void *a, const void *b) { return strcmp(((const otensor *)a)->name, ((const otensor *)b)->name); }

static cinfer_status write_json(conv *c, const char *name, json_t *j) {
    char *path = cf_path(c->o->dst, name), *txt = json_dumps(j, JSON_INDENT(4));
    cinfer_status st = path && txt ? cf_write_atomic(path, txt, strlen(txt), c->err, c->n) : cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
    free(path);
    free(txt);
    return st;
}

static cinfer_status write_shards(conv *c) {
    size_t cap = c->o->shard_bytes ? c->o->shard_bytes : (size_t)5 << 30, total = 0;
    int n_sh = 0, *shard = calloc((size_t)c->n_out + 1, sizeof *shard);
    if (!shard) return cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
    for (int i = 0, acc = 0; i < c->n_out; i++) {   /* mlx-lm's make_shards: a new shard when this tensor would overflow */
        if (acc && (size_t)acc + c->out[i].nbytes > cap) { n_sh++; acc = 0; }
        shard[i] = n_sh;
        acc += (int)(c->out[i].nbytes > cap ? cap : c->out[i].nbytes);
        total += c->out[i].nbytes;
    }
    n_sh++;
    json_t *wm = json_object(), *idx = json_object();
    cinfer_status st = CINFER_OK;
    for (int s = 0, i0 = 0; s < n_sh && !st; s++) {
        char fname[64];
        if (n_sh == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_sh);
        int i1 = i0;
        while (i1 < c->n_out && shard[i1] == s) i1++;
        st_wtensor *w = calloc((size_t)(i1 - i0) + 1, sizeof *w);
        if (!w) { st = cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory"); break; }
        for (int i = i0; i < i1; i++) {
            otensor *t = &c->out[i];
            w[i - i0] = (st_wtensor){t->name, t->dtype, t->ndim, t->shape, t->data ? t->data : t->view, t->nbytes};
            json_object_set_new(wm, t->name, json_string(fname));
        }
        void *buf = NULL;
        size_t len = 0;
        st = st_write_mem(w, i1 - i0, "{\"format\":\"mlx\"}", &buf, &len, c->err, c->n);
        if (!st) {
            char *path = cf_path(c->o->dst, fname);
            st = path ? cf_write_atomic(path, buf, len, c->err, c->n) : cf_err(c->err, c->n, CINFER_ENOMEM, "out of memory");
            free(path);
        }
        if (!st && c->o->progress) fprintf(stderr, "[convert] wrote %s (%zu bytes, %d tensors)\n", fname, len, i1 - i0);
        free(buf);
        free(w);
        i0 = i1;
    }
    free(shard);
    if (!st) {
        json_object_set_new(idx, "metadata", json_pack("{s:I,s:I}", "total_size", (json_int_t)total, "total_parameters",
                                                       (json_int_t)c->n_params));
        json_object_set(idx, "weight_map", wm);
        st = write_json(c, "model.safetensors.index.json", idx);
    }
    json_decref(wm);
    json_decref(idx);
    return st;
}

static cinfer_status write_config(conv *c) {
    json_t *cfg = json_deep_copy(c->cfg), *sorted = json_object();
    json_object_del(cfg, "quantization");
    json_object_del(cfg, "quantization_config");
    if (c->o->quantize) {
        json_object_set(cfg, "quantization", c->qblock);
        json_object_set(cfg, "quantization_config", c->qblock);
    }
    /* mlx-lm writes the top-level keys sorted */
    size_t nk = json_object_size(cfg), k = 0;
    const char **keys = calloc(nk + 1, sizeof *keys), *key;
    json_t *v;
    json_object_foreach(cfg, key, v) keys[k++] = key;
    for (size_t i = 1; i < k; i++)
        for (size_t j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) { const char *t = keys[j]; keys[j] = keys[j - 1]; keys[j - 1] = t; }
    for (size_t i = 0; i < k; i++) json_object_set(sorted, keys[i], json_object_get(cfg, keys[i]));
    cinfer_status st = write_json(c, "config.json", sorted);
    free(keys);
    json_decref(sorted);
    json_decref(cfg);
    return st;
}

/* the tokenizer, generation config and every other non-weight file */
static cinfer_status copy_files(conv *c) {
    DIR *d = opendir(c->o->src);
    if (!d) return cf_err(c->err, c->n, CINFER_EIO, "%s: cannot list: %s", c->o->src, strerror(errno));
    cinfer_status st = CINFER_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        const char *nm = e->d_name;
        size_t l = strlen(nm);
        if (nm[0] == '.' || !strcmp(nm, "config.json") || !strcmp(nm, "model.safetensors.index.json") ||
            (l > 12 && !strcmp(nm + l - 12, ".safetensors")))
            continue;
        char *src = cf_path(c->o->src, nm), *dst = cf_path(c->o->dst, nm), *buf = NULL;
        struct stat sb;
        size_t len;
        if (src && dst && !stat(src, &sb) && S_ISREG(sb.st_mode)) {
            st = cf_read_file(src, &buf, &len, c->err, c->n);
            if (!st) st = cf_write_atomic(dst, buf, len, c->err, c->n);
        }
        free(buf);
        free(src);
        free(dst);
    }
    closedir(d);
    return st;
}

static cinfer_status check_opts(conv *c) {
    const qconvert_opts *o = c->o;
    struct stat sb;
    if (!o->src) return cf_err(c->err, c->n, CINFER_EINVAL, "--hf-path is required");
    if (stat(o->src, &sb) || !S_ISDIR(sb.st_mode)) return cf_err(c->err, c->n, CINFER_EIO, "%s: not a model directory", o->src);
    if (!stat(o->dst, &sb))
        return cf_err(c->err, c->n, CINFER_EINVAL, "%s already exists: cannot save to the path of an existing model (delete it or pick another --mlx-path)", o->dst);
    if (o->quantize && o->dequantize) return cf_err(c->err, c->n, CINFER_EINVAL, "choose either quantize (-q) or dequantize (-d), not both");
    if (!aq_valid(o->bits, 32)) return cf_err(c->err, c->n, CINFER_EINVAL, "--q-bits %d: supported are 2, 3, 4, 5, 6, 8", o->bits);
    if (!aq_valid(2, o->group)) return cf_err(c->err, c->n, CINFER_EINVAL, "--q-group-size %d: supported are 32, 64, 128", o->group);
    if (o->dtype && !dtype_of(o->dtype, &c->dt)) return cf_err(c->err, c->n, CINFER_EINVAL, "--dtype %s: want float16, bfloat16 or float32", o->dtype);
    if ((o->predicate || o->quant_config) && !o->quantize)
        return cf_err(c->err, c->n, CINFER_EINVAL, "--quant-predicate and --quant-config need -q");
    if (o->predicate) {
        static const char *rec[] = {"mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"};
        int k = -1;
        for (int i = 0; i < 4; i++) if (!strcmp(o->predicate, rec[i])) k = i;
        if (k < 0) return cf_err(c->err, c->n, CINFER_EINVAL, "--quant-predicate %s: want mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6", o->predicate);
        c->lo_bits = o->predicate[6] - '0';
        c->hi_bits = o->predicate[8] - '0';
    }
    return CINFER_OK;
}

static cinfer_status load_quant_config(conv *c) {
    json_error_t je;
    c->qfile = json_load_file(c->o->quant_config, 0, &je);
    if (!c->qfile || !json_is_object(c->qfile))
        return cf_err(c->err, c->n, CINFER_EFORMAT, "%s: not a JSON object of module path -> {\"bits\", \"group_size\"} (%s)",
                      c->o->quant_config, c->qfile ? "wrong type" : je.text);
    const char *k;
    json_t *v;
    json_object_foreach(c->qfile, k, v) {
        json_t *b = json_object_get(v, "bits"), *g = json_object_get(v, "group_size");
        int bits = json_is_integer(b) ? (int)json_integer_value(b) : c->o->bits, group = json_is_integer(g) ? (int)json_integer_value(g) : c->o->group;
        if (!json_is_object(v) || !aq_valid(bits, group))
            return cf_err(c->err, c->n, CINFER_EFORMAT, "%s: entry '%s': want {\"bits\": 2|3|4|5|6|8, \"group_size\": 32|64|128}",
                          c->o->quant_config, k);
    }
    return CINFER_OK;
}

static cinfer_status run(conv *c) {
    const qconvert_opts *o = c->o;
    cinfer_status st = check_opts(c);
    if (st) return st;
    char *cp = cf_path(o->src, "config.json");
    json_error_t je;
    c->cfg = cp ? json_load_file(cp, 0, &je) : NULL;
    if (!c->cfg || !json_is_object(c->cfg)) { st = cf_err(c->err, c->n, CINFER_EFORMAT, "%s: cannot read (%s)", cp, c->cfg ? "not an object" : je.text); free(cp); return st; }
    free(cp);
    int src_quant = json_is_object(json_object_get(c->cfg, "quantization")) || json_is_object(json_object_get(c->cfg, "quantization_config"));
    if (o->quantize && src_quant) return cf_err(c->err, c->n, CINFER_EINVAL, "%s is already quantized (config.json has a quantization block)", o->src);
    if (o->dequantize && !src_quant) return cf_err(c->err, c->n, CINFER_EINVAL, "%s is not quantized: nothing to dequantize", o->src);
    if (o->dequantize && (st = qc_load(o->src, &c->src_q, c->err, c->n))) return st;
    if (o->quant_config && (st = load_quant_config(c))) return st;
    c->have_dt = o->dtype != NULL;
    if (!c->have_dt) {
        json_t *d = json_object_get(c->cfg, "torch_dtype");
        if (!json_is_string(d)) d = json_object_get(c->cfg, "dtype");
        if (json_is_string(d)) c->have_dt = dtype_of(json_string_value(d), &c->dt);
    }
    if ((st = st_open_dir(o->src, &c->st, c->err, c->n))) return st;
    for (int i = 0; i < c->st.n; i++) if (strstr(c->st.t[i].name, "down_proj.weight")) c->n_layers++;
    c->qblock = json_pack("{s:i,s:i,s:s}", "group_size", o->group, "bits", o->predicate ? c->lo_bits : o->bits, "mode", "affine");
    for (int i = 0; i < c->st.n && !st; i++) {
        const st_tensor *t = &c->st.t[i];
        char path[300];
        size_t l = strlen(t->name);
        snprintf(path, sizeof path, "%.*s", (int)(l > 7 ? l - 7 : l), t->name);
        int64_t e = 1;
        for (int d = 0; d < t->ndim; d++) e *= t->shape[d];
        if (o->dequantize) {
            char sn[320];
            snprintf(sn, sizeof sn, "%s.scales", path);
            int packed = !strcmp(t->dtype, "U32") && st_find(&c->st, sn);
            if ((l > 7 && (!strcmp(t->name + l - 7, ".scales") || !strcmp(t->name + l - 7, ".biases")))) {
                char wn[320];
                snprintf(wn, sizeof wn, "%.*s.weight", (int)(l - 7), t->name);
                const st_tensor *w = st_find(&c->st, wn);
                if (w && !strcmp(w->dtype, "U32")) continue;
            }
            st = packed ? dequantize_one(c, t, path) : cast_one(c, t);
            if (!st) { otensor *ot = &c->out[c->n_out - 1]; int64_t p = 1; for (int d = 0; d < ot->ndim; d++) p *= ot->shape[d]; c->n_params += p; }
        } else {
            int bits, group, entry;
            c->n_params += e;
            if (o->quantize && quantizable(t) && module_params(c, path, t->shape[1], &bits, &group, &entry))
                st = quantize_one(c, t, path, bits, group, entry);
            else
                st = cast_one(c, t);
        }
        if (!st && o->progress)
            fprintf(stderr, "[convert] %d/%d %s%s\n", i + 1, c->st.n, t->name,
                    c->n_out && !strcmp(c->out[c->n_out - 1].name + strlen(c->out[c->n_out - 1].name) - 7, ".biases") ? " (quantized)" : "");
    }
    if (!st && c->qfile) {
        const char *k;
        json_t *v;
        json_object_foreach(c->qfile, k, v)
            if (!json_object_get(v, "__used"))
                return cf_err(c->err, c->n, CINFER_EINVAL, "%s: entry '%s' names no quantizable module of %s", o->quant_config, k, o->src);
    }
    if (st) return st;
    qsort(c->out, (size_t)c->n_out, sizeof *c->out, cmp_out);
    if (mkdir(o->dst, 0755)) return cf_err(c->err, c->n, CINFER_EIO, "%s: cannot create: %s", o->dst, strerror(errno));
    if (!(st = write_shards(c)) && !(st = write_config(c))) st = copy_files(c);
    return st;
}

cinfer_status qconvert(const qconvert_opts *o, char *err, size_t n) {
    conv c = {.o = o, .err = err, .n = n};
    cinfer_status st = run(&c);
    for (int i = 0; i < c.n_out; i++) { free(c.out[i].name); free(c.out[i].data); }
    free(c.out);
    json_decref(c.cfg);
    json_decref(c.qblock);
    json_decref(c.qfile);
    qc_free(c.src_q);
    st_close(&c.st);
    return st;
}
