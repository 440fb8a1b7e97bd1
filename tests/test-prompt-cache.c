/*
 * test-prompt-cache.c — mlx-lm prompt-cache files against the reference
 * files mlx-lm wrote (../shared/reference/mlx/promptcache/, from prose-13m,
 * bf16 K/V of 32 prefilled ids): they load; greedy generation continuing
 * from the file equals generation from the uncached prompt while the top-two
 * margin exceeds bf16 rounding, log-probs within 1e-2; the K/V cinfer
 * computes for the same ids match the file's to bf16 precision (layout:
 * heads, positions, RoPE). Files cinfer writes load back exactly (full and
 * rotating caches, a wrapped ring written in mlx-lm's physical order), carry
 * mlx-lm's names (checked by tests/reference/read_prompt_cache.py, a reader
 * that follows load_prompt_cache), and every refusal names its reason. A
 * mutation fuzz of the reference file never crashes the reader.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "io/safetensors.h"
#include "util.h"

static const int32_t IDS[32] = {1, 450, 29871, 1576, 310, 263, 2217, 1058, 338, 3117, 29892, 322, 278, 471, 263, 1243,
                                29889, 13, 1576, 2462, 338, 4549, 29892, 322, 278, 15489, 526, 1250, 701, 297, 278, 14744};

static cinfer_ctx *new_ctx(cinfer_model *m, const char *dt, int max_kv) {
    cinfer_ctx_opts o = {0};
    o.kv_dtype = dt;
    o.max_seqs = 4;
    o.kv_memory = 64u << 20;
    o.kv_page = 16;
    o.max_kv_size = max_kv;
    cinfer_ctx *c = NULL;
    char err[512];
    if (cinfer_ctx_new(m, &o, &c, err, sizeof err)) printf("# ctx: %s\n", err);
    return c;
}

static int argmax(const float *x, int n, float *margin, float *lp) {
    int a = 0, b = -1;
    for (int i = 1; i < n; i++) if (x[i] > x[a]) a = i;
    for (int i = 0; i < n; i++) if (i != a && (b < 0 || x[i] > x[b])) b = i;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - x[a]);
    *margin = x[a] - x[b];
    *lp = (float)(-log(s));
    return a;
}

/* greedy continuation of ctx (seq 0) after feeding ids[n]: tokens, their log-probs and margins */
static int greedy(cinfer_ctx *c, const int32_t *ids, int n, int steps, int V, int32_t *tok, float *lp, float *mg) {
    float *lg = malloc(sizeof(float) * V);
    int32_t cur[64];
    memcpy(cur, ids, sizeof *ids * n);
    int ok = 1;
    for (int s = 0; s < steps && ok; s++) {
        ok = !cinfer_eval(c, cur, n, 0, lg);
        tok[s] = cur[0] = argmax(lg, V, &mg[s], &lp[s]);
        n = 1;
    }
    free(lg);
    return ok;
}

static int same_snap(cinfer_ctx *a, int sa, cinfer_ctx *b, int sb) {
    cinfer_snapshot *x = NULL, *y = NULL;
    int same = !cinfer_seq_snapshot(a, sa, &x) && !cinfer_seq_snapshot(b, sb, &y) && x->n_tensors == y->n_tensors &&
               !strcmp(x->header, y->header);
    for (int i = 0; same && i < x->n_tensors; i++)
        same = x->tensors[i].bytes == y->tensors[i].bytes && !memcmp(x->tensors[i].data, y->tensors[i].data, x->tensors[i].bytes);
    cinfer_snapshot_free(x);
    cinfer_snapshot_free(y);
    return same;
}

static float bf16f(const uint16_t *p, size_t i) { uint32_t u = (uint32_t)p[i] << 16; float f; memcpy(&f, &u, 4); return f; }

static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }

/* log-prob of the greedy token after the 3-id suffix, with seq 0 restored from s */
static double first_lp(cinfer_ctx *c, const cinfer_snapshot *s, int V, int32_t want) {
    float *lg = malloc(sizeof(float) * V), mg, lp;
    int32_t suffix[3] = {278, 2217, 1058};
    int ok = !cinfer_seq_restore(c, 0, s) && !cinfer_eval(c, suffix, 3, 0, lg);
    argmax(lg, V, &mg, &lp);
    double z = 0, mx = lg[0];
    for (int i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < V; i++) z += exp((double)lg[i] - mx);
    double r = ok ? lg[want] - mx - log(z) : NAN;
    free(lg);
    return r;
}

/* The floor of the interop comparison. MLX computed the file's K/V with bf16 activations; cinfer's forward
 * is f32. Their difference (rms 0.45% of the values: ~2 bf16 ulps) moves the first log-prob after the cache
 * by ~1e-2. Gaussian noise of that rms per tensor, added to cinfer's own bf16 K/V, moves it as much: the
 * file's deviation must lie within that spread (a loader that misplaced heads or positions would be far out). */
static void test_noise_floor(cinfer_model *m, const char *path, int V) {
    cinfer_ctx *c = new_ctx(m, "bf16", 0);
    cinfer_snapshot *own = NULL, *file = NULL, *var = NULL;
    int ok = c && !cinfer_eval(c, IDS, 32, 0, NULL) && !cinfer_seq_snapshot(c, 0, &own) &&
             !cinfer_prompt_cache_load(c, 0, path, NULL, NULL) && !cinfer_seq_snapshot(c, 0, &file) && !cinfer_seq_snapshot(c, 0, &var);
    int32_t suffix[3] = {278, 2217, 1058}, full[35], tok = 0;
    memcpy(full, IDS, sizeof IDS);
    memcpy(full + 32, suffix, sizeof suffix);
    float *lg = malloc(sizeof(float) * V), mg, lp;
    if (ok) { cinfer_ctx_reset(c); ok = !cinfer_eval(c, full, 35, 0, lg); tok = argmax(lg, V, &mg, &lp); }
    free(lg);
    double base = ok ? first_lp(c, own, V, tok) : NAN, dfile = ok ? fabs(first_lp(c, file, V, tok) - base) : NAN;
    enum { DRAWS = 20 };
    double d[DRAWS], sd = 0, so = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int r = 0; ok && r < DRAWS; r++) {
        for (int i = 0; i < own->n_tensors; i++) {
            const uint16_t *a = own->tensors[i].data, *b = file->tensors[i].data;
            uint16_t *o = var->tensors[i].data;
            size_t n = own->tensors[i].bytes / 2;
            double s2 = 0;
            for (size_t j = 0; j < n; j++) {
                double x = bf16f(b, j) - bf16f(a, j);
                s2 += x * x;
                if (!r) sd += x * x, so += (double)bf16f(a, j) * bf16f(a, j);
            }
            double rms = sqrt(s2 / (double)n);
            for (size_t j = 0; j < n; j++) {   /* Box-Muller on a xorshift stream */
                double u[2];
                for (int k = 0; k < 2; k++) {
                    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
                    u[k] = ((rng >> 11) + 0.5) / 9007199254740992.0;
                }
                o[j] = f2bf((float)(bf16f(a, j) + rms * sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1])));
            }
        }
        d[r] = fabs(first_lp(c, var, V, tok) - base);
    }
    double mx = 0, mean = 0;
    for (int r = 0; ok && r < DRAWS; r++) { mx = d[r] > mx ? d[r] : mx; mean += d[r] / DRAWS; }
    CHECK(ok && dfile <= mx, "the file's first-token log-prob deviation %.4f lies within what bf16-level noise of the same "
          "rms (%.2f%% of the K/V) gives cinfer's own K/V: mean %.4f, max %.4f over %d draws", dfile, 100 * sqrt(sd / so), mean, mx, DRAWS);
    cinfer_snapshot_free(own);
    cinfer_snapshot_free(file);
    cinfer_snapshot_free(var);
    cinfer_ctx_free(c);
}

/* greedy continuation of IDS + 3 tokens from a loaded file (context c, the file's 32 tokens in sequence 0)
 * against the uncached prompt in u: one forward of all 35 ids, or (split) the file's 32 ids first, as the
 * file was made, then the 3 */
static void continuation(cinfer_ctx *c, cinfer_ctx *u, int V, const char *what, int split, double max_bar) {
    enum { STEPS = 24 };
    int32_t tc[STEPS], tu[STEPS], suffix[3] = {278, 2217, 1058};
    float lc[STEPS], lu[STEPS], mc[STEPS], mu[STEPS];
    cinfer_ctx_reset(u);
    int32_t full[35];
    memcpy(full, IDS, sizeof IDS);
    memcpy(full + 32, suffix, sizeof suffix);
    int ok = greedy(c, suffix, 3, STEPS, V, tc, lc, mc) && (!split || !cinfer_eval(u, IDS, 32, 0, NULL)) &&
             greedy(u, split ? suffix : full, split ? 3 : 35, STEPS, V, tu, lu, mu);
    int same = 0;
    float dlp = 0, sum = 0;
    for (int i = 0; getenv("PC_DEBUG") && i < STEPS; i++) printf("# step %d: %d %d lp %.5f %.5f margin %.3f\n", i, tc[i], tu[i], lc[i], lu[i], mu[i]);
    while (ok && same < STEPS && tc[same] == tu[same]) {
        if (fabsf(lc[same] - lu[same]) > dlp) dlp = fabsf(lc[same] - lu[same]);
        sum += fabsf(lc[same] - lu[same]);
        same++;
    }
    /* a divergence is allowed only where the uncached run's top two are within bf16 rounding */
    int fair = same == STEPS || mu[same] < 0.05f;
    CHECK(ok && fair && same >= 8, "greedy from %s == from the uncached prompt: %d/%d tokens equal%s", what, same, STEPS,
          same < STEPS ? " (then a top-two tie within bf16 rounding)" : "");
    /* MLX computed the file's K/V with bf16 activations, which moves them by ~1% of their range against
     * cinfer's f32 forward (the K/V check above): the first token after the cache sees that whole
     * difference; measured 1.08e-2 there, <= 7.5e-3 at every later step. Both sides hold bf16 K/V here
     * (dt), so storage rounding is common to both; what is left is MLX's bf16 activations, which cinfer
     * does not emulate. test_noise_floor shows 1.08e-2 is what K/V noise of that size does. */
    CHECK(ok && same && sum / same < 1e-2 && dlp < max_bar, "%s: chosen-token log-probs: mean |diff| %.3g (< 1e-2), max %.3g "
          "(< %.0e)", what, same ? sum / same : 0.0, dlp, max_bar);
}

static void test_reference(cinfer_model *m, const char *ref) {
    cinfer_model_info mi;
    cinfer_model_get_info(m, &mi);
    char path[2048];
    snprintf(path, sizeof path, "%s/kv_bf16.safetensors", ref);
    const char *dt = getenv("PC_DT") ? getenv("PC_DT") : "bf16";
    cinfer_ctx *c = new_ctx(m, dt, 0), *u = new_ctx(m, dt, 0);
    char *meta = NULL;
    int fp = -1;
    cinfer_status st = cinfer_prompt_cache_load(c, 0, path, &meta, &fp);
    CHECK(!st && cinfer_seq_len(c, 0) == 32, "mlx-lm's kv_bf16 file loads: %d tokens (%s)", cinfer_seq_len(c, 0), st ? cinfer_ctx_error(c) : "ok");
    CHECK(fp == 0 && meta && strstr(meta, "\"model\":\"prose-13m\""), "its user metadata comes back, no cinfer fingerprint: %s", meta ? meta : "-");
    free(meta);
    /* K/V cinfer computes for the same ids against the file's, to bf16 precision */
    CHECK(!cinfer_eval(u, IDS, 32, 0, NULL), "uncached prefill");
    cinfer_snapshot *s = NULL;
    st_set ss = {0};
    char err[256];
    if (strcmp(dt, "bf16")) printf("# K/V comparison skipped (needs a bf16 cache)\n");
    else if (!cinfer_seq_snapshot(u, 0, &s) && !st_open_file(path, &ss, err, sizeof err)) {
        double worst = 0;
        for (int i = 0; i < s->n_tensors; i++) {
            const st_tensor *t = st_find(&ss, s->tensors[i].name);
            double mx = 0, md = 0;
            for (size_t j = 0; t && j < s->tensors[i].bytes / 2; j++) {
                float a = bf16f(t->data, j), b = bf16f(s->tensors[i].data, j);
                if (fabsf(a) > mx) mx = fabsf(a);
                if (fabsf(a - b) > md) md = fabsf(a - b);
            }
            if (!t) md = 1e9;
            if (md / (mx + 1e-9) > worst) worst = md / (mx + 1e-9);
        }
        CHECK(worst < 0.02, "cinfer's own K/V for the 32 ids match mlx-lm's file: max |diff| / max |K or V| = %.4g per tensor", worst);
    } else CHECK(0, "snapshot / open the reference: %s", err);
    cinfer_snapshot_free(s);
    st_close(&ss);
    continuation(c, u, mi.n_vocab, "mlx-lm's kv_bf16 file", 0, 2e-2);
    /* in the precision mlx-lm wrote the file with (a bf16 model: bf16 activations into the matmuls,
     * CINFER_BF16_ACT=1, emulated where the CPU lacks AVX-512 BF16) the uncached prompt's K/V come out
     * as MLX's do, and the continuation meets the bar on every step: measured max 5.2e-3
     * (2026-12-02, AVX-512 BF16 host), against 1.08e-2 with cinfer's default f32 activations above */
    setenv("CINFER_BF16_ACT", "1", 1);
    cinfer_seq_trim(c, 0, 32);   /* back to the file's 32 tokens */
    continuation(c, u, mi.n_vocab, "mlx-lm's kv_bf16 file, bf16 activations (CINFER_BF16_ACT=1)", 0, 1e-2);
    unsetenv("CINFER_BF16_ACT");
    if (!strcmp(dt, "bf16")) test_noise_floor(m, path, mi.n_vocab);
    /* the quantized file: refused by an unquantized context, naming the flags; a context of its scheme
     * takes MLX's triples byte for byte (a snapshot of the loaded sequence holds the file's tensors) */
    snprintf(path, sizeof path, "%s/kv_q8g64.safetensors", ref);
    st = cinfer_prompt_cache_load(c, 0, path, NULL, NULL);
    CHECK(st == CINFER_EFORMAT && strstr(cinfer_ctx_error(c), "QuantizedKVCache of 8 bits, group 64") &&
          strstr(cinfer_ctx_error(c), "--kv-bits 8 --kv-group-size 64") && cinfer_seq_len(c, 0) == 0,
          "QuantizedKVCache file into an unquantized context refused: %s", cinfer_ctx_error(c));
    cinfer_ctx_opts qo = {.kv_dtype = dt, .kv_bits = 8, .kv_group_size = 64, .quantized_kv_start = 5000};
    cinfer_ctx *q = NULL;
    int same_bytes = 0, n_t = 0;
    if (!cinfer_ctx_new(m, &qo, &q, err, sizeof err) && !cinfer_prompt_cache_load(q, 0, path, NULL, NULL) &&
        !cinfer_seq_snapshot(q, 0, &s) && !st_open_file(path, &ss, err, sizeof err)) {
        n_t = s->n_tensors;
        for (int i = 0; i < s->n_tensors; i++) {
            const st_tensor *t = st_find(&ss, s->tensors[i].name);
            same_bytes += t && t->nbytes == s->tensors[i].bytes && !memcmp(t->data, s->tensors[i].data, t->nbytes);
        }
    }
    CHECK(!strcmp(dt, "f32") || (n_t == 36 && same_bytes == 36), "%s context, kv_bits 8 group 64 (start 5000: the layers "
          "convert at load): mlx-lm's QuantizedKVCache loads, %d of %d tensors byte-identical in a snapshot", dt, same_bytes, n_t);
    cinfer_snapshot_free(s);
    s = NULL;
    st_close(&ss);
    /* and continues as the uncached prompt does under --kv-bits 8 --quantized-kv-start 0 fed as the file was
     * made (the 32 ids attend unquantized, the cache converts, then the rest) */
    cinfer_ctx_opts uo = qo;
    uo.quantized_kv_start = 0;
    cinfer_ctx *u8 = NULL;
    if (q && cinfer_seq_len(q, 0) == 32 && !cinfer_ctx_new(m, &uo, &u8, err, sizeof err))
        /* MLX's K/V differ from cinfer's by its bf16 activations (~1% of their range, above), which at 8 bits
         * is a different code for ~25% of the bytes (MLX's CPU rounding rule adds its own); such code
         * differences cascade through later steps (tests/test-kvquant-ref.c measures the cascade of a single
         * flip against the NumPy reference), so the bar on a single step is that test's 5e-2 for log-probs
         * read through codes. Measured: mean 6.0e-3, max 4.2e-2 (one step, a newline). */
        continuation(q, u8, mi.n_vocab, "mlx-lm's kv_q8g64 file (QuantizedKVCache)", 1, 5e-2);
    else CHECK(0, "kv_q8g64 continuation: %s", q ? cinfer_ctx_error(q) : err);
    cinfer_ctx_free(u8);
    cinfer_ctx_free(q);
    cinfer_ctx_free(c);
    cinfer_ctx_free(u);
}

/* cinfer writes, cinfer and mlx-lm's rules read back */
static void test_roundtrip(cinfer_model *m, const char *dir) {
    char path[2048], cmd[4400];
    snprintf(path, sizeof path, "%s/pc-full.safetensors", dir);
    cinfer_ctx *c = new_ctx(m, "f32", 0);
    CHECK(!cinfer_eval(c, IDS, 32, 0, NULL), "prefill 32");
    cinfer_status st = cinfer_prompt_cache_save(c, 0, path, "{\"model\":\"prose-13m\",\"tokenizer_config\":\"{}\"}", IDS, 32);
    CHECK(!st, "save a KVCache file (%s)", st ? cinfer_ctx_error(c) : "ok");
    char *meta = NULL;
    int fp = 0;
    st = cinfer_prompt_cache_load(c, 1, path, &meta, &fp);
    CHECK(!st && fp == 1 && same_snap(c, 0, c, 1), "it loads back exactly, fingerprint checked (%s)", st ? cinfer_ctx_error(c) : "ok");
    CHECK(meta && strstr(meta, "\"cinfer_tokens\":\"[1,450,") && strstr(meta, "\"tokenizer_config\":\"{}\""), "user metadata kept: %.80s", meta ? meta : "-");
    free(meta);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/read_prompt_cache.py %s KVCache 32 2>&1", path);
    if (!access("/usr/bin/python3", X_OK)) CHECK(system(cmd) == 0, "read as mlx-lm's load_prompt_cache would: %s", cmd);
    /* into an f16 context: converted */
    cinfer_ctx *h = new_ctx(m, "f16", 0);
    CHECK(!cinfer_prompt_cache_load(h, 0, path, NULL, NULL) && cinfer_seq_len(h, 0) == 32, "an f32 file loads into an f16 cache");
    /* refusals */
    cinfer_ctx *r = new_ctx(m, "f32", 64);
    st = cinfer_prompt_cache_load(r, 0, path, NULL, NULL);
    CHECK(st == CINFER_EFORMAT && strstr(cinfer_ctx_error(r), "max-kv-size"), "full cache into a --max-kv-size context refused: %s", cinfer_ctx_error(r));
    /* rotating: wrap the window with single-token steps, save, load back */
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = IDS[i % 32] + i;
    CHECK(!cinfer_eval(r, ids, 40, 0, NULL), "rotating prefill");
    for (int i = 40; i < 100; i++) cinfer_eval(r, ids + i, 1, 0, NULL);
    snprintf(path, sizeof path, "%s/pc-rot.safetensors", dir);
    st = cinfer_prompt_cache_save(r, 0, path, NULL, ids, 100);
    st = st ? st : cinfer_prompt_cache_load(r, 1, path, NULL, NULL);
    CHECK(!st && cinfer_seq_len(r, 1) == 100, "a wrapped RotatingKVCache(64, keep 4) saves and loads back (%s)", st ? cinfer_ctx_error(r) : "ok");
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/read_prompt_cache.py %s RotatingKVCache 100 2>&1", path);
    if (!access("/usr/bin/python3", X_OK)) CHECK(system(cmd) == 0, "rotating file read as mlx-lm would: %s", cmd);
    float *a = malloc(sizeof(float) * 32000), *b = malloc(sizeof(float) * 32000);
    int32_t nx = 777;
    cinfer_seq_fork(r, 1, 0);   /* continue from the restored copy and compare with a fresh one */
    cinfer_ctx *r2 = new_ctx(m, "f32", 64);
    cinfer_prompt_cache_load(r2, 0, path, NULL, NULL);
    CHECK(!cinfer_eval(r, &nx, 1, 0, a) && !cinfer_eval(r2, &nx, 1, 0, b) && !memcmp(a, b, sizeof(float) * 32000),
          "continuations from the file are identical");
    cinfer_seq_free(r, 0);
    cinfer_eval(r, ids, 40, 0, NULL);   /* the live ring itself, fed the same way */
    for (int i = 40; i < 100; i++) cinfer_eval(r, ids + i, 1, 0, NULL);
    CHECK(!cinfer_eval(r, &nx, 1, 0, a) && !memcmp(a, b, sizeof(float) * 32000), "... and equal the live cache's continuation");
    /* a ring in mlx-lm's physical order (_idx inside the buffer) reads back in temporal order */
    cinfer_snapshot *s = NULL;
    cinfer_prompt_cache_load(r2, 0, path, NULL, NULL);
    if (!cinfer_seq_snapshot(r2, 0, &s)) {
        int T = (int)s->tensors[0].shape[2], nl = s->n_tensors / 2, idx = 4 + 13;   /* ring written 13 past keep */
        st_wtensor *wt = calloc((size_t)s->n_tensors, sizeof *wt);
        char **bufs = calloc((size_t)s->n_tensors, sizeof *bufs), mj[4096];
        int o = snprintf(mj, sizeof mj, "{");
        for (int l = 0; l < nl; l++)
            o += snprintf(mj + o, sizeof mj - o, "\"0.%d.0\":\"4\",\"0.%d.1\":\"64\",\"0.%d.2\":\"100\",\"0.%d.3\":\"%d\",", l, l, l, l, idx);
        for (int l = 0; l < nl; l++) o += snprintf(mj + o, sizeof mj - o, "%s\"2.%d\":\"RotatingKVCache\"", l ? "," : "", l);
        snprintf(mj + o, sizeof mj - o, "}");
        for (int i = 0; i < s->n_tensors; i++) {   /* temporal [keep | oldest .. newest] -> ring */
            cinfer_tensor *t = &s->tensors[i];
            size_t row = (size_t)t->shape[3] * 4, W = (size_t)T - 4, shift = (size_t)(idx - 4);
            bufs[i] = malloc(t->bytes);
            for (int64_t hh = 0; hh < t->shape[1]; hh++) {
                const char *src = (char *)t->data + hh * T * row;
                char *dst = bufs[i] + hh * T * row;
                memcpy(dst, src, 4 * row);
                for (size_t j = 0; j < W; j++) memcpy(dst + (4 + (j + shift) % W) * row, src + (4 + j) * row, row);
            }
            wt[i] = (st_wtensor){t->name, "F32", 4, t->shape, bufs[i], t->bytes};
        }
        void *img = NULL;
        size_t len = 0;
        char err[256];
        st = st_write_mem(wt, s->n_tensors, mj, &img, &len, err, sizeof err);
        st = st ? st : cinfer_prompt_cache_decode(r2, 1, img, len, NULL, NULL);
        CHECK(!st && same_snap(r2, 0, r2, 1), "a wrapped ring in mlx-lm's physical order (_idx %d) restores in temporal order (%s)", idx,
              st ? cinfer_ctx_error(r2) : "ok");
        for (int i = 0; i < s->n_tensors; i++) free(bufs[i]);
        free(bufs);
        free(wt);
        free(img);
    }
    cinfer_snapshot_free(s);
    free(a);
    free(b);
    cinfer_ctx_free(r2);
    cinfer_ctx_free(c);
    cinfer_ctx_free(h);
    cinfer_ctx_free(r);
}

/* a model whose shapes match but whose fingerprint differs, and one of other shapes */
static void test_refusals(cinfer_model *m, const char *dir, const char *shared) {
    char path[2048], mdir[600], cmd[8192];
    snprintf(path, sizeof path, "%s/pc-full.safetensors", dir);
    snprintf(mdir, sizeof mdir, "%s/other-model", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && for f in %s/models/prose-13m/*; do ln -sf $(realpath $f) %s/; done && rm %s/config.json && "
             "sed 's/\"rms_norm_eps\": 1e-05/\"rms_norm_eps\": 1.1e-05/' %s/models/prose-13m/config.json > %s/config.json",
             mdir, shared, mdir, mdir, shared, mdir);
    CHECK(system(cmd) == 0, "a look-alike model dir (same shapes, another config)");
    cinfer_model *o = NULL;
    char err[512];
    if (!cinfer_model_load(mdir, NULL, &o, err, sizeof err)) {
        cinfer_ctx *c = new_ctx(o, "f32", 0);
        cinfer_status st = cinfer_prompt_cache_load(c, 0, path, NULL, NULL);
        CHECK(st == CINFER_EFORMAT && strstr(cinfer_ctx_error(c), "another model"), "fingerprint mismatch refused: %s", cinfer_ctx_error(c));
        cinfer_ctx_free(c);
        cinfer_model_free(o);
    } else CHECK(0, "load the look-alike: %s", err);
    /* weights alone differ (one byte of the last tensor, as any fine-tune moves its weights) */
    snprintf(mdir, sizeof mdir, "%s/tuned-model", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && for f in %s/models/prose-13m/*; do ln -sf $(realpath $f) %s/; done && "
             "f=%s/model-00002-of-00002.safetensors && cp --remove-destination $(realpath $f) $f && chmod u+w $f && "
             "n=$(stat -c %%s $f) && printf '\\177' | dd of=$f bs=1 seek=$((n - 1)) conv=notrunc 2>/dev/null",
             mdir, shared, mdir, mdir);
    CHECK(system(cmd) == 0, "a model dir whose last weight byte differs");
    char fa[33] = "", fb[33] = "";
    if (!cinfer_model_load(mdir, NULL, &o, err, sizeof err)) {
        cinfer_ctx *c = new_ctx(o, "f32", 0);
        cinfer_status st = cinfer_prompt_cache_load(c, 0, path, NULL, NULL);
        cinfer_model_fingerprint(m, fa);
        cinfer_model_fingerprint(o, fb);
        CHECK(strcmp(fa, fb) && st == CINFER_EFORMAT && strstr(cinfer_ctx_error(c), "another model"),
              "a one-byte weight change moves the fingerprint (%.8s vs %.8s) and the file is refused", fa, fb);
        cinfer_ctx_free(c);
        cinfer_model_free(o);
    } else CHECK(0, "load the tuned model: %s", err);
    snprintf(mdir, sizeof mdir, "%s/models/stories260k", shared);
    if (!cinfer_model_load(mdir, NULL, &o, err, sizeof err)) {
        cinfer_ctx *c = new_ctx(o, "f32", 0);
        snprintf(path, sizeof path, "%s/reference/mlx/promptcache/kv_bf16.safetensors", shared);
        cinfer_status st = cinfer_prompt_cache_load(c, 0, path, NULL, NULL);
        CHECK(st == CINFER_EFORMAT && strstr(cinfer_ctx_error(c), "layers"), "prose-13m's file into stories260k refused: %s", cinfer_ctx_error(c));
        cinfer_ctx_free(c);
        cinfer_model_free(o);
    }
    (void)m;
}

/* the reference file with one header edit (every occurrence replaced), the header length redone */
static char *edit_header(const char *orig, size_t len, const char *from, const char *to, size_t *out_len) {
    size_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (uint8_t)orig[i];
    char *h = malloc(hl * 4 + 64), *w = h;
    const char *r = orig + 8, *end = orig + 8 + hl, *q;
    while ((q = memmem(r, (size_t)(end - r), from, strlen(from)))) {
        memcpy(w, r, (size_t)(q - r)), w += q - r;
        memcpy(w, to, strlen(to)), w += strlen(to);
        r = q + strlen(from);
    }
    memcpy(w, r, (size_t)(end - r)), w += end - r;
    size_t nh = (size_t)(w - h), data = len - 8 - hl;
    char *b = malloc(8 + nh + data);
    for (int i = 0; i < 8; i++) b[i] = (char)((uint64_t)nh >> (8 * i));
    memcpy(b + 8, h, nh);
    memcpy(b + 8 + nh, orig + 8 + hl, data);
    free(h);
    *out_len = 8 + nh + data;
    return b;
}

/* hostile headers, each refused with a message (or, where the bytes still mean a valid cache, loaded) */
static void test_hostile(cinfer_model *m, const char *ref) {
    static const struct { const char *from, *to, *why; int loads; } ed[] = {
        {"\"shape\":[1,2,32,64]", "\"shape\":[1,2,33,64]", "shape larger than its bytes", 0},
        {"\"shape\":[1,2,32,64]", "\"shape\":[1,4,16,64]", "4 KV heads (same bytes)", 0},
        {"\"shape\":[1,2,32,64]", "\"shape\":[2,2,16,64]", "batch 2", 0},
        {"\"shape\":[1,2,32,64]", "\"shape\":[1,2,64,32]", "head_dim 32", 0},
        {"\"shape\":[1,2,32,64]", "\"shape\":[1,2,32,64,1]", "5 dims", 0},
        {"\"shape\":[1,2,32,64]", "\"shape\":[1,2,-32,-64]", "negative dims", 0},
        {"\"shape\":[1,2,32,64]", "\"shape\":[1,2,4611686018427387904,64]", "overflowing dims", 0},
        {"\"BF16\"", "\"U32\"", "uint32 K/V", 0},
        {"\"BF16\"", "\"I16\"", "int16 K/V", 0},
        {"\"BF16\"", "\"F16\"", "f16 K/V (same bytes)", 1},
        {"\"BF16\"", "\"XYZ\"", "unknown dtype", 0},
        {"\"KVCache\"", "\"RotatingKVCache\"", "rotating without meta state", 0},
        {"\"KVCache\"", "\"BatchKVCache\"", "an unsupported class", 0},
        {"\"KVCache\"", "\"QuantizedKVCache\"", "quantized", 0},
        {"\"2.5\":\"KVCache\"", "\"2.6\":\"KVCache\"", "a class for layer 6, none for 5", 0},
        {",\"2.5\":\"KVCache\"", "", "5 classes", 0},
        {"\"0.0\":\"\"", "\"0.0\":5", "a metadata number", 0},
        {"\"__metadata__\"", "\"__metadatx__\"", "no metadata", 0},
        {"[90112,98304]", "[90112,99999999999]", "offsets past the file", 0},
        {"[90112,98304]", "[98304,90112]", "reversed offsets", 0},
        {"[90112,98304]", "[-8192,0]", "negative offsets", 0},
        {"\"0.0\":", "\"0.1\":", "a duplicate tensor name", 0},
        {"\"5.1\":", "\"7.1\":", "values of layer 5 missing", 0},
        {"{", "[", "not an object", 0},
    };
    char path[2048];
    snprintf(path, sizeof path, "%s/kv_bf16.safetensors", ref);
    size_t len = 0;
    char *orig = NULL;
    cf_read_file(path, &orig, &len, NULL, 0);
    cinfer_ctx *c = new_ctx(m, "bf16", 0);
    int n = (int)(sizeof ed / sizeof *ed), right = 0;
    for (int i = 0; orig && i < n; i++) {
        size_t bl = 0;
        char *b = edit_header(orig, len, ed[i].from, ed[i].to, &bl);
        cinfer_status st = cinfer_prompt_cache_decode(c, 0, b, bl, NULL, NULL);
        int ok = ed[i].loads ? !st && cinfer_seq_len(c, 0) == 32 : st && cinfer_seq_len(c, 0) == 0 && cinfer_ctx_error(c)[0];
        if (!ok || getenv("PC_DEBUG")) printf("# %s: %s -> %s\n", ed[i].why, cinfer_status_str(st), st ? cinfer_ctx_error(c) : "loaded");
        right += ok;
        free(b);
    }
    CHECK(right == n, "%d hostile header edits (shapes, dtypes, classes, offsets, metadata): %d handled as expected", n, right);
    free(orig);
    cinfer_ctx_free(c);
}

/* mutations of the reference file: any status, never a crash (ASan build catches the rest) */
static void test_fuzz(cinfer_model *m, const char *ref) {
    char path[2048];
    snprintf(path, sizeof path, "%s/kv_bf16.safetensors", ref);
    size_t len = 0;
    char *orig = NULL, *b;
    cf_read_file(path, &orig, &len, NULL, 0);
    b = malloc(len + 16);
    cinfer_ctx *c = new_ctx(m, "f32", 0);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    int loaded = 0, refused = 0, n = 1500;
    for (int it = 0; orig && it < n; it++) {
        memcpy(b, orig, len);
        size_t L = len;
        int kind = it % 4;
        for (int k = 0; k < 1 + it % 6; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (r >> 17) % (kind == 1 ? 1248 : len);   /* kind 1: the header only */
            b[pos] = (char)(kind == 2 ? "{}[]\":,0123456789\\ "[(r >> 40) % 20] : (char)(r >> 33));
        }
        if (kind == 3) L = (size_t)((r >> 7) % len);
        if (cinfer_prompt_cache_decode(c, 0, b, L, NULL, NULL)) refused++;
        else loaded++;
    }
    CHECK(orig && loaded + refused == n, "%d mutated files: %d refused, %d loaded (tensor bytes only), no crash", n, refused, loaded);
    free(orig);
    free(b);
    cinfer_ctx_free(c);
}

int main(void) {
    char dir[512], ref[512], tmp[] = "/tmp/cinfer-pc-XXXXXX";
    snprintf(dir, sizeof dir, "%s/models/prose-13m", shared_dir());
    snprintf(ref, sizeof ref, "%s/reference/mlx/promptcache", shared_dir());
    cinfer_model *m = NULL;
    char err[512];
    cinfer_load_opts lo = {0};
    lo.n_threads = 2;
    if (cinfer_model_load(dir, &lo, &m, err, sizeof err)) { CHECK(0, "load %s: %s", dir, err); return CHECK_DONE(); }
    CHECK(mkdtemp(tmp) != NULL, "temp dir %s", tmp);
    test_reference(m, ref);
    test_roundtrip(m, tmp);
    test_refusals(m, tmp, shared_dir());
    test_hostile(m, ref);
    test_fuzz(m, ref);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) printf("# could not remove %s\n", tmp);
    cinfer_model_free(m);
    return CHECK_DONE();
}
