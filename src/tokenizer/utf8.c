/*
 * utf8.c — UTF-8 helpers shared by the tokenizer: validation with the
 * "maximal subpart" replacement rule (what Rust's from_utf8_lossy and
 * Python's errors="replace" both do), the GPT-2 byte<->char map, Unicode
 * whitespace as Rust's char::is_whitespace, and a growable byte buffer.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "tokenizer/tokenizer.h"

int tok_utf8_next(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c == 0xe0) { need = 2; lo = 0xa0; }
    else if (c >= 0xe1 && c <= 0xec) need = 2;
    else if (c == 0xed) { need = 2; hi = 0x9f; }
    else if (c >= 0xee && c <= 0xef) need = 2;
    else if (c == 0xf0) { need = 3; lo = 0x90; }
    else if (c >= 0xf1 && c <= 0xf3) need = 3;
    else if (c == 0xf4) { need = 3; hi = 0x8f; }
    else return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80; hi = 0xbf;
    }
    return need + 1;
}

char *tok_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    /* worst case: every byte becomes 3 bytes of U+FFFD */
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t i = 0, k = 0;
    const unsigned char *u = (const unsigned char *)s;
    while (i < n) {
        if (u[i] < 0x80) { o[k++] = (char)u[i++]; continue; }
        int l = tok_utf8_next(u + i, n - i);
        if (l > 0) { memcpy(o + k, u + i, (size_t)l); k += (size_t)l; i += (size_t)l; continue; }
        if (l == 0) l = (int)(n - i);  /* truncated at the end: one replacement */
        else l = -l;
        memcpy(o + k, "\xef\xbf\xbd", 3);
        k += 3;
        i += (size_t)l;
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

uint32_t tok_utf8_decode(const unsigned char *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f);
    case 3: return ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    default: return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
                    ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
    }
}

int tok_utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xc0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int tok_is_whitespace(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

int tok_is_word_char(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* GPT-2: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static int byte_is_self(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_self(b)) return b;
    uint32_t k = 0;
    for (unsigned i = 0; i < b; i++) k += !byte_is_self(i);
    return 256 + k;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_self(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    /* the 68 remapped bytes in order: 0..32, 127..160, 173 */
    uint32_t k = cp - 256;
    if (k <= 32) return (int)k;
    if (k <= 32 + 34) return (int)(127 + k - 33);
    return 173;
}

int tok_buf_put(tok_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) return -1;
        b->p = p;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tok_ids_push(tok_ids *o, int32_t id) {
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, nc * sizeof *v);
        if (!v) return -1;
        o->v = v;
        o->cap = nc;
    }
    o->v[o->n++] = id;
    return 0;
}

int tok_spans_push(tok_spans *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        tok_span *v = realloc(s->v, nc * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = nc;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return 0;
}
