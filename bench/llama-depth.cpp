// llama-depth.cpp — the llama.cpp peer's decode at a KV depth, for bench/kvq-cpu.sh (issue 15).
//
// llama-bench -d DEPTH fills the depth with one causal sequence before it times its decode steps;
// with a quantized KV cache on 2 CPU cores that fill takes about an hour a KV type (its flash
// attention dequantizes every V row for every query), far longer than the steps it is for. A decode
// step's cost does not depend on what the cells hold, only on how many the step attends and their
// type, so this harness fills the same number of cells cheaply: --split S writes the depth as S
// sequences of DEPTH/S tokens each (S x less attention work in the fill; the masked cells are
// skipped), then llama_memory_seq_cp gives every cell to sequence 0, so sequence 0's next token
// attends all DEPTH cells — the same cells, types and kernel as a llama-bench step at that depth. The
// timed part is llama-bench's own test_gen: one token a llama_decode, a llama_synchronize each,
// random tokens, the same threadpool setup (a warm-up token first). --split 1 fills one causal
// sequence as llama-bench does (to check the method against llama-bench at a small depth).
//
// --go FILE: after the fill, wait until FILE exists before the timed steps (so the fill can run at low
// priority beside other work and the steps run on a quiet machine).
//
// build: see bench/kvq-cpu.sh (g++ against the peer's headers and libraries)
// usage: llama-depth -m GGUF -d DEPTH -n TG -t THREADS -ctk TYPE -ctv TYPE [--split S] [--go FILE] [-r REPS]
// prints one JSON line: {"type_k":..,"type_v":..,"n_depth":..,"n_gen":..,"split":..,"fill_s":..,"ts":[..],"avg_ts":..,"model_size":..}
#include "llama.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static ggml_type kv_type(const char *s) {
    if (!strcmp(s, "f16")) return GGML_TYPE_F16;
    if (!strcmp(s, "q8_0")) return GGML_TYPE_Q8_0;
    if (!strcmp(s, "q4_0")) return GGML_TYPE_Q4_0;
    fprintf(stderr, "llama-depth: unknown KV type %s (f16, q8_0, q4_0)\n", s);
    exit(2);
}

static void quiet(ggml_log_level, const char *, void *) {}

int main(int argc, char **argv) {
    const char *model = nullptr, *go = nullptr, *tk = "f16", *tv = "f16";
    int depth = 4096, tg = 32, threads = 2, split = 64, reps = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (!v) { fprintf(stderr, "llama-depth: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-d")) depth = atoi(v);
        else if (!strcmp(a, "-n")) tg = atoi(v);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "-r")) reps = atoi(v);
        else if (!strcmp(a, "-ctk")) tk = v;
        else if (!strcmp(a, "-ctv")) tv = v;
        else if (!strcmp(a, "--split")) split = atoi(v);
        else if (!strcmp(a, "--go")) go = v;
        else { fprintf(stderr, "llama-depth: unknown option %s\n", a); return 2; }
        i++;
    }
    if (!model || depth < 1 || tg < 1 || threads < 1 || reps < 1 || split < 1 || split > 256 || depth % split) {
        fprintf(stderr, "usage: llama-depth -m GGUF -d DEPTH -n TG -t THREADS -ctk T -ctv T [--split S (divides DEPTH, <= 256)] [--go FILE] [-r REPS]\n");
        return 2;
    }
    llama_log_set(quiet, nullptr);
    ggml_backend_load_all();
    ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
    auto *tp_new = (decltype(ggml_threadpool_new) *)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_new");
    auto *tp_free = (decltype(ggml_threadpool_free) *)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_free");
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    llama_model *m = llama_model_load_from_file(model, mp);
    if (!m) { fprintf(stderr, "llama-depth: cannot load %s\n", model); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = depth + (tg + 1) * reps;   // as llama-bench sizes it (depth + tokens generated)
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = split;
    cp.kv_unified = true;   // one buffer of cells for every sequence: seq_cp then shares cells, copies nothing
    cp.type_k = kv_type(tk);
    cp.type_v = kv_type(tv);
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) { fprintf(stderr, "llama-depth: cannot create the context\n"); return 1; }
    ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    ggml_threadpool *tp = tp_new(&tpp);
    llama_attach_threadpool(ctx, tp, nullptr);
    const llama_vocab *vocab = llama_model_get_vocab(m);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_memory_t mem = llama_get_memory(ctx);

    // the fill: split sequences of len tokens, whole sequences to a batch of <= 2048 tokens
    const int len = depth / split;
    const int per = len >= 2048 ? 1 : 2048 / len;
    llama_batch b = llama_batch_init(2048, 0, 1);
    double t0 = now_s();
    for (int s = 0; s < split; s += per) {
        for (int pos0 = 0; pos0 < len; pos0 += 2048) {   // a long sequence: in batches of 2048
            b.n_tokens = 0;
            for (int q = s; q < split && q < s + per; q++)
                for (int p = pos0; p < len && p < pos0 + 2048; p++) {
                    int i = b.n_tokens++;
                    b.token[i] = std::rand() % n_vocab;
                    b.pos[i] = p;
                    b.n_seq_id[i] = 1;
                    b.seq_id[i][0] = q;
                    b.logits[i] = 0;
                }
            b.logits[b.n_tokens - 1] = 1;
            if (llama_decode(ctx, b) != 0) { fprintf(stderr, "llama-depth: fill decode failed\n"); return 1; }
        }
        fprintf(stderr, "llama-depth: %s/%s fill %d/%d tokens, %.0f s\n", tk, tv, (s + per < split ? s + per : split) * len,
                depth, now_s() - t0);
    }
    llama_synchronize(ctx);
    for (int s = 1; s < split; s++) llama_memory_seq_cp(mem, s, 0, -1, -1);
    double fill = now_s() - t0;
    if (go) {
        fprintf(stderr, "llama-depth: filled in %.0f s; waiting for %s\n", fill, go);
        while (access(go, F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    // repetitions follow one another: each starts TG + 1 tokens deeper than the last (llama-bench restores
    // its depth instead; 0.2% of a 16k depth a repetition)
    std::vector<double> ts;
    for (int r = 0; r < reps; r++) {
        llama_token tok = std::rand() % n_vocab;
        if (r == 0) {   // warm-up token, as llama-bench's
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) { fprintf(stderr, "llama-depth: decode failed\n"); return 1; }
            llama_synchronize(ctx);
        }
        double a = now_s();
        for (int i = 0; i < tg; i++) {
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) { fprintf(stderr, "llama-depth: decode failed\n"); return 1; }
            llama_synchronize(ctx);
            tok = std::rand() % n_vocab;
        }
        ts.push_back(tg / (now_s() - a));
    }
    double avg = 0;
    for (double v : ts) avg += v / ts.size();
    printf("{\"engine\":\"llama.cpp\",\"type_k\":\"%s\",\"type_v\":\"%s\",\"n_depth\":%d,\"n_gen\":%d,\"split\":%d,"
           "\"fill_s\":%.1f,\"ts\":[", tk, tv, depth, tg, split, fill);
    for (size_t i = 0; i < ts.size(); i++) printf("%s%.3f", i ? "," : "", ts[i]);
    printf("],\"avg_ts\":%.3f,\"model_size\":%llu}\n", avg, (unsigned long long)llama_model_size(m));
    llama_batch_free(b);
    llama_free(ctx);
    tp_free(tp);
    llama_model_free(m);
    return 0;
}
