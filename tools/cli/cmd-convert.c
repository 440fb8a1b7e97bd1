/*
 * cmd-convert.c — `cinfer convert`: mlx_lm.convert's flags over qconvert
 * (src/quant/convert.h), plus --quant-config (per-module overrides, OptiQ's
 * form) and --rounding (MLX's GPU rule, what mlx_lm.convert writes on a Mac,
 * or its CPU rule).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "quant/convert.h"

static void convert_help(FILE *f) {
    fprintf(f,
            "usage: cinfer convert --hf-path SRC [--mlx-path DST] [-q [--q-bits B] [--q-group-size G]\n"
            "                      [--quant-predicate RECIPE] [--quant-config FILE]] [-d] [--dtype T] [--rounding R]\n"
            "Writes DST (default mlx_model; must not exist) in mlx-lm's layout: safetensors with {\"format\":\"mlx\"},\n"
            "model.safetensors.index.json, 5 GB shards, config.json with \"quantization\" and \"quantization_config\",\n"
            "tokenizer and generation files copied. Progress on stderr.\n"
            "  --hf-path SRC          model directory to read (local)\n"
            "  --mlx-path DST         output directory (default mlx_model)\n"
            "  -q, --quantize         MLX affine quantization of the embedding, head and projections\n"
            "  --q-bits B             2, 3, 4, 5, 6 or 8 (default 4)\n"
            "  --q-group-size G       32, 64 or 128 (default 64)\n"
            "  --quant-predicate R    mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6: the high bits on v_proj/down_proj of\n"
            "                         layers i < L/8, i >= 7L/8, (i - L/8) %% 3 == 2, and on lm_head (as mlx-lm)\n"
            "  --quant-config FILE    JSON {module path: {\"bits\": B, \"group_size\": G}} overriding single modules\n"
            "  --rounding gpu|cpu     gpu (default): MLX's Metal/CUDA quantizer (max starts at 0, round half away\n"
            "                         from zero), what mlx_lm.convert writes on a Mac; cpu: MLX's CPU quantizer (rint)\n"
            "  -d, --dequantize       dequantize an MLX-quantized model (as mx.dequantize, in the scale dtype)\n"
            "  --dtype T              float16, bfloat16 or float32 for the float weights (default: config.json's)\n"
            "  --quiet                no progress lines\n");
}

int cmd_convert(int argc, char **argv) {
    static const struct option lo[] = {
        {"hf-path", 1, 0, 1}, {"mlx-path", 1, 0, 2}, {"quantize", 0, 0, 'q'}, {"q-bits", 1, 0, 3}, {"q-group-size", 1, 0, 4},
        {"quant-predicate", 1, 0, 5}, {"quant-config", 1, 0, 6}, {"rounding", 1, 0, 7}, {"dequantize", 0, 0, 'd'},
        {"dtype", 1, 0, 8}, {"quiet", 0, 0, 9}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    qconvert_opts o = {.dst = "mlx_model", .bits = 4, .group = 64, .rounding = AQ_ROUND_GPU, .progress = 1};
    int c;
    if (!cli_getopt_begin("convert", argc, argv, "qdh", lo)) return 2;
    while ((c = getopt_long(argc, argv, "qdh", lo, NULL)) != -1) {
        switch (c) {
        case 1: o.src = optarg; break;
        case 2: o.dst = optarg; break;
        case 'q': o.quantize = 1; break;
        case 'd': o.dequantize = 1; break;
        case 3: if (!cli_int("convert", "--q-bits", optarg, 1, 64, &o.bits)) return 2; break;
        case 4: if (!cli_int("convert", "--q-group-size", optarg, 1, 1 << 20, &o.group)) return 2; break;
        case 5: o.predicate = optarg; break;
        case 6: o.quant_config = optarg; break;
        case 7:
            if (!strcmp(optarg, "gpu")) o.rounding = AQ_ROUND_GPU;
            else if (!strcmp(optarg, "cpu")) o.rounding = AQ_ROUND_CPU;
            else { fprintf(stderr, "cinfer convert: --rounding wants gpu or cpu (got '%s')\n", optarg); return 2; }
            break;
        case 8: o.dtype = optarg; break;
        case 9: o.progress = 0; break;
        case 'h': convert_help(stdout); return 0;
        default: cli_bad_option("convert", argv, c); convert_help(stderr); return 2;
        }
    }
    if (!cli_no_more_args("convert", argc, argv)) return 2;
    if (!o.src) { fprintf(stderr, "cinfer convert: need --hf-path SRC (try --help)\n"); return 2; }
    char err[1024];
    if (qconvert(&o, err, sizeof err)) { fprintf(stderr, "cinfer convert: %s\n", err); return 1; }
    if (o.progress) fprintf(stderr, "[convert] done: %s\n", o.dst);
    return 0;
}
