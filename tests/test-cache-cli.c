/*
 * test-cache-cli.c — cache state on disk through the `cinfer` binary, as a
 * user runs it: cache-prompt writes a file mlx-lm's loader accepts, and
 * generate --prompt-cache-file continuing from it prints what the uncached
 * prompt prints; generate --cache-dir reuses a prefix on the second run
 * (--json prompt_cached_tokens) with the same text; a corrupt entry is
 * reported and recomputed; refusals exit non-zero with a message.
 */
#include <jansson.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

static char bin[600], tmp[64];

static int run(const char *args, char *out, size_t cap) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s 2>%s/err", bin, args, tmp);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static const char *err_text(void) {
    static char e[4096];
    char p[128];
    snprintf(p, sizeof p, "%s/err", tmp);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(e, 1, sizeof e - 1, f) : 0;
    e[n] = 0;
    if (f) fclose(f);
    return e;
}

static int cached_tokens(const char *out) {
    const char *b = strrchr(out, '{');
    json_t *j = b ? json_loads(b, 0, NULL) : NULL;
    int n = j ? (int)json_integer_value(json_object_get(j, "prompt_cached_tokens")) : -1;
    json_decref(j);
    return n;
}

int main(int argc, char **argv) {
    (void)argc;
    snprintf(bin, sizeof bin, "%s", argv[0]);
    char *s = strrchr(bin, '/');
    if (s) *s = 0;
    strncat(bin, "/../cinfer", sizeof bin - strlen(bin) - 1);
    snprintf(tmp, sizeof tmp, "/tmp/cinfer-ccli-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    static char out[1 << 16], ref[1 << 16];
    char args[2048], m[512];
    snprintf(m, sizeof m, "%s/models/prose-13m", shared_dir());
    const char *pre = "It was a bright cold day in April, and the clocks were striking", *suf = " thirteen. Winston";

    snprintf(args, sizeof args, "cache-prompt -m %s --prompt '%s' --prompt-cache-file %s/pc", m, pre, tmp);
    int rc = run(args, out, sizeof out);
    CHECK(rc == 0 && strstr(err_text(), ".safetensors"), "cache-prompt writes %s/pc.safetensors (rc %d): %s", tmp, rc, err_text());
    snprintf(args, sizeof args, "/usr/bin/python3 tests/reference/read_prompt_cache.py %s/pc.safetensors KVCache 16 >/dev/null", tmp);
    if (!access("/usr/bin/python3", X_OK)) CHECK(system(args) == 0, "the file reads as mlx-lm's loader would (16 tokens)");
    /* ids: the continuation must equal the whole prompt's exactly (text would re-tokenize the seam) */
    const char *ia = "1,739,471,263,11785,11220,2462,297,3786,29892,322", *ib = "278,12006,892,13602";
    snprintf(args, sizeof args, "cache-prompt -m %s --tokens %s --prompt-cache-file %s/ids.safetensors", m, ia, tmp);
    rc = run(args, out, sizeof out);
    snprintf(args, sizeof args, "generate -m %s --tokens %s,%s -n 24 --json", m, ia, ib);
    int rr = run(args, ref, sizeof ref);
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/ids.safetensors --tokens %s -n 24 --json", m, tmp, ib);
    int r2 = run(args, out, sizeof out);
    char *a = strrchr(ref, '{'), *b = strrchr(out, '{');
    CHECK(rc == 0 && rr == 0 && r2 == 0 && a && b && a - ref == b - out && !strncmp(ref, out, (size_t)(a - ref)) && cached_tokens(out) == 11,
          "generate --prompt-cache-file --tokens B prints what --tokens A,B prints:\n  %.*s", (int)(b ? b - out : 0), out);
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/pc.safetensors --prompt '%s' -n 8 --json", m, tmp, suf);
    rc = run(args, out, sizeof out);
    CHECK(rc == 0 && cached_tokens(out) == 16, "a text suffix after the text prompt's file (rc %d)", rc);
    snprintf(args, sizeof args, "generate -m %s --prompt '%s%s' -n 24 --json", m, pre, suf);
    rr = run(args, ref, sizeof ref);

    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/models/stories260k/config.json -p x -n 2", m, shared_dir());
    rc = run(args, out, sizeof out);
    CHECK(rc == 1 && strstr(err_text(), "prompt cache"), "a file that is not a prompt cache: exit 1, %s", err_text());
    snprintf(args, sizeof args, "generate -m %s --prompt-cache-file %s/reference/mlx/promptcache/kv_bf16.safetensors -p x -n 2", m, shared_dir());
    rc = run(args, out, sizeof out);
    CHECK(rc == 0 && strstr(err_text(), "no cinfer fingerprint"), "mlx-lm's own file: a warning that only shapes were checked");
    snprintf(args, sizeof args, "generate -m %s/models/stories260k --prompt-cache-file %s/pc.safetensors -p x -n 2", shared_dir(), tmp);
    rc = run(args, out, sizeof out);
    CHECK(rc == 1 && strstr(err_text(), "another model"), "another model's file: exit 1, %s", err_text());
    snprintf(args, sizeof args, "cache-prompt -m %s --tokens 1,2,3 --prompt-cache-file %s/q --kv-bits 8", m, tmp);
    rc = run(args, out, sizeof out);
    CHECK(rc == 2 && strstr(err_text(), "issue 15"), "--kv-bits: usage error naming the missing quantized caches");

    snprintf(args, sizeof args, "generate -m %s --prompt '%s%s' -n 24 --json --cache-dir %s/cd", m, pre, suf, tmp);
    char first[1 << 12];
    int r1 = run(args, first, sizeof first), c1 = cached_tokens(first);
    rc = run(args, out, sizeof out);
    b = strrchr(out, '{');
    CHECK(r1 == 0 && rc == 0 && c1 == 0 && cached_tokens(out) > 0 && b && !strncmp(ref, out, (size_t)(b - out)),
          "--cache-dir: the second run takes %d prompt tokens from disk and prints the same text", cached_tokens(out));
    snprintf(args, sizeof args, "for f in %s/cd/*.ckv; do printf 'XXXX' | dd of=$f bs=1 seek=100 conv=notrunc 2>/dev/null; done", tmp);
    CHECK(system(args) == 0, "corrupt the entries");
    snprintf(args, sizeof args, "generate -m %s --prompt '%s%s' -n 24 --json --cache-dir %s/cd", m, pre, suf, tmp);
    rc = run(args, out, sizeof out);
    b = strrchr(out, '{');
    CHECK(rc == 0 && cached_tokens(out) == 0 && strstr(err_text(), "corrupt") && b && !strncmp(ref, out, (size_t)(b - out)),
          "a corrupt entry: reported, recomputed, same text: %.160s", err_text());
    rc = run(args, out, sizeof out);
    CHECK(rc == 0 && cached_tokens(out) > 0, "... and stored again (%d cached)", cached_tokens(out));
    snprintf(args, sizeof args, "generate -m %s -p x --cache-dir %s/cd --cache-dir-max-gb -1", m, tmp);
    CHECK(run(args, out, sizeof out) == 2, "--cache-dir-max-gb -1: usage error");

    snprintf(args, sizeof args, "rm -rf %s", tmp);
    if (system(args)) printf("# could not remove %s\n", tmp);
    return CHECK_DONE();
}
