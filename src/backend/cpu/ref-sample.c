/*
 * ref-sample.c — the definition of be_ops.sample (backend.h), which the CPU
 * backend runs and the CUDA kernel (cuda/sample.cu) is tested against.
 *
 * Every filter is a threshold on the order (logit descending, then id): a
 * radix select over the order-preserving 32-bit keys, a byte a pass,
 * weighted by count (top-k) or by fixed-point mass (top-p), finds the key
 * where the prefix's weight reaches what is needed, and a walk over the ties
 * at that key in id order finds the last id taken. Nothing is sorted, so a
 * row costs a few passes over V whatever the filters. Masses are u64 fixed
 * point: sums are exact and do not depend on their order, so a device that
 * sums in any order draws the same token.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"

static uint32_t order_key(float v) {
    if (v != v) v = -INFINITY;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* membership of a prefix of the order: key > T, or key == T and id <= cut; on == 0: everything */
typedef struct prefix_set {
    uint32_t T;
    int cut, on;
} prefix_set;

static int in_set(const prefix_set *s, uint32_t k, int i) { return !s->on || k > s->T || (k == s->T && i <= s->cut); }

/* the shortest prefix (in order) of the ids of S whose weight (mass, or count when w is NULL) reaches need
 * (1 <= need <= the weight of S) */
static prefix_set select_prefix(const float *z, const uint64_t *w, int V, const prefix_set *S, uint64_t need) {
    uint32_t pre = 0, msk = 0;
    for (int sh = 24; sh >= 0; sh -= 8) {
        uint64_t hist[256] = {0}, cum = 0;
        for (int i = 0; i < V; i++) {
            uint32_t k = order_key(z[i]);
            if ((k & msk) == pre && in_set(S, k, i)) hist[(k >> sh) & 255] += w ? w[i] : 1;
        }
        int d = 0;
        for (int b = 255; b >= 0; b--) {
            if (cum + hist[b] >= need) { d = b; break; }
            cum += hist[b];
        }
        need -= cum;
        pre |= (uint32_t)d << sh;
        msk |= 0xffu << sh;
    }
    prefix_set r = {pre, V - 1, 1};
    uint64_t acc = 0;
    for (int i = 0; i < V; i++)
        if (order_key(z[i]) == pre && in_set(S, pre, i) && (acc += w ? w[i] : 1) >= need) { r.cut = i; break; }
    return r;
}

void be_ref_sample_row(float *z, int V, const be_sample_row *p, const be_logit_edit *edits, be_sample_out *out) {
    for (int e = 0; e < p->n_edit; e++) {
        const be_logit_edit *ed = &edits[p->edit0 + e];
        if (ed->tok >= 0 && ed->tok < V) z[ed->tok] = be_apply_edit(z[ed->tok], ed);
    }
    memset(out, 0, sizeof *out);
    out->lp = NAN;
    int best = 0;
    uint32_t kb = order_key(z[0]);
    for (int i = 1; i < V; i++) {
        uint32_t k = order_key(z[i]);
        if (k > kb) { kb = k; best = i; }
    }
    float zb = z[best] == z[best] ? z[best] : -INFINITY;
    float lse = NAN;
    if (p->n_top >= 0) {
        double sum = 0;
        for (int i = 0; i < V; i++) sum += exp((double)(z[i] == z[i] ? z[i] : -INFINITY) - zb);
        lse = zb + (float)log(sum);
        uint64_t prev = ~0ull;   /* (key << 32 | ~id): the order as one number, the largest first */
        for (int j = 0; j < p->n_top && j < V && j < BE_SAMPLE_TOP; j++) {
            uint64_t m = 0;
            for (int i = 0; i < V; i++) {
                uint64_t k = (uint64_t)order_key(z[i]) << 32 | (uint32_t)~i;
                if (k < prev && k > m) m = k;
            }
            prev = m;
            int id = (int)~(uint32_t)m;
            out->top_id[j] = id;
            out->top_lp[j] = (z[id] == z[id] ? z[id] : -INFINITY) - lse;
        }
    }
    int tok = best;
    float zt = zb * p->inv_temp;
    uint64_t *mass = p->inv_temp > 0 && isfinite(zt) ? malloc(sizeof *mass * (size_t)V) : NULL;
    if (mass) {   /* (out of memory: the greedy token) */
        for (int i = 0; i < V; i++) {
            float v = z[i] == z[i] ? z[i] : -INFINITY;
            mass[i] = (uint64_t)llrint(exp((double)(v * p->inv_temp) - (double)zt) * 0x1p40);
        }
        prefix_set all = {0, 0, 0}, S = all, P = all;
        if (p->top_k > 0 && p->top_k < V) S = select_prefix(z, NULL, V, &all, (uint64_t)p->top_k);
        if (p->top_p < 1.0f) {
            uint64_t Z = 0;
            for (int i = 0; i < V; i++) Z += in_set(&S, order_key(z[i]), i) ? mass[i] : 0;
            double nd = ceil((double)p->top_p * (double)Z);
            uint64_t need = nd < 1 ? 1 : nd >= (double)Z ? Z : (uint64_t)nd;
            P = select_prefix(z, mass, V, &S, need);
        }
        double floor_m = (double)p->min_p * 0x1p40;
        uint64_t K = 0;
        for (int i = 0; i < V; i++) {
            uint32_t k = order_key(z[i]);
            if (in_set(&S, k, i) && in_set(&P, k, i) && (double)mass[i] >= floor_m) K += mass[i];
        }
        uint64_t r = (uint64_t)(p->u * (double)K), acc = 0;
        if (r >= K) r = K - 1;
        for (int i = 0; i < V; i++) {
            uint32_t k = order_key(z[i]);
            if (in_set(&S, k, i) && in_set(&P, k, i) && (double)mass[i] >= floor_m && (acc += mass[i]) > r) {
                tok = i;
                break;
            }
        }
    }
    out->tok = tok;
    out->zmax = zb;
    if (p->n_top >= 0) out->lp = (z[tok] == z[tok] ? z[tok] : -INFINITY) - lse;
    free(mass);
}
