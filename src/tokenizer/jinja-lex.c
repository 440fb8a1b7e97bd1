/*
 * jinja-lex.c — the template lexer, following Jinja 3.1's lexer with
 * transformers' settings (trim_blocks=True, lstrip_blocks=True):
 *  - `{%-`, `{{-`, `{#-` strip all whitespace (Python str.rstrip) before the
 *    tag; `-%}`, `-}}`, `-#}` strip all whitespace after it;
 *  - trim_blocks: `%}` and `#}` swallow one following "\n" (`+%}` keeps it);
 *  - lstrip_blocks: whitespace (Python \s, so also U+00A0 etc.) between a
 *    line start and `{%`/`{#` is removed (`{%+` keeps it), never before `{{`;
 *  - `{% raw %}...{% endraw %}` is plain text;
 *  - inside tags: names, strings with Python escapes, ints, floats and
 *    operators; `}}`/`%}` only end the tag when brackets are balanced.
 * The caller normalises \r\n and \r to \n and drops one trailing newline
 * (keep_trailing_newline=False) before lexing.
 */
#include "tokenizer/jinja-internal.h"
#include "cinfer.h"

#include <stdlib.h>
#include <string.h>

typedef struct lx {
    tmpl_st *J;
    const char *s; size_t n, pos;
    int line;
    jtok *t; size_t nt, cap;
    int line_starting;
} lx;

static jtok *push(lx *L, int type) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *p = tmpl_alloc(L->J, cap * sizeof(jtok));
        if (L->nt) memcpy(p, L->t, L->nt * sizeof(jtok));
        L->t = p; L->cap = cap;
    }
    jtok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = L->line;
    return t;
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* length of text after Python rstrip() */
static size_t rstrip_len(const char *s, size_t n) {
    size_t keep = 0, i = 0;
    while (i < n) {
        uint32_t c = tmpl_u8_next(s, n, &i);
        if (!tmpl_isspace(c)) keep = i;
    }
    return keep;
}
/* bytes of \s* at s */
static size_t ws_span(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        uint32_t c = tmpl_u8_next(s, n, &j);
        if (!tmpl_isspace(c)) break;
        i = j;
    }
    return i;
}

static void emit_data(lx *L, const char *s, size_t n) {
    if (n) {
        jtok *t = push(L, TK_DATA);
        t->s = s; t->n = n;
    }
    L->line += count_nl(s, n);
}

/* text before a tag, with `-` stripping and lstrip_blocks applied */
static void emit_text_before(lx *L, const char *text, size_t n, char sign, int is_var) {
    size_t full = n;
    if (sign == '-') n = rstrip_len(text, n);
    else if (sign != '+' && !is_var) {
        size_t l_pos = n;
        while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
        if (l_pos > 0 || L->line_starting) {
            /* Jinja 3.1: whitespace_re (\s+, Unicode) must match all of it */
            size_t i = l_pos;
            int only_ws = 1;
            while (i < n) if (!tmpl_isspace(tmpl_u8_next(text, n, &i))) { only_ws = 0; break; }
            if (only_ws) n = l_pos;
        }
    }
    emit_data(L, text, n);
    L->line += count_nl(text + n, full - n);
}

/* after a block/comment end marker at L->pos (pointing past "%}"/"#}"): trim_blocks */
static void after_end(lx *L, char sign) {
    if (sign == '-') {
        size_t w = ws_span(L->s + L->pos, L->n - L->pos);
        L->line += count_nl(L->s + L->pos, w);
        L->pos += w;
        L->line_starting = w > 0 && L->s[L->pos - 1] == '\n';
    } else if (sign != '+' && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++; L->line++;
        L->line_starting = 1;
    } else L->line_starting = 0;
}

static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at s; returns length or 0 */
static size_t digits_us(const char *s, size_t n) {
    size_t i = 0;
    if (i >= n || !is_digit(s[i])) return 0;
    for (;;) {
        while (i < n && is_digit(s[i])) i++;
        if (i + 1 < n && s[i] == '_' && is_digit(s[i + 1])) { i++; continue; }
        return i;
    }
}

static void decode_string(lx *L, jtok *t, const char *s, size_t n) {
    tbuf b; tbuf_init(&b, L->J);
    size_t i = 0;
    while (i < n) {
        if (s[i] != '\\' || i + 1 >= n) { tbuf_putc(&b, s[i++]); continue; }
        char c = s[i + 1];
        i += 2;
        switch (c) {
        case '\n': break;
        case '\\': tbuf_putc(&b, '\\'); break;
        case '\'': tbuf_putc(&b, '\''); break;
        case '"': tbuf_putc(&b, '"'); break;
        case 'a': tbuf_putc(&b, 7); break;
        case 'b': tbuf_putc(&b, 8); break;
        case 'f': tbuf_putc(&b, 12); break;
        case 'n': tbuf_putc(&b, 10); break;
        case 'r': tbuf_putc(&b, 13); break;
        case 't': tbuf_putc(&b, 9); break;
        case 'v': tbuf_putc(&b, 11); break;
        case 'x': case 'u': case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int k = 0; k < want; k++) {
                char h = i + (size_t)k < n ? s[i + (size_t)k] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 :
                        h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) tmpl_fail(L->J, CINFER_EFORMAT, t->line, "truncated \\%cXX escape in string literal", c);
                v = v * 16 + (uint32_t)d;
            }
            i += (size_t)want;
            if (v > 0x10ffff) tmpl_fail(L->J, CINFER_EFORMAT, t->line, "illegal Unicode character in string literal");
            tmpl_u8_put(&b, v);
            break;
        }
        case 'N': tmpl_fail(L->J, CINFER_EUNSUPPORTED, t->line, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                uint32_t v = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++) v = v * 8 + (uint32_t)(s[i++] - '0');
                tmpl_u8_put(&b, v);
            } else { tbuf_putc(&b, '\\'); tbuf_putc(&b, c); }
        }
    }
    t->s = b.p ? b.p : "";
    t->n = b.n;
}

/* tokens inside {{ }} or {% %} until the end marker; returns end sign */
static void lex_tag(lx *L, int is_var) {
    int depth = 0;
    char stack[TMPL_MAX_DEPTH];
    const char *s = L->s;
    size_t n = L->n;
    for (;;) {
        size_t p = L->pos;
        if (p >= n)
            tmpl_fail(L->J, CINFER_EFORMAT, L->line, "unexpected end of template, expected '%s'",
                      is_var ? "end of print statement" : "end of statement block");
        char c = s[p], c1 = p + 1 < n ? s[p + 1] : 0, c2 = p + 2 < n ? s[p + 2] : 0;
        char e = is_var ? '}' : '%';
        if (!depth) {
            char sign = 0; size_t len = 0;
            if ((c == '-' || (c == '+' && !is_var)) && c1 == e && c2 == '}') { sign = c; len = 3; }
            else if (c == e && c1 == '}') len = 2;
            if (len) {
                push(L, is_var ? TK_VAR_END : TK_BLOCK_END);
                L->pos = p + len;
                if (is_var) {
                    if (sign == '-') after_end(L, '-');
                    else L->line_starting = 0;
                } else after_end(L, sign);
                return;
            }
        }
        size_t w = ws_span(s + p, n - p);
        if (w) { L->line += count_nl(s + p, w); L->pos += w; continue; }
        /* float: digits ((.digits)? e[+-]digits | .digits) */
        size_t d = digits_us(s + p, n - p);
        if (d && !(p > 0 && s[p - 1] == '.')) {
            size_t q = p + d, fr = 0, ex = 0;
            if (q < n && s[q] == '.') fr = digits_us(s + q + 1, n - q - 1);
            size_t q2 = fr ? q + 1 + fr : q;
            if (q2 < n && (s[q2] == 'e' || s[q2] == 'E')) {
                size_t r = q2 + 1;
                if (r < n && (s[r] == '+' || s[r] == '-')) r++;
                size_t ed = digits_us(s + r, n - r);
                if (ed) ex = r + ed - q2;
            }
            if (fr || ex) {
                size_t end = q2 + ex;
                char buf[128]; size_t k = 0;
                for (size_t i = p; i < end && k + 1 < sizeof buf; i++) if (s[i] != '_') buf[k++] = s[i];
                buf[k] = 0;
                jtok *t = push(L, TK_FLOAT);
                t->f = strtod(buf, NULL);
                L->pos = end;
                continue;
            }
        }
        if (d) {
            jtok *t = push(L, TK_INT);
            int64_t v = 0;
            for (size_t i = p; i < p + d; i++) {
                if (s[i] == '_') continue;
                if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s[i] - '0', &v))
                    tmpl_fail(L->J, CINFER_EUNSUPPORTED, L->line, "integer literal does not fit in 64 bits");
            }
            t->i = v;
            L->pos = p + d;
            continue;
        }
        if (is_name0(c)) {
            size_t q = p;
            while (q < n && (is_name0(s[q]) || is_digit(s[q]))) q++;
            jtok *t = push(L, TK_NAME);
            t->s = tmpl_strndup(L->J, s + p, q - p);
            t->n = q - p;
            L->pos = q;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t q = p + 1;
            while (q < n && s[q] != c) { if (s[q] == '\\') q++; q++; }
            if (q >= n) tmpl_fail(L->J, CINFER_EFORMAT, L->line, "unterminated string literal");
            jtok *t = push(L, TK_STRING);
            decode_string(L, t, s + p + 1, q - p - 1);
            L->line += count_nl(s + p, q - p);
            L->pos = q + 1;
            continue;
        }
        int op = 0; size_t ol = 2;
        if (c == '/' && c1 == '/') op = OP_FLOORDIV;
        else if (c == '*' && c1 == '*') op = OP_POW;
        else if (c == '=' && c1 == '=') op = OP_EQ;
        else if (c == '!' && c1 == '=') op = OP_NE;
        else if (c == '>' && c1 == '=') op = OP_GE;
        else if (c == '<' && c1 == '=') op = OP_LE;
        else if (c && strchr("+-/*%~[](){}><=.:|,;", c)) { op = (unsigned char)c; ol = 1; }
        if (!op) tmpl_fail(L->J, CINFER_EFORMAT, L->line, "unexpected char '%c' in tag", c);
        if (op == '(' || op == '[' || op == '{') {
            if (depth >= TMPL_MAX_DEPTH) tmpl_fail(L->J, CINFER_EINVAL, L->line, "brackets nested too deeply");
            stack[depth++] = op == '(' ? ')' : op == '[' ? ']' : '}';
        } else if (op == ')' || op == ']' || op == '}') {
            if (!depth) tmpl_fail(L->J, CINFER_EFORMAT, L->line, "unexpected '%c'", (char)op);
            if (stack[--depth] != op)
                tmpl_fail(L->J, CINFER_EFORMAT, L->line, "unexpected '%c', expected '%c'", (char)op, stack[depth]);
        }
        jtok *t = push(L, TK_OP);
        t->op = op;
        L->pos = p + ol;
    }
}

/* "{%[-+]? raw [-]?%}" at p: returns end position or 0 */
static size_t match_raw(lx *L, size_t p, const char *word, char *sign_out, char *endsign) {
    const char *s = L->s; size_t n = L->n;
    size_t q = p + 2;
    char sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) sign = s[q++];
    q += ws_span(s + q, n - q);
    size_t wl = strlen(word);
    if (q + wl > n || memcmp(s + q, word, wl)) return 0;
    q += wl;
    if (q < n && (is_name0(s[q]) || is_digit(s[q]))) return 0;
    q += ws_span(s + q, n - q);
    char es = 0;   /* "{% raw +%}" is not a raw tag in Jinja; "{% endraw +%}" is */
    if (q < n && (s[q] == '-' || (s[q] == '+' && word[0] == 'e'))) es = s[q++];
    if (q + 2 > n || s[q] != '%' || s[q + 1] != '}') return 0;
    if (sign_out) *sign_out = sign;
    *endsign = es;
    return q + 2;
}

void tmpl_lex(tmpl_st *J, const char *src, size_t n, jtok **toks, size_t *ntok) {
    lx L = {0};
    L.J = J; L.s = src; L.n = n; L.line = 1; L.line_starting = 1;
    while (L.pos < n) {
        /* next tag start */
        size_t p = L.pos;
        const char *hit = NULL;
        while (p + 1 < n) {
            const char *q = memchr(src + p, '{', n - p - 1);
            if (!q) break;
            char c1 = q[1];
            if (c1 == '{' || c1 == '%' || c1 == '#') { hit = q; break; }
            p = (size_t)(q - src) + 1;
        }
        if (!hit) { emit_data(&L, src + L.pos, n - L.pos); L.pos = n; break; }
        size_t tp = (size_t)(hit - src);
        char kind = hit[1];
        char sign = tp + 2 < n && (src[tp + 2] == '-' || src[tp + 2] == '+') ? src[tp + 2] : 0;
        char rsign = 0, resign = 0;
        size_t rend = kind == '%' ? match_raw(&L, tp, "raw", &rsign, &resign) : 0;
        if (rend) sign = rsign;
        emit_text_before(&L, src + L.pos, tp - L.pos, sign, kind == '{');
        if (rend) {
            /* raw begin ends with "-%}\s*" or "%}" (no trim_blocks) */
            L.pos = rend;
            if (resign == '-') after_end(&L, '-');
            else L.line_starting = 0;
            size_t q = L.pos, e = 0;
            char es = 0, eis = 0;
            for (; q + 1 < n; q++)
                if (src[q] == '{' && src[q + 1] == '%' && (e = match_raw(&L, q, "endraw", &es, &eis))) break;
            if (!e) tmpl_fail(J, CINFER_EFORMAT, L.line, "missing end of raw directive");
            emit_text_before(&L, src + L.pos, q - L.pos, es, 0);
            L.pos = e;
            after_end(&L, eis);
            continue;
        }
        size_t after = tp + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t q = after;
            for (;;) {
                if (q + 1 >= n) tmpl_fail(J, CINFER_EFORMAT, L.line, "missing end of comment tag");
                if ((src[q] == '+' || src[q] == '-') && q + 2 < n && src[q + 1] == '#' && src[q + 2] == '}') {
                    L.line += count_nl(src + tp, q - tp);
                    L.pos = q + 3;
                    after_end(&L, src[q]);
                    break;
                }
                if (src[q] == '#' && src[q + 1] == '}') {
                    L.line += count_nl(src + tp, q - tp);
                    L.pos = q + 2;
                    after_end(&L, 0);
                    break;
                }
                q++;
            }
            continue;
        }
        push(&L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN);
        L.pos = after;
        lex_tag(&L, kind == '{');
    }
    jtok *t = push(&L, TK_EOF);
    (void)t;
    *toks = L.t;
    *ntok = L.nt;
}
