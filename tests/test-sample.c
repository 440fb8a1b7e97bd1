/*
 * test-sample.c — be_ops.sample and cinfer_decode_sampled (backend.h's
 * definition of a sampled decode step).
 *   1. The definition (be_ref_sample_row, a radix select) against an
 *      independent one written here by sorting the whole row: the kept set
 *      of every filter combination and the token for a sweep of u; and the
 *      draw's frequencies against softmax probabilities computed in double.
 *   2. The backend's op (CPU in CI; CUDA with CINFER_TEST_DEVICE=cuda) against
 *      the definition on identical logits: vocabularies 512 to 128,256, ties,
 *      NaN and -inf, edits, log-probs; the token and the top ids exactly,
 *      log-probs to 1e-6 of |lse|.
 *   3. End to end on stories260k: cinfer_decode_sampled's picks equal the
 *      definition applied to the logits cinfer_forward_seqs returns for the
 *      same rows in a twin context (the same kernels, so the same logits).
 */
#include <stdint.h>
#include "check.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "cinfer.h"

static const be_ops *be;
static be_ctx *bc;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void) {   /* [0, 1) */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static uint32_t okey(float v) {
    if (v != v) v = -INFINITY;
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

static const float *sort_z;
static int by_order(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    uint32_t x = okey(sort_z[i]), y = okey(sort_z[j]);
    return x > y ? -1 : x < y ? 1 : i - j;
}

/* the definition written by sorting: the kept mask and masses of a row (edits already applied) */
static void brute_kept(const float *z, int V, const be_sample_row *p, uint8_t *kept, uint64_t *mass) {
    int *ord = malloc(sizeof(int) * V);
    for (int i = 0; i < V; i++) ord[i] = i;
    sort_z = z;
    qsort(ord, V, sizeof *ord, by_order);
    float zb = z[ord[0]] == z[ord[0]] ? z[ord[0]] : -INFINITY, zt = zb * p->inv_temp;
    for (int i = 0; i < V; i++) {
        float v = z[i] == z[i] ? z[i] : -INFINITY;
        mass[i] = (uint64_t)llrint(exp((double)(v * p->inv_temp) - (double)zt) * 0x1p40);
        kept[i] = 0;
    }
    int nS = p->top_k > 0 && p->top_k < V ? p->top_k : V, nP = nS;
    if (p->top_p < 1.0f) {
        uint64_t Z = 0, acc = 0;
        for (int k = 0; k < nS; k++) Z += mass[ord[k]];
        double nd = ceil((double)p->top_p * (double)Z);
        uint64_t need = nd < 1 ? 1 : nd >= (double)Z ? Z : (uint64_t)nd;
        for (nP = 0; nP < nS && acc < need; nP++) acc += mass[ord[nP]];
    }
    for (int k = 0; k < nP; k++)
        if ((double)mass[ord[k]] >= (double)p->min_p * 0x1p40) kept[ord[k]] = 1;
    free(ord);
}

static int brute_draw(const uint8_t *kept, const uint64_t *mass, int V, double u) {
    uint64_t K = 0, acc = 0;
    for (int i = 0; i < V; i++) K += kept[i] ? mass[i] : 0;
    uint64_t r = (uint64_t)(u * (double)K);
    if (r >= K) r = K - 1;
    for (int i = 0; i < V; i++)
        if (kept[i] && (acc += mass[i]) > r) return i;
    return -1;
}

static float *logits_row(int V, int kind) {
    float *z = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) z[i] = (float)(urand() * 16 - 8);
    if (kind == 1)   /* coarse values: many ties */
        for (int i = 0; i < V; i++) z[i] = floorf(z[i]);
    if (kind == 2) { z[V / 3] = NAN; z[V / 2] = -INFINITY; z[1] = z[V - 2] = 9.0f; }   /* NaN, -inf, a tied maximum */
    if (kind == 3)   /* peaked: a few likely tokens, a long flat tail */
        for (int i = 0; i < V; i++) z[i] = i % 97 == 5 ? 12.0f - (float)(i % 7) : (float)(urand() * 2 - 6);
    return z;
}

static const be_sample_row PARAMS[] = {
    /* inv_temp, top_k, top_p, min_p, u, edit0, n_edit, n_top */
    {0, 0, 1, 0, 0, 0, 0, -1},           /* greedy */
    {0, 0, 1, 0, 0, 0, 0, 5},            /* greedy with log-probs */
    {1, 0, 1, 0, 0, 0, 0, -1},           /* temperature 1, nothing filtered */
    {1.25f, 0, 1, 0, 0, 0, 0, 20},       /* temperature 0.8 */
    {1, 40, 1, 0, 0, 0, 0, -1},          /* top-k */
    {1, 0, 0.9f, 0, 0, 0, 0, 3},         /* top-p */
    {2, 0, 0.5f, 0, 0, 0, 0, -1},
    {1, 0, 1, 0.05f, 0, 0, 0, -1},       /* min-p */
    {0.7f, 50, 0.95f, 0.01f, 0, 0, 0, 1},   /* all three */
    {1, 1, 1, 0, 0, 0, 0, -1},           /* top-k 1 = greedy */
    {1, 0, 1e-6f, 0, 0, 0, 0, -1},       /* top-p tiny = greedy */
    {1, 0, 1, 1.0f, 0, 0, 0, -1},        /* min-p 1: the maximum (and ties of it) only */
    {0.5f, 3000, 0.99f, 0, 0, 0, 0, -1}, /* wide */
};
#define NPAR ((int)(sizeof PARAMS / sizeof *PARAMS))

/* 1. the definition against the sorting one */
static void test_definition(void) {
    static const int VS[] = {64, 1001, 32000};
    int bad_kept = 0, bad_tok = 0, cases = 0;
    for (int vi = 0; vi < 3; vi++)
        for (int kind = 0; kind < 4; kind++) {
            int V = VS[vi];
            float *z = logits_row(V, kind), *zc = malloc(sizeof(float) * V);
            uint8_t *kept = malloc(V);
            uint64_t *mass = malloc(sizeof(uint64_t) * V);
            for (int pi = 0; pi < NPAR; pi++) {
                be_sample_row p = PARAMS[pi];
                if (p.inv_temp == 0) continue;
                brute_kept(z, V, &p, kept, mass);
                for (int s = 0; s < 64; s++) {
                    p.u = s < 2 ? (s ? 0.999999999 : 0.0) : urand();
                    memcpy(zc, z, sizeof(float) * V);
                    be_sample_out o;
                    be_ref_sample_row(zc, V, &p, NULL, &o);
                    int want = brute_draw(kept, mass, V, p.u);
                    bad_tok += o.tok != want;
                    bad_kept += o.tok < 0 || o.tok >= V || !kept[o.tok];
                    cases++;
                }
            }
            free(z); free(zc); free(kept); free(mass);
        }
    CHECK(!bad_tok && !bad_kept, "definition vs a full sort: %d draws, %d tokens differ, %d outside the kept set", cases, bad_tok,
          bad_kept);
    /* the draw's frequencies are softmax(z / T) over a row with nothing filtered */
    int V = 64, N = 200000;
    float *z = logits_row(V, 0);
    for (int i = 0; i < V; i++) z[i] *= 0.4f;
    double pr[64], sum = 0, worst = 0;
    int cnt[64] = {0};
    be_sample_row p = {1 / 0.7f, 0, 1, 0, 0, 0, 0, -1};
    for (int i = 0; i < V; i++) sum += pr[i] = exp((double)z[i] / 0.7);
    for (int s = 0; s < N; s++) {
        be_sample_out o;
        p.u = (s + 0.5) / N;
        be_ref_sample_row(z, V, &p, NULL, &o);
        cnt[o.tok]++;
    }
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs(cnt[i] / (double)N - pr[i] / sum));
    CHECK(worst < 2.0 / N + 1e-9, "draw frequencies over a u sweep = softmax(z / 0.7) (worst %.2e, bar %.1e)", worst, 2.0 / N);
    free(z);
}

/* |a - b| / |scale| (NaN: infinity) */
static double rel(double a, double b, double scale) {
    double d = fabs(a - b);
    return d == d ? d / (fabs(scale) > 0 ? fabs(scale) : 1) : INFINITY;
}

/* 2. the backend's op against the definition */
static void test_op(void) {
    static const int VS[] = {512, 1001, 32000, 128256};
    for (int vi = 0; vi < 4; vi++) {
        int V = VS[vi], n = NPAR * 4;
        size_t nv = (size_t)n * V;
        float *z = malloc(sizeof(float) * nv), *zr = malloc(sizeof(float) * nv);
        be_sample_row *p = malloc(sizeof *p * n);
        be_logit_edit ed[6 * 64];
        int ne = 0;
        for (int r = 0; r < n; r++) {
            float *row = logits_row(V, r % 4);
            memcpy(z + (size_t)r * V, row, sizeof(float) * V);
            free(row);
            p[r] = PARAMS[r / 4];
            p[r].u = urand();
            if (r % 3 == 0) {   /* penalties and a bias: the edits of a serving row */
                p[r].edit0 = ne;
                p[r].n_edit = 6;
                int t = (int)(urand() * V);
                ed[ne++] = (be_logit_edit){t, BE_EDIT_PENALTY, 1.3f};
                ed[ne++] = (be_logit_edit){(t + 7) % V, BE_EDIT_PENALTY, 1.3f};
                ed[ne++] = (be_logit_edit){t, BE_EDIT_ADD, -0.5f};
                ed[ne++] = (be_logit_edit){t, BE_EDIT_ADD, -0.25f};
                ed[ne++] = (be_logit_edit){(t + 11) % V, BE_EDIT_ADD, 30.0f};   /* logit_bias forcing a token */
                ed[ne++] = (be_logit_edit){(t + 13) % V, BE_EDIT_ADD, -100.0f};
            }
        }
        memcpy(zr, z, sizeof(float) * nv);
        be_sample_out *ref = malloc(sizeof *ref * n), *got = malloc(sizeof *got * n);
        for (int r = 0; r < n; r++) be_ref_sample_row(zr + (size_t)r * V, V, &p[r], ed, &ref[r]);
        float *dz = be->alloc(bc, sizeof(float) * nv);
        be->from_host(bc, dz, z, sizeof(float) * nv);
        memset(got, 0xff, sizeof *got * n);
        be->sample(bc, dz, n, V, p, ed, ne, got);
        char msg[256] = "";
        int st = be->status && be->status(bc, msg, sizeof msg);
        be->to_host(bc, z, dz, sizeof(float) * nv);   /* the edits, written back */
        int tok_bad = 0, top_bad = 0, edit_bad = 0, zmax_bad = 0;
        double e_lp = 0;
        for (int r = 0; r < n; r++) {
            tok_bad += got[r].tok != ref[r].tok;
            zmax_bad += memcmp(&got[r].zmax, &ref[r].zmax, sizeof(float)) != 0;
            if (p[r].n_top >= 0) {
                double lse = z[(size_t)r * V + ref[r].tok] - ref[r].lp;
                e_lp = fmax(e_lp, rel(got[r].lp, ref[r].lp, lse));
                for (int k = 0; k < p[r].n_top; k++) {
                    top_bad += got[r].top_id[k] != ref[r].top_id[k];
                    e_lp = fmax(e_lp, rel(got[r].top_lp[k], ref[r].top_lp[k], lse));
                }
            }
        }
        for (size_t i = 0; i < nv; i++) edit_bad += memcmp(&z[i], &zr[i], 4) != 0;
        CHECK(!st && !tok_bad && !top_bad && !edit_bad && !zmax_bad && e_lp <= 1e-6,
              "%s sample V=%d, %d rows: %d tokens, %d top ids and %d row maxima differ, log-probs %.1e of |lse|, %d edited "
              "logits differ %s", be->name, V, n, tok_bad, top_bad, zmax_bad, e_lp, edit_bad, msg);
        be->free(bc, dz);
        free(z); free(zr); free(p); free(ref); free(got);
    }
}

/* 3. cinfer_decode_sampled against the definition on a twin context's logits */
static void test_engine(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/stories260k", shared_dir());
    cinfer_load_opts lo = {test_on_cuda() ? "cuda" : "cpu", 0, 1};
    cinfer_model *m = NULL;
    char err[512];
    if (cinfer_model_load(dir, &lo, &m, err, sizeof err)) { CHECK(0, "load %s: %s", dir, err); return; }
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    int V = info.n_vocab, B = 6;
    cinfer_ctx_opts co = {.max_seqs = B};
    cinfer_ctx *a = NULL, *b = NULL;
    CHECK(!cinfer_ctx_new(m, &co, &a, err, sizeof err) && !cinfer_ctx_new(m, &co, &b, err, sizeof err), "two contexts: %s", err);
    int32_t prompt[6][5] = {{1, 403, 407, 261, 505}, {1, 9, 50, 300, 2}, {1, 1, 1, 1, 1},
                            {1, 100, 200, 300, 400}, {1, 7, 8, 9, 10}, {1, 499, 498, 497, 496}};
    int seqs[6] = {0, 1, 2, 3, 4, 5}, lens[6] = {5, 3, 5, 4, 5, 2};
    float *lg = malloc(sizeof(float) * B * V);
    int ok = !cinfer_forward_seqs(a, &prompt[0][0], B, 5, seqs, lens, NULL, NULL, 0, NULL) &&
             !cinfer_forward_seqs(b, &prompt[0][0], B, 5, seqs, lens, NULL, NULL, 0, NULL);
    cinfer_logit_edit eds[2] = {{17, 1, 1.5f}, {42, 0, 3.0f}};
    int32_t ids[6] = {5, 6, 7, 8, 9, 10};
    int bad = 0, steps = 0;
    for (int step = 0; ok && step < 8; step++, steps++) {
        cinfer_row_sampling rs[6];
        for (int r = 0; r < B; r++) {
            const be_sample_row *q = &PARAMS[(r + step) % NPAR];
            rs[r] = (cinfer_row_sampling){q->inv_temp > 0 ? 1 / q->inv_temp : 0, q->top_k, q->top_p, q->min_p, urand(),
                                          r % 2 ? eds : NULL, r % 2 ? 2 : 0, q->n_top < 0 ? -1 : 4};
        }
        cinfer_row_pick pk[6];
        ok = !cinfer_forward_seqs(a, ids, B, 1, seqs, NULL, NULL, NULL, 0, lg) && !cinfer_decode_sampled(b, ids, B, seqs, rs, pk);
        for (int r = 0; ok && r < B; r++) {
            be_sample_row q = {rs[r].temp > 0 ? 1 / rs[r].temp : 0, rs[r].top_k, rs[r].top_p, rs[r].min_p, rs[r].u, 0, 0, rs[r].n_top};
            be_logit_edit be_ed[2] = {{17, BE_EDIT_PENALTY, 1.5f}, {42, BE_EDIT_ADD, 3.0f}};
            q.n_edit = rs[r].n_edits;
            be_sample_out o;
            be_ref_sample_row(lg + (size_t)r * V, V, &q, be_ed, &o);
            bad += o.tok != pk[r].token || (q.n_top >= 0 && (fabsf(o.lp - pk[r].logprob) > 1e-5f || o.top_id[0] != pk[r].top_id[0]));
            ids[r] = pk[r].token;
        }
    }
    CHECK(ok && !bad, "cinfer_decode_sampled on %s: %d steps of %d rows equal the definition on the twin's logits (%d differ) %s",
          lo.device, steps, B, bad, ok ? "" : cinfer_ctx_error(b));
    cinfer_row_sampling badr = {-1, 0, 1, 0, 0, NULL, 0, -1};
    cinfer_row_pick pk1;
    CHECK(cinfer_decode_sampled(b, ids, 1, seqs, &badr, &pk1) == CINFER_EINVAL && strstr(cinfer_ctx_error(b), "row 0"),
          "a negative temperature is refused naming the row: %s", cinfer_ctx_error(b));
    cinfer_logit_edit far = {V, 0, 1};
    cinfer_row_sampling badt = {0, 0, 1, 0, 0, &far, 1, -1};
    CHECK(cinfer_decode_sampled(b, ids, 1, seqs, &badt, &pk1) == CINFER_EINVAL && strstr(cinfer_ctx_error(b), "vocabulary"),
          "an edit outside the vocabulary is refused: %s", cinfer_ctx_error(b));
    free(lg);
    cinfer_ctx_free(a);
    cinfer_ctx_free(b);
    cinfer_model_free(m);
}

int main(void) {
    be = test_on_cuda() ? be_cuda() : be_cpu();
    CHECK(be != NULL, "backend built");
    if (!be) return CHECK_DONE();
    CHECK(be->ctx_new(&bc, 2) == 0 && be->sample, "%s context with a sample op", be->name);
    test_definition();
    if (be->sample) test_op();
    be->ctx_free(bc);
    test_engine();
    return CHECK_DONE();
}
