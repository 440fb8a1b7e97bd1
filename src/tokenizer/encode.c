/*
 * encode.c — cinfer_tokenize: the encode pipeline of HF tokenizers.
 *
 *   text (invalid UTF-8 -> U+FFFD, as Python's errors="replace")
 *   -> split on non-normalized added tokens (raw text)
 *   -> each stretch: normalizer, then split on normalized added tokens
 *   -> each stretch: pre-tokenizer -> BPE per word (bpe.c)
 *   -> post-processor ids around the whole sequence (add_special)
 *
 * Repeated words are common in prose, so words of up to WC_MAXLEN bytes go
 * through a per-call cache (word bytes -> ids); a cache hit skips the merge
 * loop. The cache lives in the call, so the tokenizer stays read-only and
 * thread-safe.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "tokenizer/tokenizer.h"
#include "util.h"

#define WC_MAXLEN 48
#define WC_BITS 14

typedef struct wc_ent { uint64_t h; uint32_t boff, ioff; uint16_t len, n_ids; uint8_t used; } wc_ent;

typedef struct enc {
    const cinfer_tokenizer *t;
    tok_bpe_scratch *sc;
    tok_ids *out;
    tok_buf pbuf;
    tok_spans spans;
    wc_ent *wc;             /* [wc_mask + 1] */
    uint32_t wc_mask;
    tok_buf wc_bytes;       /* word bytes of entries */
    tok_ids wc_ids;         /* ids of entries */
} enc;

static int bpe_cached(enc *e, const char *w, size_t len) {
    if (len > WC_MAXLEN || !e->wc) return tok_bpe_word(e->t, e->sc, w, len, e->out);
    uint64_t h = XXH3_64bits(w, len);
    wc_ent *c = &e->wc[h & e->wc_mask];
    if (c->used && c->h == h && c->len == len && !memcmp(e->wc_bytes.p + c->boff, w, len)) {
        for (uint32_t i = 0; i < c->n_ids; i++)
            if (tok_ids_push(e->out, e->wc_ids.v[c->ioff + i])) return -1;
        return 0;
    }
    size_t before = e->out->n;
    if (tok_bpe_word(e->t, e->sc, w, len, e->out)) return -1;
    size_t nid = e->out->n - before;
    /* a replaced entry's space is not reused: bounded by the text length */
    if (nid > WC_MAXLEN || e->wc_bytes.n + len > 0xffffffffu || e->wc_ids.n + nid > 0xffffffffu) return 0;
    c->boff = (uint32_t)e->wc_bytes.n;
    c->ioff = (uint32_t)e->wc_ids.n;
    if (tok_buf_put(&e->wc_bytes, w, len)) return -1;
    for (size_t i = 0; i < nid; i++)
        if (tok_ids_push(&e->wc_ids, e->out->v[before + i])) return -1;
    c->h = h; c->len = (uint16_t)len; c->n_ids = (uint16_t)nid; c->used = 1;
    return 0;
}

/* may a SentencePiece word be cut before the U+2581 at w[i]? (tokenizer.h) */
static int can_cut(const cinfer_tokenizer *t, const char *w, size_t i) {
    size_t k = i - 1;
    while (k > 0 && ((unsigned char)w[k] & 0xc0) == 0x80) k--;
    int l = tok_utf8_next((const unsigned char *)w + k, i - k);
    if (l <= 0) return 0;
    uint32_t c = tok_utf8_decode((const unsigned char *)w + k, l);
    if (c == 0x2581) return 0;
    for (int j = 0; j < t->n_nosplit; j++)
        if (t->nosplit[j] == c) return 0;
    if (t->nosplit_unknown && tok_strmap_get(&t->vocab, w + k, (size_t)l) < 0) return 0;
    return 1;
}

static int spm_word(enc *e, const char *w, size_t n) {
    size_t start = 0;
    for (size_t i = 1; i + 3 <= n; i++) {
        if ((unsigned char)w[i] != 0xe2 || (unsigned char)w[i + 1] != 0x96 || (unsigned char)w[i + 2] != 0x81) continue;
        if (!can_cut(e->t, w, i)) continue;
        if (bpe_cached(e, w + start, i - start)) return -1;
        start = i;
    }
    return bpe_cached(e, w + start, n - start);
}

static int model_stretch(enc *e, const char *s, size_t n, int first) {
    if (!n) return 0;
    e->pbuf.n = 0;
    if (tok_buf_put(&e->pbuf, s, n)) return -1;
    int rc = tok_pretokenize(e->t, &e->pbuf, &e->spans, first);
    if (rc) return rc;
    for (size_t i = 0; i < e->spans.n; i++) {
        const char *w = e->pbuf.p + e->spans.v[i].off;
        size_t len = e->spans.v[i].len;
        if (e->t->spm_split && !e->t->ignore_merges ? spm_word(e, w, len) : bpe_cached(e, w, len)) return -1;
    }
    return 0;
}

static int segment(enc *e, const char *s, size_t n, int first, int parse_special) {
    const cinfer_tokenizer *t = e->t;
    char *ns = (char *)s;
    size_t nn = n;
    if (t->n_norm) {
        if (tok_normalize(t, s, n, &ns, &nn)) return -1;
    }
    int rc = 0;
    size_t pos = 0;
    while (!rc) {
        size_t ms, me;
        int idx = tok_added_find(t, &t->trie_norm, ns, nn, pos, !parse_special, &ms, &me);
        if (idx < 0) break;
        rc = model_stretch(e, ns + pos, ms - pos, first && pos == 0);
        if (!rc) rc = tok_ids_push(e->out, t->added[idx].id);
        pos = me;
    }
    if (!rc) rc = model_stretch(e, ns + pos, nn - pos, first && pos == 0);
    if (ns != s) free(ns);
    return rc;
}

cinfer_status cinfer_tokenize(const cinfer_tokenizer *t, const char *text, size_t len,
                              int add_special, int parse_special, int32_t **ids, int *n_ids) {
    if (!ids || !n_ids) return CINFER_EINVAL;
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return CINFER_EINVAL;
    if (len > (size_t)1 << 30) return CINFER_EINVAL;
    size_t n;
    char *s = tok_utf8_sanitize(text ? text : "", len, &n);
    if (!s) return CINFER_ENOMEM;
    tok_ids out = {0};
    enc e = {.t = t, .out = &out};
    e.sc = tok_bpe_scratch_new();
    if (n >= 256) {
        /* about one slot per 8 bytes of text: a short text pays little */
        uint32_t cap = 64;
        while (cap < (1u << WC_BITS) && cap * 8 < n) cap *= 2;
        e.wc = calloc(cap, sizeof *e.wc);
        e.wc_mask = cap - 1;
    }
    int rc = e.sc ? 0 : -1;
    if (add_special)
        for (int i = 0; i < t->n_pre_ids && !rc; i++) rc = tok_ids_push(&out, t->pre_ids[i]);
    size_t pos = 0;
    while (!rc) {
        size_t ms, me;
        int idx = tok_added_find(t, &t->trie_raw, s, n, pos, !parse_special, &ms, &me);
        if (idx < 0) break;
        rc = segment(&e, s + pos, ms - pos, pos == 0, parse_special);
        if (!rc) rc = tok_ids_push(&out, t->added[idx].id);
        pos = me;
    }
    if (!rc) rc = segment(&e, s + pos, n - pos, pos == 0, parse_special);
    if (add_special)
        for (int i = 0; i < t->n_post_ids && !rc; i++) rc = tok_ids_push(&out, t->post_ids[i]);
    if (!rc && out.n > 0x7fffffff) rc = -1;
    free(s);
    free(e.pbuf.p);
    free(e.spans.v);
    free(e.wc);
    free(e.wc_bytes.p);
    free(e.wc_ids.v);
    tok_bpe_scratch_free(e.sc);
    if (rc) { free(out.v); return rc == -2 ? CINFER_EUNSUPPORTED : CINFER_ENOMEM; }
    if (!out.v) out.v = malloc(sizeof(int32_t));
    if (!out.v) return CINFER_ENOMEM;
    *ids = out.v;
    *n_ids = (int)out.n;
    return CINFER_OK;
}
