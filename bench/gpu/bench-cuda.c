/*
 * bench-cuda.c — cinfer's CUDA backend on random-weight models of real
 * shapes (bf16): prefill tok/s at P tokens and batch-1 decode tok/s (G new
 * tokens after a 128-token prompt, greedy), each next to its ceiling measured
 * in the same process: device-to-device copy bandwidth (bytes read + written)
 * for decode, cuBLAS bf16 GEMM rate (8192^3, random data) for prefill.
 *
 * The model directory is written here as a sparse file (config.json and a
 * safetensors header; the data is a hole), loaded through the normal path
 * (cinfer_model_load, device "cuda", weights uploaded once), then every
 * device weight is overwritten with random values on the GPU
 * (cuda_fill_random): an 8B model would take minutes to write to disk.
 * Everything else is the library's own path: cinfer_eval for prefill;
 * decode through ctx_greedy_run (what cinfer_generate does for greedy
 * sampling: graph replay, argmax on the device feeding the next step, each
 * token copied back while the next step runs), and
 * again with cinfer_eval copying each step's logits to the host.
 *
 * Two more modes (environment; both on the same loaded model, after the
 * above): BENCH_AGG="1 8 32 64" — N sequences of different prompt lengths
 * (64..511 tokens) decoding together, one row per sequence per step, through
 * the library's batched path (the engine a server uses), with the weight and
 * KV bytes a step reads against copy bandwidth and the step's graph replayed alone (agg_decode;
 * BENCH_AGG_PROFILE=1 also runs one step between cudaProfilerStart and Stop for ncu); BENCH_LONG="4096
 * 32768 131000" — one sequence decoding after a context of that many tokens
 * (prefilled in chunks of 4096), same measures (long_decode). BENCH_ONLY=1
 * skips the prefill/decode/breakdown part. BENCH_KVQ="4096 32768 131000" (issue 15): the same
 * long-context decode with bf16 pages, then KV8 and KV4 (MLX affine codes, group 64, bf16 scales,
 * quantized from the first write: quantized_kv_start -1), each against copy bandwidth with the
 * weight + KV bytes a step reads, and each quantized rate against the bf16 one (kvq_decode). With it, BENCH_SCORE="512 2048" (issue 18):
 * cinfer_perplexity's scored positions/s at those tokens per row against the
 * same forward with logits at every position left on the device (LM head
 * included, nothing reduced: the same plan and chunks through
 * ctx_forward_score without a request), and cinfer_kl (a live base: the same
 * model in a second context) against two such forwards (score_bench).
 *
 * usage: bench-cuda SHAPE DIR [prefill_tokens=2048] [gen_tokens=128]
 *   SHAPE: llama-3.2-1b | llama-3-8b | llama-3.1-8b | gemma-3-4b (every Llama row is written with
 *   Llama-3.1's context: max_position_embeddings 131072, rope_scaling llama3 factor 8; so
 *   llama-3.1-8b is llama-3-8b's shape under its own name).  Prints a table and JSON lines.
 *   BENCH_LONG also prints the KV bytes held after the context against a cache
 *   keeping every layer whole (gemma-3-4b: its sliding layers hold their window).
 *   BENCH_AB=VAR (environment): also compares the decode step with the
 *   backend knob VAR at 0 and 1, or at 0 and $BENCH_AB_ON (ab_compare). BENCH_PROFILE: one decode
 *   step for a profiler (profile_step).
 */
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>
#include "cinfer.h"
#include "engine/engine.h"
#include "engine/score.h"
#include "backend/cuda/cuda-api.h"
#include "util.h"

/* hd 0: hidden / heads; window > 0: a gemma3_text shape (every 6th layer global, the rest
 * sliding over `window` keys; local RoPE base 10000, global theta with linear scaling) */
typedef struct shape {
    const char *name;
    int hidden, layers, heads, kv, ffn, vocab, tied;
    double theta;
    float rope_factor;
    int hd, window;
} shape;
static const shape SHAPES[] = {
    {"prose-13m", 256, 6, 4, 2, 768, 32000, 1, 10000.0, 8.0f, 0, 0},
    {"llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, 1, 500000.0, 32.0f, 0, 0},
    {"llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 0, 500000.0, 8.0f, 0, 0},
    {"llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, 0, 500000.0, 8.0f, 0, 0},
    {"gemma-3-4b", 2560, 34, 8, 4, 10240, 262208, 1, 1000000.0, 8.0f, 256, 1024},   /* google/gemma-3-4b-it's text config */
};

/* BENCH_QUANT="BITS GROUP" (issue 11): every linear layer and the embedding as MLX affine codes (bf16 scales
 * and biases, as mlx_lm.convert writes them), random on the device like the dense weights */
static int q_bits, q_group;

static int write_model(const shape *s, const char *dir) {
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    int hd = s->hd ? s->hd : s->hidden / s->heads;
    if (s->window)
        fprintf(f, "{\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"hidden_size\":%d,"
                   "\"intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
                   "\"head_dim\":%d,\"vocab_size\":%d,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-6,\"rope_theta\":%.1f,"
                   "\"rope_local_base_freq\":10000.0,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":%.1f},"
                   "\"sliding_window\":%d,\"sliding_window_pattern\":6,\"query_pre_attn_scalar\":256,"
                   "\"hidden_activation\":\"gelu_pytorch_tanh\",\"tie_word_embeddings\":%s,\"bos_token_id\":2,"
                   "\"eos_token_id\":[1,106],\"pad_token_id\":0,\"torch_dtype\":\"bfloat16\"}\n",
                s->hidden, s->ffn, s->layers, s->heads, s->kv, hd, s->vocab, s->theta, (double)s->rope_factor, s->window,
                s->tied ? "true" : "false");
    else
    fprintf(f, "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":%d,\"intermediate_size\":%d,"
               "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":%d,\"vocab_size\":%d,"
               "\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,\"rope_theta\":%.1f,\"hidden_act\":\"silu\","
               "\"tie_word_embeddings\":%s,\"bos_token_id\":128000,\"eos_token_id\":128001,\"torch_dtype\":\"bfloat16\","
               "\"attention_bias\":false,\"mlp_bias\":false,\"rope_scaling\":{\"factor\":%.1f,\"high_freq_factor\":4.0,"
               "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}%s",
            s->hidden, s->ffn, s->layers, s->heads, s->kv, hd, s->vocab, s->theta, s->tied ? "true" : "false", (double)s->rope_factor,
            q_bits ? "" : "}\n");
    if (q_bits) fprintf(f, ",\"quantization\":{\"group_size\":%d,\"bits\":%d}}\n", q_group, q_bits);
    fclose(f);
    /* safetensors header */
    size_t cap = 1 << 20, n = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
#define T(name, r, c)                                                                                               \
    do {                                                                                                            \
        uint64_t bytes = (uint64_t)(r) * (c) * 2;                                                                   \
        if ((r) > 1) n += snprintf(h + n, cap - n, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%llu,%llu]}", \
                                   n > 1 ? "," : "", name, (int)(r), (int)(c), (unsigned long long)off, (unsigned long long)(off + bytes)); \
        else n += snprintf(h + n, cap - n, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%d],\"data_offsets\":[%llu,%llu]}", \
                           n > 1 ? "," : "", name, (int)(c), (unsigned long long)off, (unsigned long long)(off + bytes)); \
        off += bytes;                                                                                               \
    } while (0)
    n += snprintf(h + n, cap - n, "{");
    char nm[128];
    /* a matrix: dense bf16, or with BENCH_QUANT its codes (U32) and bf16 scales and biases */
#define M(name, r, c)                                                                                               \
    do {                                                                                                            \
        if (!q_bits) { T(name, r, c); break; }                                                                     \
        char qn_[160];                                                                                              \
        uint64_t cb_ = (uint64_t)(r) * (c) * q_bits / 8, sb_ = (uint64_t)(r) * ((c) / q_group) * 2;                 \
        snprintf(qn_, sizeof qn_, "%.*s", (int)(strlen(name) - 7), name);   /* without ".weight" */                  \
        n += snprintf(h + n, cap - n, "%s\"%s.weight\":{\"dtype\":\"U32\",\"shape\":[%d,%d],\"data_offsets\":[%llu,%llu]}", \
                      n > 1 ? "," : "", qn_, (int)(r), (int)((c) * q_bits / 32), (unsigned long long)off, (unsigned long long)(off + cb_)); \
        off += cb_;                                                                                                 \
        n += snprintf(h + n, cap - n, ",\"%s.scales\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%llu,%llu]}", qn_, \
                      (int)(r), (int)((c) / q_group), (unsigned long long)off, (unsigned long long)(off + sb_));     \
        off += sb_;                                                                                                 \
        n += snprintf(h + n, cap - n, ",\"%s.biases\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%llu,%llu]}", qn_, \
                      (int)(r), (int)((c) / q_group), (unsigned long long)off, (unsigned long long)(off + sb_));     \
        off += sb_;                                                                                                 \
    } while (0)
    M("model.embed_tokens.weight", s->vocab, s->hidden);
    for (int l = 0; l < s->layers; l++) {
        int q = s->heads * hd, kv = s->kv * hd;
#define L(suffix, r, c) snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix); if ((r) > 1) M(nm, r, c); else T(nm, r, c)
        L("input_layernorm.weight", 1, s->hidden);
        L("self_attn.q_proj.weight", q, s->hidden);
        L("self_attn.k_proj.weight", kv, s->hidden);
        L("self_attn.v_proj.weight", kv, s->hidden);
        L("self_attn.o_proj.weight", s->hidden, q);
        L("post_attention_layernorm.weight", 1, s->hidden);
        if (s->window) {
            L("pre_feedforward_layernorm.weight", 1, s->hidden);
            L("post_feedforward_layernorm.weight", 1, s->hidden);
            L("self_attn.q_norm.weight", 1, hd);
            L("self_attn.k_norm.weight", 1, hd);
        }
        L("mlp.gate_proj.weight", s->ffn, s->hidden);
        L("mlp.up_proj.weight", s->ffn, s->hidden);
        L("mlp.down_proj.weight", s->hidden, s->ffn);
#undef L
    }
    T("model.norm.weight", 1, s->hidden);
    if (!s->tied) M("lm_head.weight", s->vocab, s->hidden);
#undef M
#undef T
    n += snprintf(h + n, cap - n, "}");
    while (n % 8) h[n++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) { free(h); return 1; }
    uint64_t hl = n;
    int bad = write(fd, &hl, 8) != 8 || write(fd, h, n) != (ssize_t)n || ftruncate(fd, (off_t)(8 + n + off)) != 0;
    close(fd);
    free(h);
    return bad;
}

/* bytes a matrix occupies as stored (affine: codes, scales and biases) */
static size_t mat_bytes(const be_mat *w) {
    if (!be_traits(w->dt)->affine) return (size_t)w->rows * w->cols * be_dtype_size(w->dt);
    return (size_t)w->rows * w->cols * be_traits(w->dt)->bits / 8 + 2 * (size_t)w->rows * (w->cols / w->group) * be_dtype_size(w->sdt);
}

/* one matrix: dense weights mean + std * u; norms (one row) 1 */
static void fill(be_mat *w, uint64_t seed) {
    int norm = w->rows == 1;
    if (be_traits(w->dt)->affine) cuda_fill_random_affine(w, seed, 0.02f);
    else cuda_fill_random(w->dev, w->dt, (size_t)w->rows * w->cols, seed, norm ? 1.0f : 0.0f, norm ? 0.0f : 0.02f);
}

/* every prepared weight gets fresh random values on the device; the bytes of the layers */
static size_t randomize(cinfer_model *m) {
    uint64_t seed = 1;
    size_t bytes = 0;
    be_mat *all[3] = {&m->w.tok_embd, &m->w.out_norm, &m->w.lm_head};
    for (int i = 0; i < 3; i++) {
        if (i == 2 && m->w.lm_head.dev == m->w.tok_embd.dev) break;
        fill(all[i], seed++);
    }
    for (int l = 0; l < m->cfg.n_layer; l++) {
        be_mat *mats = (be_mat *)&m->w.layers[l];
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(be_mat); i++) {
            be_mat *w = &mats[i];
            if (!w->dev) continue;
            fill(w, seed++);
            bytes += mat_bytes(w);
        }
    }
    return bytes;
}

static double median(double *v, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (v[j] < v[i]) { double t = v[i]; v[i] = v[j]; v[j] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void ceilings(double *copy_gbs, double *gemm_tflops) {
    size_t bytes = (size_t)4 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms, best = 1e30f;
    *copy_gbs = *gemm_tflops = 0;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
        cuda_fill_random(a, BE_F32, bytes / 4, 7, 0, 1);
        for (int r = 0; r < 6; r++) {
            cudaEventRecord(e0, 0);
            cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            if (r && ms < best) best = ms;
        }
        *copy_gbs = 2.0 * bytes / (best * 1e-3) / 1e9;
    }
    cudaFree(a);
    cudaFree(b);
    int N = 8192;
    void *A = NULL, *B = NULL, *C = NULL;
    cublasHandle_t h;
    if (cublasCreate(&h) == CUBLAS_STATUS_SUCCESS && cudaMalloc(&A, (size_t)N * N * 2) == cudaSuccess &&
        cudaMalloc(&B, (size_t)N * N * 2) == cudaSuccess && cudaMalloc(&C, (size_t)N * N * 2) == cudaSuccess) {
        cuda_fill_random(A, BE_BF16, (size_t)N * N, 8, 0, 1);
        cuda_fill_random(B, BE_BF16, (size_t)N * N, 9, 0, 1);
        const float one = 1, zero = 0;
        double t[10];
        for (int r = 0; r < 13; r++) {
            cudaEventRecord(e0, 0);
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C, CUDA_R_16BF, N,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            if (r >= 3) t[r - 3] = ms;
        }
        *gemm_tflops = 2.0 * N * (double)N * N / (median(t, 10) * 1e-3) / 1e12;
        cublasDestroy(h);
    }
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

/* Where a decode step's time goes: each op of one layer run alone (eager,
 * one token, rotating over all layers so no matrix sits in L2), timed with
 * device synchronisation around n_layer calls; GB/s of weights for matmuls. */
static void breakdown(cinfer_model *m, cinfer_ctx *ctx, double step_s) {
    const be_ops *be = m->be;
    be_ctx *bc = ctx->bc;
    const model_config *c = &m->cfg;
    size_t big = (size_t)(c->ffn > c->n_vocab ? c->ffn : c->n_vocab);
    float *x = be->alloc(bc, sizeof(float) * big), *y = be->alloc(bc, sizeof(float) * big), *z = be->alloc(bc, sizeof(float) * big);
    if (!x || !y || !z) return;
    cuda_fill_random(x, BE_F32, big, 5, 0, 1);
    cuda_fill_random(z, BE_F32, big, 6, 0, 1);
    const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    size_t offs[] = {offsetof(layer_weights, wq), offsetof(layer_weights, wk), offsetof(layer_weights, wv), offsetof(layer_weights, wo),
                     offsetof(layer_weights, w_gate), offsetof(layer_weights, w_up), offsetof(layer_weights, w_down)};
    double per_layer = 0;
    printf("decode step breakdown (each op alone, eager, 1 token; a step is %.3f ms):\n", step_s * 1e3);
    for (int rep = 0; rep < 2; rep++)
        for (int o = 0; o < 7; o++) {
            cudaDeviceSynchronize();
            double a = cf_now();
            size_t bytes = 0;
            for (int l = 0; l < c->n_layer; l++) {
                const be_mat *w = (const be_mat *)((const char *)&m->w.layers[l] + offs[o]);
                be->matmul(bc, x, 1, w, NULL, y);
                bytes += mat_bytes(w);
            }
            cudaDeviceSynchronize();
            double t = (cf_now() - a) / c->n_layer;
            if (rep) {
                if (o == 3 || o == 6) per_layer += t;   /* o_proj, down_proj run alone in a step */
                printf("  %-10s %7.1f us  %6.0f GB/s\n", names[o], t * 1e6, bytes / (double)c->n_layer / t / 1e9);
            }
        }
    /* the fused launches a step really runs: q/k/v and gate/up as one pass each */
    for (int g = 0; g < 2; g++) {
        cudaDeviceSynchronize();
        double a = cf_now();
        size_t bytes = 0;
        for (int l = 0; l < c->n_layer; l++) {
            const layer_weights *lw = &m->w.layers[l];
            const be_mat *ws[3] = {g ? &lw->w_gate : &lw->wq, g ? &lw->w_up : &lw->wk, &lw->wv}, *bs[3] = {NULL, NULL, NULL};
            float *ys[3] = {y, z, y};
            be->norm_matmul(bc, x, 1, &lw->attn_norm, 0.0f, 1e-5f, y, g ? 2 : 3, ws, bs, ys, g);
            for (int i = 0; i < (g ? 2 : 3); i++) bytes += mat_bytes(ws[i]);
        }
        cudaDeviceSynchronize();
        double t = (cf_now() - a) / c->n_layer;
        per_layer += t;
        printf("  %-10s %7.1f us  %6.0f GB/s  (one launch)\n", g ? "norm+gate+up+glu" : "norm+q+k+v", t * 1e6, bytes / (double)c->n_layer / t / 1e9);
    }
    cudaDeviceSynchronize();
    double a = cf_now();
    for (int r = 0; r < 5; r++) be->matmul(bc, x, 1, &m->w.lm_head, NULL, y);
    cudaDeviceSynchronize();
    double th = (cf_now() - a) / 5;
    printf("  %-10s %7.1f us  %6.0f GB/s\n", "lm_head", th * 1e6, (double)mat_bytes(&m->w.lm_head) / th / 1e9);
    /* the attention ops of one decode step at position 200 of a sequence holding two f16 pages of 128 */
    {
        int hd = c->head_dim, cap = 256, p0 = 200, one = 1, zero = 0;
        int32_t pt_h[2] = {1, 0};   /* the pages out of order, as a pool hands them out */
        size_t kvn = (size_t)c->n_kv_head * cap * hd;
        float *q = be->alloc(bc, sizeof(float) * c->n_head * hd), *k = be->alloc(bc, sizeof(float) * c->n_kv_head * hd);
        float *o = be->alloc(bc, sizeof(float) * c->n_head * hd);
        void *kc = be->alloc(bc, kvn * 2), *vc = be->alloc(bc, kvn * 2);
        int32_t *pt = be->alloc(bc, sizeof pt_h);
        if (pt) be->from_host(bc, pt, pt_h, sizeof pt_h);
        be_attn at = {.B = 1, .L = 1, .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = hd, .pos0 = &p0, .len = &one,
                      .scale = 0.088f, .page = 128, .n_pt = 2, .pt = pt, .pt_host = pt_h, .seq = &zero, .run0 = &zero,
                      .max_span = p0 + 1, .pos = &p0, .inv_freq = m->w.inv_freq, .rot_dims = m->w.rot_dims, .neox = 1};
        if (q && k && o && kc && vc && pt) {
            for (int op = 0; op < 2; op++) {
                for (int rep = 0; rep < 2; rep++) {
                    cudaDeviceSynchronize();
                    double a0 = cf_now();
                    for (int l = 0; l < c->n_layer; l++) {
                        if (op) be->attention(bc, &at, q, kc, vc, BE_F16, o);
                        else be->rope_kv_write(bc, &at, q, k, k, kc, vc, BE_F16);
                    }
                    cudaDeviceSynchronize();
                    double t = (cf_now() - a0) / c->n_layer;
                    if (rep) printf("  %-10s %7.1f us  (x1 per layer)\n", op ? "attention" : "rope+kv", t * 1e6);
                }
            }
        }
        be->free(bc, q); be->free(bc, k); be->free(bc, o); be->free(bc, kc); be->free(bc, vc); be->free(bc, pt);
    }
    int32_t am = 0;
    be->argmax(bc, x, 1, c->n_vocab, &am);
    a = cf_now();
    for (int r = 0; r < 10; r++) be->argmax(bc, x, 1, c->n_vocab, &am);
    printf("  %-10s %7.1f us  (vocabulary row, with its copy back and sync)\n", "argmax", (cf_now() - a) / 10 * 1e6);
    printf("  these ops x %d layers + lm_head: %.3f ms; the rest of the step (rope + kv writes, attention, embed,\n"
           "  argmax, launch gaps): %.3f ms\n", c->n_layer, (per_layer * c->n_layer + th) * 1e3, (step_s - per_layer * c->n_layer - th) * 1e3);
    be->free(bc, x);
    be->free(bc, y);
    be->free(bc, z);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* BENCH_PROFILE (environment): a 128-token prompt, four greedy steps (the
 * graph captured and replayed), then one step between cudaProfilerStart and
 * Stop, for `ncu --profile-from-start off --graph-profiling node`; no
 * ceilings, prefill or timing. */
#ifdef CINFER_CUDA_TRACE
/* each traced file's timeline (cuda.cuh's CU_TRACE_HOST) */
int cu_trace_gemv(unsigned cap, unsigned long long *host, unsigned *n);
int cu_trace_attn(unsigned cap, unsigned long long *host, unsigned *n);
int cu_trace_rope(unsigned cap, unsigned long long *host, unsigned *n);
#endif
static int profile_step(cinfer_ctx *ctx, int32_t *ids, int NP, int V) {
    for (int i = 0; i < NP; i++) ids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)V);
    int32_t tok = 0;
    int bad = ctx_eval_greedy(ctx, ids, NP, &tok);
    for (int i = 0; i < 4 && !bad; i++) bad = ctx_eval_greedy(ctx, &tok, 1, &tok);
    cudaDeviceSynchronize();
#ifdef CINFER_CUDA_TRACE
    /* BENCH_TRACE=FILE (a build with -DCINFER_CUDA_TRACE, bench/gpu/trace.sh): the traced kernels' block timeline
     * of two steps, as text lines "globaltimer clock64 tag" (bench/gpu/trace-sum.py reads them) */
    const char *trf = getenv("BENCH_TRACE");
    int (*const tr[3])(unsigned, unsigned long long *, unsigned *) = {cu_trace_gemv, cu_trace_attn, cu_trace_rope};
    unsigned cap = 1u << 20;
    for (int t = 0; trf && t < 3; t++)
        if (tr[t](cap, NULL, NULL)) return fprintf(stderr, "trace: no buffer\n"), 1;
    for (int i = 0; trf && i < 2 && !bad; i++) bad = ctx_eval_greedy(ctx, &tok, 1, &tok);
    if (trf && !bad) {
        unsigned long long *ev = malloc((size_t)cap * 16);
        FILE *f = fopen(trf, "w");
        unsigned all = 0;
        for (int t = 0; t < 3; t++) {
            unsigned n = cap;
            if (!ev || !f || tr[t](0, ev, &n)) return fprintf(stderr, "trace: read back failed\n"), 1;
            for (unsigned i = 0; i < n; i++) fprintf(f, "%llu %llu %llu\n", ev[2 * i], ev[2 * i + 1] >> 32, ev[2 * i + 1] & 0xffffffffu);
            all += n;
        }
        fclose(f);
        free(ev);
        fprintf(stderr, "trace: %u events in %s\n", all, trf);
        return 0;
    }
#endif
    cudaProfilerStart();
    if (!bad) bad = ctx_eval_greedy(ctx, &tok, 1, &tok);
    cudaDeviceSynchronize();
    cudaProfilerStop();
    if (bad) fprintf(stderr, "profile step: %s\n", cinfer_ctx_error(ctx));
    return bad;
}

/* BENCH_AB=VAR: the decode step with the backend knob VAR (read when a
 * context is made) at 0 and at 1, alternated over 8 fresh contexts in this
 * process: 128-token prompt, G greedy steps, then the graph replayed alone.
 * Prints each round and the medians; the last tokens must agree. */
/* the backend knob var = val in the environment (knobs are read when a context is made); knob_set
 * returns var's previous value (malloc'd, NULL: unset) for knob_restore */
static char *knob_set(const char *var, const char *val) {
    const char *was = getenv(var);
    char *keep = was ? malloc(strlen(was) + 1) : NULL;
    if (keep) memcpy(keep, was, strlen(was) + 1);
    setenv(var, val, 1);
    return keep;
}
static void knob_restore(const char *var, char *keep) {
    if (keep) setenv(var, keep, 1);
    else unsetenv(var);
    free(keep);
}

/* a context made with the backend knob var = val */
static int knob_ctx(cinfer_model *m, const cinfer_ctx_opts *co, const char *var, const char *val, cinfer_ctx **out, char *err,
                    size_t en) {
    char *keep = knob_set(var, val);
    int bad = cinfer_ctx_new(m, co, out, err, en) != CINFER_OK;
    knob_restore(var, keep);
    return bad;
}

/* ctx_greedy_run's token callback: the last token, never a stop */
static int keep_tok(void *user, int32_t tok) {
    *(int32_t *)user = tok;
    return 0;
}

static int ab_compare(cinfer_model *m, const char *var, const int32_t *ids, int NP, int G) {
    double t[2][4], tg[2][4];
    int32_t last[2] = {-1, -1};
    const char *onv = getenv("BENCH_AB_ON");
    if (!onv || !*onv) onv = "1";
    for (int r = 0; r < 8; r++) {
        int on = r % 2;
        cinfer_ctx_opts co = {.kv_f16 = 1};
        cinfer_ctx *ctx = NULL;
        char err[512];
        if (knob_ctx(m, &co, var, on ? onv : "0", &ctx, err, sizeof err)) { fprintf(stderr, "ctx: %s\n", err); return 1; }
        int32_t tok = 0;
        int bad = 0;
        for (int w = 0; w < 2 && !bad; w++) {   /* the first pass captures the graph */
            cinfer_ctx_reset(ctx);
            bad = ctx_eval_greedy(ctx, ids, NP, &tok);
            double a = cf_now();
            if (!bad) bad = ctx_greedy_run(ctx, tok, G, keep_tok, &tok);
            t[on][r / 2] = (cf_now() - a) / G;
        }
        if (!bad) bad = cuda_graph_replay_time(ctx->bc, 20, &tg[on][r / 2]);
        if (bad) { fprintf(stderr, "decode (%s=%d): %s\n", var, on, cinfer_ctx_error(ctx)); cinfer_ctx_free(ctx); return 1; }
        last[on] = tok;
        printf("  %s=%s: %.4f ms/token, graph alone %.4f ms\n", var, on ? onv : "0", t[on][r / 2] * 1e3, tg[on][r / 2] * 1e3);
        cinfer_ctx_free(ctx);
    }
    for (int on = 0; on < 2; on++)
        printf("A/B %s=%s: median %.4f ms/token (%.1f tok/s), graph alone %.4f ms (%.1f tok/s)\n", var, on ? onv : "0", median(t[on], 4) * 1e3,
               1 / median(t[on], 4), median(tg[on], 4) * 1e3, 1 / median(tg[on], 4));
    printf("A/B last tokens: %d vs %d (%s)\n", (int)last[0], (int)last[1], last[0] == last[1] ? "same" : "DIFFERENT");
    return last[0] != last[1];
}

/* the next integer of a space-separated list; 0 at its end */
static int next_int(const char **p, int *v);

/* the forwards of cinfer_perplexity's plan with logits at every position, left on the device */
static int head_only(cinfer_ctx *ctx, const int32_t *rows, int n_rows, int L, int B0) {
    int W = 0, *n_in = calloc(2 * (size_t)B0, sizeof(int));
    char err[256];
    if (!n_in || score_chunk_width(ctx, B0, L - 1, 0, &W, err, sizeof err)) { free(n_in); return 1; }
    int bad = 0;
    for (int r0 = 0; r0 < n_rows && !bad; r0 += B0) {
        int B = n_rows - r0 < B0 ? n_rows - r0 : B0;
        for (int b = 0; b < B; b++) n_in[b] = L - 1;
        score_plan p;
        if (score_plan_init(&p, rows + (size_t)r0 * L, B, L, n_in, n_in + B0, W)) { bad = 1; break; }
        while (!bad && score_plan_next(&p)) {
            if (p.s == 0) cinfer_ctx_reset(ctx);
            bad = ctx_forward_score(ctx, p.ids_c, p.B, p.w, p.lens_c, p.pos0, p.pairs, p.n_out, NULL);
        }
        score_plan_free(&p);
    }
    free(n_in);
    return bad || cudaDeviceSynchronize() != cudaSuccess;
}

static int score_bench(cinfer_model *m, const char *shape_name, const char *list, double layer_params, double copy_gbs,
                       double gemm_tf) {
    const model_config *c = &m->cfg;
    int L, bad = 0;
    /* tokens scored per measurement: ~0.4-1 s of the forward on an H100 (prose-13m ~4M pos/s, 1B ~160k, 8B ~20k),
     * so that a host hiccup of a few ms moves no figure (BENCH_SCORE_TOKENS overrides) */
    int64_t budget = c->hidden <= 256 ? 2097152 : c->hidden <= 2048 ? 65536 : 16384;
    if (getenv("BENCH_SCORE_TOKENS")) budget = atoll(getenv("BENCH_SCORE_TOKENS"));
    printf("## scoring, %s: ceilings: device copy %.0f GB/s, cuBLAS bf16 GEMM %.0f TFLOP/s\n", shape_name, copy_gbs, gemm_tf);
    for (const char *q = list; !bad && next_int(&q, &L);) {
        int B = 8192 / L > 0 ? 8192 / L : 1, n_rows = (int)(budget / L);
        if (n_rows < B) n_rows = B;
        cinfer_ctx_opts co = {0};
        co.max_seqs = B > 64 ? B : 0;
        cinfer_ctx *ctx = NULL, *cb = NULL, *ctx2 = NULL, *cb2 = NULL;
        char err[512];
        if (cinfer_ctx_new(m, &co, &ctx, err, sizeof err) || cinfer_ctx_new(m, &co, &cb, err, sizeof err)) {
            fprintf(stderr, "ctx: %s\n", err);
            return 1;
        }
        /* BENCH_SCORE_AB=V: perplexity and kl also on contexts made under CINFER_CUDA_SCORE_HEAD=V
         * (0: the LM head never folded into the score op), interleaved;
         * BENCH_SCORE_AB=VAR=V: under another variable */
        const char *ab = getenv("BENCH_SCORE_AB"), *eq = ab ? strchr(ab, '=') : NULL;
        char abvar[64] = "CINFER_CUDA_SCORE_HEAD";
        if (eq && (size_t)(eq - ab) < sizeof abvar) { memcpy(abvar, ab, (size_t)(eq - ab)); abvar[eq - ab] = 0; ab = eq + 1; }
        if (ab && (knob_ctx(m, &co, abvar, ab, &ctx2, err, sizeof err) || knob_ctx(m, &co, abvar, ab, &cb2, err, sizeof err))) {
            fprintf(stderr, "ctx: %s\n", err);
            return 1;
        }
        int32_t *rows = malloc(sizeof(int32_t) * (size_t)n_rows * L);
        uint64_t x = 777 + L;
        for (size_t i = 0; i < (size_t)n_rows * L; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; rows[i] = (int32_t)((x >> 33) % c->n_vocab); }
        int64_t N = (int64_t)n_rows * (L - 1);
        cinfer_ppl_result r, r2;
        enum { REPS = 3 };
        double th[REPS], tp[REPS], tk[REPS], tp2[REPS], tk2[REPS];
        cinfer_kl_stats ks, ks2;
        for (int rep = 0; rep <= REPS && !bad; rep++) {   /* one warm-up, then the median of REPS of each, interleaved */
            double a = cf_now();
            bad |= head_only(ctx, rows, n_rows, L, B);
            double t_h = cf_now() - a;
            a = cf_now();
            bad |= cinfer_perplexity(ctx, rows, n_rows, L, B, NULL, NULL, NULL, &r, err, sizeof err) != CINFER_OK;
            double t_p = cf_now() - a;
            a = cf_now();
            bad |= cinfer_kl(ctx, cb, NULL, rows, n_rows, L, B, NULL, NULL, NULL, &ks, err, sizeof err) != CINFER_OK;
            double t_k = cf_now() - a, t_p2 = 0, t_k2 = 0;
            if (ctx2) {
                a = cf_now();
                bad |= cinfer_perplexity(ctx2, rows, n_rows, L, B, NULL, NULL, NULL, &r2, err, sizeof err) != CINFER_OK;
                t_p2 = cf_now() - a;
                a = cf_now();
                bad |= cinfer_kl(ctx2, cb2, NULL, rows, n_rows, L, B, NULL, NULL, NULL, &ks2, err, sizeof err) != CINFER_OK;
                t_k2 = cf_now() - a;
            }
            if (rep) { th[rep - 1] = t_h; tp[rep - 1] = t_p; tk[rep - 1] = t_k; tp2[rep - 1] = t_p2; tk2[rep - 1] = t_k2; }
        }
        if (bad) { fprintf(stderr, "score bench L=%d: %s / %s\n", L, err, cinfer_ctx_error(ctx)); break; }
        double h = N / median(th, REPS), pp = N / median(tp, REPS), kl = N / median(tk, REPS);
        /* the GEMM-bound rate: layers, LM head and causal attention FLOPs per position at the GEMM peak */
        double fl = 2.0 * layer_params + 2.0 * c->hidden * (double)c->n_vocab + 4.0 * c->n_layer * c->n_head * (double)c->head_dim * (L / 2.0);
        printf("score %s L=%d: compute ceiling (every FLOP at the GEMM peak) %.0f pos/s\n", shape_name, L, gemm_tf * 1e12 / fl);
        int W = 0;
        score_chunk_width(ctx, B, L - 1, 0, &W, err, sizeof err);
        printf("score %s L=%d: %d rows x %d positions, %d rows per forward, %d positions per chunk: forward+LM head (logits at every "
               "position, kept on the device) %.0f pos/s; perplexity %.0f pos/s (%.1f%% of it; ppl %.2f); kl (live base, two forwards) "
               "%.0f tok/s (%.1f%% of half that rate; mean KLD %.2g, same top %.4f)\n",
               shape_name, L, n_rows, L - 1, B, W, h, pp, 100.0 * pp / h, r.perplexity, kl, 200.0 * kl / h, ks.mean_kld, ks.same_top);
        printf("{\"engine\":\"cinfer\",\"bench\":\"score\",\"shape\":\"%s\",\"L\":%d,\"rows\":%d,\"batch\":%d,\"chunk\":%d,"
               "\"forward_logits_pos_s\":%.1f,\"perplexity_pos_s\":%.1f,\"kl_tok_s\":%.1f,\"ppl_ratio\":%.4f,\"kl_ratio\":%.4f}\n",
               shape_name, L, n_rows, B, W, h, pp, kl, pp / h, 2 * kl / h);
        if (ctx2) {
            double pp2 = N / median(tp2, REPS), kl2 = N / median(tk2, REPS);
            printf("score %s L=%d, %s=%s: perplexity %.0f pos/s (%.1f%% of the forward; ppl %.2f, default %.2f); kl %.0f "
                   "tok/s (%.1f%% of half; mean KLD %.2g, same top %.4f)\n",
                   shape_name, L, abvar, ab, pp2, 100.0 * pp2 / h, r2.perplexity, r.perplexity, kl2, 200.0 * kl2 / h, ks2.mean_kld, ks2.same_top);
            cinfer_ctx_free(cb2);
            cinfer_ctx_free(ctx2);
        }
        free(rows);
        cinfer_ctx_free(cb);
        cinfer_ctx_free(ctx);
    }
    return bad;
}

static int next_int(const char **p, int *v) {
    char *e;
    *v = (int)strtol(*p, &e, 10);
    if (e == *p) return 0;
    *p = e;
    return 1;
}

/* a KV cache format: dense pages of `dtype` (bits 0), or MLX affine codes of `bits` bits, group `group`, scales
 * and biases in `dtype`, quantized from the first write */
typedef struct kv_fmt { const char *dtype; int bits, group; } kv_fmt;

/* K + V bytes of one position over all layers in that format */
static double kv_fmt_bytes(const model_config *c, const kv_fmt *f) {
    double row = f->bits ? c->head_dim * f->bits / 8.0 + 2.0 * (c->head_dim / f->group) * 2 : c->head_dim * 2.0;
    return (double)c->n_layer * 2 * c->n_kv_head * row;
}


/* BENCH_AGG: for each N of the list, N sequences with prompts of 64..511 tokens (prefilled 8
 * rows per forward), then G decode steps of N rows: greedy on the device (ctx_decode_greedy),
 * then G/2 steps with every row's logits copied to the host (cinfer_forward_seqs), G/2 steps sampled
 * on the device as the server samples (cinfer_decode_sampled, temperature 0.8, top-p 0.95), then the
 * greedy step's graph replayed alone (the GPU's share of a step). A step
 * reads the weights once and each sequence's keys and values. */
static int agg_decode(cinfer_model *m, const char *list, int G, double copy_gbs, size_t step_bytes) {
    const model_config *c = &m->cfg;
    int V = c->n_vocab, bad = 0;
    const char *p = list;
    int N;
    while (!bad && next_int(&p, &N)) {
        if (N < 1 || N > 1024) continue;
        cinfer_ctx_opts co = {.kv_f16 = 1, .max_seqs = N};
        cinfer_ctx *ctx = NULL;
        char err[512];
        if (cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "agg ctx: %s\n", err); return 1; }
        int *lens = malloc(sizeof(int) * N), *seqs = malloc(sizeof(int) * N), LM = 512;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)N * LM), *tok = malloc(sizeof(int32_t) * N);
        float *lg = malloc(sizeof(float) * (size_t)N * V);
        long held = 0;
        for (int b = 0; b < N; b++) {
            seqs[b] = b;
            lens[b] = 64 + (b * 97 + 31) % 448;
            held += lens[b];
            for (int i = 0; i < LM; i++) ids[(size_t)b * LM + i] = (int32_t)(((unsigned)b * 7919u + (unsigned)i * 104729u + 13u) % (unsigned)V);
        }
        for (int b0 = 0; b0 < N && !bad; b0 += 8) {
            int nb = N - b0 < 8 ? N - b0 : 8;
            bad = cinfer_forward_seqs(ctx, ids + (size_t)b0 * LM, nb, LM, seqs + b0, lens + b0, NULL, NULL, 0, lg + (size_t)b0 * V);
        }
        for (int b = 0; b < N; b++) tok[b] = (int32_t)((b * 31 + 7) % V);
        for (int w = 0; w < 3 && !bad; w++) bad = ctx_decode_greedy(ctx, tok, N, seqs, tok);
        long caps0 = 0, reps0 = 0, caps = 0, reps = 0;
        cuda_graph_stats(ctx->bc, &caps0, &reps0);
        double a = cf_now();
        for (int i = 0; i < G && !bad; i++) bad = ctx_decode_greedy(ctx, tok, N, seqs, tok);
        double t = cf_now() - a;
        cuda_graph_stats(ctx->bc, &caps, &reps);
        int G2 = G / 2 > 0 ? G / 2 : 1;
        a = cf_now();
        for (int i = 0; i < G2 && !bad; i++) {
            bad = cinfer_forward_seqs(ctx, tok, N, 1, seqs, NULL, NULL, NULL, 0, lg);
            for (int b = 0; b < N && !bad; b++) tok[b] = (int32_t)argmax(lg + (size_t)b * V, V);
        }
        double tl = cf_now() - a, tg = 0;
        /* the server's step: every row sampled on the device (temperature 0.8, top-p 0.95, each row's own u) */
        cinfer_row_sampling *rs = calloc((size_t)N, sizeof *rs);
        cinfer_row_pick *pk = calloc((size_t)N, sizeof *pk);
        uint64_t ux = 99;
        a = cf_now();
        for (int i = 0; i < G2 && !bad; i++) {
            for (int b = 0; b < N; b++) {
                ux = ux * 6364136223846793005ull + 1442695040888963407ull;
                rs[b] = (cinfer_row_sampling){0.8f, 0, 0.95f, 0, (double)(ux >> 11) * 0x1p-53, NULL, 0, -1};
            }
            bad = cinfer_decode_sampled(ctx, tok, N, seqs, rs, pk);
            for (int b = 0; b < N && !bad; b++) tok[b] = pk[b].token;
        }
        double ts = cf_now() - a;
        free(rs);
        free(pk);
        for (int i = 0; i < 2 && !bad; i++) bad = ctx_decode_greedy(ctx, tok, N, seqs, tok);   /* the greedy step's graph again */
        if (!bad && cuda_graph_replay_time(ctx->bc, 10, &tg)) tg = 0;
        if (!bad && getenv("BENCH_AGG_PROFILE")) {   /* one step for `ncu --profile-from-start off --graph-profiling node` */
            cudaDeviceSynchronize();
            cudaProfilerStart();
            bad = ctx_decode_greedy(ctx, tok, N, seqs, tok);
            cudaDeviceSynchronize();
            cudaProfilerStop();
        }
        if (bad) { fprintf(stderr, "agg decode N=%d: %s\n", N, cinfer_ctx_error(ctx)); cinfer_ctx_free(ctx); return 1; }
        /* keys and values read per step: every sequence's positions at the middle of the timed steps */
        kv_fmt f16 = {"f16", 0, 0};
        double kv = kv_fmt_bytes(c, &f16) * ((double)held + N * (3.0 + G / 2.0));
        double step = t / G, gbs = (step_bytes + kv) / step / 1e9;
        printf("aggregate decode N=%d (prompts 64..511, %ld tokens held): %.3f ms/step, %.0f tok/s; reads %.2f GB weights + %.2f GB KV "
               "per step = %.0f GB/s (%.0f%% of copy bandwidth); graph captured %ld, replayed %ld; the step's graph alone %.3f ms; "
               "with logits to the host: %.3f ms/step, %.0f tok/s; sampled on the device (T 0.8, top-p 0.95): %.3f ms/step, %.0f tok/s\n",
               N, held, step * 1e3, N / step, step_bytes / 1e9, kv / 1e9, gbs, 100.0 * gbs / copy_gbs, caps - caps0, reps - reps0,
               tg * 1e3, tl / G2 * 1e3, N * G2 / tl, ts / G2 * 1e3, N * G2 / ts);
        printf("{\"engine\":\"cinfer\",\"mode\":\"aggregate_decode\",\"seqs\":%d,\"tok_s\":%.1f,\"step_ms\":%.4f,\"graph_ms\":%.4f,"
               "\"weight_bytes\":%zu,\"kv_bytes\":%.0f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"logits_tok_s\":%.1f,\"sampled_tok_s\":%.1f}\n", N, N / step,
               step * 1e3, tg * 1e3, step_bytes, kv, gbs, copy_gbs, N * G2 / tl, N * G2 / ts);
        free(lens); free(seqs); free(ids); free(tok); free(lg);
        cinfer_ctx_free(ctx);
    }
    return bad;
}

/* one sequence prefilled with P tokens in chunks of 4096 (no logits), then G greedy decode steps timed as a
 * whole and the step's graph replayed alone; a step reads the weights and every held key and value once.
 * tok_s: the decode rate. */
static int one_long(cinfer_model *m, int P, const kv_fmt *f, int G, double copy_gbs, size_t step_bytes, double *tok_s) {
    const model_config *c = &m->cfg;
    int V = c->n_vocab, bad = 0, CH = 4096;
    cinfer_ctx_opts co = {.kv_dtype = f->dtype, .max_seqs = 1};
    if (f->bits) {
        co.kv_bits = f->bits;
        co.kv_group_size = f->group;
        co.quantized_kv_start = -1;
    }
    cinfer_ctx *ctx = NULL;
    char err[512], name[32];
    if (f->bits) snprintf(name, sizeof name, "KV%d g%d %s", f->bits, f->group, f->dtype);
    else snprintf(name, sizeof name, "%s KV", f->dtype);
    if (cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "long ctx (%s): %s\n", name, err); return 1; }
    int32_t *ids = malloc(sizeof(int32_t) * CH);
    int seq = 0, none[2] = {0, 0};
    double a = cf_now();
    for (int p0 = 0; p0 < P && !bad; p0 += CH) {
        int n = P - p0 < CH ? P - p0 : CH;
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(((unsigned)(p0 + i) * 104729u + 13u) % (unsigned)V);
        bad = cinfer_forward_seqs(ctx, ids, 1, n, &seq, NULL, NULL, none, 0, NULL);
    }
    bad = bad || cudaDeviceSynchronize() != cudaSuccess;
    double tp = cf_now() - a;
    int32_t tok = 17;
    for (int w = 0; w < 3 && !bad; w++) bad = ctx_eval_greedy(ctx, &tok, 1, &tok);
    a = cf_now();
    for (int i = 0; i < G && !bad; i++) bad = ctx_eval_greedy(ctx, &tok, 1, &tok);
    double t = cf_now() - a, tg = 0;
    if (!bad && cuda_graph_replay_time(ctx->bc, 10, &tg)) tg = 0;
    free(ids);
    if (bad) { fprintf(stderr, "long decode P=%d (%s): %s\n", P, name, cinfer_ctx_error(ctx)); cinfer_ctx_free(ctx); return 1; }
    long caps = 0, reps = 0;
    cuda_graph_stats(ctx->bc, &caps, &reps);
    /* KV the cache holds (a sliding layer only its window's pages) against a cache keeping every layer whole
     * (every position of every layer); a step reads about what is held */
    cinfer_kv_info ki;
    cinfer_ctx_kv_info(ctx, &ki);
    double per = kv_fmt_bytes(c, f), whole = per * (P + 3 + G), kv = per * (P + 3 + G / 2.0);
    if ((double)ki.bytes_held < kv) kv = (double)ki.bytes_held;
    printf("KV at %d tokens of context (%s): %.3f GB held (pool %.3f GB) vs %.3f GB for a cache keeping every layer whole (%.1f%%)\n",
           P + 3 + G, name, ki.bytes_held / 1e9, ki.bytes_pool / 1e9, whole / 1e9, 100.0 * ki.bytes_held / whole);
    double step = t / G, gbs = (step_bytes + kv) / step / 1e9, ggbs = tg > 0 ? (step_bytes + kv) / tg / 1e9 : 0;
    printf("long-context decode, %s, after %d tokens (prefilled in %.1f s, %.0f tok/s): %.3f ms/token, %.1f tok/s; reads %.2f GB weights + "
           "%.2f GB KV per step = %.0f GB/s (%.0f%% of copy bandwidth); the step's graph alone %.3f ms (%.0f GB/s, %.0f%%); graph captured "
           "%ld, replayed %ld\n", name, P, tp, P / tp, step * 1e3, 1 / step, step_bytes / 1e9, kv / 1e9, gbs, 100.0 * gbs / copy_gbs, tg * 1e3,
           ggbs, 100.0 * ggbs / copy_gbs, caps, reps);
    printf("{\"engine\":\"cinfer\",\"mode\":\"long_decode\",\"kv\":\"%s\",\"kv_bits\":%d,\"context\":%d,\"tok_s\":%.2f,\"step_ms\":%.4f,"
           "\"graph_ms\":%.4f,\"weight_bytes\":%zu,\"kv_bytes\":%.0f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"pct_copy\":%.1f,\"prefill_s\":%.2f}\n",
           name, f->bits, P, 1 / step, step * 1e3, tg * 1e3, step_bytes, kv, gbs, copy_gbs, 100.0 * gbs / copy_gbs, tp);
    fflush(stdout);
    *tok_s = 1 / step;
    cinfer_ctx_free(ctx);
    return 0;
}

/* BENCH_LONG: for each context length P of the list, one_long with f16 pages. */
static int long_decode(cinfer_model *m, const char *list, int G, double copy_gbs, size_t step_bytes) {
    const char *p = list;
    int P, bad = 0;
    kv_fmt f16 = {"f16", 0, 0};
    double r;
    while (!bad && next_int(&p, &P))
        if (P > 0) bad = one_long(m, P, &f16, G, copy_gbs, step_bytes, &r);
    return bad;
}

/* one_long, or with BENCH_KVQ_AB=VAR set: with VAR=0, then VAR=1 (a knob of the decode path), printing
 * the ratio; *tok_s the =1 rate */
static int one_long_ab(cinfer_model *m, int P, const kv_fmt *f, int G, double copy_gbs, size_t step_bytes, double *tok_s) {
    const char *abv = getenv("BENCH_KVQ_AB");
    if (!abv || !*abv) return one_long(m, P, f, G, copy_gbs, step_bytes, tok_s);
    double off = 0;
    char *keep = knob_set(abv, "0");
    int bad = one_long(m, P, f, G, copy_gbs, step_bytes, &off);
    setenv(abv, "1", 1);
    bad = bad || one_long(m, P, f, G, copy_gbs, step_bytes, tok_s);
    knob_restore(abv, keep);
    if (!bad) printf("A/B %s at %d tokens (%s, %d bits): =1 decodes at %.3fx the rate of =0\n", abv, P, f->dtype, f->bits, *tok_s / off);
    return bad;
}

/* BENCH_KVQ (issue 15): for each context length P of the list, one_long with bf16 pages, then KV8 and KV4
 * (group 64, bf16 scales as MLX keeps them, quantized from the first write); BENCH_KVQ_BITS overrides the
 * quantized formats ("8 4"; "none": the bf16 row alone), BENCH_KVQ_BF16=0 skips the bf16 row, BENCH_KVQ_AB=VAR measures every
 * row with VAR=0 then =1. Prints each quantized rate against the bf16 one. */
static int kvq_decode(cinfer_model *m, const char *list, int G, double copy_gbs, size_t step_bytes) {
    const char *p = list, *bl = getenv("BENCH_KVQ_BITS");
    int P, bad = 0;
    while (!bad && next_int(&p, &P)) {
        if (P < 1) continue;
        kv_fmt f = {"bf16", 0, 0};
        double base = 0, r = 0;
        const char *b16 = getenv("BENCH_KVQ_BF16");   /* "0": skip the bf16 row (a rerun of the quantized ones) */
        if (!b16 || strcmp(b16, "0")) bad = one_long_ab(m, P, &f, G, copy_gbs, step_bytes, &base);
        const char *q = bl && *bl ? bl : "8 4";
        int bits;
        while (!bad && next_int(&q, &bits)) {
            f.bits = bits;
            f.group = 64;
            bad = one_long_ab(m, P, &f, G, copy_gbs, step_bytes, &r);
            if (!bad && base > 0) {
                printf("KV%d at %d tokens: %.2fx the bf16-KV decode rate\n", bits, P, r / base);
                printf("{\"engine\":\"cinfer\",\"mode\":\"kvq_ratio\",\"kv_bits\":%d,\"context\":%d,\"ratio\":%.4f}\n", bits, P, r / base);
            }
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: bench-cuda SHAPE DIR [prefill_tokens] [gen_tokens]\n"); return 2; }
    const shape *s = NULL;
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) if (!strcmp(SHAPES[i].name, argv[1])) s = &SHAPES[i];
    if (!s) { fprintf(stderr, "unknown shape %s\n", argv[1]); return 2; }
    int P = argc > 3 ? atoi(argv[3]) : 2048, G = argc > 4 ? atoi(argv[4]) : 128, NP = 128;
    if (P < 1 || G < 1) { fprintf(stderr, "prefill_tokens and gen_tokens must be positive (got %d, %d)\n", P, G); return 2; }
    double copy_gbs = 0, gemm_tf = 0;
    const char *qv = getenv("BENCH_QUANT");
    if (qv && *qv && (sscanf(qv, "%d %d", &q_bits, &q_group) != 2 || q_bits < 2 || q_bits > 8 || q_group < 32)) {
        fprintf(stderr, "BENCH_QUANT=\"BITS GROUP\" (e.g. \"4 64\"), not '%s'\n", qv);
        return 2;
    }
    if (!getenv("BENCH_PROFILE")) ceilings(&copy_gbs, &gemm_tf);
    double t0 = cf_now();
    if (write_model(s, argv[2])) { fprintf(stderr, "cannot write %s\n", argv[2]); return 1; }
    cinfer_load_opts lo = {"cuda", 0, 1};
    cinfer_model *m = NULL;
    char err[512];
    if (cinfer_model_load(argv[2], &lo, &m, err, sizeof err)) { fprintf(stderr, "load: %s\n", err); return 1; }
    size_t layer_bytes = randomize(m);
    double t_load = cf_now() - t0;
    const model_config *c = &m->cfg;
    size_t head_bytes = mat_bytes(&m->w.lm_head) + (size_t)c->hidden * 2;
    size_t step_bytes = layer_bytes + head_bytes;   /* weights read per decoded token (the embedding row aside) */
    double layer_params = 0;   /* parameters of the layers' matrices and norms */
    for (int l = 0; l < c->n_layer; l++)
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(be_mat); i++) {
            const be_mat *w = (const be_mat *)&m->w.layers[l] + i;
            if (w->dev) layer_params += (double)w->rows * w->cols;
        }
    cinfer_ctx_opts co = {.kv_f16 = 1};   /* f16 KV cache */
    cinfer_ctx *ctx = NULL;
    if (cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "ctx: %s\n", err); return 1; }
    int V = c->n_vocab;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(P > NP ? P : NP));   /* the prefill's P tokens, the decode benches' NP-token prompt */
    if (getenv("BENCH_PROFILE")) return profile_step(ctx, ids, NP, V);
    const char *agg = getenv("BENCH_AGG"), *lng = getenv("BENCH_LONG");
    const char *sc = getenv("BENCH_SCORE"), *kvq = getenv("BENCH_KVQ");
    if (getenv("BENCH_ONLY")) {
        int bad = (agg && agg_decode(m, agg, G, copy_gbs, step_bytes)) | (lng && long_decode(m, lng, G, copy_gbs, step_bytes));
        bad |= kvq && kvq_decode(m, kvq, G, copy_gbs, step_bytes);
        bad |= sc && score_bench(m, s->name, sc, layer_params, copy_gbs, gemm_tf);
        cinfer_ctx_free(ctx);
        cinfer_model_free(m);
        free(ids);
        return bad;
    }
    float *lg = malloc(sizeof(float) * V);
    uint64_t x = 12345;
    for (int i = 0; i < (P > NP ? P : NP); i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((x >> 33) % V); }
    /* prefill: one warm-up, then the median of 5 */
    double tp[5];
    int bad = 0;
    for (int r = 0; r < 6 && !bad; r++) {
        cinfer_ctx_reset(ctx);
        double a = cf_now();
        bad = cinfer_eval(ctx, ids, P, 0, lg);
        if (r) tp[r - 1] = cf_now() - a;
    }
    if (bad) { fprintf(stderr, "prefill: %s\n", cinfer_ctx_error(ctx)); return 1; }
    double t_pre = median(tp, 5);
    /* decode in a fresh context: its cache holds what a 128-token prompt and 128 new tokens
     * need (256 slots), not the 2048-token prefill's capacity */
    cinfer_ctx_free(ctx);
    ctx = NULL;
    if (cinfer_ctx_new(m, &co, &ctx, err, sizeof err)) { fprintf(stderr, "ctx: %s\n", err); return 1; }
    /* FLOPs: projections and MLP 2*P*params, lm_head for one row, attention QK^T and PV over the causal half */
    /* (a sliding layer's query sees at most its window's keys) */
    double keys = 0;
    for (int l = 0; l < c->n_layer; l++) {
        double w = arch_layer_window(m->arch, c, l);
        keys += w > 0 && w < P ? w * (w + 1) / 2 + (P - w) * w : (double)P * (P + 1) / 2;
    }
    double attn = 4.0 * c->n_head * (double)c->head_dim * keys;
    double flops = 2.0 * P * layer_params + 2.0 * V * c->hidden + attn;
    /* decode: 128-token prompt, then G greedy steps, timed as a whole; median of 3. First the
     * library's greedy path (ctx_greedy_run: argmax on the device, steps chained, as cinfer generate --temp 0 runs), then the
     * logits path (every step copies the vocabulary row back; argmax on the host). */
    double td[3], tl[3], t_graph = 0;
    long caps = 0, reps = 0;
    int32_t last = 0, last_l = 0;
    for (int pass = 0; pass < 2 && !bad; pass++)
        for (int r = 0; r < 4 && !bad; r++) {
            cinfer_ctx_reset(ctx);
            int32_t tok = 0;
            if (pass == 0) bad = ctx_eval_greedy(ctx, ids, NP, &tok);
            else { bad = cinfer_eval(ctx, ids, NP, 0, lg); tok = argmax(lg, V); }
            double a = cf_now();
            if (pass == 0 && !bad) bad = ctx_greedy_run(ctx, tok, G, keep_tok, &tok);
            for (int i = 0; pass == 1 && i < G && !bad; i++) {
                bad = cinfer_eval(ctx, &tok, 1, 0, lg);
                tok = argmax(lg, V);
            }
            double dt = cf_now() - a;
            int k = r - 1;
            if (k >= 0 && k < 3) { if (pass) tl[k] = dt; else td[k] = dt; }
            if (pass) last_l = tok; else last = tok;
            if (pass == 0 && r == 3) cuda_graph_replay_time(ctx->bc, 20, &t_graph);
        }
    if (bad) { fprintf(stderr, "decode: %s\n", cinfer_ctx_error(ctx)); return 1; }
    cuda_graph_stats(ctx->bc, &caps, &reps);
    double t_dec = median(td, 3), t_log = median(tl, 3);
    double dec_tps = G / t_dec, gbs = step_bytes * dec_tps / 1e9;
    char wdesc[64] = "bf16";
    if (q_bits) snprintf(wdesc, sizeof wdesc, "MLX affine %d-bit g%d, bf16 scales", q_bits, q_group);
    printf("## %s (%s, %.2f GB of weights read per token; load + random fill %.1f s)\n", s->name, wdesc, step_bytes / 1e9, t_load);
    printf("ceilings: device-to-device copy %.0f GB/s (read+write), cuBLAS bf16 GEMM 8192^3 %.0f TFLOP/s\n", copy_gbs, gemm_tf);
    printf("prefill %d tokens: %.1f ms, %.0f tok/s, %.0f TFLOP/s (%.0f%% of the GEMM rate)\n", P, t_pre * 1e3, P / t_pre,
           flops / t_pre / 1e12, 100.0 * flops / t_pre / 1e12 / gemm_tf);
    printf("decode %d tokens after %d: %.2f ms/token, %.1f tok/s, %.0f GB/s of weights (%.0f%% of copy bandwidth); "
           "graph captured %ld, replayed %ld; last token %d\n",
           G, NP, t_dec / G * 1e3, dec_tps, gbs, 100.0 * gbs / copy_gbs, caps, reps, (int)last);
    printf("decode step graph replayed alone (no host work between steps): %.3f ms/token (%.1f tok/s, %.0f GB/s); "
           "host-side time per step %.3f ms\n", t_graph * 1e3, 1 / t_graph, step_bytes / t_graph / 1e9, (t_dec / G - t_graph) * 1e3);
    printf("decode with logits copied to the host each step: %.2f ms/token, %.1f tok/s (last token %d: %s)\n", t_log / G * 1e3,
           G / t_log, (int)last_l, last_l == last ? "same" : "DIFFERENT");
    breakdown(m, ctx, t_dec / G);
    const char *ab = getenv("BENCH_AB");
    if (ab && *ab && ab_compare(m, ab, ids, NP, G)) bad = 1;
    if (agg && agg_decode(m, agg, G, copy_gbs, step_bytes)) bad = 1;
    if (lng && long_decode(m, lng, G, copy_gbs, step_bytes)) bad = 1;
    if (kvq && kvq_decode(m, kvq, G, copy_gbs, step_bytes)) bad = 1;
    printf("{\"engine\":\"cinfer\",\"shape\":\"%s\",\"bits\":%d,\"group\":%d,\"prefill_tokens\":%d,\"prefill_tok_s\":%.1f,\"prefill_tflops\":%.1f,"
           "\"decode_tok_s\":%.2f,\"decode_gbs\":%.1f,\"step_bytes\":%zu,\"copy_gbs\":%.1f,\"gemm_tflops\":%.1f,\"flops_prefill\":%.4g}\n",
           s->name, q_bits, q_group, P, P / t_pre, flops / t_pre / 1e12, dec_tps, gbs, step_bytes, copy_gbs, gemm_tf, flops);
    free(ids);
    free(lg);
    cinfer_ctx_free(ctx);
    cinfer_model_free(m);
    return bad;
}
