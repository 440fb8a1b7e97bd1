/*
 * jinja-builtins.c — Jinja's filters and tests, the Python str/dict/list
 * methods that chat templates call, and the globals transformers provides
 * (range, namespace, dict, raise_exception, strftime_now).
 *
 * Semantics follow Jinja 3.1's filters.py/tests.py and CPython's str methods
 * (whitespace = str.isspace, case mapping per code point via utf8proc).
 * Filters are case-insensitive where Jinja's are (sort, unique, dictsort,
 * min, max). tojson is transformers' override: json.dumps(x, ensure_ascii=
 * False, indent=None, separators=None, sort_keys=False), positional order
 * as in its signature. A known Jinja filter/test/method that is not
 * implemented here fails with CINFER_EUNSUPPORTED naming it.
 */
#include "tokenizer/jinja-internal.h"
#include "cinfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

static int in_set(const char *name, const char *const *set) {
    for (; *set; set++) if (!strcmp(name, *set)) return 1;
    return 0;
}

/* ---------------------------------------------------------- arguments */
typedef struct fargs {
    jv *args; int nargs;
    const char **kwn; jv *kwv; int nkw;
} fargs;

/* argument `name` at position `pos` (-1: keyword only); 1 when given */
static int arg(const fargs *a, const char *name, int pos, jv *out) {
    if (pos >= 0 && pos < a->nargs) { *out = a->args[pos]; return 1; }
    for (int i = 0; i < a->nkw; i++)
        if (!strcmp(a->kwn[i], name)) { *out = a->kwv[i]; return 1; }
    return 0;
}
static void check_kwargs(tmpl_st *J, const fargs *a, const char *what, const char *const *allowed, int maxpos, int line) {
    if (a->nargs > maxpos)
        tmpl_fail(J, CINFER_EINVAL, line, "%s takes at most %d positional argument(s)", what, maxpos);
    for (int i = 0; i < a->nkw; i++)
        if (!in_set(a->kwn[i], allowed))
            tmpl_fail(J, CINFER_EINVAL, line, "%s got an unexpected keyword argument '%s'", what, a->kwn[i]);
}
static int opt_bool(const fargs *a, const char *name, int pos, int dflt) {
    jv v;
    return arg(a, name, pos, &v) ? jv_truthy(v) : dflt;
}
static int64_t want_int(tmpl_st *J, jv v, const char *what, int line) {
    if (v.k == JV_INT) return v.u.i;
    if (v.k == JV_BOOL) return v.u.b;
    tmpl_fail(J, CINFER_EINVAL, line, "%s: expected an integer, got %s", what, jv_typename(v));
}
static jstr *want_str(tmpl_st *J, jv v, const char *what, int line) {
    if (v.k != JV_STR) tmpl_fail(J, CINFER_EINVAL, line, "%s: expected a string, got %s", what, jv_typename(v));
    return v.u.s;
}
static jv mkstr(tmpl_st *J, tbuf *b) { return jv_str(J, b->p ? b->p : "", b->n); }

/* ------------------------------------------------------------- strings */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE };
static uint32_t map_case(uint32_t c, int how) {
    if (c < 0x80) {
        if (how == CASE_LOWER) return c >= 'A' && c <= 'Z' ? c + 32 : c;
        return c >= 'a' && c <= 'z' ? c - 32 : c;
    }
    if (c > 0x10ffff) return c;
    utf8proc_int32_t r = how == CASE_UPPER ? utf8proc_toupper((utf8proc_int32_t)c) :
                         how == CASE_LOWER ? utf8proc_tolower((utf8proc_int32_t)c) :
                                             utf8proc_totitle((utf8proc_int32_t)c);
    return (uint32_t)r;
}
static int is_cased(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (c > 0x10ffff) return 0;
    int cat = utf8proc_category((utf8proc_int32_t)c);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
static int is_upper_cp(uint32_t c) { return is_cased(c) && map_case(c, CASE_LOWER) != c; }
static int is_lower_cp(uint32_t c) { return is_cased(c) && map_case(c, CASE_UPPER) != c; }

/* the unconditional one-to-many mappings of Unicode's SpecialCasing.txt that
 * Python applies (a common subset) */
static const char *special_case(uint32_t c, int how) {
    if (how == CASE_LOWER) return c == 0x130 ? "i\xcc\x87" : NULL;
    switch (c) {
    case 0xdf: return how == CASE_UPPER ? "SS" : "Ss";
    case 0xfb00: return how == CASE_UPPER ? "FF" : "Ff";
    case 0xfb01: return how == CASE_UPPER ? "FI" : "Fi";
    case 0xfb02: return how == CASE_UPPER ? "FL" : "Fl";
    case 0xfb03: return how == CASE_UPPER ? "FFI" : "Ffi";
    case 0xfb04: return how == CASE_UPPER ? "FFL" : "Ffl";
    case 0xfb05: case 0xfb06: return how == CASE_UPPER ? "ST" : "St";
    case 0x149: return "\xca\xbcN";
    default: return NULL;
    }
}

static jv str_case(tmpl_st *J, jstr *s, int how) {
    tbuf b; tbuf_init(&b, J);
    size_t i = 0;
    while (i < s->n) {
        size_t st = i;
        uint32_t c = tmpl_u8_next(s->s, s->n, &i);
        const char *sp = c >= 0x80 ? special_case(c, how) : NULL;
        if (c >= 0x80 && i - st == 1) tbuf_put(&b, s->s + st, 1);
        else if (sp) tbuf_puts(&b, sp);
        else tmpl_u8_put(&b, map_case(c, how));
    }
    return mkstr(J, &b);
}
/* Python str.title(): words are runs of cased characters */
static jv str_pytitle(tmpl_st *J, jstr *s) {
    tbuf b; tbuf_init(&b, J);
    size_t i = 0;
    int prev_cased = 0;
    while (i < s->n) {
        uint32_t c = tmpl_u8_next(s->s, s->n, &i);
        tmpl_u8_put(&b, map_case(c, prev_cased ? CASE_LOWER : CASE_TITLE));
        prev_cased = is_cased(c);
    }
    return mkstr(J, &b);
}
/* Jinja's title filter: words split at runs of [-\s({\[<] */
static jv str_jtitle(tmpl_st *J, jstr *s) {
    tbuf b; tbuf_init(&b, J);
    size_t i = 0;
    int at_start = 1, prev_sep = -1;
    while (i < s->n) {
        uint32_t c = tmpl_u8_next(s->s, s->n, &i);
        int sep = tmpl_isspace(c) || (c < 0x80 && strchr("-({[<", (int)c) && c);
        if (sep != prev_sep) at_start = 1;
        tmpl_u8_put(&b, map_case(c, at_start ? CASE_UPPER : CASE_LOWER));
        at_start = 0;
        prev_sep = sep;
    }
    return mkstr(J, &b);
}
static jv str_capitalize(tmpl_st *J, jstr *s) {
    tbuf b; tbuf_init(&b, J);
    size_t i = 0;
    int first = 1;
    while (i < s->n) {
        uint32_t c = tmpl_u8_next(s->s, s->n, &i);
        tmpl_u8_put(&b, map_case(c, first ? CASE_TITLE : CASE_LOWER));
        first = 0;
    }
    return mkstr(J, &b);
}

static int in_chars(uint32_t c, const jstr *chars) {
    if (!chars) return tmpl_isspace(c);
    size_t i = 0;
    while (i < chars->n) if (tmpl_u8_next(chars->s, chars->n, &i) == c) return 1;
    return 0;
}
/* which: 1 left, 2 right, 3 both */
static jv str_strip(tmpl_st *J, jstr *s, const jstr *chars, int which) {
    size_t a = 0, b = s->n;
    if (which & 1) {
        while (a < b) { size_t j = a; uint32_t c = tmpl_u8_next(s->s, s->n, &j); if (!in_chars(c, chars)) break; a = j; }
    }
    if (which & 2) {
        size_t i = a, keep = a;
        while (i < b) { uint32_t c = tmpl_u8_next(s->s, b, &i); if (!in_chars(c, chars)) keep = i; }
        b = keep;
    }
    return jv_str(J, s->s + a, b - a);
}

static jv str_split(tmpl_st *J, jstr *s, const jstr *sep, int64_t maxsplit, int right, int line) {
    jv out = jv_list(J, 4);
    const char *p = s->s;
    size_t n = s->n;
    if (sep && !sep->n) tmpl_fail(J, CINFER_EINVAL, line, "empty separator");
    if (!right) {
        if (!sep) {
            size_t i = 0;
            while (i < n) {
                size_t j = i; uint32_t c = tmpl_u8_next(p, n, &j);
                if (tmpl_isspace(c)) { i = j; continue; }
                if (maxsplit >= 0 && (int64_t)out.u.l->n >= maxsplit) {
                    jl_push(J, &out, jv_str(J, p + i, n - i));   /* the rest, as is */
                    return out;
                }
                size_t st = i;
                while (i < n) { size_t k = i; uint32_t d = tmpl_u8_next(p, n, &k); if (tmpl_isspace(d)) break; i = k; }
                jl_push(J, &out, jv_str(J, p + st, i - st));
            }
            return out;
        }
        size_t i = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || (int64_t)out.u.l->n < maxsplit) ?
                              memmem(p + i, n - i, sep->s, sep->n) : NULL;
            if (!hit) { jl_push(J, &out, jv_str(J, p + i, n - i)); return out; }
            size_t h = (size_t)(hit - p);
            jl_push(J, &out, jv_str(J, p + i, h - i));
            i = h + sep->n;
        }
    }
    /* rsplit: collect from the right, then reverse */
    jv rev = jv_list(J, 4);
    if (!sep) {
        size_t *starts = tmpl_alloc(J, (n + 1) * sizeof(size_t)), ns = 0;
        size_t i = 0;
        while (i < n) { starts[ns++] = i; tmpl_u8_next(p, n, &i); }
        starts[ns] = n;
        int64_t k = (int64_t)ns - 1;
        for (;;) {
            while (k >= 0) { size_t j = starts[k]; if (!tmpl_isspace(tmpl_u8_next(p, n, &j))) break; k--; }
            if (k < 0) break;
            size_t end = starts[k + 1];
            if (maxsplit >= 0 && (int64_t)rev.u.l->n >= maxsplit) {
                jl_push(J, &rev, jv_str(J, p, end));   /* the rest, as is */
                break;
            }
            while (k >= 0) { size_t j = starts[k]; if (tmpl_isspace(tmpl_u8_next(p, n, &j))) break; k--; }
            size_t st = starts[k + 1];
            jl_push(J, &rev, jv_str(J, p + st, end - st));
        }
    } else {
        size_t end = n;
        for (;;) {
            const char *hit = NULL;
            if ((maxsplit < 0 || (int64_t)rev.u.l->n < maxsplit) && end >= sep->n)
                for (size_t q = end - sep->n + 1; q-- > 0;)
                    if (!memcmp(p + q, sep->s, sep->n)) { hit = p + q; break; }
            if (!hit) { jl_push(J, &rev, jv_str(J, p, end)); break; }
            size_t h = (size_t)(hit - p);
            jl_push(J, &rev, jv_str(J, p + h + sep->n, end - h - sep->n));
            end = h;
        }
    }
    for (size_t i = rev.u.l->n; i-- > 0;) jl_push(J, &out, rev.u.l->v[i]);
    return out;
}

static jv str_replace(tmpl_st *J, jstr *s, jstr *old, jstr *new_, int64_t count) {
    tbuf b; tbuf_init(&b, J);
    size_t i = 0;
    int64_t done = 0;
    if (!old->n) {   /* Python inserts `new` between every character */
        size_t k = 0;
        while (k <= s->n) {
            if (count < 0 || done < count) { tbuf_put(&b, new_->s, new_->n); done++; }
            if (k == s->n) break;
            size_t st = k; tmpl_u8_next(s->s, s->n, &k);
            tbuf_put(&b, s->s + st, k - st);
        }
        return mkstr(J, &b);
    }
    while (i <= s->n) {
        const char *hit = (count < 0 || done < count) ? memmem(s->s + i, s->n - i, old->s, old->n) : NULL;
        if (!hit) { tbuf_put(&b, s->s + i, s->n - i); break; }
        size_t h = (size_t)(hit - s->s);
        tbuf_put(&b, s->s + i, h - i);
        tbuf_put(&b, new_->s, new_->n);
        i = h + old->n;
        done++;
    }
    return mkstr(J, &b);
}

static int starts_ends(tmpl_st *J, jstr *s, jv what, int ends, int line) {
    if (what.k == JV_LIST && what.u.l->tuple) {
        for (size_t i = 0; i < what.u.l->n; i++) if (starts_ends(J, s, what.u.l->v[i], ends, line)) return 1;
        return 0;
    }
    jstr *w = want_str(J, what, ends ? "endswith" : "startswith", line);
    if (w->n > s->n) return 0;
    return !memcmp(ends ? s->s + s->n - w->n : s->s, w->s, w->n);
}

/* codepoint index of byte offset */
static int64_t cp_index(const char *s, size_t off) {
    size_t i = 0; int64_t k = 0;
    while (i < off) { tmpl_u8_next(s, off, &i); k++; }
    return k;
}

/* Python %-formatting: %s %r %d %i %f %F %e %E %g %G %x %X %o %c %% */
static jv py_percent(tmpl_st *J, jstr *fmt, jv *args, int nargs, int line) {
    tbuf b; tbuf_init(&b, J);
    int ai = 0;
    for (size_t i = 0; i < fmt->n; i++) {
        char c = fmt->s[i];
        if (c != '%') { tbuf_putc(&b, c); continue; }
        if (i + 1 < fmt->n && fmt->s[i + 1] == '%') { tbuf_putc(&b, '%'); i++; continue; }
        char spec[32]; size_t k = 0;
        spec[k++] = '%';
        i++;
        if (i < fmt->n && fmt->s[i] == '(')
            tmpl_fail(J, CINFER_EUNSUPPORTED, line, "%%(name) formatting is not supported");
        while (i < fmt->n && strchr("-+ #0123456789.", fmt->s[i]) && k < 20) spec[k++] = fmt->s[i++];
        if (i >= fmt->n) tmpl_fail(J, CINFER_EINVAL, line, "incomplete format");
        char conv = fmt->s[i];
        if (ai >= nargs) tmpl_fail(J, CINFER_EINVAL, line, "not enough arguments for format string");
        jv a = args[ai++];
        if (conv == 's' || conv == 'r' || conv == 'a') {
            tbuf t; tbuf_init(&t, J);
            if (conv == 's') jv_str_into(J, &t, a, line); else jv_repr_into(J, &t, a, line);
            spec[k++] = 's'; spec[k] = 0;
            if (k == 2) tbuf_put(&b, t.p ? t.p : "", t.n);
            else {
                char *o; int len = asprintf(&o, spec, t.p ? t.p : "");
                if (len < 0) tmpl_fail(J, CINFER_ENOMEM, line, "out of memory");
                tbuf_put(&b, o, (size_t)len); free(o);
            }
        } else if (strchr("dixXoc", conv)) {
            if (a.k != JV_INT && a.k != JV_BOOL && a.k != JV_FLOAT)
                tmpl_fail(J, CINFER_EINVAL, line, "%%%c format: a number is required, not %s", conv, jv_typename(a));
            long long v = a.k == JV_FLOAT ? (long long)a.u.f : a.k == JV_INT ? (long long)a.u.i : a.u.b;
            if (conv == 'c') { tmpl_u8_put(&b, (uint32_t)v); continue; }
            spec[k++] = 'l'; spec[k++] = 'l'; spec[k++] = conv == 'i' ? 'd' : conv; spec[k] = 0;
            tbuf_printf(&b, spec, v);
        } else if (strchr("fFeEgG", conv)) {
            if (a.k != JV_INT && a.k != JV_BOOL && a.k != JV_FLOAT)
                tmpl_fail(J, CINFER_EINVAL, line, "must be real number, not %s", jv_typename(a));
            double v = a.k == JV_FLOAT ? a.u.f : a.k == JV_INT ? (double)a.u.i : a.u.b;
            spec[k++] = conv; spec[k] = 0;
            tbuf_printf(&b, spec, v);
        } else tmpl_fail(J, CINFER_EUNSUPPORTED, line, "format conversion '%%%c' is not supported", conv);
    }
    if (ai < nargs) tmpl_fail(J, CINFER_EINVAL, line, "not all arguments converted during string formatting");
    return mkstr(J, &b);
}

/* str.format with {} {0} {name}; no format specs */
static jv py_format(tmpl_st *J, jstr *fmt, const fargs *a, int line) {
    tbuf b; tbuf_init(&b, J);
    int auto_i = 0;
    for (size_t i = 0; i < fmt->n; i++) {
        char c = fmt->s[i];
        if (c == '{' && i + 1 < fmt->n && fmt->s[i + 1] == '{') { tbuf_putc(&b, '{'); i++; continue; }
        if (c == '}' && i + 1 < fmt->n && fmt->s[i + 1] == '}') { tbuf_putc(&b, '}'); i++; continue; }
        if (c != '{') { tbuf_putc(&b, c); continue; }
        size_t e = i + 1;
        while (e < fmt->n && fmt->s[e] != '}') e++;
        if (e >= fmt->n) tmpl_fail(J, CINFER_EINVAL, line, "single '{' encountered in format string");
        const char *f = fmt->s + i + 1;
        size_t fl = e - i - 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            tmpl_fail(J, CINFER_EUNSUPPORTED, line, "str.format specs/conversions are not supported");
        jv v;
        if (!fl) {
            if (auto_i >= a->nargs) tmpl_fail(J, CINFER_EINVAL, line, "format: index out of range");
            v = a->args[auto_i++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            int idx = atoi(f);
            if (idx >= a->nargs) tmpl_fail(J, CINFER_EINVAL, line, "format: index out of range");
            v = a->args[idx];
        } else {
            char *name = tmpl_strndup(J, f, fl);
            if (!arg(a, name, -1, &v)) tmpl_fail(J, CINFER_EINVAL, line, "format: missing key '%s'", name);
        }
        jv_str_into(J, &b, v, line);
        i = e;
    }
    return mkstr(J, &b);
}

/* str.splitlines() boundaries */
static jv str_splitlines(tmpl_st *J, jstr *s) {
    jv out = jv_list(J, 4);
    size_t i = 0, st = 0;
    while (i < s->n) {
        size_t j = i;
        uint32_t c = tmpl_u8_next(s->s, s->n, &j);
        if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
            c == 0x85 || c == 0x2028 || c == 0x2029) {
            jl_push(J, &out, jv_str(J, s->s + st, i - st));
            if (c == '\r' && j < s->n && s->s[j] == '\n') j++;
            st = j;
        }
        i = j;
    }
    if (st < s->n) jl_push(J, &out, jv_str(J, s->s + st, s->n - st));
    return out;
}

/* ------------------------------------------------------------- methods */
static const char *const str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace",
    "upper", "lower", "title", "capitalize", "find", "rfind", "index", "rindex", "count",
    "join", "format", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower",
    "isnumeric", "isdecimal", "splitlines", "swapcase", "casefold",
    /* Python has these; not implemented here */
    "center", "ljust", "rjust", "zfill", "encode", "expandtabs", "partition", "rpartition",
    "removeprefix", "removesuffix", "translate", "maketrans", "istitle", "isidentifier",
    "isprintable", "isascii", "format_map", NULL};
static const char *const dict_methods[] = {
    "get", "items", "keys", "values",
    "copy", "pop", "popitem", "setdefault", "update", "clear", "fromkeys", NULL};
static const char *const list_methods[] = {
    "count", "index",
    "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", "copy", NULL};

int tmpl_is_method(jv self, const char *name) {
    if (self.k == JV_STR) return in_set(name, str_methods);
    if (self.k == JV_DICT) return in_set(name, dict_methods);
    if (self.k == JV_LIST) return in_set(name, list_methods);
    return 0;
}

static jv dict_items(tmpl_st *J, jv d) {
    jv out = jv_view(jv_list(J, d.u.d->n), JL_ITEMS);
    for (size_t i = 0; i < d.u.d->n; i++) {
        jv t = jv_list(J, 2);
        t.u.l->tuple = 1;
        jl_push(J, &t, d.u.d->k[i]);
        jl_push(J, &t, d.u.d->v[i]);
        jl_push(J, &out, t);
    }
    return out;
}

static int str_all(jstr *s, int what) {
    if (!s->n) return 0;
    size_t i = 0;
    int any_cased = 0;
    while (i < s->n) {
        uint32_t c = tmpl_u8_next(s->s, s->n, &i);
        int cat = c > 0x10ffff ? 0 : utf8proc_category((utf8proc_int32_t)c);
        int ok;
        switch (what) {
        case 'd': ok = cat == UTF8PROC_CATEGORY_ND; break;
        case 'a': ok = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO; break;
        case 'n': ok = (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                       (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO); break;
        case 's': ok = tmpl_isspace(c); break;
        case 'u': ok = !is_lower_cp(c); any_cased |= is_upper_cp(c); break;
        case 'l': ok = !is_upper_cp(c); any_cased |= is_lower_cp(c); break;
        default: ok = 0;
        }
        if (!ok) return 0;
    }
    return (what == 'u' || what == 'l') ? any_cased : 1;
}

jv tmpl_method(tmpl_st *J, jv self, const char *name, jv *args, int nargs,
               const char **kwn, jv *kwv, int nkw, int line) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    jv x, y;
    tmpl_charge(J, self, line);
    if (self.k == JV_STR) {
        jstr *s = self.u.s;
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
            jstr *chars = arg(&a, "chars", 0, &x) && x.k != JV_NONE ? want_str(J, x, name, line) : NULL;
            return str_strip(J, s, chars, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3);
        }
        if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
            jstr *sep = arg(&a, "sep", 0, &x) && x.k != JV_NONE ? want_str(J, x, name, line) : NULL;
            int64_t maxsplit = arg(&a, "maxsplit", 1, &y) ? want_int(J, y, name, line) : -1;
            return str_split(J, s, sep, maxsplit, name[0] == 'r', line);
        }
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            if (nargs != 1 || nkw) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "str.%s: only one argument is supported", name);
            return jv_bool(starts_ends(J, s, args[0], name[0] == 'e', line));
        }
        if (!strcmp(name, "replace")) {
            if (nargs < 2) tmpl_fail(J, CINFER_EINVAL, line, "replace expected at least 2 arguments");
            int64_t count = nargs > 2 ? want_int(J, args[2], name, line) : -1;
            return str_replace(J, s, want_str(J, args[0], name, line), want_str(J, args[1], name, line), count);
        }
        if (!strcmp(name, "upper")) return str_case(J, s, CASE_UPPER);
        if (!strcmp(name, "lower") || !strcmp(name, "casefold")) return str_case(J, s, CASE_LOWER);
        if (!strcmp(name, "title")) return str_pytitle(J, s);
        if (!strcmp(name, "capitalize")) return str_capitalize(J, s);
        if (!strcmp(name, "swapcase")) {
            tbuf b; tbuf_init(&b, J);
            size_t i = 0;
            while (i < s->n) {
                uint32_t c = tmpl_u8_next(s->s, s->n, &i);
                tmpl_u8_put(&b, is_upper_cp(c) ? map_case(c, CASE_LOWER) : is_lower_cp(c) ? map_case(c, CASE_UPPER) : c);
            }
            return mkstr(J, &b);
        }
        if (!strcmp(name, "find") || !strcmp(name, "index") || !strcmp(name, "rfind") || !strcmp(name, "rindex") ||
            !strcmp(name, "count")) {
            if (nargs != 1) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "str.%s: only one argument is supported", name);
            jstr *sub = want_str(J, args[0], name, line);
            if (!strcmp(name, "count")) {
                if (!sub->n) return jv_int((int64_t)tmpl_u8_len(s->s, s->n) + 1);
                int64_t k = 0; size_t i = 0;
                const char *h;
                while ((h = memmem(s->s + i, s->n - i, sub->s, sub->n))) { k++; i = (size_t)(h - s->s) + sub->n; }
                return jv_int(k);
            }
            int64_t pos = -1;
            if (name[0] == 'r') {
                if (sub->n <= s->n)
                    for (size_t q = s->n - sub->n + 1; q-- > 0;)
                        if (!memcmp(s->s + q, sub->s, sub->n)) { pos = cp_index(s->s, q); break; }
            } else {
                const char *h = memmem(s->s, s->n, sub->s, sub->n);
                if (h) pos = cp_index(s->s, (size_t)(h - s->s));
            }
            if (pos < 0 && strstr(name, "index")) tmpl_fail(J, CINFER_EINVAL, line, "substring not found");
            return jv_int(pos);
        }
        if (!strcmp(name, "join")) {
            if (nargs != 1) tmpl_fail(J, CINFER_EINVAL, line, "join() takes exactly one argument");
            jv items = tmpl_iterate(J, args[0], line);
            tbuf b; tbuf_init(&b, J);
            for (size_t i = 0; i < items.u.l->n; i++) {
                if (i) tbuf_put(&b, s->s, s->n);
                if (items.u.l->v[i].k != JV_STR)
                    tmpl_fail(J, CINFER_EINVAL, line, "sequence item %zu: expected str instance, %s found",
                              i, jv_typename(items.u.l->v[i]));
                tbuf_put(&b, items.u.l->v[i].u.s->s, items.u.l->v[i].u.s->n);
            }
            return mkstr(J, &b);
        }
        if (!strcmp(name, "format")) return py_format(J, s, &a, line);
        if (!strcmp(name, "isdigit") || !strcmp(name, "isdecimal") || !strcmp(name, "isnumeric"))
            return jv_bool(str_all(s, 'd'));
        if (!strcmp(name, "isalpha")) return jv_bool(str_all(s, 'a'));
        if (!strcmp(name, "isalnum")) return jv_bool(str_all(s, 'n'));
        if (!strcmp(name, "isspace")) return jv_bool(str_all(s, 's'));
        if (!strcmp(name, "isupper")) return jv_bool(str_all(s, 'u'));
        if (!strcmp(name, "islower")) return jv_bool(str_all(s, 'l'));
        if (!strcmp(name, "splitlines")) return str_splitlines(J, s);
        tmpl_fail(J, CINFER_EUNSUPPORTED, line, "string method '%s' is not supported", name);
    }
    if (self.k == JV_DICT) {
        if (!strcmp(name, "get")) {
            if (nargs < 1 || nargs > 2) tmpl_fail(J, CINFER_EINVAL, line, "get expected 1 or 2 arguments");
            jv *p = jd_get(&self, args[0]);
            return p ? *p : nargs > 1 ? args[1] : jv_none();
        }
        if (!strcmp(name, "items")) return dict_items(J, self);
        if (!strcmp(name, "keys")) {
            jv it = tmpl_iterate(J, self, line);
            jv out = jv_view(jv_list(J, it.u.l->n), JL_KEYS);
            for (size_t i = 0; i < it.u.l->n; i++) jl_push(J, &out, it.u.l->v[i]);
            return out;
        }
        if (!strcmp(name, "values")) {
            jv out = jv_view(jv_list(J, self.u.d->n), JL_VALUES);
            for (size_t i = 0; i < self.u.d->n; i++) jl_push(J, &out, self.u.d->v[i]);
            return out;
        }
        tmpl_fail(J, CINFER_EUNSUPPORTED, line, "dict method '%s' is not supported (dicts are immutable in the sandbox)", name);
    }
    if (self.k == JV_LIST) {
        if (!strcmp(name, "count") && nargs == 1) {
            int64_t k = 0;
            for (size_t i = 0; i < self.u.l->n; i++) k += jv_eq(self.u.l->v[i], args[0]);
            return jv_int(k);
        }
        if (!strcmp(name, "index") && nargs == 1) {
            for (size_t i = 0; i < self.u.l->n; i++) if (jv_eq(self.u.l->v[i], args[0])) return jv_int((int64_t)i);
            tmpl_fail(J, CINFER_EINVAL, line, "value is not in list");
        }
        tmpl_fail(J, CINFER_EUNSUPPORTED, line, "list method '%s' is not supported (lists are immutable in the sandbox)", name);
    }
    tmpl_fail(J, CINFER_EUNSUPPORTED, line, "method '%s' of %s is not supported", name, jv_typename(self));
}

/* ---------------------------------------------------------------- tests */
static const char *const test_names[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even",
    "false", "filter", "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable",
    "le", "<=", "lower", "lt", "lessthan", "<", "mapping", "ne", "!=", "none", "number", "odd",
    "sameas", "sequence", "string", "test", "true", "undefined", "upper", NULL};

int tmpl_test_known(const char *name) { return in_set(name, test_names); }

static const char *const tests_with_arg[] = {
    "divisibleby", "eq", "equalto", "==", "ne", "!=", "gt", "greaterthan", ">", "ge", ">=",
    "lt", "lessthan", "<", "le", "<=", "in", "sameas", NULL};

int tmpl_test(tmpl_st *J, const char *name, jv v, jv *args, int nargs, int line) {
    int want = in_set(name, tests_with_arg);
    if (nargs != want)
        tmpl_fail(J, CINFER_EINVAL, line, "test '%s' takes %d argument(s), %d given", name, want, nargs);
    jv a0 = nargs > 0 ? args[0] : jv_undef(NULL);
    int k = v.k;
    if (!strcmp(name, "defined")) return k != JV_UNDEF;
    if (!strcmp(name, "undefined")) return k == JV_UNDEF;
    if (!strcmp(name, "none")) return k == JV_NONE;
    if (!strcmp(name, "boolean")) return k == JV_BOOL;
    if (!strcmp(name, "true")) return k == JV_BOOL && v.u.b;
    if (!strcmp(name, "false")) return k == JV_BOOL && !v.u.b;
    if (!strcmp(name, "integer")) return k == JV_INT;
    if (!strcmp(name, "float")) return k == JV_FLOAT;
    if (!strcmp(name, "number")) return k == JV_INT || k == JV_FLOAT || k == JV_BOOL;
    if (!strcmp(name, "string")) return k == JV_STR;
    if (!strcmp(name, "mapping")) return k == JV_DICT && v.u.d->kind == JD_PLAIN;
    if (!strcmp(name, "iterable")) return k == JV_STR || k == JV_LIST || k == JV_UNDEF || (k == JV_DICT && v.u.d->kind == JD_PLAIN);
    if (!strcmp(name, "sequence"))
        return k == JV_STR || (k == JV_LIST && (!v.u.l->view || v.u.l->view == JL_RANGE)) ||
               (k == JV_DICT && v.u.d->kind == JD_PLAIN);
    if (!strcmp(name, "callable")) return k == JV_FUNC;
    if (!strcmp(name, "escaped")) return 0;
    if (!strcmp(name, "sameas")) {
        if (k != a0.k) return 0;
        switch (k) {
        case JV_NONE: case JV_UNDEF: return 1;
        case JV_BOOL: return v.u.b == a0.u.b;
        case JV_INT: return v.u.i == a0.u.i && v.u.i >= -5 && v.u.i <= 256;  /* CPython small ints */
        case JV_STR: return v.u.s == a0.u.s;
        case JV_LIST: return v.u.l == a0.u.l;
        case JV_DICT: return v.u.d == a0.u.d;
        default: return v.u.fn == a0.u.fn;
        }
    }
    if (!strcmp(name, "filter")) return k == JV_STR && tmpl_filter_known(v.u.s->s);
    if (!strcmp(name, "test")) return k == JV_STR && tmpl_test_known(v.u.s->s);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        jv s = jv_to_string(J, v, line);
        return str_all(s.u.s, name[0]);
    }
    if (!strcmp(name, "even") || !strcmp(name, "odd")) {
        int64_t x = want_int(J, v, name, line);
        return (x % 2 != 0) == (name[0] == 'o');
    }
    if (!strcmp(name, "divisibleby")) {
        jv r = tmpl_binop(J, '%', v, a0, line);
        return !jv_truthy(r);
    }
    if (!strcmp(name, "in")) return tmpl_contains(J, a0, v, line);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_eq(v, a0);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_eq(v, a0);
    int c;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) return jv_cmp(J, v, a0, line) > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return jv_cmp(J, v, a0, line) >= 0;
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) return jv_cmp(J, v, a0, line) < 0;
    if (!strcmp(name, "le") || !strcmp(name, "<=")) { c = jv_cmp(J, v, a0, line); return c <= 0; }
    tmpl_fail(J, CINFER_EUNSUPPORTED, line, "test '%s' is not supported", name);
}

/* --------------------------------------------------------- sort helpers */
typedef struct sort_ctx { tmpl_st *J; int line, ci, reverse, eq_first; } sort_ctx;

static jv fold(tmpl_st *J, jv v, int ci) {
    return (ci && v.k == JV_STR) ? str_case(J, v.u.s, CASE_LOWER) : v;
}
/* stable merge sort of keys[] carrying items[] */
static void msort(sort_ctx *c, jv *keys, jv *items, jv *tk, jv *ti, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(c, keys, items, tk, ti, h);
    msort(c, keys + h, items + h, tk, ti, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        /* attribute keys are compared as 1-lists: equal items (even two
         * Undefined) compare equal before '<' is tried */
        int r = c->eq_first && jv_eq(keys[j], keys[i]) ? 0 : jv_cmp(c->J, keys[j], keys[i], c->line);
        if (c->reverse) r = -r;
        if (r < 0) { tk[k] = keys[j]; ti[k++] = items[j++]; }
        else { tk[k] = keys[i]; ti[k++] = items[i++]; }
    }
    while (i < h) { tk[k] = keys[i]; ti[k++] = items[i++]; }
    while (j < n) { tk[k] = keys[j]; ti[k++] = items[j++]; }
    memcpy(keys, tk, n * sizeof(jv));
    memcpy(items, ti, n * sizeof(jv));
}
static jv sorted(tmpl_st *J, jv items, jv *keys, int reverse, int eq_first, int line) {
    size_t n = items.u.l->n;
    jv out = jv_list(J, n);
    for (size_t i = 0; i < n; i++) jl_push(J, &out, items.u.l->v[i]);
    jv *tk = tmpl_alloc(J, (n + 1) * sizeof(jv)), *ti = tmpl_alloc(J, (n + 1) * sizeof(jv));
    sort_ctx c = {J, line, 0, reverse, eq_first};
    msort(&c, keys, out.u.l->v, tk, ti, n);
    return out;
}

/* Jinja's make_attrgetter: dotted path, digit parts are indexes */
static jv attr_path_d(tmpl_st *J, jv item, jstr *path, const jv *dflt, int line) {
    const char *p = path->s;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) if (p[i] < '0' || p[i] > '9') digits = 0;
        jv key = digits ? jv_int(atoll(p)) : jv_str(J, p, n);
        item = tmpl_getitem(J, item, key, line);
        if (dflt && item.k == JV_UNDEF) item = *dflt;   /* per part, as Jinja */
        if (!dot) return item;
        p = dot + 1;
    }
}

static jv attr_path(tmpl_st *J, jv item, jstr *path, int line) { return attr_path_d(J, item, path, NULL, line); }

/* ------------------------------------------------------------- filters */
static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "pprint",
    "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson", "trim",
    "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", NULL};

int tmpl_filter_known(const char *name) { return in_set(name, filter_names); }

static jv f_select(tmpl_st *J, jv v, const fargs *a, int attr, int want, int line) {
    jv items = jv_truthy(v) ? tmpl_iterate(J, v, line) : jv_list(J, 0);   /* Jinja: `if value:` */
    jv out = jv_list(J, items.u.l->n);
    int off = attr ? 1 : 0;
    jstr *path = NULL;
    if (attr) {
        if (a->nargs < 1) tmpl_fail(J, CINFER_EINVAL, line, "selectattr/rejectattr need an attribute");
        path = want_str(J, a->args[0], "attribute", line);
    }
    const char *test = NULL;
    if (a->nargs > off) test = want_str(J, a->args[off], "test name", line)->s;
    if (test && !tmpl_test_known(test)) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "no test named '%s'", test);
    for (size_t i = 0; i < items.u.l->n; i++) {
        jv it = items.u.l->v[i];
        jv x = attr ? attr_path(J, it, path, line) : it;
        int r = test ? tmpl_test(J, test, x, a->args + off + 1, a->nargs - off - 1, line) : jv_truthy(x);
        if (r == want) jl_push(J, &out, it);
    }
    return out;
}

static jv f_map(tmpl_st *J, jv v, const fargs *a, int line) {
    jv items = jv_truthy(v) ? tmpl_iterate(J, v, line) : jv_list(J, 0);   /* Jinja: `if value:` */
    jv out = jv_list(J, items.u.l->n);
    jv at, dflt;
    if (!a->nargs && arg(a, "attribute", -1, &at)) {
        jstr *path = want_str(J, at, "attribute", line);
        int has_d = arg(a, "default", -1, &dflt) && dflt.k != JV_NONE;
        for (size_t i = 0; i < items.u.l->n; i++)
            jl_push(J, &out, attr_path_d(J, items.u.l->v[i], path, has_d ? &dflt : NULL, line));
        return out;
    }
    if (a->nargs < 1) tmpl_fail(J, CINFER_EINVAL, line, "map requires a filter name or attribute=");
    const char *f = want_str(J, a->args[0], "filter name", line)->s;
    if (!tmpl_filter_known(f)) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "no filter named '%s'", f);
    for (size_t i = 0; i < items.u.l->n; i++)
        jl_push(J, &out, tmpl_filter(J, f, items.u.l->v[i], a->args + 1, a->nargs - 1, a->kwn, a->kwv, a->nkw, line));
    return out;
}

/* the text Python's float() accepts (no hex, underscores only between digits) */
static int py_float_text(const char *s, size_t n, double *out) {
    char buf[512];
    size_t k = 0;
    if (!n || n >= sizeof buf) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '_') {
            if (!i || i + 1 >= n || s[i - 1] < '0' || s[i - 1] > '9' || s[i + 1] < '0' || s[i + 1] > '9') return 0;
            continue;
        }
        if (c == 'x' || c == 'X' || c == 'p' || c == 'P') return 0;
        buf[k++] = c;
    }
    buf[k] = 0;
    char *end;
    double f = strtod(buf, &end);
    if (end != buf + k) return 0;
    *out = f;
    return 1;
}

static jv to_int(tmpl_st *J, jv v, jv dflt, int line) {
    switch (v.k) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(v.u.b);
    case JV_FLOAT:
        if (isnan(v.u.f) || isinf(v.u.f)) tmpl_fail(J, CINFER_EINVAL, line, "cannot convert float %s to integer", isnan(v.u.f) ? "NaN" : "infinity");
        if (fabs(v.u.f) >= 9.2e18) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "integer does not fit in 64 bits");
        return jv_int((int64_t)v.u.f);
    case JV_STR: {
        jv t = str_strip(J, v.u.s, NULL, 3);
        const char *s = t.u.s->s;
        size_t n = t.u.s->n, i = 0;
        int neg = 0, ok = n > 0, nd = 0;
        int64_t r = 0;
        if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
        for (; i < n && ok; i++) {
            if (s[i] == '_' && nd && i + 1 < n && s[i + 1] != '_') continue;
            if (s[i] < '0' || s[i] > '9') { ok = 0; break; }
            if (__builtin_mul_overflow(r, 10, &r) || __builtin_add_overflow(r, s[i] - '0', &r))
                tmpl_fail(J, CINFER_EUNSUPPORTED, line, "integer does not fit in 64 bits");
            nd++;
        }
        if (ok && nd) return jv_int(neg ? -r : r);
        double f;
        if (py_float_text(s, n, &f) && !isnan(f) && !isinf(f)) return to_int(J, jv_float(f), dflt, line);
        return dflt;
    }
    default: return dflt;
    }
}

static jv to_float(tmpl_st *J, jv v, jv dflt) {
    switch (v.k) {
    case JV_FLOAT: return v;
    case JV_INT: return jv_float((double)v.u.i);
    case JV_BOOL: return jv_float(v.u.b);
    case JV_STR: {
        jv t = str_strip(J, v.u.s, NULL, 3);
        double f;
        return py_float_text(t.u.s->s, t.u.s->n, &f) ? jv_float(f) : dflt;
    }
    default: return dflt;
    }
}

static jv f_minmax(tmpl_st *J, jv v, const fargs *a, int want_max, int line) {
    jv items = tmpl_iterate(J, v, line);
    int ci = !opt_bool(a, "case_sensitive", 0, 0);
    jv at; jstr *path = arg(a, "attribute", 1, &at) && at.k != JV_NONE ? want_str(J, at, "attribute", line) : NULL;
    if (!items.u.l->n) return jv_undef("\001No aggregated item, sequence was empty.");
    size_t best = 0;
    jv bk = fold(J, path ? attr_path(J, items.u.l->v[0], path, line) : items.u.l->v[0], ci);
    for (size_t i = 1; i < items.u.l->n; i++) {
        jv k = fold(J, path ? attr_path(J, items.u.l->v[i], path, line) : items.u.l->v[i], ci);
        int c = jv_cmp(J, k, bk, line);
        if (want_max ? c > 0 : c < 0) { best = i; bk = k; }
    }
    return items.u.l->v[best];
}

static jv html_escape(tmpl_st *J, jv v, int line) {
    jv s = jv_to_string(J, v, line);
    tbuf b; tbuf_init(&b, J);
    for (size_t i = 0; i < s.u.s->n; i++) {
        char c = s.u.s->s[i];
        switch (c) {
        case '&': tbuf_puts(&b, "&amp;"); break;
        case '<': tbuf_puts(&b, "&lt;"); break;
        case '>': tbuf_puts(&b, "&gt;"); break;
        case '"': tbuf_puts(&b, "&#34;"); break;
        case '\'': tbuf_puts(&b, "&#39;"); break;
        default: tbuf_putc(&b, c);
        }
    }
    return mkstr(J, &b);
}

static jv f_tojson(tmpl_st *J, jv v, const fargs *a, int line) {
    static const char *const allowed[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    check_kwargs(J, a, "tojson", allowed, 4, line);
    json_opts o = {0};
    o.ensure_ascii = opt_bool(a, "ensure_ascii", 0, 0);
    o.sort_keys = opt_bool(a, "sort_keys", 3, 0);
    jv ind, sep;
    char *indent = NULL;
    if (arg(a, "indent", 1, &ind) && ind.k != JV_NONE) {
        if (ind.k == JV_STR) indent = ind.u.s->s;
        else {
            int64_t w = want_int(J, ind, "tojson indent", line);
            if (w > 1024) tmpl_fail(J, CINFER_EINVAL, line, "tojson indent too large");
            if (w < 0) w = 0;
            indent = tmpl_alloc(J, (size_t)w + 1);
            memset(indent, ' ', (size_t)w);
        }
    }
    o.indent = indent;
    o.item_sep = indent ? "," : ", ";
    o.key_sep = ": ";
    if (arg(a, "separators", 2, &sep) && sep.k != JV_NONE) {
        if (sep.k != JV_LIST || sep.u.l->n != 2)
            tmpl_fail(J, CINFER_EINVAL, line, "tojson separators must be a pair of strings");
        o.item_sep = want_str(J, sep.u.l->v[0], "separators", line)->s;
        o.key_sep = want_str(J, sep.u.l->v[1], "separators", line)->s;
    }
    tbuf b; tbuf_init(&b, J);
    jv_tojson(J, &b, v, &o, 0, line);
    return mkstr(J, &b);
}

static jv f_indent(tmpl_st *J, jv v, const fargs *a, int line) {
    if (v.k == JV_UNDEF) tmpl_undef_error(J, v, line);
    if (v.k != JV_STR)   /* Jinja does s += "\n" */
        tmpl_fail(J, CINFER_EINVAL, line, "indent: unsupported operand type(s) for +=: '%s' and 'str'", jv_typename(v));
    jv w, s = v;
    const char *ind = "    ";
    if (arg(a, "width", 0, &w)) {
        if (w.k == JV_STR) ind = w.u.s->s;
        else {
            int64_t n = want_int(J, w, "indent width", line);
            if (n < 0) n = 0;
            if (n > 1024) tmpl_fail(J, CINFER_EINVAL, line, "indent width too large");
            char *p = tmpl_alloc(J, (size_t)n + 1);
            memset(p, ' ', (size_t)n);
            ind = p;
        }
    }
    int first = opt_bool(a, "first", 1, 0), blank = opt_bool(a, "blank", 2, 0);
    tbuf t; tbuf_init(&t, J);
    tbuf_put(&t, s.u.s->s, s.u.s->n);
    tbuf_putc(&t, '\n');
    jv lines = str_splitlines(J, mkstr(J, &t).u.s);
    tbuf b; tbuf_init(&b, J);
    if (first) tbuf_puts(&b, ind);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jstr *l = lines.u.l->v[i].u.s;
        if (i) {
            tbuf_putc(&b, '\n');
            if (blank || l->n) tbuf_puts(&b, ind);
        }
        tbuf_put(&b, l->s, l->n);
    }
    return mkstr(J, &b);
}

jv tmpl_filter(tmpl_st *J, const char *name, jv v, jv *args, int nargs,
               const char **kwn, jv *kwv, int nkw, int line) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    jv x, y;
    tmpl_charge(J, v, line);
    if (!strcmp(name, "safe")) return jv_to_string(J, v, line);   /* Markup(str(v)) */
    if (!strcmp(name, "tojson")) return f_tojson(J, v, &a, line);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv dflt = arg(&a, "default_value", 0, &x) ? x : jv_cstr(J, "");
        int boolean = opt_bool(&a, "boolean", 1, 0);
        if (v.k == JV_UNDEF || (boolean && !jv_truthy(v))) return dflt;
        return v;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        switch (v.k) {
        case JV_UNDEF: return jv_int(0);
        case JV_STR: return jv_int((int64_t)tmpl_u8_len(v.u.s->s, v.u.s->n));
        case JV_LIST:
            if (v.u.l->view == JL_GEN) tmpl_fail(J, CINFER_EINVAL, line, "object of type 'generator' has no len()");
            return jv_int((int64_t)v.u.l->n);
        case JV_DICT: if (v.u.d->kind == JD_PLAIN) return jv_int((int64_t)v.u.d->n); /* fallthrough */
        default: tmpl_fail(J, CINFER_EINVAL, line, "object of type '%s' has no len()", jv_typename(v));
        }
    }
    if (!strcmp(name, "string")) return jv_to_string(J, v, line);
    if (!strcmp(name, "trim")) {
        jstr *chars = arg(&a, "chars", 0, &x) && x.k != JV_NONE ? want_str(J, x, "trim", line) : NULL;
        return str_strip(J, jv_to_string(J, v, line).u.s, chars, 3);
    }
    if (!strcmp(name, "upper")) return str_case(J, jv_to_string(J, v, line).u.s, CASE_UPPER);
    if (!strcmp(name, "lower")) return str_case(J, jv_to_string(J, v, line).u.s, CASE_LOWER);
    if (!strcmp(name, "title")) return str_jtitle(J, jv_to_string(J, v, line).u.s);
    if (!strcmp(name, "capitalize")) return str_capitalize(J, jv_to_string(J, v, line).u.s);
    if (!strcmp(name, "replace")) {
        if (nargs < 2) tmpl_fail(J, CINFER_EINVAL, line, "replace needs old and new");
        int64_t count = arg(&a, "count", 2, &x) && x.k != JV_NONE ? want_int(J, x, "replace", line) : -1;
        return str_replace(J, jv_to_string(J, v, line).u.s, jv_to_string(J, args[0], line).u.s,
                           jv_to_string(J, args[1], line).u.s, count);
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape") || !strcmp(name, "forceescape")) return html_escape(J, v, line);
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        if (name[0] == 'l' && v.k == JV_LIST && v.u.l->view == JL_GEN)
            tmpl_fail(J, CINFER_EINVAL, line, "'generator' object is not reversible");
        jv items = tmpl_iterate(J, v, line);
        if (!items.u.l->n) return jv_undef(name[0] == 'f' ? "\001No first item, sequence was empty."
                                                          : "\001No last item, sequence was empty.");
        return items.u.l->v[name[0] == 'f' ? 0 : items.u.l->n - 1];
    }
    if (!strcmp(name, "list")) {
        jv items = tmpl_iterate(J, v, line);
        jv out = jv_list(J, items.u.l->n);
        for (size_t i = 0; i < items.u.l->n; i++) jl_push(J, &out, items.u.l->v[i]);
        return out;
    }
    if (!strcmp(name, "items")) {
        if (v.k == JV_UNDEF) return jv_view(jv_list(J, 0), JL_GEN);
        if (v.k != JV_DICT || v.u.d->kind != JD_PLAIN)
            tmpl_fail(J, CINFER_EINVAL, line, "can only get item pairs from a mapping");
        return jv_view(dict_items(J, v), JL_GEN);
    }
    if (!strcmp(name, "join")) {
        jv items = tmpl_iterate(J, v, line);
        jstr *sep = arg(&a, "d", 0, &x) ? jv_to_string(J, x, line).u.s : NULL;
        jstr *path = arg(&a, "attribute", 1, &y) && y.k != JV_NONE ? want_str(J, y, "attribute", line) : NULL;
        tbuf b; tbuf_init(&b, J);
        for (size_t i = 0; i < items.u.l->n; i++) {
            if (i && sep) tbuf_put(&b, sep->s, sep->n);
            jv it = path ? attr_path(J, items.u.l->v[i], path, line) : items.u.l->v[i];
            jv_str_into(J, &b, it, line);
        }
        return mkstr(J, &b);
    }
    if ((!strcmp(name, "int") || !strcmp(name, "float")) && v.k == JV_UNDEF) tmpl_undef_error(J, v, line);
    if (!strcmp(name, "int")) {
        jv dflt = arg(&a, "default", 0, &x) ? x : jv_int(0);
        if (arg(&a, "base", 1, &y) && !(y.k == JV_INT && y.u.i == 10))
            tmpl_fail(J, CINFER_EUNSUPPORTED, line, "int filter: only base 10 is supported");
        return to_int(J, v, dflt, line);
    }
    if (!strcmp(name, "float")) return to_float(J, v, arg(&a, "default", 0, &x) ? x : jv_float(0));
    if (!strcmp(name, "abs")) {
        if (v.k == JV_INT) { if (v.u.i == INT64_MIN) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "integer overflow"); return jv_int(v.u.i < 0 ? -v.u.i : v.u.i); }
        if (v.k == JV_BOOL) return jv_int(v.u.b);
        if (v.k == JV_FLOAT) return jv_float(fabs(v.u.f));
        tmpl_fail(J, CINFER_EINVAL, line, "bad operand type for abs(): '%s'", jv_typename(v));
    }
    if (!strcmp(name, "round")) {
        int64_t prec = arg(&a, "precision", 0, &x) ? want_int(J, x, "round", line) : 0;
        const char *method = arg(&a, "method", 1, &y) ? want_str(J, y, "round", line)->s : "common";
        double f = to_float(J, v, jv_float(NAN)).u.f;
        if (v.k != JV_INT && v.k != JV_FLOAT && v.k != JV_BOOL)
            tmpl_fail(J, CINFER_EINVAL, line, "round: a number is required");
        if (prec < 0 || prec > 30) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "round precision %lld", (long long)prec);
        double m = pow(10.0, (double)prec);
        if (!strcmp(method, "common")) {
            if (v.k == JV_INT || v.k == JV_BOOL) return jv_int(v.k == JV_INT ? v.u.i : v.u.b);  /* round(int) is int */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, f);
            return jv_float(strtod(buf, NULL));
        }
        if (!strcmp(method, "ceil")) return jv_float(ceil(f * m) / m);
        if (!strcmp(method, "floor")) return jv_float(floor(f * m) / m);
        tmpl_fail(J, CINFER_EINVAL, line, "method must be common, ceil or floor");
    }
    if (!strcmp(name, "reverse")) {
        if (v.k == JV_STR) {
            jv chars = tmpl_iterate(J, v, line);
            tbuf b; tbuf_init(&b, J);
            for (size_t i = chars.u.l->n; i-- > 0;) tbuf_put(&b, chars.u.l->v[i].u.s->s, chars.u.l->v[i].u.s->n);
            return mkstr(J, &b);
        }
        jv items = tmpl_iterate(J, v, line);
        /* reversed(x) is an iterator; a generator is not reversible, so Jinja lists it */
        int gen = v.k == JV_LIST && v.u.l->view == JL_GEN;
        jv out = jv_view(jv_list(J, items.u.l->n), gen ? JL_PLAIN : JL_GEN);
        for (size_t i = items.u.l->n; i-- > 0;) jl_push(J, &out, items.u.l->v[i]);
        return out;
    }
    if (!strcmp(name, "sort") || !strcmp(name, "unique") || !strcmp(name, "dictsort")) {
        int dictsort = name[0] == 'd';
        jv items = dictsort ? (v.k == JV_DICT && v.u.d->kind == JD_PLAIN ? dict_items(J, v) :
                               (tmpl_fail(J, CINFER_EINVAL, line, "dictsort needs a mapping"), v))
                            : tmpl_iterate(J, v, line);
        int reverse = name[0] == 's' ? opt_bool(&a, "reverse", 0, 0) : dictsort ? opt_bool(&a, "reverse", 2, 0) : 0;
        int ci = !opt_bool(&a, "case_sensitive", name[0] == 's' ? 1 : 0, 0);
        jstr *path = NULL;
        int by_value = 0;
        if (dictsort) {
            if (arg(&a, "by", 1, &y)) {
                const char *by = want_str(J, y, "dictsort by", line)->s;
                if (!strcmp(by, "value")) by_value = 1;
                else if (strcmp(by, "key")) tmpl_fail(J, CINFER_EINVAL, line, "You can only sort by either \"key\" or \"value\"");
            }
        } else if (arg(&a, "attribute", name[0] == 's' ? 2 : 1, &y) && y.k != JV_NONE)
            path = want_str(J, y, "attribute", line);
        size_t n = items.u.l->n;
        jv *keys = tmpl_alloc(J, (n + 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) {
            jv it = items.u.l->v[i];
            jv k = dictsort ? it.u.l->v[by_value] : path ? attr_path(J, it, path, line) : it;
            keys[i] = fold(J, k, ci);
        }
        if (name[0] != 'u') return sorted(J, items, keys, reverse, path != NULL || dictsort, line);
        jv out = jv_view(jv_list(J, n), JL_GEN);
        jv seen = jv_list(J, n);
        for (size_t i = 0; i < n; i++) {
            jv k = keys[i];
            if ((k.k == JV_LIST && !k.u.l->tuple) || k.k == JV_DICT)
                tmpl_fail(J, CINFER_EINVAL, line, "unique: unhashable type: '%s'", jv_typename(k));
            int dup = 0;
            for (size_t k = 0; k < seen.u.l->n && !dup; k++) dup = jv_eq(seen.u.l->v[k], keys[i]);
            if (!dup) { jl_push(J, &seen, keys[i]); jl_push(J, &out, items.u.l->v[i]); }
        }
        return out;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) return f_minmax(J, v, &a, name[1] == 'a', line);
    if (!strcmp(name, "sum")) {
        jv items = tmpl_iterate(J, v, line);
        jstr *path = arg(&a, "attribute", 0, &x) && x.k != JV_NONE ? want_str(J, x, "attribute", line) : NULL;
        jv acc = arg(&a, "start", 1, &y) ? y : jv_int(0);
        for (size_t i = 0; i < items.u.l->n; i++)
            acc = tmpl_binop(J, '+', acc, path ? attr_path(J, items.u.l->v[i], path, line) : items.u.l->v[i], line);
        return acc;
    }
    if (!strcmp(name, "map")) return jv_view(f_map(J, v, &a, line), JL_GEN);
    if (!strcmp(name, "select")) return jv_view(f_select(J, v, &a, 0, 1, line), JL_GEN);
    if (!strcmp(name, "reject")) return jv_view(f_select(J, v, &a, 0, 0, line), JL_GEN);
    if (!strcmp(name, "selectattr")) return jv_view(f_select(J, v, &a, 1, 1, line), JL_GEN);
    if (!strcmp(name, "rejectattr")) return jv_view(f_select(J, v, &a, 1, 0, line), JL_GEN);
    if (!strcmp(name, "attr")) {
        if (nargs != 1) tmpl_fail(J, CINFER_EINVAL, line, "attr needs a name");
        const char *an = want_str(J, args[0], "attr", line)->s;
        if (v.k == JV_UNDEF) tmpl_undef_error(J, v, line);
        if (v.k == JV_DICT && v.u.d->kind == JD_PLAIN && !tmpl_is_method(v, an)) return jv_undef(an);
        return tmpl_getattr(J, v, an, line);   /* methods, namespace/loop attributes */
    }
    if (!strcmp(name, "batch")) {
        jv items = tmpl_iterate(J, v, line);
        int64_t cnt = nargs > 0 ? want_int(J, args[0], "batch", line) : 0;
        if (cnt <= 0) tmpl_fail(J, CINFER_EINVAL, line, "batch size must be positive");
        int fill = arg(&a, "fill_with", 1, &y) && y.k != JV_NONE;
        jv out = jv_view(jv_list(J, 4), JL_GEN), cur = jv_list(J, 4);
        for (size_t i = 0; i < items.u.l->n; i++) {
            jl_push(J, &cur, items.u.l->v[i]);
            if ((int64_t)cur.u.l->n == cnt) { jl_push(J, &out, cur); cur = jv_list(J, 4); }
        }
        if (cur.u.l->n) {
            while (fill && (int64_t)cur.u.l->n < cnt) jl_push(J, &cur, y);
            jl_push(J, &out, cur);
        }
        return out;
    }
    if (!strcmp(name, "center")) {
        jv s = jv_to_string(J, v, line);
        int64_t w = arg(&a, "width", 0, &x) ? want_int(J, x, "center", line) : 80;
        int64_t len = (int64_t)tmpl_u8_len(s.u.s->s, s.u.s->n);
        if (w > 65536) tmpl_fail(J, CINFER_EINVAL, line, "center width too large");
        if (w <= len) return s;
        int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
        tbuf b; tbuf_init(&b, J);
        for (int64_t i = 0; i < left; i++) tbuf_putc(&b, ' ');
        tbuf_put(&b, s.u.s->s, s.u.s->n);
        for (int64_t i = 0; i < pad - left; i++) tbuf_putc(&b, ' ');
        return mkstr(J, &b);
    }
    if (!strcmp(name, "indent")) return f_indent(J, v, &a, line);
    if (!strcmp(name, "wordcount")) {
        jv s = jv_to_string(J, v, line);
        int64_t k = 0; int in = 0; size_t i = 0;
        while (i < s.u.s->n) {
            uint32_t c = tmpl_u8_next(s.u.s->s, s.u.s->n, &i);
            int cat = c > 0x10ffff ? 0 : utf8proc_category((utf8proc_int32_t)c);
            int w = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                    (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
            if (w && !in) k++;
            in = w;
        }
        return jv_int(k);
    }
    if (!strcmp(name, "format")) {
        if (nkw) tmpl_fail(J, CINFER_EUNSUPPORTED, line, "format filter with keyword arguments is not supported");
        return py_percent(J, jv_to_string(J, v, line).u.s, args, nargs, line);
    }
    tmpl_fail(J, CINFER_EUNSUPPORTED, line, "filter '%s' is not supported", name);
}

/* ------------------------------------------------------------- globals */
static const char *const global_names[] = {
    "range", "namespace", "dict", "raise_exception", "strftime_now", "lipsum", "cycler", "joiner", NULL};

void tmpl_add_globals(tmpl_st *J, jscope *sc) {
    for (const char *const *g = global_names; *g; g++) tmpl_scope_set(J, sc, *g, jv_func(J, *g, FN_GLOBAL, NULL));
}

static void fill_dict(tmpl_st *J, jv *d, const fargs *a, int line) {
    if (a->nargs > 1) tmpl_fail(J, CINFER_EINVAL, line, "expected at most 1 positional argument");
    if (a->nargs == 1) {
        jv src = a->args[0];
        if (src.k == JV_DICT && src.u.d->kind != JD_OBJ) {
            for (size_t i = 0; i < src.u.d->n; i++) jd_set(J, d, src.u.d->k[i], src.u.d->v[i]);
        } else {
            jv items = tmpl_iterate(J, src, line);
            for (size_t i = 0; i < items.u.l->n; i++) {
                jv p = items.u.l->v[i];
                if (p.k != JV_LIST || p.u.l->n != 2)
                    tmpl_fail(J, CINFER_EINVAL, line, "dictionary update sequence element has wrong length");
                jd_set(J, d, p.u.l->v[0], p.u.l->v[1]);
            }
        }
    }
    for (int i = 0; i < a->nkw; i++) jd_set(J, d, jv_cstr(J, a->kwn[i]), a->kwv[i]);
}

jv tmpl_global_call(tmpl_st *J, const char *name, jv *args, int nargs,
                    const char **kwn, jv *kwv, int nkw, int line) {
    fargs a = {args, nargs, kwn, kwv, nkw};
    if (!strcmp(name, "raise_exception")) {
        jv msg = nargs > 0 ? jv_to_string(J, args[0], line) : jv_cstr(J, "");
        tmpl_fail(J, CINFER_EINVAL, line, "raise_exception: %s", msg.u.s->s);
    }
    if (!strcmp(name, "range")) {
        if (nkw || nargs < 1 || nargs > 3) tmpl_fail(J, CINFER_EINVAL, line, "range expected 1 to 3 integer arguments");
        int64_t lo = 0, hi, st = 1;
        if (nargs == 1) hi = want_int(J, args[0], "range", line);
        else {
            lo = want_int(J, args[0], "range", line);
            hi = want_int(J, args[1], "range", line);
            if (nargs == 3) st = want_int(J, args[2], "range", line);
        }
        if (!st) tmpl_fail(J, CINFER_EINVAL, line, "range() arg 3 must not be zero");
        double cnt = st > 0 ? ceil(((double)hi - (double)lo) / (double)st) : ceil(((double)lo - (double)hi) / (double)-st);
        if (cnt < 0) cnt = 0;
        if (cnt > TMPL_MAX_RANGE)
            tmpl_fail(J, CINFER_EINVAL, line, "range too big: at most %d items", TMPL_MAX_RANGE);
        jv out = jv_view(jv_list(J, (size_t)cnt), JL_RANGE);
        out.u.l->r0 = lo; out.u.l->r1 = hi; out.u.l->rs = st;
        for (int64_t i = 0; i < (int64_t)cnt; i++) jl_push(J, &out, jv_int(lo + i * st));
        return out;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jv d = jv_dict(J, name[0] == 'n' ? JD_NS : JD_PLAIN);
        fill_dict(J, &d, &a, line);
        return d;
    }
    if (!strcmp(name, "strftime_now")) {
        if (nargs != 1) tmpl_fail(J, CINFER_EINVAL, line, "strftime_now takes one format argument");
        jstr *f = want_str(J, args[0], "strftime_now", line);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[1024];
        size_t n = f->n ? strftime(buf, sizeof buf, f->s, &tm) : 0;
        return jv_str(J, buf, n);
    }
    tmpl_fail(J, CINFER_EUNSUPPORTED, line, "global function '%s' is not supported", name);
}
