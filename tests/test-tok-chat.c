/*
 * test-tok-chat.c — cinfer_chat_render against transformers'
 * apply_chat_template on the real Qwen3, Llama 3 and Gemma 3 tokenizer
 * configs, from tests/fixtures/templates/<name>.json (made by
 * tests/reference/make_template_fixtures.py): each case's call (messages,
 * tools, add_generation_prompt, kwargs) must render to `expected` byte for
 * byte, or fail where transformers raised. The template engine itself is
 * tested by test-chat-template.c; this test checks the variables the public
 * function builds (special-token strings, tools/documents, kwargs).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"
#include "template-errors.h"

static char tmpdir[256];

static int place(const char *src, const char *dst) {
    char cmd[3400], gz[1500];
    if (access(src, R_OK) == 0) snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    else {
        snprintf(gz, sizeof gz, "%s.gz", src);
        if (access(gz, R_OK) != 0) return 0;
        snprintf(cmd, sizeof cmd, "gzip -dc '%s' > '%s'", gz, dst);
    }
    return system(cmd) == 0;
}

static void run_one(const char *name) {
    char dir[600], a[1400], b[1400], fx[600];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    snprintf(a, sizeof a, "mkdir -p '%s'", dir);
    if (system(a) != 0) { CHECK(0, "%s: mkdir", name); return; }
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/tokenizers/%s/%s", shared_dir(), name, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        if (!place(a, b)) { CHECK(0, "%s: set up %s", name, a); return; }
    }
    snprintf(fx, sizeof fx, "tests/fixtures/templates/%s.json", name);
    json_t *root = json_load_file(fx, 0, NULL);
    CHECK(root != NULL, "%s: fixture %s loads", name, fx);
    if (!root) return;
    cinfer_tokenizer *t = NULL;
    char err[1024] = "";
    cinfer_status st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
    CHECK(st == CINFER_OK, "%s: tokenizer loads (%s)", name, err);
    if (st) { json_decref(root); return; }
    json_t *cases = json_object_get(root, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i), *call = json_object_get(c, "call");
        const char *cname = json_string_value(json_object_get(c, "name"));
        char *msgs = json_dumps(json_object_get(call, "messages"), JSON_COMPACT);
        json_t *tools = json_object_get(call, "tools"), *kw = json_object_get(call, "kwargs");
        char *tj = tools && !json_is_null(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
        char *kj = kw && json_object_size(kw) ? json_dumps(kw, JSON_COMPACT) : NULL;
        char *out = NULL;
        err[0] = 0;
        st = cinfer_chat_render(t, msgs, tj, kj, json_is_true(json_object_get(call, "add_generation_prompt")),
                                &out, err, sizeof err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        if (want) {
            CHECK(st == CINFER_OK && !strcmp(out, want), "%s %s: renders as transformers (%s)", name, cname,
                  st ? err : "");
            if (!st && strcmp(out, want)) printf("  got:\n%s\n  want:\n%s\n", out, want);
        } else {
            const char *raised = json_string_value(json_object_get(c, "expected_error"));
            char why[128] = "";
            CHECK(out == NULL && raised && tmpl_error_ok(raised, st, err, why, sizeof why),
                  "%s %s: fails where transformers raises '%s' (status %d: %s; %s)", name, cname, raised ? raised : "?", st, err, why);
        }
        free(out);
        free(msgs);
        free(tj);
        free(kj);
    }
    /* bad arguments give messages, not crashes */
    char *out = NULL;
    err[0] = 0;
    st = cinfer_chat_render(t, "[{\"role\": \"user\"", NULL, NULL, 1, &out, err, sizeof err);
    CHECK(st == CINFER_EINVAL && out == NULL && strstr(err, "messages"), "%s: truncated messages JSON is an error (%s)", name, err);
    st = cinfer_chat_render(t, "{}", NULL, NULL, 1, &out, err, sizeof err);
    CHECK(st == CINFER_EINVAL && out == NULL, "%s: messages must be an array (%s)", name, err);
    st = cinfer_chat_render(t, "[]", NULL, "[1]", 1, &out, err, sizeof err);
    CHECK(st == CINFER_EINVAL && out == NULL, "%s: kwargs must be an object (%s)", name, err);
    cinfer_tokenizer_free(t);
    json_decref(root);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cinfer-tokchat-XXXXXX");
    if (!mkdtemp(tmpdir)) { printf("FAIL mkdtemp\n"); return 1; }
    run_one("qwen3");
    run_one("llama3");
    run_one("gemma3");
    /* a tokenizer without a chat template */
    cinfer_tokenizer *t = NULL;
    char err[512] = "", p[600];
    snprintf(p, sizeof p, "%s/models/stories260k", shared_dir());
    if (cinfer_tokenizer_load(p, &t, err, sizeof err) == CINFER_OK) {
        char *out = NULL;
        cinfer_status st = cinfer_chat_render(t, "[]", NULL, NULL, 1, &out, err, sizeof err);
        CHECK(st == CINFER_ENOTFOUND && strstr(err, "chat template"), "no chat template is ENOTFOUND (%s)", err);
        cinfer_tokenizer_free(t);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) return 1;
    return CHECK_DONE();
}
