/*
 * test-bad-input.c — hostile and broken model directories: each must end in
 * a status, a message naming the file and the problem, and (for the CLI) a
 * non-zero exit — never a crash or a sanitizer report.
 */
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"

static char root[256];
static char bindir[512];

typedef struct tdesc { const char *name, *dtype; int ndim; long long shape[2]; } tdesc;

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static void write_text(const char *dir, const char *name, const char *text) { write_file(dir, name, text, strlen(text)); }

static const char *CONFIG =
    "{\"model_type\": \"llama\", \"hidden_size\": 4, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"intermediate_size\": 6, \"vocab_size\": 8, \"tie_word_embeddings\": true}";

/* the tensors of CONFIG's model: embed [8,4], norm, q [4,4], k/v [2,4], o [4,4], mlp */
static tdesc TENSORS[] = {
    {"model.embed_tokens.weight", "F32", 2, {8, 4}}, {"model.norm.weight", "F32", 1, {4, 0}},
    {"model.layers.0.input_layernorm.weight", "F32", 1, {4, 0}},
    {"model.layers.0.self_attn.q_proj.weight", "F32", 2, {4, 4}},
    {"model.layers.0.self_attn.k_proj.weight", "F32", 2, {2, 4}},
    {"model.layers.0.self_attn.v_proj.weight", "F32", 2, {2, 4}},
    {"model.layers.0.self_attn.o_proj.weight", "F32", 2, {4, 4}},
    {"model.layers.0.post_attention_layernorm.weight", "F32", 1, {4, 0}},
    {"model.layers.0.mlp.gate_proj.weight", "F32", 2, {6, 4}}, {"model.layers.0.mlp.up_proj.weight", "F32", 2, {6, 4}},
    {"model.layers.0.mlp.down_proj.weight", "F32", 2, {4, 6}},
};
#define NT (int)(sizeof TENSORS / sizeof *TENSORS)

/* writes model.safetensors from descs; `skip` drops one tensor; `lie` adds to one end offset */
static void write_st(const char *dir, const tdesc *t, int n, int skip, long long lie) {
    char hdr[8192];
    int k = snprintf(hdr, sizeof hdr, "{");
    long long off = 0;
    for (int i = 0; i < n; i++) {
        if (i == skip) continue;
        long long el = t[i].shape[0] * (t[i].ndim == 2 ? t[i].shape[1] : 1), sz = !strcmp(t[i].dtype, "F32") || !strcmp(t[i].dtype, "I32") ? 4 : 2;
        long long end = off + el * sz + (i == n - 1 ? lie : 0);
        if (t[i].ndim == 2)
            k += snprintf(hdr + k, sizeof hdr - k, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [%lld, %lld], \"data_offsets\": [%lld, %lld]}",
                          k > 1 ? ", " : "", t[i].name, t[i].dtype, t[i].shape[0], t[i].shape[1], off, end);
        else
            k += snprintf(hdr + k, sizeof hdr - k, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [%lld], \"data_offsets\": [%lld, %lld]}",
                          k > 1 ? ", " : "", t[i].name, t[i].dtype, t[i].shape[0], off, end);
        off = end;
    }
    k += snprintf(hdr + k, sizeof hdr - k, "}");
    size_t total = 8 + (size_t)k + (size_t)(off > 0 ? off : 0);
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((unsigned long long)k >> (8 * i));
    memcpy(buf + 8, hdr, (size_t)k);
    for (size_t i = 8 + k; i + 4 <= total; i += 4) { float one = 0.5f; memcpy(buf + i, &one, 4); }
    write_file(dir, "model.safetensors", buf, total);
    free(buf);
}

/* a safetensors file with the given header and 16 data bytes */
static void write_raw_st(const char *dir, const char *header) {
    unsigned char buf[256] = {0};
    size_t k = strlen(header);
    buf[0] = (unsigned char)k;
    memcpy(buf + 8, header, k);
    write_file(dir, "model.safetensors", buf, 8 + k + 16);
}

static char *mkcase(const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mkdir(dir, 0755);
    return dir;
}

/* loads dir and checks the status (cinfer.h's classes: EIO missing, EFORMAT malformed/lying,
 * EUNSUPPORTED valid but not handled) and that the failure message holds every needle */
static void expect_fail(const char *what, const char *dir, int want, ...) {
    char err[1024] = "";
    cinfer_model *m = NULL;
    cinfer_status st = cinfer_model_load(dir, NULL, &m, err, sizeof err);
    int ok = (int)st == want && m == NULL && err[0];
    va_list ap;
    va_start(ap, want);
    for (const char *needle; (needle = va_arg(ap, const char *));) ok = ok && strstr(err, needle);
    va_end(ap);
    CHECK(ok, "%s -> status %d (want %d, %s): %s", what, (int)st, want, cinfer_status_str((cinfer_status)want), err);
    cinfer_model_free(m);
}

/* the CLI exits 1 with a message, no signal */
static void expect_cli_fail(const char *what, const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s/cinfer generate -m %s -n 2 >/dev/null 2>%s/cli.err", bindir, dir, root);
    int rc = system(cmd);
    char path[300], msg[512] = "";
    snprintf(path, sizeof path, "%s/cli.err", root);
    FILE *f = fopen(path, "r");
    if (f) { size_t n = fread(msg, 1, sizeof msg - 1, f); msg[n] = 0; fclose(f); }
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(msg, "cinfer generate:"), "cli: %s exits 1 with a message (%s)", what,
          msg[0] ? strtok(msg, "\n") : "no message");
}

int main(int argc, char **argv) {
    (void)argc;
    snprintf(bindir, sizeof bindir, "%s", argv[0]);
    char *slash = strrchr(bindir, '/');
    if (slash) *slash = 0;
    strncat(bindir, "/..", sizeof bindir - strlen(bindir) - 1);
    snprintf(root, sizeof root, "/tmp/cinfer-bad-XXXXXX");
    if (!mkdtemp(root)) return 1;

    expect_fail("missing directory", "/nonexistent/cinfer-model", CINFER_EIO, "/nonexistent/cinfer-model", "not a directory", NULL);
    char *d = mkcase("noconfig");
    expect_fail("missing config.json", d, CINFER_EIO, "config.json", NULL);
    d = mkcase("badjson");
    write_text(d, "config.json", "{\"model_type\": \"llama\", ");
    expect_fail("malformed config.json", d, CINFER_EFORMAT, "config.json", "malformed JSON", NULL);
    d = mkcase("unknown");
    write_text(d, "config.json", "{\"model_type\": \"gpt-nonesuch\", \"hidden_size\": 4}");
    expect_fail("unknown model_type", d, CINFER_EUNSUPPORTED, "config.json", "unknown model_type \"gpt-nonesuch\"", NULL);
    d = mkcase("nohidden");
    write_text(d, "config.json", "{\"model_type\": \"llama\", \"num_hidden_layers\": 1}");
    expect_fail("missing hidden_size", d, CINFER_EFORMAT, "config.json", "hidden_size", NULL);
    d = mkcase("neg-theta");   /* would make every logit NaN: (-1)^(-2i/d) */
    write_text(d, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 4, \"num_hidden_layers\": 1, "
                                 "\"num_attention_heads\": 2, \"intermediate_size\": 6, \"vocab_size\": 8, \"rope_theta\": -1.0}");
    expect_fail("negative rope_theta", d, CINFER_EFORMAT, "config.json", "rope_theta", NULL);
    d = mkcase("badfield");
    write_text(d, "config.json", "{\"model_type\": \"qwen3\", \"hidden_size\": \"big\"}");
    expect_fail("hidden_size of the wrong type", d, CINFER_EFORMAT, "config.json", "hidden_size", NULL);

    d = mkcase("good");
    write_text(d, "config.json", CONFIG);
    write_st(d, TENSORS, NT, -1, 0);
    {
        char err[512];
        cinfer_model *m = NULL;
        cinfer_status st = cinfer_model_load(d, NULL, &m, err, sizeof err);
        CHECK(st == CINFER_OK && m, "the well-formed tiny model loads (%s)", st ? err : "ok");
        cinfer_ctx *c = NULL;
        float lg[8];
        int32_t bad_ids[2] = {1, 99};
        if (m && !cinfer_ctx_new(m, NULL, &c, err, sizeof err)) {
            st = cinfer_eval(c, bad_ids, 2, 0, lg);
            CHECK(st == CINFER_EINVAL && strstr(cinfer_ctx_error(c), "99"), "token id outside the vocabulary: %s", cinfer_ctx_error(c));
            int32_t ok_ids[2] = {1, 2};
            CHECK(cinfer_eval(c, ok_ids, 2, 0, lg) == CINFER_OK, "the context still works after a refused call");
        }
        cinfer_ctx_free(c);
        cinfer_model_free(m);
    }
    d = mkcase("noweights");
    write_text(d, "config.json", CONFIG);
    expect_fail("no safetensors", d, CINFER_EIO, "model.safetensors", NULL);
    d = mkcase("missing-tensor");
    write_text(d, "config.json", CONFIG);
    write_st(d, TENSORS, NT, 4, 0);
    expect_fail("missing tensor", d, CINFER_EFORMAT, "missing tensor", "k_proj", NULL);
    d = mkcase("wrong-shape");
    write_text(d, "config.json", CONFIG);
    tdesc t2[NT];
    memcpy(t2, TENSORS, sizeof t2);
    t2[3].shape[0] = 3;
    write_st(d, t2, NT, -1, 0);
    expect_fail("wrong shape", d, CINFER_EFORMAT, "model.safetensors", "q_proj", "shape [3, 4], expected [4, 4]", NULL);
    d = mkcase("wrong-dtype");
    write_text(d, "config.json", CONFIG);
    memcpy(t2, TENSORS, sizeof t2);
    t2[5].dtype = "I32";
    write_st(d, t2, NT, -1, 0);
    expect_fail("wrong dtype", d, CINFER_EUNSUPPORTED, "model.safetensors", "v_proj", "I32", NULL);
    d = mkcase("lying-size");
    write_text(d, "config.json", CONFIG);
    write_st(d, TENSORS, NT, -1, 4);   /* last tensor claims 4 bytes past its shape (and the file) */
    expect_fail("offsets past the data", d, CINFER_EFORMAT, "model.safetensors", "down_proj", NULL);
    d = mkcase("truncated");
    write_text(d, "config.json", CONFIG);
    write_st(d, TENSORS, NT, -1, 0);
    {
        char p[600];
        snprintf(p, sizeof p, "%s/model.safetensors", d);
        struct stat sb;
        stat(p, &sb);
        CHECK(truncate(p, sb.st_size - 40) == 0, "truncate the weights file");
    }
    expect_fail("truncated safetensors", d, CINFER_EFORMAT, "model.safetensors", "outside", NULL);
    d = mkcase("tiny-file");
    write_text(d, "config.json", CONFIG);
    write_text(d, "model.safetensors", "abc");
    expect_fail("3-byte safetensors", d, CINFER_EFORMAT, "model.safetensors", "truncated", NULL);
    d = mkcase("huge-header");
    write_text(d, "config.json", CONFIG);
    write_file(d, "model.safetensors", "\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10);
    expect_fail("header length past the file", d, CINFER_EFORMAT, "model.safetensors", "header length", NULL);
    d = mkcase("overflow");
    write_text(d, "config.json", CONFIG);
    write_raw_st(d, "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 8], \"data_offsets\": [0, 16]}}");
    expect_fail("shape whose size overflows", d, CINFER_EFORMAT, "model.safetensors", "overflows", NULL);
    d = mkcase("neg-offset");
    write_text(d, "config.json", CONFIG);
    write_raw_st(d, "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [18446744073709551600, 16]}}");
    expect_fail("offset that wraps around", d, CINFER_EFORMAT, "model.safetensors", NULL);
    d = mkcase("bad-index");
    write_text(d, "config.json", CONFIG);
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}");
    expect_fail("shard path outside the directory", d, CINFER_EFORMAT, "model.safetensors.index.json", "bad shard name", NULL);

    expect_cli_fail("missing directory", "/nonexistent/cinfer-model");
    char dd[512];
    snprintf(dd, sizeof dd, "%s/unknown", root);
    expect_cli_fail("unknown model_type", dd);
    snprintf(dd, sizeof dd, "%s/truncated", root);
    expect_cli_fail("truncated safetensors", dd);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) printf("# could not remove %s\n", root);
    return CHECK_DONE();
}
