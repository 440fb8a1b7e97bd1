/*
 * score-data.c — the data side of perplexity and KL: seeded shuffles and
 * mlx_lm's load_data (samples visited in a permutation, concatenated, cut
 * into non-overlapping rows).
 *
 * Shuffles, bit-exact with their references:
 *   numpy      np.random.seed(s) -> MT19937 init_genrand(s); permutation(n)
 *              is the legacy shuffle: for i = n-1 .. 1, j = random_interval(i)
 *              (32-bit outputs masked with the smallest all-ones mask >= i,
 *              rejected while > i), swap(i, j).  (numpy/random/mtrand.pyx,
 *              numpy/random/src/distributions/distributions.c)
 *   mulberry32 mlx-bun src/eval/perplexity.ts: the same descending loop with
 *              j = floor(rnd * (i + 1)), rnd = mulberry32 / 2^32.
 * Data files: .jsonl with {"text"} / {"messages"} / {"prompt","completion"}
 * (or {"tokens": [ids]}, taken as is: tests and benchmarks),
 * anything else one text sample. Samples are tokenized lazily, in visit
 * order, so a large file costs only the tokens the rows need.
 * Unlike mlx_lm (mlx-lm#1690), num_samples = -1 takes every full row and a
 * too-small dataset stops at its end instead of indexing past perm.
 */
#include <jansson.h>
#include <string.h>
#include "engine/engine.h"
#include "util.h"

/* ------------------------------------------------------------ shuffles */

typedef struct { uint32_t mt[624]; int i; } mt19937;

static void mt_seed(mt19937 *s, uint32_t seed) {
    s->mt[0] = seed;
    for (int i = 1; i < 624; i++) s->mt[i] = 1812433253u * (s->mt[i - 1] ^ (s->mt[i - 1] >> 30)) + (uint32_t)i;
    s->i = 624;
}

static uint32_t mt_next(mt19937 *s) {
    if (s->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (s->mt[k] & 0x80000000u) | (s->mt[(k + 1) % 624] & 0x7fffffffu);
            s->mt[k] = s->mt[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        s->i = 0;
    }
    uint32_t y = s->mt[s->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* NumPy's legacy random_interval for max < 2^32 */
static uint32_t mt_interval(mt19937 *s, uint32_t max) {
    if (max == 0) return 0;
    uint32_t mask = max, v;
    mask |= mask >> 1; mask |= mask >> 2; mask |= mask >> 4; mask |= mask >> 8; mask |= mask >> 16;
    while ((v = mt_next(s) & mask) > max) {}
    return v;
}

static double mulberry32(uint32_t *st) {
    *st += 0x6d2b79f5u;
    uint32_t t = *st;
    t = (t ^ (t >> 15)) * (t | 1u);
    t ^= t + (t ^ (t >> 7)) * (t | 61u);
    return (double)(t ^ (t >> 14)) / 4294967296.0;
}

cinfer_status cinfer_shuffle_perm(cinfer_shuffle kind, uint32_t seed, int n, int32_t *perm) {
    if (n < 0 || (n > 0 && !perm)) return CINFER_EINVAL;
    for (int i = 0; i < n; i++) perm[i] = i;
    if (kind == CINFER_SHUFFLE_NONE) return CINFER_OK;
    if (kind == CINFER_SHUFFLE_NUMPY) {
        mt19937 *s = malloc(sizeof *s);
        if (!s) return CINFER_ENOMEM;
        mt_seed(s, seed);
        for (int i = n - 1; i > 0; i--) {
            int j = (int)mt_interval(s, (uint32_t)i);
            int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        free(s);
        return CINFER_OK;
    }
    if (kind == CINFER_SHUFFLE_MULBERRY32) {
        uint32_t st = seed;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(mulberry32(&st) * (i + 1));
            int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        return CINFER_OK;
    }
    return CINFER_EINVAL;
}

cinfer_data_opts cinfer_data_defaults(void) {
    cinfer_data_opts o = {512, 256, 123, CINFER_SHUFFLE_NUMPY};
    return o;
}

/* ------------------------------------------------------------- packing */

/* a source of samples: get(i) yields sample i's tokens (valid until the next call) */
typedef cinfer_status (*sample_fn)(void *user, int i, const int32_t **ids, int *n, char *err, size_t en);

static cinfer_status pack(sample_fn get, void *user, int n_samples, const cinfer_data_opts *o,
                          int32_t **rows, int *n_rows, char *err, size_t en) {
    *rows = NULL;
    *n_rows = 0;
    if (!o) return cf_err(err, en, CINFER_EINVAL, "no data options");
    int L = o->seq_len;
    if (L < 2) return cf_err(err, en, CINFER_EINVAL, "sequence length %d: need at least 2 tokens a row", L);
    if (o->num_samples == 0 || o->num_samples < -1)
        return cf_err(err, en, CINFER_EINVAL, "num_samples %d: want a positive count or -1 (all rows)", o->num_samples);
    if (n_samples <= 0) return cf_err(err, en, CINFER_EINVAL, "the data holds no samples");
    int64_t want = o->num_samples < 0 ? INT64_MAX : (int64_t)L * o->num_samples;
    int32_t *perm = malloc(sizeof *perm * (size_t)n_samples);
    if (!perm) return cf_err(err, en, CINFER_ENOMEM, "out of memory");
    cinfer_status st = cinfer_shuffle_perm(o->shuffle, o->seed, n_samples, perm);
    if (st) { free(perm); return cf_err(err, en, st, "unknown shuffle %d", (int)o->shuffle); }
    size_t cap = 1 << 16, len = 0;
    int32_t *stream = malloc(cap * sizeof *stream);
    for (int k = 0; stream && !st && k < n_samples && (int64_t)len < want; k++) {
        const int32_t *ids;
        int n;
        st = get(user, perm[k], &ids, &n, err, en);
        if (st) break;
        if (len + (size_t)n > cap) {
            while (len + (size_t)n > cap) cap *= 2;
            int32_t *p = realloc(stream, cap * sizeof *stream);
            if (!p) { free(stream); stream = NULL; break; }
            stream = p;
        }
        if (n) memcpy(stream + len, ids, (size_t)n * sizeof *ids);
        len += (size_t)n;
    }
    free(perm);
    if (!stream) return cf_err(err, en, CINFER_ENOMEM, "out of memory for the token stream");
    if (st) { free(stream); return st; }
    int64_t nr = (int64_t)len / L;
    if (o->num_samples > 0 && nr > o->num_samples) nr = o->num_samples;
    if (nr > INT32_MAX / 2) nr = INT32_MAX / 2;
    if (nr < 1) {
        free(stream);
        return cf_err(err, en, CINFER_EINVAL, "the data holds %zu tokens, fewer than one row of %d", len, L);
    }
    *rows = stream;   /* the tail past nr * L is unused */
    *n_rows = (int)nr;
    return CINFER_OK;
}

typedef struct { const int32_t *const *s; const int *lens; } mem_src;

static cinfer_status mem_get(void *u, int i, const int32_t **ids, int *n, char *err, size_t en) {
    mem_src *m = u;
    if (m->lens[i] < 0 || (m->lens[i] > 0 && !m->s[i])) return cf_err(err, en, CINFER_EINVAL, "sample %d: bad length %d", i, m->lens[i]);
    *ids = m->s[i];
    *n = m->lens[i];
    return CINFER_OK;
}

cinfer_status cinfer_pack_rows(const int32_t *const *samples, const int *lens, int n_samples,
                               const cinfer_data_opts *o, int32_t **rows, int *n_rows, char *err, size_t en) {
    if (n_samples > 0 && (!samples || !lens)) return cf_err(err, en, CINFER_EINVAL, "no samples");
    mem_src m = {samples, lens};
    return pack(mem_get, &m, n_samples, o, rows, n_rows, err, en);
}

/* --------------------------------------------------------- data files */

enum { S_TEXT, S_CHAT, S_COMPLETION };

typedef struct {
    const cinfer_tokenizer *t;
    int eos;
    const char *path;
    char *buf;            /* the file */
    int n;
    char **line;          /* [n] sample text or JSON line (into buf) */
    int *lineno;          /* [n] 1-based line numbers */
    int jsonl;
    int32_t *ids;         /* last tokenized sample */
} file_src;

static cinfer_status tok_text(file_src *f, const char *text, int add_special, int32_t **ids, int *n,
                              char *err, size_t en, int ln) {
    if (!f->t) return cf_err(err, en, CINFER_EINVAL, "%s:%d: text needs a tokenizer (the model directory has none)", f->path, ln);
    cinfer_status st = cinfer_tokenize(f->t, text, strlen(text), add_special, 1, ids, n);
    if (st) return cf_err(err, en, st, "%s:%d: tokenizing failed (%s)", f->path, ln, cinfer_status_str(st));
    return CINFER_OK;
}

static cinfer_status chat_ids(file_src *f, json_t *msgs, json_t *tools, int ln, int32_t **ids, int *n,
                              char *err, size_t en) {
    char *mj = json_dumps(msgs, JSON_COMPACT), *tj = tools && !json_is_null(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
    char *text = NULL, terr[512] = "";
    cinfer_status st = mj ? cinfer_chat_render(f->t, mj, tj, NULL, 0, &text, terr, sizeof terr) : CINFER_ENOMEM;
    free(mj);
    free(tj);
    if (st) return cf_err(err, en, st, "%s:%d: chat template failed: %s", f->path, ln, terr[0] ? terr : cinfer_status_str(st));
    st = tok_text(f, text, 0, ids, n, err, en, ln);
    free(text);
    return st;
}

/* the sample kind of a parsed JSONL line, -1 when it has none */
static int line_kind(json_t *o) {
    if (json_is_array(json_object_get(o, "messages"))) return S_CHAT;
    if (json_is_string(json_object_get(o, "prompt")) && json_is_string(json_object_get(o, "completion"))) return S_COMPLETION;
    if (json_is_string(json_object_get(o, "text"))) return S_TEXT;
    return -1;
}

/* every line, before any is scored: a bad line late in the file is an error
 * whether or not the rows reach it (tokens are still made lazily) */
static cinfer_status validate_lines(const file_src *f, char *err, size_t en) {
    for (int i = 0; i < f->n; i++) {
        json_error_t je;
        json_t *o = json_loads(f->line[i], 0, &je), *tk = json_object_get(o, "tokens");
        int ok = json_is_object(o) && (json_is_array(tk) || line_kind(o) >= 0);
        size_t k;
        json_t *v;
        if (ok && json_is_array(tk))
            json_array_foreach(tk, k, v) if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) ok = 0;
        json_decref(o);
        if (!o) return cf_err(err, en, CINFER_EFORMAT, "%s:%d: not valid JSON (%s)", f->path, f->lineno[i], je.text);
        if (!ok)
            return cf_err(err, en, CINFER_EFORMAT, "%s:%d: expected an object with \"text\", \"messages\" or "
                          "\"prompt\"+\"completion\" strings, or \"tokens\": [non-negative ids]", f->path, f->lineno[i]);
    }
    return CINFER_OK;
}

static cinfer_status file_get(void *u, int i, const int32_t **out, int *n_out, char *err, size_t en) {
    file_src *f = u;
    free(f->ids);
    f->ids = NULL;
    int ln = f->lineno[i], n = 0, kind = S_TEXT;
    cinfer_status st;
    if (!f->jsonl) {
        st = tok_text(f, f->line[i], 1, &f->ids, &n, err, en, ln);
    } else {
        json_error_t je;
        json_t *o = json_loads(f->line[i], 0, &je);
        if (!o) return cf_err(err, en, CINFER_EFORMAT, "%s:%d: not valid JSON (%s)", f->path, ln, je.text);
        json_t *text = json_object_get(o, "text"), *msgs = json_object_get(o, "messages");
        json_t *pr = json_object_get(o, "prompt"), *co = json_object_get(o, "completion");
        json_t *tk = json_object_get(o, "tokens");
        if (json_is_array(tk)) {   /* pre-tokenized: taken as is */
            size_t k, nt = json_array_size(tk);
            json_t *v;
            f->ids = malloc(sizeof *f->ids * (nt ? nt : 1));
            if (!f->ids) { json_decref(o); return cf_err(err, en, CINFER_ENOMEM, "out of memory"); }
            json_array_foreach(tk, k, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                    json_decref(o);
                    return cf_err(err, en, CINFER_EFORMAT, "%s:%d: \"tokens\" must hold non-negative integer ids", f->path, ln);
                }
                f->ids[k] = (int32_t)json_integer_value(v);
            }
            json_decref(o);
            *out = f->ids;
            *n_out = (int)nt;
            return CINFER_OK;
        }
        kind = line_kind(o);
        if (kind < 0) {
            json_decref(o);
            return cf_err(err, en, CINFER_EFORMAT, "%s:%d: expected an object with \"text\", \"messages\" or \"prompt\"+\"completion\" strings", f->path, ln);
        }
        if (kind == S_TEXT) st = tok_text(f, json_string_value(text), 1, &f->ids, &n, err, en, ln);
        else if (kind == S_CHAT) st = chat_ids(f, msgs, json_object_get(o, "tools"), ln, &f->ids, &n, err, en);
        else {
            json_t *m = json_pack("[{s:s,s:O},{s:s,s:O}]", "role", "user", "content", pr, "role", "assistant", "content", co);
            st = m ? chat_ids(f, m, NULL, ln, &f->ids, &n, err, en) : CINFER_ENOMEM;
            json_decref(m);
        }
        json_decref(o);
    }
    if (st) return st;
    if (kind == S_TEXT && f->eos >= 0 && (n == 0 || f->ids[n - 1] != f->eos)) {
        int32_t *p = realloc(f->ids, sizeof *p * (size_t)(n + 1));
        if (!p) return cf_err(err, en, CINFER_ENOMEM, "out of memory");
        f->ids = p;
        f->ids[n++] = f->eos;
    }
    *out = f->ids;
    *n_out = n;
    return CINFER_OK;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static cinfer_status load_rows(file_src *f_, size_t len, const cinfer_data_opts *o, int32_t **rows, int *n_rows,
                               char *err, size_t en);

cinfer_status cinfer_load_rows(const cinfer_tokenizer *t, int eos, const char *path, const cinfer_data_opts *o,
                               int32_t **rows, int *n_rows, char *err, size_t en) {
    *rows = NULL;
    *n_rows = 0;
    file_src f = {0};
    size_t len;
    cinfer_status st = cf_read_file(path, &f.buf, &len, err, en);
    if (st) return st;
    f.t = t;
    f.eos = eos >= 0 ? eos : t ? cinfer_tokenizer_eos(t) : -1;
    f.path = path;
    f.jsonl = ends_with(path, ".jsonl") || ends_with(path, ".ndjson");
    return load_rows(&f, len, o, rows, n_rows, err, en);
}

cinfer_status cinfer_load_rows_mem(const cinfer_tokenizer *t, int eos, const char *name, const char *data, size_t len,
                                   int jsonl, const cinfer_data_opts *o, int32_t **rows, int *n_rows, char *err, size_t en) {
    *rows = NULL;
    *n_rows = 0;
    file_src f = {0};
    if (!data || !name) return cf_err(err, en, CINFER_EINVAL, "cinfer_load_rows_mem: NULL data or name");
    if (!(f.buf = malloc(len + 1))) return cf_err(err, en, CINFER_ENOMEM, "%s: out of memory", name);
    memcpy(f.buf, data, len);
    f.buf[len] = 0;
    f.t = t;
    f.eos = eos >= 0 ? eos : t ? cinfer_tokenizer_eos(t) : -1;
    f.path = name;
    f.jsonl = jsonl;
    return load_rows(&f, len, o, rows, n_rows, err, en);
}

/* f holds the data (f->buf, owned: freed here), its name and kind */
static cinfer_status load_rows(file_src *f_, size_t len, const cinfer_data_opts *o, int32_t **rows, int *n_rows,
                               char *err, size_t en) {
    file_src f = *f_;
    const char *path = f.path;
    cinfer_status st = CINFER_OK;
    if (strlen(f.buf) != len) { free(f.buf); return cf_err(err, en, CINFER_EFORMAT, "%s: the file holds a NUL byte", path); }
    int cap = 0;
    if (!f.jsonl) {
        cap = 1;
        f.line = malloc(sizeof *f.line);
        f.lineno = malloc(sizeof *f.lineno);
        if (f.line && f.lineno && len > 0) { f.line[0] = f.buf; f.lineno[0] = 1; f.n = 1; }
    } else {
        int ln = 0;
        for (char *p = f.buf; p && *p;) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = 0;
            ln++;
            char *q = p;
            while (*q == ' ' || *q == '\t' || *q == '\r') q++;
            if (*q) {
                if (f.n == cap) {
                    cap = cap ? cap * 2 : 256;
                    char **a = realloc(f.line, sizeof *a * cap);
                    if (a) f.line = a;
                    int *b = realloc(f.lineno, sizeof *b * cap);
                    if (b) f.lineno = b;
                    if (!a || !b) { st = CINFER_ENOMEM; break; }
                }
                f.line[f.n] = q;
                f.lineno[f.n++] = ln;
            }
            p = nl ? nl + 1 : NULL;
        }
    }
    if (st || (cap && (!f.line || !f.lineno))) st = cf_err(err, en, CINFER_ENOMEM, "out of memory");
    else if (f.n == 0) st = cf_err(err, en, CINFER_EINVAL, "%s: the file is empty (no samples)", path);
    else if (f.jsonl && (st = validate_lines(&f, err, en))) {}
    else {
        char perr[512] = "";
        st = pack(file_get, &f, f.n, o, rows, n_rows, perr, sizeof perr);
        if (st) cf_err(err, en, st, "%s%s%s", strncmp(perr, path, strlen(path)) ? path : "",
                       strncmp(perr, path, strlen(path)) ? ": " : "", perr);
    }
    free(f.ids);
    free(f.line);
    free(f.lineno);
    free(f.buf);
    return st;
}
