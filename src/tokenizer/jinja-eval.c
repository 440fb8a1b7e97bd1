/*
 * jinja-eval.c — evaluates the AST: statements write into an output buffer,
 * expressions produce values, with Jinja's runtime semantics:
 *  - scopes: each for-loop iteration, macro call and with-block gets a fresh
 *    scope (so `set` inside a loop does not leak out — namespaces exist for
 *    that); if-blocks do not open a scope; lookups walk outwards;
 *  - Undefined (jinja2.Undefined): prints "", is falsy, iterates empty,
 *    but attribute access, arithmetic or calls on it are errors;
 *  - attribute access `x.y` prefers methods/attributes, `x[y]` prefers items
 *    (as the sandbox's getattr/getitem); missing ones give Undefined;
 *  - Python arithmetic on int64/float (overflow is an error, not a wrap),
 *    floor division and modulo with Python signs, str/list concatenation and
 *    repetition;
 *  - loop.index/index0/revindex/revindex0/first/last/length/previtem/
 *    nextitem/cycle(), for-else, `for x in y if cond` (filter before
 *    counting), break/continue.
 * Every statement, iteration and call counts against TMPL_MAX_STEPS, and
 * nesting against TMPL_MAX_EVAL/TMPL_MAX_CALLS.
 */
#include "tokenizer/jinja-internal.h"
#include "cinfer.h"

#include <math.h>
#include <string.h>

enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

/* the C stack this render has used: deep recursion fails before it can
 * overflow a thread's stack (frames are larger under sanitizers) */
static void stack_check(tmpl_st *J, int line) {
    char here;
    uintptr_t used = J->stack_base - (uintptr_t)&here;
    if (used > TMPL_MAX_STACK)
        tmpl_fail(J, CINFER_EINVAL, line, "template evaluation nested too deeply (over %u KiB of stack; runaway recursion?)",
                  TMPL_MAX_STACK >> 10);
}

static void step(tmpl_st *J, int line) {
    if (++J->steps > TMPL_MAX_STEPS)
        tmpl_fail(J, CINFER_EINVAL, line, "template exceeded %ld evaluation steps", (long)TMPL_MAX_STEPS);
}

/* ----------------------------------------------------------------- scopes */
jscope *tmpl_scope_new(tmpl_st *J, jscope *parent) {
    jscope *s = tmpl_alloc(J, sizeof(jscope));
    s->parent = parent;
    return s;
}
void tmpl_scope_set(tmpl_st *J, jscope *s, const char *name, jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) { s->vals[i] = v; return; }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nm = tmpl_alloc(J, cap * sizeof(char *));
        jv *vv = tmpl_alloc(J, cap * sizeof(jv));
        if (s->n) { memcpy(nm, s->names, s->n * sizeof(char *)); memcpy(vv, s->vals, s->n * sizeof(jv)); }
        s->names = nm; s->vals = vv; s->cap = cap;
    }
    s->names[s->n] = name; s->vals[s->n] = v; s->n++;
}
jv *tmpl_scope_lookup(jscope *s, const char *name) {
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name)) return &s->vals[i];
    return NULL;
}

/* -------------------------------------------------------- access helpers */
void tmpl_undef_error(tmpl_st *J, jv u, int line) {
    if (u.u.uname && u.u.uname[0] == '\001')   /* a full message (failed lookup, empty sequence) */
        tmpl_fail(J, CINFER_EINVAL, line, "%s", u.u.uname + 1);
    tmpl_fail(J, CINFER_EINVAL, line, "'%s' is undefined", u.u.uname ? u.u.uname : "value");
}

#define undef_error tmpl_undef_error

/* Undefined from a failed attribute/item lookup, remembering why */
static jv undef_lookup(tmpl_st *J, jv obj, jv key, int attr) {
    tbuf b; tbuf_init(&b, J);
    tbuf_printf(&b, "\001'%s object' has no %s ", jv_typename(obj), attr ? "attribute" : "element");
    if (key.k == JV_STR) { tbuf_putc(&b, '\''); tbuf_put(&b, key.u.s->s, key.u.s->n > 200 ? 200 : key.u.s->n); tbuf_putc(&b, '\''); }
    else if (key.k == JV_INT) tbuf_printf(&b, "%lld", (long long)key.u.i);
    else tbuf_puts(&b, jv_typename(key));
    return jv_undef(b.p);
}
static jv undef_attr(tmpl_st *J, jv obj, const char *name) {
    return undef_lookup(J, obj, jv_cstr(J, name), 1);
}

jv tmpl_getattr(tmpl_st *J, jv obj, const char *name, int line) {
    switch (obj.k) {
    case JV_UNDEF: undef_error(J, obj, line);
    case JV_DICT:
        if (obj.u.d->kind == JD_PLAIN && tmpl_is_method(obj, name)) return jv_func(J, name, FN_METHOD, &obj);
        if (obj.u.d->kind == JD_OBJ && !strcmp(name, "cycle")) return jv_func(J, name, FN_CYCLE, &obj);
        {
            jv *p = jd_gets(&obj, name);
            if (p) return *p;
        }
        return undef_attr(J, obj, name);
    case JV_STR: case JV_LIST:
        if (tmpl_is_method(obj, name)) return jv_func(J, name, FN_METHOD, &obj);
        return undef_attr(J, obj, name);
    default:
        return undef_attr(J, obj, name);
    }
}

static int64_t norm_index(int64_t i, size_t n, int *ok) {
    if (i < 0) i += (int64_t)n;
    *ok = i >= 0 && (uint64_t)i < n;
    return i;
}

/* byte offset of the codepoint number `idx` */
static size_t u8_offset(const char *s, size_t n, size_t idx) {
    size_t i = 0;
    while (idx-- && i < n) tmpl_u8_next(s, n, &i);
    return i;
}

jv tmpl_getitem(tmpl_st *J, jv obj, jv key, int line) {
    if (obj.k == JV_STR || (obj.k == JV_DICT && obj.u.d->n > 8)) tmpl_charge(J, obj, line);  /* O(n) lookups */
    switch (obj.k) {
    case JV_UNDEF: undef_error(J, obj, line);
    case JV_DICT: {
        if (obj.u.d->kind == JD_PLAIN) {
            jv *p = jd_get(&obj, key);
            if (p) return *p;
        }
        if (key.k == JV_STR) return tmpl_getattr(J, obj, key.u.s->s, line);
        return undef_lookup(J, obj, key, 0);
    }
    case JV_LIST:
        if (obj.u.l->view && obj.u.l->view != JL_RANGE) return undef_lookup(J, obj, key, 0);  /* not subscriptable */
        if (key.k == JV_INT || key.k == JV_BOOL) {
            int ok;
            int64_t i = norm_index(key.k == JV_INT ? key.u.i : key.u.b, obj.u.l->n, &ok);
            if (ok) return obj.u.l->v[i];
            return undef_lookup(J, obj, key, 0);
        }
        if (key.k == JV_STR) return tmpl_getattr(J, obj, key.u.s->s, line);
        return undef_lookup(J, obj, key, 0);
    case JV_STR:
        if (key.k == JV_INT || key.k == JV_BOOL) {
            size_t len = tmpl_u8_len(obj.u.s->s, obj.u.s->n);
            int ok;
            int64_t i = norm_index(key.k == JV_INT ? key.u.i : key.u.b, len, &ok);
            if (!ok) return undef_lookup(J, obj, key, 0);
            size_t a = u8_offset(obj.u.s->s, obj.u.s->n, (size_t)i), b = a;
            tmpl_u8_next(obj.u.s->s, obj.u.s->n, &b);
            return jv_str(J, obj.u.s->s + a, b - a);
        }
        if (key.k == JV_STR) return tmpl_getattr(J, obj, key.u.s->s, line);
        return undef_lookup(J, obj, key, 0);
    default:
        return undef_lookup(J, obj, key, 0);
    }
}

/* Python slice semantics over n items; fills the chosen indices */
static size_t slice_indices(tmpl_st *J, jv lo, jv hi, jv st, size_t n, int64_t **out, int line) {
    int64_t step_ = 1;
    if (st.k == JV_INT) step_ = st.u.i;
    else if (st.k != JV_NONE && st.k != JV_UNDEF)
        tmpl_fail(J, CINFER_EINVAL, line, "slice indices must be integers or None");
    if (step_ == 0) tmpl_fail(J, CINFER_EINVAL, line, "slice step cannot be zero");
    int64_t N = (int64_t)n, a, b;
    for (int k = 0; k < 2; k++) {
        jv x = k ? hi : lo;
        if (x.k != JV_INT && x.k != JV_NONE && x.k != JV_UNDEF)
            tmpl_fail(J, CINFER_EINVAL, line, "slice indices must be integers or None");
    }
    if (step_ > 0) {
        a = lo.k == JV_INT ? lo.u.i : 0;
        b = hi.k == JV_INT ? hi.u.i : N;
        if (a < 0) { a += N; if (a < 0) a = 0; } else if (a > N) a = N;
        if (b < 0) { b += N; if (b < 0) b = 0; } else if (b > N) b = N;
    } else {
        a = lo.k == JV_INT ? lo.u.i : N - 1;
        b = hi.k == JV_INT ? hi.u.i : -1;
        if (lo.k == JV_INT) { if (a < 0) { a += N; if (a < 0) a = -1; } else if (a >= N) a = N - 1; }
        if (hi.k == JV_INT) { if (b < 0) { b += N; if (b < 0) b = -1; } else if (b >= N) b = N - 1; }
    }
    size_t cnt = 0;
    int64_t *idx = tmpl_alloc(J, (n + 1) * sizeof(int64_t));
    if (step_ > 0) for (int64_t i = a; i < b; i += step_) idx[cnt++] = i;
    else for (int64_t i = a; i > b; i += step_) idx[cnt++] = i;
    *out = idx;
    return cnt;
}

static jv do_slice(tmpl_st *J, jv obj, jv lo, jv hi, jv st, int line) {
    tmpl_charge(J, obj, line);
    int64_t *idx;
    if (obj.k == JV_UNDEF) undef_error(J, obj, line);
    if (obj.k == JV_LIST && obj.u.l->view && obj.u.l->view != JL_RANGE) return jv_undef("\001slice of a non-subscriptable object");
    if (obj.k == JV_LIST) {
        size_t c = slice_indices(J, lo, hi, st, obj.u.l->n, &idx, line);
        jv r = jv_list(J, c);
        r.u.l->tuple = obj.u.l->tuple;
        for (size_t i = 0; i < c; i++) jl_push(J, &r, obj.u.l->v[idx[i]]);
        return r;
    }
    if (obj.k == JV_STR) {
        const char *s = obj.u.s->s; size_t n = obj.u.s->n;
        size_t len = tmpl_u8_len(s, n);
        size_t *off = tmpl_alloc(J, (len + 1) * sizeof(size_t));
        size_t i = 0, k = 0;
        while (i < n) { off[k++] = i; tmpl_u8_next(s, n, &i); }
        off[len] = n;
        size_t c = slice_indices(J, lo, hi, st, len, &idx, line);
        tbuf b; tbuf_init(&b, J);
        for (size_t j = 0; j < c; j++) tbuf_put(&b, s + off[idx[j]], off[idx[j] + 1] - off[idx[j]]);
        return jv_str(J, b.p ? b.p : "", b.n);
    }
    return jv_undef(NULL);
}

jv tmpl_iterate(tmpl_st *J, jv v, int line) {
    tmpl_charge(J, v, line);
    switch (v.k) {
    case JV_UNDEF: return jv_list(J, 0);
    case JV_LIST: return v;
    case JV_DICT: {
        if (v.u.d->kind != JD_PLAIN)
            tmpl_fail(J, CINFER_EINVAL, line, "'%s' object is not iterable", jv_typename(v));
        jv r = jv_list(J, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) jl_push(J, &r, v.u.d->k[i]);
        return r;
    }
    case JV_STR: {
        jv r = jv_list(J, v.u.s->n);
        size_t i = 0;
        while (i < v.u.s->n) {
            size_t st = i;
            tmpl_u8_next(v.u.s->s, v.u.s->n, &i);
            jl_push(J, &r, jv_str(J, v.u.s->s + st, i - st));
        }
        return r;
    }
    default:
        tmpl_fail(J, CINFER_EINVAL, line, "'%s' object is not iterable", jv_typename(v));
    }
}

int tmpl_contains(tmpl_st *J, jv c, jv x, int line) {
    tmpl_charge(J, c, line);
    switch (c.k) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (x.k != JV_STR)
            tmpl_fail(J, CINFER_EINVAL, line, "'in <string>' requires string as left operand, not %s", jv_typename(x));
        if (!x.u.s->n) return 1;
        return memmem(c.u.s->s, c.u.s->n, x.u.s->s, x.u.s->n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < c.u.l->n; i++) if (jv_eq(c.u.l->v[i], x)) return 1;
        return 0;
    case JV_DICT:
        if (c.u.d->kind != JD_PLAIN)
            tmpl_fail(J, CINFER_EINVAL, line, "argument of type '%s' is not iterable", jv_typename(c));
        return jd_get(&c, x) != NULL;
    default:
        tmpl_fail(J, CINFER_EINVAL, line, "argument of type '%s' is not iterable", jv_typename(c));
    }
}

/* ------------------------------------------------------------ arithmetic */
static int isnum(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static int isint(jv v) { return v.k == JV_INT || v.k == JV_BOOL; }
static int64_t ival(jv v) { return v.k == JV_INT ? v.u.i : v.u.b; }
static double fval(jv v) { return v.k == JV_FLOAT ? v.u.f : (double)ival(v); }

static const char *opname(int op) {
    switch (op) {
    case OP_FLOORDIV: return "//"; case OP_POW: return "**";
    case '+': return "+"; case '-': return "-"; case '*': return "*"; case '/': return "/"; case '%': return "%";
    default: return "?";
    }
}

static __attribute__((noreturn)) void overflow(tmpl_st *J, int line) {
    tmpl_fail(J, CINFER_EUNSUPPORTED, line, "integer result does not fit in 64 bits");
}

static jv repeat(tmpl_st *J, jv seq, int64_t times, int line) {
    if (times < 0) times = 0;
    if (seq.k == JV_STR) {
        if (seq.u.s->n && (uint64_t)times > TMPL_MAX_OUTPUT / seq.u.s->n)
            tmpl_fail(J, CINFER_EINVAL, line, "string repetition too large");
        tbuf b; tbuf_init(&b, J);
        for (int64_t i = 0; i < times; i++) tbuf_put(&b, seq.u.s->s, seq.u.s->n);
        return jv_str(J, b.p ? b.p : "", b.n);
    }
    if (seq.u.l->n && (uint64_t)times > (1u << 24) / seq.u.l->n)
        tmpl_fail(J, CINFER_EINVAL, line, "list repetition too large");
    jv r = jv_list(J, seq.u.l->n * (size_t)times);
    r.u.l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) jl_push(J, &r, seq.u.l->v[k]);
    return r;
}

jv tmpl_binop(tmpl_st *J, int op, jv a, jv b, int line) {
    if (op == '%' && a.k == JV_STR && (b.k == JV_UNDEF || (b.k == JV_DICT && b.u.d->kind == JD_PLAIN)))
        return tmpl_filter(J, "format", a, NULL, 0, NULL, NULL, 0, line);   /* Python: a mapping operand */
    if (a.k == JV_UNDEF) undef_error(J, a, line);
    if (b.k == JV_UNDEF) undef_error(J, b, line);
    if (isnum(a) && isnum(b)) {
        if (isint(a) && isint(b)) {
            int64_t x = ival(a), y = ival(b), r;
            switch (op) {
            case '+': if (__builtin_add_overflow(x, y, &r)) overflow(J, line); return jv_int(r);
            case '-': if (__builtin_sub_overflow(x, y, &r)) overflow(J, line); return jv_int(r);
            case '*': if (__builtin_mul_overflow(x, y, &r)) overflow(J, line); return jv_int(r);
            case '/':
                if (!y) tmpl_fail(J, CINFER_EINVAL, line, "division by zero");
                return jv_float((double)x / (double)y);
            case OP_FLOORDIV: case '%': {
                if (!y) tmpl_fail(J, CINFER_EINVAL, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) overflow(J, line);
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(op == '%' ? m : q);
            }
            case OP_POW:
                if (y >= 0) {
                    int64_t acc = 1, base = x;
                    while (y) {
                        if (y & 1) { if (__builtin_mul_overflow(acc, base, &acc)) overflow(J, line); }
                        y >>= 1;
                        if (y && __builtin_mul_overflow(base, base, &base)) overflow(J, line);
                    }
                    return jv_int(acc);
                }
                if (!x) tmpl_fail(J, CINFER_EINVAL, line, "0.0 cannot be raised to a negative power");
                return jv_float(pow((double)x, (double)y));
            }
        } else {
            double x = fval(a), y = fval(b);
            switch (op) {
            case '+': return jv_float(x + y);
            case '-': return jv_float(x - y);
            case '*': return jv_float(x * y);
            case '/':
                if (y == 0) tmpl_fail(J, CINFER_EINVAL, line, "float division by zero");
                return jv_float(x / y);
            case OP_FLOORDIV: case '%': {
                /* CPython's float_divmod */
                if (y == 0) tmpl_fail(J, CINFER_EINVAL, line, "float divmod by zero");
                double mod = fmod(x, y), div = (x - mod) / y, fd;
                if (mod != 0) { if ((y < 0) != (mod < 0)) { mod += y; div -= 1.0; } }
                else mod = copysign(0.0, y);
                if (div != 0) { fd = floor(div); if (div - fd > 0.5) fd += 1.0; }
                else fd = copysign(0.0, x / y);
                return jv_float(op == '%' ? mod : fd);
            }
            case OP_POW: {
                if (x == 0 && y < 0) tmpl_fail(J, CINFER_EINVAL, line, "0.0 cannot be raised to a negative power");
                if (x < 0 && y != floor(y) && isfinite(y))
                    tmpl_fail(J, CINFER_EUNSUPPORTED, line, "negative number to a fractional power (complex result)");
                double r = pow(x, y);
                if (isinf(r) && isfinite(x) && isfinite(y)) tmpl_fail(J, CINFER_EINVAL, line, "float power overflow");
                return jv_float(r);
            }
            }
        }
    }
    if (op == '+' && a.k == JV_STR && b.k == JV_STR) {
        tbuf t; tbuf_init(&t, J);
        tbuf_put(&t, a.u.s->s, a.u.s->n);
        tbuf_put(&t, b.u.s->s, b.u.s->n);
        return jv_str(J, t.p ? t.p : "", t.n);
    }
    if (op == '+' && a.k == JV_LIST && b.k == JV_LIST && a.u.l->tuple == b.u.l->tuple &&
        !a.u.l->view && !b.u.l->view) {
        jv r = jv_list(J, a.u.l->n + b.u.l->n);
        r.u.l->tuple = a.u.l->tuple;
        for (size_t i = 0; i < a.u.l->n; i++) jl_push(J, &r, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jl_push(J, &r, b.u.l->v[i]);
        return r;
    }
    if (op == '*' && (a.k == JV_STR || (a.k == JV_LIST && !a.u.l->view)) && isint(b)) return repeat(J, a, ival(b), line);
    if (op == '*' && (b.k == JV_STR || (b.k == JV_LIST && !b.u.l->view)) && isint(a)) return repeat(J, b, ival(a), line);
    if (op == '%' && a.k == JV_STR) {
        jv args = b;
        if (!(b.k == JV_LIST && b.u.l->tuple)) { args = jv_list(J, 1); jl_push(J, &args, b); }
        return tmpl_filter(J, "format", a, args.u.l->v, (int)args.u.l->n, NULL, NULL, 0, line);
    }
    if (op == '+' && a.k == JV_STR)
        tmpl_fail(J, CINFER_EINVAL, line, "can only concatenate str (not \"%s\") to str", jv_typename(b));
    tmpl_fail(J, CINFER_EINVAL, line, "unsupported operand type(s) for %s: '%s' and '%s'",
              opname(op), jv_typename(a), jv_typename(b));
}

/* -------------------------------------------------------------- calls */
static jv call_macro(tmpl_st *J, jfunc *f, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line) {
    jnode *m = f->macro;
    if (nargs > m->args.n)
        tmpl_fail(J, CINFER_EINVAL, line, "macro '%s' takes not more than %d argument(s)", m->name, m->args.n);
    if (++J->calls > TMPL_MAX_CALLS)
        tmpl_fail(J, CINFER_EINVAL, line, "macro recursion too deep (over %d calls)", TMPL_MAX_CALLS);
    jscope *sc = tmpl_scope_new(J, f->closure);
    for (int i = 0; i < m->args.n; i++) {
        const char *pn = m->args.v[i]->name;
        jv v;
        int set = 0;
        if (i < nargs) { v = args[i]; set = 1; }
        for (int k = 0; k < nkw; k++)
            if (!strcmp(kwn[k], pn)) {
                if (set) tmpl_fail(J, CINFER_EINVAL, line, "macro '%s' got multiple values for argument '%s'", m->name, pn);
                v = kwv[k]; set = 1;
            }
        if (!set) v = m->kwargs.v[i] ? tmpl_eval(J, sc, m->kwargs.v[i]) : jv_undef(pn);
        tmpl_scope_set(J, sc, pn, v);
    }
    for (int k = 0; k < nkw; k++) {
        int found = 0;
        for (int i = 0; i < m->args.n; i++) if (!strcmp(kwn[k], m->args.v[i]->name)) found = 1;
        if (!found) tmpl_fail(J, CINFER_EINVAL, line, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
    }
    tbuf out; tbuf_init(&out, J);
    tmpl_exec(J, sc, &m->body, &out);
    J->calls--;
    return jv_str(J, out.p ? out.p : "", out.n);
}

jv tmpl_call(tmpl_st *J, jv fn, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line) {
    step(J, line);
    if (fn.k == JV_UNDEF) undef_error(J, fn, line);
    if (fn.k != JV_FUNC) tmpl_fail(J, CINFER_EINVAL, line, "'%s' object is not callable", jv_typename(fn));
    jfunc *f = fn.u.fn;
    switch (f->kind) {
    case FN_MACRO: return call_macro(J, f, args, nargs, kwn, kwv, nkw, line);
    case FN_METHOD: return tmpl_method(J, *f->self, f->name, args, nargs, kwn, kwv, nkw, line);
    case FN_CYCLE: {
        if (!nargs) tmpl_fail(J, CINFER_EINVAL, line, "no items for cycling given");
        jv *i0 = jd_gets(f->self, "index0");
        return args[(i0 ? i0->u.i : 0) % nargs];
    }
    default: return tmpl_global_call(J, f->name, args, nargs, kwn, kwv, nkw, line);
    }
}

/* evaluates a node's positional and keyword argument lists */
static void eval_args(tmpl_st *J, jscope *sc, const jnode *e, jv **args, jv **kwv) {
    *args = e->args.n ? tmpl_alloc(J, (size_t)e->args.n * sizeof(jv)) : NULL;
    *kwv = e->kwargs.n ? tmpl_alloc(J, (size_t)e->kwargs.n * sizeof(jv)) : NULL;
    for (int i = 0; i < e->args.n; i++) (*args)[i] = tmpl_eval(J, sc, e->args.v[i]);
    for (int i = 0; i < e->kwargs.n; i++) (*kwv)[i] = tmpl_eval(J, sc, e->kwargs.v[i]);
}

static int compare(tmpl_st *J, int op, jv a, jv b, int line) {
    tmpl_charge(J, a, line);
    switch (op) {
    case OP_EQ: return jv_eq(a, b);
    case OP_NE: return !jv_eq(a, b);
    case OP_IN: return tmpl_contains(J, b, a, line);
    case OP_NOTIN: return !tmpl_contains(J, b, a, line);
    default: break;
    }
    int c = jv_cmp(J, a, b, line);
    switch (op) {
    case '<': return c < 0;
    case '>': return c > 0;
    case OP_LE: return c <= 0;
    default: return c >= 0;
    }
}

jv tmpl_eval(tmpl_st *J, jscope *sc, const jnode *e) {
    if (++J->depth > TMPL_MAX_EVAL)
        tmpl_fail(J, CINFER_EINVAL, e->line, "evaluation nested too deeply (over %d levels; runaway recursion?)", TMPL_MAX_EVAL);
    stack_check(J, e->line);
    J->line = e->line;
    jv r;
    switch (e->kind) {
    case N_CONST: r = e->val; break;
    case N_NAME: {
        jv *p = tmpl_scope_lookup(sc, e->name);
        r = p ? *p : jv_undef(e->name);
        break;
    }
    case N_GETATTR: r = tmpl_getattr(J, tmpl_eval(J, sc, e->a), e->name, e->line); break;
    case N_GETITEM: {
        jv o = tmpl_eval(J, sc, e->a);
        r = tmpl_getitem(J, o, tmpl_eval(J, sc, e->b), e->line);
        break;
    }
    case N_SLICE: {
        jv o = tmpl_eval(J, sc, e->a);
        const jnode *bn = e->b;
        jv lo = bn->a ? tmpl_eval(J, sc, bn->a) : jv_none();
        jv hi = bn->b ? tmpl_eval(J, sc, bn->b) : jv_none();
        jv st = bn->c ? tmpl_eval(J, sc, bn->c) : jv_none();
        r = do_slice(J, o, lo, hi, st, e->line);
        break;
    }
    case N_CALL: {
        jv fn = tmpl_eval(J, sc, e->a);
        jv *args, *kwv;
        eval_args(J, sc, e, &args, &kwv);
        r = tmpl_call(J, fn, args, e->args.n, e->kwnames, kwv, e->kwargs.n, e->line);
        break;
    }
    case N_FILTER: {
        jv v = tmpl_eval(J, sc, e->a);
        jv *args, *kwv;
        eval_args(J, sc, e, &args, &kwv);
        r = tmpl_filter(J, e->name, v, args, e->args.n, e->kwnames, kwv, e->kwargs.n, e->line);
        break;
    }
    case N_TEST: {
        jv v = tmpl_eval(J, sc, e->a);
        jv *args, *kwv;
        eval_args(J, sc, e, &args, &kwv);
        r = jv_bool(tmpl_test(J, e->name, v, args, e->args.n, e->line));
        break;
    }
    case N_BINOP: {
        jv a = tmpl_eval(J, sc, e->a);
        r = tmpl_binop(J, e->op, a, tmpl_eval(J, sc, e->b), e->line);
        break;
    }
    case N_NEG: case N_POS: {
        jv a = tmpl_eval(J, sc, e->a);
        if (a.k == JV_UNDEF) undef_error(J, a, e->line);
        if (a.k == JV_FLOAT) r = jv_float(e->kind == N_NEG ? -a.u.f : a.u.f);
        else if (a.k == JV_INT || a.k == JV_BOOL) {
            int64_t x = ival(a);
            if (e->kind == N_NEG && x == INT64_MIN) overflow(J, e->line);
            r = jv_int(e->kind == N_NEG ? -x : x);
        } else tmpl_fail(J, CINFER_EINVAL, e->line, "bad operand type for unary %c: '%s'",
                         e->kind == N_NEG ? '-' : '+', jv_typename(a));
        break;
    }
    case N_NOT: r = jv_bool(!jv_truthy(tmpl_eval(J, sc, e->a))); break;
    case N_AND: {
        jv a = tmpl_eval(J, sc, e->a);
        r = jv_truthy(a) ? tmpl_eval(J, sc, e->b) : a;
        break;
    }
    case N_OR: {
        jv a = tmpl_eval(J, sc, e->a);
        r = jv_truthy(a) ? a : tmpl_eval(J, sc, e->b);
        break;
    }
    case N_COMPARE: {
        jv a = tmpl_eval(J, sc, e->a);
        r = jv_bool(1);
        for (int i = 0; i < e->args.n; i++) {
            jv b = tmpl_eval(J, sc, e->args.v[i]);
            if (!compare(J, e->ops[i], a, b, e->line)) { r = jv_bool(0); break; }
            a = b;
        }
        break;
    }
    case N_COND:
        if (jv_truthy(tmpl_eval(J, sc, e->a))) r = tmpl_eval(J, sc, e->b);
        else r = e->c ? tmpl_eval(J, sc, e->c) : jv_undef(NULL);
        break;
    case N_LIST: case N_TUPLE: {
        r = jv_list(J, (size_t)e->args.n);
        r.u.l->tuple = e->kind == N_TUPLE;
        for (int i = 0; i < e->args.n; i++) jl_push(J, &r, tmpl_eval(J, sc, e->args.v[i]));
        break;
    }
    case N_DICT: {
        r = jv_dict(J, JD_PLAIN);
        for (int i = 0; i < e->args.n; i++) {
            jv k = tmpl_eval(J, sc, e->args.v[i]);
            if (k.k == JV_LIST && !k.u.l->tuple) tmpl_fail(J, CINFER_EINVAL, e->line, "unhashable type: 'list'");
            if (k.k == JV_DICT) tmpl_fail(J, CINFER_EINVAL, e->line, "unhashable type: 'dict'");
            jd_set(J, &r, k, tmpl_eval(J, sc, e->kwargs.v[i]));
        }
        break;
    }
    case N_CONCAT: {
        tbuf b; tbuf_init(&b, J);
        for (int i = 0; i < e->args.n; i++) jv_str_into(J, &b, tmpl_eval(J, sc, e->args.v[i]), e->line);
        r = jv_str(J, b.p ? b.p : "", b.n);
        break;
    }
    default:
        tmpl_fail(J, CINFER_EUNSUPPORTED, e->line, "expression kind %d not supported", e->kind);
    }
    J->depth--;
    return r;
}

/* ------------------------------------------------------------ statements */
static void assign(tmpl_st *J, jscope *sc, const jnode *target, jv v, int line) {
    if (target->kind == N_NAME) { tmpl_scope_set(J, sc, target->name, v); return; }
    /* tuple unpacking */
    jv items = tmpl_iterate(J, v, line);
    if (items.u.l->n != (size_t)target->args.n)
        tmpl_fail(J, CINFER_EINVAL, line, "cannot unpack %zu values into %d names", items.u.l->n, target->args.n);
    for (int i = 0; i < target->args.n; i++) tmpl_scope_set(J, sc, target->args.v[i]->name, items.u.l->v[i]);
}

static void set_loop_fields(tmpl_st *J, jv *loop, jv items, size_t i) {
    size_t n = items.u.l->n;
    jv *f = loop->u.d->v;   /* fixed layout, see exec_for */
    f[0] = jv_int((int64_t)i + 1);
    f[1] = jv_int((int64_t)i);
    f[2] = jv_int((int64_t)(n - i));
    f[3] = jv_int((int64_t)(n - i - 1));
    f[4] = jv_bool(i == 0);
    f[5] = jv_bool(i + 1 == n);
    f[6] = jv_int((int64_t)n);
    f[7] = i > 0 ? items.u.l->v[i - 1] : jv_undef("previtem");
    f[8] = i + 1 < n ? items.u.l->v[i + 1] : jv_undef("nextitem");
    (void)J;
}

static int exec_body(tmpl_st *J, jscope *sc, const jnodes *body, tbuf *out);

static int exec_for(tmpl_st *J, jscope *sc, const jnode *s, tbuf *out) {
    jv seq = tmpl_iterate(J, tmpl_eval(J, sc, s->b), s->line);
    if (s->c) {   /* inline filter: evaluated per item in a scope holding the target */
        jv kept = jv_list(J, seq.u.l->n);
        for (size_t i = 0; i < seq.u.l->n; i++) {
            step(J, s->line);
            jscope *fs = tmpl_scope_new(J, sc);
            assign(J, fs, s->a, seq.u.l->v[i], s->line);
            if (jv_truthy(tmpl_eval(J, fs, s->c))) jl_push(J, &kept, seq.u.l->v[i]);
        }
        seq = kept;
    }
    if (!seq.u.l->n) return exec_body(J, sc, &s->orelse, out) ;
    static const char *fields[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                   "length", "previtem", "nextitem", "depth", "depth0"};
    jv keys = jv_list(J, 11);
    for (int k = 0; k < 11; k++) jl_push(J, &keys, jv_cstr(J, fields[k]));
    for (size_t i = 0; i < seq.u.l->n; i++) {
        step(J, s->line);
        jv loop = jv_dict(J, JD_OBJ);
        jdict *d = loop.u.d;
        d->k = keys.u.l->v;           /* shared, never modified */
        d->v = tmpl_alloc(J, 11 * sizeof(jv));
        d->n = d->cap = 11;
        d->v[9] = jv_int(1); d->v[10] = jv_int(0);
        set_loop_fields(J, &loop, seq, i);
        jscope *it = tmpl_scope_new(J, sc);
        tmpl_scope_set(J, it, "loop", loop);
        assign(J, it, s->a, seq.u.l->v[i], s->line);
        int fl = exec_body(J, it, &s->body, out);
        if (fl == FLOW_BREAK) break;
    }
    return FLOW_NONE;
}

static void set_namespace_attr(tmpl_st *J, jscope *sc, const jnode *s, jv v) {
    jv *ns = tmpl_scope_lookup(sc, s->a->name);
    if (!ns || ns->k != JV_DICT || ns->u.d->kind != JD_NS)
        tmpl_fail(J, CINFER_EINVAL, s->line, "cannot assign attribute on non-namespace object '%s'", s->a->name);
    jd_set(J, ns, s->a->b->val, v);
}

static int exec_stmt(tmpl_st *J, jscope *sc, const jnode *s, tbuf *out) {
    step(J, s->line);
    J->line = s->line;
    switch (s->kind) {
    case S_TEXT: tbuf_put(out, s->val.u.s->s, s->val.u.s->n); return FLOW_NONE;
    case S_OUTPUT: jv_str_into(J, out, tmpl_eval(J, sc, s->a), s->line); return FLOW_NONE;
    case S_IF:
        if (jv_truthy(tmpl_eval(J, sc, s->a))) return exec_body(J, sc, &s->body, out);
        return exec_body(J, sc, &s->orelse, out);
    case S_FOR: return exec_for(J, sc, s, out);
    case S_SET: {
        jv v = tmpl_eval(J, sc, s->b);
        if (s->a->kind == N_NSREF) set_namespace_attr(J, sc, s, v);
        else assign(J, sc, s->a, v, s->line);
        return FLOW_NONE;
    }
    case S_SETBLOCK: case S_FILTERBLOCK: {
        tbuf b; tbuf_init(&b, J);
        int fl = exec_body(J, sc, &s->body, &b);
        jv v = jv_str(J, b.p ? b.p : "", b.n);
        /* apply the filter chain: innermost filter has a == NULL */
        const jnode **chain = tmpl_alloc(J, TMPL_MAX_DEPTH * sizeof(jnode *));
        int nc = 0;
        for (const jnode *f = s->c; f; f = f->a) {
            if (nc == TMPL_MAX_DEPTH) tmpl_fail(J, CINFER_EINVAL, s->line, "filter chain longer than %d", TMPL_MAX_DEPTH);
            chain[nc++] = f;
        }
        while (nc-- > 0) {
            const jnode *f = chain[nc];
            jv *args, *kwv;
            eval_args(J, sc, f, &args, &kwv);
            v = tmpl_filter(J, f->name, v, args, f->args.n, f->kwnames, kwv, f->kwargs.n, f->line);
        }
        if (s->kind == S_SETBLOCK) assign(J, sc, s->a, v, s->line);
        else jv_str_into(J, out, v, s->line);
        return fl;
    }
    case S_MACRO: {
        jv f = jv_func(J, s->name, FN_MACRO, NULL);
        f.u.fn->macro = (jnode *)s;
        f.u.fn->closure = sc;
        tmpl_scope_set(J, sc, s->name, f);
        return FLOW_NONE;
    }
    case S_BREAK: return FLOW_BREAK;
    case S_CONTINUE: return FLOW_CONTINUE;
    case S_WITH: {
        jscope *w = tmpl_scope_new(J, sc);
        for (int i = 0; i < s->args.n; i++)
            tmpl_scope_set(J, w, s->args.v[i]->name, tmpl_eval(J, sc, s->kwargs.v[i]));
        return exec_body(J, w, &s->body, out);
    }
    case S_BODY: return exec_body(J, sc, &s->body, out);
    default:
        tmpl_fail(J, CINFER_EUNSUPPORTED, s->line, "statement kind %d not supported", s->kind);
    }
}

static int exec_body(tmpl_st *J, jscope *sc, const jnodes *body, tbuf *out) {
    if (++J->depth > TMPL_MAX_EVAL)
        tmpl_fail(J, CINFER_EINVAL, J->line, "evaluation nested too deeply (over %d levels; runaway recursion?)", TMPL_MAX_EVAL);
    stack_check(J, J->line);
    int fl = FLOW_NONE;
    for (int i = 0; i < body->n; i++) {
        fl = exec_stmt(J, sc, body->v[i], out);
        if (fl != FLOW_NONE) break;
    }
    J->depth--;
    return fl;
}

void tmpl_exec(tmpl_st *J, jscope *sc, const jnodes *body, tbuf *out) {
    int fl = exec_body(J, sc, body, out);
    (void)fl;
}
