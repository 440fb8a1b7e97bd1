/*
 * decode.c — ids -> text through the tokenizer.json decoder chain, whole
 * (cinfer_detokenize) or streaming (cinfer_detok_stream_*).
 *
 * Both run the same incremental machine, so a stream's concatenated output
 * equals the whole decode by construction. Per token: the piece (added
 * content or vocab piece) gets the per-token decoders (Replace, Metaspace,
 * a Strip before any Fuse); ByteFallback collects consecutive <0xXX> tokens
 * and, when the run ends, emits them as UTF-8 or, if invalid, one U+FFFD per
 * byte (HF's rule); ByteLevel maps chars back to bytes. The fused byte stream
 * then loses up to N leading spaces (Strip after Fuse) and passes a lossy
 * UTF-8 stage that holds an incomplete tail (at most 3 bytes) until it
 * completes, and replaces invalid sequences with U+FFFD as Rust's
 * from_utf8_lossy does. Without a decoder HF joins pieces with " ".
 */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

struct cinfer_detok_stream {
    const cinfer_tokenizer *t;
    int skip_special;
    tok_buf out;          /* text returned by the last push/flush */
    tok_buf grp;          /* pending byte-fallback run */
    unsigned char pend[4];
    int pend_n;           /* incomplete UTF-8 tail */
    int strip_left;       /* leading spaces still to strip from the whole text */
    long n_tok;           /* tokens decoded so far (not skipped) */
    tok_buf tmp, tmp2;
    int has_fallback, has_bytelevel, strip_per_token, per_token_strip_n, no_decoder;
};

static int emit_bytes(cinfer_detok_stream *s, const char *b, size_t n) {
    while (s->strip_left > 0 && n > 0) {
        if (b[0] != ' ') { s->strip_left = 0; break; }
        b++; n--; s->strip_left--;
    }
    if (n && s->strip_left) s->strip_left = 0;
    size_t i = 0;
    const unsigned char *u = (const unsigned char *)b;
    while (s->pend_n && i < n) {
        s->pend[s->pend_n++] = u[i++];
        int l = tok_utf8_next(s->pend, (size_t)s->pend_n);
        if (l == 0) continue;
        if (l > 0) {
            if (tok_buf_put(&s->out, (const char *)s->pend, (size_t)l)) return -1;
            s->pend_n = 0;
        } else {
            /* invalid: one U+FFFD for the maximal subpart, re-scan the rest */
            int k = -l;
            if (tok_buf_put(&s->out, "\xef\xbf\xbd", 3)) return -1;
            int rest = s->pend_n - k;
            i -= (size_t)rest;    /* those bytes came from b (pend held < k) */
            s->pend_n = 0;
        }
    }
    size_t start = i;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int l = tok_utf8_next(u + i, n - i);
        if (l > 0) { i += (size_t)l; continue; }
        if (tok_buf_put(&s->out, b + start, i - start)) return -1;
        if (l == 0) {
            s->pend_n = (int)(n - i);
            memcpy(s->pend, u + i, n - i);
            return 0;
        }
        if (tok_buf_put(&s->out, "\xef\xbf\xbd", 3)) return -1;
        i += (size_t)-l;
        start = i;
    }
    return tok_buf_put(&s->out, b + start, n - start);
}

static int flush_group(cinfer_detok_stream *s) {
    if (!s->grp.n) return 0;
    const unsigned char *u = (const unsigned char *)s->grp.p;
    size_t n = s->grp.n, i = 0;
    int ok = 1;
    while (i < n) {
        int l = tok_utf8_next(u + i, n - i);
        if (l <= 0) { ok = 0; break; }
        i += (size_t)l;
    }
    int rc = 0;
    if (ok) rc = emit_bytes(s, s->grp.p, n);
    else
        for (size_t k = 0; k < n && !rc; k++) rc = emit_bytes(s, "\xef\xbf\xbd", 3);
    s->grp.n = 0;
    return rc;
}

static int replace_all(tok_buf *o, const char *s, size_t n, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), i = 0;
    o->n = 0;
    while (i < n) {
        const char *hit = memmem(s + i, n - i, from, fl);
        if (!hit) break;
        size_t k = (size_t)(hit - s);
        if (tok_buf_put(o, s + i, k - i) || tok_buf_put(o, to, tl)) return -1;
        i = k + fl;
    }
    return tok_buf_put(o, s + i, n - i);
}

static int byte_of_piece(const char *p, size_t n) {
    if (n != 6 || memcmp(p, "<0x", 3) || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else return -1;
    }
    return v;
}

static int push_id(cinfer_detok_stream *s, int32_t id) {
    const cinfer_tokenizer *t = s->t;
    if (id < 0 || id >= t->n_vocab || !t->piece[id]) return 0;  /* HF skips unknown ids */
    if (s->skip_special && t->is_special[id]) return 0;
    const char *p = t->piece[id];
    size_t n = t->piece_len[id];
    int first = s->n_tok++ == 0;
    if (s->no_decoder) {
        if (!first && emit_bytes(s, " ", 1)) return -1;
        return emit_bytes(s, p, n);
    }
    /* per-token decoders, in chain order up to the first fusing one */
    for (int k = 0; k < t->n_dec; k++) {
        int d = t->dec[k];
        if (d == TD_FUSE || d == TD_BYTELEVEL) break;
        if (d == TD_REPLACE) {
            if (replace_all(&s->tmp, p, n, t->dec_repl_from, t->dec_repl_to)) return -1;
        } else if (d == TD_METASPACE) {
            /* HF: in the first token every replacement char is dropped */
            if (replace_all(&s->tmp, p, n, t->dec_meta_repl, first && t->dec_meta_first ? "" : " ")) return -1;
        } else if (d == TD_STRIP) {
            size_t a = 0;
            while (a < n && (int)a < t->dec_strip_start && p[a] == ' ') a++;
            s->tmp.n = 0;
            if (tok_buf_put(&s->tmp, p + a, n - a)) return -1;
        } else continue;
        tok_buf sw = s->tmp; s->tmp = s->tmp2; s->tmp2 = sw;
        p = s->tmp2.p;
        n = s->tmp2.n;
    }
    if (s->has_fallback) {
        int b = byte_of_piece(p, n);
        if (b >= 0) {
            char c = (char)b;
            return tok_buf_put(&s->grp, &c, 1);
        }
        if (flush_group(s)) return -1;
    }
    if (s->has_bytelevel) {
        /* chars -> bytes; a piece with a char outside the map goes raw */
        s->tmp.n = 0;
        const unsigned char *u = (const unsigned char *)p;
        for (size_t i = 0; i < n;) {
            int l = tok_utf8_next(u + i, n - i);
            int by = l > 0 ? tok_cp_to_byte(tok_utf8_decode(u + i, l)) : -1;
            if (by < 0) { s->tmp.n = 0; if (tok_buf_put(&s->tmp, p, n)) return -1; break; }
            char c = (char)by;
            if (tok_buf_put(&s->tmp, &c, 1)) return -1;
            i += (size_t)l;
        }
        return emit_bytes(s, s->tmp.p ? s->tmp.p : "", s->tmp.n);
    }
    return emit_bytes(s, p, n);
}

cinfer_detok_stream *cinfer_detok_stream_new(const cinfer_tokenizer *t, int skip_special) {
    if (!t) return NULL;
    cinfer_detok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->t = t;
    s->skip_special = skip_special;
    int fused = 0;
    s->no_decoder = t->n_dec == 0;
    for (int k = 0; k < t->n_dec; k++) {
        int d = t->dec[k];
        if (d == TD_BYTEFALLBACK) s->has_fallback = 1;
        if (d == TD_BYTELEVEL) s->has_bytelevel = 1;
        if (d == TD_FUSE || d == TD_BYTELEVEL) fused = 1;
        if (d == TD_STRIP && fused) s->strip_left = t->dec_strip_start;
    }
    if (tok_buf_put(&s->out, "", 0)) { free(s); return NULL; }
    return s;
}

const char *cinfer_detok_stream_push(cinfer_detok_stream *s, int32_t id) {
    if (!s) return NULL;
    s->out.n = 0;
    s->out.p[0] = 0;
    if (push_id(s, id)) return NULL;
    return s->out.p;
}

const char *cinfer_detok_stream_flush(cinfer_detok_stream *s) {
    if (!s) return NULL;
    s->out.n = 0;
    s->out.p[0] = 0;
    if (flush_group(s)) return NULL;
    if (s->pend_n) {
        s->pend_n = 0;
        if (tok_buf_put(&s->out, "\xef\xbf\xbd", 3)) return NULL;
    }
    return s->out.p;
}

void cinfer_detok_stream_free(cinfer_detok_stream *s) {
    if (!s) return;
    free(s->out.p);
    free(s->grp.p);
    free(s->tmp.p);
    free(s->tmp2.p);
    free(s);
}

cinfer_status cinfer_detokenize(const cinfer_tokenizer *t, const int32_t *ids, int n, int skip_special,
                                char **text) {
    if (!text) return CINFER_EINVAL;
    *text = NULL;
    if (!t || n < 0 || (n && !ids)) return CINFER_EINVAL;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return CINFER_EINVAL;
    cinfer_detok_stream *s = cinfer_detok_stream_new(t, skip_special);
    if (!s) return CINFER_ENOMEM;
    /* accumulate straight into one buffer: the stream appends to s->out */
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = push_id(s, ids[i]);
    if (!rc) rc = flush_group(s);
    if (!rc && s->pend_n) { s->pend_n = 0; rc = tok_buf_put(&s->out, "\xef\xbf\xbd", 3); }
    if (rc) { cinfer_detok_stream_free(s); return CINFER_ENOMEM; }
    *text = s->out.p;
    s->out.p = NULL;
    cinfer_detok_stream_free(s);
    return CINFER_OK;
}
