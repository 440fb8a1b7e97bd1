/*
 * tok-json.c — the in-place JSON reader of tok-json.h (RFC 8259).
 *
 * Recursive descent with a depth cap; every read is bounds-checked against
 * the end pointer, so truncated or hostile files fail with an offset instead
 * of reading past the buffer. \u escapes (with surrogate pairs) are decoded to
 * UTF-8; a lone surrogate becomes U+FFFD as serde_json's lossy readers do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok-json.h"

typedef struct tjp {
    tj_doc *d;
    char *p, *beg, *end;
    char *err;
    size_t err_len;
    int failed;
} tjp;

static void fail(tjp *s, const char *what) {
    if (!s->failed && s->err && s->err_len)
        snprintf(s->err, s->err_len, "JSON error at byte %zu: %s", (size_t)(s->p - s->beg), what);
    s->failed = 1;
}

static uint32_t new_node(tjp *s, uint8_t type) {
    tj_doc *d = s->d;
    if (d->count == d->cap) {
        uint32_t nc = d->cap ? d->cap * 2 : 1024;
        if (nc < d->cap || nc > 0x7fffffffu) { fail(s, "too many values"); return TJ_NONE; }
        tj_node *nn = realloc(d->n, (size_t)nc * sizeof *nn);
        if (!nn) { fail(s, "out of memory"); return TJ_NONE; }
        d->n = nn;
        d->cap = nc;
    }
    uint32_t i = d->count++;
    memset(&d->n[i], 0, sizeof d->n[i]);
    d->n[i].type = type;
    d->n[i].next = TJ_NONE;
    return i;
}

static void ws(tjp *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static char *put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) *o++ = (char)cp;
    else if (cp < 0x800) { *o++ = (char)(0xc0 | (cp >> 6)); *o++ = (char)(0x80 | (cp & 0x3f)); }
    else if (cp < 0x10000) {
        *o++ = (char)(0xe0 | (cp >> 12)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *o++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *o++ = (char)(0xf0 | (cp >> 18)); *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
        *o++ = (char)(0x80 | ((cp >> 6) & 0x3f)); *o++ = (char)(0x80 | (cp & 0x3f));
    }
    return o;
}

/* s->p at the opening quote; decodes in place; returns start, sets *len. */
static char *parse_string(tjp *s, uint32_t *len) {
    char *start = ++s->p, *o = start;
    /* fast path: scan to the first quote or backslash */
    char *q = start;
    while (q < s->end && *q != '"' && *q != '\\') {
        if ((unsigned char)*q < 0x20) { s->p = q; fail(s, "control character in string"); return NULL; }
        q++;
    }
    if (q < s->end && *q == '"') {
        *len = (uint32_t)(q - start);
        *q = 0;
        s->p = q + 1;
        return start;
    }
    o = q;
    s->p = q;
    while (s->p < s->end) {
        char c = *s->p;
        if (c == '"') {
            *len = (uint32_t)(o - start);
            *o = 0;  /* o <= s->p: safe */
            s->p++;
            return start;
        }
        if ((unsigned char)c < 0x20) { fail(s, "control character in string"); return NULL; }
        if (c != '\\') { *o++ = c; s->p++; continue; }
        if (s->end - s->p < 2) break;
        char e = s->p[1];
        s->p += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (s->end - s->p < 4 || !hex4(s->p, &cp)) { fail(s, "bad \\u escape"); return NULL; }
            s->p += 4;
            if (cp >= 0xd800 && cp < 0xdc00) {
                if (s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' && hex4(s->p + 2, &lo) &&
                    lo >= 0xdc00 && lo < 0xe000) {
                    s->p += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else cp = 0xfffd;
            } else if (cp >= 0xdc00 && cp < 0xe000) cp = 0xfffd;
            /* an escape of 6 (or 12) input bytes yields at most 3 (or 4) */
            o = put_utf8(o, cp);
            break;
        }
        default: fail(s, "bad escape"); return NULL;
        }
    }
    fail(s, "unterminated string");
    return NULL;
}

static uint32_t parse_value(tjp *s, int depth);

static uint32_t parse_container(tjp *s, int depth, int obj) {
    uint32_t me = new_node(s, obj ? TJ_OBJ : TJ_ARR);
    if (me == TJ_NONE) return TJ_NONE;
    s->d->n[me].u.first = TJ_NONE;
    s->p++;
    ws(s);
    char close = obj ? '}' : ']';
    if (s->p < s->end && *s->p == close) { s->p++; return me; }
    uint32_t last = TJ_NONE, count = 0;
    for (;;) {
        const char *key = NULL;
        uint32_t klen = 0;
        ws(s);
        if (obj) {
            if (s->p >= s->end || *s->p != '"') { fail(s, "expected a key"); return TJ_NONE; }
            key = parse_string(s, &klen);
            if (!key) return TJ_NONE;
            ws(s);
            if (s->p >= s->end || *s->p != ':') { fail(s, "expected ':'"); return TJ_NONE; }
            s->p++;
        }
        uint32_t c = parse_value(s, depth + 1);
        if (c == TJ_NONE) return TJ_NONE;
        s->d->n[c].key = key;
        s->d->n[c].klen = klen;
        if (last == TJ_NONE) s->d->n[me].u.first = c;
        else s->d->n[last].next = c;
        last = c;
        count++;
        ws(s);
        if (s->p >= s->end) { fail(s, "unexpected end of input"); return TJ_NONE; }
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == close) { s->p++; break; }
        fail(s, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        return TJ_NONE;
    }
    s->d->n[me].len = count;
    return me;
}

static uint32_t parse_value(tjp *s, int depth) {
    if (depth > TJ_MAX_DEPTH) { fail(s, "nesting too deep"); return TJ_NONE; }
    ws(s);
    if (s->p >= s->end) { fail(s, "unexpected end of input"); return TJ_NONE; }
    char c = *s->p;
    if (c == '{' || c == '[') return parse_container(s, depth, c == '{');
    if (c == '"') {
        uint32_t len;
        char *str = parse_string(s, &len);
        if (!str) return TJ_NONE;
        uint32_t me = new_node(s, TJ_STR);
        if (me == TJ_NONE) return TJ_NONE;
        s->d->n[me].u.s = str;
        s->d->n[me].len = len;
        return me;
    }
    static const struct { const char *w; uint8_t t; } lits[] = {
        {"null", TJ_NULL}, {"true", TJ_TRUE}, {"false", TJ_FALSE}};
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(lits[i].w);
        if ((size_t)(s->end - s->p) >= l && !memcmp(s->p, lits[i].w, l)) {
            s->p += l;
            return new_node(s, lits[i].t);
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char *q = s->p;
        if (*q == '-') q++;
        if (q >= s->end || *q < '0' || *q > '9') { fail(s, "bad number"); return TJ_NONE; }
        while (q < s->end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' ||
                              *q == '+' || *q == '-')) q++;
        char tmp[64];
        size_t l = (size_t)(q - s->p);
        if (l >= sizeof tmp) { fail(s, "number too long"); return TJ_NONE; }
        memcpy(tmp, s->p, l);
        tmp[l] = 0;
        char *e;
        double v = strtod(tmp, &e);
        if (e != tmp + l) { fail(s, "bad number"); return TJ_NONE; }
        s->p = q;
        uint32_t me = new_node(s, TJ_NUM);
        if (me == TJ_NONE) return TJ_NONE;
        s->d->n[me].u.num = v;
        return me;
    }
    fail(s, "unexpected character");
    return TJ_NONE;
}

int tj_parse(tj_doc *d, char *buf, size_t len, char *err, size_t err_len) {
    memset(d, 0, sizeof *d);
    tjp s = {d, buf, buf, buf + len, err, err_len, 0};
    uint32_t root = parse_value(&s, 0);
    if (root != TJ_NONE) {
        ws(&s);
        if (s.p != s.end) fail(&s, "trailing characters after the document");
    }
    if (s.failed || root == TJ_NONE) {
        tj_free(d);
        return -1;
    }
    return 0;
}

void tj_free(tj_doc *d) {
    free(d->n);
    memset(d, 0, sizeof *d);
}

const tj_node *tj_first(const tj_doc *d, const tj_node *v) {
    if (!v || (v->type != TJ_ARR && v->type != TJ_OBJ) || v->u.first == TJ_NONE) return NULL;
    return &d->n[v->u.first];
}

const tj_node *tj_next(const tj_doc *d, const tj_node *v) {
    return v->next == TJ_NONE ? NULL : &d->n[v->next];
}

const tj_node *tj_get(const tj_doc *d, const tj_node *obj, const char *key) {
    if (!obj || obj->type != TJ_OBJ) return NULL;
    size_t kl = strlen(key);
    for (const tj_node *c = tj_first(d, obj); c; c = tj_next(d, c))
        if (c->klen == kl && !memcmp(c->key, key, kl)) return c;
    return NULL;
}

const char *tj_str(const tj_node *v) {
    return v && v->type == TJ_STR ? v->u.s : NULL;
}

int tj_bool(const tj_node *v, int def) {
    if (!v) return def;
    if (v->type == TJ_TRUE) return 1;
    if (v->type == TJ_FALSE) return 0;
    return def;
}
