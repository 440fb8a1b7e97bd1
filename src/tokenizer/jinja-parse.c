/*
 * jinja-parse.c — recursive-descent parser from tokens to the AST, with the
 * grammar and precedence of Jinja 3.1's parser.py:
 *   condexpr: or ('if' or ('else' condexpr)?)*       or/and/not
 *   compare:  math1 (('=='|'!='|'<'|...|'in'|'not in') math1)*
 *   math1 (+ -) > concat (~) > math2 (* / // %) > pow (**, left-assoc)
 *   unary (- +) > primary + postfix (.x [i] [a:b:c] (call)) + filters (|f)
 *   and tests (is [not] t [arg]).
 * Statements: for (else, inline if filter), if/elif/else, set (incl. tuple
 * targets, ns.attr, block set), macro, filter, with, break/continue,
 * generation (transformers' tag, renders its body). Tags that Jinja has but
 * this interpreter does not (include, import, extends, block, call, ...)
 * are CINFER_EUNSUPPORTED at parse time; unknown tags, bad syntax and
 * unknown filter/test names are errors as in Jinja.
 */
#include "tokenizer/jinja-internal.h"
#include "cinfer.h"

#include <stdio.h>
#include <string.h>

typedef struct ps {
    tmpl_st *J;
    jtok *t; size_t n, i;
    int depth;
    int loops;   /* enclosing for-loops (break/continue allowed) */
} ps;

static jtok *cur(ps *P) { return &P->t[P->i]; }
static jtok *peek(ps *P, size_t k) { return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1]; }
static jtok *next(ps *P) { jtok *t = cur(P); if (P->i + 1 < P->n) P->i++; return t; }

/* a token as Jinja names it in messages, into b[32] */
static const char *describe(jtok *t, char *b) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: snprintf(b, 32, "%.28s", t->s); return b;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default:
        switch (t->op) {
        case OP_FLOORDIV: return "//"; case OP_POW: return "**"; case OP_EQ: return "==";
        case OP_NE: return "!="; case OP_GE: return ">="; case OP_LE: return "<=";
        default: snprintf(b, 32, "%c", (char)t->op); return b;
        }
    }
}

static __attribute__((noreturn)) void syntax(ps *P, const char *what) {
    char b[32];
    tmpl_fail(P->J, CINFER_EFORMAT, cur(P)->line, "syntax error: %s (got '%s')", what, describe(cur(P), b));
}
static int is_op(ps *P, int op) { return cur(P)->type == TK_OP && cur(P)->op == op; }
static int is_name(ps *P, const char *name) { return cur(P)->type == TK_NAME && !strcmp(cur(P)->s, name); }
static void expect_op(ps *P, int op) {
    if (!is_op(P, op)) {
        char w[40]; snprintf(w, sizeof w, "expected '%c'", (char)op);
        syntax(P, w);
    }
    next(P);
}
static void expect_type(ps *P, int type, const char *what) {
    if (cur(P)->type != type) {
        char w[80]; snprintf(w, sizeof w, "expected %s", what);
        syntax(P, w);
    }
    next(P);
}
static const char *expect_name(ps *P) {
    if (cur(P)->type != TK_NAME) syntax(P, "expected a name");
    return next(P)->s;
}

static jnode *mk(ps *P, int kind) {
    jnode *n = tmpl_alloc(P->J, sizeof(jnode));
    n->kind = kind;
    n->line = cur(P)->line;
    return n;
}
static void add(ps *P, jnodes *l, jnode *n) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        jnode **v = tmpl_alloc(P->J, (size_t)cap * sizeof(jnode *));
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof(jnode *));
        l->v = v; l->cap = cap;
    }
    l->v[l->n++] = n;
}
static void add_kw(ps *P, jnode *n, const char *name, jnode *v) {
    if (n->kwargs.n == n->kwargs.cap) {
        int cap = n->kwargs.cap ? n->kwargs.cap * 2 : 4;
        const char **k = tmpl_alloc(P->J, (size_t)cap * sizeof(char *));
        if (n->kwargs.n) memcpy(k, n->kwnames, (size_t)n->kwargs.n * sizeof(char *));
        n->kwnames = k;
    }
    add(P, &n->kwargs, v);   /* grows kwargs.cap to the same capacity */
    n->kwnames[n->kwargs.n - 1] = name;
}

static void enter(ps *P) {
    char here;
    if (++P->depth > TMPL_MAX_DEPTH || P->J->stack_base - (uintptr_t)&here > TMPL_MAX_STACK)
        tmpl_fail(P->J, CINFER_EINVAL, cur(P)->line, "template nested too deeply (over %d levels)", TMPL_MAX_DEPTH);
}

static jnode *parse_expression(ps *P, int with_condexpr);
static jnode *parse_or_(ps *P);
static jnode *parse_tuple(ps *P, int simplified, int with_condexpr, const char *extra_end, int explicit_paren);
static jnode *parse_unary(ps *P, int with_filter);
static jnode *parse_primary(ps *P);
static jnode *parse_postfix(ps *P, jnode *node);
static jnode *parse_filter(ps *P, jnode *node, int start_inline);
static jnodes parse_statements(ps *P, const char **ends, int drop_needle);

static jnode *binop(ps *P, int op, jnode *a, jnode *b, int line) {
    jnode *n = mk(P, N_BINOP);
    n->op = op; n->a = a; n->b = b; n->line = line;
    return n;
}

static jnode *parse_condexpr(ps *P) {
    int line = cur(P)->line;
    jnode *e1 = NULL;
    e1 = parse_or_(P);
    while (is_name(P, "if")) {
        next(P);
        jnode *n = mk(P, N_COND);
        n->line = line;
        n->a = parse_or_(P);   /* test */
        n->b = e1;             /* then */
        if (is_name(P, "else")) { next(P); n->c = parse_condexpr(P); }
        e1 = n;
    }
    return e1;
}

static jnode *parse_compare(ps *P);
static jnode *parse_not(ps *P) {
    if (is_name(P, "not")) {
        jnode *n = mk(P, N_NOT);
        next(P);
        enter(P);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}
static jnode *parse_and(ps *P) {
    jnode *l = parse_not(P);
    while (is_name(P, "and")) {
        jnode *n = mk(P, N_AND);
        next(P);
        n->a = l; n->b = parse_not(P);
        l = n;
    }
    return l;
}
static jnode *parse_or_(ps *P) {
    jnode *l = parse_and(P);
    while (is_name(P, "or")) {
        jnode *n = mk(P, N_OR);
        next(P);
        n->a = l; n->b = parse_and(P);
        l = n;
    }
    return l;
}

static jnode *parse_math1(ps *P);
static jnode *parse_compare(ps *P) {
    jnode *e = parse_math1(P);
    jnode *cmp = NULL;
    for (;;) {
        int op = 0;
        jtok *t = cur(P);
        if (t->type == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == '<' || t->op == '>' ||
                                 t->op == OP_LE || t->op == OP_GE)) { op = t->op; next(P); }
        else if (is_name(P, "in")) { op = OP_IN; next(P); }
        else if (is_name(P, "not") && peek(P, 1)->type == TK_NAME && !strcmp(peek(P, 1)->s, "in")) {
            op = OP_NOTIN; next(P); next(P);
        } else break;
        if (!cmp) { cmp = mk(P, N_COMPARE); cmp->a = e; }
        add(P, &cmp->args, parse_math1(P));
        int *ops = tmpl_alloc(P->J, (size_t)cmp->args.n * sizeof(int));
        if (cmp->ops) memcpy(ops, cmp->ops, (size_t)(cmp->args.n - 1) * sizeof(int));
        ops[cmp->args.n - 1] = op;
        cmp->ops = ops;
    }
    return cmp ? cmp : e;
}

static jnode *parse_math2(ps *P);
static jnode *parse_concat(ps *P) {
    jnode *first = parse_math2(P);
    if (!is_op(P, '~')) return first;
    jnode *n = mk(P, N_CONCAT);
    add(P, &n->args, first);
    while (is_op(P, '~')) { next(P); add(P, &n->args, parse_math2(P)); }
    return n;
}
static jnode *parse_math1(ps *P) {
    jnode *l = parse_concat(P);
    while (is_op(P, '+') || is_op(P, '-')) {
        int line = cur(P)->line, op = next(P)->op;
        l = binop(P, op, l, parse_concat(P), line);
    }
    return l;
}
static jnode *parse_pow(ps *P) {
    jnode *l = parse_unary(P, 1);
    while (is_op(P, OP_POW)) {
        int line = cur(P)->line;
        next(P);
        l = binop(P, OP_POW, l, parse_unary(P, 1), line);
    }
    return l;
}
static jnode *parse_math2(ps *P) {
    jnode *l = parse_pow(P);
    while (is_op(P, '*') || is_op(P, '/') || is_op(P, OP_FLOORDIV) || is_op(P, '%')) {
        int line = cur(P)->line, op = next(P)->op;
        l = binop(P, op, l, parse_pow(P), line);
    }
    return l;
}

static void parse_call_args(ps *P, jnode *n) {
    expect_op(P, '(');
    while (!is_op(P, ')')) {
        if (n->args.n || n->kwargs.n) {
            expect_op(P, ',');
            if (is_op(P, ')')) break;
        }
        if (is_op(P, '*') || is_op(P, OP_POW))
            tmpl_fail(P->J, CINFER_EUNSUPPORTED, cur(P)->line, "*args / **kwargs in calls are not supported");
        if (cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && peek(P, 1)->op == '=') {
            const char *k = next(P)->s;
            next(P);
            add_kw(P, n, k, parse_expression(P, 1));
        } else {
            if (n->kwargs.n) syntax(P, "positional argument after keyword argument");
            add(P, &n->args, parse_expression(P, 1));
        }
    }
    next(P);
}

static jnode *parse_filter_expr(ps *P, jnode *node);
static jnode *parse_unary(ps *P, int with_filter) {
    enter(P);
    jnode *node;
    if (is_op(P, '-') || is_op(P, '+')) {
        node = mk(P, is_op(P, '-') ? N_NEG : N_POS);
        next(P);
        node->a = parse_unary(P, 0);
    } else node = parse_primary(P);
    node = parse_postfix(P, node);
    if (with_filter) node = parse_filter_expr(P, node);
    P->depth--;
    return node;
}

static jnode *parse_primary(ps *P) {
    jtok *t = cur(P);
    jnode *n;
    switch (t->type) {
    case TK_NAME:
        n = mk(P, N_CONST);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) n->val = jv_bool(1);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) n->val = jv_bool(0);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) n->val = jv_none();
        else { n->kind = N_NAME; n->name = t->s; }
        next(P);
        return n;
    case TK_STRING: {
        n = mk(P, N_CONST);
        tbuf b; tbuf_init(&b, P->J);
        while (cur(P)->type == TK_STRING) { tbuf_put(&b, cur(P)->s, cur(P)->n); next(P); }
        n->val = jv_str(P->J, b.p ? b.p : "", b.n);
        return n;
    }
    case TK_INT: n = mk(P, N_CONST); n->val = jv_int(t->i); next(P); return n;
    case TK_FLOAT: n = mk(P, N_CONST); n->val = jv_float(t->f); next(P); return n;
    case TK_OP:
        if (t->op == '(') {
            next(P);
            n = parse_tuple(P, 0, 1, NULL, 1);
            expect_op(P, ')');
            return n;
        }
        if (t->op == '[') {
            n = mk(P, N_LIST);
            next(P);
            while (!is_op(P, ']')) {
                if (n->args.n) expect_op(P, ',');
                if (is_op(P, ']')) break;
                add(P, &n->args, parse_expression(P, 1));
            }
            next(P);
            return n;
        }
        if (t->op == '{') {
            n = mk(P, N_DICT);
            next(P);
            while (!is_op(P, '}')) {
                if (n->args.n) expect_op(P, ',');
                if (is_op(P, '}')) break;
                add(P, &n->args, parse_expression(P, 1));
                expect_op(P, ':');
                add(P, &n->kwargs, parse_expression(P, 1));
            }
            next(P);
            return n;
        }
        /* fallthrough */
    default:
        syntax(P, "unexpected token in expression");
    }
}

static jnode *parse_subscribed(ps *P) {
    jnode *a = NULL, *b = NULL, *c = NULL;
    int line = cur(P)->line;
    if (!is_op(P, ':')) {
        a = parse_expression(P, 1);
        if (!is_op(P, ':')) return a;
    }
    next(P);   /* ':' */
    if (!is_op(P, ']') && !is_op(P, ',') && !is_op(P, ':')) b = parse_expression(P, 1);
    if (is_op(P, ':')) {
        next(P);
        if (!is_op(P, ']') && !is_op(P, ',')) c = parse_expression(P, 1);
    }
    jnode *n = mk(P, N_SLICE);
    n->line = line;
    n->a = a; n->b = b; n->c = c;
    return n;
}

static jnode *parse_postfix(ps *P, jnode *node) {
    for (;;) {
        if (is_op(P, '.')) {
            int line = cur(P)->line;
            next(P);
            jtok *t = next(P);
            jnode *n;
            if (t->type == TK_NAME) { n = mk(P, N_GETATTR); n->name = t->s; }
            else if (t->type == TK_INT) {
                n = mk(P, N_GETITEM);
                n->b = mk(P, N_CONST); n->b->val = jv_int(t->i);
            } else { P->i--; syntax(P, "expected name or number after '.'"); }
            n->line = line; n->a = node;
            node = n;
        } else if (is_op(P, '[')) {
            int line = cur(P)->line;
            next(P);
            jnode *tup = mk(P, N_TUPLE);
            while (!is_op(P, ']')) {
                if (tup->args.n) expect_op(P, ',');
                add(P, &tup->args, parse_subscribed(P));
            }
            next(P);
            if (!tup->args.n) syntax(P, "expected subscript expression");
            jnode *idx = tup->args.n == 1 ? tup->args.v[0] : tup;
            jnode *n;
            if (idx->kind == N_SLICE) { n = mk(P, N_SLICE); n->b = idx; }   /* bounds in idx->a/b/c */
            else {
                for (int k = 0; k < tup->args.n; k++)
                    if (tup->args.v[k]->kind == N_SLICE)
                        tmpl_fail(P->J, CINFER_EUNSUPPORTED, line, "multi-dimensional slicing is not supported");
                n = mk(P, N_GETITEM); n->b = idx;
            }
            n->line = line;
            n->a = node;
            node = n;
        } else if (is_op(P, '(')) {
            jnode *n = mk(P, N_CALL);
            n->a = node;
            parse_call_args(P, n);
            node = n;
        } else return node;
    }
}

static const char *dotted_name(ps *P) {
    const char *name = expect_name(P);
    while (is_op(P, '.')) {
        next(P);
        const char *more = expect_name(P);
        size_t a = strlen(name), b = strlen(more);
        char *s = tmpl_alloc(P->J, a + b + 2);
        memcpy(s, name, a); s[a] = '.'; memcpy(s + a + 1, more, b);
        name = s;
    }
    return name;
}

static jnode *parse_filter(ps *P, jnode *node, int start_inline) {
    while (is_op(P, '|') || start_inline) {
        if (!start_inline) next(P);
        start_inline = 0;
        jnode *n = mk(P, N_FILTER);
        n->name = dotted_name(P);
        if (!tmpl_filter_known(n->name))
            tmpl_fail(P->J, CINFER_EUNSUPPORTED, n->line, "no filter named '%s'", n->name);
        if (is_op(P, '(')) parse_call_args(P, n);
        n->a = node;
        node = n;
    }
    return node;
}

static jnode *parse_test(ps *P, jnode *node) {
    next(P);   /* 'is' */
    int neg = 0;
    if (is_name(P, "not")) { next(P); neg = 1; }
    jnode *n = mk(P, N_TEST);
    n->name = dotted_name(P);
    if (!tmpl_test_known(n->name))
        tmpl_fail(P->J, CINFER_EUNSUPPORTED, n->line, "no test named '%s'", n->name);
    jtok *t = cur(P);
    if (is_op(P, '(')) parse_call_args(P, n);
    else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
              (t->type == TK_OP && (t->op == '(' || t->op == '[' || t->op == '{'))) &&
             !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is")) syntax(P, "you cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        add(P, &n->args, arg);
    }
    n->a = node;
    if (neg) { jnode *m = mk(P, N_NOT); m->a = n; return m; }
    return n;
}

static jnode *parse_filter_expr(ps *P, jnode *node) {
    for (;;) {
        if (is_op(P, '|')) node = parse_filter(P, node, 0);
        else if (is_name(P, "is")) node = parse_test(P, node);
        else if (is_op(P, '(')) {
            jnode *n = mk(P, N_CALL);
            n->a = node;
            parse_call_args(P, n);
            node = n;
        } else return node;
    }
}

static jnode *parse_expression(ps *P, int with_condexpr) {
    enter(P);
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or_(P);
    P->depth--;
    return n;
}

static int tuple_end(ps *P, const char *extra_end) {
    jtok *t = cur(P);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || (t->type == TK_OP && t->op == ')')) return 1;
    return extra_end && is_name(P, extra_end);
}

static jnode *parse_tuple(ps *P, int simplified, int with_condexpr, const char *extra_end, int explicit_paren) {
    int line = cur(P)->line;
    jnode *tup = mk(P, N_TUPLE);
    int is_tuple = 0;
    for (;;) {
        if (tup->args.n) expect_op(P, ',');
        if (tuple_end(P, extra_end)) break;
        add(P, &tup->args, simplified ? parse_primary(P) : parse_expression(P, with_condexpr));
        if (is_op(P, ',')) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (tup->args.n) return tup->args.v[0];
        if (!explicit_paren) syntax(P, "expected an expression");
    }
    tup->line = line;
    return tup;
}

/* ----------------------------------------------------------- statements */
static void check_target(ps *P, jnode *t) {
    if (t->kind == N_NAME) return;
    if (t->kind == N_TUPLE) {
        for (int i = 0; i < t->args.n; i++)
            if (t->args.v[i]->kind != N_NAME) tmpl_fail(P->J, CINFER_EFORMAT, t->line, "can't assign to this target");
        return;
    }
    tmpl_fail(P->J, CINFER_EFORMAT, t->line, "can't assign to this target");
}

static jnode *parse_assign_target(ps *P, int with_namespace, const char *extra_end) {
    if (with_namespace && cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && peek(P, 1)->op == '.') {
        jnode *n = mk(P, N_NSREF);
        n->name = next(P)->s;   /* the namespace variable */
        next(P);
        jnode *attr = mk(P, N_CONST);
        const char *a = expect_name(P);
        attr->val = jv_cstr(P->J, a);
        n->b = attr;
        return n;
    }
    jnode *t = parse_tuple(P, 1, 1, extra_end, 0);
    check_target(P, t);
    return t;
}

static void block_end(ps *P) { expect_type(P, TK_BLOCK_END, "end of statement block"); }

static jnode *parse_for(ps *P) {
    jnode *n = mk(P, S_FOR);
    next(P);
    n->a = parse_assign_target(P, 0, "in");
    if (!is_name(P, "in")) syntax(P, "expected 'in'");
    next(P);
    n->b = parse_tuple(P, 0, 0, "recursive", 0);
    if (is_name(P, "if")) { next(P); n->c = parse_expression(P, 1); }
    if (is_name(P, "recursive"))
        tmpl_fail(P->J, CINFER_EUNSUPPORTED, cur(P)->line, "recursive for-loops are not supported");
    static const char *ends1[] = {"endfor", "else", NULL}, *ends2[] = {"endfor", NULL};
    P->loops++;
    n->body = parse_statements(P, ends1, 0);
    P->loops--;
    if (!strcmp(next(P)->s, "else")) n->orelse = parse_statements(P, ends2, 1);
    return n;
}

static jnode *parse_if(ps *P) {
    jnode *n = mk(P, S_IF), *top = n;
    next(P);
    static const char *ends1[] = {"elif", "else", "endif", NULL}, *ends2[] = {"endif", NULL};
    for (;;) {
        n->a = parse_tuple(P, 0, 0, NULL, 0);
        n->body = parse_statements(P, ends1, 0);
        const char *t = next(P)->s;
        if (!strcmp(t, "elif")) {
            jnode *m = mk(P, S_IF);
            add(P, &n->orelse, m);
            n = m;
            continue;
        }
        if (!strcmp(t, "else")) n->orelse = parse_statements(P, ends2, 1);
        return top;
    }
}

static jnode *parse_set(ps *P) {
    jnode *n = mk(P, S_SET);
    next(P);
    n->a = parse_assign_target(P, 1, NULL);
    if (is_op(P, '=')) {
        next(P);
        n->b = parse_tuple(P, 0, 1, NULL, 0);
        return n;
    }
    if (n->a->kind == N_NSREF) syntax(P, "expected '='");
    n->kind = S_SETBLOCK;
    n->c = parse_filter(P, NULL, 0);
    static const char *ends[] = {"endset", NULL};
    n->body = parse_statements(P, ends, 1);
    return n;
}

static jnode *parse_macro(ps *P) {
    jnode *n = mk(P, S_MACRO);
    next(P);
    n->name = expect_name(P);
    expect_op(P, '(');
    while (!is_op(P, ')')) {
        if (n->args.n) expect_op(P, ',');
        jnode *p = mk(P, N_NAME);
        p->name = expect_name(P);
        add(P, &n->args, p);
        jnode *dflt = NULL;
        if (is_op(P, '=')) { next(P); dflt = parse_expression(P, 1); }
        else if (n->kwargs.n && n->kwargs.v[n->kwargs.n - 1])
            syntax(P, "non-default argument follows default argument");
        add(P, &n->kwargs, dflt);
    }
    next(P);
    static const char *ends[] = {"endmacro", NULL};
    int saved = P->loops;
    P->loops = 0;
    n->body = parse_statements(P, ends, 1);
    P->loops = saved;
    return n;
}

static jnode *parse_statement(ps *P) {
    jtok *t = cur(P);
    if (t->type != TK_NAME) syntax(P, "tag name expected");
    enter(P);
    jnode *n = NULL;
    const char *s = t->s;
    if (!strcmp(s, "for")) n = parse_for(P);
    else if (!strcmp(s, "if")) n = parse_if(P);
    else if (!strcmp(s, "set")) n = parse_set(P);
    else if (!strcmp(s, "macro")) n = parse_macro(P);
    else if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        if (!P->loops) tmpl_fail(P->J, CINFER_EFORMAT, t->line, "'%s' outside of a loop", s);
        n = mk(P, s[0] == 'b' ? S_BREAK : S_CONTINUE);
        next(P);
    } else if (!strcmp(s, "filter")) {
        n = mk(P, S_FILTERBLOCK);
        next(P);
        n->c = parse_filter(P, NULL, 1);
        static const char *ends[] = {"endfilter", NULL};
        n->body = parse_statements(P, ends, 1);
    } else if (!strcmp(s, "with")) {
        n = mk(P, S_WITH);
        next(P);
        while (cur(P)->type != TK_BLOCK_END) {
            if (n->args.n) expect_op(P, ',');
            jnode *tg = parse_assign_target(P, 0, NULL);
            if (tg->kind != N_NAME) syntax(P, "with-targets must be names");
            add(P, &n->args, tg);
            expect_op(P, '=');
            add(P, &n->kwargs, parse_expression(P, 1));
        }
        static const char *ends[] = {"endwith", NULL};
        n->body = parse_statements(P, ends, 1);
    } else if (!strcmp(s, "generation")) {
        n = mk(P, S_BODY);
        next(P);
        static const char *ends[] = {"endgeneration", NULL};
        n->body = parse_statements(P, ends, 1);
    } else if (!strcmp(s, "call") || !strcmp(s, "include") || !strcmp(s, "import") ||
               !strcmp(s, "from") || !strcmp(s, "extends") || !strcmp(s, "block") ||
               !strcmp(s, "autoescape") || !strcmp(s, "do") || !strcmp(s, "trans") ||
               !strcmp(s, "print")) {
        tmpl_fail(P->J, CINFER_EUNSUPPORTED, t->line, "the '%s' tag is not supported", s);
    } else {
        tmpl_fail(P->J, CINFER_EFORMAT, t->line, "encountered unknown tag '%s'", s);
    }
    P->depth--;
    return n;
}

static int in_list(const char *s, const char **l) {
    for (; l && *l; l++) if (!strcmp(s, *l)) return 1;
    return 0;
}

/* parses until {% <one of ends> ; leaves the cursor on that name */
static jnodes subparse(ps *P, const char **ends) {
    jnodes body = {0};
    for (;;) {
        jtok *t = cur(P);
        if (t->type == TK_EOF) {
            if (ends) {
                char w[160]; size_t k = 0;
                k += (size_t)snprintf(w, sizeof w, "unexpected end of template, looking for");
                for (const char **e = ends; *e && k < sizeof w; e++)
                    k += (size_t)snprintf(w + k, sizeof w - k, " '%s'", *e);
                tmpl_fail(P->J, CINFER_EFORMAT, t->line, "%s", w);
            }
            return body;
        }
        if (t->type == TK_DATA) {
            jnode *n = mk(P, S_TEXT);
            n->val = jv_str(P->J, t->s, t->n);
            add(P, &body, n);
            next(P);
        } else if (t->type == TK_VAR_BEGIN) {
            next(P);
            jnode *n = mk(P, S_OUTPUT);
            n->a = parse_tuple(P, 0, 1, NULL, 0);
            expect_type(P, TK_VAR_END, "end of print statement");
            add(P, &body, n);
        } else if (t->type == TK_BLOCK_BEGIN) {
            next(P);
            if (cur(P)->type == TK_NAME && in_list(cur(P)->s, ends)) return body;
            add(P, &body, parse_statement(P));
            block_end(P);
        } else {
            syntax(P, "unexpected token");
        }
    }
}

/* as Jinja: the block end of the opening tag, the body, and (drop_needle)
 * the closing tag's name; the caller's subparse consumes its block end */
static jnodes parse_statements(ps *P, const char **ends, int drop_needle) {
    block_end(P);
    jnodes body = subparse(P, ends);
    if (drop_needle) next(P);
    return body;
}

jnode *tmpl_parse(tmpl_st *J, jtok *toks, size_t ntok) {
    ps P = {0};
    P.J = J; P.t = toks; P.n = ntok;
    jnode *root = tmpl_alloc(J, sizeof(jnode));
    root->kind = S_BODY;
    root->line = 1;
    root->body = subparse(&P, NULL);
    return root;
}
