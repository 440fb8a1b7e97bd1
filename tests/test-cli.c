/*
 * test-cli.c — the `cinfer` binary as a user runs it: generate on the
 * default model (shipped in models/stories260k: no ../shared needed),
 * logits --npy against transformers' logits, --json output that parses,
 * --help, and usage errors with exit status 2.
 */
#include <jansson.h>
#include "check.h"
#include "cli-run.h"
#include "io/npy.h"

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_setup(argv[0])) return 1;
    static char out[1 << 16];
    char args[1024];
    const char *sh = "models/stories260k";   /* shipped in the repository */

    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 20", sh);
    int rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0 && !strncmp(out, ", there was a little girl named Lily.", 37), "generate prints the story after the prompt (rc %d): %.60s", rc, out);

    snprintf(args, sizeof args, "generate -m %s -n 5 --json", sh);
    rc = sh_run(args, out, sizeof out);
    json_t *j = json_loads(out, 0, NULL);
    CHECK(rc == 0 && j && json_integer_value(json_object_get(j, "generation_tokens")) == 5 &&
          json_is_number(json_object_get(j, "generation_tps")), "generate --json prints parseable statistics");
    json_decref(j);

    char npy[128];
    snprintf(npy, sizeof npy, "%s/l.npy", cli_tmp);
    snprintf(args, sizeof args, "logits -m %s --tokens 1,403,407,261,378 --top 3 --npy %s --json", sh, npy);
    rc = sh_run(args, out, sizeof out);
    j = json_loads(out, 0, NULL);
    json_t *pos = json_object_get(j, "positions");
    json_t *last = json_array_get(pos, 4);
    json_t *top0 = json_array_get(json_object_get(last, "top"), 0);
    CHECK(rc == 0 && json_array_size(pos) == 5 && json_integer_value(json_object_get(top0, "id")) == 432,
          "logits --json: 5 positions, ',' (432) tops the last one");
    json_decref(j);
    float *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    int64_t sa[4], sb[4];
    char err[256];
    int ok = !npy_read_f32(npy, &a, &na, sa, err, sizeof err) &&
             !npy_read_f32("tests/fixtures/models/stories260k-ref/logits.npy", &b, &nb, sb, err, sizeof err) &&
             na == 2 && sa[0] == 5 && sa[1] == 512 && sb[0] == 5;
    double mx = 0;
    for (int i = 0; ok && i < 5 * 512; i++) mx = fmax(mx, fabs(a[i] - b[i]));
    CHECK(ok && mx < 1e-3, "logits --npy writes [5, 512] float32 equal to transformers' (max diff %.2e)", mx);
    free(a);
    free(b);

    rc = sh_run("generate --help", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "--top-p") && strstr(out, "--seed"), "generate --help documents the flags");
    rc = sh_run("logits --help", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "--npy"), "logits --help documents the flags");
    rc = sh_run("generate -m x --temp abc", out, sizeof out);
    CHECK(rc == 2, "a bad flag value is a usage error (exit 2)");
    rc = sh_run("frobnicate", out, sizeof out);
    CHECK(rc == 2, "an unknown command is a usage error (exit 2)");
    snprintf(args, sizeof args, "logits -m %s --tokens 1,999999", sh);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 1, "a token id outside the vocabulary fails cleanly (exit %d)", rc);

    /* chat and generate --chat through a chat template added to a copy of stories260k */
    char mdir[128], cmd[3000];
    snprintf(mdir, sizeof mdir, "%s/chatm", cli_tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/* %s/ && chmod -R u+w %s", mdir, sh, mdir, mdir);
    int copied = system(cmd) == 0;
    snprintf(cmd, sizeof cmd, "%s/tokenizer_config.json", mdir);
    json_t *tc = json_load_file(cmd, 0, NULL);
    if (tc) {
        json_object_set_new(tc, "chat_template", json_string(
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
            "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"));
        json_dump_file(tc, cmd, 0);
        json_decref(tc);
    }
    snprintf(args, sizeof args, "generate --chat -m %s -p 'Once upon a time' -n 8", mdir);
    rc = sh_run(args, out, sizeof out);
    CHECK(copied && tc && rc == 0 && !strncmp(out, ", there was a little girl", 25), "generate --chat renders the template (rc %d): %.40s", rc, out);
    snprintf(args, sizeof args, "chat -m %s -n 12 < /dev/null", mdir);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0, "chat ends cleanly at end of input (rc %d)", rc);
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\nLily and Ben\\n' | %s chat -m %s -n 12 > %s/chat.out 2>&1", cli, mdir, cli_tmp);
    rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/chat.out", cli_tmp);
    FILE *cf = fopen(cmd, "r");
    size_t got = cf ? fread(out, 1, sizeof out - 1, cf) : 0;
    out[got] = 0;
    if (cf) fclose(cf);
    int turns = 0;
    for (char *q = out; (q = strstr(q, "tok/s]")); q++) turns++;
    CHECK(rc == 0 && turns == 2 && strstr(out, ", there was a little girl"), "chat answers two turns (%d turns)", turns);
    /* the second turn reuses the cached first turn: its reply must equal a fresh greedy run on the
     * whole conversation (rendered by `template`, tokenized by `tokenize`), which a wrong reuse
     * offset or a stale cache tail would change */
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\nLily and Ben\\n' | %s chat -m %s -n 12 2>/dev/null > %s/chat2.out", cli,
             mdir, cli_tmp);
    rc = system(cmd);
    char replies[2][256] = {"", ""};
    snprintf(cmd, sizeof cmd, "%s/chat2.out", cli_tmp);
    cf = fopen(cmd, "r");
    for (int i = 0; cf && i < 2 && fgets(replies[i], sizeof replies[i], cf); i++) replies[i][strcspn(replies[i], "\n")] = 0;
    if (cf) fclose(cf);
    json_t *conv = json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "Once upon a time", "role",
                             "assistant", "content", replies[0], "role", "user", "content", "Lily and Ben");
    snprintf(cmd, sizeof cmd, "%s/conv.json", cli_tmp);
    int wrote = conv && json_dump_file(conv, cmd, 0) == 0;
    json_decref(conv);
    snprintf(cmd, sizeof cmd,
             "%s template -m %s --messages %s/conv.json > %s/conv.txt && %s tokenize -m %s --no-bos-eos --ids - < %s/conv.txt | "
             "tr ' ' ',' > %s/conv.ids && %s generate -m %s --ignore-chat-template -q -n 12 --tokens $(cat %s/conv.ids) > %s/fresh.out",
             cli, mdir, cli_tmp, cli_tmp, cli, mdir, cli_tmp, cli_tmp, cli, mdir, cli_tmp, cli_tmp);
    int frc = system(cmd);
    char fresh[256] = "";
    snprintf(cmd, sizeof cmd, "%s/fresh.out", cli_tmp);
    cf = fopen(cmd, "r");
    if (cf && fgets(fresh, sizeof fresh, cf)) fresh[strcspn(fresh, "\n")] = 0;
    if (cf) fclose(cf);
    CHECK(rc == 0 && wrote && frc == 0 && replies[1][0] && !strcmp(replies[1], fresh),
          "chat's second turn, fed after the cached first, equals a fresh run on the whole conversation ('%s' vs '%s')",
          replies[1], fresh);
    snprintf(args, sizeof args, "generate --chat -m %s -p hi -n 2", sh);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 1, "generate --chat on a model without a chat template fails cleanly (rc %d)", rc);

    cli_cleanup();
    return CHECK_DONE();
}
