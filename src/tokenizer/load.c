/*
 * load.c — cinfer_tokenizer_load / _free and the small accessors.
 *
 * Reads DIR/tokenizer.json with the in-place reader (tok-json.c) and
 * DIR/tokenizer_config.json (optional) with jansson. Only the BPE model is
 * supported; every id in the file is range-checked before it indexes an
 * array; merges may be "a b" strings or ["a", "b"] pairs and must name
 * tokens of the vocabulary (as HF requires).
 *
 * BOS/EOS added by cinfer_tokenize(add_special=1): tokenizer_config.json's
 * add_bos_token / add_eos_token when present (what transformers' Llama and
 * Gemma tokenizers do), else tokenizer.json's post_processor template.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok-json.h"
#include "tokenizer/tokenizer.h"
#include "util.h"

#define MAX_VOCAB (1 << 24)

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

static int id_of(const tj_node *v, int32_t *out) {
    if (!v || v->type != TJ_NUM || v->u.num < 0 || v->u.num >= MAX_VOCAB || v->u.num != (double)(int32_t)v->u.num)
        return 0;
    *out = (int32_t)v->u.num;
    return 1;
}

/* byte-level: the raw bytes a GPT-2-mapped piece stands for, written to o
 * (at most n bytes); -1 if a char is outside the map (such a piece can never
 * be produced by encoding) */
static long unmap_into(const char *s, size_t n, char *o) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int l = tok_utf8_next((const unsigned char *)s + i, n - i);
        if (l <= 0) return -1;
        int b = tok_cp_to_byte(tok_utf8_decode((const unsigned char *)s + i, l));
        if (b < 0) return -1;
        o[k++] = (char)b;
        i += (size_t)l;
    }
    return (long)k;
}

static char *unmap_bytes(const char *s, size_t n, uint32_t *out_len) {
    char *o = malloc(n + 1);
    if (!o) return NULL;
    long k = unmap_into(s, n, o);
    if (k < 0) { free(o); return NULL; }
    o[k] = 0;
    *out_len = (uint32_t)k;
    return o;
}

static cinfer_status load_vocab(cinfer_tokenizer *t, const tj_doc *d, const tj_node *vocab,
                                const tj_node *added, const char *path, char *err, size_t n) {
    int32_t max_id = -1, id;
    for (const tj_node *c = tj_first(d, vocab); c; c = tj_next(d, c)) {
        if (!id_of(c, &id)) return cf_err(err, n, CINFER_EFORMAT, "%s: vocab entry \"%.40s\" has a bad id", path, c->key);
        if (id > max_id) max_id = id;
    }
    for (const tj_node *c = tj_first(d, added); c; c = tj_next(d, c)) {
        if (!id_of(tj_get(d, c, "id"), &id) || !tj_str(tj_get(d, c, "content")))
            return cf_err(err, n, CINFER_EFORMAT, "%s: added_tokens entry without a valid id/content", path);
        if (id > max_id) max_id = id;
    }
    if (max_id < 0) return cf_err(err, n, CINFER_EFORMAT, "%s: empty vocabulary", path);
    int nv = max_id + 1;
    t->n_vocab = nv;
    t->piece = calloc((size_t)nv, sizeof *t->piece);
    t->piece_len = calloc((size_t)nv, sizeof *t->piece_len);
    t->key = calloc((size_t)nv, sizeof *t->key);
    t->key_len = calloc((size_t)nv, sizeof *t->key_len);
    t->is_special = calloc((size_t)nv, 1);
    t->is_added = calloc((size_t)nv, 1);
    if (!t->piece || !t->piece_len || !t->key || !t->key_len || !t->is_special || !t->is_added) return CINFER_ENOMEM;
    /* keys live in one pool in file order: fewer cache misses when the
     * merges are resolved against the hash table */
    size_t total = 1;
    for (const tj_node *c = tj_first(d, vocab); c; c = tj_next(d, c)) total += (size_t)c->klen + 1;
    t->key_pool = malloc(total);
    if (!t->key_pool) return CINFER_ENOMEM;
    size_t off = 0;
    for (const tj_node *c = tj_first(d, vocab); c; c = tj_next(d, c)) {
        id_of(c, &id);
        free(t->piece[id]);
        t->key[id] = NULL;
        t->piece[id] = dupn(c->key, c->klen);
        if (!t->piece[id]) return CINFER_ENOMEM;
        t->piece_len[id] = c->klen;
        char *k = t->key_pool + off;
        long kl = c->klen;
        if (t->byte_level) kl = unmap_into(c->key, c->klen, k);
        else memcpy(k, c->key, c->klen);
        if (kl < 0) continue;
        k[kl] = 0;
        t->key[id] = k;
        t->key_len[id] = (uint32_t)kl;
        off += (size_t)kl + 1;
    }
    if (tok_strmap_build(&t->vocab, (const char *const *)t->key, t->key_len, nv)) return CINFER_ENOMEM;
    return CINFER_OK;
}

static int32_t model_id(const cinfer_tokenizer *t, const char *s, size_t len) {
    if (!t->byte_level) return tok_strmap_get(&t->vocab, s, len);
    uint32_t kl;
    char *k = unmap_bytes(s, len, &kl);
    if (!k) return -1;
    int32_t id = tok_strmap_get(&t->vocab, k, kl);
    free(k);
    return id;
}

static cinfer_status load_merges(cinfer_tokenizer *t, const tj_doc *d, const tj_node *merges, const char *path,
                                 char *err, size_t n) {
    if (!merges || merges->type == TJ_NULL) return CINFER_OK;
    if (merges->type != TJ_ARR) return cf_err(err, n, CINFER_EFORMAT, "%s: model.merges is not a list", path);
    if (tok_merges_alloc(t, merges->len)) return CINFER_ENOMEM;
    uint32_t rank = 0;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (const tj_node *c = tj_first(d, merges); c; c = tj_next(d, c), rank++) {
        const char *a, *b;
        size_t al, bl;
        if (c->type == TJ_STR) {
            const char *sp = memchr(c->u.s, ' ', c->len);
            if (!sp) { free(tmp); return cf_err(err, n, CINFER_EFORMAT, "%s: merge %u \"%.40s\" has no space", path, rank, c->u.s); }
            a = c->u.s; al = (size_t)(sp - a); b = sp + 1; bl = c->len - al - 1;
        } else if (c->type == TJ_ARR && c->len == 2 && tj_first(d, c)->type == TJ_STR &&
                   tj_next(d, tj_first(d, c))->type == TJ_STR) {
            const tj_node *x = tj_first(d, c), *y = tj_next(d, x);
            a = x->u.s; al = x->len; b = y->u.s; bl = y->len;
        } else { free(tmp); return cf_err(err, n, CINFER_EFORMAT, "%s: merge %u is neither \"a b\" nor [a, b]", path, rank); }
        if (al + bl > tmp_cap) {
            tmp_cap = (al + bl) * 2 + 64;
            char *nt = realloc(tmp, tmp_cap);
            if (!nt) { free(tmp); return CINFER_ENOMEM; }
            tmp = nt;
        }
        /* with a continuing_subword_prefix the merged token drops b's prefix (HF) */
        size_t skip = 0, pl = t->cont_prefix ? strlen(t->cont_prefix) : 0;
        if (pl && bl >= pl && !memcmp(b, t->cont_prefix, pl)) skip = pl;
        memcpy(tmp, a, al);
        memcpy(tmp + al, b + skip, bl - skip);
        int32_t ia = model_id(t, a, al), ib = model_id(t, b, bl), im = model_id(t, tmp, al + bl - skip);
        if (ia < 0 || ib < 0 || im < 0) {
            free(tmp);
            return cf_err(err, n, CINFER_EFORMAT, "%s: merge %u (\"%.*s\" \"%.*s\") names a token missing from the vocab",
                          path, rank, (int)(al > 40 ? 40 : al), a, (int)(bl > 40 ? 40 : bl), b);
        }
        tok_merges_put(t, ia, ib, rank, im);
    }
    free(tmp);
    return CINFER_OK;
}

static cinfer_status load_added(cinfer_tokenizer *t, const tj_doc *d, const tj_node *added, char *err, size_t n) {
    if (!added || added->type == TJ_NULL) return CINFER_OK;
    if (added->type != TJ_ARR) return cf_err(err, n, CINFER_EFORMAT, "tokenizer.json: added_tokens is not a list");
    t->added = calloc(added->len ? added->len : 1, sizeof *t->added);
    if (!t->added) return CINFER_ENOMEM;
    for (const tj_node *c = tj_first(d, added); c; c = tj_next(d, c)) {
        tok_added *a = &t->added[t->n_added];
        const tj_node *ct = tj_get(d, c, "content");
        id_of(tj_get(d, c, "id"), &a->id);
        a->special = (uint8_t)tj_bool(tj_get(d, c, "special"), 0);
        a->lstrip = (uint8_t)tj_bool(tj_get(d, c, "lstrip"), 0);
        a->rstrip = (uint8_t)tj_bool(tj_get(d, c, "rstrip"), 0);
        a->single_word = (uint8_t)tj_bool(tj_get(d, c, "single_word"), 0);
        a->normalized = (uint8_t)tj_bool(tj_get(d, c, "normalized"), !a->special);
        free(t->piece[a->id]);
        t->piece[a->id] = dupn(ct->u.s, ct->len);
        if (!t->piece[a->id]) return CINFER_ENOMEM;
        t->piece_len[a->id] = ct->len;
        t->is_added[a->id] = 1;
        t->is_special[a->id] = a->special;
        if (a->normalized && t->n_norm) {
            if (tok_normalize(t, ct->u.s, ct->len, &a->content, &a->len)) return CINFER_ENOMEM;
        } else {
            a->content = dupn(ct->u.s, ct->len);
            a->len = ct->len;
            if (!a->content) return CINFER_ENOMEM;
        }
        if (tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len, t->n_added))
            return CINFER_ENOMEM;
        t->n_added++;
    }
    return CINFER_OK;
}

/* "tok" or {"content": "tok"} -> malloc'd string or NULL */
static char *token_str(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

static int32_t piece_id(const cinfer_tokenizer *t, const char *s) {
    size_t l = strlen(s);
    for (int i = 0; i < t->n_added; i++)
        if (t->piece_len[t->added[i].id] == l && !memcmp(t->piece[t->added[i].id], s, l)) return t->added[i].id;
    return model_id(t, s, l);
}

/* chat_template.jinja beside the config (newer transformers) wins */
static cinfer_status load_jinja(cinfer_tokenizer *t, const char *dir, char *err, size_t n) {
    char *path = cf_path(dir, "chat_template.jinja");
    if (!path) return CINFER_ENOMEM;
    cinfer_status st = CINFER_OK;
    if (cf_file_exists(path)) {
        char *src;
        st = cf_read_file(path, &src, NULL, err, n);
        if (!st) { free(t->chat_template); t->chat_template = src; }
    }
    free(path);
    return st;
}

static cinfer_status load_config(cinfer_tokenizer *t, const char *dir, char *err, size_t n) {
    char *path = cf_path(dir, "tokenizer_config.json");
    if (!path) return CINFER_ENOMEM;
    t->bos = t->n_pre_ids ? t->pre_ids[0] : -1;
    t->eos = -1;
    if (!cf_file_exists(path)) { free(path); return load_jinja(t, dir, err, n); }
    json_error_t je;
    json_t *root = json_load_file(path, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
    if (!root || !json_is_object(root)) {
        cinfer_status st = cf_err(err, n, CINFER_EFORMAT, "%s: line %d: %s", path, je.line, root ? "not an object" : je.text);
        json_decref(root);
        free(path);
        return st;
    }
    free(path);
    /* the special-token strings transformers passes to chat templates */
    json_t *vars = json_object();
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    for (size_t i = 0; vars && i < sizeof names / sizeof *names; i++) {
        char *v = token_str(json_object_get(root, names[i]));
        if (v) json_object_set_new(vars, names[i], json_string(v));
        free(v);
    }
    json_t *extra = json_object_get(root, "extra_special_tokens");
    const char *ek;
    json_t *ev;
    if (vars && json_is_object(extra))
        json_object_foreach(extra, ek, ev) {
            char *v = token_str(ev);
            if (v) json_object_set_new(vars, ek, json_string(v));
            free(v);
        }
    t->chat_vars = vars ? json_dumps(vars, JSON_COMPACT) : NULL;
    json_decref(vars);
    t->bos_str = token_str(json_object_get(root, "bos_token"));
    t->eos_str = token_str(json_object_get(root, "eos_token"));
    if (t->bos_str) t->bos = piece_id(t, t->bos_str);
    if (t->eos_str) t->eos = piece_id(t, t->eos_str);
    json_t *ab = json_object_get(root, "add_bos_token"), *ae = json_object_get(root, "add_eos_token");
    if (json_is_boolean(ab)) {
        t->n_pre_ids = 0;
        if (json_is_true(ab) && t->bos >= 0) t->pre_ids[t->n_pre_ids++] = t->bos;
    }
    if (json_is_boolean(ae)) {
        t->n_post_ids = 0;
        if (json_is_true(ae) && t->eos >= 0) t->post_ids[t->n_post_ids++] = t->eos;
    }
    json_t *ct = json_object_get(root, "chat_template");
    if (json_is_string(ct)) t->chat_template = strdup(json_string_value(ct));
    else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            json_t *tp = json_object_get(e, "template");
            if (name && !strcmp(name, "default") && json_is_string(tp)) t->chat_template = strdup(json_string_value(tp));
        }
    }
    json_decref(root);
    return load_jinja(t, dir, err, n);
}

/* see tokenizer.h: which chars before U+2581 forbid cutting a word there */
static void spm_split_setup(cinfer_tokenizer *t) {
    static const char mark[] = "\xe2\x96\x81";
    if (t->byte_level || t->cont_prefix || t->end_suffix) return;
    /* the cut's right symbol must be the mark itself, not byte-fallback pieces */
    if (tok_strmap_get(&t->vocab, mark, 3) < 0) return;
    for (int id = 0; id < t->n_vocab; id++) {
        const char *p = t->key[id];
        if (!p) continue;
        size_t n = t->key_len[id];
        for (const char *q = p; (q = memmem(q, n - (size_t)(q - p), mark, 3)) != NULL; q += 3) {
            if (q == p) continue;
            size_t k = (size_t)(q - p) - 1;
            while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
            int l = tok_utf8_next((const unsigned char *)p + k, (size_t)(q - p) - k);
            if (l <= 0) return;  /* not UTF-8: give up the optimisation */
            uint32_t c = tok_utf8_decode((const unsigned char *)p + k, l);
            if (c == 0x2581) continue;
            int seen = 0;
            for (int i = 0; i < t->n_nosplit; i++) seen |= t->nosplit[i] == c;
            if (seen) continue;
            if (t->n_nosplit == 16) return;
            t->nosplit[t->n_nosplit++] = c;
            /* byte-fallback and unk symbols end in '>' */
            if (c == '>') t->nosplit_unknown = 1;
        }
    }
    t->spm_split = 1;
}

static cinfer_status load_json(cinfer_tokenizer *t, const char *dir, const char *path, char *buf, size_t len,
                               char *err, size_t n) {
    tj_doc d;
    char e2[200];
    if (tj_parse(&d, buf, len, e2, sizeof e2)) return cf_err(err, n, CINFER_EFORMAT, "%s: %s", path, e2);
    cinfer_status st = CINFER_OK;
    const tj_node *root = &d.n[0];
    const tj_node *model = tj_get(&d, root, "model");
    if (root->type != TJ_OBJ || !model || model->type != TJ_OBJ) {
        st = cf_err(err, n, CINFER_EFORMAT, "%s: no \"model\" object", path);
        goto done;
    }
    const char *ty = tj_str(tj_get(&d, model, "type"));
    if (ty && strcmp(ty, "BPE")) {
        st = cf_err(err, n, CINFER_EUNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", path, ty);
        goto done;
    }
    const tj_node *vocab = tj_get(&d, model, "vocab"), *added = tj_get(&d, root, "added_tokens");
    if (!vocab || vocab->type != TJ_OBJ) {
        st = cf_err(err, n, CINFER_EFORMAT, "%s: model.vocab is not an object", path);
        goto done;
    }
    if (added && added->type != TJ_ARR && added->type != TJ_NULL) {
        st = cf_err(err, n, CINFER_EFORMAT, "%s: added_tokens is not a list", path);
        goto done;
    }
    if ((st = tok_load_pipeline(t, &d, root, err, n))) goto done;
    if ((st = load_vocab(t, &d, vocab, added, path, err, n))) goto done;
    t->byte_fallback = tj_bool(tj_get(&d, model, "byte_fallback"), 0);
    t->fuse_unk = tj_bool(tj_get(&d, model, "fuse_unk"), 0);
    t->ignore_merges = tj_bool(tj_get(&d, model, "ignore_merges"), 0);
    const char *cp = tj_str(tj_get(&d, model, "continuing_subword_prefix"));
    const char *es = tj_str(tj_get(&d, model, "end_of_word_suffix"));
    if (cp && *cp) t->cont_prefix = strdup(cp);
    if (es && *es) t->end_suffix = strdup(es);
    if ((st = load_merges(t, &d, tj_get(&d, model, "merges"), path, err, n))) goto done;
    const char *unk = tj_str(tj_get(&d, model, "unk_token"));
    t->unk_id = unk ? tok_strmap_get(&t->vocab, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0 && !t->byte_level) {
        st = cf_err(err, n, CINFER_EFORMAT, "%s: unk_token \"%.40s\" is not in the vocab", path, unk);
        goto done;
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) {
            char c = (char)b;
            t->byte_id[b] = tok_strmap_get(&t->vocab, &c, 1);
        } else {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            t->byte_id[b] = t->byte_fallback ? tok_strmap_get(&t->vocab, hex, 6) : -1;
        }
    }
    spm_split_setup(t);
    if ((st = load_added(t, &d, added, err, n))) goto done;
    for (int i = 0; i < t->n_pre_ids; i++)
        if (t->pre_ids[i] >= t->n_vocab) { st = cf_err(err, n, CINFER_EFORMAT, "%s: post_processor id out of range", path); goto done; }
    for (int i = 0; i < t->n_post_ids; i++)
        if (t->post_ids[i] >= t->n_vocab) { st = cf_err(err, n, CINFER_EFORMAT, "%s: post_processor id out of range", path); goto done; }
    st = load_config(t, dir, err, n);
done:
    tj_free(&d);
    return st;
}

cinfer_status cinfer_tokenizer_load(const char *dir, cinfer_tokenizer **out, char *err, size_t err_len) {
    if (!out) return cf_err(err, err_len, CINFER_EINVAL, "cinfer_tokenizer_load: out is NULL");
    *out = NULL;
    if (!dir) return cf_err(err, err_len, CINFER_EINVAL, "cinfer_tokenizer_load: dir is NULL");
    char *path = cf_path(dir, "tokenizer.json");
    if (!path) return CINFER_ENOMEM;
    if (!cf_file_exists(path)) {
        cinfer_status st = cf_err(err, err_len, CINFER_ENOTFOUND, "%s: no tokenizer.json", dir);
        free(path);
        return st;
    }
    char *buf;
    size_t len;
    cinfer_status st = cf_read_file(path, &buf, &len, err, err_len);
    if (st) { free(path); return st; }
    cinfer_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { free(buf); free(path); return CINFER_ENOMEM; }
    t->unk_id = -1;
    t->bos = t->eos = -1;
    st = load_json(t, dir, path, buf, len, err, err_len);
    free(buf);
    free(path);
    if (st) {
        if (st == CINFER_ENOMEM) cf_err(err, err_len, st, "%s: out of memory loading the tokenizer", dir);
        cinfer_tokenizer_free(t);
        return st;
    }
    *out = t;
    return CINFER_OK;
}

void cinfer_tokenizer_free(cinfer_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_vocab; i++) {
        free(t->piece[i]);
    }
    free(t->piece); free(t->piece_len); free(t->key); free(t->key_len); free(t->key_pool);
    free(t->is_special); free(t->is_added);
    tok_strmap_free(&t->vocab);
    free(t->merges);
    free(t->cont_prefix); free(t->end_suffix);
    for (int i = 0; i < t->n_norm; i++) {
        free(t->norm[i].a); free(t->norm[i].b);
        pcre2_code_free(t->norm[i].re);
    }
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    free(t->pre);
    free(t->dec_repl_from); free(t->dec_repl_to);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    free(t->chat_template); free(t->bos_str); free(t->eos_str); free(t->chat_vars);
    free(t);
}

int cinfer_tokenizer_n_vocab(const cinfer_tokenizer *t) { return t ? t->n_vocab : 0; }
int cinfer_tokenizer_bos(const cinfer_tokenizer *t) { return t ? t->bos : -1; }
int cinfer_tokenizer_eos(const cinfer_tokenizer *t) { return t ? t->eos : -1; }

const char *cinfer_token_piece(const cinfer_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    return t->piece[id];
}
