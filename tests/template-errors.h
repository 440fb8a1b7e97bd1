/*
 * template-errors.h — what a chat template that raised in transformers/jinja2
 * must give here (test-chat-template.c, test-tok-chat.c). The fixtures record
 * the exception as "Class: message"; src/tokenizer/chat-template.h documents
 * the status of each kind of failure, and the message must name the problem:
 *   TemplateSyntaxError                     -> CINFER_EFORMAT,      "syntax error"
 *   TemplateAssertionError, SecurityError   -> CINFER_EUNSUPPORTED, the unknown name
 *   TemplateError (raise_exception), runtime type/value/undefined/recursion
 *   errors                                  -> CINFER_EINVAL,       the message's gist
 * Every message also names the template line ("template line N").
 */
#ifndef CINFER_TEMPLATE_ERRORS_H
#define CINFER_TEMPLATE_ERRORS_H
#include <stdio.h>
#include <string.h>
#include "cinfer.h"

/* 1 when (st, err) is what `expected` ("Class: message") maps to; else 0 and why[] says what was wanted */
static inline int tmpl_error_ok(const char *expected, int st, const char *err, char *why, size_t n) {
    /* needle NULL: the first quoted name of the message ('...' or "..."), if it has one;
     * "^": the message's start (raise_exception's own text); "": the status and line only (type errors:
 * Python's wording varies by operator, e.g. "can't multiply sequence" vs "unsupported operand") */
    static const struct { const char *cls; int st; const char *needle; } map[] = {
        {"TemplateSyntaxError", CINFER_EFORMAT, NULL}, {"SyntaxError", CINFER_EFORMAT, NULL},
        {"TemplateAssertionError", CINFER_EUNSUPPORTED, NULL}, {"SecurityError", CINFER_EUNSUPPORTED, NULL},
        {"TemplateError", CINFER_EINVAL, "^"}, {"UndefinedError", CINFER_EINVAL, NULL},
        {"TypeError", CINFER_EINVAL, ""}, {"TemplateRuntimeError", CINFER_EINVAL, NULL},
        {"AttributeError", CINFER_EINVAL, ""}, {"FilterArgumentError", CINFER_EINVAL, ""},
        {"ValueError", CINFER_EINVAL, "unpack"}, {"ZeroDivisionError", CINFER_EINVAL, "by zero"},
        {"RecursionError", CINFER_EINVAL, "recursion"},
    };
    /* known deviation: cinfer refuses calls with star arguments when parsing (a construct it does not
     * implement) before jinja2 gets to raise UndefinedError for the callee; and it refuses to print
     * a generator, whose text in Python is a memory address, where jinja2 goes on to a TypeError */
    if (err && (strstr(err, "*args / **kwargs in calls are not supported") || strstr(err, "printing a generator"))) {
        snprintf(why, n, "known deviation: want status %d", CINFER_EUNSUPPORTED);
        return st == CINFER_EUNSUPPORTED;
    }
    size_t cl = strcspn(expected, ":");
    const char *msg = expected[cl] ? expected + cl + 1 + (expected[cl + 1] == ' ') : "";
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        if (strlen(map[i].cls) != cl || strncmp(expected, map[i].cls, cl)) continue;
        char needle[48] = "";
        if (map[i].needle && !strcmp(map[i].needle, "^")) snprintf(needle, sizeof needle, "%.40s", msg);
        else if (map[i].needle) snprintf(needle, sizeof needle, "%s", map[i].needle);
        else {
            const char *q = msg + strcspn(msg, "'\"");
            size_t k = *q ? strcspn(q + 1, "'\"") : 0;
            if (*q) snprintf(needle, sizeof needle, "%.*s", (int)(k < 40 ? k : 40), q + 1);
        }
        int ok = st == map[i].st && err && strstr(err, "template line") && strcasestr(err, needle);
        snprintf(why, n, "want status %d and '%s'", map[i].st, needle);
        return ok;
    }
    snprintf(why, n, "no rule for '%.*s'", (int)cl, expected);
    return 0;
}
#endif
