/*
 * chat-template.h — a Jinja interpreter for the subset of Jinja that Hugging
 * Face chat templates use (tokenizer_config.json "chat_template").
 *
 * Rendering follows transformers' apply_chat_template: Jinja 3.1 in an
 * ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True,
 * loop controls, transformers' tojson (json.dumps, ensure_ascii=False),
 * raise_exception and strftime_now, and Python's printing of None/True/
 * False/ints/floats/lists/dicts.
 *
 * Supported: {{ }}, {% %}, {# #} with -/+ whitespace control, raw; for (with
 * loop.*, else, inline if, break/continue, tuple targets), if/elif/else,
 * set (tuple targets, ns.attr, block set with filters), macro (defaults,
 * keyword args, recursion), filter and with blocks, generation; all Jinja
 * operators; Jinja's filters and tests except the HTML/URL/random ones
 * (wordwrap, truncate, urlize, xmlattr, groupby, slice, random, ...);
 * Python str/dict/list methods that templates call (strip, split, rsplit,
 * startswith, endswith, replace, find, count, join, format, upper/lower/
 * title/capitalize, is*, get/items/keys/values, ...); globals range,
 * namespace, dict, raise_exception, strftime_now. Not supported: include/
 * import/extends/block/call tags, recursive loops, *args and **kwargs, complex
 * numbers, integers beyond 64 bits. A construct the interpreter does not
 * implement is an error naming it (never a silently different prompt).
 *
 * Hostile templates are bounded: nesting/recursion depth, output size and
 * loop work are capped; a template never crashes the process. A render uses
 * at most ~400 KiB of C stack (call it from a thread with >= 512 KiB).
 */
#ifndef CINFER_CHAT_TEMPLATE_H
#define CINFER_CHAT_TEMPLATE_H

#include <stddef.h>

/* Renders Jinja template `source` with the variables of the JSON object
 * `context_json` (messages, tools, add_generation_prompt, bos_token,
 * eos_token, any extra kwargs such as enable_thinking).
 * Returns 0 (CINFER_OK) and a malloc'd NUL-terminated *out (caller frees), or
 * a cinfer_status from include/cinfer.h with *out = NULL and a message in
 * `err` (may be NULL) naming the construct and the template line:
 *   CINFER_EFORMAT       template syntax error, or context_json not an object
 *   CINFER_EUNSUPPORTED  construct/filter/method/test not implemented
 *   CINFER_EINVAL        raise_exception(msg) called by the template, a
 *                        runtime type error, or a resource limit hit
 *   CINFER_ENOMEM        allocation failure */
int tmpl_render(const char *source, const char *context_json, char **out,
                char *err, size_t err_len);

#endif
