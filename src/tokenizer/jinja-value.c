/*
 * jinja-value.c — the arena, byte buffers and values of the chat-template
 * interpreter, with Python's printing rules: str()/repr() of None, booleans,
 * ints, floats (shortest round-trip repr, as float.__repr__), strings, lists,
 * tuples and dicts, and json.dumps as transformers' tojson filter calls it
 * (ensure_ascii=False by default, optional indent/separators/sort_keys).
 *
 * Invariants: every allocation comes from the render's arena and is bounded
 * by TMPL_MAX_ARENA; strings stay NUL-terminated; values never alias mutable
 * state except namespaces (JD_NS).
 */
#include "tokenizer/jinja-internal.h"
#include "cinfer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------------- arena */
struct tmpl_chunk { tmpl_chunk *next; size_t used, cap; max_align_t align[]; };
#define CHUNK_BYTES (64u << 10)

void tmpl_fail(tmpl_st *J, int status, int line, const char *fmt, ...) {
    if (J->err && J->err_len) {
        int k = 0;
        if (line > 0) k = snprintf(J->err, J->err_len, "template line %d: ", line);
        if (k < 0) k = 0;
        if ((size_t)k < J->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(J->err + k, J->err_len - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    J->status = status;
    longjmp(J->jb, 1);
}

void tmpl_charge(tmpl_st *J, jv v, int line) {
    unsigned long long w = 1;
    if (v.k == JV_STR) w += v.u.s->n;
    else if (v.k == JV_LIST) w += 16ull * v.u.l->n;
    else if (v.k == JV_DICT) w += 32ull * v.u.d->n;
    J->work += w;
    if (J->work > TMPL_MAX_WORK)
        tmpl_fail(J, CINFER_EINVAL, line, "template exceeded its work budget (%llu GiB scanned)", TMPL_MAX_WORK >> 30);
}

void *tmpl_alloc(tmpl_st *J, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tmpl_chunk *c = J->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_BYTES / 2 ? n : CHUNK_BYTES;
        if (n > TMPL_MAX_ARENA || J->arena_bytes + cap > TMPL_MAX_ARENA)
            tmpl_fail(J, CINFER_EINVAL, J->line, "template uses too much memory (over %u MiB)",
                      TMPL_MAX_ARENA >> 20);
        tmpl_chunk *nc = malloc(sizeof(tmpl_chunk) + cap);
        if (!nc) tmpl_fail(J, CINFER_ENOMEM, J->line, "out of memory");
        nc->used = 0; nc->cap = cap;
        J->arena_bytes += cap;
        if (cap == CHUNK_BYTES || !c) { nc->next = c; J->chunks = nc; c = nc; }
        else { nc->next = c->next; c->next = nc; c = nc; }  /* big one-off: keep the current chunk on top */
    }
    void *p = (char *)c->align + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void tmpl_arena_free(tmpl_st *J) {
    tmpl_chunk *c = J->chunks;
    while (c) { tmpl_chunk *n = c->next; free(c); c = n; }
    J->chunks = NULL;
}

char *tmpl_strndup(tmpl_st *J, const char *s, size_t n) {
    char *p = tmpl_alloc(J, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---------------------------------------------------------------- buffers */
void tbuf_init(tbuf *b, tmpl_st *J) { b->p = NULL; b->n = b->cap = 0; b->J = J; b->limit = TMPL_MAX_OUTPUT; }

static void tbuf_grow(tbuf *b, size_t add) {
    if (b->n + add + 1 <= b->cap) return;
    if (b->n + add + 1 > b->limit)
        tmpl_fail(b->J, CINFER_EINVAL, b->J->line, "rendered text exceeds %zu MiB", b->limit >> 20);
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + add + 1) cap *= 2;
    char *p = tmpl_alloc(b->J, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p; b->cap = cap;
}
void tbuf_put(tbuf *b, const char *s, size_t n) {
    if (!n) return;
    tbuf_grow(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void tbuf_puts(tbuf *b, const char *s) { tbuf_put(b, s, strlen(s)); }
void tbuf_putc(tbuf *b, char c) { tbuf_put(b, &c, 1); }
void tbuf_printf(tbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) tbuf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ------------------------------------------------------------------ UTF-8 */
uint32_t tmpl_u8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t p = *i;
    unsigned c = u[p];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len <= 1 || p + (size_t)len > n) { *i = p + 1; return c; }
    uint32_t cp = c & (0xff >> (len + 1));
    for (int k = 1; k < len; k++) {
        if ((u[p + k] & 0xc0) != 0x80) { *i = p + 1; return c; }
        cp = (cp << 6) | (u[p + k] & 0x3f);
    }
    *i = p + (size_t)len;
    return cp;
}
void tmpl_u8_put(tbuf *b, uint32_t c) {
    char t[4];
    if (c < 0x80) { t[0] = (char)c; tbuf_put(b, t, 1); }
    else if (c < 0x800) { t[0] = (char)(0xc0 | (c >> 6)); t[1] = (char)(0x80 | (c & 0x3f)); tbuf_put(b, t, 2); }
    else if (c < 0x10000) {
        t[0] = (char)(0xe0 | (c >> 12)); t[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        t[2] = (char)(0x80 | (c & 0x3f)); tbuf_put(b, t, 3);
    } else {
        t[0] = (char)(0xf0 | (c >> 18)); t[1] = (char)(0x80 | ((c >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((c >> 6) & 0x3f)); t[3] = (char)(0x80 | (c & 0x3f)); tbuf_put(b, t, 4);
    }
}
size_t tmpl_u8_len(const char *s, size_t n) {
    size_t i = 0, k = 0;
    while (i < n) { tmpl_u8_next(s, n, &i); k++; }
    return k;
}
int tmpl_isspace(uint32_t c) {
    if (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c < 0x85) return 0;
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ----------------------------------------------------------------- values */
jv jv_undef(const char *name) { jv v = {JV_UNDEF, {0}}; v.u.uname = name; return v; }
jv jv_none(void) { jv v = {JV_NONE, {0}}; return v; }
jv jv_bool(int b) { jv v = {JV_BOOL, {0}}; v.u.b = !!b; return v; }
jv jv_int(int64_t i) { jv v = {JV_INT, {0}}; v.u.i = i; return v; }
jv jv_float(double f) { jv v = {JV_FLOAT, {0}}; v.u.f = f; return v; }
jv jv_str(tmpl_st *J, const char *s, size_t n) {
    jv v = {JV_STR, {0}};
    v.u.s = tmpl_alloc(J, sizeof(jstr) + n + 1);
    v.u.s->n = n;
    if (n) memcpy(v.u.s->s, s, n);
    v.u.s->s[n] = 0;
    return v;
}
jv jv_cstr(tmpl_st *J, const char *s) { return jv_str(J, s, strlen(s)); }
jv jv_list(tmpl_st *J, size_t cap) {
    jv v = {JV_LIST, {0}};
    v.u.l = tmpl_alloc(J, sizeof(jlist));
    if (cap) { v.u.l->v = tmpl_alloc(J, cap * sizeof(jv)); v.u.l->cap = cap; }
    return v;
}
jv jv_view(jv list, int view) { list.u.l->view = view; return list; }
void jl_push(tmpl_st *J, jv *list, jv x) {
    jlist *l = list->u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *p = tmpl_alloc(J, cap * sizeof(jv));
        if (l->n) memcpy(p, l->v, l->n * sizeof(jv));
        l->v = p; l->cap = cap;
    }
    l->v[l->n++] = x;
}
jv jv_dict(tmpl_st *J, int kind) {
    jv v = {JV_DICT, {0}};
    v.u.d = tmpl_alloc(J, sizeof(jdict));
    v.u.d->kind = kind;
    return v;
}
jv *jd_get(const jv *dict, jv key) {
    jdict *d = dict->u.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], key)) return &d->v[i];
    return NULL;
}
jv *jd_gets(const jv *dict, const char *key) {
    jdict *d = dict->u.d;
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].k == JV_STR && d->k[i].u.s->n == n && !memcmp(d->k[i].u.s->s, key, n))
            return &d->v[i];
    return NULL;
}
void jd_set(tmpl_st *J, jv *dict, jv key, jv val) {
    jv *p = jd_get(dict, key);
    if (p) { *p = val; return; }
    jdict *d = dict->u.d;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *k = tmpl_alloc(J, cap * sizeof(jv)), *v = tmpl_alloc(J, cap * sizeof(jv));
        if (d->n) { memcpy(k, d->k, d->n * sizeof(jv)); memcpy(v, d->v, d->n * sizeof(jv)); }
        d->k = k; d->v = v; d->cap = cap;
    }
    d->k[d->n] = key; d->v[d->n] = val; d->n++;
}
jv jv_func(tmpl_st *J, const char *name, int kind, const jv *self) {
    jv v = {JV_FUNC, {0}};
    v.u.fn = tmpl_alloc(J, sizeof(jfunc));
    v.u.fn->name = name;
    v.u.fn->kind = kind;
    if (self) { v.u.fn->self = tmpl_alloc(J, sizeof(jv)); *v.u.fn->self = *self; }
    return v;
}

int jv_truthy(jv v) {
    switch (v.k) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->n != 0;
    case JV_LIST: return v.u.l->view == JL_GEN || v.u.l->n != 0;
    case JV_DICT: return v.u.d->kind != JD_PLAIN || v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double num_f(jv v) { return v.k == JV_FLOAT ? v.u.f : v.k == JV_INT ? (double)v.u.i : v.u.b; }

int jv_eq(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT)
            return (a.k == JV_INT ? a.u.i : a.u.b) == (b.k == JV_INT ? b.u.i : b.u.b);
        return num_f(a) == num_f(b);
    }
    if (a.k != b.k) return 0;
    switch (a.k) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a.u.s->n == b.u.s->n && !memcmp(a.u.s->s, b.u.s->s, a.u.s->n);
    case JV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->view != b.u.l->view || a.u.l->n != b.u.l->n) return 0;
        if (a.u.l->view == JL_GEN) return a.u.l == b.u.l;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->kind != JD_PLAIN || b.u.d->kind != JD_PLAIN || a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv *o = jd_get(&b, a.u.d->k[i]);
            if (!o || !jv_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

const char *jv_typename(jv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                  "list", "dict", "function"};
    if (v.k == JV_LIST && v.u.l->view) {
        static const char *views[] = {"list", "generator", "dict_items", "dict_keys", "dict_values", "range"};
        return views[v.u.l->view];
    }
    if (v.k == JV_LIST && v.u.l->tuple) return "tuple";
    if (v.k == JV_DICT && v.u.d->kind == JD_NS) return "Namespace";
    if (v.k == JV_DICT && v.u.d->kind == JD_OBJ) return "LoopContext";
    return names[v.k];
}

int jv_cmp(tmpl_st *J, jv a, jv b, int line) {
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
            int64_t x = a.k == JV_INT ? a.u.i : a.u.b, y = b.k == JV_INT ? b.u.i : b.u.b;
            return (x > y) - (x < y);
        }
        double x = num_f(a), y = num_f(b);
        return (x > y) - (x < y);
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return (a.u.s->n > b.u.s->n) - (a.u.s->n < b.u.s->n);
    }
    if (a.k == JV_LIST && b.k == JV_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->view && !b.u.l->view) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return jv_cmp(J, a.u.l->v[i], b.u.l->v[i], line);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    if (a.k == JV_UNDEF || b.k == JV_UNDEF) tmpl_undef_error(J, a.k == JV_UNDEF ? a : b, line);
    tmpl_fail(J, CINFER_EINVAL, line, "'<' not supported between instances of '%s' and '%s'",
              jv_typename(a), jv_typename(b));
}

/* -------------------------------------------------------------- printing */
/* Python's float.__repr__: the shortest digits that round-trip; fixed
 * notation for exponents in [-4, 16), scientific otherwise. */
void tmpl_float_repr(double f, char *out, size_t n) {
    if (isnan(f)) { snprintf(out, n, "nan"); return; }
    if (isinf(f)) { snprintf(out, n, f < 0 ? "-inf" : "inf"); return; }
    char buf[64];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[32]; int nd = 0, neg = 0;
    const char *p = buf;
    if (*p == '-') { neg = 1; p++; }
    while (*p && *p != 'e') { if (*p != '.') digits[nd++] = *p; p++; }
    digits[nd] = 0;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    char res[64]; int k = 0;
    if (neg) res[k++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            res[k++] = '0'; res[k++] = '.';
            for (int i = 0; i < -exp - 1; i++) res[k++] = '0';
            for (int i = 0; i < nd; i++) res[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) res[k++] = i < nd ? digits[i] : '0';
            res[k++] = '.';
            if (nd > exp + 1) for (int i = exp + 1; i < nd; i++) res[k++] = digits[i];
            else res[k++] = '0';
        }
        res[k] = 0;
    } else {
        res[k++] = digits[0];
        if (nd > 1) { res[k++] = '.'; for (int i = 1; i < nd; i++) res[k++] = digits[i]; }
        k += snprintf(res + k, sizeof res - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    snprintf(out, n, "%s", res);
}

/* printable in the sense of str.isprintable (approximation for non-ASCII:
 * separators, controls, format characters, surrogates, private use and
 * unassigned code points are not) */
#include <utf8proc.h>
static int py_printable(uint32_t c) {
    if (c < 0x20 || c == 0x7f) return 0;
    if (c < 0x7f) return 1;
    if (c > 0x10ffff) return 0;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default: return 1;
    }
}

static void repr_str(tbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    tbuf_putc(b, q);
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t c = tmpl_u8_next(s, n, &i);
        if (c == (uint32_t)q || c == '\\') { tbuf_putc(b, '\\'); tbuf_putc(b, (char)c); }
        else if (c == '\n') tbuf_puts(b, "\\n");
        else if (c == '\r') tbuf_puts(b, "\\r");
        else if (c == '\t') tbuf_puts(b, "\\t");
        else if (c >= 0x80 && i - st == 1) tbuf_printf(b, "\\x%02x", c);  /* stray byte */
        else if (py_printable(c)) tbuf_put(b, s + st, i - st);
        else if (c < 0x100) tbuf_printf(b, "\\x%02x", c);
        else if (c < 0x10000) tbuf_printf(b, "\\u%04x", c);
        else tbuf_printf(b, "\\U%08x", c);
    }
    tbuf_putc(b, q);
}

static void print_value(tmpl_st *J, tbuf *b, jv v, int line, int repr) {
    char num[64];
    switch (v.k) {
    case JV_UNDEF: if (repr) tbuf_puts(b, "Undefined"); return;
    case JV_NONE: tbuf_puts(b, "None"); return;
    case JV_BOOL: tbuf_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: tbuf_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: tmpl_float_repr(v.u.f, num, sizeof num); tbuf_puts(b, num); return;
    case JV_STR:
        if (repr) repr_str(b, v.u.s->s, v.u.s->n);
        else tbuf_put(b, v.u.s->s, v.u.s->n);
        return;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->view == JL_GEN)
            tmpl_fail(J, CINFER_EUNSUPPORTED, line, "printing a generator (Python prints its memory address); "
                      "add |list or |join");
        if (l->view == JL_RANGE) {
            tbuf_printf(b, "range(%lld, %lld", (long long)l->r0, (long long)l->r1);
            if (l->rs != 1) tbuf_printf(b, ", %lld", (long long)l->rs);
            tbuf_putc(b, ')');
            return;
        }
        if (l->view) { tbuf_puts(b, jv_typename(v)); tbuf_putc(b, '('); }
        if (++J->vdepth > TMPL_MAX_DEPTH) tmpl_fail(J, CINFER_EINVAL, line, "value nested too deeply to print");
        tbuf_putc(b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) tbuf_puts(b, ", ");
            print_value(J, b, l->v[i], line, 1);
        }
        if (l->tuple && l->n == 1) tbuf_putc(b, ',');
        tbuf_putc(b, l->tuple ? ')' : ']');
        if (l->view) tbuf_putc(b, ')');
        J->vdepth--;
        return;
    }
    case JV_DICT: {
        if (v.u.d->kind != JD_PLAIN)
            tmpl_fail(J, CINFER_EUNSUPPORTED, line, "printing a %s object is not supported", jv_typename(v));
        if (++J->vdepth > TMPL_MAX_DEPTH) tmpl_fail(J, CINFER_EINVAL, line, "value nested too deeply to print");
        jdict *d = v.u.d;
        tbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) tbuf_puts(b, ", ");
            print_value(J, b, d->k[i], line, 1);
            tbuf_puts(b, ": ");
            print_value(J, b, d->v[i], line, 1);
        }
        tbuf_putc(b, '}');
        J->vdepth--;
        return;
    }
    default:
        tmpl_fail(J, CINFER_EUNSUPPORTED, line, "printing a function/macro object ('%s') is not supported",
                  v.u.fn->name ? v.u.fn->name : "?");
    }
}
void jv_str_into(tmpl_st *J, tbuf *b, jv v, int line) { print_value(J, b, v, line, 0); }
void jv_repr_into(tmpl_st *J, tbuf *b, jv v, int line) { print_value(J, b, v, line, 1); }
jv jv_to_string(tmpl_st *J, jv v, int line) {
    if (v.k == JV_STR) return v;
    tbuf b; tbuf_init(&b, J);
    print_value(J, &b, v, line, 0);
    return jv_str(J, b.p ? b.p : "", b.n);
}

/* ------------------------------------------------------------------ json */
static void json_str(tbuf *b, const char *s, size_t n, int ascii) {
    tbuf_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        uint32_t c = tmpl_u8_next(s, n, &i);
        switch (c) {
        case '"': tbuf_puts(b, "\\\""); break;
        case '\\': tbuf_puts(b, "\\\\"); break;
        case '\n': tbuf_puts(b, "\\n"); break;
        case '\r': tbuf_puts(b, "\\r"); break;
        case '\t': tbuf_puts(b, "\\t"); break;
        case '\b': tbuf_puts(b, "\\b"); break;
        case '\f': tbuf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) tbuf_printf(b, "\\u%04x", c);
            else if (c < 0x80 || !ascii) tbuf_put(b, s + st, i - st);
            else if (c < 0x10000) tbuf_printf(b, "\\u%04x", c);
            else {
                c -= 0x10000;
                tbuf_printf(b, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
            }
        }
    }
    tbuf_putc(b, '"');
}

static void json_nl(tbuf *b, const json_opts *o, int level) {
    tbuf_putc(b, '\n');
    for (int i = 0; i < level; i++) tbuf_puts(b, o->indent);
}

static int key_cmp(const void *x, const void *y) {
    const jv *a = *(jv * const *)x, *b = *(jv * const *)y;
    if (a->k != JV_STR || b->k != JV_STR) return 0;
    size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
    int c = memcmp(a->u.s->s, b->u.s->s, n);
    return c ? c : (a->u.s->n > b->u.s->n) - (a->u.s->n < b->u.s->n);
}

void jv_tojson(tmpl_st *J, tbuf *b, jv v, const json_opts *o, int level, int line) {
    char num[64];
    switch (v.k) {
    case JV_NONE: tbuf_puts(b, "null"); return;
    case JV_BOOL: tbuf_puts(b, v.u.b ? "true" : "false"); return;
    case JV_INT: tbuf_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT:
        if (isnan(v.u.f)) tbuf_puts(b, "NaN");
        else if (isinf(v.u.f)) tbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else { tmpl_float_repr(v.u.f, num, sizeof num); tbuf_puts(b, num); }
        return;
    case JV_STR: json_str(b, v.u.s->s, v.u.s->n, o->ensure_ascii); return;
    case JV_LIST: {
        jlist *l = v.u.l;
        if (l->view)
            tmpl_fail(J, CINFER_EINVAL, line, "Object of type %s is not JSON serializable", jv_typename(v));
        if (!l->n) { tbuf_puts(b, "[]"); return; }
        if (++J->vdepth > TMPL_MAX_DEPTH) tmpl_fail(J, CINFER_EINVAL, line, "value nested too deeply for tojson");
        tbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) tbuf_puts(b, o->item_sep);
            if (o->indent) json_nl(b, o, level + 1);
            jv_tojson(J, b, l->v[i], o, level + 1, line);
        }
        if (o->indent) json_nl(b, o, level);
        tbuf_putc(b, ']');
        J->vdepth--;
        return;
    }
    case JV_DICT: {
        jdict *d = v.u.d;
        if (d->kind != JD_PLAIN)
            tmpl_fail(J, CINFER_EINVAL, line, "Object of type %s is not JSON serializable", jv_typename(v));
        if (!d->n) { tbuf_puts(b, "{}"); return; }
        if (++J->vdepth > TMPL_MAX_DEPTH) tmpl_fail(J, CINFER_EINVAL, line, "value nested too deeply for tojson");
        jv **keys = tmpl_alloc(J, d->n * sizeof(jv *));
        for (size_t i = 0; i < d->n; i++) keys[i] = &d->k[i];
        if (o->sort_keys) qsort(keys, d->n, sizeof(jv *), key_cmp);  /* string keys (JSON input) */
        tbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            jv k = *keys[i];
            jv val = d->v[keys[i] - d->k];
            if (i) tbuf_puts(b, o->item_sep);
            if (o->indent) json_nl(b, o, level + 1);
            if (k.k == JV_STR) json_str(b, k.u.s->s, k.u.s->n, o->ensure_ascii);
            else if (k.k == JV_INT || k.k == JV_FLOAT || k.k == JV_BOOL || k.k == JV_NONE) {
                tbuf t; tbuf_init(&t, J);
                jv_tojson(J, &t, k, o, 0, line);
                tbuf_putc(b, '"'); tbuf_put(b, t.p, t.n); tbuf_putc(b, '"');
            } else tmpl_fail(J, CINFER_EINVAL, line, "keys must be str, int, float, bool or None, not %s",
                             jv_typename(k));
            tbuf_puts(b, o->key_sep);
            jv_tojson(J, b, val, o, level + 1, line);
        }
        if (o->indent) json_nl(b, o, level);
        tbuf_putc(b, '}');
        J->vdepth--;
        return;
    }
    default:
        tmpl_fail(J, CINFER_EINVAL, line, "Object of type %s is not JSON serializable", jv_typename(v));
    }
}
