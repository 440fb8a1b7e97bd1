/*
 * serve-prefix.c — the server's prompt-prefix cache. Each entry owns one
 * sequence of the context holding the KV state of a prompt's tokens (shared
 * by reference with the request that computed it: a fork, no copy). A new
 * request forks the entry sharing its longest prefix and trims to the shared
 * length, so only the rest of its prompt is computed; the state layer copies
 * a shared last page on the first write (copy on write).
 *
 * The index is a radix tree over page-aligned prefixes: a node stands for
 * the prefix of its depth x page tokens, its edge label is that page's
 * tokens, and it lists the entries that hold the whole prefix. A lookup
 * walks the prompt's full pages down the tree (each step compares one page
 * with the children's labels), then compares the rest of the prompt, less
 * than a page past the deepest node, with the entries listed there — so it
 * finds the same longest prefix as comparing the prompt with every entry,
 * at a cost that grows with the prompt's pages, not with the number of
 * entries times the shared length. Entries keep their whole token list, so
 * reuse stays token-granular past the last shared page.
 *
 * Eviction is least recently used, on demand: when an entry slot is needed
 * or the KV budget is exhausted. An entry that is a prefix of a newer one is
 * superseded by it.
 */
#include <stdlib.h>
#include <string.h>
#include "serve-prefix.h"

typedef struct pfx_entry { int32_t *ids; int n; long used; } pfx_entry;

typedef struct pfx_node {
    const int32_t *label;       /* [page] this node's page of tokens (in an entry's ids; any entry listed holds them) */
    struct pfx_node **kid;      /* [n_kid] */
    int n_kid, cap_kid;
    int *ent;                   /* [n_ent] entries holding this whole prefix */
    int n_ent, cap_ent;
} pfx_node;

struct srv_prefix {
    int cap, seq0, page;    /* entry i lives in sequence seq0 + i; page: tokens per tree level */
    pfx_entry *e;           /* [cap], n == 0: free */
    pfx_node root;          /* depth 0: lists no entries (every entry is a candidate at the root) */
    long tick;
};

srv_prefix *pfx_new(int cap, int seq0, int page) {
    srv_prefix *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cap = cap;
    p->seq0 = seq0;
    p->page = page > 0 ? page : 128;
    p->e = calloc((size_t)(cap > 0 ? cap : 1), sizeof *p->e);
    if (!p->e) { free(p); return NULL; }
    return p;
}

static void node_free(pfx_node *n) {
    for (int i = 0; i < n->n_kid; i++) {
        node_free(n->kid[i]);
        free(n->kid[i]);
    }
    free(n->kid);
    free(n->ent);
}

void pfx_free(srv_prefix *p) {
    if (!p) return;
    node_free(&p->root);
    for (int i = 0; i < p->cap; i++) free(p->e[i].ids);
    free(p->e);
    free(p);
}

int pfx_count(const srv_prefix *p) {
    int n = 0;
    for (int i = 0; i < p->cap; i++) n += p->e[i].n > 0;
    return n;
}

int pfx_entry_ids(const srv_prefix *p, int i, const int32_t **ids) {
    *ids = p->e[i].ids;
    return p->e[i].n;
}

/* the index of n's child labelled with the page at ids, or -1 */
static int child_at(const pfx_node *n, const int32_t *ids, int page) {
    for (int i = 0; i < n->n_kid; i++)
        if (n->kid[i]->label[0] == ids[0] && !memcmp(n->kid[i]->label, ids, sizeof *ids * (size_t)page)) return i;
    return -1;
}

static pfx_node *child(const pfx_node *n, const int32_t *ids, int page) {
    int i = child_at(n, ids, page);
    return i < 0 ? NULL : n->kid[i];
}

static int grow(void **a, int *cap, int need, size_t size) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap * 2 : 4;
    void *q = realloc(*a, size * (size_t)c);
    if (!q) return 0;
    *a = q;
    *cap = c;
    return 1;
}

/* lists entry i on the nodes of its full pages (created as needed); 0 on allocation failure */
static int tree_add(srv_prefix *p, int i) {
    pfx_node *n = &p->root;
    const int32_t *ids = p->e[i].ids;
    for (int d = 0; d + p->page <= p->e[i].n; d += p->page) {
        pfx_node *k = child(n, ids + d, p->page);
        if (!k) {
            if (!grow((void **)&n->kid, &n->cap_kid, n->n_kid + 1, sizeof *n->kid) || !(k = calloc(1, sizeof *k))) return 0;
            n->kid[n->n_kid++] = k;
        }
        k->label = ids + d;   /* relabelled to the newest holder: a listed entry's ids outlive the node's use */
        if (!grow((void **)&k->ent, &k->cap_ent, k->n_ent + 1, sizeof *k->ent)) return 0;
        k->ent[k->n_ent++] = i;
        n = k;
    }
    return 1;
}

/* unlists entry i; a node no entry holds any more goes (its subtree holds none either) */
static void tree_remove(srv_prefix *p, int i) {
    pfx_node *n = &p->root;
    const int32_t *ids = p->e[i].ids;
    for (int d = 0; d + p->page <= p->e[i].n; d += p->page) {
        int ki = child_at(n, ids + d, p->page);
        if (ki < 0) return;
        pfx_node *k = n->kid[ki];
        int w = 0;
        for (int j = 0; j < k->n_ent; j++)
            if (k->ent[j] != i) k->ent[w++] = k->ent[j];
        k->n_ent = w;
        if (!w) {
            node_free(k);
            free(k);
            n->kid[ki] = n->kid[--n->n_kid];
            return;
        }
        k->label = p->e[k->ent[0]].ids + d;   /* the label must stay in a listed entry's ids */
        n = k;
    }
}

static void drop(srv_prefix *p, cinfer_ctx *c, int i) {
    tree_remove(p, i);
    cinfer_seq_free(c, p->seq0 + i);
    free(p->e[i].ids);
    p->e[i].ids = NULL;
    p->e[i].n = 0;
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

int pfx_lookup(srv_prefix *p, const int32_t *ids, int n, int *seq) {
    const pfx_node *node = &p->root, *k;
    int d = 0;
    while (d + p->page <= n && (k = child(node, ids + d, p->page))) {
        node = k;
        d += p->page;
    }
    /* the candidates: the entries holding the d tokens matched (at the root: all) */
    int best = 0, bi = -1, cand = node == &p->root ? p->cap : node->n_ent;
    for (int j = 0; j < cand; j++) {
        int i = node == &p->root ? j : node->ent[j];
        if (!p->e[i].n) continue;
        int m = d + lcp(p->e[i].ids + d, p->e[i].n - d, ids + d, n - d);
        if (m > best) { best = m; bi = i; }
    }
    if (bi < 0) return 0;
    p->e[bi].used = ++p->tick;
    *seq = p->seq0 + bi;
    return best;
}

int pfx_evict_lru(srv_prefix *p, cinfer_ctx *c) {
    int bi = -1;
    for (int i = 0; i < p->cap; i++)
        if (p->e[i].n && (bi < 0 || p->e[i].used < p->e[bi].used)) bi = i;
    if (bi < 0) return 0;
    drop(p, c, bi);
    return 1;
}

void pfx_insert(srv_prefix *p, cinfer_ctx *c, int src_seq, const int32_t *ids, int n) {
    if (n < 1 || p->cap < 1) return;
    int slot = -1, at;
    if (pfx_lookup(p, ids, n, &at) == n) return;   /* already held by an entry (now the most recently used) */
    for (int i = 0; i < p->cap; i++) {   /* entries this one supersedes: its prefixes */
        pfx_entry *e = &p->e[i];
        if (e->n && e->n < n && lcp(e->ids, e->n, ids, n) == e->n) {
            drop(p, c, i);
            if (slot < 0) slot = i;
        }
    }
    for (int i = 0; slot < 0 && i < p->cap; i++)
        if (!p->e[i].n) slot = i;
    if (slot < 0) {
        pfx_evict_lru(p, c);
        for (int i = 0; slot < 0 && i < p->cap; i++)
            if (!p->e[i].n) slot = i;
    }
    int32_t *copy = malloc(sizeof *copy * (size_t)n);
    if (!copy) return;
    int dst = p->seq0 + slot;
    if (cinfer_seq_fork(c, src_seq, dst) || cinfer_seq_len(c, dst) < n || cinfer_seq_trim(c, dst, n)) {
        cinfer_seq_free(c, dst);
        free(copy);
        return;
    }
    memcpy(copy, ids, sizeof *copy * (size_t)n);
    p->e[slot] = (pfx_entry){copy, n, ++p->tick};
    if (!tree_add(p, slot)) drop(p, c, slot);   /* out of memory: not cached rather than half indexed */
}
