/*
 * chat.c — cinfer_chat_render: builds the variables a Hugging Face chat
 * template sees and hands them to the Jinja interpreter (chat-template.c).
 *
 * The context mirrors transformers' apply_chat_template: the special-token
 * strings of tokenizer_config.json that are set (bos/eos/unk/sep/pad/cls/
 * mask_token and the extra_special_tokens), messages, tools (null when not
 * given), documents (null), add_generation_prompt, then every key of
 * kwargs_json (which may override any of them). The template comes
 * from tokenizer_config.json "chat_template" (a string, or a list of
 * {name, template} of which "default" is used) or, preferred when present,
 * from a chat_template.jinja file beside it (newer transformers save it so).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chat-template.h"
#include "tokenizer/tokenizer.h"
#include "util.h"

static json_t *parse(const char *what, const char *s, int want_array, cinfer_status *st, char *err, size_t n) {
    json_error_t je;
    json_t *v = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) {
        *st = cf_err(err, n, CINFER_EINVAL, "%s: invalid JSON at line %d column %d: %s", what, je.line, je.column, je.text);
        return NULL;
    }
    if (want_array ? !json_is_array(v) : !json_is_object(v)) {
        json_decref(v);
        *st = cf_err(err, n, CINFER_EINVAL, "%s: expected a JSON %s", what, want_array ? "array" : "object");
        return NULL;
    }
    return v;
}

int cinfer_tokenizer_has_chat_template(const cinfer_tokenizer *t) { return t && t->chat_template; }

cinfer_status cinfer_chat_render(const cinfer_tokenizer *t, const char *messages_json,
                                 const char *tools_json, const char *kwargs_json,
                                 int add_generation_prompt, char **out, char *err, size_t err_len) {
    return cinfer_chat_render_with(t, NULL, messages_json, tools_json, kwargs_json, add_generation_prompt, out, err, err_len);
}

cinfer_status cinfer_chat_render_with(const cinfer_tokenizer *t, const char *template_source, const char *messages_json,
                                      const char *tools_json, const char *kwargs_json,
                                      int add_generation_prompt, char **out, char *err, size_t err_len) {
    if (!out) return cf_err(err, err_len, CINFER_EINVAL, "cinfer_chat_render: out is NULL");
    *out = NULL;
    if (!t || !messages_json) return cf_err(err, err_len, CINFER_EINVAL, "cinfer_chat_render: tokenizer and messages are required");
    const char *source = template_source ? template_source : t->chat_template;
    if (!source)
        return cf_err(err, err_len, CINFER_ENOTFOUND, "the tokenizer has no chat template (tokenizer_config.json \"chat_template\")");
    cinfer_status st = CINFER_OK;
    json_t *ctx = json_object();
    json_t *msgs = parse("messages", messages_json, 1, &st, err, err_len);
    if (!ctx || !msgs) { json_decref(ctx); return st ? st : CINFER_ENOMEM; }
    if (t->chat_vars) {
        json_t *vars = json_loads(t->chat_vars, 0, NULL);
        if (vars) json_object_update(ctx, vars);
        json_decref(vars);
    }
    json_object_set_new(ctx, "messages", msgs);
    json_t *tools = json_null();
    if (tools_json && !(tools = parse("tools", tools_json, 1, &st, err, err_len))) { json_decref(ctx); return st; }
    json_object_set_new(ctx, "tools", tools);
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (kwargs_json) {
        json_t *kw = parse("kwargs", kwargs_json, 0, &st, err, err_len);
        if (!kw) { json_decref(ctx); return st; }
        json_object_update(ctx, kw);
        json_decref(kw);
    }
    char *cj = json_dumps(ctx, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(ctx);
    if (!cj) return cf_err(err, err_len, CINFER_ENOMEM, "cinfer_chat_render: out of memory");
    int rc = tmpl_render(source, cj, out, err, err_len);
    free(cj);
    return (cinfer_status)rc;
}
