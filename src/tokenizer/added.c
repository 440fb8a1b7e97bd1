/*
 * added.c — added-token matching: a byte trie over the tokens' contents and
 * HF's AddedVocabulary::find_matches rules.
 *
 * Matches are leftmost-longest and non-overlapping (HF uses an Aho-Corasick
 * automaton in LeftmostLongest mode). A match that is skipped (a special
 * token while specials are encoded as text, or a single_word token touching
 * a word character) still consumes its bytes, as HF's iterator does. lstrip
 * and rstrip widen an accepted match over neighbouring Unicode whitespace,
 * never back past the previous match.
 */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

static uint32_t th(uint32_t k) {
    k ^= k >> 16; k *= 0x7feb352dU; k ^= k >> 15; k *= 0x846ca68bU; k ^= k >> 16;
    return k;
}

static int trie_grow(tok_trie *tr) {
    uint32_t nc = tr->cap ? tr->cap * 2 : 1024;
    uint32_t *nk = calloc(nc, sizeof *nk), *nv = malloc(nc * sizeof *nv);
    if (!nk || !nv) { free(nk); free(nv); return -1; }
    for (uint32_t i = 0; i < tr->cap; i++) {
        if (!tr->key[i]) continue;
        uint32_t h = th(tr->key[i]) & (nc - 1);
        while (nk[h]) h = (h + 1) & (nc - 1);
        nk[h] = tr->key[i];
        nv[h] = tr->val[i];
    }
    free(tr->key);
    free(tr->val);
    tr->key = nk;
    tr->val = nv;
    tr->cap = nc;
    return 0;
}

static int64_t child(const tok_trie *tr, uint32_t node, uint8_t b) {
    if (!tr->cap) return -1;
    uint32_t k = ((node << 8) | b) + 1, h = th(k) & (tr->cap - 1);
    for (;;) {
        if (!tr->key[h]) return -1;
        if (tr->key[h] == k) return tr->val[h];
        h = (h + 1) & (tr->cap - 1);
    }
}

static int new_node(tok_trie *tr) {
    if (tr->n_nodes == tr->n_term_cap) {
        uint32_t nc = tr->n_term_cap ? tr->n_term_cap * 2 : 256;
        int32_t *t = realloc(tr->term, nc * sizeof *t);
        if (!t) return -1;
        tr->term = t;
        tr->n_term_cap = nc;
    }
    tr->term[tr->n_nodes] = -1;
    return (int)tr->n_nodes++;
}

int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t idx) {
    if (!n) return 0;
    if (!tr->n_nodes && new_node(tr) < 0) return -1;
    if (tr->n_nodes + n >= (1u << 23)) return -1;  /* node ids must fit 24 bits */
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int64_t c = child(tr, node, b);
        if (c < 0) {
            if ((tr->n_nodes + 1) * 2 > tr->cap && trie_grow(tr)) return -1;
            int nn = new_node(tr);
            if (nn < 0) return -1;
            uint32_t k = ((node << 8) | b) + 1, h = th(k) & (tr->cap - 1);
            while (tr->key[h]) h = (h + 1) & (tr->cap - 1);
            tr->key[h] = k;
            tr->val[h] = (uint32_t)nn;
            c = nn;
        }
        node = (uint32_t)c;
    }
    if (tr->term[node] < 0) tr->term[node] = idx;
    tr->first[(uint8_t)s[0]] = 1;
    return 0;
}

void tok_trie_free(tok_trie *tr) {
    free(tr->key);
    free(tr->val);
    free(tr->term);
    memset(tr, 0, sizeof *tr);
}

static uint32_t last_char(const char *s, size_t start) {
    size_t k = start - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
    int l = tok_utf8_next((const unsigned char *)s + k, start - k);
    return l > 0 ? tok_utf8_decode((const unsigned char *)s + k, l) : 0xfffd;
}

static uint32_t next_char(const char *s, size_t n, size_t at, int *len) {
    int l = tok_utf8_next((const unsigned char *)s + at, n - at);
    if (l <= 0) { *len = 1; return 0xfffd; }
    *len = l;
    return tok_utf8_decode((const unsigned char *)s + at, l);
}

/* *pos: where to search from (advanced past skipped matches); floor: end of
 * the previous accepted match. Returns added[] index or -1. */
int tok_added_find(const cinfer_tokenizer *t, const tok_trie *tr, const char *s, size_t n, size_t from,
                   int skip_special, size_t *ms, size_t *me) {
    size_t floor = from, pos = from;
    if (!tr->n_nodes) return -1;
    while (pos < n) {
        size_t i = pos;
        int idx = -1;
        size_t end = 0;
        for (; i < n; i++) {
            if (!tr->first[(uint8_t)s[i]]) continue;
            uint32_t node = 0;
            for (size_t j = i; j < n; j++) {
                int64_t c = child(tr, node, (uint8_t)s[j]);
                if (c < 0) break;
                node = (uint32_t)c;
                if (tr->term[node] >= 0) { idx = tr->term[node]; end = j + 1; }
            }
            if (idx >= 0) break;
        }
        if (idx < 0) return -1;
        const tok_added *a = &t->added[idx];
        size_t start = i, stop = end;
        pos = end;
        if (skip_special && a->special) continue;
        if (a->single_word) {
            int start_space = start == 0 || !tok_is_word_char(last_char(s, start));
            int l;
            int stop_space = stop == n || !tok_is_word_char(next_char(s, n, stop, &l));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = ns - 1;
                while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
                int l = tok_utf8_next((const unsigned char *)s + k, ns - k);
                if (l <= 0 || !tok_is_whitespace(tok_utf8_decode((const unsigned char *)s + k, l))) break;
                ns = k;
            }
            start = ns > floor ? ns : floor;
        }
        if (a->rstrip) {
            while (stop < n) {
                int l;
                uint32_t c = next_char(s, n, stop, &l);
                if (!tok_is_whitespace(c)) break;
                stop += (size_t)l;
            }
        }
        *ms = start;
        *me = stop;
        return idx;
    }
    return -1;
}
