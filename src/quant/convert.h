/*
 * convert.h — `cinfer convert`: mlx_lm.convert's quantize / dequantize of a
 * model directory into a new one, in mlx-lm's output layout (safetensors with
 * {"format":"mlx"} metadata, model.safetensors.index.json, 5 GB shards,
 * config.json with both "quantization" and "quantization_config", the
 * tokenizer and generation files copied).
 *
 * Quantized: every 2-D "<path>.weight" that is an embedding, a head or a
 * projection (not a norm) whose input dim the group size divides (others stay
 * dense, as mlx-lm skips them). Weights are cast to the output dtype first
 * (--dtype, else config.json's torch_dtype/dtype, else kept), then quantized
 * by src/quant/affine with the chosen rounding rule; scales and biases are in
 * that dtype. Mixed recipes (mixed_a_b) give b bits to v_proj/down_proj of
 * layers i < L/8, i >= 7L/8, (i - L/8) % 3 == 2 (integer division, as
 * mlx-lm) and to lm_head, a bits elsewhere; --quant-config overrides single
 * modules (path -> {"bits","group_size"}, OptiQ's form).
 */
#ifndef CINFER_CONVERT_H
#define CINFER_CONVERT_H
#include <stddef.h>
#include "cinfer.h"
#include "quant/affine.h"

typedef struct qconvert_opts {
    const char *src, *dst;       /* --hf-path, --mlx-path */
    int quantize, dequantize;    /* -q, -d (exclusive; neither: a dtype conversion) */
    int bits, group;             /* --q-bits (4), --q-group-size (64) */
    const char *predicate;       /* --quant-predicate mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6, or NULL */
    const char *dtype;           /* --dtype float16|bfloat16|float32, or NULL */
    const char *quant_config;    /* --quant-config FILE, or NULL */
    aq_rounding rounding;        /* --rounding gpu (default) | cpu */
    int progress;                /* 1: one line per tensor on stderr */
    size_t shard_bytes;          /* 0: 5 GB */
} qconvert_opts;

cinfer_status qconvert(const qconvert_opts *o, char *err, size_t n);
#endif
