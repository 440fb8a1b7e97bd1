/*
 * jinja-internal.h — shared types of the chat-template interpreter
 * (jinja-lex.c, jinja-parse.c, jinja-value.c, jinja-eval.c, jinja-builtins.c;
 * entry point tmpl_render in chat-template.c).
 *
 * Memory: every object of one render (tokens, AST, values, strings) lives in
 * one arena freed at the end, so errors unwind with longjmp and leak nothing.
 * Values are immutable once built (the sandbox forbids mutating lists and
 * dicts) except namespaces, which `{% set ns.x = ... %}` updates in place.
 * Strings are UTF-8 byte strings, NUL-terminated; lengths in codepoints are
 * computed when Python semantics need them (len, indexing, slicing).
 *
 * Limits (hostile templates): arena bytes, output bytes, evaluation steps,
 * nesting depth of parse and evaluation, macro recursion; exceeding one is an
 * error, never a crash.
 */
#ifndef CINFER_JINJA_INTERNAL_H
#define CINFER_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#define TMPL_MAX_ARENA   (256u << 20)   /* bytes of all objects of one render */
#define TMPL_MAX_OUTPUT  (64u << 20)    /* bytes of the rendered text */
#define TMPL_MAX_STEPS   20000000L      /* statements + loop iterations + calls */
#define TMPL_MAX_DEPTH   256            /* parser nesting; nesting of printed/serialised values */
#define TMPL_MAX_EVAL    1000           /* evaluator nesting (expressions, bodies, macro calls) */
#define TMPL_MAX_CALLS   200            /* macro call depth */
#define TMPL_MAX_STACK   (384u << 10)   /* C stack one render may use (callers need ~0.5 MiB) */
#define TMPL_MAX_RANGE   100000         /* range() length, as Jinja's sandbox */
#define TMPL_MAX_WORK    (1ull << 31)   /* bytes scanned by string/list operations */

/* ------------------------------------------------------------ the state */
typedef struct tmpl_chunk tmpl_chunk;
typedef struct tmpl_st {
    jmp_buf jb;
    int status;              /* cinfer_status of the failure */
    char *err; size_t err_len;
    tmpl_chunk *chunks;      /* arena */
    size_t arena_bytes;
    long steps;
    unsigned long long work; /* bytes scanned (see tmpl_charge) */
    int depth, calls;        /* evaluator nesting, macro calls */
    int vdepth;              /* nesting of the value being printed / serialised */
    uintptr_t stack_base;    /* address of a local of tmpl_render */
    int line;                /* line of the node being evaluated */
} tmpl_st;

void tmpl_fail(tmpl_st *J, int status, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
void *tmpl_alloc(tmpl_st *J, size_t n);          /* zeroed, never NULL */
char *tmpl_strndup(tmpl_st *J, const char *s, size_t n);
void tmpl_arena_free(tmpl_st *J);

/* growable byte buffer in the arena */
typedef struct tbuf { char *p; size_t n, cap; tmpl_st *J; size_t limit; } tbuf;
void tbuf_init(tbuf *b, tmpl_st *J);
void tbuf_put(tbuf *b, const char *s, size_t n);
void tbuf_puts(tbuf *b, const char *s);
void tbuf_putc(tbuf *b, char c);
void tbuf_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --------------------------------------------------------------- values */
typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC
} jv_kind;

typedef struct jstr { size_t n; char s[]; } jstr;      /* s[n] == 0 */
struct jv;
/* Python objects that behave like sequences but print, measure or serialise
 * differently: generators (map/select/... results: always truthy, no len(),
 * unprintable), dict views (items()/keys()/values()) and range objects */
enum { JL_PLAIN, JL_GEN, JL_ITEMS, JL_KEYS, JL_VALUES, JL_RANGE };
typedef struct jlist {
    size_t n, cap; struct jv *v;
    int tuple;
    int view;                  /* JL_* */
    int64_t r0, r1, rs;        /* JL_RANGE: start, stop, step */
} jlist;
enum { JD_PLAIN, JD_NS, JD_OBJ };   /* dict, namespace(), loop object */
typedef struct jdict { size_t n, cap; struct jv *k, *v; int kind; } jdict;
struct jnode;
struct jscope;
typedef struct jfunc {
    const char *name;        /* builtin/method name, or macro name */
    int kind;                /* FN_GLOBAL, FN_METHOD, FN_MACRO, FN_CYCLE */
    struct jv *self;         /* bound object for methods / loop.cycle */
    struct jnode *macro;     /* FN_MACRO: the definition */
    struct jscope *closure;  /* FN_MACRO: scope it was defined in */
} jfunc;
enum { FN_GLOBAL, FN_METHOD, FN_MACRO, FN_CYCLE };

typedef struct jv {
    int k;                   /* jv_kind */
    union {
        int b; int64_t i; double f;
        jstr *s; jlist *l; jdict *d; jfunc *fn;
        const char *uname;   /* JV_UNDEF: the missing name, for messages */
    } u;
} jv;

/* accounts for work proportional to the size of v (a string's bytes, a
 * container's items), so repeated scans of big inputs stay bounded */
void tmpl_charge(tmpl_st *J, jv v, int line);

jv jv_undef(const char *name);
jv jv_none(void);
jv jv_bool(int b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(tmpl_st *J, const char *s, size_t n);
jv jv_cstr(tmpl_st *J, const char *s);
jv jv_list(tmpl_st *J, size_t cap);
jv jv_view(jv list, int view);             /* marks a fresh list as a JL_* view */
void jl_push(tmpl_st *J, jv *list, jv v);
jv jv_dict(tmpl_st *J, int kind);
void jd_set(tmpl_st *J, jv *dict, jv key, jv val);   /* replace or append */
jv *jd_get(const jv *dict, jv key);                  /* NULL when absent */
jv *jd_gets(const jv *dict, const char *key);
jv jv_func(tmpl_st *J, const char *name, int kind, const jv *self);

int jv_truthy(jv v);
int jv_eq(jv a, jv b);
int jv_cmp(tmpl_st *J, jv a, jv b, int line);        /* <0 0 >0, error when unorderable */
const char *jv_typename(jv v);
/* Python str() / repr() into a buffer */
void jv_str_into(tmpl_st *J, tbuf *b, jv v, int line);
void jv_repr_into(tmpl_st *J, tbuf *b, jv v, int line);
jv jv_to_string(tmpl_st *J, jv v, int line);
void tmpl_float_repr(double f, char *out, size_t n);
/* json.dumps(v, ensure_ascii, indent (NULL = none), separators, sort_keys) */
typedef struct json_opts {
    int ensure_ascii, sort_keys;
    const char *indent;       /* NULL: single line */
    const char *item_sep, *key_sep;
} json_opts;
void jv_tojson(tmpl_st *J, tbuf *b, jv v, const json_opts *o, int level, int line);

/* UTF-8 helpers (invalid bytes decode as themselves, one byte each) */
uint32_t tmpl_u8_next(const char *s, size_t n, size_t *i);
void tmpl_u8_put(tbuf *b, uint32_t c);
size_t tmpl_u8_len(const char *s, size_t n);
int tmpl_isspace(uint32_t c);

/* --------------------------------------------------------------- tokens */
enum {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP
};
enum { OP_FLOORDIV = 256, OP_POW, OP_EQ, OP_NE, OP_GE, OP_LE, OP_NOTIN, OP_IN };
typedef struct jtok {
    int type, line, op;
    const char *s; size_t n;  /* name / data / decoded string bytes */
    int64_t i; double f;
} jtok;

/* lexes `src` (newlines already normalised) into *toks (arena), EOF-terminated */
void tmpl_lex(tmpl_st *J, const char *src, size_t n, jtok **toks, size_t *ntok);

/* ----------------------------------------------------------------- AST */
enum {
    /* expressions */
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_BINOP, N_NEG, N_POS, N_NOT, N_AND, N_OR, N_COMPARE, N_COND, N_LIST,
    N_TUPLE, N_DICT, N_CONCAT, N_NSREF,
    /* statements */
    S_TEXT, S_OUTPUT, S_FOR, S_IF, S_SET, S_SETBLOCK, S_MACRO, S_BREAK,
    S_CONTINUE, S_FILTERBLOCK, S_WITH, S_BODY
};
typedef struct jnodes { struct jnode **v; int n, cap; } jnodes;
typedef struct jnode {
    int kind, line, op;
    const char *name;          /* name, attribute, filter, test, macro */
    jv val;                    /* N_CONST, S_TEXT */
    struct jnode *a, *b, *c;   /* operands / target, iterable, condition */
    jnodes args;               /* call args, list items, compare operands, params */
    jnodes kwargs;             /* keyword values (names in kwnames), dict values, defaults */
    const char **kwnames;
    int *ops;                  /* N_COMPARE: operator per operand */
    jnodes body, orelse;
} jnode;

jnode *tmpl_parse(tmpl_st *J, jtok *toks, size_t ntok);   /* returns an S_BODY */

/* ------------------------------------------------------------- evaluation */
typedef struct jscope {
    struct jscope *parent;
    size_t n, cap;
    const char **names;
    jv *vals;
} jscope;

jscope *tmpl_scope_new(tmpl_st *J, jscope *parent);
void tmpl_scope_set(tmpl_st *J, jscope *s, const char *name, jv v);
jv *tmpl_scope_lookup(jscope *s, const char *name);

void tmpl_exec(tmpl_st *J, jscope *sc, const jnodes *body, tbuf *out);
jv tmpl_eval(tmpl_st *J, jscope *sc, const jnode *e);
jv tmpl_call(tmpl_st *J, jv fn, jv *args, int nargs, const char **kwn, jv *kwv, int nkw, int line);
jv tmpl_getattr(tmpl_st *J, jv obj, const char *name, int line);
jv tmpl_getitem(tmpl_st *J, jv obj, jv key, int line);
jv tmpl_iterate(tmpl_st *J, jv v, int line);   /* list of the items */
/* fails with UndefinedError's message for an Undefined value */
void tmpl_undef_error(tmpl_st *J, jv u, int line) __attribute__((noreturn));

/* builtins (jinja-builtins.c) */
int tmpl_filter_known(const char *name);
int tmpl_test_known(const char *name);
jv tmpl_filter(tmpl_st *J, const char *name, jv v, jv *args, int nargs,
               const char **kwn, jv *kwv, int nkw, int line);
int tmpl_test(tmpl_st *J, const char *name, jv v, jv *args, int nargs, int line);
jv tmpl_method(tmpl_st *J, jv self, const char *name, jv *args, int nargs,
               const char **kwn, jv *kwv, int nkw, int line);
int tmpl_is_method(jv self, const char *name);
jv tmpl_global_call(tmpl_st *J, const char *name, jv *args, int nargs,
                    const char **kwn, jv *kwv, int nkw, int line);
void tmpl_add_globals(tmpl_st *J, jscope *sc);
jv tmpl_binop(tmpl_st *J, int op, jv a, jv b, int line);
int tmpl_contains(tmpl_st *J, jv container, jv item, int line);

#endif
