/*
 * serve-engine.c — the scheduler thread of `cinfer serve`: the only thread
 * that touches the model's context.
 *
 * Slots 0..max_batch-1 are sequences of running choices (slot i = sequence
 * i); sequences max_batch.. hold the prefix cache. Each step:
 *   1. ends choices whose client went away or whose deadline passed;
 *   2. admits queued requests while slots are free (a request takes one
 *      slot per choice), forking the longest cached prefix of the prompt;
 *   3. prefills admitted prompts in chunks, oldest first, with the part of
 *      the step's token budget the decode rows leave (one forward, a row per
 *      prompt);
 *   4. decodes every choice in its decode phase as ONE batch
 *      (cinfer_forward_seqs, one row of one token per sequence), then
 *      applies each request's logits processors and sampler.
 * A prompt is fed as mlx-lm's generate_step feeds it (all but the last token
 * in chunks, the last token as the first decode row), so greedy output
 * equals `cinfer generate`. With n > 1 the prompt is prefilled once and
 * forked into the other choices' sequences (pages shared). When the KV
 * budget runs out, cached prefixes are evicted least recently used first;
 * then the newest running choice is preempted (recompute: its pages are
 * freed and its tokens fed again once another choice has ended); a request
 * that does not fit even alone fails with 503 and the others go on.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "serve-prefix.h"
#include "serve.h"

/* PH_RESUME: a choice preempted under memory pressure recomputes its prompt and generated tokens */
enum { PH_FREE = 0, PH_PREFILL, PH_FORKWAIT, PH_DECODE, PH_RESUME };
enum { ECHO_CHUNK = 32 };   /* prompt positions per forward when their log-probs are wanted */

typedef struct slot {
    srv_req *r;
    int choice, phase;
    long admitted;          /* arrival order (prefill order; the newest is preempted first) */
    long wait_fin;          /* preempted: resumes once more than this many choices have ended (-1: not waiting) */
    int fed;                /* prompt tokens in the cache (prefill progress) */
    int32_t pending;        /* the token the next decode row feeds */
    int32_t *hist;          /* [cap_hist] prompt then generated tokens */
    int n_hist, cap_hist, n_gen;
    cinfer_sampler *smp;
    cinfer_detok_stream *ds;
    char *hold;             /* text held back while it may start a stop string */
    size_t n_hold, cap_hold;
} slot;

struct srv_engine {
    pthread_t th;
    int started;
    cinfer_ctx *ctx;
    int n_slot;
    slot *sl;               /* [n_slot] */
    srv_prefix *pfx;
    srv_tier *tier;         /* --cache-dir: the prefix cache's second level on disk (NULL: none) */
    srv_req **wait;         /* [max_queue] FIFO, taken from the server queue */
    int n_wait;
    cinfer_row_sampling *rs;  /* [n_slot] a decode step's rows: sampling parameters */
    cinfer_row_pick *pk;      /* [n_slot] ... and their picks */
    cinfer_logit_edit *ed;    /* [cap_ed] the step's logit edits (penalties, logit_bias), rows' runs back to back */
    size_t n_ed, cap_ed;
    float *plogits;         /* [ECHO_CHUNK][V] prompt logits of an echo + logprobs request */
    int out_rows[2 * 32];
    int32_t *ids;           /* [n_slot] */
    int *seqs;              /* [n_slot] */
    int *plen, *prow;       /* [n_slot] prefill rows: chunk lengths, slots */
    int32_t *pids;          /* [cap_pids] prefill rows, right-padded */
    size_t cap_pids;
    long tick;
    long n_fin;             /* choices ended so far */
    long n_preempt;         /* choices preempted so far */
    /* step timing, reported when the engine stops (not with -q) */
    long n_dec, n_dec_rows, n_pre;
    double t_dec, t_tok, t_pre;   /* seconds: decode forwards (with sampling), their tokens' handling, prefill forwards */
};

static int is_eos(const srv *s, int32_t t) {
    cinfer_model_info info;
    cinfer_model_get_info(s->m, &info);
    for (int i = 0; i < info.n_eos; i++)
        if (info.eos[i] == t) return 1;
    return 0;
}

/* ------------------------------------------------------------ finishing */

static void req_done(srv_req *r, int status, const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (status && !r->err_status) {
        r->err_status = status;
        snprintf(r->err, sizeof r->err, "%s", msg);
    }
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    srv_req_unref(r);   /* the engine's reference */
}

static int req_slots(const srv_engine *e, const srv_req *r) {
    int n = 0;
    for (int i = 0; i < e->n_slot; i++) n += e->sl[i].r == r;
    return n;
}

static void slot_clear(srv *s, int i) {
    slot *q = &s->eng->sl[i];
    cinfer_seq_free(s->eng->ctx, i);
    cinfer_sampler_free(q->smp);
    cinfer_detok_stream_free(q->ds);
    free(q->hist);
    free(q->hold);
    memset(q, 0, sizeof *q);
    s->eng->n_fin++;
}

/* ends slot i; emits a final event with `finish` unless the request failed or was cancelled */
static void slot_end(srv *s, int i, const char *finish, char *text, int status, const char *msg) {
    slot *q = &s->eng->sl[i];
    srv_req *r = q->r;
    if (finish) {
        srv_event ev = {.choice = q->choice, .token = -1, .text = text, .finish = finish};
        srv_req_push(r, &ev);
    } else free(text);
    slot_clear(s, i);
    if (!req_slots(s->eng, r)) req_done(r, status, msg);
}

/* fails every slot of r (and r) with an HTTP status */
static void req_fail(srv *s, srv_req *r, int status, const char *msg) {
    srv_engine *e = s->eng;
    int any = 0;
    for (int i = 0; i < e->n_slot; i++)
        if (e->sl[i].r == r) { any = 1; slot_clear(s, i); }
    if (any) req_done(r, status, msg);
}

/* ------------------------------------------------------------ stop strings */

static int hold_put(slot *q, const char *t, size_t n) {
    return srv_buf_put(&q->hold, &q->n_hold, &q->cap_hold, t, n);
}

/* moves what can be released from the hold buffer into *out (malloc'd);
 * returns 1 when a stop string matched (the hold from the match on is dropped) */
static int stop_scan(const srv_req *r, slot *q, int final, char **out) {
    size_t n = q->n_hold, cut = n, keep = 0;
    int hit = 0;
    for (int k = 0; k < r->n_stop; k++) {
        char *p = q->hold ? memmem(q->hold, n, r->stop[k], strlen(r->stop[k])) : NULL;
        if (p && (size_t)(p - q->hold) < cut) { cut = (size_t)(p - q->hold); hit = 1; }
    }
    if (!hit && !final)
        for (int k = 0; k < r->n_stop; k++) {   /* the longest tail that may still grow into a stop string */
            size_t m = srv_tail_prefix(q->hold, n, r->stop[k]);
            keep = m > keep ? m : keep;
        }
    if (!hit) cut = n - keep;
    *out = malloc(cut + 1);
    if (*out) {
        if (cut) memcpy(*out, q->hold, cut);
        (*out)[cut] = 0;
    }
    if (hit) q->n_hold = 0;
    else {
        memmove(q->hold, q->hold + cut, n - cut);
        q->n_hold = n - cut;
    }
    return hit;
}

/* ------------------------------------------------------------ sampling */

static int put_edit(srv_engine *e, int32_t tok, int mul, float v) {
    if (e->n_ed == e->cap_ed) {
        size_t nc = e->cap_ed ? e->cap_ed * 2 : 256;
        cinfer_logit_edit *ne = realloc(e->ed, sizeof *ne * nc);
        if (!ne) return -1;
        e->ed = ne;
        e->cap_ed = nc;
    }
    e->ed[e->n_ed++] = (cinfer_logit_edit){tok, mul, v};
    return 0;
}

/* an edit (mul, v) of each token of the last ctx of q's history: every occurrence, or (distinct) each token once */
static int window_edits(srv_engine *e, const slot *q, int ctx, int distinct, int mul, float v) {
    int bad = 0, from = q->n_hist > ctx ? q->n_hist - ctx : 0;
    for (int i = from; i < q->n_hist; i++) {
        int dup = 0;
        for (int j = from; distinct && j < i && !dup; j++) dup = q->hist[j] == q->hist[i];
        if (!dup) bad |= put_edit(e, q->hist[i], mul, v);
    }
    return bad;
}

/* mlx-lm's logits processors as edits of the raw logits, applied in this order by the sample op:
 * repetition penalty over the last rep_ctx tokens (prompt included), presence and frequency
 * penalties over their windows, logit_bias; appended to e->ed; -1 when out of memory */
static int slot_edits(srv_engine *e, const srv_req *r, const slot *q) {
    int bad = 0;
    if (r->rep_penalty != 1.0f) bad |= window_edits(e, q, r->rep_ctx, 1, 1, r->rep_penalty);
    if (r->presence != 0.0f) bad |= window_edits(e, q, r->presence_ctx, 1, 0, -r->presence);
    if (r->frequency != 0.0f) bad |= window_edits(e, q, r->frequency_ctx, 0, 0, -r->frequency);
    for (int i = 0; i < r->n_bias; i++) bad |= put_edit(e, r->bias_id[i], 0, r->bias_val[i]);
    return bad;
}

/* log-softmax of l; the chosen token's log-prob and the k most likely */
static void logprobs(const float *l, int V, int32_t tok, int k, srv_event *ev) {
    float mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    float lse = mx + (float)log(sum);
    ev->logprob = l[tok] - lse;
    ev->n_top = 0;
    for (int i = 0; i < V && k > 0; i++) {   /* insertion into a sorted top-k */
        float v = l[i] - lse;
        if (ev->n_top == k && v <= ev->top[k - 1].lp) continue;
        int j = ev->n_top < k ? ev->n_top++ : k - 1;
        while (j > 0 && ev->top[j - 1].lp < v) { ev->top[j] = ev->top[j - 1]; j--; }
        ev->top[j] = (srv_top){i, v};
    }
}

/* one decode row's pick -> the next token of slot i, its event, maybe its end */
static void take_token(srv *s, int i, const cinfer_row_pick *pk) {
    srv_engine *e = s->eng;
    slot *q = &e->sl[i];
    srv_req *r = q->r;
    srv_event ev = {.choice = q->choice};
    int32_t tok = pk->token;
    if (r->logprobs) {
        ev.logprob = pk->logprob;
        ev.n_top = r->top_logprobs < s->n_vocab ? r->top_logprobs : s->n_vocab;
        for (int k = 0; k < ev.n_top; k++) ev.top[k] = (srv_top){pk->top_id[k], pk->top_logprob[k]};
    }
    ev.token = tok;
    if (q->n_hist == q->cap_hist) {   /* grows with the output: max_tokens may be huge with a rotating window */
        int nc = q->cap_hist * 2;
        int32_t *nh = realloc(q->hist, sizeof *nh * (size_t)nc);
        if (!nh) { slot_end(s, i, "length", NULL, 0, NULL); return; }
        q->hist = nh;
        q->cap_hist = nc;
    }
    q->hist[q->n_hist++] = tok;
    q->n_gen++;
    pthread_mutex_lock(&r->mu);
    r->completion_tokens++;
    if (!r->t_first) r->t_first = srv_now();
    pthread_mutex_unlock(&r->mu);
    if (!r->ignore_eos && is_eos(s, tok)) {
        char *rest = NULL;
        const char *fl = q->ds ? cinfer_detok_stream_flush(q->ds) : NULL;
        if (fl) hold_put(q, fl, strlen(fl));
        stop_scan(r, q, 1, &rest);
        if (r->logprobs) { ev.text = strdup(""); ev.tok_text = strdup(""); srv_req_push(r, &ev); }
        slot_end(s, i, "stop", rest, 0, NULL);
        return;
    }
    const char *t = q->ds ? cinfer_detok_stream_push(q->ds, tok) : NULL;   /* no tokenizer: ids only, no text */
    if (!t) t = "";
    ev.tok_text = r->logprobs ? strdup(t) : NULL;
    hold_put(q, t, strlen(t));
    int last = q->n_gen >= r->max_tokens;
    if (last && q->ds) {
        const char *fl = cinfer_detok_stream_flush(q->ds);
        if (fl) hold_put(q, fl, strlen(fl));
    }
    int hit = stop_scan(r, q, last, &ev.text);
    if (ev.text && (ev.text[0] || r->logprobs)) srv_req_push(r, &ev);
    else { free(ev.text); free(ev.tok_text); }
    if (hit) slot_end(s, i, "stop", NULL, 0, NULL);
    else if (last) slot_end(s, i, "length", NULL, 0, NULL);
    else q->pending = tok;
}

/* ------------------------------------------------------------ admission */

static int slot_init(srv *s, int i, srv_req *r, int choice) {
    slot *q = &s->eng->sl[i];
    memset(q, 0, sizeof *q);
    q->r = r;
    q->choice = choice;
    q->admitted = ++s->eng->tick;
    q->wait_fin = -1;
    q->cap_hist = r->n_prompt + (r->max_tokens < 256 ? r->max_tokens : 256) + 1;
    q->hist = malloc(sizeof(int32_t) * (size_t)q->cap_hist);
    cinfer_sampler_params sp = r->sp;
    sp.rep_penalty = 1.0f;   /* applied as a logit edit (slot_edits), before log-probs are read */
    sp.seed += (uint64_t)choice;
    if (cinfer_sampler_new(&sp, s->n_vocab, &q->smp) || !q->hist) return -1;
    if (s->tok && !(q->ds = cinfer_detok_stream_new(s->tok, 1))) return -1;
    memcpy(q->hist, r->prompt, sizeof(int32_t) * r->n_prompt);
    q->n_hist = r->n_prompt;
    /* the stream sees the prompt first, so the continuation's text joins it as
     * `cinfer generate` prints it (SentencePiece drops only the first space) */
    for (int k = 0; q->ds && k < r->n_prompt; k++) cinfer_detok_stream_push(q->ds, r->prompt[k]);
    return 0;
}

/* the prompt minus its last token is in choice 0's sequence: cache it, fork
 * it to the other choices, and start decoding with the last prompt token */
static void start_decode(srv *s, srv_req *r) {
    srv_engine *e = s->eng;
    int first = -1;
    for (int i = 0; i < e->n_slot; i++)
        if (e->sl[i].r == r && e->sl[i].choice == 0) first = i;
    if (r->n_prompt > 1) pfx_insert(e->pfx, e->ctx, first, r->prompt, r->n_prompt - 1);
    if (r->n_prompt > 1 && r->cached_tokens < r->n_prompt - 1) stier_store(e->tier, e->ctx, first, r->prompt, r->n_prompt - 1);
    for (int i = 0; i < e->n_slot; i++) {
        slot *q = &e->sl[i];
        if (q->r != r) continue;
        if (i != first && cinfer_seq_fork(e->ctx, first, i)) { req_fail(s, r, 500, cinfer_ctx_error(e->ctx)); return; }
        q->phase = PH_DECODE;
        q->pending = r->prompt[r->n_prompt - 1];
    }
    if (r->max_tokens == 0)
        for (int i = 0; i < e->n_slot; i++)
            if (e->sl[i].r == r) slot_end(s, i, "length", NULL, 0, NULL);
}

static int free_slots(const srv_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n_slot; i++) n += !e->sl[i].r;
    return n;
}

static void admit(srv *s) {
    srv_engine *e = s->eng;
    while (e->n_wait && free_slots(e) >= e->wait[0]->n_choices) {
        srv_req *r = e->wait[0];
        memmove(e->wait, e->wait + 1, sizeof *e->wait * --e->n_wait);
        if (atomic_load(&r->cancelled)) { req_done(r, 0, NULL); continue; }
        if (srv_now() > r->deadline) { req_done(r, 503, "the request timed out in the queue"); continue; }
        int first = -1, ok = 1;
        for (int c = 0, i = 0; c < r->n_choices; i++) {
            if (e->sl[i].r) continue;
            if (slot_init(s, i, r, c)) ok = 0;
            e->sl[i].phase = c ? PH_FORKWAIT : PH_PREFILL;
            if (!c) first = i;
            c++;
        }
        if (ok && r->echo && r->logprobs) {
            r->pev = calloc((size_t)r->n_prompt, sizeof *r->pev);
            ok = r->pev != NULL;
            if (ok) r->pev[0].token = r->prompt[0];
        }
        if (!ok) { req_fail(s, r, 500, "out of memory"); continue; }
        /* reuse the longest cached prefix, leaving at least the last token to feed (not when
         * the prompt's own log-probs are wanted: they come from its forward): from memory, or
         * from disk when the tier holds a longer one */
        int src = -1, m = r->pev ? 0 : pfx_lookup(e->pfx, r->prompt, r->n_prompt - 1, &src);
        int md = r->pev ? 0 : stier_lookup(e->tier, e->ctx, first, r->prompt, r->n_prompt, m, r->n_prompt - 1);
        if (md > 0) e->sl[first].fed = m = md;
        else if (m > 0 && !cinfer_seq_fork(e->ctx, src, first) && !cinfer_seq_trim(e->ctx, first, m)) e->sl[first].fed = m;
        else { cinfer_seq_free(e->ctx, first); m = 0; }
        pthread_mutex_lock(&r->mu);
        r->prompt_tokens = r->n_prompt;
        r->cached_tokens = m;
        pthread_mutex_unlock(&r->mu);
        if (e->sl[first].fed >= r->n_prompt - 1) start_decode(s, r);
    }
}

/* ------------------------------------------------------------ forwards */

/* The KV budget cannot hold every running sequence: the newest running
 * choice is preempted (its pages freed; it recomputes its tokens once some
 * other choice has ended, as vLLM's recompute preemption) or, when it holds
 * no tokens yet, held back the same way. Alone, and still too large, it fails
 * with 503. */
static void preempt_newest(srv *s) {
    srv_engine *e = s->eng;
    int bi = -1, n = 0;
    for (int i = 0; i < e->n_slot; i++) {
        const slot *q = &e->sl[i];
        if (!q->r || q->phase == PH_FORKWAIT || (q->wait_fin >= 0 && e->n_fin <= q->wait_fin)) continue;
        n++;
        if (bi < 0 || q->admitted > e->sl[bi].admitted) bi = i;
    }
    if (bi < 0) return;
    slot *q = &e->sl[bi];
    if (n == 1) { req_fail(s, q->r, 503, "the KV cache memory (--kv-memory) cannot hold this request"); return; }
    if (cinfer_seq_len(e->ctx, bi)) {
        cinfer_seq_free(e->ctx, bi);
        e->n_preempt++;
    }
    q->fed = 0;
    q->wait_fin = e->n_fin;
    if (q->phase == PH_DECODE) q->phase = PH_RESUME;
}

/* a forward that evicts cached prefixes while the budget is short; 0 ok,
 * 1 when it failed (a choice was preempted or failed instead; the step is to be redone) */
static int forward(srv *s, const int32_t *ids, int B, int L, const int *seqs, const int *lens, const int *out_rows,
                   int n_out, float *logits, int sampled) {
    srv_engine *e = s->eng;
    for (;;) {
        cinfer_status st = sampled ? cinfer_decode_sampled(e->ctx, ids, B, seqs, e->rs, e->pk)
                                   : cinfer_forward_seqs(e->ctx, ids, B, L, seqs, lens, NULL, out_rows, n_out, logits);
        if (!st) return 0;
        if (st == CINFER_ENOMEM && pfx_evict_lru(e->pfx, e->ctx)) continue;
        if (st == CINFER_ENOMEM) preempt_newest(s);
        else {   /* a bad row is a bug; fail its requests rather than spin */
            fprintf(stderr, "cinfer serve: forward failed: %s\n", cinfer_ctx_error(e->ctx));
            for (int b = 0; b < B; b++)
                if (e->sl[seqs[b]].r) req_fail(s, e->sl[seqs[b]].r, 500, cinfer_ctx_error(e->ctx));
        }
        return 1;
    }
}

/* a slot prefills its prompt (PH_PREFILL) or, preempted, its prompt and generated tokens (PH_RESUME) */
static int prefill_ready(const srv_engine *e, const slot *q) {
    return (q->phase == PH_PREFILL || q->phase == PH_RESUME) && (q->wait_fin < 0 || e->n_fin > q->wait_fin);
}

/* the tokens slot q still has to feed: its prompt but the last token, or (preempted) everything but its pending token */
static const int32_t *prefill_ids(const slot *q, int *want) {
    int resume = q->phase == PH_RESUME;
    *want = (resume ? q->n_hist : q->r->n_prompt) - 1;
    return resume ? q->hist : q->r->prompt;
}

static void prefill_done(srv *s, slot *q) {
    q->wait_fin = -1;
    if (q->phase == PH_RESUME) q->phase = PH_DECODE;   /* its pending token is the last generated one */
    else start_decode(s, q->r);
}

/* echo + logprobs: one chunk of the prompt alone, with every position's logits */
static void prefill_echo(srv *s, int i, int k) {
    srv_engine *e = s->eng;
    slot *q = &e->sl[i];
    srv_req *r = q->r;
    if (k > ECHO_CHUNK) k = ECHO_CHUNK;
    for (int p = 0; p < k; p++) { e->out_rows[2 * p] = 0; e->out_rows[2 * p + 1] = p; }
    if (forward(s, r->prompt + q->fed, 1, k, &i, NULL, e->out_rows, k, e->plogits, 0)) return;
    for (int p = 0; p < k; p++) {   /* position fed+p predicts prompt token fed+p+1 */
        srv_event *ev = &r->pev[q->fed + p + 1];
        logprobs(e->plogits + (size_t)p * s->n_vocab, s->n_vocab, r->prompt[q->fed + p + 1], r->top_logprobs, ev);
        ev->token = r->prompt[q->fed + p + 1];
    }
    q->fed += k;
    if (q->fed >= r->n_prompt - 1) prefill_done(s, q);
}

/* One forward over chunks of the oldest slots still prefilling, as many as
 * the budget holds; rows are right-padded to the longest chunk, so a row is
 * added only while the padded batch stays within 1.25x the budget. */
static void prefill(srv *s, int budget) {
    srv_engine *e = s->eng;
    int step = s->o.co.prefill_step_size > 0 ? s->o.co.prefill_step_size : 2048, moving = 0, P = 0, L = 0;
    for (int i = 0; i < e->n_slot; i++) moving += e->sl[i].phase == PH_DECODE || prefill_ready(e, &e->sl[i]);
    for (int i = 0; i < e->n_slot && !moving; i++) e->sl[i].wait_fin = -1;   /* nothing else can end: resume */
    int total = budget, left = budget;
    while (left > 0 && P < e->n_slot) {
        int bi = -1;   /* the oldest ready slot not yet in the batch */
        for (int i = 0; i < e->n_slot; i++) {
            int taken = 0;
            for (int p = 0; p < P && !taken; p++) taken = e->prow[p] == i;
            if (!taken && prefill_ready(e, &e->sl[i]) && (bi < 0 || e->sl[i].admitted < e->sl[bi].admitted)) bi = i;
        }
        if (bi < 0) break;
        slot *q = &e->sl[bi];
        int want;
        prefill_ids(q, &want);
        int k = want - q->fed < left ? want - q->fed : left;
        if (k > step) k = step;
        if (q->r->pev && q->phase == PH_PREFILL) {   /* its logits are wanted: it goes alone */
            if (!P) prefill_echo(s, bi, k);
            break;
        }
        if (k <= 0) { prefill_done(s, q); continue; }
        int nl = k > L ? k : L;
        if (P && (size_t)(P + 1) * nl > (size_t)total + total / 4) break;
        e->prow[P] = bi;
        e->plen[P++] = k;
        L = nl;
        left -= k;
    }
    if (!P) return;
    if ((size_t)P * L > e->cap_pids) {
        int32_t *np = realloc(e->pids, sizeof *np * (size_t)P * L);
        if (!np) return;
        e->pids = np;
        e->cap_pids = (size_t)P * L;
    }
    for (int p = 0; p < P; p++) {
        slot *q = &e->sl[e->prow[p]];
        int want;
        const int32_t *ids = prefill_ids(q, &want);
        memcpy(e->pids + (size_t)p * L, ids + q->fed, sizeof(int32_t) * e->plen[p]);
        memset(e->pids + (size_t)p * L + e->plen[p], 0, sizeof(int32_t) * (L - e->plen[p]));
    }
    double t0 = srv_now();
    int failed = forward(s, e->pids, P, L, e->prow, e->plen, NULL, 0, NULL, 0);
    e->t_pre += srv_now() - t0;
    e->n_pre++;
    if (failed) return;
    for (int p = 0; p < P; p++) {
        slot *q = &e->sl[e->prow[p]];
        int want;
        prefill_ids(q, &want);
        q->fed += e->plen[p];
        if (q->fed >= want) prefill_done(s, q);
    }
}

/* every choice in its decode phase, one row each, in one forward whose tokens the backend picks
 * (cinfer_decode_sampled: on CUDA the logits stay on the device) */
static void decode(srv *s) {
    srv_engine *e = s->eng;
    int B = 0;
    e->n_ed = 0;
    for (int i = 0; i < e->n_slot; i++) {
        slot *q = &e->sl[i];
        if (q->phase != PH_DECODE) continue;
        const srv_req *r = q->r;
        size_t at = e->n_ed;
        if (slot_edits(e, r, q)) {
            e->n_ed = at;   /* the rows' edits stay back to back */
            req_fail(s, q->r, 500, "out of memory");
            continue;
        }
        e->rs[B] = (cinfer_row_sampling){r->sp.temp, r->sp.top_k, r->sp.top_p, r->sp.min_p,
                                         r->sp.temp > 0 ? cinfer_sampler_uniform(q->smp) : 0, NULL,
                                         (int)(e->n_ed - at), r->logprobs ? r->top_logprobs : -1};
        e->ids[B] = q->pending;
        e->seqs[B++] = i;
    }
    for (size_t b = 0, at = 0; b < (size_t)B; at += (size_t)e->rs[b++].n_edits)   /* e->ed is final now */
        e->rs[b].edits = e->rs[b].n_edits ? e->ed + at : NULL;
    if (!B) return;
    double t0 = srv_now();
    int failed = forward(s, e->ids, B, 1, e->seqs, NULL, NULL, 0, NULL, 1);
    double t1 = srv_now();
    e->t_dec += t1 - t0;
    e->n_dec++;
    e->n_dec_rows += B;
    if (failed) return;
    for (int b = 0; b < B; b++)
        if (e->sl[e->seqs[b]].phase == PH_DECODE) take_token(s, e->seqs[b], &e->pk[b]);
    e->t_tok += srv_now() - t1;
}

/* ends choices whose client left (no event) or whose deadline passed ("length") */
static void reap(srv *s, int stopping) {
    srv_engine *e = s->eng;
    double now = srv_now();
    for (int i = 0; i < e->n_slot; i++) {
        srv_req *r = e->sl[i].r;
        if (!r) continue;
        if (atomic_load(&r->cancelled)) slot_end(s, i, NULL, NULL, 0, NULL);
        else if (now > r->deadline || stopping > 1) {
            if (e->sl[i].phase == PH_DECODE || e->sl[i].phase == PH_RESUME) slot_end(s, i, "length", NULL, 0, NULL);
            else req_fail(s, r, 503, stopping > 1 ? "the server is shutting down" : "the request timed out");
        }
    }
}

static int busy(const srv_engine *e) {
    for (int i = 0; i < e->n_slot; i++)
        if (e->sl[i].r) return 1;
    return 0;
}

/* ------------------------------------------------------------ the thread */

static int engine_load(srv *s) {
    srv_engine *e = s->eng;
    cinfer_model *m = cli_load_model("serve", s->o.model_dir, s->o.device, s->o.threads);
    if (!m) return -1;
    cinfer_model_info info;
    cinfer_model_get_info(m, &info);
    cinfer_ctx_opts co = s->o.co;
    co.n_threads = s->o.threads;
    /* on CUDA a 16-bit model's KV cache keeps its dtype unless --kv-dtype says otherwise: f32 pages read twice
     * the bytes at every decode step and miss the many-sequence attention kernel (16-bit pages) */
    if (!co.kv_dtype && !co.kv_f16 && s->o.device && !strcmp(s->o.device, "cuda") &&
        (!strcmp(info.weight_dtype, "bf16") || !strcmp(info.weight_dtype, "f16")))
        co.kv_dtype = info.weight_dtype;
    co.max_seqs = e->n_slot + s->o.prompt_cache;
    char err[512];
    if (cinfer_ctx_new(m, &co, &e->ctx, err, sizeof err)) {
        fprintf(stderr, "cinfer serve: %s\n", err);
        cinfer_model_free(m);
        return -1;
    }
    s->tok = cinfer_model_tokenizer(m);
    s->n_vocab = info.n_vocab;
    s->max_pos = info.max_pos > 0 ? info.max_pos : 1 << 30;
    s->bos = s->tok && cinfer_tokenizer_bos(s->tok) >= 0 ? cinfer_tokenizer_bos(s->tok) : info.bos;
    s->anchor = -1;
    int32_t *aid = NULL;
    int na = 0;
    if (s->tok && !cinfer_tokenize(s->tok, "a", 1, 0, 0, &aid, &na) && na == 1) s->anchor = aid[0];
    free(aid);
    e->rs = calloc((size_t)e->n_slot, sizeof *e->rs);
    e->pk = calloc((size_t)e->n_slot, sizeof *e->pk);
    e->plogits = malloc(sizeof(float) * ECHO_CHUNK * (size_t)info.n_vocab);
    cinfer_kv_info kvi;
    cinfer_ctx_kv_info(e->ctx, &kvi);
    e->pfx = pfx_new(s->o.prompt_cache, e->n_slot, kvi.page);
    s->m = m;
    if (!e->rs || !e->pk || !e->plogits || !e->pfx) return -1;
    if (s->o.cache_dir && !(e->tier = stier_open(s->o.cache_dir, s->o.cache_max, m, s->o.quiet))) return -1;
    return 0;
}

static void publish(srv *s) {   /* under s->mu */
    srv_engine *e = s->eng;
    cinfer_kv_info ki;
    cinfer_ctx_kv_info(e->ctx, &ki);
    s->st.running = e->n_slot - free_slots(e);
    s->st.waiting = e->n_wait;   /* the queue's own s->q_len is added by readers */
    s->st.cached = pfx_count(e->pfx);
    s->st.kv_held = ki.bytes_held;
    s->st.kv_budget = ki.budget;
    s->st.preempted = e->n_preempt;
}

static void *engine_main(void *arg) {
    srv *s = arg;
    srv_engine *e = s->eng;
    if (engine_load(s)) {
        atomic_store(&s->ready, -1);
        return NULL;
    }
    if (!s->o.quiet) {
        cinfer_kv_info ki;
        cinfer_ctx_kv_info(e->ctx, &ki);
        fprintf(stderr, "cinfer serve: model loaded; serving '%s' (KV cache %s)\n", s->o.model_id, ki.dtype);
    }
    atomic_store(&s->ready, 1);
    double stop_at = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!atomic_load(&s->stopping) && !s->q_len && !e->n_wait && !busy(e)) {
            publish(s);
            pthread_cond_wait(&s->cv, &s->mu);
        }
        while (s->q_len && e->n_wait < s->o.max_queue) {
            e->wait[e->n_wait++] = s->queue[s->q_head];
            s->q_head = (s->q_head + 1) % s->o.max_queue;
            s->q_len--;
        }
        int stopping = atomic_load(&s->stopping);
        publish(s);
        pthread_mutex_unlock(&s->mu);
        if (stopping) {   /* no new work; running requests get a grace period, then end */
            if (!stop_at) stop_at = srv_now() + 10;
            while (e->n_wait) req_done(e->wait[--e->n_wait], 503, "the server is shutting down");
            if (srv_now() > stop_at) stopping = 2;
            if (!busy(e)) break;
        }
        reap(s, stopping);
        admit(s);
        int n_dec = 0;
        for (int i = 0; i < e->n_slot; i++) n_dec += e->sl[i].phase == PH_DECODE;
        int budget = s->o.step_tokens - n_dec;
        prefill(s, budget < 16 ? 16 : budget);
        decode(s);
    }
    pthread_mutex_lock(&s->mu);
    publish(s);
    pthread_mutex_unlock(&s->mu);
    long caps = 0, reps = 0;
    cinfer_ctx_graph_stats(e->ctx, &caps, &reps);
    if (!s->o.quiet && e->n_dec)
        fprintf(stderr, "cinfer serve: %ld decode steps (%.1f rows on average): %.3f ms a step in the forward and sampling, "
                "%.3f ms handling its tokens; %ld prefill forwards, %.3f ms each; graphs captured %ld, replayed %ld\n", e->n_dec,
                (double)e->n_dec_rows / e->n_dec, 1e3 * e->t_dec / e->n_dec, 1e3 * e->t_tok / e->n_dec, e->n_pre,
                e->n_pre ? 1e3 * e->t_pre / e->n_pre : 0.0, caps, reps);
    return NULL;
}

int srv_engine_start(srv *s) {
    srv_engine *e = calloc(1, sizeof *e);
    if (!e) return -1;
    s->eng = e;
    e->n_slot = s->o.max_batch;
    e->sl = calloc((size_t)e->n_slot, sizeof *e->sl);
    e->wait = calloc((size_t)s->o.max_queue, sizeof *e->wait);
    e->ids = calloc((size_t)e->n_slot, sizeof *e->ids);
    e->seqs = calloc((size_t)e->n_slot, sizeof *e->seqs);
    e->prow = calloc((size_t)e->n_slot, sizeof *e->prow);
    e->plen = calloc((size_t)e->n_slot, sizeof *e->plen);
    s->queue = calloc((size_t)s->o.max_queue, sizeof *s->queue);
    if (!e->sl || !e->wait || !e->ids || !e->seqs || !e->prow || !e->plen || !s->queue) return -1;
    if (pthread_create(&e->th, NULL, engine_main, s)) return -1;
    e->started = 1;
    return 0;
}

void srv_engine_stop(srv *s) {
    srv_engine *e = s->eng;
    if (!e) return;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stopping, 1);
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (e->started) pthread_join(e->th, NULL);
    e->started = 0;
    for (int i = 0; i < e->n_slot && e->ctx; i++)
        if (e->sl[i].r) req_fail(s, e->sl[i].r, 503, "the server is shutting down");
    pthread_mutex_lock(&s->mu);
    while (s->q_len) {   /* requests queued after the engine left */
        req_done(s->queue[s->q_head], 503, "the server is shutting down");
        s->q_head = (s->q_head + 1) % s->o.max_queue;
        s->q_len--;
    }
    pthread_mutex_unlock(&s->mu);
}

void srv_engine_free(srv *s) {
    srv_engine *e = s->eng;
    if (!e) return;
    srv_engine_stop(s);
    pfx_free(e->pfx);
    stier_close(e->tier);   /* drains the writes queued before the engine stopped */
    cinfer_ctx_free(e->ctx);
    cinfer_model_free(s->m);
    s->m = NULL;
    free(e->sl); free(e->wait); free(e->ids); free(e->seqs); free(e->prow); free(e->plen); free(e->pids); free(e->rs); free(e->pk); free(e->ed); free(e->plogits);
    free(s->queue);
    free(e);
    s->eng = NULL;
}

int srv_submit(srv *s, srv_req *r) {
    if (atomic_load(&s->ready) != 1) return 503;
    if (r->n_choices > s->o.max_batch) return 400;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (atomic_load(&s->stopping)) rc = 503;
    else if (s->q_len + s->st.waiting >= s->o.max_queue) rc = 429;
    else {
        atomic_fetch_add(&r->refs, 1);
        r->deadline = srv_now() + s->o.timeout_s;
        s->queue[(s->q_head + s->q_len) % s->o.max_queue] = r;
        s->q_len++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}
