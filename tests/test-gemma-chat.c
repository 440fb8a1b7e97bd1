/*
 * test-gemma-chat.c — `cinfer chat` on a Gemma 3 model: a tiny random-weight
 * gemma3_text directory (2 layers, one sliding with a window of 4, the other
 * global; vocabulary 262,208) written here with the real Gemma 3 tokenizer and
 * chat template from ../shared/tokenizers/gemma3 (its vocabulary is too large
 * for a committed fixture). Checks: the template renders Gemma's turns, the
 * real tokenizer maps them to <bos> <start_of_turn> ... ids, and chat's two
 * replies (the second fed after the first turn's cache, whose sliding layer
 * has dropped old keys) equal fresh greedy runs on each rendered conversation.
 * Missing ../shared is one FAIL line naming it (check.h shared_dir).
 */
#include <jansson.h>
#include <sys/stat.h>
#include "check.h"
#include "cli-run.h"
#include "backend/backend.h"
#include "io/safetensors.h"

enum { V = 262208, H = 16, HD = 8, NH = 2, FF = 32, NL = 2 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {   /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* a bf16 tensor of n random values times scale */
static uint16_t *rnd_bf16(size_t n, float scale) {
    uint16_t *p = malloc(n * 2);
    for (size_t i = 0; p && i < n; i++) p[i] = be_f32_to_bf16(urand() * scale);
    return p;
}

static int write_model(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    fprintf(f, "{\"model_type\": \"gemma3_text\", \"architectures\": [\"Gemma3ForCausalLM\"], \"vocab_size\": %d, "
               "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
               "\"num_key_value_heads\": 1, \"head_dim\": %d, \"sliding_window\": 4, "
               "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"rms_norm_eps\": 1e-6, "
               "\"query_pre_attn_scalar\": %d, \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "
               "\"hidden_activation\": \"gelu_pytorch_tanh\", \"bos_token_id\": 2, \"eos_token_id\": [1, 106], "
               "\"pad_token_id\": 0, \"tie_word_embeddings\": true, \"max_position_embeddings\": 4096}\n",
            V, H, FF, NL, NH, HD, HD);
    fclose(f);
    st_wtensor t[3 + NL * 13];
    int64_t shapes[3 + NL * 13][2];
    void *data[3 + NL * 13];
    char names[3 + NL * 13][96];
    int n = 0;
#define T(nm, r, c, scale)                                                               \
    do {                                                                                 \
        snprintf(names[n], sizeof names[n], "%s", nm);                                   \
        shapes[n][0] = (r);                                                              \
        shapes[n][1] = (c);                                                              \
        data[n] = rnd_bf16((size_t)(r) * (c), scale);                                    \
        t[n] = (st_wtensor){names[n], "BF16", (r) > 1 ? 2 : 1, (r) > 1 ? shapes[n] : shapes[n] + 1, data[n], \
                            (size_t)(r) * (c) * 2};                                      \
        n++;                                                                             \
    } while (0)
    T("model.embed_tokens.weight", V, H, 1.0f);
    T("model.norm.weight", 1, H, 0.3f);
    char nm[96];
    for (int l = 0; l < NL; l++) {
        const char *norms[] = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                               "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"};
        for (int i = 0; i < 6; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, norms[i]);
            T(nm, 1, i >= 4 ? HD : H, 0.3f);
        }
        const struct { const char *s; int r, c; } mats[] = {{"self_attn.q_proj", NH * HD, H}, {"self_attn.k_proj", HD, H},
                                                            {"self_attn.v_proj", HD, H}, {"self_attn.o_proj", H, NH * HD},
                                                            {"mlp.gate_proj", FF, H}, {"mlp.up_proj", FF, H},
                                                            {"mlp.down_proj", H, FF}};
        for (int i = 0; i < 7; i++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, mats[i].s);
            T(nm, mats[i].r, mats[i].c, 0.5f);
        }
    }
#undef T
    void *buf = NULL;
    size_t len = 0;
    char err[256];
    int ok = !st_write_mem(t, n, NULL, &buf, &len, err, sizeof err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = ok ? fopen(path, "wb") : NULL;
    ok = f && fwrite(buf, 1, len, f) == len;
    if (f) fclose(f);
    free(buf);
    for (int i = 0; i < n; i++) free(data[i]);
    return ok;
}

/* gunzips (or copies) ../shared/tokenizers/gemma3/NAME into dir */
static int place(const char *name, const char *dir) {
    char src[700], cmd[2000];
    snprintf(src, sizeof src, "%s/tokenizers/gemma3/%s", shared_dir(), name);
    if (access(src, R_OK) == 0) snprintf(cmd, sizeof cmd, "cp '%s' '%s/%s'", src, dir, name);
    else snprintf(cmd, sizeof cmd, "gzip -dc '%s.gz' > '%s/%s'", src, dir, name);
    return system(cmd) == 0;
}

static void read_text(const char *path, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
}

/* the reply a fresh greedy run gives on conv (a JSON messages array) rendered and tokenized */
static int fresh_reply(const char *mdir, json_t *conv, char *out, size_t cap) {
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "%s/conv.json", cli_tmp);
    if (json_dump_file(conv, cmd, 0)) return 0;
    snprintf(cmd, sizeof cmd,
             "%s template -m %s --add-generation-prompt --messages %s/conv.json > %s/conv.txt && "
             "%s tokenize -m %s --no-bos-eos --ids - < %s/conv.txt | tr ' ' ',' > %s/conv.ids && "
             "%s generate -m %s --ignore-chat-template -q -n 6 --tokens $(cat %s/conv.ids) > %s/fresh.out",
             cli, mdir, cli_tmp, cli_tmp, cli, mdir, cli_tmp, cli_tmp, cli, mdir, cli_tmp, cli_tmp);
    if (system(cmd) != 0) return 0;
    snprintf(cmd, sizeof cmd, "%s/fresh.out", cli_tmp);
    read_text(cmd, out, cap);
    out[strcspn(out, "\n")] = 0;
    return 1;
}

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_setup(argv[0])) return 1;
    char mdir[128], cmd[3000], out[1 << 14];
    snprintf(mdir, sizeof mdir, "%s/gemma3-tiny", cli_tmp);
    mkdir(mdir, 0755);
    int ok = place("tokenizer.json", mdir) && place("tokenizer_config.json", mdir);
    CHECK(ok, "the Gemma 3 tokenizer files from %s/tokenizers/gemma3 are in place", shared_dir());
    if (!ok) { cli_cleanup(); return CHECK_DONE(); }
    CHECK(write_model(mdir), "a random gemma3_text model (vocabulary %d, window 4) written to %s", V, mdir);

    /* the template: Gemma's turns; the real tokenizer: its special ids */
    json_t *conv = json_pack("[{s:s,s:s}]", "role", "user", "content", "What is a cat?");
    snprintf(cmd, sizeof cmd, "%s/c1.json", cli_tmp);
    json_dump_file(conv, cmd, 0);
    char args[600];
    snprintf(args, sizeof args, "template -m %s --add-generation-prompt --messages %s/c1.json", mdir, cli_tmp);
    int rc = sh_run(args, out, sizeof out);
    const char *want = "<bos><start_of_turn>user\nWhat is a cat?<end_of_turn>\n<start_of_turn>model\n";
    CHECK(rc == 0 && !strcmp(out, want), "template renders Gemma 3's turns (rc %d): '%s'", rc, out);
    snprintf(args, sizeof args, "template -m %s --add-generation-prompt --tokenize --messages %s/c1.json", mdir, cli_tmp);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0 && !strncmp(out, "2 105 2364 107", 14) && strstr(out, " 106 107 105 4368 107"),
          "the real tokenizer gives <bos> <start_of_turn> user \\n ... <end_of_turn> \\n <start_of_turn> model \\n: %s", out);

    /* chat: two turns, each equal to a fresh greedy run on the conversation so far */
    snprintf(cmd, sizeof cmd, "printf 'What is a cat?\\nAnd a dog?\\n' | %s chat -m %s -n 6 2>%s/chat.err > %s/chat.out", cli, mdir,
             cli_tmp, cli_tmp);
    rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/chat.out", cli_tmp);
    char replies[2][512] = {"", ""};
    FILE *cf = fopen(cmd, "r");
    for (int i = 0; cf && i < 2 && fgets(replies[i], sizeof replies[i], cf); i++) replies[i][strcspn(replies[i], "\n")] = 0;
    if (cf) fclose(cf);
    snprintf(cmd, sizeof cmd, "%s/chat.err", cli_tmp);
    read_text(cmd, out, sizeof out);
    int turns = 0;
    for (char *q = out; (q = strstr(q, "tok/s]")); q++) turns++;
    CHECK(rc == 0 && turns == 2 && replies[0][0], "cinfer chat answers two turns on the Gemma 3 directory (rc %d, %d turns)", rc, turns);
    char fresh[512] = "";
    ok = fresh_reply(mdir, conv, fresh, sizeof fresh);
    CHECK(ok && !strcmp(replies[0], fresh), "chat's first reply equals a greedy run on the rendered prompt ('%s' vs '%s')", replies[0],
          fresh);
    json_array_append_new(conv, json_pack("{s:s,s:s}", "role", "assistant", "content", replies[0]));
    json_array_append_new(conv, json_pack("{s:s,s:s}", "role", "user", "content", "And a dog?"));
    ok = fresh_reply(mdir, conv, fresh, sizeof fresh);
    CHECK(ok && replies[1][0] && !strcmp(replies[1], fresh),
          "chat's second reply, fed after the first turn's cache (window 4), equals a fresh run on the whole conversation "
          "('%s' vs '%s')", replies[1], fresh);
    json_decref(conv);
    cli_cleanup();
    return CHECK_DONE();
}
