/*
 * test-convert.c — `cinfer convert` (src/quant/convert.c) against references:
 *  - --rounding cpu -q --quant-predicate mixed_3_6 --q-group-size 64 of
 *    ../shared/models/prose-13m reproduces ../shared/models/prose-13m-mlx-mixed-3-6
 *    (written by mlx_lm.convert with MLX's CPU backend): every tensor bit for
 *    bit, the same config.json quantization block, the same index;
 *  - --rounding gpu at every bit width (g64) and group size (4-bit g32/g128):
 *    the output loads and its logits equal transformers float32 on the same
 *    model quantized by the NumPy port of MLX's GPU quantizer
 *    (tests/fixtures/quant/convert, tests/reference/make_quant_fixtures.py);
 *  - -d --dtype float32 (dequantize round trip): the dense model's logits equal
 *    the quantized model's (same s*q+b values, f32 matmuls);
 *  - --quant-config overrides one module; refusals: an existing output, bits 7,
 *    group 48, an unknown recipe, -q of a quantized model, -d of a dense one,
 *    a --quant-config entry naming no module.
 */
#include <jansson.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "golden.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "quant/convert.h"

#define F32_TOL 5e-6   /* what test-model holds the dense f32 path to */
static char root[256], prose[512], mixed[512];

static const char *out_dir(const char *name) {
    static char d[600];
    snprintf(d, sizeof d, "%s/%s", root, name);
    return d;
}

static qconvert_opts opts(const char *src, const char *dst) {
    return (qconvert_opts){.src = src, .dst = dst, .bits = 4, .group = 64, .rounding = AQ_ROUND_GPU};
}

static void test_mlx_mixed(void) {
    qconvert_opts o = opts(prose, out_dir("mixed36"));
    o.quantize = 1;
    o.predicate = "mixed_3_6";
    o.rounding = AQ_ROUND_CPU;
    char err[512] = "";
    CHECK(qconvert(&o, err, sizeof err) == CINFER_OK, "convert -q --quant-predicate mixed_3_6 --rounding cpu (%s)", err);
    st_set a = {0}, b = {0};
    int ok = !st_open_dir(o.dst, &a, err, sizeof err) && !st_open_dir(mixed, &b, err, sizeof err) && a.n == b.n, same = 0;
    for (int i = 0; ok && i < a.n; i++) {
        const st_tensor *x = &a.t[i], *y = st_find(&b, x->name);
        same += y && !strcmp(x->dtype, y->dtype) && x->ndim == y->ndim && !memcmp(x->shape, y->shape, sizeof x->shape) &&
                x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
    }
    CHECK(ok && same == a.n, "mixed_3_6 output: %d of %d tensors bit for bit equal to mlx_lm.convert's (%s)", same, b.n,
          a.metadata ? a.metadata : "");
    CHECK(a.metadata && !strcmp(a.metadata, "{\"format\":\"mlx\"}"), "safetensors metadata {\"format\":\"mlx\"}");
    st_close(&a);
    st_close(&b);
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/config.json", o.dst);
    snprintf(p2, sizeof p2, "%s/config.json", mixed);
    json_t *c1 = json_load_file(p1, 0, NULL), *c2 = json_load_file(p2, 0, NULL);
    CHECK(c1 && c2 && json_equal(json_object_get(c1, "quantization"), json_object_get(c2, "quantization")) &&
              json_equal(json_object_get(c1, "quantization_config"), json_object_get(c2, "quantization_config")) && json_equal(c1, c2),
          "config.json equals mlx-lm's (quantization and quantization_config blocks, every key)");
    json_decref(c1);
    json_decref(c2);
    snprintf(p1, sizeof p1, "%s/model.safetensors.index.json", o.dst);
    snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", mixed);
    c1 = json_load_file(p1, 0, NULL);
    c2 = json_load_file(p2, 0, NULL);
    CHECK(c1 && c2 && json_equal(c1, c2), "index (total_size, total_parameters, weight_map) equals mlx-lm's");
    {   /* model info: parameters as mlx-lm counts them (the index's total_parameters), stored types, bits per weight */
        json_t *md = json_object_get(c2, "metadata");
        json_int_t tp = json_integer_value(json_object_get(md, "total_parameters")), ts = json_integer_value(json_object_get(md, "total_size"));
        cinfer_model *m = golden_load(mixed, NULL, 1);
        cinfer_model_info mi;
        if (m) cinfer_model_get_info(m, &mi);
        CHECK(m && mi.n_params == tp && !strcmp(mi.weight_types, "q3+q6 (affine g64, bf16 scales)") &&
                  fabs(mi.bits_per_weight - 8.0 * (double)ts / (double)tp) < 1e-9 && !strcmp(mi.weight_dtype, "q3"),
              "model info: %lld parameters (index: %lld), types '%s', %.3f bits per weight", m ? (long long)mi.n_params : -1LL,
              (long long)tp, m ? mi.weight_types : "", m ? mi.bits_per_weight : 0.0);
        cinfer_model_free(m);
    }
    json_decref(c1);
    json_decref(c2);
    snprintf(p1, sizeof p1, "%s/tokenizer.json", o.dst);
    CHECK(access(p1, R_OK) == 0, "tokenizer.json copied");
    o.rounding = AQ_ROUND_GPU;
    CHECK(qconvert(&o, err, sizeof err) != CINFER_OK && strstr(err, "already exists"), "an existing output is refused (%s)", err);
}

static void test_gpu_cases(void) {
    json_t *cs = json_load_file("tests/fixtures/quant/convert/cases.json", 0, NULL);
    float *ref = NULL;
    int nd;
    int64_t sh[4];
    char err[512];
    CHECK(cs && !npy_read_f32("tests/fixtures/quant/convert/logits2.npy", &ref, &nd, sh, err, sizeof err), "convert fixtures read");
    if (!cs || !ref) { json_decref(cs); free(ref); return; }
    int32_t ids[16];
    int n = golden_ids(json_object_get(cs, "tokens2"), ids, 16);
    json_t *arr = json_object_get(cs, "cases"), *e;
    size_t i;
    json_array_foreach(arr, i, e) {
        int bits = (int)json_integer_value(json_object_get(e, "bits")), group = (int)json_integer_value(json_object_get(e, "group_size"));
        char name[64];
        snprintf(name, sizeof name, "b%d-g%d", bits, group);
        qconvert_opts o = opts(prose, out_dir(name));
        o.quantize = 1;
        o.bits = bits;
        o.group = group;
        int ok = qconvert(&o, err, sizeof err) == CINFER_OK;
        cinfer_model *m = ok ? golden_load(o.dst, NULL, 1) : NULL;
        float *lg = NULL;
        int V = 0;
        if (m) {
            cinfer_model_info info;
            cinfer_model_get_info(m, &info);
            V = info.n_vocab;
            lg = golden_eval_all(m, ids, n, V);
        }
        double e2 = lg && sh[1] == V ? golden_rel_err(lg, ref + i * (size_t)n * (size_t)V, (size_t)n * V) : 1;
        CHECK(ok && lg && e2 <= F32_TOL, "convert -q --q-bits %d --q-group-size %d (gpu rule): logits vs transformers on the NumPy-port "
              "quantization: %.2e of range (tolerance %.0e)%s%s", bits, group, e2, F32_TOL, ok ? "" : ": ", ok ? "" : err);
        free(lg);
        cinfer_model_free(m);
    }
    json_decref(cs);
    free(ref);
}

static void test_dequantize(void) {
    qconvert_opts o = opts(mixed, out_dir("deq-f32"));
    o.dequantize = 1;
    o.dtype = "float32";
    char err[512];
    int ok = qconvert(&o, err, sizeof err) == CINFER_OK;
    CHECK(ok, "convert -d --dtype float32 of the mlx-lm checkpoint (%s)", ok ? "ok" : err);
    cinfer_model *q = golden_load(mixed, NULL, 1), *d = ok ? golden_load(o.dst, NULL, 1) : NULL;
    int32_t ids[] = {1, 739, 338, 263, 8760, 4946, 635, 24084, 3192};
    if (q && d) {
        cinfer_model_info iq, id;
        cinfer_model_get_info(q, &iq);
        cinfer_model_get_info(d, &id);
        float *a = golden_eval_all(q, ids, 9, iq.n_vocab), *b = golden_eval_all(d, ids, 9, id.n_vocab);
        double e = a && b ? golden_rel_err(a, b, (size_t)9 * iq.n_vocab) : 1;
        CHECK(e <= F32_TOL && !strcmp(id.weight_dtype, "f32"), "dequantize round trip: dense f32 logits == quantized logits (%.2e of range)", e);
        free(a);
        free(b);
    }
    cinfer_model_free(q);
    cinfer_model_free(d);
    /* the default keeps the scale dtype (bf16), as mx.dequantize */
    o = opts(mixed, out_dir("deq-bf16"));
    o.dequantize = 1;
    ok = qconvert(&o, err, sizeof err) == CINFER_OK;
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", o.dst);
    json_t *c = json_load_file(p, 0, NULL);
    d = ok ? golden_load(o.dst, NULL, 1) : NULL;
    cinfer_model_info id;
    if (d) cinfer_model_get_info(d, &id);
    CHECK(ok && c && !json_object_get(c, "quantization") && !json_object_get(c, "quantization_config") && d &&
              !strcmp(id.weight_dtype, "bf16"),
          "convert -d: bf16 weights, no quantization block, loads");
    json_decref(c);
    cinfer_model_free(d);
}

static void refuse(const char *what, qconvert_opts o, const char *needle) {
    char err[512] = "";
    CHECK(qconvert(&o, err, sizeof err) != CINFER_OK && strstr(err, needle), "%s refused: %s", what, err);
}

static void test_options(void) {
    char qc[600], err[512];
    snprintf(qc, sizeof qc, "%s/qc.json", root);
    FILE *f = fopen(qc, "w");
    if (f) { fputs("{\"model.layers.1.mlp.down_proj\": {\"bits\": 8, \"group_size\": 32}}", f); fclose(f); }
    qconvert_opts o = opts(prose, out_dir("qc"));
    o.quantize = 1;
    o.quant_config = qc;
    int ok = qconvert(&o, err, sizeof err) == CINFER_OK;
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", o.dst);
    json_t *c = json_load_file(p, 0, NULL), *e = json_object_get(json_object_get(c, "quantization"), "model.layers.1.mlp.down_proj");
    cinfer_model *m = ok ? golden_load(o.dst, NULL, 1) : NULL;
    CHECK(ok && json_integer_value(json_object_get(e, "bits")) == 8 && json_integer_value(json_object_get(e, "group_size")) == 32 &&
              json_object_size(json_object_get(c, "quantization")) == 4 && m,
          "--quant-config: the one module at 8 bits g32 in config.json, the rest at the defaults; loads");
    cinfer_model_free(m);
    json_decref(c);
    f = fopen(qc, "w");
    if (f) { fputs("{\"model.layers.7.mlp.down_proj\": {\"bits\": 8}}", f); fclose(f); }
    o = opts(prose, out_dir("qc2"));
    o.quantize = 1;
    o.quant_config = qc;
    refuse("--quant-config entry naming no module", o, "model.layers.7.mlp.down_proj");
    o = opts(prose, out_dir("x"));
    o.quantize = 1;
    o.bits = 7;
    refuse("--q-bits 7", o, "--q-bits 7");
    o.bits = 4;
    o.group = 48;
    refuse("--q-group-size 48", o, "--q-group-size 48");
    o.group = 64;
    o.predicate = "mixed_5_7";
    refuse("--quant-predicate mixed_5_7", o, "mixed_5_7");
    o = opts(mixed, out_dir("x"));
    o.quantize = 1;
    refuse("-q of a quantized model", o, "already quantized");
    o = opts(prose, out_dir("x"));
    o.dequantize = 1;
    refuse("-d of a dense model", o, "not quantized");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/cinfer-convert-XXXXXX");
    if (!mkdtemp(root)) return 1;
    snprintf(prose, sizeof prose, "%s/models/prose-13m", shared_dir());
    snprintf(mixed, sizeof mixed, "%s/models/prose-13m-mlx-mixed-3-6", shared_dir());
    test_mlx_mixed();
    test_gpu_cases();
    test_dequantize();
    test_options();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) printf("# cleanup of %s failed\n", root);
    return CHECK_DONE();
}
