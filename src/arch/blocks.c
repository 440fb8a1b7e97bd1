/*
 * blocks.c — the decoder blocks' shared steps, run layer by layer over a padded batch.
 * The llama family's pre-norm block (llama, mistral, qwen2, qwen3):
 *
 *   h = x + o_proj(attn(rope(norm_q(q_proj(rms(x)))), rope(norm_k(k_proj(..))), v_proj(..)))
 *   x = h + down(act(gate(rms(h))) * up(rms(h)))
 *
 * Gemma 2/3's "sandwich" block adds a norm on each branch's output, before
 * its residual add, and all its norms scale by (1 + w) (cfg->norm_add):
 *
 *   h = x + rms_post_attn(o_proj(attn(...)))      attention scale query_pre_attn_scalar^-1/2,
 *   x = h + rms_post_ffn(down(gelu_tanh(gate(rms_pre_ffn(h))) * up(..)))   scores softcapped
 *
 * This file holds the llama block and the steps both are built from
 * (blk_* in arch.h); gemma2.c composes the sandwich block from them.
 * Options come from model_config (biases, qk-norm, sliding window); the
 * attention, its mask and the RoPE of q and k (be_attn.pos/inv_freq) belong
 * to the layer's cache. All buffers are backend
 * memory; the scratch is sized by block_scratch_floats for n_tokens = B*L.
 * Reference: transformers models/llama/modeling_llama.py, qwen3/modeling_qwen3.py,
 * gemma2/modeling_gemma2.py, gemma3/modeling_gemma3.py.
 */
#include <math.h>
#include "arch/arch.h"

_Static_assert((int)ACT_SILU == (int)BE_ACT_SILU && (int)ACT_GELU_TANH == (int)BE_ACT_GELU_TANH, "config and backend activations agree");

size_t block_scratch_floats(const model_config *c, int n) {
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    size_t per = (size_t)c->hidden * 2 + qd * 2 + kvd * 2 + (size_t)c->ffn * 2;
    return per * (size_t)n;
}

const be_mat *blk_opt(const be_mat *m) { return m->data ? m : NULL; }

/* y[i] = rmsnorm(x) . w[i]^T (+ b[i]); glu (count 2): y[0] = silu(..) * (..), y[1] scratch.
 * One optional op where the backend fuses it, else norm, matmul(s), swiglu. */
static void norm_matmul(const be_ops *be, be_ctx *bc, const float *x, int T, const be_mat *norm, float w_add, float eps, float *xn,
                        int count, const be_mat *const *w, const be_mat *const *b, float *const *y, int glu) {
    if (be->norm_matmul) {
        be->norm_matmul(bc, x, T, norm, w_add, eps, xn, count, w, b, y, glu);
        return;
    }
    be->rmsnorm(bc, x, T, (int)w[0]->cols, norm, w_add, eps, xn);
    if (be->matmul_multi) be->matmul_multi(bc, xn, T, count, w, b, y);
    else for (int i = 0; i < count; i++) be->matmul(bc, xn, T, w[i], b[i], y[i]);
    if (glu) be->glu(bc, y[0], y[1], y[0], (size_t)T * w[0]->rows, glu);
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

blk_bufs blk_carve(const model_config *c, int T, float *scratch) {
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    blk_bufs s;
    s.xn = scratch;
    s.tmp = s.xn + (size_t)T * c->hidden;
    s.q = s.tmp + (size_t)T * c->hidden;
    s.att = s.q + (size_t)T * qd;
    s.k = s.att + (size_t)T * qd;
    s.v = s.k + (size_t)T * kvd;
    s.gate = s.v + (size_t)T * kvd;
    s.up = s.gate + (size_t)T * c->ffn;
    return s;
}

be_attn blk_attn(const model_config *c, const model_weights *w, const block_batch *bb) {
    float scale = c->attn_scalar > 0 ? 1.0f / sqrtf(c->attn_scalar) : 1.0f / sqrtf((float)c->head_dim);
    return (be_attn){
        .B = bb->B, .L = bb->L, .n_head = c->n_head, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim,
        .pos0 = bb->pos0, .len = bb->len, .scale = scale, .softcap = c->attn_softcap,
        .pos = bb->pos, .inv_freq = w->inv_freq, .rot_dims = w->rot_dims, .neox = 1,   /* the cache ropes q, k */
    };
}

void blk_attend(const be_ops *be, be_ctx *bc, const model_config *c, const layer_weights *lw, kv_group *g, kv_cache *kc,
                be_attn *a, int T, const float *x, const blk_bufs *s) {
    const be_mat *wqkv[3] = {&lw->wq, &lw->wk, &lw->wv}, *bqkv[3] = {blk_opt(&lw->bq), blk_opt(&lw->bk), blk_opt(&lw->bv)};
    float *yqkv[3] = {s->q, s->k, s->v};
    norm_matmul(be, bc, x, T, &lw->attn_norm, c->norm_add, c->eps, s->xn, 3, wqkv, bqkv, yqkv, 0);
    if (c->qk_norm) {
        be->rmsnorm(bc, s->q, T * c->n_head, c->head_dim, &lw->q_norm, c->norm_add, c->eps, s->q);
        be->rmsnorm(bc, s->k, T * c->n_kv_head, c->head_dim, &lw->k_norm, c->norm_add, c->eps, s->k);
    }
    kv_group_describe(g, a);
    kc->vt->update_attend(kc, a, s->k, s->v, s->q, s->att);
}

void blk_mlp_in(const be_ops *be, be_ctx *bc, const model_config *c, const layer_weights *lw, int T, const float *x, const blk_bufs *s) {
    const be_mat *wgu[2] = {&lw->w_gate, &lw->w_up}, *bgu[2] = {blk_opt(&lw->b_gate), blk_opt(&lw->b_up)};
    float *ygu[2] = {s->gate, s->up};
    norm_matmul(be, bc, x, T, &lw->ffn_norm, c->norm_add, c->eps, s->xn, 2, wgu, bgu, ygu, c->act ? c->act : BE_ACT_SILU);
}

void blk_branch_out(const be_ops *be, be_ctx *bc, const model_config *c, const float *t, int T, const be_mat *w, const be_mat *b,
                    const be_mat *post, float *x, float *tmp) {
    if (!post) {
        matmul_add(be, bc, t, T, w, b, x, tmp);
        return;
    }
    be->matmul(bc, t, T, w, b, tmp);
    be->rmsnorm(bc, tmp, T, (int)w->rows, post, c->norm_add, c->eps, tmp);
    be->add(bc, x, tmp, (size_t)T * w->rows);
}

void blk_layer(const be_ops *be, be_ctx *bc, const model_config *c, const layer_weights *lw, kv_group *g, kv_cache *kc, be_attn *a,
               int T, float *x, const blk_bufs *s) {
    blk_attend(be, bc, c, lw, g, kc, a, T, x, s);
    const be_mat *wgu[2] = {&lw->w_gate, &lw->w_up};
    if (be->prefetch_next) be->prefetch_next(bc, 2, wgu);   /* read after o_proj: a backend may fetch ahead while it waits */
    blk_branch_out(be, bc, c, s->att, T, &lw->wo, blk_opt(&lw->bo), blk_opt(&lw->post_attn_norm), x, s->tmp);
    blk_mlp_in(be, bc, c, lw, T, x, s);
    blk_branch_out(be, bc, c, s->gate, T, &lw->w_down, blk_opt(&lw->b_down), blk_opt(&lw->post_ffn_norm), x, s->tmp);
}

cinfer_status block_forward(const be_ops *be, be_ctx *bc, const model_config *c, const model_weights *w,
                            kv_group *const *groups, kv_cache *const *caches, const block_batch *bb, float *x,
                            float *scratch) {
    int T = bb->B * bb->L;
    blk_bufs s = blk_carve(c, T, scratch);
    be_attn a = blk_attn(c, w, bb);
    for (int l = 0; l < c->n_layer; l++) {
        a.inv_freq = w->local && w->local[l] ? w->inv_freq_local : w->inv_freq;   /* a layer's own RoPE (Gemma 3's local base) */
        blk_layer(be, bc, c, &w->layers[l], groups[l], caches[l], &a, T, x, &s);
    }
    return CINFER_OK;
}
