/*
 * test-chat-template.c — the chat-template interpreter against transformers.
 *
 * tests/fixtures/templates/{qwen3,llama3,gemma3}.json hold renders made by
 * transformers 5.17's apply_chat_template (tests/reference/
 * make_template_fixtures.py on the GPU machine); the templates themselves are
 * read from ../shared/tokenizers/<name>/tokenizer_config.json(.gz). micro.json
 * holds small feature templates rendered by the same Jinja environment, and
 * extra.json ~200 edge cases rendered by jinja2 3.1.6 configured the same way.
 * Every render must match byte for byte; cases where transformers raised must
 * fail here too. Then error cases (syntax errors, unknown filters,
 * raise_exception, hostile nesting/recursion/loops) must return the right
 * status with a message and never crash (run under ASan/UBSan by make test).
 */
#include "check.h"
#include "cinfer.h"
#include "tokenizer/chat-template.h"
#include "template-errors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static char *read_all(FILE *f) {
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    size_t k;
    while (p && (k = fread(p + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n - 1 == 0) { cap *= 2; char *q = realloc(p, cap); if (!q) { free(p); return NULL; } p = q; }
    }
    if (p) p[n] = 0;
    return p;
}

/* the chat_template string of ../shared/tokenizers/<name>/tokenizer_config.json[.gz] */
static char *load_template(const char *name) {
    char path[1024], cmd[1200];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer_config.json", shared_dir(), name);
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    if (f) { text = read_all(f); fclose(f); }
    else {
        snprintf(cmd, sizeof cmd, "gzip -dc '%s.gz' 2>/dev/null", path);
        FILE *p = popen(cmd, "r");
        if (!p) return NULL;
        text = read_all(p);
        pclose(p);
    }
    if (!text) return NULL;
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (!j) return NULL;
    json_t *t = json_object_get(j, "chat_template");
    char *res = json_is_string(t) ? strdup(json_string_value(t)) : NULL;
    json_decref(j);
    return res;
}

/* first differing byte, for readable failures */
static void show_diff(const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("   at byte %zu\n   got:  \"%.100s\"\n   want: \"%.100s\"\n", i, got + from, want + from);
}

/* extra.json has ~1500 cases: one CHECK per group (name without its number),
 * with the failing cases printed; the other files get a CHECK per case */
typedef struct group { char name[32]; int ok, bad; } group;

static group *group_of(group *g, int *ng, const char *name) {
    char key[32];
    size_t n = strcspn(name, "0123456789");
    snprintf(key, sizeof key, "%.*s", (int)(n < 31 ? n : 31), name);
    for (int i = 0; i < *ng; i++) if (!strcmp(g[i].name, key)) return &g[i];
    if (*ng == 64) return &g[63];
    snprintf(g[*ng].name, sizeof g[*ng].name, "%s", key);
    g[*ng].ok = g[*ng].bad = 0;
    return &g[(*ng)++];
}

static void run_fixture_file(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/templates/%s.json", file);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    CHECK(root != NULL, "%s: fixture file loads", path);
    if (!root) return;
    json_t *cases = json_object_get(root, "cases");
    int own = !strcmp(file, "micro") || !strcmp(file, "extra");   /* cases carry their template */
    int grouped = !strcmp(file, "extra");
    group groups[64];
    int ngroups = 0;
    char *tmpl = own ? NULL : load_template(file);
    if (!own) CHECK(tmpl != NULL, "%s: chat_template read from %s/tokenizers", file, shared_dir());
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *src = tmpl;
        if (own) src = json_string_value(json_object_get(c, "template"));
        if (!src || !name) { CHECK(0, "%s case %zu: has a template and a name", file, i); continue; }
        char *ctx = json_dumps(json_object_get(c, "context"), JSON_PRESERVE_ORDER | JSON_COMPACT);
        char *out = NULL, err[512];
        int st = tmpl_render(src, ctx, &out, err, sizeof err);
        json_t *exp = json_object_get(c, "expected");
        const char *want = json_string_value(exp ? exp : json_object_get(c, "expected_error"));
        char why[128] = "";
        int ok = exp ? (st == CINFER_OK && out && !strcmp(out, want))
                     : (out == NULL && want && tmpl_error_ok(want, st, err, why, sizeof why));
        if (grouped) {
            group *g = group_of(groups, &ngroups, name);
            if (ok) g->ok++;
            else {
                g->bad++;
                printf("  %s/%s: template %s\n  status %d %s %s\n", file, name, src, st, st ? err : "", why);
                if (out && exp) show_diff(out, want);
            }
        } else if (exp) {
            CHECK(ok, "%s/%s renders as transformers (status %d%s%s)", file, name, st, st ? ": " : "", st ? err : "");
            if (!ok && st == CINFER_OK && out) show_diff(out, want);
        } else {
            CHECK(ok, "%s/%s fails like transformers (%s) -> status %d: %s (%s)",
                  file, name, want ? want : "?", st, err, why);
        }
        free(out);
        free(ctx);
    }
    for (int k = 0; k < ngroups; k++)
        CHECK(groups[k].bad == 0, "%s/%s*: %d of %d cases match jinja2 (renders, or fails where it fails)",
              file, groups[k].name, groups[k].ok, groups[k].ok + groups[k].bad);
    free(tmpl);
    json_decref(root);
}

static int render(const char *src, const char *ctx, char **out, char *err, size_t n) {
    return tmpl_render(src, ctx, out, err, n);
}

static void expect_status(const char *what, const char *src, const char *ctx, int want, const char *needle) {
    char *out = NULL, err[512];
    int st = render(src, ctx, &out, err, sizeof err);
    CHECK(st == want && !out && (!needle || strstr(err, needle)),
          "%s -> status %d (want %d), message: %s", what, st, want, err);
    free(out);
}

static void expect_text(const char *what, const char *src, const char *ctx, const char *want) {
    char *out = NULL, err[512];
    int st = render(src, ctx, &out, err, sizeof err);
    CHECK(st == CINFER_OK && out && !strcmp(out, want), "%s -> \"%s\" (%s)", what, out ? out : "(null)",
          st ? err : "ok");
    free(out);
}

static void error_cases(void) {
    expect_status("syntax error: unclosed if", "{% if x %}abc", "{}", CINFER_EFORMAT, "line 1");
    expect_status("syntax error: bad expression", "a\nb\n{{ 1 + }}", "{}", CINFER_EFORMAT, "line 3");
    expect_status("syntax error: mismatched end tag", "{% for x in y %}{% endif %}", "{}", CINFER_EFORMAT, "endif");
    expect_status("syntax error: unknown tag", "{% frobnicate %}", "{}", CINFER_EFORMAT, "frobnicate");
    expect_status("syntax error: unterminated string", "{{ 'abc }}", "{}", CINFER_EFORMAT, NULL);
    expect_status("syntax error: unbalanced brackets", "{{ (1 + 2 }}", "{}", CINFER_EFORMAT, NULL);
    expect_status("syntax error: unclosed comment", "{# abc", "{}", CINFER_EFORMAT, "comment");
    expect_status("unknown filter", "{{ x | frobnicate }}", "{\"x\": 1}", CINFER_EUNSUPPORTED, "frobnicate");
    expect_status("unknown test", "{{ x is frobnicated }}", "{\"x\": 1}", CINFER_EUNSUPPORTED, "frobnicated");
    expect_status("unimplemented Jinja filter", "{{ 'a b' | wordwrap(3) }}", "{}", CINFER_EUNSUPPORTED, "wordwrap");
    expect_status("unsupported tag", "{% include 'x.j2' %}", "{}", CINFER_EUNSUPPORTED, "include");
    expect_status("unsupported string method", "{{ 'a'.zfill(3) }}", "{}", CINFER_EUNSUPPORTED, "zfill");
    expect_status("raise_exception", "{{ raise_exception('Roles must alternate') }}", "{}", CINFER_EINVAL,
                  "Roles must alternate");
    expect_status("undefined attribute", "{{ nothing.attr }}", "{}", CINFER_EINVAL, "nothing");
    expect_status("type error", "{{ 'a' + 1 }}", "{}", CINFER_EINVAL, "concatenate");
    expect_status("immutable list", "{% set l = [1] %}{{ l.append(2) }}", "{}", CINFER_EUNSUPPORTED, "append");
    expect_status("bad context JSON", "{{ x }}", "{\"x\": ", CINFER_EFORMAT, "JSON");
    expect_status("context not an object", "{{ x }}", "[1, 2]", CINFER_EFORMAT, "object");
    expect_status("recursive macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}",
                  CINFER_EINVAL, "too deep");
    expect_status("huge range", "{% for i in range(1000000000) %}x{% endfor %}", "{}", CINFER_EINVAL, "range");
    expect_status("nested loops hit the step limit",
                  "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "{}",
                  CINFER_EINVAL, NULL);
    expect_status("output size limit", "{% for a in range(100000) %}{{ s * 10000 }}{% endfor %}",
                  "{\"s\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
                  CINFER_EINVAL, NULL);

    /* deeply nested template syntax and data */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    size_t k = 0;
    memcpy(deep + k, "{{ ", 3); k += 3;
    for (size_t i = 0; i < depth; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < depth; i++) deep[k++] = ')';
    memcpy(deep + k, " }}", 4);
    expect_status("5000 nested parentheses", deep, "{}", CINFER_EINVAL, "deeply");
    k = 0;
    for (size_t i = 0; i < 400; i++) { memcpy(deep + k, "{% if 1 %}", 10); k += 10; if (k > depth * 2) break; }
    deep[k] = 0;
    expect_status("400 unclosed nested ifs", deep, "{}", CINFER_EINVAL, NULL);
    free(deep);

    /* long flat chains: filters, additions, macro recursion just under/over the limits */
    {
        size_t cap = 200000;
        char *t = malloc(cap);
        k = (size_t)sprintf(t, "{{ 'a'");
        for (int i = 0; i < 5000; i++) k += (size_t)sprintf(t + k, "|upper");
        sprintf(t + k, " }}");
        expect_status("5000 chained filters", t, "{}", CINFER_EINVAL, "deep");
        k = (size_t)sprintf(t, "{{ 1");
        for (int i = 0; i < 5000; i++) k += (size_t)sprintf(t + k, " + 1");
        sprintf(t + k, " }}");
        expect_status("5000 chained additions", t, "{}", CINFER_EINVAL, "deep");
        k = (size_t)sprintf(t, "{%% set x | trim");
        for (int i = 0; i < 300; i++) k += (size_t)sprintf(t + k, " | trim");
        sprintf(t + k, " %%}a{%% endset %%}{{ x }}");
        expect_status("300 filters on a set block", t, "{}", CINFER_EINVAL, "filter chain");
        free(t);
    }
    {
        char t[4096];
        k = (size_t)sprintf(t, "{{ ");
        for (int i = 0; i < 250; i++) t[k++] = '(';
        t[k++] = '1';
        for (int i = 0; i < 250; i++) t[k++] = ')';
        sprintf(t + k, " }}");
        expect_status("250 nested parentheses", t, "{}", CINFER_EINVAL, "deep");
        k = (size_t)sprintf(t, "{{ ");
        for (int i = 0; i < 250; i++) t[k++] = '[';
        for (int i = 0; i < 250; i++) t[k++] = ']';
        sprintf(t + k, " | tojson }}");
        expect_status("250 nested list literals", t, "{}", CINFER_EINVAL, "deep");
        k = (size_t)sprintf(t, "{{ ");
        for (int i = 0; i < 300; i++) k += (size_t)sprintf(t + k, "not ");
        sprintf(t + k, "1 }}");
        expect_status("300 nested nots", t, "{}", CINFER_EINVAL, "deep");
        k = (size_t)sprintf(t, "{{ ");
        for (int i = 0; i < 40; i++) t[k++] = '(';
        t[k++] = '7';
        for (int i = 0; i < 40; i++) t[k++] = ')';
        sprintf(t + k, " }}");
        expect_text("40 nested parentheses", t, "{}", "7");
    }
    {   /* repeated scans of a big string: bounded by the work budget */
        size_t n = 1 << 20;
        char *c = malloc(n + 32);
        memcpy(c, "{\"s\": \"", 7);
        memset(c + 7, 'a', n);
        memcpy(c + 7 + n, "\"}", 3);
        expect_status("100000 substring scans of a 1 MiB string",
                      "{% for i in range(100000) %}{% if 'zz' in s %}x{% endif %}{% endfor %}", c, CINFER_EINVAL, "work");
        free(c);
    }
    expect_text("macro recursion 50 deep",
                "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% else %}done{% endif %}{% endmacro %}{{ f(50) }}",
                "{}", "done");

    char *ctx = malloc(20000);
    k = 0;
    k += (size_t)sprintf(ctx, "{\"x\": ");
    for (int i = 0; i < 1000; i++) ctx[k++] = '[';
    for (int i = 0; i < 1000; i++) ctx[k++] = ']';
    ctx[k++] = '}'; ctx[k] = 0;
    char *out = NULL, err[256];
    int st = render("{{ x | tojson }}{{ x }}", ctx, &out, err, sizeof err);
    CHECK(st != CINFER_OK && out == NULL, "1000-deep nested context list is refused cleanly (status %d: %s)", st, err);
    free(out);
    free(ctx);

    /* NULL/empty arguments */
    st = tmpl_render("abc", NULL, &out, err, sizeof err);
    CHECK(st == CINFER_OK && out && !strcmp(out, "abc"), "NULL context renders plain text");
    free(out);
    st = tmpl_render(NULL, "{}", &out, err, sizeof err);
    CHECK(st == CINFER_EINVAL && out == NULL, "NULL source is EINVAL");
    st = tmpl_render("{{ x", "{}", &out, NULL, 0);
    CHECK(st == CINFER_EFORMAT && out == NULL, "NULL err buffer is fine");

    /* a few behaviours the fixtures do not pin down */
    expect_text("trailing newline dropped", "a\n", "{}", "a");
    expect_text("only one trailing newline dropped", "a\n\n", "{}", "a\n");
    expect_text("strftime_now renders", "{{ strftime_now('%Y') | length }}", "{}", "4");
    expect_text("loop.cycle", "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}", "{}", "aba");
    expect_text("for-else on undefined", "{% for x in nothing %}x{% else %}none{% endfor %}", "{}", "none");
    expect_text("NUL inside a JSON string", "{{ s | length }}", "{\"s\": \"a\\u0000b\"}", "3");
    expect_text("big int and float from JSON", "{{ a }} {{ b }} {{ c }}", "{\"a\": 9007199254740993, \"b\": 1e300, \"c\": 0.1}",
                "9007199254740993 1e+300 0.1");
}

/* truncations and byte mutations of the real templates: any status is fine,
 * but never a crash, a leak or an output on failure (ASan/UBSan run) */
static void mutation_cases(const char *name) {
    char *tmpl = load_template(name);
    if (!tmpl) { CHECK(0, "%s: template for mutation test", name); return; }
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/templates/%s.json", name);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *c0 = root ? json_array_get(json_object_get(root, "cases"), 0) : NULL;
    char *ctx = c0 ? json_dumps(json_object_get(c0, "context"), JSON_COMPACT) : strdup("{}");
    size_t n = strlen(tmpl);
    char *buf = malloc(n + 1);
    int bad = 0, ok = 0, failed = 0;
    uint32_t seed = 12345;
    static const char alphabet[] = "{}%#-+()[]|.'\"~ \nab1=,:!<>*/if";
    for (size_t round = 0; round < 700; round++) {
        memcpy(buf, tmpl, n + 1);
        if (round < 300) buf[(round * 997) % n] = 0;   /* truncation */
        else {
            for (int k = 0; k < 1 + (int)(round % 3); k++) {
                seed = seed * 1103515245u + 12345u;
                size_t at = (seed >> 8) % n;
                seed = seed * 1103515245u + 12345u;
                buf[at] = alphabet[(seed >> 8) % (sizeof alphabet - 1)];
            }
        }
        char *out = NULL, err[256];
        int st = tmpl_render(buf, ctx, &out, err, sizeof err);
        if ((st == CINFER_OK) != (out != NULL) || (st != CINFER_OK && !err[0])) bad++;
        if (st == CINFER_OK) ok++; else failed++;
        free(out);
    }
    CHECK(bad == 0, "%s: 700 truncated/mutated templates: %d rendered, %d refused with a message, %d inconsistent",
          name, ok, failed, bad);
    free(buf); free(ctx); free(tmpl);
    json_decref(root);
}

int main(void) {
    run_fixture_file("micro");
    run_fixture_file("extra");
    run_fixture_file("qwen3");
    run_fixture_file("llama3");
    run_fixture_file("gemma3");
    error_cases();
    mutation_cases("qwen3");
    mutation_cases("llama3");
    mutation_cases("gemma3");
    return CHECK_DONE();
}
