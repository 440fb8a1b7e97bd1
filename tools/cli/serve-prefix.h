/*
 * serve-prefix.h — the server's cache of prompt prefixes (serve-prefix.c, a
 * radix tree over page-aligned prefixes): entries live in sequences
 * seq0..seq0+cap-1 of the engine's context.
 */
#ifndef CINFER_SERVE_PREFIX_H
#define CINFER_SERVE_PREFIX_H
#include "cinfer.h"

typedef struct srv_prefix srv_prefix;
/* cap entries in sequences seq0..; page: the tree's tokens per level (the context's KV page) */
srv_prefix *pfx_new(int cap, int seq0, int page);
void pfx_free(srv_prefix *p);   /* the sequences are the context's: free them with it */
int pfx_count(const srv_prefix *p);
/* entry i (0..cap-1): its token count (0: free) and tokens */
int pfx_entry_ids(const srv_prefix *p, int i, const int32_t **ids);
/* length of the longest cached prefix of ids[n] (0: none); *seq holds it */
int pfx_lookup(srv_prefix *p, const int32_t *ids, int n, int *seq);
/* caches the first n tokens of sequence src_seq (whose tokens are ids) */
void pfx_insert(srv_prefix *p, cinfer_ctx *c, int src_seq, const int32_t *ids, int n);
/* frees the least recently used entry; 0 when there was none */
int pfx_evict_lru(srv_prefix *p, cinfer_ctx *c);
#endif
