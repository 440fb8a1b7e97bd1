/*
 * quant-config.h — config.json's MLX quantization block ("quantization", or
 * its "quantization_config" mirror): global bits / group_size / mode and
 * per-module entries keyed by module path (a dict overriding them, or false
 * = not quantized). Read by the model loader (arch.c decides per module:
 * quantized when it has an entry, or when "<path>.scales" exists) and
 * written by `cinfer convert`. Only mode "affine" is accepted; mxfp4/nvfp4,
 * other quant_methods, bad bits or group sizes and keys that are neither a
 * known field nor a module entry are refused with a message naming them.
 * Reference: mlx-lm utils.py (load_model's class_predicate), ../shared/specs/quantization.md.
 */
#ifndef CINFER_QUANT_CONFIG_H
#define CINFER_QUANT_CONFIG_H
#include <stddef.h>
#include "cinfer.h"

typedef struct qc_module {
    char *path;       /* "model.layers.0.self_attn.q_proj" */
    int skip;         /* entry is false: not quantized */
    int bits, group;  /* the entry's, defaults filled in from the globals */
    int used;         /* set by qc_find: the loader bound a module of this path */
} qc_module;

typedef struct quant_config {
    char file[512];   /* ".../config.json", for messages */
    const char *key;  /* "quantization" or "quantization_config" */
    int bits, group;  /* globals (mlx defaults 4 / 64 when absent) */
    int n;
    qc_module *mods;  /* [n] */
} quant_config;

/* *out = NULL when config.json has no quantization block */
cinfer_status qc_load(const char *dir, quant_config **out, char *err, size_t n);
void qc_free(quant_config *q);
/* the entry of a module path (marked used), or NULL */
qc_module *qc_find(quant_config *q, const char *path);
/* the first entry no module claimed, or NULL */
const qc_module *qc_unused(const quant_config *q);
#endif
