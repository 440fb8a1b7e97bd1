/*
 * test-cli-text.c — the text commands end to end, against Hugging Face's
 * output recorded in the fixtures (never against the library):
 *   - `cinfer tokenize --ids` (post-processor's BOS/EOS added) and
 *     `--no-bos-eos` == tokenizers' encode(text, add_special_tokens=True /
 *     False) for every case of tests/fixtures/tokenizer/stories260k.json;
 *   - `cinfer detokenize` / `--skip-special` of those ids == tokenizers'
 *     decode(ids, skip_special_tokens=False / True);
 *   - `cinfer template` == transformers' apply_chat_template for the Qwen3
 *     cases of tests/fixtures/templates/qwen3.json (messages, tools, kwargs,
 *     add_generation_prompt), byte for byte.
 */
#include <jansson.h>
#include "check.h"
#include "cinfer.h"
#include "cli-run.h"

static char tmp[64];
static char out[1 << 17], er[1 << 16];

static int unhex(const char *h, char *buf, size_t cap) {
    size_t n = strlen(h) / 2;
    if (n + 1 > cap) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
        buf[i] = (char)v;
    }
    buf[n] = 0;
    return (int)n;
}

static void write_path(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(data, 1, n, f); fclose(f); }
}

/* "1 2 3\n" == ids */
static int same_ids(const char *text, json_t *ids) {
    size_t i = 0;
    const char *p = text;
    char *end;
    for (;; i++) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (i >= json_array_size(ids) || v != json_integer_value(json_array_get(ids, i))) return 0;
        p = end;
    }
    return i == json_array_size(ids);
}

static void test_tokenize(void) {
    char model[512], path[128], args[8192];
    snprintf(model, sizeof model, "%s/models/stories260k", shared_dir());
    snprintf(path, sizeof path, "%s/text", tmp);
    json_t *fx = json_load_file("tests/fixtures/tokenizer/stories260k.json", JSON_ALLOW_NUL, NULL), *c;
    size_t k;
    int n_cases = 0, bad_tok = 0, bad_plain = 0, bad_dec = 0, bad_skip = 0;
    static char text[1 << 16];
    json_array_foreach(json_object_get(fx, "cases"), k, c) {
        int n = unhex(json_string_value(json_object_get(c, "hex")), text, sizeof text);
        json_t *ids = json_object_get(c, "ids_special");
        if (n <= 0 || (int)strlen(text) != n || json_array_size(ids) > 600) continue;   /* NUL bytes; command-line length */
        n_cases++;
        write_path(path, text, (size_t)n);
        snprintf(args, sizeof args, "tokenize -m %s --ids -f %s", model, path);
        if (run(args, out, er, sizeof out) || !same_ids(out, ids)) { bad_tok++; printf("# tokenize case %zu: %.80s %s\n", k, out, er); }
        snprintf(args, sizeof args, "tokenize -m %s --ids --no-bos-eos -f %s", model, path);
        if (run(args, out, er, sizeof out) || !same_ids(out, json_object_get(c, "ids"))) bad_plain++;
        /* detokenize the special-token ids both ways */
        int w = snprintf(args, sizeof args, "detokenize -m %s -n", model);
        size_t i;
        json_t *v;
        json_array_foreach(ids, i, v) w += snprintf(args + w, sizeof args - w, " %lld", (long long)json_integer_value(v));
        const char *want = json_string_value(json_object_get(c, "decoded"));
        if (run(args, out, er, sizeof out) || !want || strcmp(out, want)) { bad_dec++; printf("# detokenize case %zu: '%.60s' want '%.60s'\n", k, out, want ? want : "?"); }
        snprintf(args + w, sizeof args - w, " --skip-special");
        want = json_string_value(json_object_get(c, "decoded_skip"));
        if (run(args, out, er, sizeof out) || !want || strcmp(out, want)) bad_skip++;
    }
    CHECK(n_cases >= 50 && !bad_tok && !bad_plain, "tokenize --ids (with and without --no-bos-eos) == tokenizers' encode on %d texts "
          "(%d and %d differ)", n_cases, bad_tok, bad_plain);
    CHECK(n_cases >= 50 && !bad_dec && !bad_skip, "detokenize (with and without --skip-special) == tokenizers' decode on %d id lists "
          "(%d and %d differ)", n_cases, bad_dec, bad_skip);
    json_decref(fx);
}

static void test_template(void) {
    char dir[128], cmd[1024], mp[160], tp[160], args[2048];
    snprintf(dir, sizeof dir, "%s/qwen3", tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && gzip -dc %s/tokenizers/qwen3/tokenizer.json.gz > %s/tokenizer.json && "
             "cp %s/tokenizers/qwen3/tokenizer_config.json %s/", dir, shared_dir(), dir, shared_dir(), dir);
    CHECK(system(cmd) == 0, "qwen3 tokenizer files set up in %s", dir);
    json_t *fx = json_load_file("tests/fixtures/templates/qwen3.json", 0, NULL), *c;
    size_t k;
    int n = 0, bad = 0;
    snprintf(mp, sizeof mp, "%s/messages.json", tmp);
    snprintf(tp, sizeof tp, "%s/tools.json", tmp);
    json_array_foreach(json_object_get(fx, "cases"), k, c) {
        json_t *call = json_object_get(c, "call"), *tools = json_object_get(call, "tools"), *kw = json_object_get(call, "kwargs");
        const char *want = json_string_value(json_object_get(c, "expected"));
        char *kj = kw && json_object_size(kw) ? json_dumps(kw, JSON_COMPACT) : NULL;
        if (!want || (kj && strchr(kj, '\''))) { free(kj); continue; }   /* error cases: test-tok-chat; shell quoting */
        json_dump_file(json_object_get(call, "messages"), mp, 0);
        int w = snprintf(args, sizeof args, "template -m %s --messages %s", dir, mp);
        if (tools && !json_is_null(tools)) { json_dump_file(tools, tp, 0); w += snprintf(args + w, sizeof args - w, " --tools %s", tp); }
        if (kj) w += snprintf(args + w, sizeof args - w, " --kwargs '%s'", kj);
        if (json_is_true(json_object_get(call, "add_generation_prompt"))) snprintf(args + w, sizeof args - w, " --add-generation-prompt");
        int rc = run(args, out, er, sizeof out);
        if (rc || strcmp(out, want)) { bad++; printf("# template %s: rc %d %s\n", json_string_value(json_object_get(c, "name")), rc, er); }
        n++;
        free(kj);
    }
    CHECK(n >= 10 && !bad, "template == transformers' apply_chat_template on %d Qwen3 cases (%d differ)", n, bad);
    json_decref(fx);
}

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_find(argv[0])) { CHECK(0, "the CLI %s exists (build it: make all)", cli); return CHECK_DONE(); }
    snprintf(tmp, sizeof tmp, "/tmp/cinfer-clitext-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    test_tokenize();
    test_template();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) printf("# could not remove %s\n", tmp);
    return CHECK_DONE();
}
