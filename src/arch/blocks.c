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

cinfer_status block_forward(const be_ops *be, be_ctx *bc, const model_config *c, const model_weights *w,
                            kv_cache **caches, const block_batch *bb, float *x, float *scratch) {
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
        .pos0 = bb->pos0, .len = bb->len, .window = c->sliding_window, .scale = 1.0f / sqrtf((float)hd),
        .pos = bb->pos, .inv_freq = w->inv_freq, .rot_dims = w->rot_dims, .neox = 1,   /* the cache ropes q, k */
    };
    /* backends may fuse (optional ops): q/k/v and gate/up as one pass over x,
     * each residual add with the norm that follows it */
    for (int l = 0; l < c->n_layer; l++) {
        const layer_weights *lw = &w->layers[l];
        if (l == 0 || !be->add_rmsnorm) be->rmsnorm(bc, x, T, H, &lw->attn_norm, 0.0f, c->eps, xn);
        if (be->matmul_multi) {
            const be_mat *ws[3] = {&lw->wq, &lw->wk, &lw->wv}, *bs[3] = {opt(&lw->bq), opt(&lw->bk), opt(&lw->bv)};
            float *ys[3] = {q, k, v};
            be->matmul_multi(bc, xn, T, 3, ws, bs, ys);
        } else {
            be->matmul(bc, xn, T, &lw->wq, opt(&lw->bq), q);
            be->matmul(bc, xn, T, &lw->wk, opt(&lw->bk), k);
            be->matmul(bc, xn, T, &lw->wv, opt(&lw->bv), v);
        }
        if (c->qk_norm) {
            be->rmsnorm(bc, q, T * c->n_head, hd, &lw->q_norm, 0.0f, c->eps, q);
            be->rmsnorm(bc, k, T * c->n_kv_head, hd, &lw->k_norm, 0.0f, c->eps, k);
        }
        cinfer_status st = caches[l]->vt->update_attend(caches[l], &a, k, v, q, att);
        if (st) return st;
        be->matmul(bc, att, T, &lw->wo, opt(&lw->bo), tmp);
        if (be->add_rmsnorm) {
            be->add_rmsnorm(bc, x, tmp, T, H, &lw->ffn_norm, 0.0f, c->eps, xn);
        } else {
            be->add(bc, x, tmp, (size_t)T * H);
            be->rmsnorm(bc, x, T, H, &lw->ffn_norm, 0.0f, c->eps, xn);
        }
        if (be->matmul_glu) {
            be->matmul_glu(bc, xn, T, &lw->w_gate, opt(&lw->b_gate), &lw->w_up, opt(&lw->b_up), gate, up);
        } else {
            if (be->matmul_multi) {
                const be_mat *ws[2] = {&lw->w_gate, &lw->w_up}, *bs[2] = {opt(&lw->b_gate), opt(&lw->b_up)};
                float *ys[2] = {gate, up};
                be->matmul_multi(bc, xn, T, 2, ws, bs, ys);
            } else {
                be->matmul(bc, xn, T, &lw->w_gate, opt(&lw->b_gate), gate);
                be->matmul(bc, xn, T, &lw->w_up, opt(&lw->b_up), up);
            }
            be->swiglu(bc, gate, up, gate, (size_t)T * c->ffn);
        }
        be->matmul(bc, gate, T, &lw->w_down, opt(&lw->b_down), tmp);
        if (be->add_rmsnorm && l + 1 < c->n_layer)   /* with the next layer's input norm */
            be->add_rmsnorm(bc, x, tmp, T, H, &w->layers[l + 1].attn_norm, 0.0f, c->eps, xn);
        else
            be->add(bc, x, tmp, (size_t)T * H);
    }
    return CINFER_OK;
}
