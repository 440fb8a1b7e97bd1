/*
 * cinfer.h — the public API of cinfer, a large-language-model runtime in C.
 *
 * Everything is reached through opaque handles. Every function that can fail
 * returns a cinfer_status; the message for the last failure is kept on the
 * context (cinfer_ctx_error) or, for functions that create a handle or take
 * an `err` buffer, written into the caller's buffer.
 *
 * Ownership: a model is read-only after load and may be shared by threads;
 * a context belongs to one thread at a time and keeps a pointer to its model
 * (free the contexts before the model). Arrays returned through `**out`
 * parameters are malloc'd and owned by the caller (free with free()).
 */
#ifndef CINFER_H
#define CINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cinfer_status {
    CINFER_OK = 0,
    CINFER_EINVAL = 1,      /* bad argument from the caller */
    CINFER_EIO = 2,         /* file missing, unreadable */
    CINFER_EFORMAT = 3,     /* file present but malformed, truncated or lying */
    CINFER_EUNSUPPORTED = 4,/* valid input cinfer does not handle (architecture, dtype) */
    CINFER_ENOMEM = 5,
    CINFER_EBACKEND = 6,    /* device/backend failure */
    CINFER_ENOTFOUND = 7,   /* optional piece absent (e.g. no tokenizer in a model dir) */
} cinfer_status;

/* A short English name for a status ("format error", ...). Never NULL. */
const char *cinfer_status_str(cinfer_status s);

/* The library's version, "MAJOR.MINOR.PATCH", followed by " (git REV)" when
 * it was built from a git checkout. Never NULL. */
const char *cinfer_version(void);

typedef struct cinfer_model cinfer_model;
typedef struct cinfer_ctx cinfer_ctx;
typedef struct cinfer_tokenizer cinfer_tokenizer;

/* ---------------------------------------------------------------- models */

typedef struct cinfer_load_opts {
    const char *device;   /* "cpu" (default, NULL) or "cuda" */
    int n_threads;        /* CPU threads; 0 = all cores */
    int no_tokenizer;     /* 1: do not load tokenizer files even if present */
} cinfer_load_opts;

/* Loads a Hugging Face / MLX model directory: config.json, model.safetensors
 * or shards + model.safetensors.index.json, generation_config.json and, when
 * present, tokenizer.json / tokenizer_config.json. Weights are memory-mapped
 * and used in place. On failure *out is NULL and `err` (may be NULL) holds a
 * message naming the file and the problem. opts may be NULL. */
cinfer_status cinfer_model_load(const char *dir, const cinfer_load_opts *opts,
                                cinfer_model **out, char *err, size_t err_len);
void cinfer_model_free(cinfer_model *m);  /* NULL is fine */

typedef struct cinfer_model_info {
    const char *model_type;  /* HF model_type, e.g. "llama" */
    int n_layer, hidden, n_head, n_kv_head, head_dim, ffn, n_vocab, max_pos;
    int bos;                 /* -1 when unknown */
    int n_eos;               /* eos ids from generation_config.json/config.json */
    const int32_t *eos;      /* [n_eos], owned by the model */
    const char *weight_dtype;/* "f32", "f16", "bf16" (of the projection weights); "q2".."q8":
                                MLX affine-quantized, that many bits per code */
    size_t weight_bytes;     /* bytes of all tensors in the safetensors files */
    int64_t n_params;        /* parameters (a quantized matrix counts its unpacked values) */
    const char *weight_types;/* the stored types of the 2-D weights, e.g. "bf16" or "q3+q6 (affine g64, bf16 scales)" */
    double bits_per_weight;  /* weight_bytes * 8 / n_params (codes, scales, biases and norms included) */
} cinfer_model_info;

void cinfer_model_get_info(const cinfer_model *m, cinfer_model_info *info);

/* The tokenizer loaded with the model, or NULL when the directory had none. */
const cinfer_tokenizer *cinfer_model_tokenizer(const cinfer_model *m);

/* -------------------------------------------------------------- contexts */

typedef struct cinfer_ctx_opts {
    int n_threads;      /* 0 = the model's default */
    int kv_f16;         /* 1: KV pages in f16 (the same as kv_dtype "f16") */
    const char *kv_dtype;  /* "f32" (default), "f16" or "bf16"; NULL: by kv_f16 */
    int max_seqs;       /* sequences the context holds, ids 0..max_seqs-1 (0 = 64) */
    size_t kv_memory;   /* bytes the KV pages may take; 0 = 75% of the memory available
                           when the context is created (host MemAvailable on the CPU, free
                           device memory on CUDA). Pages are allocated as sequences grow. */
    int kv_page;        /* token slots per page, a power of two (0 = 128) */
    int max_kv_size;    /* > 0: every layer keeps the first 4 tokens and a window of the
                           most recent max_kv_size - 4 (mlx-lm's RotatingKVCache(N, keep=4));
                           generation may then run past the model's context */
    int batch_invariant;/* 1: a row's logits never depend on the other rows of its batch
                           or on how a sequence is cut into forwards (CUDA keeps activations
                           f32 in every matmul; the CPU runs every row through its per-row
                           kernels: bit for bit, at some prefill speed). Off, the CPU
                           differs at float rounding (~1e-6 of the logit range), which a
                           quantized KV cache can turn into a different code */
    const char *prefill_act; /* CPU: the activations into many-token matmuls (prefill, scoring;
                           decode's GEMV kernels always take f32): "f32"; "bf16" (rounded to bf16,
                           AMX tiles or AVX-512 BF16 dot products where the CPU has them, else the f32
                           path on the rounded values), for bf16 and MLX affine weights; NULL or "auto":
                           bf16 for MLX affine weights on a CPU with AVX-512 BF16 (2-14x the f32 rate;
                           the weights' own rounding is far larger: KL in BENCHMARKS.md), f32 for
                           everything else; there CINFER_BF16_ACT=1 or 0 in the environment turns
                           bf16 on or off. Another backend refuses "f32"/"bf16" (CUDA: see
                           batch_invariant). */
    int prefill_step_size; /* cinfer_generate feeds a prompt in steps of this many tokens and
                           its last token alone, as mlx-lm's generate_step (0 = 2048) */
    /* Quantized KV (mlx-lm's QuantizedKVCache, MLX affine codes along head_dim, a scale and
     * a bias per group in the KV dtype): */
    int kv_bits;        /* 0: off; 2, 3, 4, 5, 6 or 8: every layer (mlx-lm --kv-bits) */
    int kv_group_size;  /* 32, 64 or 128 (0 = 64) */
    const char *kv_config; /* per-layer scheme instead of kv_bits: a JSON list, or the path of a
                           file holding one (text not starting with '['):
                           [{"layer_idx": L, "bits": B, "group_size": G}, ...] (OptiQ's
                           kv_config.json; group_size defaults to 64, layers not listed
                           stay unquantized, extra fields ignored) */
    int quantized_kv_start; /* >= 0: the layers convert after the forward that brings a
                           sequence to this many tokens (that forward attended unquantized;
                           mlx-lm's maybe_quantize_kv_cache; 0: after the first forward);
                           -1: quantized from the first write, every key quantized before
                           any query reads it (QuantizedKVCache; scoring) */
    const char *kv_kernels; /* "unfused" (mlx-lm's quantized SDPA for every read), "tiled-causal"
                           (decode unfused, a causal window of queries through the tiled port,
                           masked windows unfused), "tiled" (every window tiled); NULL: unfused
                           with kv_bits, tiled-causal with kv_config. The tiled port takes 4 and
                           8 bits only and no softcapped attention: other requests are refused. */
} cinfer_ctx_opts;

/* A context holds many sequences (their KV state in pages from one memory
 * budget), scratch buffers and a backend context. opts may be NULL. */
cinfer_status cinfer_ctx_new(cinfer_model *m, const cinfer_ctx_opts *opts, cinfer_ctx **out,
                             char *err, size_t err_len);
void cinfer_ctx_free(cinfer_ctx *c);
const char *cinfer_ctx_error(const cinfer_ctx *c);  /* message of the last failure */

/* Drops every token of every sequence. */
void cinfer_ctx_reset(cinfer_ctx *c);
/* Keeps the first n tokens of every sequence and drops the rest (prefix
 * reuse: a new prompt that shares n tokens with the cached ones feeds only
 * its tail). n >= a sequence's length leaves it as it is. A sequence whose
 * window has already dropped keys that position n needs is cleared instead
 * (cinfer_seq_trim reports that case). */
void cinfer_ctx_trim(cinfer_ctx *c, int n);
/* Tokens held by sequence 0 (its next position). */
int cinfer_ctx_pos(const cinfer_ctx *c);
/* Bytes of KV pages held by the sequences (kv_bytes). */
size_t cinfer_ctx_cache_bytes(const cinfer_ctx *c);
/* Bytes cinfer holds for this context and its model: the mapped weights, the
 * work buffers (grown to the largest batch seen) and the KV cache. This is
 * what "peak memory" reports: not the address space a runtime (CUDA)
 * reserves nor the libraries' resident pages. */
size_t cinfer_ctx_memory_bytes(const cinfer_ctx *c);

typedef struct cinfer_kv_info {
    size_t bytes_held;   /* pages held by sequences */
    size_t bytes_pool;   /* pages allocated (held + free) */
    size_t budget;       /* kv_memory in force */
    int page;            /* slots per page */
    const char *dtype;   /* "f32", "f16", "bf16" */
    int max_seqs;
    int max_kv_size;     /* 0: none */
} cinfer_kv_info;
void cinfer_ctx_kv_info(const cinfer_ctx *c, cinfer_kv_info *info);
/* Decode steps the backend has captured as graphs and replayed so far (CUDA; 0 and 0 on the CPU). */
void cinfer_ctx_graph_stats(const cinfer_ctx *c, long *captures, long *replays);

/* ------------------------------------------------------------- sequences
 * Sequence ids are 0..max_seqs-1; every id exists from the start, empty. A
 * forward row extends a sequence; these calls manage them. Forks share the
 * parent's pages (copy on write of a partly filled last page). */

/* Tokens held by sequence seq (its next position); 0 for an unknown id. */
int cinfer_seq_len(const cinfer_ctx *c, int seq);
/* Keeps the first n tokens of seq. Fails (EINVAL, nothing changed) when a
 * window has dropped keys that position n would need. */
cinfer_status cinfer_seq_trim(cinfer_ctx *c, int seq, int n);
/* dst becomes a copy of src sharing its pages (dst's old tokens are dropped). */
cinfer_status cinfer_seq_fork(cinfer_ctx *c, int src, int dst);
/* Drops every token of seq and returns its pages; the id stays usable. */
void cinfer_seq_free(cinfer_ctx *c, int seq);

/* A sequence's cache state as named tensors and a JSON header, made by each
 * layer's codec; restoring it rebuilds the sequence exactly. Tensor "L.0"
 * holds layer L's keys, "L.1" its values, shape [1][n_kv][T][head_dim] for
 * the T positions the layer holds (mlx-lm's prompt-cache names). The header:
 * {"format":"cinfer-kv","version":1,"tokens":N,"layers":[{"layer","kind",
 * "dtype","n_kv","head_dim","window","keep","sinks","run","offset"}...]}:
 * a layer holds positions [0, sinks) and [run, offset) (run 0: all of
 * [0, offset)). The snapshot owns everything it points to. */
typedef struct cinfer_tensor {
    char name[32];
    const char *dtype;   /* "f32", "f16", "bf16" (static strings) */
    int ndim;
    int64_t shape[4];
    void *data;          /* malloc'd, bytes long */
    size_t bytes;
} cinfer_tensor;

typedef struct cinfer_snapshot {
    char *header;        /* malloc'd JSON */
    int n_tensors;
    cinfer_tensor *tensors; /* [n_tensors], malloc'd */
} cinfer_snapshot;

cinfer_status cinfer_seq_snapshot(cinfer_ctx *c, int seq, cinfer_snapshot **out);
/* seq is cleared, then rebuilt from s; shapes, dtypes and the cache policy
 * must match this context (EFORMAT with a message otherwise). */
cinfer_status cinfer_seq_restore(cinfer_ctx *c, int seq, const cinfer_snapshot *s);
void cinfer_snapshot_free(cinfer_snapshot *s);   /* NULL is fine */

/* ------------------------------------------------------- state on disk
 * Fingerprints name what a cache state belongs to: the model's covers
 * config.json, every shard's safetensors header and a sample of every
 * tensor's bytes (two fine-tunes of one base differ); the tokenizer's covers
 * tokenizer.json and tokenizer_config.json. out receives 32 hex digits. */
cinfer_status cinfer_model_fingerprint(const cinfer_model *m, char out[33]);
cinfer_status cinfer_tokenizer_fingerprint(const cinfer_model *m, char out[33]);

/* mlx-lm prompt-cache files (mlx_lm.models.cache.save_prompt_cache): one
 * safetensors file, tensors "L.0"/"L.1" = layer L's keys/values [1][n_kv][T]
 * [head_dim] (KVCache; RotatingKVCache in ring order with its meta state
 * "0.L" = "keep,max_size,offset,_idx"), "2.L" the class name, "1.KEY" user
 * metadata. Saving writes K/V in the context's KV dtype and adds the user
 * metadata in user_meta_json (a JSON object of strings, may be NULL) plus
 * cinfer's keys: 1.cinfer_model, 1.cinfer_tokenizer (fingerprints) and
 * 1.cinfer_tokens (the ids, when `tokens` is not NULL; n_tokens must equal
 * the sequence's length). The file is written to a temporary name, fsynced
 * and renamed. */
cinfer_status cinfer_prompt_cache_save(cinfer_ctx *c, int seq, const char *path, const char *user_meta_json,
                                       const int32_t *tokens, int n_tokens);
/* The same image in a malloc'd buffer *buf[*len] (caller frees). */
cinfer_status cinfer_prompt_cache_encode(cinfer_ctx *c, int seq, const char *user_meta_json, const int32_t *tokens,
                                         int n_tokens, void **buf, size_t *len);
/* Restores a prompt-cache file into seq (cleared first; any float K/V dtype
 * is converted). Refused with EFORMAT / EUNSUPPORTED and a message naming the
 * mismatch: another model or tokenizer fingerprint, layer count, KV heads,
 * head_dim, a window (--max-kv-size) other than the context's, a quantized
 * cache (QuantizedKVCache: not supported yet). *user_meta_json (may be NULL)
 * receives the file's "1.*" metadata as a malloc'd JSON object without the
 * "1." prefix; *fingerprinted (may be NULL) is 0 when the file carries no
 * cinfer fingerprint, so only shapes could be checked. A refused file leaves
 * seq empty. */
cinfer_status cinfer_prompt_cache_load(cinfer_ctx *c, int seq, const char *path, char **user_meta_json,
                                       int *fingerprinted);
cinfer_status cinfer_prompt_cache_decode(cinfer_ctx *c, int seq, const void *buf, size_t len, char **user_meta_json,
                                         int *fingerprinted);

/* A persistent prefix tier: a directory of cache entries keyed by the model
 * and tokenizer fingerprints, the cache configuration and a token prefix
 * (format: README, "Cache directory"). Each entry carries an XXH3 per tensor
 * and over its header, verified on every load; entries are written to a
 * temporary file, fsynced, renamed and the directory fsynced, so a reader
 * never sees half an entry; processes share a directory through advisory
 * locks; least recently used entries are evicted past max_bytes. A corrupt
 * entry is reported through `log` (NULL: stderr), removed and treated as a
 * miss. A tier is used by one thread at a time. */
typedef struct cinfer_tier cinfer_tier;
typedef struct cinfer_tier_opts {
    size_t max_bytes;    /* 0 = no limit */
    void (*log)(const char *msg, void *user);
    void *log_user;
} cinfer_tier_opts;
/* Creates dir if needed. The model must outlive the tier. opts may be NULL. */
cinfer_status cinfer_tier_open(const char *dir, const cinfer_model *m, const cinfer_tier_opts *opts,
                               cinfer_tier **out, char *err, size_t err_len);
void cinfer_tier_free(cinfer_tier *t);   /* NULL is fine */
const char *cinfer_tier_error(const cinfer_tier *t);
/* Restores into seq the longest stored prefix of ids[0..n) of at most
 * max_len tokens; *n_cached = its length (0: a miss, seq cleared). */
cinfer_status cinfer_tier_lookup(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, int max_len,
                                 int *n_cached);
/* As cinfer_tier_lookup, restoring only a prefix longer than min_len tokens
 * (a caller that already holds min_len of them elsewhere reads nothing it
 * would throw away). */
cinfer_status cinfer_tier_lookup_longer(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n,
                                        int min_len, int max_len, int *n_cached);
/* Stores seq's state; ids[0..n) are its tokens (n = its length). Equal to
 * cinfer_tier_capture then cinfer_tier_commit. */
cinfer_status cinfer_tier_store(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n);
/* A store in two halves, so the slow half (encode, checksum, write, fsync,
 * evict) can run on another thread while the context goes on. capture, on
 * the context's thread: copies seq's state and ids into *out (the caller
 * owns it; NULL when the entry is already stored: only its recency was
 * touched). commit, on any thread through a tier handle of that thread
 * (cinfer_tier_open on the same directory and model): writes the entry and
 * frees p (always, also on failure). */
typedef struct cinfer_tier_pending cinfer_tier_pending;
cinfer_status cinfer_tier_capture(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n,
                                  cinfer_tier_pending **out);
cinfer_status cinfer_tier_commit(cinfer_tier *t, cinfer_tier_pending *p);
void cinfer_tier_pending_free(cinfer_tier_pending *p);   /* NULL is fine */
/* For a prompt about to be generated from: restores the longest stored
 * prefix of ids[0..n-1), feeds the rest of those n-1 tokens (in
 * prefill_step_size steps) and stores the state at n-1 tokens and at the last
 * multiple of CINFER_TIER_BLOCK tokens before it (a checkpoint that prompts
 * sharing only a prefix can use), each when it fed tokens past the restored
 * prefix. A store that fails is reported and skipped. The caller then feeds
 * ids[n-1] (cinfer_generate). *n_cached: tokens taken from disk. */
#define CINFER_TIER_BLOCK 256
cinfer_status cinfer_tier_prefill(cinfer_tier *t, cinfer_ctx *c, int seq, const int32_t *ids, int n, int *n_cached);

/* One forward over B token rows of padded length L (the design's forward
 * contract); row b extends sequence b. ids [B][L]; lens[B] true lengths
 * (NULL: all L); pos0[B] start positions (NULL: continue each sequence from
 * its length; a start before it overwrites, and so trims, the tail).
 * Logits are computed only at the positions requested:
 *   - out_rows == NULL: the last true position of each row -> logits [B][vocab]
 *   - otherwise n_out (row, position) pairs out_rows[2*i], out_rows[2*i+1]
 *     -> logits [n_out][vocab].
 * logits may be NULL (prefill only). Everything is checked before any
 * state changes: a call that fails leaves every sequence as it was. */
cinfer_status cinfer_forward(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *lens,
                             const int *pos0, const int *out_rows, int n_out, float *logits);
/* The same with row b extending sequence seqs[b] (distinct ids); seqs NULL
 * is cinfer_forward. Rows of different sequences and lengths run in one
 * batch. */
cinfer_status cinfer_forward_seqs(cinfer_ctx *c, const int32_t *ids, int B, int L, const int *seqs,
                                  const int *lens, const int *pos0, const int *out_rows, int n_out,
                                  float *logits);

/* Convenience for one row: feeds ids[n] after the cached tokens, writes the
 * logits of every fed position (all=1, [n][vocab]) or only the last
 * ([vocab]). */
cinfer_status cinfer_eval(cinfer_ctx *c, const int32_t *ids, int n, int all, float *logits);

/* ---------------------------------------------------------------- sampling */

typedef struct cinfer_sampler_params {
    float temp;          /* 0 = greedy */
    int top_k;           /* 0 = off */
    float top_p;         /* 1 = off */
    float min_p;         /* 0 = off */
    float rep_penalty;   /* 1 = off (CTRL-style: divide positive logits, multiply negative) */
    int rep_last_n;      /* window of recent tokens for the penalty; 0 = all */
    uint64_t seed;
} cinfer_sampler_params;

/* Defaults: greedy, no filters, seed 0. */
cinfer_sampler_params cinfer_sampler_defaults(void);

typedef struct cinfer_sampler cinfer_sampler;
cinfer_status cinfer_sampler_new(const cinfer_sampler_params *p, int n_vocab, cinfer_sampler **out);
void cinfer_sampler_free(cinfer_sampler *s);
/* Picks the next token. logits [n_vocab] is modified in place (penalties,
 * filters). history [n_hist] is the context the repetition penalty sees. */
int32_t cinfer_sampler_sample(cinfer_sampler *s, float *logits, const int32_t *history, int n_hist);

/* Draws the next uniform in [0, 1) from the sampler's generator (the one its
 * sampling uses): the u of a cinfer_row_sampling, so a request's draws stay
 * seeded whichever function samples. */
double cinfer_sampler_uniform(cinfer_sampler *s);

/* ------------------------------------------- decode steps sampled by the backend */

/* A change to one logit before anything reads the row, applied in order:
 * mul != 0: CTRL penalty (a positive logit divided by value, a negative one
 * multiplied); mul == 0: logit += value (presence / frequency penalties,
 * logit_bias). */
typedef struct cinfer_logit_edit {
    int32_t token, mul;
    float value;
} cinfer_logit_edit;

#define CINFER_MAX_TOP 20
typedef struct cinfer_row_sampling {
    float temp;                       /* 0 = greedy */
    int top_k;                        /* 0 = off */
    float top_p, min_p;               /* 1, 0 = off */
    double u;                         /* uniform in [0, 1) for the draw (cinfer_sampler_uniform) */
    const cinfer_logit_edit *edits;   /* [n_edits] */
    int n_edits;
    int n_top;                        /* -1: no log-probs; else the chosen token's and the n_top (<= CINFER_MAX_TOP) most likely */
} cinfer_row_sampling;

typedef struct cinfer_row_pick {
    int32_t token;
    float logprob;                    /* of token, after the edits (n_top >= 0; else NAN) */
    int32_t top_id[CINFER_MAX_TOP];   /* the n_top most likely, descending */
    float top_logprob[CINFER_MAX_TOP];
} cinfer_row_pick;

/* One decode step of B sequences (row b feeds ids[b] to sequence seqs[b], as
 * cinfer_forward_seqs with L = 1) whose next tokens are chosen by the backend:
 * on CUDA the logits never leave the device, only out[B] does. The rule
 * (edits, temperature, top-k, top-p, min-p, the draw from u) is one
 * definition on every backend; it keeps mlx-lm's filters, and draws over the
 * kept ids in id order. Greedy rows return the first index of the maximum. */
cinfer_status cinfer_decode_sampled(cinfer_ctx *c, const int32_t *ids, int B, const int *seqs,
                                    const cinfer_row_sampling *rows, cinfer_row_pick *out);

/* -------------------------------------------------------------- generation */

typedef struct cinfer_gen_stats {
    int prompt_tokens, gen_tokens;
    double prompt_s, gen_s;    /* seconds in prefill / in decode */
    size_t peak_rss;           /* bytes, process peak resident set */
    int stopped_by_eos;
    int finish_reason;         /* cinfer_finish */
    size_t kv_bytes;           /* cinfer_ctx_cache_bytes at the end */
    size_t peak_memory;        /* cinfer_ctx_memory_bytes at the end (its peak: buffers only grow) */
} cinfer_gen_stats;

/* Called for each generated token with the text it completes (complete UTF-8
 * only; may be ""). Return non-zero to stop. */
typedef int (*cinfer_token_cb)(int32_t token, const char *text, void *user);

/* Feeds prompt[n_prompt] (must be >= 1 token) after the cached tokens, then
 * samples up to max_tokens tokens, stopping at an eos id or at the model's
 * context limit (max_position_embeddings; see cinfer_generate_ex). text in
 * the callback is NULL when the model has no tokenizer. */
cinfer_status cinfer_generate(cinfer_ctx *c, const int32_t *prompt, int n_prompt,
                              const cinfer_sampler_params *sp, int max_tokens,
                              cinfer_token_cb cb, void *user, cinfer_gen_stats *stats);

/* Why generation ended (mlx-lm's finish_reason). */
typedef enum cinfer_finish {
    CINFER_FINISH_LENGTH = 0,   /* "length": max_tokens generated */
    CINFER_FINISH_STOP = 1,     /* "stop": an eos id (or extra eos id) sampled, or the callback stopped it */
    CINFER_FINISH_CONTEXT = 2,  /* "context": the sequence reached the context limit */
} cinfer_finish;

typedef struct cinfer_gen_opts {
    int max_tokens;             /* -1: until an eos id or the context limit (default 100) */
    int max_context;            /* positions a sequence may hold (cached + prompt + generated):
                                 * 0 = the model's max_position_embeddings (default), -1 = no limit
                                 * (for a cache that rotates); a prompt that does not fit is refused */
    const int32_t *extra_eos;   /* [n_extra_eos] more ids that end generation, like the eos ids */
    int n_extra_eos;
    int logprobs;               /* 1: pass each chosen id's log-prob to the callback (else NAN) */
    int report_eos;             /* 1: call the callback for the eos id too (text "") */
} cinfer_gen_opts;

cinfer_gen_opts cinfer_gen_defaults(void);

/* As cinfer_token_cb, with the chosen id's log-probability: log-softmax of the
 * logits after the repetition penalty, before temperature and the filters (as
 * mlx-lm's generate_step yields it); NAN when not asked for and for the
 * final flush (token -1). */
typedef int (*cinfer_token_lp_cb)(int32_t token, const char *text, float logprob, void *user);

/* cinfer_generate with options (go may be NULL: the defaults). stats gets the
 * finish reason. A prompt that would not fit the context limit fails with
 * CINFER_EINVAL and a message saying so, before any forward. */
cinfer_status cinfer_generate_ex(cinfer_ctx *c, const int32_t *prompt, int n_prompt,
                                 const cinfer_sampler_params *sp, const cinfer_gen_opts *go,
                                 cinfer_token_lp_cb cb, void *user, cinfer_gen_stats *stats);

/* -------------------------------------------------------------- tokenizers */

/* Loads tokenizer.json (+ tokenizer_config.json) from a directory that may
 * hold only tokenizer files. */
cinfer_status cinfer_tokenizer_load(const char *dir, cinfer_tokenizer **out, char *err, size_t err_len);
void cinfer_tokenizer_free(cinfer_tokenizer *t);
int cinfer_tokenizer_n_vocab(const cinfer_tokenizer *t);
int cinfer_tokenizer_bos(const cinfer_tokenizer *t);  /* -1 if none */
int cinfer_tokenizer_eos(const cinfer_tokenizer *t);  /* -1 if none */

/* Encodes UTF-8 text. add_special: apply the post-processor's BOS/EOS as
 * tokenizer_config.json says. parse_special: match special tokens in text. */
cinfer_status cinfer_tokenize(const cinfer_tokenizer *t, const char *text, size_t len,
                              int add_special, int parse_special, int32_t **ids, int *n_ids);
/* Decodes ids to UTF-8 text; skip_special drops special tokens. */
cinfer_status cinfer_detokenize(const cinfer_tokenizer *t, const int32_t *ids, int n,
                                int skip_special, char **text);
/* The vocabulary piece of an id (as stored), or NULL if out of range. */
const char *cinfer_token_piece(const cinfer_tokenizer *t, int32_t id);

/* Streaming decoder: push ids one at a time; each push returns the newly
 * completed text (complete UTF-8 only, "" if none yet) valid until the next
 * call. */
typedef struct cinfer_detok_stream cinfer_detok_stream;
cinfer_detok_stream *cinfer_detok_stream_new(const cinfer_tokenizer *t, int skip_special);
const char *cinfer_detok_stream_push(cinfer_detok_stream *s, int32_t id);
const char *cinfer_detok_stream_flush(cinfer_detok_stream *s);  /* remaining bytes */
void cinfer_detok_stream_free(cinfer_detok_stream *s);

/* Renders the tokenizer's chat template. messages_json: a JSON array of
 * {"role","content",...}; tools_json and kwargs_json (an object of extra
 * template variables) may be NULL. */
cinfer_status cinfer_chat_render(const cinfer_tokenizer *t, const char *messages_json,
                                 const char *tools_json, const char *kwargs_json,
                                 int add_generation_prompt, char **out, char *err, size_t err_len);

/* 1 when the tokenizer has a chat template (tokenizer_config.json
 * "chat_template" or chat_template.jinja), else 0. */
int cinfer_tokenizer_has_chat_template(const cinfer_tokenizer *t);
/* cinfer_chat_render with the Jinja source `template_source` instead of the
 * tokenizer's own (NULL: the tokenizer's); the tokenizer still provides the
 * special-token variables (bos_token, eos_token, ...). */
cinfer_status cinfer_chat_render_with(const cinfer_tokenizer *t, const char *template_source,
                                      const char *messages_json, const char *tools_json,
                                      const char *kwargs_json, int add_generation_prompt,
                                      char **out, char *err, size_t err_len);

/* ----------------------------------------------------------------- scoring
 * Perplexity (mlx_lm.perplexity), KL divergence (llama.cpp --kl-divergence)
 * and response log-probs, over the forward contract: rows are fed in
 * position chunks through the cache and the LM head runs only at positions
 * that are scored. Log-softmax and cross-entropy are float32 per position
 * (the normaliser summed in double); totals and statistics are double.
 * Functions that fail write a message into err[err_len] (may be NULL). */

typedef enum cinfer_shuffle {
    CINFER_SHUFFLE_NUMPY = 0,     /* np.random.seed(s); np.random.permutation(n) (MT19937, legacy) */
    CINFER_SHUFFLE_MULBERRY32 = 1,/* mlx-bun: Fisher-Yates, j = floor(mulberry32() * (i + 1)) */
    CINFER_SHUFFLE_NONE = 2,      /* file order */
} cinfer_shuffle;

/* Writes a permutation of 0..n-1 into perm[n] exactly as the named generator
 * seeded with `seed` produces it. */
cinfer_status cinfer_shuffle_perm(cinfer_shuffle kind, uint32_t seed, int n, int32_t *perm);

typedef struct cinfer_data_opts {
    int seq_len;          /* tokens per row, >= 2 (default 512) */
    int num_samples;      /* rows kept; -1 = every full row (default 256) */
    uint32_t seed;        /* default 123 */
    cinfer_shuffle shuffle;  /* default CINFER_SHUFFLE_NUMPY */
} cinfer_data_opts;

/* mlx_lm's defaults: seq_len 512, num_samples 256, seed 123, numpy shuffle. */
cinfer_data_opts cinfer_data_defaults(void);

/* mlx_lm's load_data on tokenized samples: visits samples[perm[k]]
 * (lens[perm[k]] tokens) in the shuffle's order, appending to one stream until it
 * holds seq_len * num_samples tokens (or the samples run out), then cuts it
 * into min(len / seq_len, num_samples) non-overlapping rows. *rows is
 * malloc'd [n_rows][seq_len]. Fewer tokens than one row is an error. */
cinfer_status cinfer_pack_rows(const int32_t *const *samples, const int *lens, int n_samples,
                               const cinfer_data_opts *o, int32_t **rows, int *n_rows,
                               char *err, size_t err_len);

/* Reads a data file and packs it as above. `.jsonl`: one JSON object a line,
 * {"text"} (encoded with the tokenizer's special tokens, EOS appended unless
 * last), {"messages": [...], "tools"?} or {"prompt","completion"} (rendered
 * through the chat template as user/assistant turns, tokenized without
 * adding special tokens, no EOS appended: mlx_lm's rules); blank lines are
 * skipped, a bad line is an error naming "path:line"; {"tokens": [ids]} is
 * taken as is (no tokenizer needed, t may be NULL). Any other file is one
 * text sample. eos: the id to append, -1 = the tokenizer's. Every line is
 * checked first; only the samples that the rows need are tokenized. */
cinfer_status cinfer_load_rows(const cinfer_tokenizer *t, int eos, const char *path,
                               const cinfer_data_opts *o, int32_t **rows, int *n_rows,
                               char *err, size_t err_len);
/* As cinfer_load_rows on data[len] already in memory (standard input):
 * `name` stands for the path in messages, jsonl = 1 reads it as JSONL. Every
 * JSONL line is checked (JSON, and a shape above) before any row is cut. */
cinfer_status cinfer_load_rows_mem(const cinfer_tokenizer *t, int eos, const char *name,
                                   const char *data, size_t len, int jsonl,
                                   const cinfer_data_opts *o, int32_t **rows, int *n_rows,
                                   char *err, size_t err_len);

/* Progress of a long scoring run: done of total scored positions. Return
 * non-zero to stop (the call then fails with CINFER_EINVAL, "stopped"). */
typedef int (*cinfer_progress_cb)(int64_t done, int64_t total, void *user);

typedef struct cinfer_ppl_result {
    double perplexity;      /* exp(mean_loss) */
    double standard_error;  /* perplexity * std_loss / sqrt(tokens) (delta method) */
    double mean_loss;       /* mean cross-entropy in nats */
    double std_loss;        /* sample standard deviation (ddof 1) of the losses */
    int64_t tokens;         /* scored positions: rows * (seq_len - 1) */
    int rows;
    double seconds;         /* wall time of the forwards */
} cinfer_ppl_result;

/* mlx_lm.perplexity's evaluation: rows[n_rows][L] in batches of batch_size;
 * each row's first L-1 tokens are fed and every position is scored against
 * the next token. nll (may be NULL) receives the losses [n_rows][L-1]. */
cinfer_status cinfer_perplexity(cinfer_ctx *c, const int32_t *rows, int n_rows, int L, int batch_size,
                                float *nll, cinfer_progress_cb cb, void *user,
                                cinfer_ppl_result *out, char *err, size_t err_len);

/* One scored position of a KL run. */
typedef struct cinfer_kl_token {
    float kld;          /* sum over i with log p_base(i) > -16 of p_base(i) (log p_base(i) - log p_model(i)) */
    float nll_model;    /* -log p_model(next token) */
    float nll_base;     /* -log p_base(next token) */
    float dp;           /* p_model(next) - p_base(next) */
    int32_t same_top;   /* 1 when both argmaxes (first index on ties) agree */
} cinfer_kl_token;

/* llama.cpp's KL-divergence report (fractions, not percent). Uncertainties
 * as llama.cpp: sqrt((E[x^2] - E[x]^2) / (n - 1)), 0 when n <= 10. */
typedef struct cinfer_kl_stats {
    int64_t tokens;
    double ppl_model, ppl_model_unc, ppl_base, ppl_base_unc;
    double cor_ln_ppl;             /* correlation of the per-token nlls, -1..1 */
    double ln_ratio, ln_ratio_unc; /* mean ln(PPL(Q)/PPL(base)) */
    double ratio, ratio_unc;       /* PPL(Q)/PPL(base) */
    double diff, diff_unc;         /* PPL(Q) - PPL(base) */
    double mean_kld, kld_unc;
    double kld_q[11];   /* max, 99.9%, 99%, 95%, 90%, median, 10%, 5%, 1%, 0.1%, min */
    double mean_dp, dp_unc;
    double dp_q[13];    /* max, 99.9%, 99%, 95%, 90%, 75%, median, 25%, 10%, 5%, 1%, 0.1%, min */
    double rms_dp, rms_dp_unc;
    double same_top, same_top_unc; /* fraction of positions with the same argmax */
} cinfer_kl_stats;

/* A file of base-model log-probs (--save-base / --base-logprobs). Per scored
 * position it keeps the exact next-token nll (f32) and argmax (i32) and the
 * full-vocabulary log-probs as llama.cpp's 16-bit code: entries above
 * max-16 as scale*q + min (|error| <= 16/65535/2 = 1.22e-4 nats), the rest
 * clamped to that floor (<= -16, so outside the KLD sum). So PPL(base),
 * Δp and same-top are exact; each KLD term is off by at most ~1.2e-4 relative
 * (|ΔKLD| <= 1.22e-4 * (1 + E_base|log p_base - log p_model|) per token). */
typedef struct cinfer_kl_base cinfer_kl_base;

/* Scores rows[n_rows][L] with the base model and writes the file. */
cinfer_status cinfer_kl_save_base(cinfer_ctx *base, const int32_t *rows, int n_rows, int L, int batch_size,
                                  const char *path, cinfer_progress_cb cb, void *user,
                                  char *err, size_t err_len);
/* Opens a file written by cinfer_kl_save_base (header and size checked). */
cinfer_status cinfer_kl_base_open(const char *path, cinfer_kl_base **out, char *err, size_t err_len);
void cinfer_kl_base_free(cinfer_kl_base *b);
/* The rows stored in the file ([n_rows][L], owned by the handle) and its vocab size. */
const int32_t *cinfer_kl_base_rows(const cinfer_kl_base *b, int *n_rows, int *L, int *n_vocab);

/* KL of `model` against a base: either a live context `base` over rows
 * [n_rows][L], or a file (`file`; rows/n_rows/L are then taken from it and
 * may be 0). Exactly one of base/file is non-NULL; the vocabularies must
 * agree. Positions as in cinfer_perplexity. per_token (may be NULL) receives
 * [n_rows][L-1] entries. */
cinfer_status cinfer_kl(cinfer_ctx *model, cinfer_ctx *base, cinfer_kl_base *file,
                        const int32_t *rows, int n_rows, int L, int batch_size,
                        cinfer_kl_token *per_token, cinfer_progress_cb cb, void *user,
                        cinfer_kl_stats *out, char *err, size_t err_len);

/* One prompt/response pair for response log-probs. */
typedef struct cinfer_lp_seq {
    const int32_t *prompt;   /* [n_prompt], n_prompt >= 1 */
    int n_prompt;
    const int32_t *response; /* [n_response], n_response >= 0 */
    int n_response;
} cinfer_lp_seq;

/* Summed log-likelihood of each response given its prompt, in padded batches
 * of batch_size rows; the LM head runs only at response positions. sum[n]
 * receives the totals (double); per_token (may be NULL) receives every
 * response token's log-prob, the sequences' tokens concatenated in order. */
cinfer_status cinfer_response_logprobs(cinfer_ctx *c, const cinfer_lp_seq *seqs, int n, int batch_size,
                                       double *sum, float *per_token, cinfer_progress_cb cb, void *user,
                                       char *err, size_t err_len);
/* The same with a prefix tier (NULL: none): each prompt but its last token is
 * restored from the tier's longest stored prefix, the rest fed one row at a
 * time and stored (cinfer_tier_prefill), so prompts repeated across pairs
 * (DPO's chosen/rejected) and across runs are computed once. The scores are
 * those without a tier. *cached_tokens (may be NULL): prompt tokens taken
 * from disk. The context needs a sequence per row of a batch. */
cinfer_status cinfer_response_logprobs_tier(cinfer_ctx *c, cinfer_tier *tier, const cinfer_lp_seq *seqs, int n,
                                            int batch_size, double *sum, float *per_token, cinfer_progress_cb cb,
                                            void *user, int64_t *cached_tokens, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
