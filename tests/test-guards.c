/*
 * test-guards.c — the library never gives a wrong answer silently (issue 12):
 * config values it cannot honour are refused by name; NaN weights fail the
 * forward with a message; generation stops at the model's context and
 * refuses a prompt that does not fit; each generated id's log-prob equals
 * log-softmax of transformers' logits (after the repetition penalty, before
 * temperature); atomic writes never replace a FIFO or a symlink; a JSONL
 * file is checked whole; rows longer than the context are refused.
 * Model: models/stories260k (shipped; max_position_embeddings 512), with
 * transformers' logits in tests/fixtures/models/stories260k-ref.
 */
#include <cblas.h>
#include <fcntl.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "io/npy.h"
#include "model-copy.h"

/* the logits-buffer test allocates more than exists on purpose: ASan returns NULL, as malloc does */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

#define MODEL SHIPPED_MODEL
static char tmp[64];

static void test_config(void) {
    static const char *cases[][2] = {
        {"hidden_act", "\"gelu\""}, {"hidden_act", "\"relu\""}, {"hidden_act", "\"nonsense\""},
        {"rope_scaling", "\"linear\""}, {"rms_norm_eps", "0"}, {"rms_norm_eps", "-1e-5"},
        {"rope_theta", "0"}, {"rope_theta", "-10000"}, {"partial_rotary_factor", "2.0"},
    };
    char dir[256], err[512];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32];
        snprintf(name, sizeof name, "cfg%zu", i);
        copy_model(tmp, name, cases[i][0], cases[i][1], dir, sizeof dir);
        cinfer_model *m = NULL;
        err[0] = 0;
        cinfer_status st = cinfer_model_load(dir, NULL, &m, err, sizeof err);
        CHECK(st != CINFER_OK && !m && strstr(err, cases[i][0]), "config %s = %s is refused, naming the key (%s)",
              cases[i][0], cases[i][1], err);
        cinfer_model_free(m);
    }
    copy_model(tmp, "cfg-silu", "hidden_act", "\"silu\"", dir, sizeof dir);
    cinfer_model *m = NULL;
    CHECK(!cinfer_model_load(dir, NULL, &m, err, sizeof err), "hidden_act silu still loads (%s)", m ? "ok" : err);
    cinfer_model_free(m);
}

/* writes NaN over model.norm.weight of a copy */
static void test_nan_weights(void) {
    char dir[256], err[512];
    int ok = copy_model_nan(tmp, "nan", dir, sizeof dir);
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    float lg[512];
    int32_t ids[] = {1, 403, 407};
    int loaded = ok && !cinfer_model_load(dir, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, NULL, &c, err, sizeof err);
    cinfer_status st = loaded ? cinfer_eval(c, ids, 3, 0, lg) : CINFER_OK;
    CHECK(loaded && st && strstr(cinfer_ctx_error(c), "NaN"), "NaN weights: the forward fails and says NaN (%s)",
          c ? cinfer_ctx_error(c) : err);
    cinfer_gen_stats gs;
    if (c) cinfer_ctx_reset(c);
    st = loaded ? cinfer_generate(c, ids, 3, NULL, 5, NULL, NULL, &gs) : CINFER_OK;
    CHECK(loaded && st, "NaN weights: generate fails instead of printing <unk> (%s)", c ? cinfer_ctx_error(c) : "");
    cinfer_ctx_free(c);
    cinfer_model_free(m);
}

static int count_cb(int32_t tok, const char *text, void *user) {
    (void)tok; (void)text;
    ++*(int *)user;
    return 0;
}

/* log-softmax of row[tok], the sum in double */
static double ref_logprob(const float *row, int V, int tok) {
    double mx = row[0], s = 0;
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < V; i++) s += exp(row[i] - mx);
    return row[tok] - mx - log(s);
}

typedef struct lp_acc { int32_t tok[8]; float lp[8]; int n; } lp_acc;
static int lp_cb(int32_t tok, const char *text, float lp, void *user) {
    lp_acc *a = user;
    (void)text;
    if (tok >= 0 && a->n < 8) { a->tok[a->n] = tok; a->lp[a->n++] = lp; }
    return 0;
}

static void test_generation(void) {
    char err[512];
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    int ok = !cinfer_model_load(MODEL, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, NULL, &c, err, sizeof err);
    CHECK(ok, "load " MODEL " (%s)", ok ? "ok" : err);
    if (!ok) { cinfer_model_free(m); return; }
    /* the context: 512 positions; from BOS, prompt + generated stop there */
    int32_t bos = 1, count = 0;
    cinfer_gen_stats gs;
    cinfer_status st = cinfer_generate(c, &bos, 1, NULL, 600, count_cb, &count, &gs);
    CHECK(!st && gs.prompt_tokens + gs.gen_tokens == 512 && gs.finish_reason == CINFER_FINISH_CONTEXT,
          "generate -n 600 stops at the 512-position context: %d + %d tokens, finish %d", gs.prompt_tokens, gs.gen_tokens, gs.finish_reason);
    /* a prompt that does not fit is refused before any forward */
    int32_t *big = malloc(sizeof *big * 513);
    for (int i = 0; i < 513; i++) big[i] = 1 + i % 300;
    cinfer_ctx_reset(c);
    st = cinfer_generate(c, big, 513, NULL, 4, NULL, NULL, &gs);
    CHECK(st == CINFER_EINVAL && strstr(cinfer_ctx_error(c), "context") && cinfer_ctx_pos(c) == 0,
          "a 513-token prompt is refused, nothing fed (%s)", cinfer_ctx_error(c));
    free(big);
    /* the hook a rotating cache will use: max_context */
    cinfer_ctx_reset(c);
    cinfer_gen_opts go = cinfer_gen_defaults();
    go.max_tokens = -1;
    go.max_context = 20;
    st = cinfer_generate_ex(c, &bos, 1, NULL, &go, NULL, NULL, &gs);
    CHECK(!st && gs.prompt_tokens + gs.gen_tokens == 20 && gs.finish_reason == CINFER_FINISH_CONTEXT,
          "max_tokens -1 with max_context 20: %d + %d, finish context", gs.prompt_tokens, gs.gen_tokens);

    /* log-probs against transformers' logits of tokens2 (31 positions) */
    json_t *ref = json_load_file("tests/fixtures/models/stories260k-ref/reference.json", 0, NULL);
    float *tl = NULL;
    int nd = 0;
    int64_t shape[4];
    ok = ref && !npy_read_f32("tests/fixtures/models/stories260k-ref/logits2.npy", &tl, &nd, shape, err, sizeof err) &&
         shape[0] == 31 && shape[1] == 512;
    CHECK(ok, "fixture logits2.npy [31, 512] and reference.json");
    if (ok) {
        int32_t t2[31];
        json_t *a = json_object_get(ref, "tokens2");
        for (int i = 0; i < 31; i++) t2[i] = (int32_t)json_integer_value(json_array_get(a, i));
        const float *last = tl + 30 * 512;
        /* greedy */
        lp_acc acc = {.n = 0};
        go = cinfer_gen_defaults();
        go.max_tokens = 1;
        go.logprobs = 1;
        cinfer_ctx_reset(c);
        st = cinfer_generate_ex(c, t2, 31, NULL, &go, lp_cb, &acc, &gs);
        int am = 0;
        for (int i = 1; i < 512; i++) if (last[i] > last[am]) am = i;
        double want = ref_logprob(last, 512, am);
        CHECK(!st && acc.n == 1 && acc.tok[0] == am && fabs(acc.lp[0] - want) < 1e-4,
              "greedy: id %d log-prob %.6f == transformers' log-softmax %.6f (id %d)", acc.n ? acc.tok[0] : -1, acc.n ? acc.lp[0] : 0, want, am);
        /* repetition penalty 1.5 over the last 20 ids: the log-prob is of the penalised logits */
        float pen[512];
        memcpy(pen, last, sizeof pen);
        unsigned char seen[512] = {0};
        for (int i = 31 - 20; i < 31; i++) {
            int t = t2[i];
            if (seen[t]) continue;
            seen[t] = 1;
            pen[t] = pen[t] > 0 ? pen[t] / 1.5f : pen[t] * 1.5f;
        }
        int pm = 0;
        for (int i = 1; i < 512; i++) if (pen[i] > pen[pm]) pm = i;
        cinfer_sampler_params sp = cinfer_sampler_defaults();
        sp.rep_penalty = 1.5f;
        sp.rep_last_n = 20;
        acc.n = 0;
        cinfer_ctx_reset(c);
        st = cinfer_generate_ex(c, t2, 31, &sp, &go, lp_cb, &acc, &gs);
        want = ref_logprob(pen, 512, pm);
        CHECK(!st && acc.n == 1 && acc.tok[0] == pm && fabs(acc.lp[0] - want) < 1e-4,
              "repetition penalty 1.5: id %d log-prob %.6f == log-softmax of the penalised logits %.6f", acc.n ? acc.tok[0] : -1, acc.n ? acc.lp[0] : 0, want);
        /* temperature: the log-prob is before it */
        sp = cinfer_sampler_defaults();
        sp.temp = 2.5f;
        sp.seed = 7;
        acc.n = 0;
        cinfer_ctx_reset(c);
        st = cinfer_generate_ex(c, t2, 31, &sp, &go, lp_cb, &acc, &gs);
        want = acc.n ? ref_logprob(last, 512, acc.tok[0]) : 0;
        CHECK(!st && acc.n == 1 && fabs(acc.lp[0] - want) < 1e-4, "temperature 2.5: log-prob %.6f of id %d is before temperature (%.6f)",
              acc.n ? acc.lp[0] : 0, acc.n ? acc.tok[0] : -1, want);
    }
    free(tl);
    json_decref(ref);
    /* an extra eos id ends generation with finish "stop" */
    int32_t p[] = {1, 403, 407, 261, 378}, extra = 376;
    lp_acc acc = {.n = 0};
    go = cinfer_gen_defaults();
    go.max_tokens = 20;
    go.extra_eos = &extra;
    go.n_extra_eos = 1;
    go.report_eos = 1;
    cinfer_ctx_reset(c);
    st = cinfer_generate_ex(c, p, 5, NULL, &go, lp_cb, &acc, &gs);
    CHECK(!st && gs.gen_tokens == 5 && acc.n == 5 && acc.tok[4] == 376 && gs.finish_reason == CINFER_FINISH_STOP,
          "--extra-eos-token 376 ends ', there was a little' after 5 ids, finish stop (%d)", gs.gen_tokens);
    /* memory: the weights + buffers + cache, not the process's address space */
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    size_t mem = cinfer_ctx_memory_bytes(c);
    CHECK(gs.peak_memory == mem && mem >= info.weight_bytes + gs.kv_bytes && mem < info.weight_bytes + (16u << 20) &&
          gs.kv_bytes >= (size_t)5 * 2 * 4 * 8 * 4 * 9,
          "peak memory %zu B = weights %zu + buffers + KV %zu (a 1 MB model is not 0.17 GB)", mem, info.weight_bytes, gs.kv_bytes);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
}

/* NaN logits: never chosen, by greedy or by any filter (a NaN first once won greedy and top-p) */
static void test_sampler_nan(void) {
    static const struct { float temp, top_p; int top_k; } cases[] = {{0, 1, 0}, {1, 0.9f, 0}, {1, 1, 2}, {1, 1, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        cinfer_sampler_params sp = cinfer_sampler_defaults();
        sp.temp = cases[k].temp;
        sp.top_p = cases[k].top_p;
        sp.top_k = cases[k].top_k;
        int bad = 0;
        for (int seed = 0; seed < 100; seed++) {
            sp.seed = (uint64_t)seed;
            cinfer_sampler *s = NULL;
            if (cinfer_sampler_new(&sp, 6, &s)) { bad++; continue; }
            float lg[6] = {NAN, 1.0f, 5.0f, NAN, 4.0f, NAN};
            int32_t t = cinfer_sampler_sample(s, lg, NULL, 0);
            bad += k == 0 ? t != 2 : (t != 2 && t != 4 && (k != 3 || t != 1));
            cinfer_sampler_free(s);
        }
        CHECK(bad == 0, "logits with NaN (temp %g, top-p %g, top-k %d) never pick a NaN id (%d bad of 100)",
              cases[k].temp, cases[k].top_p, cases[k].top_k, bad);
    }
}

static int is_fifo(const char *p) { struct stat st; return lstat(p, &st) == 0 && S_ISFIFO(st.st_mode); }
static int is_link(const char *p) { struct stat st; return lstat(p, &st) == 0 && S_ISLNK(st.st_mode); }

static void test_special_files(void) {
    char fifo[128], link[128], target[128], err[512] = "";
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp);
    snprintf(link, sizeof link, "%s/link.npy", tmp);
    snprintf(target, sizeof target, "%s/target.npy", tmp);
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    int made = mkfifo(fifo, 0644) == 0;
    cinfer_status st = npy_write_f32(fifo, v, 1, shape, err, sizeof err);
    CHECK(made && st && is_fifo(fifo) && strstr(err, "not a regular file"), "--npy onto a FIFO is refused and the FIFO stays (%s)", err);
    FILE *f = fopen(target, "w");
    if (f) fclose(f);
    made = symlink("target.npy", link) == 0;
    st = npy_write_f32(link, v, 1, shape, err, sizeof err);
    float *back = NULL;
    int nd = 0;
    int64_t sh[4];
    int got = !st && !npy_read_f32(target, &back, &nd, sh, err, sizeof err) && nd == 1 && sh[0] == 4 && back[3] == 4;
    CHECK(made && got && is_link(link), "--npy onto a symlink writes its target and the link stays a link");
    free(back);
    /* kl --save-base onto a FIFO */
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    int32_t rows[8] = {1, 403, 407, 261, 378, 432, 383, 286};
    st = cinfer_model_load(MODEL, NULL, &m, err, sizeof err) || cinfer_ctx_new(m, NULL, &c, err, sizeof err)
             ? CINFER_OK : cinfer_kl_save_base(c, rows, 1, 8, 1, fifo, NULL, NULL, err, sizeof err);
    CHECK(st && is_fifo(fifo) && strstr(err, "not a regular file"), "kl --save-base onto a FIFO is refused and the FIFO stays (%s)", err);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
}

static void test_data_and_rows(void) {
    char path[128], err[512] = "";
    snprintf(path, sizeof path, "%s/d.jsonl", tmp);
    FILE *f = fopen(path, "w");
    if (f) {
        for (int i = 0; i < 3; i++) fprintf(f, "{\"tokens\": [1, 403, 407, 261, 378, 432, 383, 286, 261, 376]}\n");
        fprintf(f, "{\"tokens\": [1, 2\n");
        fclose(f);
    }
    cinfer_data_opts o = cinfer_data_defaults();
    o.seq_len = 8;
    o.num_samples = 1;
    o.shuffle = CINFER_SHUFFLE_NONE;
    int32_t *rows = NULL;
    int n = 0;
    cinfer_status st = cinfer_load_rows(NULL, -1, path, &o, &rows, &n, err, sizeof err);
    CHECK(st && strstr(err, "d.jsonl:4"), "a malformed 4th line fails even when 1 row needs only the 1st (%s)", err);
    free(rows);
    /* rows longer than the context */
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    int L = 600;
    int32_t *r = malloc(sizeof *r * L);
    for (int i = 0; i < L; i++) r[i] = 1 + i % 300;
    cinfer_ppl_result res;
    st = cinfer_model_load(MODEL, NULL, &m, err, sizeof err) || cinfer_ctx_new(m, NULL, &c, err, sizeof err)
             ? CINFER_OK : cinfer_perplexity(c, r, 1, L, 1, NULL, NULL, NULL, &res, err, sizeof err);
    CHECK(st && strstr(err, "context"), "perplexity over 600-token rows on a 512-position model is refused (%s)", err);
    free(r);
    cinfer_ctx_free(c);
    cinfer_model_free(m);
}

/* A forward whose logits buffer cannot be allocated fails with ENOMEM, and
 * so does the next one: the buffer once left NULL beside its allocated twin
 * (ctx.c) was written through on the second call. The model: hidden 2, one
 * layer, a vocabulary of 2^30 ids (a sparse 8 GiB tied embedding), so the
 * [64][vocab] logits buffer (256 GiB) cannot exist and the rest is tiny. */
static void test_logits_buffer_retry(void) {
    static const struct { const char *name; long long r, c; } t[] = {
        {"model.embed_tokens.weight", 1 << 30, 2}, {"model.norm.weight", 2, 0},
        {"model.layers.0.input_layernorm.weight", 2, 0}, {"model.layers.0.post_attention_layernorm.weight", 2, 0},
        {"model.layers.0.self_attn.q_proj.weight", 2, 2}, {"model.layers.0.self_attn.k_proj.weight", 2, 2},
        {"model.layers.0.self_attn.v_proj.weight", 2, 2}, {"model.layers.0.self_attn.o_proj.weight", 2, 2},
        {"model.layers.0.mlp.gate_proj.weight", 2, 2}, {"model.layers.0.mlp.up_proj.weight", 2, 2},
        {"model.layers.0.mlp.down_proj.weight", 2, 2}};
    char dir[128], path[160], hdr[4096], err[512];
    snprintf(dir, sizeof dir, "%s/hugevocab", tmp);
    mkdir(dir, 0755);
    int k = snprintf(hdr, sizeof hdr, "{");
    long long off = 0;
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        long long end = off + t[i].r * (t[i].c ? t[i].c : 1) * 4;
        if (t[i].c)
            k += snprintf(hdr + k, sizeof hdr - k, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld], \"data_offsets\": [%lld, %lld]}",
                          i ? ", " : "", t[i].name, t[i].r, t[i].c, off, end);
        else
            k += snprintf(hdr + k, sizeof hdr - k, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%lld], \"data_offsets\": [%lld, %lld]}",
                          i ? ", " : "", t[i].name, t[i].r, off, end);
        off = end;
    }
    k += snprintf(hdr + k, sizeof hdr - k, "}");
    while ((8 + k) % 64) hdr[k++] = ' ';   /* aligned data is mapped in place, never copied */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint64_t hl = (uint64_t)k;
    int ok = fd >= 0 && write(fd, &hl, 8) == 8 && write(fd, hdr, (size_t)k) == k && ftruncate(fd, (off_t)(8 + k + off)) == 0;
    if (fd >= 0) close(fd);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 2, \"intermediate_size\": 2, \"num_hidden_layers\": 1, "
                   "\"num_attention_heads\": 1, \"num_key_value_heads\": 1, \"vocab_size\": %d, \"tie_word_embeddings\": true}", 1 << 30);
        fclose(f);
    }
    cinfer_model *m = NULL;
    cinfer_ctx *c = NULL;
    float lg[4];
    int32_t id = 1;
    ok = ok && !cinfer_model_load(dir, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, NULL, &c, err, sizeof err);
    CHECK(ok, "a 2^30-id model loads (sparse weights): %s", ok ? "ok" : err);
    cinfer_status s1 = ok ? cinfer_eval(c, &id, 1, 0, lg) : CINFER_OK;
    cinfer_status s2 = ok ? cinfer_eval(c, &id, 1, 0, lg) : CINFER_OK;
    if (ok && s1 == CINFER_OK) printf("# this machine allocated the 256 GiB logits buffer: the retry path is not reached\n");
    CHECK(ok && (s1 == CINFER_OK || (s1 == CINFER_ENOMEM && s2 == CINFER_ENOMEM)),
          "no room for the logits: ENOMEM twice, no write through NULL (%s)", c ? cinfer_ctx_error(c) : "");
    cinfer_ctx_free(c);
    cinfer_model_free(m);
}

/* OpenBLAS's thread count is process-global: a second context (the server's)
 * must not change it under the first one's GEMMs, which run at one thread */
static void test_blas_threads(void) {
    char err[512];
    cinfer_model *m = NULL;
    cinfer_ctx *a = NULL, *b = NULL;
    cinfer_ctx_opts o = {0};
    o.n_threads = 2;
    int ok = !cinfer_model_load(MODEL, NULL, &m, err, sizeof err) && !cinfer_ctx_new(m, &o, &a, err, sizeof err);
    int before = openblas_get_num_threads();
    ok = ok && !cinfer_ctx_new(m, &o, &b, err, sizeof err);
    CHECK(ok && before == 1 && openblas_get_num_threads() == 1, "a new 2-thread context leaves OpenBLAS at 1 thread (%d, %d)",
          before, openblas_get_num_threads());
    cinfer_ctx_free(a);
    cinfer_ctx_free(b);
    cinfer_model_free(m);
}

static void test_version(void) {
    const char *v = cinfer_version();
    int a, b, c;
    CHECK(v && sscanf(v, "%d.%d.%d", &a, &b, &c) == 3, "cinfer_version() is a semantic version: %s", v ? v : "NULL");
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/cinfer-guards-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    test_config();
    test_nan_weights();
    test_generation();
    test_sampler_nan();
    test_special_files();
    test_data_and_rows();
    test_blas_threads();
    test_logits_buffer_retry();
    test_version();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) printf("# could not remove %s\n", tmp);
    return CHECK_DONE();
}
