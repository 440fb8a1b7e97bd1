/*
 * test-quant-load.c — MLX-quantized model directories that must be refused:
 * each load ends in a status and a message naming the file, the tensor or
 * module, and the problem (never a crash). The broken directories are copies
 * of ../shared/models/prose-13m-mlx-mixed-3-6 (written by mlx-lm) with one
 * thing changed in config.json or in the safetensors file, and one built from
 * the shipped stories260k (hidden 64, so group 128 cannot divide it).
 * Also: the untouched copy loads, `quantization_config` alone is read like
 * `quantization`, and a module whose entry is `false` stays dense.
 */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "io/safetensors.h"
#include "util.h"

static char root[256];
static char mixed[512];

/* what a test changes in the copy's tensors: drop `drop`, rename `from` to `to`, re-declare `reshape`'s last dim as `dim` */
typedef struct edit { const char *drop, *reshape; int64_t dim; } edit;

/* copies src (config.json edited by cfg_edit, tensors by e) into root/name; returns the dir */
static const char *make_copy(const char *name, const char *src, void (*cfg_edit)(json_t *), const edit *e) {
    static char dir[512];
    char path[700], err[256];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (cfg && cfg_edit) cfg_edit(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg) json_dump_file(cfg, path, JSON_INDENT(1));
    json_decref(cfg);
    st_set st = {0};
    if (st_open_dir(src, &st, err, sizeof err)) { printf("# %s: %s\n", src, err); return dir; }
    st_wtensor *w = calloc((size_t)st.n, sizeof *w);
    int64_t (*shapes)[ST_MAX_DIMS] = calloc((size_t)st.n, sizeof *shapes);
    int n = 0;
    for (int i = 0; i < st.n; i++) {
        const st_tensor *t = &st.t[i];
        if (e && e->drop && !strcmp(t->name, e->drop)) continue;
        memcpy(shapes[n], t->shape, sizeof shapes[n]);
        size_t nb = t->nbytes;
        if (e && e->reshape && !strcmp(t->name, e->reshape)) {
            nb = nb / (size_t)t->shape[t->ndim - 1] * (size_t)e->dim;
            if (nb > t->nbytes) nb = t->nbytes;   /* keep the data inside the source map */
            shapes[n][t->ndim - 1] = e->dim;
        }
        w[n] = (st_wtensor){t->name, t->dtype, t->ndim, shapes[n], t->data, nb};
        n++;
    }
    void *buf = NULL;
    size_t len = 0;
    if (!st_write_mem(w, n, "{\"format\":\"mlx\"}", &buf, &len, err, sizeof err)) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        FILE *f = fopen(path, "wb");
        if (f) { fwrite(buf, 1, len, f); fclose(f); }
    }
    free(buf);
    free(w);
    free(shapes);
    st_close(&st);
    return dir;
}

/* the load fails, and the message holds every one of the NULL-terminated needles */
static void refused(const char *what, const char *dir, ...) {
    cinfer_model *m = NULL;
    char err[512] = "";
    cinfer_load_opts o = {.no_tokenizer = 1};
    cinfer_status st = cinfer_model_load(dir, &o, &m, err, sizeof err);
    int ok = st != CINFER_OK && !m;
    va_list ap;
    va_start(ap, dir);
    for (const char *s; (s = va_arg(ap, const char *));) ok &= strstr(err, s) != NULL;
    va_end(ap);
    CHECK(ok, "%s: refused with '%s'", what, err);
    cinfer_model_free(m);
}

static json_t *qblock(json_t *c) { return json_object_get(c, "quantization"); }
static void set_q(json_t *c, const char *mod, const char *key, json_t *v) {
    json_t *q = qblock(c), *e = mod ? json_object_get(q, mod) : q;
    json_object_set_new(e, key, v);
    json_object_del(c, "quantization_config");
}
static void bits7(json_t *c) { set_q(c, NULL, "bits", json_integer(7)); }
static void group48(json_t *c) { set_q(c, "model.layers.1.mlp.up_proj", "group_size", json_integer(48)); }
static void mxfp4(json_t *c) { set_q(c, "model.layers.0.self_attn.q_proj", "mode", json_string("mxfp4")); }
static void nomodule(json_t *c) {
    json_object_set_new(qblock(c), "model.layers.9.mlp.up_proj", json_pack("{s:i,s:i}", "bits", 4, "group_size", 64));
    json_object_del(c, "quantization_config");
}
static void unknown(json_t *c) { set_q(c, NULL, "fancy_option", json_integer(3)); }
static void bits_wrong(json_t *c) { set_q(c, "model.layers.0.self_attn.q_proj", "bits", json_integer(4)); }
static void awq(json_t *c) {
    json_object_del(c, "quantization");
    json_object_set_new(c, "quantization_config", json_pack("{s:s,s:i,s:i}", "quant_method", "awq", "bits", 4, "group_size", 128));
}
static void noblock(json_t *c) { json_object_del(c, "quantization"); json_object_del(c, "quantization_config"); }
static void only_hf(json_t *c) { json_object_del(c, "quantization"); }
static void g128_story(json_t *c) {
    json_object_set_new(c, "quantization", json_pack("{s:i,s:i,s:s}", "group_size", 128, "bits", 4, "mode", "affine"));
}

/* stories260k with layer 0's q_proj replaced by a 4-bit packed tensor (64 inputs) and its scales/biases */
static const char *story_g128(void) {
    static char dir[512];
    char err[256], path[700];
    snprintf(dir, sizeof dir, "%s/story-g128", root);
    mkdir(dir, 0755);
    json_t *cfg = json_load_file("models/stories260k/config.json", 0, NULL);
    if (cfg) { g128_story(cfg); snprintf(path, sizeof path, "%s/config.json", dir); json_dump_file(cfg, path, 0); }
    json_decref(cfg);
    st_set st = {0};
    if (st_open_dir("models/stories260k", &st, err, sizeof err)) return dir;
    st_wtensor *w = calloc((size_t)st.n + 2, sizeof *w);
    static uint32_t packed[64 * 8];
    static float sb[64 * 2];
    static int64_t shp[3][2] = {{64, 8}, {64, 2}, {64, 2}};
    int n = 0;
    for (int i = 0; i < st.n; i++) {
        const st_tensor *t = &st.t[i];
        if (!strcmp(t->name, "model.layers.0.self_attn.q_proj.weight") && t->shape[1] == 64 && t->shape[0] == 64) {
            w[n++] = (st_wtensor){t->name, "U32", 2, shp[0], packed, sizeof packed};
            w[n++] = (st_wtensor){"model.layers.0.self_attn.q_proj.scales", "F32", 2, shp[1], sb, sizeof sb};
            w[n++] = (st_wtensor){"model.layers.0.self_attn.q_proj.biases", "F32", 2, shp[2], sb, sizeof sb};
        } else {
            w[n++] = (st_wtensor){t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes};
        }
    }
    void *buf = NULL;
    size_t len = 0;
    if (!st_write_mem(w, n, NULL, &buf, &len, err, sizeof err)) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        FILE *f = fopen(path, "wb");
        if (f) { fwrite(buf, 1, len, f); fclose(f); }
    }
    free(buf);
    free(w);
    st_close(&st);
    return dir;
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/cinfer-quant-load-XXXXXX");
    if (!mkdtemp(root)) return 1;
    snprintf(mixed, sizeof mixed, "%s/models/prose-13m-mlx-mixed-3-6", shared_dir());

    cinfer_model *m = NULL;
    char err[512];
    cinfer_load_opts o = {.no_tokenizer = 1};
    const char *d = make_copy("same", mixed, NULL, NULL);
    CHECK(!cinfer_model_load(d, &o, &m, err, sizeof err), "unchanged copy of the mlx-lm checkpoint loads (%s)", m ? "ok" : err);
    cinfer_model_free(m);
    m = NULL;
    d = make_copy("hf-only", mixed, only_hf, NULL);
    CHECK(!cinfer_model_load(d, &o, &m, err, sizeof err), "quantization_config alone is read (%s)", m ? "ok" : err);
    cinfer_model_free(m);

    refused("bits 7", make_copy("bits7", mixed, bits7, NULL), "config.json", "bits 7", NULL);
    refused("group 48", make_copy("g48", mixed, group48, NULL), "config.json", "model.layers.1.mlp.up_proj", "group_size 48", NULL);
    refused("mode mxfp4", make_copy("mxfp4", mixed, mxfp4, NULL), "config.json", "model.layers.0.self_attn.q_proj", "mxfp4", NULL);
    refused("entry naming no module", make_copy("nomod", mixed, nomodule, NULL), "config.json", "model.layers.9.mlp.up_proj",
            "names no module", NULL);
    refused("unknown key", make_copy("unknown", mixed, unknown, NULL), "config.json", "fancy_option", NULL);
    refused("quant_method awq", make_copy("awq", mixed, awq, NULL), "config.json", "awq", NULL);
    refused("scales without a quantization block", make_copy("noblock", mixed, noblock, NULL), "model.embed_tokens.scales",
            "no \"quantization\" block", NULL);
    edit e1 = {.drop = "model.layers.1.mlp.up_proj.scales"};
    refused("missing scales", make_copy("noscales", mixed, NULL, &e1), "model.safetensors", "model.layers.1.mlp.up_proj.scales", "has no tensor", NULL);
    edit e2 = {.drop = "model.layers.4.self_attn.v_proj.biases"};
    refused("missing biases", make_copy("nobiases", mixed, NULL, &e2), "model.safetensors", "model.layers.4.self_attn.v_proj.biases", "has no tensor", NULL);
    refused("bits that disagree with the packed shape", make_copy("bits4", mixed, bits_wrong, NULL), "model.safetensors",
            "model.layers.0.self_attn.q_proj.weight", "disagrees with 4 bits", NULL);
    edit e3 = {.reshape = "model.layers.2.mlp.down_proj.weight", .dim = 100};
    refused("packed width that disagrees with bits", make_copy("narrow", mixed, NULL, &e3), "model.safetensors",
            "model.layers.2.mlp.down_proj.weight", "disagrees with 6 bits", NULL);
    refused("group that does not divide the input dimension", story_g128(), "model.safetensors",
            "model.layers.0.self_attn.q_proj.weight", "not divisible by group_size 128", NULL);
    {   /* truncated packed data: the file cut inside the last tensor */
        char path[700];
        d = make_copy("trunc", mixed, NULL, NULL);
        snprintf(path, sizeof path, "%s/model.safetensors", d);
        struct stat sb;
        if (!stat(path, &sb)) CHECK(truncate(path, sb.st_size - 1000) == 0, "file truncated");
        refused("truncated packed data", d, "model.safetensors", "truncated", NULL);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) printf("# cleanup of %s failed\n", root);
    return CHECK_DONE();
}
