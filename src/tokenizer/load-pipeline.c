/*
 * load-pipeline.c — tokenizer.json's normalizer, pre_tokenizer, decoder and
 * post_processor sections -> the tables in tokenizer.h.
 *
 * Every component type cinfer does not implement is an error naming it
 * (CINFER_EUNSUPPORTED), never a silently different tokenization. Regexes
 * PCRE2 rejects are CINFER_EFORMAT with PCRE2's message and offset.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok-json.h"
#include "tokenizer/tokenizer.h"
#include "util.h"

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

pcre2_code *tok_regex_compile(const char *pat, size_t len, int literal, char *err, size_t err_len) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        cf_err(err, err_len, CINFER_EFORMAT, "regex rejected by PCRE2 at offset %zu: %s (pattern: %.80s)",
               (size_t)eo, (const char *)msg, pat);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  /* falls back to the interpreter if JIT is absent */
    return re;
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* {"String": s} or {"Regex": r} -> compiled regex */
static pcre2_code *pattern_of(const tj_doc *d, const tj_node *pat, const char *what, cinfer_status *st,
                              char *err, size_t err_len, const tj_node **lit) {
    const tj_node *s = tj_get(d, pat, "String"), *r = tj_get(d, pat, "Regex");
    if (lit) *lit = s && s->type == TJ_STR ? s : NULL;
    const tj_node *p = s && s->type == TJ_STR ? s : (r && r->type == TJ_STR ? r : NULL);
    if (!p) {
        *st = cf_err(err, err_len, CINFER_EFORMAT, "tokenizer.json: %s has no String/Regex pattern", what);
        return NULL;
    }
    char e2[300];
    pcre2_code *re = tok_regex_compile(p->u.s, p->len, p == s, e2, sizeof e2);
    if (!re) *st = cf_err(err, err_len, CINFER_EFORMAT, "tokenizer.json: %s: %s", what, e2);
    return re;
}

static cinfer_status add_norm(cinfer_tokenizer *t, const tj_doc *d, const tj_node *v, char *err, size_t n) {
    if (!v || v->type == TJ_NULL) return CINFER_OK;
    const char *ty = tj_str(tj_get(d, v, "type"));
    if (!ty) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: normalizer without a type");
    if (!strcmp(ty, "Sequence")) {
        const tj_node *l = tj_get(d, v, "normalizers");
        if (!l || l->type != TJ_ARR) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: Sequence normalizer without a list");
        for (const tj_node *c = tj_first(d, l); c; c = tj_next(d, c)) {
            cinfer_status st = add_norm(t, d, c, err, n);
            if (st) return st;
        }
        return CINFER_OK;
    }
    tok_norm nm = {0};
    if (!strcmp(ty, "NFC")) nm.kind = TN_NFC;
    else if (!strcmp(ty, "NFD")) nm.kind = TN_NFD;
    else if (!strcmp(ty, "NFKC")) nm.kind = TN_NFKC;
    else if (!strcmp(ty, "NFKD")) nm.kind = TN_NFKD;
    else if (!strcmp(ty, "Lowercase")) nm.kind = TN_LOWER;
    else if (!strcmp(ty, "Prepend")) {
        const tj_node *p = tj_get(d, v, "prepend");
        if (!tj_str(p)) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: Prepend without a string");
        nm.kind = TN_PREPEND;
        nm.a = dupn(p->u.s, p->len);
        nm.alen = p->len;
    } else if (!strcmp(ty, "Replace")) {
        const tj_node *c = tj_get(d, v, "content"), *lit;
        if (!tj_str(c)) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: Replace without content");
        cinfer_status st = CINFER_OK;
        nm.kind = TN_REPLACE;
        pcre2_code *re = pattern_of(d, tj_get(d, v, "pattern"), "Replace normalizer", &st, err, n, &lit);
        if (!re) return st;
        if (lit) { pcre2_code_free(re); nm.a = dupn(lit->u.s, lit->len); nm.alen = lit->len; }
        else nm.re = re;
        nm.b = dupn(c->u.s, c->len);
        nm.blen = c->len;
    } else if (!strcmp(ty, "Strip")) {
        nm.kind = TN_STRIP;
        nm.strip_left = tj_bool(tj_get(d, v, "strip_left"), 1);
        nm.strip_right = tj_bool(tj_get(d, v, "strip_right"), 1);
    } else
        return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: normalizer type \"%s\" is not supported", ty);
    tok_norm *nn = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *nn);
    if (!nn) { free(nm.a); free(nm.b); return CINFER_ENOMEM; }
    t->norm = nn;
    t->norm[t->n_norm++] = nm;
    return CINFER_OK;
}

static int behavior_of(const char *b) {
    if (!b) return -1;
    if (!strcmp(b, "Removed")) return TB_REMOVED;
    if (!strcmp(b, "Isolated")) return TB_ISOLATED;
    if (!strcmp(b, "MergedWithPrevious")) return TB_MERGED_PREV;
    if (!strcmp(b, "MergedWithNext")) return TB_MERGED_NEXT;
    if (!strcmp(b, "Contiguous")) return TB_CONTIGUOUS;
    return -1;
}

static cinfer_status add_pre(cinfer_tokenizer *t, const tj_doc *d, const tj_node *v, char *err, size_t n) {
    if (!v || v->type == TJ_NULL) return CINFER_OK;
    const char *ty = tj_str(tj_get(d, v, "type"));
    if (!ty) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(ty, "Sequence")) {
        const tj_node *l = tj_get(d, v, "pretokenizers");
        if (!l || l->type != TJ_ARR) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: Sequence pre_tokenizer without a list");
        for (const tj_node *c = tj_first(d, l); c; c = tj_next(d, c)) {
            cinfer_status st = add_pre(t, d, c, err, n);
            if (st) return st;
        }
        return CINFER_OK;
    }
    tok_pretok p = {0};
    cinfer_status st = CINFER_OK;
    char e2[300];
    if (!strcmp(ty, "Split")) {
        p.kind = TP_SPLIT;
        p.behavior = behavior_of(tj_str(tj_get(d, v, "behavior")));
        if (p.behavior < 0) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: Split with an unknown behavior");
        p.invert = tj_bool(tj_get(d, v, "invert"), 0);
        p.re = pattern_of(d, tj_get(d, v, "pattern"), "Split pre_tokenizer", &st, err, n, NULL);
        if (!p.re) return st;
    } else if (!strcmp(ty, "ByteLevel")) {
        p.kind = TP_BYTELEVEL;
        p.add_prefix_space = tj_bool(tj_get(d, v, "add_prefix_space"), 1);
        if (tj_bool(tj_get(d, v, "use_regex"), 1)) {
            p.re = tok_regex_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), 0, e2, sizeof e2);
            if (!p.re) return cf_err(err, n, CINFER_EFORMAT, "%s", e2);
        }
        t->byte_level = 1;
    } else if (!strcmp(ty, "Metaspace")) {
        p.kind = TP_METASPACE;
        const char *r = tj_str(tj_get(d, v, "replacement"));
        if (!r) r = "\xe2\x96\x81";
        p.repl_len = strlen(r);
        if (p.repl_len == 0 || p.repl_len > 4) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: bad Metaspace replacement");
        memcpy(p.repl, r, p.repl_len);
        const char *sch = tj_str(tj_get(d, v, "prepend_scheme"));
        if (sch) p.prepend_scheme = !strcmp(sch, "first") ? TM_FIRST : !strcmp(sch, "never") ? TM_NEVER : TM_ALWAYS;
        else p.prepend_scheme = tj_bool(tj_get(d, v, "add_prefix_space"), 1) ? TM_ALWAYS : TM_NEVER;
        p.split = tj_bool(tj_get(d, v, "split"), 1);
        p.re = tok_regex_compile(p.repl, p.repl_len, 1, e2, sizeof e2);
        if (!p.re) return cf_err(err, n, CINFER_EFORMAT, "%s", e2);
    } else if (!strcmp(ty, "Digits")) {
        p.kind = TP_DIGITS;
        p.behavior = TB_ISOLATED;
        const char *pat = tj_bool(tj_get(d, v, "individual_digits"), 0) ? "\\p{N}" : "\\p{N}+";
        p.re = tok_regex_compile(pat, strlen(pat), 0, e2, sizeof e2);
    } else if (!strcmp(ty, "WhitespaceSplit")) {
        p.kind = TP_WS_SPLIT;
        p.behavior = TB_REMOVED;
        p.re = tok_regex_compile("\\s+", 3, 0, e2, sizeof e2);
    } else if (!strcmp(ty, "Whitespace")) {
        p.kind = TP_WHITESPACE;
        p.behavior = TB_REMOVED;
        p.invert = 1;
        p.re = tok_regex_compile("\\w+|[^\\w\\s]+", 12, 0, e2, sizeof e2);
    } else
        return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: pre_tokenizer type \"%s\" is not supported", ty);
    if (!p.re && p.kind != TP_BYTELEVEL) return cf_err(err, n, CINFER_EFORMAT, "%s", e2);
    tok_pretok *np = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *np);
    if (!np) { pcre2_code_free(p.re); return CINFER_ENOMEM; }
    t->pre = np;
    t->pre[t->n_pre++] = p;
    return CINFER_OK;
}

static cinfer_status add_dec(cinfer_tokenizer *t, const tj_doc *d, const tj_node *v, char *err, size_t n) {
    if (!v || v->type == TJ_NULL) return CINFER_OK;
    const char *ty = tj_str(tj_get(d, v, "type"));
    if (!ty) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: decoder without a type");
    if (!strcmp(ty, "Sequence")) {
        const tj_node *l = tj_get(d, v, "decoders");
        if (!l || l->type != TJ_ARR) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: Sequence decoder without a list");
        for (const tj_node *c = tj_first(d, l); c; c = tj_next(d, c)) {
            cinfer_status st = add_dec(t, d, c, err, n);
            if (st) return st;
        }
        return CINFER_OK;
    }
    if (t->n_dec >= 8) return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: decoder chain too long");
    int kind;
    if (!strcmp(ty, "ByteLevel")) kind = TD_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) kind = TD_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) kind = TD_FUSE;
    else if (!strcmp(ty, "Strip")) {
        kind = TD_STRIP;
        const tj_node *c = tj_get(d, v, "content"), *a = tj_get(d, v, "start"), *b = tj_get(d, v, "stop");
        if (!tj_str(c) || strcmp(c->u.s, " ") || (a && a->type != TJ_NUM) || (b && b->type != TJ_NUM))
            return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: Strip decoder supported only for content \" \"");
        t->dec_strip_start = a ? (int)a->u.num : 0;
        t->dec_strip_stop = b ? (int)b->u.num : 0;
        if (t->dec_strip_stop) return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: Strip decoder with stop > 0 is not supported");
    } else if (!strcmp(ty, "Replace")) {
        kind = TD_REPLACE;
        const tj_node *p = tj_get(d, tj_get(d, v, "pattern"), "String"), *c = tj_get(d, v, "content");
        if (!tj_str(p) || !tj_str(c) || !p->len || t->dec_repl_from)
            return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: Replace decoder supported only once with a String pattern");
        t->dec_repl_from = dupn(p->u.s, p->len);
        t->dec_repl_to = dupn(c->u.s, c->len);
    } else if (!strcmp(ty, "Metaspace")) {
        kind = TD_METASPACE;
        const char *r = tj_str(tj_get(d, v, "replacement"));
        if (!r) r = "\xe2\x96\x81";
        if (strlen(r) == 0 || strlen(r) > 4) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: bad Metaspace replacement");
        strcpy(t->dec_meta_repl, r);
        const char *sch = tj_str(tj_get(d, v, "prepend_scheme"));
        if (sch) t->dec_meta_first = strcmp(sch, "never") != 0;
        else t->dec_meta_first = tj_bool(tj_get(d, v, "add_prefix_space"), 1);
    } else
        return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: decoder type \"%s\" is not supported", ty);
    t->dec[t->n_dec++] = kind;
    return CINFER_OK;
}

/* id of a special token named by its content in TemplateProcessing */
static int32_t special_id(const tj_doc *d, const tj_node *specials, const char *name) {
    const tj_node *s = tj_get(d, specials, name);
    const tj_node *ids = tj_get(d, s, "ids");
    const tj_node *f = tj_first(d, ids);
    if (!f || f->type != TJ_NUM) return -1;
    return (int32_t)f->u.num;
}

static cinfer_status add_post(cinfer_tokenizer *t, const tj_doc *d, const tj_node *v, char *err, size_t n) {
    if (!v || v->type == TJ_NULL) return CINFER_OK;
    const char *ty = tj_str(tj_get(d, v, "type"));
    if (!ty) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: post_processor without a type");
    if (!strcmp(ty, "Sequence")) {
        const tj_node *l = tj_get(d, v, "processors");
        for (const tj_node *c = tj_first(d, l); c; c = tj_next(d, c)) {
            cinfer_status st = add_post(t, d, c, err, n);
            if (st) return st;
        }
        return CINFER_OK;
    }
    if (!strcmp(ty, "ByteLevel")) return CINFER_OK;  /* offsets only */
    if (!strcmp(ty, "TemplateProcessing")) {
        const tj_node *single = tj_get(d, v, "single"), *specials = tj_get(d, v, "special_tokens");
        int seen_seq = 0;
        for (const tj_node *c = tj_first(d, single); c; c = tj_next(d, c)) {
            if (tj_get(d, c, "Sequence")) { seen_seq = 1; continue; }
            const char *name = tj_str(tj_get(d, tj_get(d, c, "SpecialToken"), "id"));
            int32_t id = name ? special_id(d, specials, name) : -1;
            if (id < 0) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: TemplateProcessing names an unknown special token");
            if (!seen_seq) { if (t->n_pre_ids < 4) t->pre_ids[t->n_pre_ids++] = id; }
            else if (t->n_post_ids < 4) t->post_ids[t->n_post_ids++] = id;
        }
        return CINFER_OK;
    }
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        const tj_node *cls = tj_get(d, v, "cls"), *sep = tj_get(d, v, "sep");
        const tj_node *c0 = tj_first(d, cls), *s0 = tj_first(d, sep);
        const tj_node *ci = c0 ? tj_next(d, c0) : NULL, *si = s0 ? tj_next(d, s0) : NULL;
        if (!ci || !si || ci->type != TJ_NUM || si->type != TJ_NUM)
            return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: %s without cls/sep", ty);
        t->pre_ids[t->n_pre_ids++] = (int32_t)ci->u.num;
        t->post_ids[t->n_post_ids++] = (int32_t)si->u.num;
        return CINFER_OK;
    }
    return cf_err(err, n, CINFER_EUNSUPPORTED, "tokenizer.json: post_processor type \"%s\" is not supported", ty);
}

cinfer_status tok_load_pipeline(cinfer_tokenizer *t, const tj_doc *d, const tj_node *root, char *err, size_t n) {
    cinfer_status st;
    if ((st = add_norm(t, d, tj_get(d, root, "normalizer"), err, n))) return st;
    if ((st = add_pre(t, d, tj_get(d, root, "pre_tokenizer"), err, n))) return st;
    if ((st = add_dec(t, d, tj_get(d, root, "decoder"), err, n))) return st;
    if ((st = add_post(t, d, tj_get(d, root, "post_processor"), err, n))) return st;
    return CINFER_OK;
}
