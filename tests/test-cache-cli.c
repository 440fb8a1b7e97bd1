/*
 * test-cache-cli.c — cache state on disk through the `cinfer` binary, as a
 * user runs it: cache-prompt writes a file mlx-lm's loader accepts, and
 * generate --prompt-cache-file continuing from it prints what the uncached
 * prompt prints; generate --cache-dir reuses a prefix on the second run
 * (--json prompt_cached_tokens) with the same text; a corrupt entry is
 * reported and recomputed; refusals exit non-zero with a message.
 */
#include <jansson.h>
#include "check.h"
#include "cli-run.h"

static char tmp[64], er[1 << 16];

/* generate --json's object: its "text" (malloc'd) and prompt_cached_tokens (-1 when it does not parse) */
static int result(const char *out, char **text) {
    json_t *j = json_loads(out, 0, NULL);
    int n = j ? (int)json_integer_value(json_object_get(j, "prompt_cached_tokens")) : -1;
    const char *t = json_string_value(json_object_get(j, "text"));
    *text = strdup(t ? t : "");
    json_decref(j);
    return t ? n : -1;
}

/* both outputs parse, and their texts are equal and not empty */
static int same_text(const char *a, const char *b, int *cached) {
    char *ta, *tb;
    int ca = result(a, &ta), cb = result(b, &tb), same = ca >= 0 && cb >= 0 && *ta && !strcmp(ta, tb);
    free(ta);
    free(tb);
    *cached = cb;
    return same;
}

static int cached_tokens(const char *out) {
    char *t;
    int n = result(out, &t);
    free(t);
    return n;
}

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_find(argv[0])) { CHECK(0, "the cinfer binary next to %s", argv[0]); return CHECK_DONE(); }
    snprintf(tmp, sizeof tmp, "/tmp/cinfer-ccli-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    static char out[1 << 16], ref[1 << 16];
    char args[2048], m[512];
    snprintf(m, sizeof m, "%s/models/prose-13m", shared_dir());
    const char *pre = "It was a bright cold day in April, and the clocks were striking", *suf = " thirteen. Winston";

    snprintf(args, sizeof args, "cache-prompt -m %s --prompt '%s' --prompt-cache-file %s/pc", m, pre, tmp);
    int rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && strstr(er, ".safetensors"), "cache-prompt writes %s/pc.safetensors (rc %d): %s", tmp, rc, er);
    snprintf(args, sizeof args, "/usr/bin/python3 tests/reference/read_prompt_cache.py %s/pc.safetensors KVCache 16 >/dev/null", tmp);
    if (!access("/usr/bin/python3", X_OK)) CHECK(system(args) == 0, "the file reads as mlx-lm's loader would (16 tokens)");
    /* ids: the continuation must equal the whole prompt's exactly (text would re-tokenize the seam) */
    const char *ia = "1,739,471,263,11785,11220,2462,297,3786,29892,322", *ib = "278,12006,892,13602";
    snprintf(args, sizeof args, "cache-prompt -m %s --tokens %s --prompt-cache-file %s/ids.safetensors", m, ia, tmp);
    rc = run(args, out, er, sizeof out);
    snprintf(args, sizeof args, "generate -m %s --tokens %s,%s -n 24 --json", m, ia, ib);
    int rr = run(args, ref, er, sizeof ref);
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/ids.safetensors --tokens %s -n 24 --json", m, tmp, ib);
    int r2 = run(args, out, er, sizeof out);
    int cached = -1;
    CHECK(rc == 0 && rr == 0 && r2 == 0 && same_text(ref, out, &cached) && cached == 11,
          "generate --prompt-cache-file --tokens B prints what --tokens A,B prints (%d cached):\n  %.200s", cached, out);
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/pc.safetensors --prompt '%s' -n 8 --json", m, tmp, suf);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && cached_tokens(out) == 16, "a text suffix after the text prompt's file (rc %d)", rc);
    snprintf(args, sizeof args, "generate -m %s --prompt '%s%s' -n 24 --json", m, pre, suf);
    rr = run(args, ref, er, sizeof ref);

    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/models/stories260k/config.json -p x -n 2", m, shared_dir());
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "prompt cache"), "a file that is not a prompt cache: exit 1, %s", er);
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/reference/mlx/promptcache/kv_bf16.safetensors -p x -n 2", m, shared_dir());
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && strstr(er, "no cinfer fingerprint"), "mlx-lm's own file: a warning that only shapes were checked");
    snprintf(args, sizeof args, "generate -m %s/models/stories260k --prompt-cache-file %s/pc.safetensors -p x -n 2", shared_dir(), tmp);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "another model"), "another model's file: exit 1, %s", er);
    /* QuantizedKVCache files: mlx-lm's own (to_quantized(64, 8) of a 32-token prefill) continues exactly as its
     * KVCache twin quantized by cinfer at load (--quantized-kv-start 0); cinfer writes the same classes, names,
     * shapes and dtypes, and reads them back */
    static char qa[4096], qb[4096], qc[4096];
#define PC "generate -m %s --prompt-cache-file %s/reference/mlx/promptcache/%s -p ' and' -n 12 --temp 0 -q --kv-bits 8 %s"
    snprintf(args, sizeof args, PC, m, shared_dir(), "kv_q8g64.safetensors", "--kv-dtype bf16");
    int ra = run(args, qa, er, sizeof qa);
    snprintf(args, sizeof args, PC, m, shared_dir(), "kv_bf16.safetensors", "--kv-dtype bf16 --quantized-kv-start 0");
    int rb = run(args, qb, er, sizeof qb);
    CHECK(ra == 0 && rb == 0 && strlen(qa) > 8 && !strcmp(qa, qb), "mlx-lm's QuantizedKVCache file continues as its KVCache "
          "twin quantized at load: '%s' vs '%s'", qa, qb);
    snprintf(args, sizeof args, PC, m, shared_dir(), "kv_q8g64.safetensors", "--kv-group-size 32");
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 1 && strstr(er, "QuantizedKVCache of 8 bits, group 64") && strstr(er, "--kv-group-size 64"),
          "a QuantizedKVCache file into another scheme: refused, naming the flags: %s", er);
    snprintf(args, sizeof args, "cache-prompt -m %s --tokens 1,450,29871,1576,310,263,2217,1058 --prompt-cache-file %s/q8 "
             "--kv-bits 8 --quantized-kv-start 0 --kv-dtype bf16", m, tmp);
    rc = run(args, out, er, sizeof out);
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/q8.safetensors -p ' and' -n 12 --temp 0 -q --kv-bits 8 "
             "--kv-dtype bf16", m, tmp);
    int rq = run(args, qc, er, sizeof qc);
    CHECK(rc == 0 && rq == 0 && strlen(qc) > 8, "cache-prompt --kv-bits 8 writes a QuantizedKVCache file that generate "
          "continues from: '%s'", qc);

    snprintf(args, sizeof args, "generate -m %s --prompt '%s%s' -n 24 --json --cache-dir %s/cd", m, pre, suf, tmp);
    static char first[1 << 16];
    int r1 = run(args, first, er, sizeof first), c1 = cached_tokens(first);
    rc = run(args, out, er, sizeof out);
    CHECK(r1 == 0 && rc == 0 && c1 == 0 && same_text(ref, out, &cached) && cached > 0,
          "--cache-dir: the second run takes %d prompt tokens from disk and prints the same text", cached_tokens(out));
    snprintf(args, sizeof args, "for f in %s/cd/*.ckv; do printf 'XXXX' | dd of=$f bs=1 seek=100 conv=notrunc 2>/dev/null; done", tmp);
    CHECK(system(args) == 0, "corrupt the entries");
    snprintf(args, sizeof args, "generate -m %s --prompt '%s%s' -n 24 --json --cache-dir %s/cd", m, pre, suf, tmp);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && same_text(ref, out, &cached) && cached == 0 && strstr(er, "corrupt"),
          "a corrupt entry: reported, recomputed, same text: %.160s", er);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 0 && cached_tokens(out) > 0, "... and stored again (%d cached)", cached_tokens(out));
    snprintf(args, sizeof args, "generate -m %s -p x --cache-dir %s/cd --cache-dir-max-gb -1", m, tmp);
    CHECK(run(args, out, er, sizeof out) == 2, "--cache-dir-max-gb -1: usage error");

    /* a chat template: cache-prompt keeps the rendering up to the end of the user's text, generate takes it from
     * the start of the user's text; chat --cache-dir stores its first rendering and reuses it on the next run */
    snprintf(args, sizeof args, "mkdir %s/chat && for f in %s/*; do ln -s $(realpath $f) %s/chat/; done && rm %s/chat/tokenizer_config.json",
             tmp, m, tmp, tmp);
    int made = system(args) == 0;
    char p[256];
    snprintf(p, sizeof p, "%s/chat/tokenizer_config.json", tmp);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("{\"add_bos_token\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"chat_template\": \"{{ bos_token }}"
              "{% for m in messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}\"}", f);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/chat-input", tmp);
    if ((f = fopen(p, "w"))) { fputs("Hello there\nAnd then?\n", f); fclose(f); }
    CHECK(made && f, "a prose-13m dir with a chat template");
    snprintf(args, sizeof args, "cache-prompt -m %s/chat --chat --system 'Be brief.' --prompt 'Tell me a story about' "
             "--prompt-cache-file %s/chat.safetensors", tmp, tmp);
    rc = run(args, out, er, sizeof out);
    snprintf(args, sizeof args, "generate -m %s/chat --chat --system 'Be brief.' --prompt ' a cat.' --prompt-cache-file "
             "%s/chat.safetensors -n 12 --json", tmp, tmp);
    int r3 = run(args, out, er, sizeof out);
    snprintf(args, sizeof args, "generate -m %s/chat --chat --system 'Be brief.' --prompt 'Tell me a story about a cat.' -n 12 --json", tmp);
    rr = run(args, ref, er, sizeof ref);
    CHECK(rc == 0 && r3 == 0 && rr == 0 && same_text(ref, out, &cached) && cached > 5,
          "--chat: cache-prompt then generate the rest prints what the whole chat prompt prints (%d cached): %.200s", cached, out);
    snprintf(args, sizeof args, "chat -m %s/chat --cache-dir %s/chatdir -n 6 < %s/chat-input", tmp, tmp, tmp);
    rc = run(args, out, er, sizeof out);
    r3 = run(args, out, er, sizeof out);
    snprintf(args, sizeof args, "ls %s/chatdir/*.ckv >/dev/null", tmp);
    CHECK(rc == 0 && r3 == 0 && system(args) == 0, "chat --cache-dir runs twice and leaves an entry (rc %d %d)", rc, r3);

    /* mlx_lm.chat has no --prompt-cache-file (its cache is in memory only): refused, naming --cache-dir */
    snprintf(args, sizeof args, "chat -m %s/chat --prompt-cache-file %s/chat.safetensors -n 6 < %s/chat-input", tmp, tmp, tmp);
    rc = run(args, out, er, sizeof out);
    CHECK(rc == 2 && strstr(er, "mlx_lm.chat has no such flag") && strstr(er, "--cache-dir"),
          "chat --prompt-cache-file: usage error naming --cache-dir (rc %d): %.200s", rc, er);

    snprintf(args, sizeof args, "rm -rf %s", tmp);
    if (system(args)) printf("# could not remove %s\n", tmp);
    return CHECK_DONE();
}
