/*
 * blocks.c — the shared pre-norm decoder block of the llama family
 * (llama, mistral, qwen2, qwen3), run layer by layer over a padded batch:
 *
 *   h = x + o_proj(attn(rope(norm_q(q_proj(rms(x)))), rope(norm_k(k_proj(..))), v_proj(..)))
 *   x = h + down(silu(gate(rms(h))) * up(rms(h)))
 *
 * Options come from model_config (biases, qk-norm, sliding window); the
 * attention, its mask and the RoPE of q and k (be_attn.pos/inv_freq) belong
 * to the layer's cache. All buffers are backend
 * memory; the scratch is sized by block_scratch_floats for n_tokens = B*L.
 * Reference: transformers models/llama/modeling_llama.py, qwen3/modeling_qwen3.py.
 */
#include <math.h>
#include "arch/arch.h"

size_t block_scratch_floats(const model_config *c, int n) {
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    size_t per = (size_t)c->hidden * 2 + qd * 2 + kvd * 2 + (size_t)c->ffn * 2;
    return per * (size_t)n;
}

static const be_mat *opt(const be_mat *m) { return m->data ? m : NULL; }

/* y[i] = rmsnorm(x) . w[i]^T (+ b[i]); glu (count 2): y[0] = silu(..) * (..), y[1] scratch.
 * One optional op where the backend fuses it, else norm, matmul(s), swiglu. */
static void norm_matmul(const be_ops *be, be_ctx *bc, const float *x, int T, const be_mat *norm, float eps, float *xn, int count,
                        const be_mat *const *w, const be_mat *const *b, float *const *y, int glu) {
    if (be->norm_matmul) {
        be->norm_matmul(bc, x, T, norm, 0.0f, eps, xn, count, w, b, y, glu);
        return;
    }
    be->rmsnorm(bc, x, T, (int)w[0]->cols, norm, 0.0f, eps, xn);
    if (be->matmul_multi) be->matmul_multi(bc, xn, T, count, w, b, y);
    else for (int i = 0; i < count; i++) be->matmul(bc, xn, T, w[i], b[i], y[i]);
    if (glu) be->swiglu(bc, y[0], y[1], y[0], (size_t)T * w[0]->rows);
}

/* x += t . w^T (+ b): the residual add, in the matmul where the backend fuses it */
static void matmul_add(const be_ops *be, be_ctx *bc, const float *t, int T, const be_mat *w, const be_mat *b, float *x, float *tmp) {
    if (be->matmul_add) {
        be->matmul_add(bc, t, T, w, b, x, tmp);
        return;
    }
    be->matmul(bc, t, T, w, b, tmp);
    be->add(bc, x, tmp, (size_t)T * w->rows);
}

cinfer_status block_forward(const be_ops *be, be_ctx *bc, const model_config *c, const model_weights *w,
                            kv_group *const *groups, kv_cache *const *caches, const block_batch *bb, float *x,
                            float *scratch) {
    int T = bb->B * bb->L, hd = c->head_dim, H = c->hidden;
    size_t qd = (size_t)c->n_head * hd, kvd = (size_t)c->n_kv_head * hd;
    float *xn = scratch;                       /* [T][H] */
    float *tmp = xn + (size_t)T * H;           /* [T][H] */
    float *q = tmp + (size_t)T * H;            /* [T][qd] */
    float *att = q + (size_t)T * qd;           /* [T][qd] */
    float *k = att + (size_t)T * qd;           /* [T][kvd] */
    float *v = k + (size_t)T * kvd;            /* [T][kvd] */
    float *gate = v + (size_t)T * kvd;         /* [T][ffn] */
    float *up = gate + (size_t)T * c->ffn;     /* [T][ffn] */
    be_attn a = {
        .B = bb->B, .L = bb->L, .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = hd,
        .pos0 = bb->pos0, .len = bb->len, .scale = 1.0f / sqrtf((float)hd),
        .pos = bb->pos, .inv_freq = w->inv_freq, .rot_dims = w->rot_dims, .neox = 1,   /* the cache ropes q, k */
    };
    for (int l = 0; l < c->n_layer; l++) {
        const layer_weights *lw = &w->layers[l];
        const be_mat *wqkv[3] = {&lw->wq, &lw->wk, &lw->wv}, *bqkv[3] = {opt(&lw->bq), opt(&lw->bk), opt(&lw->bv)};
        float *yqkv[3] = {q, k, v};
        norm_matmul(be, bc, x, T, &lw->attn_norm, c->eps, xn, 3, wqkv, bqkv, yqkv, 0);
        if (c->qk_norm) {
            be->rmsnorm(bc, q, T * c->n_head, hd, &lw->q_norm, 0.0f, c->eps, q);
            be->rmsnorm(bc, k, T * c->n_kv_head, hd, &lw->k_norm, 0.0f, c->eps, k);
        }
        kv_group_describe(groups[l], &a);
        caches[l]->vt->update_attend(caches[l], &a, k, v, q, att);
        matmul_add(be, bc, att, T, &lw->wo, opt(&lw->bo), x, tmp);
        const be_mat *wgu[2] = {&lw->w_gate, &lw->w_up}, *bgu[2] = {opt(&lw->b_gate), opt(&lw->b_up)};
        float *ygu[2] = {gate, up};
        norm_matmul(be, bc, x, T, &lw->ffn_norm, c->eps, xn, 2, wgu, bgu, ygu, 1);
        matmul_add(be, bc, gate, T, &lw->w_down, opt(&lw->b_down), x, tmp);
    }
    return CINFER_OK;
}
