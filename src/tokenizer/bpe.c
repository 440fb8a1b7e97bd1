/*
 * bpe.c — the BPE model: vocabulary hash, merge table, and the merge loop
 * for one pre-tokenized word.
 *
 * Matches HF tokenizers' BPE::merge_word + Word::merge_all exactly: a word
 * starts as one symbol per char (per byte for byte-level vocabularies);
 * unknown chars go to <0xXX> byte tokens (byte_fallback) or to unk (fused
 * when fuse_unk); then merges are applied lowest rank first, ties broken by
 * the leftmost position, through a binary heap with lazily discarded stale
 * entries. ignore_merges returns a word that is itself in the vocabulary as
 * one token. Cost is O(n log n) in the word's symbols, which matters: SPM
 * tokenizers without a pre-tokenizer hand whole paragraphs in as one word.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "tokenizer/tokenizer.h"

/* ------------------------------------------------------------ strmap */

/* a slot holds a tag (24 hash bits, the low 8 bits of the key length) and
 * id + 1: a probe touches the key bytes only when the tag matches */
int tok_strmap_build(tok_strmap *m, const char *const *key, const uint32_t *klen, int n) {
    uint32_t cap = 16;
    while (cap < (uint32_t)n * 2u + 16u) cap *= 2;
    m->slot = calloc(cap, sizeof *m->slot);
    if (!m->slot) return -1;
    m->cap = cap;
    m->key = key;
    m->klen = klen;
    for (int id = 0; id < n; id++) {
        if (!key[id]) continue;
        uint64_t hv = XXH3_64bits(key[id], klen[id]);
        uint32_t h = (uint32_t)hv & (cap - 1);
        uint64_t tag = (hv >> 40 << 40) | (uint64_t)(klen[id] & 0xff) << 32;
        for (;;) {
            uint64_t s = m->slot[h];
            if (!s) { m->slot[h] = tag | ((uint32_t)id + 1); break; }
            uint32_t o = (uint32_t)s - 1;
            /* duplicate key: HF keeps the last id for a key (map insert) */
            if ((s >> 32 << 32) == tag && klen[o] == klen[id] && !memcmp(key[o], key[id], klen[id])) {
                m->slot[h] = tag | ((uint32_t)id + 1);
                break;
            }
            h = (h + 1) & (cap - 1);
        }
    }
    return 0;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t len) {
    if (!m->slot) return -1;
    uint64_t hv = XXH3_64bits(s, len);
    uint32_t h = (uint32_t)hv & (m->cap - 1);
    uint64_t tag = (hv >> 40 << 40) | (uint64_t)(len & 0xff) << 32;
    for (;;) {
        uint64_t v = m->slot[h];
        if (!v) return -1;
        if ((v >> 32 << 32) == tag) {
            uint32_t id = (uint32_t)v - 1;
            if (m->klen[id] == len && !memcmp(m->key[id], s, len)) return (int32_t)id;
        }
        h = (h + 1) & (m->cap - 1);
    }
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slot);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------ merges */

static inline uint32_t mhash(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL; k ^= k >> 33;
    return (uint32_t)k;
}

int tok_merges_alloc(cinfer_tokenizer *t, size_t n) {
    uint32_t cap = 16;
    while (cap < n + n / 2 + 16) {
        if (cap >= 0x40000000u) return -1;
        cap *= 2;
    }
    t->merges = calloc(cap, sizeof *t->merges);
    if (!t->merges) return -1;
    t->merge_cap = cap;
    return 0;
}

void tok_merges_put(cinfer_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t h = mhash(k) & (t->merge_cap - 1);
    while (t->merges[h].key && t->merges[h].key != k) h = (h + 1) & (t->merge_cap - 1);
    /* a repeated pair keeps its last rank, as HF's map does */
    t->merges[h] = (tok_merge){k, rank, id};
}

static inline int merge_get(const cinfer_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    if (!t->merge_cap) return 0;
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t h = mhash(k) & (t->merge_cap - 1);
    for (;;) {
        const tok_merge *e = &t->merges[h];
        if (!e->key) return 0;
        if (e->key == k) { *rank = e->rank; *id = e->id; return 1; }
        h = (h + 1) & (t->merge_cap - 1);
    }
}

/* ------------------------------------------------------------ word merge */

typedef struct sym { int32_t id; int32_t prev, next; uint32_t len; } sym;
typedef struct hent { uint32_t rank, pos; int32_t id; } hent;

struct tok_bpe_scratch {
    sym *s; size_t s_cap;
    hent *h; size_t h_n, h_cap;
    char *tmp; size_t tmp_cap;
};

tok_bpe_scratch *tok_bpe_scratch_new(void) {
    return calloc(1, sizeof(tok_bpe_scratch));
}

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
    if (!s) return;
    free(s->s);
    free(s->h);
    free(s->tmp);
    free(s);
}

static inline int hless(const hent *a, const hent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int hpush(tok_bpe_scratch *sc, uint32_t rank, uint32_t pos, int32_t id) {
    if (sc->h_n == sc->h_cap) {
        size_t nc = sc->h_cap ? sc->h_cap * 2 : 64;
        hent *h = realloc(sc->h, nc * sizeof *h);
        if (!h) return -1;
        sc->h = h;
        sc->h_cap = nc;
    }
    size_t i = sc->h_n++;
    hent e = {rank, pos, id};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &sc->h[p])) break;
        sc->h[i] = sc->h[p];
        i = p;
    }
    sc->h[i] = e;
    return 0;
}

static hent hpop(tok_bpe_scratch *sc) {
    hent top = sc->h[0];
    hent last = sc->h[--sc->h_n];
    size_t i = 0, n = sc->h_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const hent *best = &last;
        if (l < n && hless(&sc->h[l], best)) { m = l; best = &sc->h[l]; }
        if (r < n && hless(&sc->h[r], best)) { m = r; best = &sc->h[r]; }
        if (m == i) break;
        sc->h[i] = sc->h[m];
        i = m;
    }
    if (n) sc->h[i] = last;
    return top;
}

static int add_sym(tok_bpe_scratch *sc, size_t *n, int32_t id, uint32_t len) {
    if (*n == sc->s_cap) {
        size_t nc = sc->s_cap ? sc->s_cap * 2 : 64;
        sym *s = realloc(sc->s, nc * sizeof *s);
        if (!s) return -1;
        sc->s = s;
        sc->s_cap = nc;
    }
    sym *s = &sc->s[*n];
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = (int32_t)*n + 1;
    (*n)++;
    return 0;
}

/* vocab lookup of a char with optional prefix/suffix decorations */
static int32_t lookup_decorated(const cinfer_tokenizer *t, tok_bpe_scratch *sc, const char *c, size_t cl,
                                int first, int last) {
    const char *pre = (!first && t->cont_prefix) ? t->cont_prefix : NULL;
    const char *suf = (last && t->end_suffix) ? t->end_suffix : NULL;
    if (!pre && !suf) return tok_strmap_get(&t->vocab, c, cl);
    size_t pl = pre ? strlen(pre) : 0, sl = suf ? strlen(suf) : 0, n = pl + cl + sl;
    if (n > sc->tmp_cap) {
        char *p = realloc(sc->tmp, n);
        if (!p) return -2;
        sc->tmp = p;
        sc->tmp_cap = n;
    }
    if (pl) memcpy(sc->tmp, pre, pl);
    memcpy(sc->tmp + pl, c, cl);
    if (sl) memcpy(sc->tmp + pl + cl, suf, sl);
    return tok_strmap_get(&t->vocab, sc->tmp, n);
}

/* Short words: the same order of merges (lowest rank, then leftmost) by a
 * linear scan over a compact array of pair ranks; cheaper than the heap
 * below that size. Equivalent to the heap because a pair's position only
 * ever gains a longer (so different) token, so no stale entry can match. */
#define SMALL_WORD 48
static int merge_small(const cinfer_tokenizer *t, const sym *in, size_t n, tok_ids *out) {
    int32_t id[SMALL_WORD], nid[SMALL_WORD];
    uint32_t rk[SMALL_WORD];
    int m = (int)n;
    for (int i = 0; i < m; i++) id[i] = in[i].id;
    for (int i = 0; i + 1 < m; i++)
        if (!merge_get(t, id[i], id[i + 1], &rk[i], &nid[i])) rk[i] = UINT32_MAX;
    while (m > 1) {
        int best = 0;
        for (int i = 1; i + 1 < m; i++)
            if (rk[i] < rk[best]) best = i;
        if (rk[best] == UINT32_MAX) break;
        id[best] = nid[best];
        /* drop symbol best+1 and pair best+1 */
        if (m - best - 2 > 0) memmove(id + best + 1, id + best + 2, (size_t)(m - best - 2) * sizeof *id);
        if (m - best - 3 > 0) {
            memmove(rk + best + 1, rk + best + 2, (size_t)(m - best - 3) * sizeof *rk);
            memmove(nid + best + 1, nid + best + 2, (size_t)(m - best - 3) * sizeof *nid);
        }
        m--;
        if (best > 0 && !merge_get(t, id[best - 1], id[best], &rk[best - 1], &nid[best - 1])) rk[best - 1] = UINT32_MAX;
        if (best + 1 < m && !merge_get(t, id[best], id[best + 1], &rk[best], &nid[best])) rk[best] = UINT32_MAX;
    }
    for (int i = 0; i < m; i++)
        if (tok_ids_push(out, id[i])) return -1;
    return 0;
}

int tok_bpe_word(const cinfer_tokenizer *t, tok_bpe_scratch *sc, const char *w, size_t len, tok_ids *out) {
    if (!len) return 0;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, w, len);
        if (id >= 0) return tok_ids_push(out, id);
    }
    size_t n = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    const unsigned char *u = (const unsigned char *)w;
    for (size_t i = 0; i < len;) {
        size_t cl;
        if (t->byte_level) cl = 1;
        else {
            int l = tok_utf8_next(u + i, len - i);
            cl = l > 0 ? (size_t)l : 1;   /* input is sanitized; stay safe anyway */
        }
        int first = i == 0, last = i + cl == len;
        int32_t id;
        if (t->byte_level && !t->cont_prefix && !t->end_suffix) id = t->byte_id[u[i]];
        else id = lookup_decorated(t, sc, w + i, cl, first, last);
        if (id == -2) return -1;
        if (id >= 0) {
            if (unk_id >= 0) {
                if (add_sym(sc, &n, unk_id, unk_len)) return -1;
                unk_id = -1;
            }
            if (add_sym(sc, &n, id, (uint32_t)cl)) return -1;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                /* all bytes of the (undecorated) char must have <0xXX> tokens */
                int ok = 1;
                for (size_t k = 0; k < cl; k++) ok &= t->byte_id[u[i + k]] >= 0;
                if (ok) {
                    /* HF does not flush a pending unk here; neither do we */
                    for (size_t k = 0; k < cl; k++)
                        if (add_sym(sc, &n, t->byte_id[u[i + k]], 1)) return -1;
                    done = 1;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (unk_id >= 0 && t->fuse_unk) unk_len += (uint32_t)cl;
                else {
                    if (unk_id >= 0 && add_sym(sc, &n, unk_id, unk_len)) return -1;
                    unk_id = t->unk_id;
                    unk_len = (uint32_t)cl;
                }
            }
        }
        i += cl;
    }
    if (unk_id >= 0 && add_sym(sc, &n, unk_id, unk_len)) return -1;
    if (!n) return 0;
    if (n <= SMALL_WORD) return merge_small(t, sc->s, n, out);
    sc->s[n - 1].next = -1;
    sym *s = sc->s;

    /* merge loop */
    sc->h_n = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r; int32_t id;
        if (merge_get(t, s[i].id, s[i + 1].id, &r, &id) && hpush(sc, r, (uint32_t)i, id)) return -1;
    }
    while (sc->h_n) {
        hent top = hpop(sc);
        sym *a = &s[top.pos];
        if (a->len == 0 || a->next < 0) continue;
        sym *b = &s[a->next];
        uint32_t r; int32_t id;
        if (!merge_get(t, a->id, b->id, &r, &id) || id != top.id) continue;
        a->id = top.id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = (int32_t)top.pos;
        if (a->prev >= 0 && merge_get(t, s[a->prev].id, a->id, &r, &id) &&
            hpush(sc, r, (uint32_t)a->prev, id)) return -1;
        if (a->next >= 0 && merge_get(t, a->id, s[a->next].id, &r, &id) &&
            hpush(sc, r, top.pos, id)) return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i].len && tok_ids_push(out, s[i].id)) return -1;
    return 0;
}
