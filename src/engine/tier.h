/*
 * tier.h — the entry codec of the persistent prefix tier (tier-entry.c),
 * shared by the tier (tier.c) and the tests that corrupt and fuzz entries.
 *
 * An entry file:
 *   [0, 8)    magic "CINFKV01"
 *   [8, 12)   u32 LE H, the header's length
 *   [12, 16)  u32 LE 0 (reserved)
 *   [16, 24)  u64 LE XXH3-64 of bytes [0, 16) followed by the header
 *   [24, 24+H) header, JSON: {"format":"cinfer-tier-entry","version":1,
 *             "config":C,"created":unix_seconds,"tokens":[ids],
 *             "snapshot":{the cinfer-kv snapshot header},
 *             "tensors":[{"name","dtype","shape":[4],"offset","bytes","xxh3"}]}
 *   then the tensors' bytes back to back in header order (offset is relative
 *   to the end of the header); the file ends exactly after the last one.
 * Every byte is covered: the preamble and header by the header hash, each
 * tensor by its own XXH3-64 (16 hex digits), the length by the exact-size rule.
 */
#ifndef CINFER_TIER_H
#define CINFER_TIER_H
#include "cinfer.h"

#define TIER_MAGIC "CINFKV01"
#define TIER_PRE 24

typedef struct tier_entry {
    char *config;              /* malloc'd */
    int32_t *tokens;           /* [n_tokens], malloc'd */
    int n_tokens;
    cinfer_snapshot snap;      /* header malloc'd; tensors malloc'd, their data point into the buffer */
} tier_entry;

/* Serialises a snapshot and its tokens into a malloc'd entry image. */
cinfer_status tier_entry_encode(const cinfer_snapshot *s, const char *config, const int32_t *tokens, int n,
                                void **buf, size_t *len, char *err, size_t n_err);
/* Parses and verifies an entry image (every check: magic, sizes, header hash,
 * JSON shape, per-tensor hashes). e points into buf afterwards. */
cinfer_status tier_entry_decode(const void *buf, size_t len, tier_entry *e, char *err, size_t n_err);
void tier_entry_clear(tier_entry *e);
/* The model and tokenizer fingerprints through the memo in a tier directory
 * (fingerprint.c): *hit = 1 when the memo answered (a stat per file), else they
 * were computed and the memo written. */
cinfer_status tier_fingerprints(const cinfer_model *m, const char *dir, char model_fp[33], char tok_fp[33], int *hit);
#endif
