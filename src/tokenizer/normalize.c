/*
 * normalize.c — the tokenizer.json normalizers cinfer supports, applied in
 * order to one segment of text (a stretch between added tokens):
 * NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Prepend, Replace (literal or
 * regex), Strip. Input and output are valid UTF-8.
 *
 * Prepend acts only on a non-empty segment, as in HF. NFC has a fast path:
 * text whose code points are all below U+0300 is already in NFC (nothing
 * there composes or decomposes canonically), which covers most prose.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "tokenizer/tokenizer.h"

static int below_0300(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0xcc) return 0;
    return 1;
}

static int do_utf8proc(const char *s, size_t n, int opt, tok_buf *o) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | opt));
    if (r < 0) { free(dst); return -1; }
    int rc = tok_buf_put(o, (const char *)dst, (size_t)r);
    free(dst);
    return rc;
}

static int do_lower(const char *s, size_t n, tok_buf *o) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_next(u + i, n - i);
        if (l <= 0) l = 1;
        uint32_t cp = tok_utf8_decode(u + i, l);
        char tmp[4];
        int k = tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), tmp);
        if (tok_buf_put(o, tmp, (size_t)k)) return -1;
        i += (size_t)l;
    }
    return 0;
}

static int do_replace(const tok_norm *nm, const char *s, size_t n, tok_buf *o) {
    if (!nm->re) {
        if (!nm->alen) return tok_buf_put(o, s, n);
        size_t i = 0;
        while (i < n) {
            const char *hit = (n - i >= nm->alen) ? memmem(s + i, n - i, nm->a, nm->alen) : NULL;
            if (!hit) break;
            size_t k = (size_t)(hit - s);
            if (tok_buf_put(o, s + i, k - i) || tok_buf_put(o, nm->b, nm->blen)) return -1;
            i = k + nm->alen;
        }
        return tok_buf_put(o, s + i, n - i);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(nm->re, NULL);
    if (!md) return -1;
    size_t i = 0, from = 0;
    int rc = 0;
    while (from <= n) {
        int r = pcre2_match(nm->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (tok_buf_put(o, s + i, ov[0] - i) || tok_buf_put(o, nm->b, nm->blen)) { rc = -1; break; }
        i = ov[1];
        if (ov[1] == ov[0]) {  /* empty match: step one char */
            if (ov[1] >= n) break;
            int l = tok_utf8_next((const unsigned char *)s + ov[1], n - ov[1]);
            from = ov[1] + (size_t)(l > 0 ? l : 1);
            if (tok_buf_put(o, s + i, from - i)) { rc = -1; break; }
            i = from;
        } else from = ov[1];
    }
    pcre2_match_data_free(md);
    if (rc) return rc;
    return tok_buf_put(o, s + i, n - i);
}

static int do_strip(const tok_norm *nm, const char *s, size_t n, tok_buf *o) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n;
    if (nm->strip_left)
        while (a < b) {
            int l = tok_utf8_next(u + a, b - a);
            if (l <= 0 || !tok_is_whitespace(tok_utf8_decode(u + a, l))) break;
            a += (size_t)l;
        }
    if (nm->strip_right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && (u[k] & 0xc0) == 0x80) k--;
            int l = tok_utf8_next(u + k, b - k);
            if (l <= 0 || !tok_is_whitespace(tok_utf8_decode(u + k, l))) break;
            b = k;
        }
    return tok_buf_put(o, s + a, b - a);
}

int tok_normalize(const cinfer_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n) {
    tok_buf cur = {0}, nxt = {0};
    if (tok_buf_put(&cur, s, n)) return -1;
    for (int i = 0; i < t->n_norm; i++) {
        const tok_norm *nm = &t->norm[i];
        nxt.n = 0;
        int rc = 0;
        switch (nm->kind) {
        case TN_NFC:
            if (below_0300(cur.p, cur.n)) continue;
            rc = do_utf8proc(cur.p, cur.n, UTF8PROC_COMPOSE, &nxt);
            break;
        case TN_NFD: rc = do_utf8proc(cur.p, cur.n, UTF8PROC_DECOMPOSE, &nxt); break;
        case TN_NFKC: rc = do_utf8proc(cur.p, cur.n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, &nxt); break;
        case TN_NFKD: rc = do_utf8proc(cur.p, cur.n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &nxt); break;
        case TN_LOWER: rc = do_lower(cur.p, cur.n, &nxt); break;
        case TN_PREPEND:
            if (!cur.n) continue;
            rc = tok_buf_put(&nxt, nm->a, nm->alen) || tok_buf_put(&nxt, cur.p, cur.n);
            break;
        case TN_REPLACE: rc = do_replace(nm, cur.p, cur.n, &nxt); break;
        case TN_STRIP: rc = do_strip(nm, cur.p, cur.n, &nxt); break;
        default: continue;
        }
        if (rc) { free(cur.p); free(nxt.p); return -1; }
        tok_buf tmp = cur; cur = nxt; nxt = tmp;
    }
    free(nxt.p);
    if (!cur.p && tok_buf_put(&cur, "", 0)) return -1;
    *out = cur.p;
    *out_n = cur.n;
    return 0;
}
