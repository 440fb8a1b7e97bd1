/*
 * test-cuda-model.c — the whole forward on the CUDA backend against the CPU
 * backend and against transformers' golden logits (tests/fixtures/models):
 * every tiny architecture/dtype fixture, the 300-token and sliding-window
 * fixtures (head_dim 64: the flash-attention prefill), prose-13m (real bf16
 * weights), then stories260k's logits and its greedy text, which must be
 * identical to the CPU's. Also: token-by-token decode through the CUDA graph
 * path equals the prefill, and a padded batch equals its rows.
 * Bars (issue 14), each a small factor above the figure achieved on the H200
 * (tests/gpu/last-run/tests.log; the head_dim-64 fixtures in
 * tests/gpu/last-run/issue14-model.log), as max |error| / logit range:
 *   TOL_F32     f32 models vs transformers' f32 logits and vs the CPU backend:
 *               achieved <= 5.9e-7 (llama-sharded-f32), CPU-vs-CUDA <= 3.3e-7
 *   TOL_16_F32  16-bit weights vs transformers' f32 math on the same weights
 *               (logits.npy): the prefill rounds activations to bf16 for
 *               cuBLAS; achieved 4.1e-4 (f16) .. 4.2e-3 (llama-tied-bf16),
 *               1.2e-3 prose-13m
 *   TOL_16_NAT  16-bit weights vs transformers' own bf16/f16 run
 *               (logits_native.npy): that run's rounding, achieved <= 9.4e-3
 *   TOL_16_CPU  16-bit weights, CUDA vs the CPU backend: achieved <= 4.2e-3
 *   TOL_FLASH   head_dim 64/128 and L >= 16 (the flash-attention prefill: K/V
 *               and the probabilities as f16 on the tensor cores), f32
 *               weights, vs transformers f32 (achieved 4.8e-4 .. 1.06e-3), vs
 *               transformers with K/V rounded to f16 (logits_kv_f16.npy,
 *               2.7e-4 .. 1.22e-3: the f16 probabilities dominate) and vs the
 *               CPU (<= 1.06e-3). The CPU reaches 1.8e-6 on the same rows: the
 *               flash path costs f32 models three orders of magnitude.
 *   decode == prefill: f32 achieved <= 6.4e-7; 16-bit <= 5.5e-3; flash
 *               prefill vs the exact f32 decode <= 1.92e-3 (TOL_FLASH_DEC).
 *   padded batch == rows alone (2 rows): <= 3.5e-7; flash <= 1.9e-4.
 *   12 sequences decoded together == each alone: batch-invariant mode 0 (bar
 *               1e-6); default 1e-4 (f32) / 1.5e-2 (16-bit; prose-13m 1.48e-3).
 * argv[1]: directory holding stories260k and prose-13m (default ../shared/models).
 */
#include <jansson.h>
#include <unistd.h>
#include "../check.h"
#include "../golden.h"
#include "cinfer.h"
#include "engine/engine.h"
#include "io/npy.h"
#include "backend/cuda/cuda-api.h"

#define TOL_F32 2e-6
#define TOL_16_F32 1e-2
#define TOL_16_NAT 1.5e-2
#define TOL_16_CPU 1e-2
#define TOL_FLASH 2.5e-3
#define TOL_FLASH_DEC 4e-3
#define TOL_FLASH_PAD 5e-4
#define TOL_DEC_F32 2e-6
#define TOL_DEC_16 1.1e-2
#define TOL_PAD 1e-6

/* token by token through the cache (decode steps: graph capture + replays) */
static void check_decode(const char *name, cinfer_model *m, const int32_t *ids, int n, int V, const float *full, double tol) {
    cinfer_ctx *c = NULL;
    char err[256];
    double worst = 0;
    int ok = !cinfer_ctx_new(m, NULL, &c, err, sizeof err) && golden_decode_err(c, ids, n, V, full, &worst);
    long caps = 0, reps = 0;
    if (c) cuda_graph_stats(c->bc, &caps, &reps);
    /* every step after the first is replayed, or captured afresh when the attention geometry
     * (bucketed by the keys it spans) changes: at most 2 steps run eagerly */
    CHECK(ok && worst <= tol && reps + caps >= n - 2, "%s: token-by-token decode == prefill (max error %.2e of range, tol %.3g; graph captured %ld, replayed %ld)",
          name, worst, tol, caps, reps);
    cinfer_ctx_free(c);
}

static void check_padded(const char *name, cinfer_model *m, const int32_t *ids, int n, int V, const float *full, double tol) {
    double e0, e1;
    int ok = golden_padded_err(m, ids, n, V, full, &e0, &e1);
    CHECK(ok && e0 <= tol && e1 <= tol, "%s: padded batch of 2 rows == each row alone (%.2e, %.2e)", name, e0, e1);
}

/* logits g against refdir/file: one CHECK with the figure, the bar and the CPU's own figure */
static void against(const char *name, const char *what, const char *refdir, const char *file, const float *g,
                    const float *c, int n, int V, double tol) {
    float *ref = golden_read_npy(refdir, file, n, V);
    double e = ref ? golden_rel_err(g, ref, (size_t)n * V) : 1, ecpu = ref ? golden_rel_err(c, ref, (size_t)n * V) : 1;
    CHECK(ref && e <= tol, "%s: cuda vs %s (%s): %.2e of range (tol %.3g; cpu's own: %.2e)", name, what, file, e, tol, ecpu);
    free(ref);
}

/* Issue 10 item 8: 12 sequences of different lengths (prefixes of ids) decoded together, one
 * row each, against each decoded alone. Batch-invariant mode: within 1e-6 of the range (the
 * ops are built to give the lone row's bits; the bar leaves f32 noise room). Default: within
 * tol, the stated tolerance of the fast path (a batch of more than 8 rows rounds the activations
 * of 16-bit matmuls to bf16/f16 for cuBLAS; f32 models take SGEMM). */
static void check_batch(const char *name, cinfer_model *m, const int32_t *ids, int n, int V, double tol) {
    enum { NS = 12 };
    double worst[2] = {0, 0};
    int ok = n >= 4;
    for (int inv = 0; inv < 2 && ok; inv++) {
        cinfer_ctx_opts co = {.max_seqs = NS, .batch_invariant = inv};
        cinfer_ctx *cb = NULL, *ca = NULL;
        char err[256];
        float *lb = malloc(sizeof(float) * NS * V), *la = malloc(sizeof(float) * V);
        int seqs[NS];
        int32_t tok[NS];
        ok = lb && la && !cinfer_ctx_new(m, &co, &cb, err, sizeof err) && !cinfer_ctx_new(m, &co, &ca, err, sizeof err);
        for (int s = 0; s < NS && ok; s++) {   /* the same prompts in both contexts, each alone */
            int len = 2 + (s * 5) % (n - 2);
            seqs[s] = s;
            tok[s] = ids[(s * 7) % n];
            ok = !cinfer_forward_seqs(cb, ids, 1, len, &seqs[s], NULL, NULL, NULL, 0, la) &&
                 !cinfer_forward_seqs(ca, ids, 1, len, &seqs[s], NULL, NULL, NULL, 0, la);
        }
        ok = ok && !cinfer_forward_seqs(cb, tok, NS, 1, seqs, NULL, NULL, NULL, 0, lb);
        for (int s = 0; s < NS && ok; s++) {
            ok = !cinfer_forward_seqs(ca, &tok[s], 1, 1, &seqs[s], NULL, NULL, NULL, 0, la);
            double e = golden_rel_err(lb + (size_t)s * V, la, V);
            if (!(e <= worst[inv])) worst[inv] = e;
        }
        if (!ok) printf("# %s batch check: %s\n", name, cb ? cinfer_ctx_error(cb) : err);
        cinfer_ctx_free(cb);
        cinfer_ctx_free(ca);
        free(lb);
        free(la);
    }
    CHECK(ok && worst[1] <= 1e-6 && worst[0] <= tol,
          "%s: 12 sequences decoded together == each alone: batch-invariant %.2e of range (tol 1e-6), default %.2e (tol %.3g)", name,
          worst[1], worst[0], tol);
}

/* the model in dir against the transformers logits in refdir (a tiny fixture holds both) */
static void model_case(const char *name, const char *refdir, const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/reference.json", refdir);
    json_t *ref = json_load_file(path, 0, NULL);
    cinfer_model *mg = golden_load(dir, "cuda", 0), *mc = golden_load(dir, "cpu", 0);
    CHECK(ref && mg && mc, "%s: fixture and model load on cuda and cpu", name);
    if (ref && mg && mc) {
        cinfer_model_info info;
        cinfer_model_get_info(mg, &info);
        int V = info.n_vocab;
        int32_t ids[512];
        int n = golden_ids(json_object_get(ref, "tokens"), ids, 512);
        const char *dt = json_string_value(json_object_get(ref, "weights_dtype"));
        int f32 = dt && !strcmp(dt, "float32"), flash = info.head_dim == 64 || info.head_dim == 128;
        float *g = golden_eval_all(mg, ids, n, V), *c = golden_eval_all(mc, ids, n, V);
        CHECK(g && c, "%s: eval %d tokens on both backends", name, n);
        if (g && c) {
            snprintf(path, sizeof path, "%s/logits_kv_f16.npy", refdir);
            if (flash && n >= 16 && !access(path, R_OK)) {
                /* the flash prefill: its own bar, against K/V rounded as it rounds them */
                against(name, "transformers, K/V as f16", refdir, "logits_kv_f16.npy", g, c, n, V, TOL_FLASH);
                against(name, "transformers f32", refdir, "logits.npy", g, c, n, V, TOL_FLASH);
            } else {
                against(name, f32 ? "transformers f32" : "transformers f32 math on the 16-bit weights", refdir, "logits.npy", g, c,
                        n, V, f32 ? TOL_F32 : TOL_16_F32);
                if (!f32) against(name, "transformers native 16-bit", refdir, "logits_native.npy", g, c, n, V, TOL_16_NAT);
            }
            double ec = golden_rel_err(g, c, (size_t)n * V), tc = flash && n >= 16 ? TOL_FLASH : f32 ? TOL_F32 : TOL_16_CPU;
            CHECK(ec <= tc, "%s: cuda vs cpu backend: %.2e of range (tol %.3g)", name, ec, tc);
            /* decode runs the GEMV on f32 activations; prefill of 16-bit weights rounds them for cuBLAS */
            check_decode(name, mg, ids, n, V, g, flash && n >= 16 ? TOL_FLASH_DEC : f32 ? TOL_DEC_F32 : TOL_DEC_16);
            check_padded(name, mg, ids, n, V, g, flash && n >= 16 ? TOL_FLASH_PAD : TOL_PAD);
            check_batch(name, mg, ids, n, V, f32 ? 1e-4 : 1.5e-2);
        }
        free(g); free(c);
    }
    json_decref(ref);
    cinfer_model_free(mg);
    cinfer_model_free(mc);
}

typedef struct toks { int32_t t[256]; int n, stop_at; } toks;
static int collect(int32_t tok, const char *text, void *user) {
    (void)text;
    toks *k = user;
    if (tok >= 0 && k->n < 256) k->t[k->n++] = tok;
    return k->stop_at > 0 && k->n >= k->stop_at;   /* stop_at > 0: the callback ends the generation there */
}

static void stories(const char *models) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/stories260k", models);
    const char *refdir = "tests/fixtures/models/stories260k-ref";
    char path[512];
    snprintf(path, sizeof path, "%s/reference.json", refdir);
    json_t *ref = json_load_file(path, 0, NULL);
    cinfer_model *mg = golden_load(dir, "cuda", 0), *mc = golden_load(dir, "cpu", 0);
    CHECK(ref && mg && mc, "stories260k: reference and model load from %s", dir);
    if (!(ref && mg && mc)) goto out;
    cinfer_model_info info;
    cinfer_model_get_info(mg, &info);
    int V = info.n_vocab;
    int32_t ids[128];
    int n = golden_ids(json_object_get(ref, "tokens"), ids, 64);
    float *g = golden_eval_all(mg, ids, n, V), *hf = golden_read_npy(refdir, "logits.npy", n, V);
    if (g && hf) {
        double e = golden_rel_err(g, hf, (size_t)n * V);
        CHECK(e <= TOL_F32, "stories260k: cuda logits vs transformers: %.2e of range (tol %.3g; achieved 4.3e-7)", e, TOL_F32);
    } else CHECK(0, "stories260k: logits");
    free(g); free(hf);
    /* greedy generation: the same tokens and text as the CPU */
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(mc);
    int32_t *prompt = NULL;
    int np = 0;
    const char *text = "Once upon a time, there was a little girl named Lily.";
    if (!tk || cinfer_tokenize(tk, text, strlen(text), 1, 0, &prompt, &np)) { CHECK(0, "stories260k: tokenizer"); goto out; }
    toks tg = {0}, tc = {0};
    cinfer_sampler_params sp = cinfer_sampler_defaults();
    cinfer_ctx *cg = NULL, *cc = NULL;
    char err[256];
    cinfer_gen_stats sg, sc;
    int ok = !cinfer_ctx_new(mg, NULL, &cg, err, sizeof err) && !cinfer_ctx_new(mc, NULL, &cc, err, sizeof err);
    ok = ok && !cinfer_generate(cg, prompt, np, &sp, 200, collect, &tg, &sg) && !cinfer_generate(cc, prompt, np, &sp, 200, collect, &tc, &sc);
    char *s1 = NULL, *s2 = NULL;
    if (ok) { cinfer_detokenize(tk, tg.t, tg.n, 1, &s1); cinfer_detokenize(tk, tc.t, tc.n, 1, &s2); }
    int same = ok && tg.n == tc.n && !memcmp(tg.t, tc.t, sizeof(int32_t) * tg.n) && s1 && s2 && !strcmp(s1, s2);
    CHECK(same, "stories260k: greedy text on cuda identical to cpu (%d vs %d tokens)", tg.n, tc.n);
    if (s1) printf("# cuda: %s\n", s1);
    if (!same && s2) printf("# cpu:  %s\n", s2);
    /* the cache after it (CUDA chains greedy steps and drops one issued past the end), then more on top of it:
     * 12 tokens (ended by the count), the same positions and tokens as the CPU */
    int pg = ok ? cinfer_ctx_pos(cg) : -1, pc = ok ? cinfer_ctx_pos(cc) : -2;
    toks tg2 = {0}, tc2 = {0};
    int ok2 = ok && !cinfer_generate(cg, prompt, np, &sp, 12, collect, &tg2, NULL) && !cinfer_generate(cc, prompt, np, &sp, 12, collect, &tc2, NULL);
    int same2 = ok2 && tg2.n == tc2.n && !memcmp(tg2.t, tc2.t, sizeof(int32_t) * tg2.n) && cinfer_ctx_pos(cg) == cinfer_ctx_pos(cc);
    CHECK(pg == pc && same2, "stories260k: positions after generating equal the CPU's (%d vs %d, %s), and 12 more tokens on top: %s (%d vs %d tokens)",
          pg, pc, sg.stopped_by_eos ? "ended by EOS" : "ended by the count", same2 ? "same" : "DIFFERENT", tg2.n, tc2.n);
    /* a callback that stops at the 7th token: CUDA has issued the step after it and must drop it */
    toks tg3 = {0}, tc3 = {0};
    tg3.stop_at = tc3.stop_at = 7;
    int ok3 = ok2 && !cinfer_generate(cg, prompt, np, &sp, 50, collect, &tg3, NULL) && !cinfer_generate(cc, prompt, np, &sp, 50, collect, &tc3, NULL);
    int pg3 = ok3 ? cinfer_ctx_pos(cg) : -1, pc3 = ok3 ? cinfer_ctx_pos(cc) : -2;
    toks tg4 = {0}, tc4 = {0};
    int ok4 = ok3 && !cinfer_generate(cg, prompt, np, &sp, 12, collect, &tg4, NULL) && !cinfer_generate(cc, prompt, np, &sp, 12, collect, &tc4, NULL);
    int same4 = ok4 && tg3.n == 7 && tc3.n == 7 && !memcmp(tg3.t, tc3.t, sizeof(int32_t) * 7) && tg4.n == tc4.n &&
                !memcmp(tg4.t, tc4.t, sizeof(int32_t) * tg4.n) && cinfer_ctx_pos(cg) == cinfer_ctx_pos(cc);
    CHECK(pg3 == pc3 && same4, "stories260k: a generation stopped by its callback at 7 tokens leaves the CPU's positions (%d vs %d), "
          "and 12 more on top: %s", pg3, pc3, same4 ? "same" : "DIFFERENT");
    long caps = 0, reps = 0;
    if (cg) cuda_graph_stats(cg->bc, &caps, &reps);
    printf("# stories260k decode: %d tokens, graph captured %ld, replayed %ld\n", tg.n, caps, reps);
    free(s1); free(s2); free(prompt);
    cinfer_ctx_free(cg);
    cinfer_ctx_free(cc);
out:
    json_decref(ref);
    cinfer_model_free(mg);
    cinfer_model_free(mc);
}

/* KL of one tiny bf16 model against another (both LM heads folded into the score op on CUDA): the
 * two forwards side by side on two streams (the default: the base's issued first, ordered after the
 * model's last score; CINFER_KL_BASE_FIRST=0: the model's first) give the very statistics of
 * CINFER_KL_DEFER=0's one-after-the-other, and all are the CPU's within the bf16 activations' bars */
static int kl_run(const char *dev, const char *mdir, const char *bdir, const int32_t *rows, int n_rows, int L,
                  cinfer_kl_stats *o) {
    cinfer_model *mm = golden_load(mdir, dev, 0), *mb = golden_load(bdir, dev, 0);
    cinfer_ctx *cm = NULL, *cb = NULL;
    char err[256] = "";
    int ok = mm && mb && !cinfer_ctx_new(mm, NULL, &cm, err, sizeof err) && !cinfer_ctx_new(mb, NULL, &cb, err, sizeof err) &&
             !cinfer_kl(cm, cb, NULL, rows, n_rows, L, 3, NULL, NULL, NULL, o, err, sizeof err);
    if (!ok) printf("# kl on %s: %s\n", dev, err);
    cinfer_ctx_free(cm); cinfer_ctx_free(cb);
    cinfer_model_free(mm); cinfer_model_free(mb);
    return ok;
}

static void kl_case(void) {
    const char *md = "tests/fixtures/models/qwen2-bf16", *bd = "tests/fixtures/models/llama-tied-bf16";
    enum { NR = 7, L = 48 };
    int32_t rows[NR * L];
    uint32_t x = 12345;
    for (int i = 0; i < NR * L; i++) { x = x * 1664525u + 1013904223u; rows[i] = (int32_t)((x >> 8) % 256); }
    cinfer_kl_stats d, m, s, c;
    int ok = kl_run("cuda", md, bd, rows, NR, L, &d);
    setenv("CINFER_KL_BASE_FIRST", "0", 1);
    ok = ok && kl_run("cuda", md, bd, rows, NR, L, &m);
    unsetenv("CINFER_KL_BASE_FIRST");
    setenv("CINFER_KL_DEFER", "0", 1);
    ok = ok && kl_run("cuda", md, bd, rows, NR, L, &s);
    unsetenv("CINFER_KL_DEFER");
    ok = ok && kl_run("cpu", md, bd, rows, NR, L, &c);
    for (int v = 0; v < 2; v++) {
        const cinfer_kl_stats *e = v ? &m : &d;
        CHECK(ok && e->tokens == s.tokens && e->mean_kld == s.mean_kld && e->ppl_model == s.ppl_model && e->ppl_base == s.ppl_base &&
                  e->same_top == s.same_top && e->kld_q[0] == s.kld_q[0],
              "kl qwen2-bf16 vs llama-tied-bf16 on cuda: the forwards side by side (%s first) give the statistics of one after "
              "the other (mean KLD %.9g vs %.9g, PPL(Q) %.9g vs %.9g)", v ? "the model's" : "the base's", e->mean_kld, s.mean_kld,
              e->ppl_model, s.ppl_model);
    }
    CHECK(ok && d.tokens == c.tokens && fabs(d.mean_kld - c.mean_kld) <= 1e-2 * c.mean_kld &&
          fabs(d.ppl_model - c.ppl_model) <= 1e-3 * c.ppl_model && fabs(d.ppl_base - c.ppl_base) <= 1e-3 * c.ppl_base &&
          fabs(d.same_top - c.same_top) <= 0.02,
          "kl qwen2-bf16 vs llama-tied-bf16: cuda vs cpu: mean KLD %.6g vs %.6g, PPL(Q) %.6g vs %.6g, PPL(base) %.6g vs %.6g, "
          "same top %.4f vs %.4f", d.mean_kld, c.mean_kld, d.ppl_model, c.ppl_model, d.ppl_base, c.ppl_base, d.same_top, c.same_top);
}

int main(int argc, char **argv) {
    const char *tiny[] = {"llama-f32", "llama-tied-bf16", "llama-f16", "llama3-rope-f32", "llama-linear-f32",
                          "llama-sharded-f32", "mistral-f32", "qwen2-f32", "qwen2-bf16", "qwen3-f32", "qwen3-bf16",
                          "llama-long-f32", "mistral-window4-f32", "mistral-window-long-f32"};
    char dir[512];
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", tiny[i]);
        model_case(tiny[i], dir, dir);
    }
    const char *models = argc > 1 ? argv[1] : "../shared/models";
    snprintf(dir, sizeof dir, "%s/prose-13m", models);   /* real bf16 weights in two shards */
    model_case("prose-13m", "tests/fixtures/models/prose13m-ref", dir);
    stories(models);
    kl_case();
    return CHECK_DONE();
}
