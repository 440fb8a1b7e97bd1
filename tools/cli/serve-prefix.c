/*
 * serve-prefix.c — the server's prompt-prefix cache. Each entry owns one
 * sequence of the context holding the KV state of a prompt's tokens (shared
 * by reference with the request that computed it: a fork, no copy). A new
 * request forks the entry sharing its longest prefix and trims to the shared
 * length, so only the rest of its prompt is computed; the state layer copies
 * a shared last page on the first write (copy on write).
 *
 * Lookup compares the prompt with every entry (entries are few: one per
 * cached prompt, --prompt-cache-size; a compare stops at the first
 * difference), so a lookup costs O(entries x shared length) integer compares,
 * small next to the forward it saves. Eviction is least recently used, on
 * demand: when an entry slot is needed or the KV budget is exhausted.
 * An entry that is a prefix of a newer one is superseded by it.
 */
#include <stdlib.h>
#include <string.h>
#include "serve-prefix.h"

typedef struct pfx_entry { int32_t *ids; int n; long used; } pfx_entry;

struct srv_prefix {
    int cap, seq0;          /* entry i lives in sequence seq0 + i */
    pfx_entry *e;           /* [cap], n == 0: free */
    long tick;
};

srv_prefix *pfx_new(int cap, int seq0) {
    srv_prefix *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cap = cap;
    p->seq0 = seq0;
    p->e = calloc((size_t)(cap > 0 ? cap : 1), sizeof *p->e);
    if (!p->e) { free(p); return NULL; }
    return p;
}

void pfx_free(srv_prefix *p) {
    if (!p) return;
    for (int i = 0; i < p->cap; i++) free(p->e[i].ids);
    free(p->e);
    free(p);
}

int pfx_count(const srv_prefix *p) {
    int n = 0;
    for (int i = 0; i < p->cap; i++) n += p->e[i].n > 0;
    return n;
}

static void drop(srv_prefix *p, cinfer_ctx *c, int i) {
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
    int best = 0, bi = -1;
    for (int i = 0; i < p->cap; i++) {
        if (!p->e[i].n) continue;
        int m = lcp(p->e[i].ids, p->e[i].n, ids, n);
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
    int slot = -1;
    for (int i = 0; i < p->cap; i++) {
        pfx_entry *e = &p->e[i];
        if (!e->n) continue;
        int m = lcp(e->ids, e->n, ids, n);
        if (m == n) { e->used = ++p->tick; return; }   /* already covered by a longer (or equal) entry */
        if (m == e->n) { drop(p, c, i); if (slot < 0) slot = i; }   /* superseded */
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
}
