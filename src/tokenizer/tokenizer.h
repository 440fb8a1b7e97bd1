/*
 * tokenizer.h — internal shape of a loaded Hugging Face tokenizer.json.
 *
 * The pipeline mirrors HF `tokenizers` (Tokenizer.from_file semantics):
 *   added tokens (raw text) -> normalizer -> added tokens (normalized text)
 *   -> pre-tokenizer -> BPE model -> post-processor (BOS/EOS)
 * and for decoding: ids -> pieces -> decoder chain -> text.
 *
 * Byte-level tokenizers (a ByteLevel pre-tokenizer) keep their vocabulary
 * keys as the raw bytes the GPT-2 char map stands for, so encoding works on
 * raw bytes and never builds the mapped string; `piece` keeps the stored
 * form for cinfer_token_piece. A tokenizer is read-only after load and may
 * be used by several threads at once (encode state lives on the stack/heap
 * of each call).
 */
#ifndef CINFER_TOKENIZER_H
#define CINFER_TOKENIZER_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include "cinfer.h"

/* ---- string -> id hash table (open addressing, keys in a byte pool) ---- */
typedef struct tok_strmap {
    uint64_t *slot;     /* [cap] (hash tag << 32) | (id + 1), 0 = empty */
    uint32_t cap;       /* power of two */
    const char *const *key;  /* key[id] -> bytes (borrowed from the tokenizer) */
    const uint32_t *klen;    /* klen[id] */
} tok_strmap;

/* ---- normalizers ---- */
enum { TN_NFC, TN_NFD, TN_NFKC, TN_NFKD, TN_LOWER, TN_PREPEND, TN_REPLACE, TN_STRIP };
typedef struct tok_norm {
    int kind;
    char *a; size_t alen;       /* PREPEND text; REPLACE pattern (literal) */
    char *b; size_t blen;       /* REPLACE content */
    pcre2_code *re;             /* REPLACE with a Regex pattern */
    int strip_left, strip_right;
} tok_norm;

/* ---- pre-tokenizers ---- */
enum { TP_SPLIT, TP_BYTELEVEL, TP_METASPACE, TP_DIGITS, TP_WS_SPLIT, TP_WHITESPACE, TP_PUNCT };
enum { TB_REMOVED, TB_ISOLATED, TB_MERGED_PREV, TB_MERGED_NEXT, TB_CONTIGUOUS };
enum { TM_ALWAYS, TM_FIRST, TM_NEVER };
typedef struct tok_pretok {
    int kind;
    int behavior, invert;
    pcre2_code *re;             /* SPLIT (literal patterns are compiled escaped) */
    int add_prefix_space;       /* BYTELEVEL */
    int prepend_scheme, split;  /* METASPACE */
    char repl[8]; size_t repl_len;
    int individual_digits;      /* DIGITS */
} tok_pretok;

/* ---- decoders ---- */
enum { TD_BYTELEVEL, TD_REPLACE, TD_BYTEFALLBACK, TD_FUSE, TD_STRIP, TD_METASPACE };

/* ---- added tokens ---- */
typedef struct tok_added {
    int32_t id;
    char *content; size_t len;  /* as matched: normalized content when normalized */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* byte trie over added-token contents, for leftmost-longest matching */
typedef struct tok_trie {
    uint32_t *key;      /* [cap] (node << 8 | byte) + 1, 0 = empty */
    uint32_t *val;      /* [cap] child node */
    int32_t *term;      /* [n_nodes] index into added[], -1 if none */
    uint32_t cap, n_nodes, n_term_cap;
    uint8_t first[256]; /* bytes that can start a match */
} tok_trie;

typedef struct tok_merge {
    uint64_t key;               /* (left id << 32 | right id) + 1, 0 = empty */
    uint32_t rank;
    int32_t id;                 /* merged token */
} tok_merge;

struct cinfer_tokenizer {
    int n_vocab;                /* max id + 1 over model vocab and added tokens */
    char **piece;               /* [n_vocab] stored piece (NUL-terminated) or NULL */
    uint32_t *piece_len;        /* [n_vocab] */
    char **key;                 /* [n_vocab] model-key bytes (raw bytes for byte-level) */
    uint32_t *key_len;          /* [n_vocab] */
    char *key_pool;             /* the bytes key[] points into */
    uint8_t *is_special;        /* [n_vocab] added token with special=true */
    uint8_t *is_added;          /* [n_vocab] */
    tok_strmap vocab;           /* model vocab key -> id */

    /* BPE merges: (left id, right id) -> rank, merged id */
    tok_merge *merges;          /* [merge_cap] open addressing; one cache line per probe */
    uint32_t merge_cap;
    int byte_level;             /* vocab keys are raw bytes; symbols start as single bytes */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;             /* -1 if none */
    char *cont_prefix, *end_suffix;     /* continuing_subword_prefix / end_of_word_suffix, may be NULL */
    int32_t byte_id[256];       /* byte-level: id of each single byte; fallback: id of <0xXX>; -1 */
    /* SentencePiece words may be cut before a U+2581 that follows another
     * char c when no piece contains "c\u2581" (then no merge can cross the
     * cut and BPE of the parts equals BPE of the whole): spm_split says the
     * vocabulary allows it, nosplit[] lists the chars c that forbid it */
    int spm_split, nosplit_unknown;
    uint32_t nosplit[16]; int n_nosplit;

    tok_norm *norm; int n_norm;
    tok_pretok *pre; int n_pre;
    int dec[8]; int n_dec;      /* decoder chain kinds, in order */
    char *dec_repl_from, *dec_repl_to;  /* TD_REPLACE (one supported) */
    int dec_strip_start, dec_strip_stop;
    int dec_meta_first;         /* TD_METASPACE: strip the first token's leading space */
    char dec_meta_repl[8];

    tok_added *added; int n_added;
    tok_trie trie_raw, trie_norm;

    int32_t pre_ids[4]; int n_pre_ids;    /* post-processor: prepended ids */
    int32_t post_ids[4]; int n_post_ids;  /* appended ids */
    int bos, eos;

    char *chat_template;        /* from tokenizer_config.json, may be NULL */
    char *bos_str, *eos_str;    /* bos_token / eos_token strings, may be NULL */
    char *chat_vars;            /* JSON object of special-token strings for templates, may be NULL */
};

/* strmap */
int tok_strmap_build(tok_strmap *m, const char *const *key, const uint32_t *klen, int n);
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t len);
void tok_strmap_free(tok_strmap *m);

/* merges */
int tok_merges_alloc(cinfer_tokenizer *t, size_t n);
void tok_merges_put(cinfer_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);

/* BPE on one pre-token word; appends ids to *ids (growing *cap). 0 ok, -1 oom. */
typedef struct tok_ids { int32_t *v; size_t n, cap; } tok_ids;
int tok_ids_push(tok_ids *o, int32_t id);
typedef struct tok_bpe_scratch tok_bpe_scratch;
tok_bpe_scratch *tok_bpe_scratch_new(void);
void tok_bpe_scratch_free(tok_bpe_scratch *s);
int tok_bpe_word(const cinfer_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t len, tok_ids *out);

/* UTF-8 helpers */
/* length of a complete valid char at s[0..n) (>0); -k: invalid, replace k bytes
 * with one U+FFFD (maximal subpart); 0: valid but truncated at n */
int tok_utf8_next(const unsigned char *s, size_t n);
/* copies s with invalid sequences replaced by U+FFFD; NULL on oom */
char *tok_utf8_sanitize(const char *s, size_t n, size_t *out_len);
uint32_t tok_utf8_decode(const unsigned char *s, int len);  /* of a valid char */
int tok_utf8_encode(uint32_t cp, char *out);
int tok_is_whitespace(uint32_t cp);   /* Unicode White_Space (Rust char::is_whitespace) */
int tok_is_word_char(uint32_t cp);    /* alphanumeric or '_' */

/* the GPT-2 byte <-> char map */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);      /* -1 if not in the map */

/* growable byte buffer */
typedef struct tok_buf { char *p; size_t n, cap; } tok_buf;
int tok_buf_put(tok_buf *b, const char *s, size_t n);

/* normalizer over a whole segment: returns malloc'd result in *out */
int tok_normalize(const cinfer_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n);
/* pre-tokenizes seg into pieces (offsets into *buf, which may be rewritten);
 * first = segment starts the input (Metaspace prepend_scheme "first") */
typedef struct tok_span { size_t off, len; } tok_span;
typedef struct tok_spans { tok_span *v; size_t n, cap; } tok_spans;
int tok_pretokenize(const cinfer_tokenizer *t, tok_buf *buf, tok_spans *out, int first);
int tok_spans_push(tok_spans *s, size_t off, size_t len);

/* added tokens: finds the leftmost-longest match in s[from..n); returns the
 * index into t->added or -1; *ms, *me = match start/end after lstrip/rstrip */
int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t idx);
void tok_trie_free(tok_trie *tr);
int tok_added_find(const cinfer_tokenizer *t, const tok_trie *tr, const char *s, size_t n, size_t from,
                   int skip_special, size_t *ms, size_t *me);

/* loading pieces (load-model.c / load-pipeline.c) */
struct tj_doc; struct tj_node;
cinfer_status tok_load_model(cinfer_tokenizer *t, const struct tj_doc *d, const struct tj_node *model,
                             char *err, size_t err_len);
cinfer_status tok_load_pipeline(cinfer_tokenizer *t, const struct tj_doc *d, const struct tj_node *root,
                                char *err, size_t err_len);
pcre2_code *tok_regex_compile(const char *pat, size_t len, int literal, char *err, size_t err_len);
#endif
