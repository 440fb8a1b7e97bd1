/*
 * test-cache.c — the cache conformance test: seeded random sequences of
 * append / trim / fork / free / snapshot-restore over several sequences, for
 * every cache policy (full causal; HF sliding window; mlx-lm's
 * RotatingKVCache(N, keep)) and several page sizes and dtypes, run through
 * the real kv_group + dense pages + CPU attention, and checked against a
 * plain reference that keeps every sequence's keys concatenated and masks
 * them by an independent statement of each policy:
 *   - full: key j visible to the query at p iff j <= p;
 *   - window W: iff p - W < j <= p (transformers' sliding window);
 *   - rotating: a literal simulation of mlx-lm's RotatingKVCache buffer
 *     (models/cache.py: _update_concat trims to max_size - 1 then appends,
 *     _update_in_place writes a ring that wraps to keep, make_mask's
 *     window over buffer indices for multi-token steps, no mask for one
 *     token); the visible keys are the positions its buffer shows.
 * Keys and values are rounded to the pool dtype in the reference too (for
 * the quantized page format: quantized and dequantized per row, so the
 * reference is the dense equivalent), so the comparison is of the attention
 * arithmetic and the mask alone.
 */
#include "check.h"
#include "backend/cpu/cpu.h"
#include "cache/cache.h"
#include "quant/affine.h"

static const be_ops *test_backend(void) { return test_on_cuda() ? be_cuda() : be_cpu(); }

#define NSEQ 5
#define HD 32
#define NKV 2
#define NH 4
#define MAXP 400

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 20);
}
static float frand(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

/* mlx-lm's RotatingKVCache, tracking which position sits at each buffer index */
typedef struct mlx_rot {
    int max_size, keep, offset, idx, n;
    int buf[MAXP + 300];   /* logical position at each index, -1 = zeros */
} mlx_rot;

static void rot_temporal(mlx_rot *r) {
    if (r->idx == r->n) return;
    int t[MAXP + 300], m = 0;
    if (r->idx < r->offset) {
        for (int i = 0; i < r->keep; i++) t[m++] = r->buf[i];
        for (int i = r->idx; i < r->n; i++) t[m++] = r->buf[i];
        for (int i = r->keep; i < r->idx; i++) t[m++] = r->buf[i];
    } else {
        for (int i = 0; i < r->idx; i++) t[m++] = r->buf[i];
    }
    memcpy(r->buf, t, sizeof(int) * m);
    r->n = m;
}

static void rot_trim_front(mlx_rot *r, int trim) {   /* _trim: buf[:keep] + buf[trim+keep:] */
    if (trim <= 0) return;
    memmove(r->buf + r->keep, r->buf + r->keep + trim, sizeof(int) * (r->n - r->keep - trim));
    r->n -= trim;
}

/* one update of S tokens at positions offset..offset+S-1; vis[i][*] gets the
 * positions query i sees (count in nvis[i]) */
static void rot_update(mlx_rot *r, int S, int vis[][MAXP], int *nvis) {
    int off_before = r->offset;
    if (S > 1) {
        if (r->n) {
            rot_temporal(r);
            r->idx = r->n;
            rot_trim_front(r, r->idx - r->max_size + 1);
        }
        for (int i = 0; i < S; i++) r->buf[r->n++] = off_before + i;
        r->offset += S;
        r->idx = r->n;
        int om = off_before < r->max_size - 1 ? off_before : r->max_size - 1;
        for (int i = 0; i < S; i++) {
            nvis[i] = 0;
            for (int k = 0; k < r->n; k++) {
                int ok = k <= om + i && (om + S <= r->max_size || k > om + i - r->max_size);
                if (ok) vis[i][nvis[i]++] = r->buf[k];
            }
        }
        return;
    }
    if (!r->n || (off_before >= r->n && r->n < r->max_size)) {
        int grow = r->max_size - off_before < 256 ? r->max_size - off_before : 256;
        for (int i = 0; i < grow; i++) r->buf[r->n++] = -1;
        r->idx = off_before;
    }
    if (r->n - r->max_size > 0) {
        rot_trim_front(r, r->n - r->max_size);
        r->idx = r->max_size;
    }
    if (r->idx == r->max_size) r->idx = r->keep;
    r->buf[r->idx++] = off_before;
    r->offset++;
    int shown = r->offset < r->max_size ? r->offset : r->n;
    nvis[0] = 0;
    for (int k = 0; k < shown; k++) vis[0][nvis[0]++] = r->buf[k];
}

typedef struct ref_seq {
    int len;
    float k[MAXP][NKV][HD], v[MAXP][NKV][HD];
    mlx_rot rot;
} ref_seq;

typedef struct policy { const char *name; int window, keep; } policy;

static int vis_buf[64][MAXP];

/* the positions query i of a step (S tokens from pos0) may see: causal, or transformers' window */
static void ref_visible(const policy *p, int pos0, int S, int nvis[]) {
    for (int i = 0; i < S; i++) {
        int q = pos0 + i;
        nvis[i] = 0;
        for (int j = 0; j <= q; j++)
            if (!p->window || j > q - p->window) vis_buf[i][nvis[i]++] = j;
    }
}

static double ref_attend(const ref_seq *r, const float *q, int h, const int *vis, int n, float *out) {
    double mx = -INFINITY, sum = 0, acc[HD] = {0}, s[MAXP];
    for (int t = 0; t < n; t++) {
        double d = 0;
        for (int e = 0; e < HD; e++) d += (double)q[e] * r->k[vis[t]][h][e];
        s[t] = d / sqrt((double)HD);
        if (s[t] > mx) mx = s[t];
    }
    for (int t = 0; t < n; t++) {
        double w = exp(s[t] - mx);
        sum += w;
        for (int e = 0; e < HD; e++) acc[e] += w * r->v[vis[t]][h][e];
    }
    double worst = 0;
    for (int e = 0; e < HD; e++) worst = fmax(worst, fabs(acc[e] / sum - out[e]));
    return worst;
}

typedef struct rig {
    const be_ops *be;
    be_ctx *bc;
    kv_budget budget;
    kv_group *g;
    kv_cache *layer;
    be_dtype dt;
    int bits;       /* 0: dense pages of dt; else quantized pages (group 32, f32 scales) */
    int tiled;
    policy pol;
    ref_seq *ref;   /* [NSEQ] */
    double worst;
    int steps, refused;
} rig;

/* dst[HD] = a row as the pool keeps it: rounded to the dtype, or quantized and dequantized */
static void store_ref(const rig *R, const float *x, float *dst) {
    if (R->bits) {
        uint8_t codes[HD];
        float sc[HD / 32], bi[HD / 32];
        aq_quantize_row(x, HD, R->bits, 32, AQ_ROUND_GPU, BE_F32, codes, sc, bi);
        aq_dequant_row(codes, sc, bi, BE_F32, R->bits, 32, 0, HD, dst);
        return;
    }
    for (int e = 0; e < HD; e++) {
        float t;
        be_kv_put(&t, R->dt, 0, x[e]);
        dst[e] = be_kv_get(&t, R->dt, 0);
    }
}

/* one step: rows on distinct sequences, each appending n[b] tokens */
static int step(rig *R, int B, const int *seq, const int *n) {
    int L = 0, pos0[NSEQ], ok = 1;
    for (int b = 0; b < B; b++) {
        pos0[b] = R->ref[seq[b]].len;
        if (n[b] > L) L = n[b];
        if (pos0[b] + n[b] > MAXP - 2) return 1;
    }
    char err[300];
    if (kv_group_prepare(R->g, B, seq, pos0, n, err, sizeof err)) { printf("# prepare: %s\n", err); return 0; }
    size_t T = (size_t)B * L;
    float *k = calloc(T * NKV * HD, 4), *v = calloc(T * NKV * HD, 4), *q = calloc(T * NH * HD, 4), *o = calloc(T * NH * HD, 4);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n[b]; i++) {
            ref_seq *r = &R->ref[seq[b]];
            for (int h = 0; h < NKV; h++) {
                float *kk = &k[(((size_t)b * L + i) * NKV + h) * HD], *vv = &v[(((size_t)b * L + i) * NKV + h) * HD];
                for (int e = 0; e < HD; e++) kk[e] = frand(), vv[e] = frand();
                store_ref(R, kk, r->k[pos0[b] + i][h]);   /* what the pool keeps */
                store_ref(R, vv, r->v[pos0[b] + i][h]);
            }
            for (int e = 0; e < NH * HD; e++) q[((size_t)b * L + i) * NH * HD + e] = 2 * frand();
        }
    be_attn a = {.B = B, .L = L, .n_head = NH, .n_kv_head = NKV, .head_dim = HD, .pos0 = pos0, .len = n,
                 .scale = 1.0f / sqrtf((float)HD)};
    kv_group_describe(R->g, &a);
    /* through backend memory, as the model runs it (device memory on CUDA) */
    size_t kb = T * NKV * HD * 4, qb = T * NH * HD * 4;
    float *dk = R->be->alloc(R->bc, kb), *dv = R->be->alloc(R->bc, kb), *dq = R->be->alloc(R->bc, qb), *dout = R->be->alloc(R->bc, qb);
    R->be->from_host(R->bc, dk, k, kb);
    R->be->from_host(R->bc, dv, v, kb);
    R->be->from_host(R->bc, dq, q, qb);
    R->layer->vt->update_attend(R->layer, &a, dk, dv, dq, dout);
    R->be->to_host(R->bc, o, dout, qb);
    R->be->free(R->bc, dk); R->be->free(R->bc, dv); R->be->free(R->bc, dq); R->be->free(R->bc, dout);
    kv_group_commit(R->g);
    int nvis[64];
    for (int b = 0; b < B; b++) {
        ref_seq *r = &R->ref[seq[b]];
        if (R->pol.keep) rot_update(&r->rot, n[b], vis_buf, nvis);
        else ref_visible(&R->pol, pos0[b], n[b], nvis);
        r->len = pos0[b] + n[b];
        for (int i = 0; i < n[b]; i++)
            for (int h = 0; h < NH; h++) {
                double e = ref_attend(r, q + (((size_t)b * L + i) * NH + h) * HD, h / (NH / NKV), vis_buf[i], nvis[i],
                                      o + (((size_t)b * L + i) * NH + h) * HD);
                if (!(e <= R->worst)) R->worst = e;
            }
        if (kv_group_len(R->g, seq[b]) != r->len) ok = 0;
    }
    free(k); free(v); free(q); free(o);
    R->steps++;
    return ok;
}

/* snapshot of sequence s through the layer codec (every part), restored into d */
static int snap_restore(rig *R, int s, int d) {
    int n_sink, run, len, page, ok = 1;
    kv_group_held(R->g, s, &n_sink, &run, &len);
    int T = n_sink + len - run;
    kv_part pp[KV_MAX_PARTS];
    int np = R->layer->vt->parts(R->layer, pp);
    char *k[KV_MAX_PARTS], *v[KV_MAX_PARTS];
    const int32_t *pt = kv_group_table(R->g, s, &page);
    /* two ranges, one call each, kept as [range][n_kv][n][width] */
    for (int p = 0; p < np; p++) {
        size_t row = pp[p].width * pp[p].el, bytes = (size_t)NKV * (T ? T : 1) * row, part = (size_t)NKV * n_sink * row;
        k[p] = malloc(bytes), v[p] = malloc(bytes);
        if (n_sink) R->layer->vt->read(R->layer, p, pt, page, 0, n_sink, k[p], v[p]);
        if (len > run) R->layer->vt->read(R->layer, p, pt, page, run, len - run, k[p] + part, v[p] + part);
    }
    char err[300];
    ok = !kv_group_restore(R->g, d, n_sink, run, len, err, sizeof err);
    if (!ok) printf("# restore: %s\n", err);
    pt = kv_group_table(R->g, d, &page);
    for (int p = 0; p < np; p++) {
        size_t row = pp[p].width * pp[p].el, bytes = (size_t)NKV * (T ? T : 1) * row, part = (size_t)NKV * n_sink * row;
        char *k2 = malloc(bytes), *v2 = malloc(bytes);
        if (ok && n_sink) R->layer->vt->write(R->layer, p, pt, page, 0, n_sink, k[p], v[p]);
        if (ok && len > run) R->layer->vt->write(R->layer, p, pt, page, run, len - run, k[p] + part, v[p] + part);
        /* the round trip is exact: read back what was written */
        if (ok && n_sink) R->layer->vt->read(R->layer, p, pt, page, 0, n_sink, k2, v2);
        if (ok && len > run) R->layer->vt->read(R->layer, p, pt, page, run, len - run, k2 + part, v2 + part);
        if (ok && T && (memcmp(k[p], k2, (size_t)NKV * T * row) || memcmp(v[p], v2, (size_t)NKV * T * row))) ok = 0;
        free(k[p]); free(v[p]); free(k2); free(v2);
    }
    return ok;
}

static void run_policy(const policy *pol, int page, be_dtype dt, int bits, int tiled, int n_ops) {
    rig R = {.be = test_backend(), .dt = dt, .bits = bits, .tiled = tiled, .pol = *pol, .budget = {(size_t)64 << 20, 0}};
    R.be->ctx_new(&R.bc, 1);
    R.g = kv_group_new(R.be, R.bc, &R.budget, NSEQ, page, pol->window, pol->keep);
    R.layer = bits ? kv_quant_new(R.be, R.bc, NKV, HD, bits, 32, BE_F32, page, tiled ? KV_TILED : KV_UNFUSED)
                   : kv_dense_new(R.be, R.bc, NKV, HD, dt, page);
    kv_group_add(R.g, R.layer);
    R.ref = calloc(NSEQ, sizeof *R.ref);
    for (int s = 0; s < NSEQ; s++) R.ref[s].rot = (mlx_rot){.max_size = pol->window, .keep = pol->keep};
    int ok = 1, forks = 0, trims = 0, snaps = 0, frees = 0;
    for (int op = 0; op < n_ops && ok; op++) {
        int kind = rnd() % 10, s = rnd() % NSEQ, d = rnd() % NSEQ;
        if (kind < 5) {   /* a batch of appends: several sequences, mixed lengths, some decode steps */
            int B = 1 + rnd() % 3, seq[3], n[3];
            for (int b = 0; b < B; b++) {
                seq[b] = (s + b * 2) % NSEQ;
                n[b] = rnd() % 3 == 0 ? 1 : 1 + rnd() % 24;
            }
            ok = step(&R, B, seq, n);
        } else if (kind == 5 && s != d) {
            ok = !kv_group_fork(R.g, s, d, NULL, 0);
            R.ref[d] = R.ref[s];
            forks++;
        } else if (kind == 6) {
            int n = R.ref[s].len ? (int)(rnd() % R.ref[s].len) : 0;
            /* mlx-lm trims a rotating cache only while offset < max_size; the others keep everything */
            int allowed = !pol->keep || R.ref[s].rot.offset < pol->window;
            int min = kv_group_min_start(R.g, s);
            cinfer_status st = kv_group_trim(R.g, s, n, NULL, 0);
            if (st) {
                R.refused++;
                ok = n < min && kv_group_len(R.g, s) == R.ref[s].len;   /* refused only for a reason, state kept */
            } else {
                /* mlx-lm's trim(len - n): offset and _idx go back (its buffer is unwrapped while
                 * offset < max_size); cinfer must never accept a trim mlx-lm refuses */
                ok = allowed;
                R.ref[s].len = n;
                if (pol->keep) R.ref[s].rot.offset = R.ref[s].rot.idx = n;
                trims++;
            }
        } else if (kind == 7) {
            kv_group_clear(R.g, s);
            R.ref[s].len = 0;
            R.ref[s].rot = (mlx_rot){.max_size = pol->window, .keep = pol->keep};
            frees++;
        } else if (kind == 8 && s != d) {
            ok = snap_restore(&R, s, d);
            R.ref[d] = R.ref[s];
            snaps++;
        } else {
            int n[1] = {1}, seq[1] = {s};
            ok = step(&R, 1, seq, n);
        }
        if (!ok) printf("# op %d (kind %d, seq %d -> %d) failed\n", op, kind, s, d);
    }
    /* sequences of a windowed cache hold a bounded number of pages */
    size_t held = kv_group_bytes(R.g), bound = pol->window
        ? (size_t)NSEQ * ((pol->window + pol->keep) / page + 3) * R.layer->vt->page_bytes(R.layer) : (size_t)-1;
    CHECK(ok && R.worst <= 2e-6 && held <= bound,
          "cache conformance (%s) %s, page %d, %s%s%s: %d steps, %d forks, %d trims (%d refused), %d snapshots, %d frees; "
          "worst |attention - reference| %.2g; %zu bytes held", R.be->name, pol->name, page,
          be_dtype_name(bits && be_dtype_affine(bits, &dt) ? dt : dt), bits ? " g32" : "",
          bits ? (tiled ? " tiled" : " unfused") : "", R.steps, forks, trims,
          R.refused, snaps, frees, R.worst, held);
    kv_group_free(R.g);
    R.be->ctx_free(R.bc);
    free(R.ref);
}

int main(void) {
    static const policy pols[] = {{"full", 0, 0}, {"window 16", 16, 0}, {"rotating 24 keep 4", 24, 4},
                                  {"rotating 40 keep 4", 40, 4}};
    static const int pages[] = {1, 4, 16, 128};
    CHECK(test_backend() != NULL, "backend %s", test_on_cuda() ? "cuda" : "cpu");
    if (!test_backend()) return CHECK_DONE();
    for (size_t p = 0; p < sizeof pols / sizeof *pols; p++)
        for (size_t g = 0; g < sizeof pages / sizeof *pages; g++)
            for (int dt = 0; dt < 3; dt++) run_policy(&pols[p], pages[g], (be_dtype)dt, 0, 0, dt == 0 ? 160 : 60);
    /* the quantized page format against its dense equivalent, every policy (the rotating and
     * multi-sequence quantized caches mlx-lm cannot build), both kernel sets */
    static const int qbits[] = {8, 4, 3, 2};
    for (size_t p = 0; p < sizeof pols / sizeof *pols; p++)
        for (size_t i = 0; i < sizeof qbits / sizeof *qbits; i++)
            run_policy(&pols[p], pages[(p + i) % 4], BE_F32, qbits[i], qbits[i] == 4 || qbits[i] == 8 ? (int)(i & 1) : 0, 60);
    return CHECK_DONE();
}
