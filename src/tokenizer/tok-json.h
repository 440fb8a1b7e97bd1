/*
 * tok-json.h — a small, fast JSON reader for tokenizer.json.
 *
 * Why not jansson: Gemma 3's tokenizer.json is 33 MB (262k vocab entries and
 * 515k merges); jansson needs ~1 s to build and free its tree. This reader
 * decodes strings in place inside the caller's buffer (an unescaped string is
 * never longer than its escaped form) and keeps every value in one flat node
 * array, so a parse is one pass and one free.
 *
 * Invariants: the buffer must be NUL-terminated and outlive the document;
 * string values are NUL-terminated in place (a string may contain "\u0000",
 * so use .len). Nesting depth is capped (TJ_MAX_DEPTH); errors carry the byte
 * offset. Numbers are kept as doubles (ids < 2^53 are exact).
 */
#ifndef CINFER_TOK_JSON_H
#define CINFER_TOK_JSON_H
#include <stddef.h>
#include <stdint.h>

enum { TJ_NULL, TJ_FALSE, TJ_TRUE, TJ_NUM, TJ_STR, TJ_ARR, TJ_OBJ };
#define TJ_NONE 0xffffffffu
#define TJ_MAX_DEPTH 128

typedef struct tj_node {
    uint8_t type;
    uint32_t next;      /* next sibling, TJ_NONE at the end */
    uint32_t len;       /* string bytes, or number of children */
    uint32_t klen;      /* key bytes when the parent is an object */
    const char *key;    /* key when the parent is an object, else NULL */
    union {
        const char *s;  /* TJ_STR */
        double num;     /* TJ_NUM */
        uint32_t first; /* TJ_ARR / TJ_OBJ: first child or TJ_NONE */
    } u;
} tj_node;

typedef struct tj_doc {
    tj_node *n;         /* [cap] nodes; n[0] is the root */
    uint32_t count, cap;
} tj_doc;

/* Parses buf[len] (buf[len] must be 0; modified in place). Returns 0, or -1
 * with a message in err naming the byte offset. */
int tj_parse(tj_doc *d, char *buf, size_t len, char *err, size_t err_len);
void tj_free(tj_doc *d);

/* Object member by key, or NULL. */
const tj_node *tj_get(const tj_doc *d, const tj_node *obj, const char *key);
/* First child / next sibling (NULL at the end). */
const tj_node *tj_first(const tj_doc *d, const tj_node *v);
const tj_node *tj_next(const tj_doc *d, const tj_node *v);
/* Typed helpers: string value or NULL; boolean with default. */
const char *tj_str(const tj_node *v);
int tj_bool(const tj_node *v, int def);
#endif
