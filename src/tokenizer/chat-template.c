/*
 * chat-template.c — tmpl_render: renders a Hugging Face chat template (Jinja)
 * with a JSON context, the way transformers' apply_chat_template does.
 *
 * Pipeline: the context is parsed with jansson and converted to interpreter
 * values (object key order kept); the template source gets Jinja's newline
 * handling (\r\n and \r become \n, one trailing newline dropped since
 * keep_trailing_newline=False); then lex (jinja-lex.c), parse
 * (jinja-parse.c) and execute (jinja-eval.c, jinja-builtins.c) in scopes
 * globals -> context -> template.
 *
 * All objects live in one arena (jinja-value.c); any error longjmps back
 * here, frees the arena and returns a status with a message naming the
 * construct and template line. References: Jinja 3.1 (lexer.py, parser.py,
 * filters.py, tests.py, sandbox.py), transformers' chat_template_utils.py.
 */
#include "tokenizer/chat-template.h"
#include "tokenizer/jinja-internal.h"
#include "cinfer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jv from_json(tmpl_st *J, json_t *j, int depth) {
    if (depth > 2 * TMPL_MAX_DEPTH)
        tmpl_fail(J, CINFER_EINVAL, 0, "context JSON nested too deeply (over %d levels)", 2 * TMPL_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_dict(J, JD_PLAIN);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) jd_set(J, &d, jv_cstr(J, k), from_json(J, v, depth + 1));
        return d;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jv l = jv_list(J, n);
        for (size_t i = 0; i < n; i++) jl_push(J, &l, from_json(J, json_array_get(j, i), depth + 1));
        return l;
    }
    case JSON_STRING: return jv_str(J, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    default: return jv_none();
    }
}

static void set_err(char *err, size_t err_len, const char *msg) {
    if (err && err_len) snprintf(err, err_len, "%s", msg);
}

int tmpl_render(const char *source, const char *context_json, char **out, char *err, size_t err_len) {
    if (out) *out = NULL;
    if (err && err_len) err[0] = 0;
    if (!source || !out) { set_err(err, err_len, "tmpl_render: source and out are required"); return CINFER_EINVAL; }

    json_t *ctx = NULL;
    if (context_json && *context_json) {
        json_error_t je;
        ctx = json_loads(context_json, JSON_ALLOW_NUL, &je);
        if (!ctx) {
            if (err && err_len) snprintf(err, err_len, "template context: bad JSON at line %d: %s", je.line, je.text);
            return CINFER_EFORMAT;
        }
        if (!json_is_object(ctx)) {
            json_decref(ctx);
            set_err(err, err_len, "template context must be a JSON object");
            return CINFER_EFORMAT;
        }
    }

    tmpl_st *J = calloc(1, sizeof *J);
    if (!J) { json_decref(ctx); set_err(err, err_len, "out of memory"); return CINFER_ENOMEM; }
    J->err = err; J->err_len = err_len;
    char stack_mark;
    J->stack_base = (uintptr_t)&stack_mark;
    int status = CINFER_OK;
    if (setjmp(J->jb)) {
        status = J->status ? J->status : CINFER_EINVAL;
        goto done;
    }
    {
        /* Jinja newline handling */
        size_t n = strlen(source);
        char *src = tmpl_alloc(J, n + 1);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (source[i] == '\r') { src[k++] = '\n'; if (i + 1 < n && source[i + 1] == '\n') i++; }
            else src[k++] = source[i];
        }
        if (k && src[k - 1] == '\n') k--;
        src[k] = 0;

        jtok *toks; size_t ntok;
        tmpl_lex(J, src, k, &toks, &ntok);
        jnode *root = tmpl_parse(J, toks, ntok);

        jscope *globals = tmpl_scope_new(J, NULL);
        tmpl_add_globals(J, globals);
        jscope *cscope = tmpl_scope_new(J, globals);
        if (ctx) {
            const char *key;
            json_t *v;
            json_object_foreach(ctx, key, v) tmpl_scope_set(J, cscope, tmpl_strndup(J, key, strlen(key)), from_json(J, v, 0));
        }
        jscope *top = tmpl_scope_new(J, cscope);
        tbuf o; tbuf_init(&o, J);
        tmpl_exec(J, top, &root->body, &o);
        char *res = malloc(o.n + 1);
        if (!res) tmpl_fail(J, CINFER_ENOMEM, 0, "out of memory");
        if (o.n) memcpy(res, o.p, o.n);
        res[o.n] = 0;
        *out = res;
    }
done:
    tmpl_arena_free(J);
    free(J);
    json_decref(ctx);
    return status;
}
