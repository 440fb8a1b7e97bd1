/*
 * pretokenize.c — the pre-tokenizers: Split (regex or literal, all five HF
 * split behaviours, invert), ByteLevel (optional prefix space and GPT-2
 * regex; the byte->char mapping itself is implicit, see tokenizer.h),
 * Metaspace (replacement char, prepend scheme, split), Digits, Whitespace,
 * WhitespaceSplit.
 *
 * A segment becomes a list of spans over a buffer; steps that only split
 * keep the buffer, steps that insert text (prefix space, Metaspace) rebuild
 * it. Empty pieces are dropped, as HF's PreTokenizedString::split does.
 * Regexes run with PCRE2 (UTF + UCP, JIT when available); HF uses
 * Oniguruma, which agrees on the patterns real tokenizers use.
 */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

typedef struct part { size_t a, b; int m; } part;
typedef struct parts { part *v; size_t n, cap; } parts;

static int parts_push(parts *p, size_t a, size_t b, int m) {
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 64;
        part *v = realloc(p->v, nc * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = nc;
    }
    p->v[p->n++] = (part){a, b, m};
    return 0;
}

/* all matches of re in s[a..b) as parts covering [a, b) */
static int find_matches(pcre2_code *re, pcre2_match_data *md, const char *s, size_t a, size_t b, parts *out) {
    out->n = 0;
    if (a == b) return parts_push(out, a, a, 0);
    size_t prev = a, from = a;
    const char *base = s + a;
    size_t n = b - a;
    while (from <= b) {
        int r = pcre2_jit_match(re, (PCRE2_SPTR)base, n, from - a, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r == PCRE2_ERROR_JIT_BADOPTION)
            r = pcre2_match(re, (PCRE2_SPTR)base, n, from - a, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) return -2;  /* a match limit or JIT stack failure: never a silent wrong split */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = a + ov[0], me = a + ov[1];
        if (ms != prev && parts_push(out, prev, ms, 0)) return -1;
        if (parts_push(out, ms, me, 1)) return -1;
        prev = me;
        if (me == ms) {
            if (me >= b) break;
            int l = tok_utf8_next((const unsigned char *)s + me, b - me);
            from = me + (size_t)(l > 0 ? l : 1);
        } else from = me;
    }
    if (prev != b && parts_push(out, prev, b, 0)) return -1;
    return 0;
}

/* applies a split behaviour to parts, appending non-empty pieces to out */
static int apply_behavior(int behavior, int invert, parts *p, tok_spans *out) {
    if (invert)
        for (size_t i = 0; i < p->n; i++) p->v[i].m = !p->v[i].m;
    size_t n = p->n;
    part *v = p->v;
    /* merge in place into v[0..k) then emit */
    size_t k = 0;
    int prev_match = 0;
    switch (behavior) {
    case TB_ISOLATED:
        k = n;
        break;
    case TB_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].m) v[k++] = v[i];
        break;
    case TB_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            if (v[i].m == prev_match && k) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
            prev_match = v[i].m;
        }
        break;
    case TB_MERGED_PREV:
        for (size_t i = 0; i < n; i++) {
            if (v[i].m && !prev_match && k) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
            prev_match = v[i].m;
        }
        break;
    case TB_MERGED_NEXT: {
        /* right to left, then the result is already in order */
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            if (v[i].m && !prev_match && w < n) v[w].a = v[i].a;
            else v[--w] = v[i];
            prev_match = v[i].m;
        }
        for (size_t i = w; i < n; i++)
            if (v[i].b > v[i].a && tok_spans_push(out, v[i].a, v[i].b - v[i].a)) return -1;
        return 0;
    }
    }
    for (size_t i = 0; i < k; i++)
        if (v[i].b > v[i].a && tok_spans_push(out, v[i].a, v[i].b - v[i].a)) return -1;
    return 0;
}

static int split_step(pcre2_code *re, int behavior, int invert, const tok_buf *buf, const tok_spans *in,
                      tok_spans *out) {
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return -1;
    parts p = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        rc = find_matches(re, md, buf->p, in->v[i].off, in->v[i].off + in->v[i].len, &p);
        if (!rc) rc = apply_behavior(behavior, invert, &p, out);
    }
    free(p.v);
    pcre2_match_data_free(md);
    return rc;
}

/* rebuilds buf so each piece may get a prefix and have ' ' replaced */
static int rewrite_step(const tok_pretok *pt, tok_buf *buf, const tok_spans *in, tok_spans *out, int first) {
    tok_buf nb = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *s = buf->p + in->v[i].off;
        size_t n = in->v[i].len, start = nb.n;
        if (pt->kind == TP_BYTELEVEL) {
            if (pt->add_prefix_space && (n == 0 || s[0] != ' ') && tok_buf_put(&nb, " ", 1)) goto oom;
            if (tok_buf_put(&nb, s, n)) goto oom;
        } else {
            int starts_repl = n >= pt->repl_len && !memcmp(s, pt->repl, pt->repl_len);
            if (n && s[0] == ' ') starts_repl = 1;  /* the space becomes the replacement */
            int prepend = !starts_repl && (pt->prepend_scheme == TM_ALWAYS ||
                                           (pt->prepend_scheme == TM_FIRST && first && in->v[i].off == 0));
            if (prepend && tok_buf_put(&nb, pt->repl, pt->repl_len)) goto oom;
            for (size_t k = 0; k < n; k++) {
                size_t j = k;
                while (j < n && s[j] != ' ') j++;
                if (tok_buf_put(&nb, s + k, j - k)) goto oom;
                if (j < n && tok_buf_put(&nb, pt->repl, pt->repl_len)) goto oom;
                k = j;
            }
        }
        if (nb.n > start && tok_spans_push(out, start, nb.n - start)) goto oom;
    }
    if (!nb.p && tok_buf_put(&nb, "", 0)) goto oom;
    free(buf->p);
    *buf = nb;
    return 0;
oom:
    free(nb.p);
    return -1;
}

int tok_pretokenize(const cinfer_tokenizer *t, tok_buf *buf, tok_spans *out, int first) {
    tok_spans cur = {0}, nxt = {0};
    out->n = 0;
    if (buf->n && tok_spans_push(&cur, 0, buf->n)) return -1;
    int rc = 0;
    for (int i = 0; i < t->n_pre && !rc; i++) {
        const tok_pretok *pt = &t->pre[i];
        nxt.n = 0;
        switch (pt->kind) {
        case TP_SPLIT:
        case TP_DIGITS:
        case TP_WS_SPLIT:
        case TP_WHITESPACE:
            rc = split_step(pt->re, pt->behavior, pt->invert, buf, &cur, &nxt);
            break;
        case TP_BYTELEVEL:
            if (pt->add_prefix_space) {
                rc = rewrite_step(pt, buf, &cur, &nxt, first);
                if (rc) break;
                tok_spans tmp = cur; cur = nxt; nxt = tmp;
                nxt.n = 0;
            }
            if (pt->re) rc = split_step(pt->re, TB_ISOLATED, 0, buf, &cur, &nxt);
            else
                for (size_t k = 0; k < cur.n && !rc; k++) rc = tok_spans_push(&nxt, cur.v[k].off, cur.v[k].len);
            break;
        case TP_METASPACE:
            rc = rewrite_step(pt, buf, &cur, &nxt, first);
            if (!rc && pt->split) {
                tok_spans tmp = cur; cur = nxt; nxt = tmp;
                nxt.n = 0;
                rc = split_step(pt->re, TB_MERGED_NEXT, 0, buf, &cur, &nxt);
            }
            break;
        default:
            continue;
        }
        tok_spans tmp = cur; cur = nxt; nxt = tmp;
    }
    free(nxt.v);
    if (rc) { free(cur.v); return rc; }
    free(out->v);
    *out = cur;
    return 0;
}
