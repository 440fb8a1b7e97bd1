/*
 * serve-tools.c — tool calls in a chat reply, for the two template families
 * of ../shared/tokenizers:
 *   Qwen3 / Hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
 *                   (any number of blocks; the text around them is content);
 *   Llama 3:        the whole reply is {"name": ..., "parameters": {...}},
 *                   optionally after <|python_tag|>.
 * Returns OpenAI's tool_calls array ({id, type: "function", function: {name,
 * arguments: a JSON string}}) or NULL when the reply holds none; *content
 * receives the text outside the calls (malloc'd). A streamed reply is cut
 * into the same calls as it arrives by serve-resp.c (tool_stream).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "serve.h"

static json_t *call_of(json_t *j, int k) {
    json_t *name = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
    if (!args) args = json_object_get(j, "parameters");
    if (!json_is_string(name)) return NULL;
    char *a = args ? (json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY))
                   : strdup("{}");
    if (!a) return NULL;
    json_t *c = json_pack("{s:o,s:s,s:{s:O,s:s}}", "id", json_sprintf("call_%d", k), "type", "function", "function",
                          "name", name, "arguments", a);
    free(a);
    return c;
}

json_t *srv_tool_call_parse(const char *json, size_t n, int k) {
    json_t *j = json_loadb(json, n, 0, NULL);
    json_t *c = json_is_object(j) ? call_of(j, k) : NULL;
    json_decref(j);
    return c;
}

json_t *srv_tool_calls(const char *text, char **content) {
    *content = NULL;
    json_t *calls = json_array();
    char *rest = malloc(strlen(text) + 1);
    if (!calls || !rest) { json_decref(calls); free(rest); return NULL; }
    size_t n = 0;
    const char *p = text;
    for (;;) {
        const char *a = strstr(p, "<tool_call>"), *b = a ? strstr(a, "</tool_call>") : NULL;
        if (!a || !b) break;
        memcpy(rest + n, p, (size_t)(a - p));
        n += (size_t)(a - p);
        a += strlen("<tool_call>");
        json_t *c = srv_tool_call_parse(a, (size_t)(b - a), (int)json_array_size(calls));
        if (c) json_array_append_new(calls, c);
        p = b + strlen("</tool_call>");
    }
    strcpy(rest + n, p);
    if (!json_array_size(calls)) {   /* Llama 3: the reply is one JSON object */
        const char *q = text;
        if (!strncmp(q, "<|python_tag|>", 14)) q += 14;
        while (*q == ' ' || *q == '\n') q++;
        json_t *c = *q == '{' ? srv_tool_call_parse(q, strlen(q), 0) : NULL;
        if (c) { json_array_append_new(calls, c); rest[0] = 0; }
    }
    if (!json_array_size(calls)) { json_decref(calls); free(rest); return NULL; }
    char *s = rest, *e = rest + strlen(rest);   /* trim the content between calls */
    while (*s == ' ' || *s == '\n') s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\n')) e--;
    *e = 0;
    memmove(rest, s, (size_t)(e - s) + 1);
    *content = rest;
    return calls;
}
