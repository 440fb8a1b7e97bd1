/*
 * test-api.c — public calls no other test checks, each against an
 * expectation made without cinfer:
 *   - cinfer_model_get_info: every field against config.json,
 *     generation_config.json and the safetensors headers, read here with
 *     jansson (sizes and parameter counts summed from the headers' shapes);
 *   - cinfer_status_str: the header's wording for each status, never NULL;
 *   - the progress callback of perplexity / KL / log-probs: monotone, ends at
 *     the number of scored positions, and a non-zero return stops the call;
 *   - cinfer_generate's stops: an eos id from generation_config.json ends it
 *     where transformers' greedy sequence (stories260k-ref) reaches that id,
 *     and a callback returning non-zero ends it at once.
 */
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "golden.h"
#include "cinfer.h"

/* ------------------------------------------------------------ model info */

/* sums the tensor bytes (data_offsets) and elements (shapes) of one safetensors file's header */
static int st_sums(const char *path, size_t *bytes, int64_t *params) {
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    if (!f || fread(len8, 1, 8, f) != 8) { if (f) fclose(f); return 0; }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | len8[i];
    char *h = hl < (1u << 26) ? malloc(hl + 1) : NULL;
    int ok = h && fread(h, 1, hl, f) == hl;
    fclose(f);
    json_t *j = ok ? json_loadb(h, hl, 0, NULL) : NULL;
    free(h);
    const char *k;
    json_t *t;
    json_object_foreach(j, k, t) {
        if (!strcmp(k, "__metadata__")) continue;
        json_t *off = json_object_get(t, "data_offsets"), *sh = json_object_get(t, "shape");
        *bytes += (size_t)(json_integer_value(json_array_get(off, 1)) - json_integer_value(json_array_get(off, 0)));
        int64_t el = 1;
        size_t i;
        json_t *d;
        json_array_foreach(sh, i, d) el *= json_integer_value(d);
        *params += el;
    }
    json_decref(j);
    return j != NULL;
}

static int cfg_int(json_t *c, const char *k, int def) {
    json_t *v = json_object_get(c, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

static void check_info(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    json_t *gen = json_load_file(p, 0, NULL);
    cinfer_model *m = golden_load(dir, NULL, 1);
    CHECK(cfg && m, "%s: config.json and the model load", dir);
    if (!cfg || !m) goto out;
    cinfer_model_info in;
    cinfer_model_get_info(m, &in);
    int hidden = cfg_int(cfg, "hidden_size", 0), heads = cfg_int(cfg, "num_attention_heads", 0);
    int ok = !strcmp(in.model_type, json_string_value(json_object_get(cfg, "model_type"))) &&
             in.n_layer == cfg_int(cfg, "num_hidden_layers", -1) && in.hidden == hidden && in.n_head == heads &&
             in.n_kv_head == cfg_int(cfg, "num_key_value_heads", heads) && in.head_dim == cfg_int(cfg, "head_dim", hidden / heads) &&
             in.ffn == cfg_int(cfg, "intermediate_size", -1) && in.n_vocab == cfg_int(cfg, "vocab_size", -1) &&
             in.max_pos == cfg_int(cfg, "max_position_embeddings", -1);
    CHECK(ok, "%s: info shape fields == config.json (%s, %d layers, hidden %d, heads %d/%d, head_dim %d, ffn %d, vocab %d, max_pos %d)",
          dir, in.model_type, in.n_layer, in.hidden, in.n_head, in.n_kv_head, in.head_dim, in.ffn, in.n_vocab, in.max_pos);
    /* bos / eos: generation_config.json over config.json; eos may be a list */
    json_t *src = gen && json_object_get(gen, "eos_token_id") ? gen : cfg, *e = json_object_get(src, "eos_token_id");
    int32_t want[8];
    int nw = json_is_array(e) ? golden_ids(e, want, 8) : json_is_integer(e) ? (want[0] = (int32_t)json_integer_value(e), 1) : 0;
    int bos = cfg_int(gen && json_object_get(gen, "bos_token_id") ? gen : cfg, "bos_token_id", -1);
    int eos_ok = in.n_eos == nw;
    for (int i = 0; eos_ok && i < nw; i++) eos_ok = in.eos[i] == want[i];
    CHECK(in.bos == bos && eos_ok, "%s: bos %d (want %d), %d eos ids == generation_config/config (first %d)", dir, in.bos, bos,
          in.n_eos, in.n_eos ? in.eos[0] : -1);
    /* dtype, bytes and parameters from the safetensors headers */
    const char *dt = json_string_value(json_object_get(cfg, "dtype"));
    if (!dt) dt = json_string_value(json_object_get(cfg, "torch_dtype"));
    const char *wd = !dt ? "?" : !strcmp(dt, "float32") ? "f32" : !strcmp(dt, "bfloat16") ? "bf16" : !strcmp(dt, "float16") ? "f16" : dt;
    size_t bytes = 0;
    int64_t params = 0;
    int files = 0;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (!access(p, R_OK)) files += st_sums(p, &bytes, &params);
    for (int s = 1; s <= 9; s++)
        for (int of = 2; of <= 9; of++) {
            snprintf(p, sizeof p, "%s/model-%05d-of-%05d.safetensors", dir, s, of);
            if (!access(p, R_OK)) files += st_sums(p, &bytes, &params);
        }
    CHECK(files > 0 && !strcmp(in.weight_dtype, wd) && in.weight_bytes == bytes && in.n_params == params,
          "%s: weight dtype %s (want %s), %zu bytes and %lld parameters == the %d safetensors headers (%zu, %lld)", dir,
          in.weight_dtype, wd, in.weight_bytes, (long long)in.n_params, files, bytes, (long long)params);
out:
    cinfer_model_free(m);
    json_decref(cfg);
    json_decref(gen);
}

/* ---------------------------------------------------------- status names */

static void check_status_str(void) {
    /* the words of include/cinfer.h's comment for each code */
    static const struct { cinfer_status s; const char *word; } w[] = {
        {CINFER_OK, "ok"}, {CINFER_EINVAL, "argument"}, {CINFER_EIO, "I/O"}, {CINFER_EFORMAT, "format error"},
        {CINFER_EUNSUPPORTED, "unsupported"}, {CINFER_ENOMEM, "memory"}, {CINFER_EBACKEND, "backend"},
        {CINFER_ENOTFOUND, "not found"}};
    int bad = 0;
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
        const char *s = cinfer_status_str(w[i].s);
        if (!s || !strcasestr(s, w[i].word)) { bad++; printf("# status %d: '%s' lacks '%s'\n", (int)w[i].s, s ? s : "(null)", w[i].word); }
        for (size_t j = 0; s && j < i; j++)
            if (!strcmp(s, cinfer_status_str(w[j].s))) { bad++; printf("# statuses %d and %d share '%s'\n", (int)w[i].s, (int)w[j].s, s); }
    }
    const char *u = cinfer_status_str((cinfer_status)99), *n = cinfer_status_str((cinfer_status)-1);
    CHECK(!bad && u && *u && n && *n, "cinfer_status_str: 8 distinct names in the header's words; unknown codes get '%s'", u ? u : "(null)");
}

/* ------------------------------------------------------ progress callback */

typedef struct prog { int64_t last, total, calls, stop_at; int monotone; } prog;

static int on_progress(int64_t done, int64_t total, void *user) {
    prog *p = user;
    if (done < p->last || done > total || (p->total && total != p->total)) p->monotone = 0;
    p->last = done;
    p->total = total;
    p->calls++;
    return p->stop_at && p->calls >= p->stop_at;
}

static void check_progress(void) {
    cinfer_model *m = golden_load("tests/fixtures/models/llama-f32", NULL, 1);
    cinfer_ctx *c = NULL;
    char err[256] = "";
    if (m) cinfer_ctx_new(m, NULL, &c, err, sizeof err);
    CHECK(c != NULL, "llama-f32 context (%s)", err);
    if (!c) { cinfer_model_free(m); return; }
    int R = 3, L = 17;
    int32_t rows[3 * 17];
    for (int i = 0; i < R * L; i++) rows[i] = 3 + (i * 37) % 250;
    setenv("CINFER_SCORE_CHUNK", "4", 1);   /* several chunks, so several calls */
    prog p = {0, 0, 0, 0, 1};
    cinfer_ppl_result r;
    cinfer_status st = cinfer_perplexity(c, rows, R, L, 2, NULL, on_progress, &p, &r, err, sizeof err);
    CHECK(!st && p.monotone && p.calls >= 4 && p.last == (int64_t)R * (L - 1) && p.total == p.last,
          "perplexity progress: %lld calls, monotone, ends at %lld of %lld = rows x (L-1)", (long long)p.calls, (long long)p.last,
          (long long)p.total);
    prog q = {0, 0, 0, 2, 1};
    err[0] = 0;
    st = cinfer_perplexity(c, rows, R, L, 2, NULL, on_progress, &q, &r, err, sizeof err);
    CHECK(st == CINFER_EINVAL && strstr(err, "stopped") && q.calls == 2, "perplexity: a callback returning 1 stops it (status %d, '%s', %lld calls)",
          (int)st, err, (long long)q.calls);
    prog k = {0, 0, 0, 0, 1};
    cinfer_kl_stats ks;
    st = cinfer_kl(c, c, NULL, rows, R, L, 3, NULL, on_progress, &k, &ks, err, sizeof err);
    CHECK(!st && k.monotone && k.calls >= 2 && k.last == k.total && k.total >= (int64_t)R * (L - 1),
          "KL progress: %lld calls, monotone, ends at its total %lld", (long long)k.calls, (long long)k.total);
    cinfer_lp_seq sq[2] = {{rows, 5, rows + 5, 9}, {rows + 17, 2, rows + 19, 4}};
    double sums[2];
    prog l = {0, 0, 0, 0, 1};
    st = cinfer_response_logprobs(c, sq, 2, 2, sums, NULL, on_progress, &l, err, sizeof err);
    CHECK(!st && l.monotone && l.last == 13 && l.total == 13, "log-probs progress ends at the 13 response tokens (%lld of %lld)",
          (long long)l.last, (long long)l.total);
    unsetenv("CINFER_SCORE_CHUNK");
    cinfer_ctx_free(c);
    cinfer_model_free(m);
}

/* ------------------------------------------------------- generation stops */

typedef struct seen { int32_t tok[128]; int n, stop_after; } seen;

static int on_token(int32_t tok, const char *text, void *user) {
    seen *s = user;
    (void)text;
    if (tok < 0) return 0;   /* the final flush of pending text */
    if (s->n < 128) s->tok[s->n++] = tok;
    return s->stop_after && s->n >= s->stop_after;
}

static void check_generate_stops(void) {
    json_t *ref = json_load_file("tests/fixtures/models/stories260k-ref/reference.json", 0, NULL);
    int32_t g[128];
    int ng = golden_ids(json_object_get(ref, "greedy"), g, 128), k = 8;
    while (k < ng) {   /* the first token from index 8 on that greedy has not produced before */
        int fresh = 1;
        for (int i = 0; i < k; i++) fresh &= g[i] != g[k];
        if (fresh) break;
        k++;
    }
    /* stories260k with generation_config.json naming g[k] (and 2) as eos */
    char dir[64], src[600], dst[128];
    snprintf(dir, sizeof dir, "/tmp/cinfer-api-%d", (int)getpid());
    mkdir(dir, 0755);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(src, sizeof src, "%s/models/stories260k/%s", shared_dir(), files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        char *abs = realpath(src, NULL);
        if (!abs || symlink(abs, dst)) printf("# link %s failed\n", dst);
        free(abs);
    }
    snprintf(dst, sizeof dst, "%s/generation_config.json", dir);
    FILE *f = fopen(dst, "w");
    if (f) { fprintf(f, "{\"bos_token_id\": 1, \"eos_token_id\": [2, %d]}\n", (int)g[k]); fclose(f); }
    cinfer_model *m = golden_load(dir, NULL, 0);
    cinfer_ctx *c = NULL;
    char err[256];
    int ok = ref && ng == 60 && k < ng && m && !cinfer_ctx_new(m, NULL, &c, err, sizeof err);
    CHECK(ok, "stories260k with eos [2, %d] (transformers' greedy token %d) loads", ok ? (int)g[k] : -1, k);
    if (ok) {
        int32_t bos = 1;
        cinfer_sampler_params sp = cinfer_sampler_defaults();
        cinfer_gen_stats gs;
        seen s = {.n = 0};
        cinfer_status st = cinfer_generate(c, &bos, 1, &sp, 60, on_token, &s, &gs);
        int same = s.n == k && !memcmp(s.tok, g, sizeof *g * k);
        CHECK(!st && same && gs.stopped_by_eos && gs.gen_tokens == k + 1,
              "generate stops at the eos id: %d tokens streamed (transformers' first %d), eos counted (%d generated), stopped_by_eos %d",
              s.n, k, gs.gen_tokens, gs.stopped_by_eos);
        cinfer_ctx_reset(c);
        seen t = {.n = 0, .stop_after = 5};
        st = cinfer_generate(c, &bos, 1, &sp, 60, on_token, &t, &gs);
        CHECK(!st && t.n == 5 && gs.gen_tokens == 5 && !gs.stopped_by_eos && !memcmp(t.tok, g, sizeof *g * 5),
              "a callback returning non-zero after 5 tokens stops generate there (%d streamed, %d generated)", t.n, gs.gen_tokens);
    }
    cinfer_ctx_free(c);
    cinfer_model_free(m);
    for (int i = 0; i < 4; i++) { snprintf(dst, sizeof dst, "%s/%s", dir, files[i]); unlink(dst); }
    snprintf(dst, sizeof dst, "%s/generation_config.json", dir);
    unlink(dst);
    rmdir(dir);
    json_decref(ref);
}

int main(void) {
    char s260[512];
    snprintf(s260, sizeof s260, "%s/models/stories260k", shared_dir());
    const char *dirs[] = {s260, "tests/fixtures/models/llama-f32", "tests/fixtures/models/llama3-rope-f32",
                          "tests/fixtures/models/qwen3-f32", "tests/fixtures/models/llama-tied-bf16",
                          "tests/fixtures/models/llama-f16", "tests/fixtures/models/llama-sharded-f32"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) check_info(dirs[i]);
    check_status_str();
    check_progress();
    check_generate_stops();
    return CHECK_DONE();
}
