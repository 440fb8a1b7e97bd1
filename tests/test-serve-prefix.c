/*
 * test-serve-prefix.c — the server's prefix index (tools/cli/serve-prefix.c,
 * compiled in), on stories260k's real weights: a seeded random run of
 * inserts, lookups and evictions over prompts that share stems, at pages of
 * 4 and 16 tokens:
 *   - every lookup finds the longest prefix that comparing the prompt with
 *     every live entry finds (the brute force the radix tree replaces);
 *   - the entry it returns holds the K/V of those tokens: forked, trimmed to
 *     the shared length and fed the rest of the prompt, it gives the logits
 *     of the whole prompt computed from scratch;
 *   - entries stay within the cap, each entry's sequence as long as its
 *     tokens, and superseded prefixes are gone.
 */
#include "check.h"
#include "golden.h"
#include <string.h>
#include "../tools/cli/serve-prefix.c"

#define CAP 6
#define WORK (CAP)   /* the sequence prompts are computed in (entries take 0..CAP-1) */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int rnd(int n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

static int lcp_ref(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* last-position logits of ids[n] in sequence seq from position pos0 (the sequence already holds pos0 tokens) */
static int feed(cinfer_ctx *c, int seq, const int32_t *ids, int n, float *lg) {
    return cinfer_forward_seqs(c, ids, 1, n, &seq, NULL, NULL, NULL, 0, lg) == CINFER_OK;
}

static void run(cinfer_model *m, int page) {
    cinfer_ctx_opts o = {.max_seqs = CAP + 2, .kv_page = page};
    cinfer_ctx *c = NULL;
    char err[256];
    if (cinfer_ctx_new(m, &o, &c, err, sizeof err)) { CHECK(0, "context: %s", err); return; }
    srv_prefix *p = pfx_new(CAP, 0, page);
    cinfer_model_info mi;
    cinfer_model_get_info(m, &mi);
    int V = mi.n_vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int32_t stem[4][48], ids[64];
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < 48; i++) stem[s][i] = 3 + rnd(V - 3);
    int wrong = 0, lookups = 0, hits = 0, kv_checked = 0, kv_bad = 0, feed_bad = 0;
    for (int op = 0; op < 160; op++) {
        int s = rnd(4), keep = rnd(49), n = keep + rnd(10);
        if (n < 1) n = 1;
        for (int i = 0; i < n; i++) ids[i] = i < keep ? stem[s][i] : 3 + rnd(V - 3);
        if (rnd(12) == 0) { pfx_evict_lru(p, c); continue; }
        int brute = 0;
        for (int i = 0; i < CAP; i++) {
            const int32_t *e;
            int en = pfx_entry_ids(p, i, &e), l = en ? lcp_ref(e, en, ids, n) : 0;
            if (l > brute) brute = l;
        }
        int seq = -1, got = pfx_lookup(p, ids, n, &seq);
        lookups++;
        hits += got > 0;
        if (got != brute && wrong++ < 3) printf("# op %d: lookup %d, every entry compared %d (page %d)\n", op, got, brute, page);
        if (got > 0 && got < n && op % 5 == 0) {   /* the entry's K/V: continue from it == from scratch */
            kv_checked++;
            int ok = !cinfer_seq_fork(c, seq, WORK + 1) && !cinfer_seq_trim(c, WORK + 1, got) && feed(c, WORK + 1, ids + got, n - got, a) &&
                     feed(c, WORK, ids, n, b);
            double e = 0, r = 0;
            for (int i = 0; ok && i < V; i++) {
                if (fabs(a[i] - b[i]) > e) e = fabs(a[i] - b[i]);
                if (fabs(b[i]) > r) r = fabs(b[i]);
            }
            if (!ok || e > 1e-5 * r) kv_bad++;
            cinfer_seq_free(c, WORK + 1);
            cinfer_seq_free(c, WORK);
        }
        if (!feed(c, WORK, ids, n, NULL)) { feed_bad++; continue; }
        pfx_insert(p, c, WORK, ids, n);
        cinfer_seq_free(c, WORK);
    }
    CHECK(!wrong && !feed_bad, "page %d: %d lookups (%d hits) find the longest prefix every entry compared finds (%d differ)", page, lookups,
          hits, wrong);
    CHECK(kv_checked > 3 && !kv_bad, "page %d: %d entries continued from their shared length give the whole prompt's logits (%d differ)",
          page, kv_checked, kv_bad);
    int held = 0, bad_len = 0, nested = 0;
    for (int i = 0; i < CAP; i++) {
        const int32_t *e, *f;
        int en = pfx_entry_ids(p, i, &e);
        if (!en) continue;
        held++;
        bad_len += cinfer_seq_len(c, i) != en;
        for (int j = 0; j < CAP; j++) {
            int fn = pfx_entry_ids(p, j, &f);
            nested += j != i && fn && fn <= en && lcp_ref(e, en, f, fn) == fn;
        }
    }
    CHECK(held == pfx_count(p) && held <= CAP && !bad_len && !nested,
          "page %d: %d entries (cap %d), each sequence as long as its tokens (%d not), no entry a prefix of another (%d)", page, held, CAP,
          bad_len, nested);
    pfx_free(p);
    free(a);
    free(b);
    cinfer_ctx_free(c);
}

int main(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/stories260k", shared_dir());
    cinfer_model *m = golden_load(dir, NULL, 1);
    CHECK(m != NULL, "stories260k loads from %s", dir);
    if (!m) return CHECK_DONE();
    run(m, 4);
    run(m, 16);
    cinfer_model_free(m);
    return CHECK_DONE();
}
