/*
 * test-cli-guards.c — the CLI as users of mlx_lm and llama.cpp expect it
 * (issue 12): generate prints only the generated text (or with --json exactly
 * one object: text, ids, log-probs, finish reason, statistics), chat templates
 * by default, stop strings, random unless seeded, the context limit, prompts
 * from files; stray or unknown arguments named; failed writes are exit 1;
 * FIFOs and devices are never replaced; the version. Model: models/stories260k
 * (shipped), whose greedy continuation of "Once upon a time" transformers
 * gives as ", there was a little girl named Lily." (reference.json).
 */
#include <jansson.h>
#include <sys/stat.h>
#include "check.h"
#include "cli-run.h"
#include "model-copy.h"

#define M "models/stories260k"
static char out[1 << 20], args[4096];

static json_t *run_json(const char *a, int *rc) {
    *rc = sh_run(a, out, sizeof out);
    return json_loads(out, 0, NULL);   /* the whole stdout: one object and nothing else */
}

/* a copy of the model with a chat template that adds " upon a time" as the
 * assistant's opening, so templated and plain prompts differ */
static void make_chat_model(char *dir, size_t n) {
    char cmd[1024];
    copy_model(cli_tmp, "chat", NULL, NULL, dir, n);
    snprintf(cmd, sizeof cmd, "%s/tokenizer_config.json", dir);
    json_t *tc = json_load_file(cmd, 0, NULL);
    if (!tc) return;
    json_object_set_new(tc, "chat_template", json_string(
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }} "
        "{% elif m['role'] == 'user' %}{{ m['content'] }}{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %} upon a time{% endif %}"));
    json_dump_file(tc, cmd, 0);
    json_decref(tc);
}

static void test_generate_output(void) {
    int rc = sh_run("generate -m " M " -p 'Once upon a time' -n 12", out, sizeof out);
    CHECK(rc == 0 && !strncmp(out, ", there was a little girl named Lily.", 37) && !strstr(out, "Once upon") &&
          out[strlen(out) - 1] == '\n', "generate prints the continuation only, then a newline: '%.50s'", out);
    CHECK(strstr(run_err(), "Generation: 12 tokens"), "the statistics go to stderr");
    rc = sh_run("generate -m " M " -p 'Once upon a time' -n 12 --quiet", out, sizeof out);
    CHECK(rc == 0 && !run_err()[0], "--quiet: nothing on stderr ('%.40s')", run_err());

    json_t *j = run_json("generate -m " M " -p 'Once upon a time' -n 8 --json", &rc);
    static const char *keys[] = {"text", "tokens", "logprobs", "finish_reason", "prompt_tokens", "prompt_tps",
                                 "generation_tokens", "generation_tps", "peak_memory_gb", "kv_bytes", "weight_types",
                                 "bits_per_weight"};
    int have = 0;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) have += json_object_get(j, keys[i]) != NULL;
    CHECK(rc == 0 && j && have == 12 && json_object_size(j) == 12, "--json: stdout is exactly one object with the 12 fields (%d)", have);
    CHECK(!strcmp(json_string_value(json_object_get(j, "weight_types")) ? json_string_value(json_object_get(j, "weight_types")) : "", "f32") &&
              json_real_value(json_object_get(j, "bits_per_weight")) > 31.9 && json_real_value(json_object_get(j, "bits_per_weight")) < 32.1,
          "--json: weight_types f32, bits_per_weight 32 for the f32 model");
    json_t *tk = json_object_get(j, "tokens"), *lp = json_object_get(j, "logprobs");
    static const int want[8] = {432, 383, 286, 261, 376, 298, 315, 421};   /* transformers' greedy ids */
    int same = json_array_size(tk) == 8 && json_array_size(lp) == 8;
    for (int i = 0; same && i < 8; i++)
        same = json_integer_value(json_array_get(tk, i)) == want[i] && json_real_value(json_array_get(lp, i)) <= 0;
    CHECK(same && !strcmp(json_string_value(json_object_get(j, "text")), ", there was a little girl") &&
          !strcmp(json_string_value(json_object_get(j, "finish_reason")), "length") &&
          json_integer_value(json_object_get(j, "prompt_tokens")) == 5 && json_integer_value(json_object_get(j, "generation_tokens")) == 8,
          "--json: transformers' ids, their log-probs, the text and finish_reason length");
    double gb = json_real_value(json_object_get(j, "peak_memory_gb"));
    CHECK(gb > 1.0e-3 && gb < 0.02 && json_integer_value(json_object_get(j, "kv_bytes")) >= 5 * 2 * 4 * 8 * 4 * 13,
          "peak memory counts the 1 MB model and its caches (%.4f GB), not the process", gb);
    json_decref(j);

    /* the context: 512 positions */
    j = run_json("generate -m " M " -n 600 --json", &rc);
    CHECK(rc == 0 && json_integer_value(json_object_get(j, "generation_tokens")) == 511 &&
          !strcmp(json_string_value(json_object_get(j, "finish_reason")) ?: "", "context"),
          "-n 600 stops at the 512-position context with finish_reason context (%lld)",
          (long long)json_integer_value(json_object_get(j, "generation_tokens")));
    json_decref(j);
    j = run_json("generate -m " M " -n 600 --max-kv-size 64 --json", &rc);
    CHECK(rc == 0 && json_integer_value(json_object_get(j, "generation_tokens")) == 600 &&
          !strcmp(json_string_value(json_object_get(j, "finish_reason")) ?: "", "length"),
          "--max-kv-size 64 (a rotating cache) lifts the context stop, as mlx-lm: 600 tokens, finish_reason length");
    json_decref(j);
    j = run_json("generate -m " M " -n -1 --json", &rc);
    CHECK(rc == 0 && j && json_integer_value(json_object_get(j, "prompt_tokens")) + json_integer_value(json_object_get(j, "generation_tokens")) <= 512,
          "-n -1 runs until EOS or the context limit (rc %d)", rc);
    json_decref(j);
    char *big = malloc(600 * 4 + 64);
    int k = sprintf(big, "generate -m " M " -n 2 --tokens 1");
    for (int i = 0; i < 600; i++) k += sprintf(big + k, ",%d", 300 + i % 100);
    rc = sh_run(big, out, sizeof out);
    CHECK(rc == 1 && strstr(run_err(), "context"), "a 601-token prompt is refused: %.120s", run_err());
    free(big);

    /* a model without tokenizer files prints the generated ids */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/notok && cp " M "/config.json " M "/model.safetensors %s/notok/", cli_tmp, cli_tmp);
    int ok = system(cmd) == 0;
    snprintf(args, sizeof args, "generate -m %s/notok --tokens 1,403,407,261,378 -n 3 -q", cli_tmp);
    rc = sh_run(args, out, sizeof out);
    CHECK(ok && rc == 0 && !strcmp(out, "432 383 286\n"), "a tokenizer-less model prints the ids: '%s'", out);
}

/* tmp/name holding text[len]; returns the path (static) */
static const char *input_file(const char *name, const char *text, size_t len) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", cli_tmp, name);
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(text, 1, len, f); fclose(f); }
    return path;
}

static void test_chat_template(void) {
    char dir[256];
    make_chat_model(dir, sizeof dir);
    snprintf(args, sizeof args, "generate -m %s -p Once -n 5 -q", dir);
    int rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0 && !strcmp(out, ", there was a little\n"), "the chat template applies by default: '%s'", out);
    snprintf(args, sizeof args, "generate -m %s -p Once -n 5 -q --ignore-chat-template", dir);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0 && strcmp(out, ", there was a little\n") != 0, "--ignore-chat-template feeds the prompt as is: '%s'", out);
    snprintf(args, sizeof args, "generate -m %s -p upon -n 3 --system-prompt Once --json", dir);
    json_t *j = run_json(args, &rc);
    CHECK(rc == 0 && json_integer_value(json_object_get(j, "prompt_tokens")) == 6,
          "--system-prompt goes through the template: <s>Once upon upon a time (%d tokens)",
          (int)json_integer_value(json_object_get(j, "prompt_tokens")));
    json_decref(j);
    snprintf(args, sizeof args, "generate -m %s --system-prompt Once -n 3", dir);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "needs a prompt"), "--system-prompt without a prompt says so: %.80s", run_err());
    rc = sh_run("chat -m " M " < /dev/null", out, sizeof out);
    CHECK(rc == 1 && strstr(run_err(), "--chat-template"), "chat without a template fails at start and offers --chat-template: %.100s", run_err());
    snprintf(args, sizeof args, "chat -m " M " -n 5 --chat-template '{{ bos_token }}{%% for m in messages %%}{{ m.content }}{%% endfor %%}' "
             "< %s", input_file("in1", "Once upon a time\n", 17));
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0 && !strncmp(out, ", there was a little", 20), "chat --chat-template TEXT: '%.30s'", out);
    /* q, r, h as mlx_lm.chat; a line longer than 8 KB is one turn */
    snprintf(args, sizeof args, "chat -m %s -n 4 < %s", dir, input_file("in2", "Once\nr\nOnce\nh\nq\nLily\n", 21));
    rc = sh_run(args, out, sizeof out);
    int turns = 0;
    for (const char *p = run_err(); (p = strstr(p, "tok/s]")); p++) turns++;
    CHECK(rc == 0 && turns == 2 && !strcmp(out, ", there was a\n, there was a\n") && strstr(run_err(), "(conversation reset)") &&
          strstr(run_err(), "q quits"), "chat: r resets, h helps, q quits (%d turns): '%s'", turns, out);
    char path[128];
    snprintf(path, sizeof path, "%s/long.txt", cli_tmp);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 3000; i++) fputs("ab ", f);
    if (f) { fputc('\n', f); fclose(f); }
    snprintf(args, sizeof args, "chat -m %s -n 4 < %s", dir, path);
    rc = sh_run(args, out, sizeof out);
    const char *e = run_err();
    int refused = 0;
    for (const char *p = e; (p = strstr(p, "does not fit")); p++) refused++;
    CHECK(rc == 0 && refused == 1 && !strstr(e, "tok/s]"), "a 9 KB chat line is one turn, refused as too long for the context (%d)", refused);
}

/* a copy of the last stdout */
static void keep(char *a, size_t n) {
    size_t l = strlen(out);
    l = l < n ? l : n - 1;
    memcpy(a, out, l);
    a[l] = 0;
}

static void test_sampling(void) {
    char a[1 << 12] = "";
    int rc = sh_run("generate -m " M " -p 'Once upon a time' -n 30 --temp 1 -q", out, sizeof out);
    keep(a, sizeof a);
    int rc2 = sh_run("generate -m " M " -p 'Once upon a time' -n 30 --temp 1 -q", out, sizeof out);
    CHECK(rc == 0 && rc2 == 0 && strcmp(a, out), "unseeded runs differ");
    rc = sh_run("generate -m " M " -p 'Once upon a time' -n 30 --temp 1 --seed 5 -q", out, sizeof out);
    keep(a, sizeof a);
    rc2 = sh_run("generate -m " M " -p 'Once upon a time' -n 30 --temp 1 --seed 5 -q", out, sizeof out);
    CHECK(rc == 0 && rc2 == 0 && !strcmp(a, out), "--seed 5 reproduces");
    rc = sh_run("generate -m " M " -p 'Once upon a time' -n 3 --temp 1 --seed -1 -q", out, sizeof out);
    CHECK(rc == 0, "--seed -1 is random, as llama.cpp (rc %d)", rc);
    rc = sh_run("generate -m " M " -p 'Once upon a time' -n 20 --stop little -q", out, sizeof out);
    CHECK(rc == 0 && !strcmp(out, ", there was a \n"), "--stop cuts before the stop string: '%s'", out);
    int jrc;
    json_t *j = run_json("generate -m " M " -p 'Once upon a time' -n 20 --stop 'girl named' --stop zzz --json", &jrc);
    CHECK(jrc == 0 && !strcmp(json_string_value(json_object_get(j, "text")) ?: "", ", there was a little ") &&
          !strcmp(json_string_value(json_object_get(j, "finish_reason")) ?: "", "stop"), "--stop across tokens, finish_reason stop");
    json_decref(j);
    j = run_json("generate -m " M " -p 'Once upon a time' -n 20 --extra-eos-token 376 --json", &jrc);
    CHECK(jrc == 0 && json_array_size(json_object_get(j, "tokens")) == 5 &&
          !strcmp(json_string_value(json_object_get(j, "finish_reason")) ?: "", "stop"), "--extra-eos-token 376 ends at 'little'");
    json_decref(j);
}

static void test_inputs(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/p.txt", cli_tmp);
    FILE *f = fopen(path, "w");
    if (f) { fputs("Once upon a time", f); fclose(f); }
    snprintf(args, sizeof args, "generate -m " M " -f %s -n 5 -q", path);
    int rc = sh_run(args, out, sizeof out);
    CHECK(rc == 0 && !strcmp(out, ", there was a little\n"), "-f FILE reads the prompt: '%s'", out);
    rc = sh_run("generate -m " M " -p - -n 3 -q < /dev/null", out, sizeof out);
    CHECK(rc == 0, "-p - reads standard input");
    snprintf(args, sizeof args, "generate -m " M " -p - -n 3 -q < %s", input_file("nul", "Once\0upon", 9));
    rc = sh_run(args, out, sizeof out);
    CHECK(rc != 0 && strstr(run_err(), "NUL"), "a NUL byte in the prompt is an error, not a silent cut: %.80s", run_err());
    rc = sh_run("generate -m " M " -f /dev/zero -n 3", out, sizeof out);
    CHECK(rc == 1 && strstr(run_err(), "not a regular file"), "-f /dev/zero: not a regular file (%.80s)", run_err());
    rc = sh_run("generate -m " M " --tokens 1,403 -p x", out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "--tokens"), "--tokens with -p is refused: %.80s", run_err());
    rc = sh_run("logits -m " M " --tokens 1 2 3", out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "'2'"), "logits --tokens 1 2 3: the stray '2' is named: %.80s", run_err());
    rc = sh_run("generate -m " M " -ngl 99", out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "'-ngl'"), "-ngl 99 is an unknown option, by name: %.80s", run_err());
    rc = sh_run("perplexity -m " M " --data x --frobnicate", out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "'--frobnicate'"), "perplexity names an unknown flag: %.80s", run_err());
    rc = sh_run("chat -m " M " --json", out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "--json"), "chat --json is refused, not ignored");
    rc = sh_run("generate -m " M " -n 3 --device cuda", out, sizeof out);
    const char *e = run_err();
    CHECK(rc == 0 /* a GPU is there */ || (rc == 1 && (strstr(e, "driver") || strstr(e, "no CUDA device") || strstr(e, "without CUDA") || strstr(e, "(driver"))),
          "--device cuda without a GPU says why: %.120s", e);
    /* perplexity: standard input and mlx_lm's --data-path */
    snprintf(args, sizeof args, "perplexity -m " M " --data - --sequence-length 16 --num-samples 2 --json < tests/fixtures/score/data.jsonl");
    int rcj;
    json_t *j = run_json(args, &rcj);
    double a = json_real_value(json_object_get(j, "perplexity"));
    json_decref(j);
    snprintf(args, sizeof args, "perplexity -m " M " --data-path tests/fixtures/score/data.jsonl --sequence-length 16 --num-samples 2 --json");
    j = run_json(args, &rc);
    double b = json_real_value(json_object_get(j, "perplexity"));
    json_decref(j);
    CHECK(rcj == 0 && rc == 0 && a > 1 && a == b, "perplexity --data - (stdin) == --data-path FILE (%g, %g)", a, b);
    char lp[2200] = "{\"prompt\": \"Once\", \"response\": \"";
    for (int i = 0; i < 600; i++) strcat(lp, " a");
    strcat(lp, "\"}\n");
    const char *lp1 = "{\"prompt\": \"Once\", \"response\": \" upon\"}\n";
    snprintf(args, sizeof args, "logprobs -m " M " --data %s", input_file("lp.jsonl", lp1, strlen(lp1)));
    int rc1 = sh_run(args, out, sizeof out);
    snprintf(args, sizeof args, "logprobs -m " M " --data %s", input_file("lp2.jsonl", lp, strlen(lp)));
    rc = sh_run(args, out, sizeof out);
    CHECK(rc1 == 0 && rc == 1 && strstr(run_err(), "lp2.jsonl:1:") && strstr(run_err(), "context"),
          "logprobs: a pair longer than the context is refused with file:line: %.100s", run_err());
    j = run_json("kl --base " M " --model " M " --data tests/fixtures/score/data.jsonl --sequence-length 16 --num-samples 2 --json", &rc);
    double gb = json_real_value(json_object_get(j, "peak_memory_gb"));
    CHECK(rc == 0 && gb > 2.0e-3 && gb < 0.03, "kl --json: peak memory counts the two 1 MB models and their caches (%.4f GB)", gb);
    json_decref(j);
    j = run_json("perplexity -m " M " --data tests/fixtures/score/data.jsonl --sequence-length 16 --num-samples 2 --json", &rc);
    gb = json_real_value(json_object_get(j, "peak_memory_gb"));
    CHECK(rc == 0 && gb > 1.0e-3 && gb < 0.02, "perplexity --json: peak memory counts the model and its caches (%.4f GB)", gb);
    json_decref(j);
    rc = sh_run("perplexity -m " M " --sequence-length 600 --data tests/fixtures/score/data.jsonl", out, sizeof out);
    CHECK(rc == 1 && strstr(run_err(), "context"), "--sequence-length 600 on a 512-position model is refused: %.100s", run_err());
}

static void test_writes(void) {
    static const char *cmds[] = {
        "generate -m " M " -p 'Once upon a time' -n 5 -q",
        "generate -m " M " -n 5 --json",
        "tokenize -m " M " 'Once upon a time'",
        "detokenize -m " M " 403 407",
        "logits -m " M " --tokens 1,403",
        "perplexity -m " M " --data tests/fixtures/score/data.jsonl --sequence-length 16 --num-samples 2 --json",
        "--version",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        snprintf(args, sizeof args, "%s > /dev/full", cmds[i]);
        int rc = sh_run(args, out, sizeof out);
        CHECK(rc == 1 && strstr(run_err(), "writing"), "'%s > /dev/full' fails with a message (rc %d)", cmds[i], rc);
    }
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", cli_tmp);
    struct stat st;
    int made = mkfifo(fifo, 0644) == 0;
    snprintf(args, sizeof args, "logits -m " M " --tokens 1,403 --npy %s", fifo);
    int rc = sh_run(args, out, sizeof out);
    CHECK(made && rc == 1 && lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode) && strstr(run_err(), "not a regular file"),
          "--npy onto a FIFO: refused, the FIFO stays: %.100s", run_err());
    snprintf(args, sizeof args, "kl --base " M " --data tests/fixtures/score/data.jsonl --sequence-length 16 --num-samples 1 --save-base %s", fifo);
    rc = sh_run(args, out, sizeof out);
    CHECK(rc == 1 && lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "kl --save-base onto a FIFO: refused, the FIFO stays");
}

/* NaN weights: an error naming NaN, never "<unk>" text or "nan" in JSON */
static void test_nan_model(void) {
    char dir[256];
    int ok = copy_model_nan(cli_tmp, "nan", dir, sizeof dir);
    snprintf(args, sizeof args, "generate -m %s -p 'Once upon a time' -n 5 --json", dir);
    int rc = sh_run(args, out, sizeof out);
    CHECK(ok && rc == 1 && !out[0] && strstr(run_err(), "NaN"), "generate on NaN weights: exit 1, a message: %.90s", run_err());
    snprintf(args, sizeof args, "perplexity -m %s --data tests/fixtures/score/data.jsonl --sequence-length 16 --num-samples 2 --json", dir);
    rc = sh_run(args, out, sizeof out);
    CHECK(ok && rc == 1 && !out[0] && strstr(run_err(), "NaN"), "perplexity --json on NaN weights: exit 1, no 'nan' JSON: %.90s", run_err());
}

static void test_version(void) {
    int rc = sh_run("--version", out, sizeof out);
    int a, b, c;
    CHECK(rc == 0 && sscanf(out, "cinfer %d.%d.%d", &a, &b, &c) == 3, "cinfer --version: %s", out);
}

/* --prefill-act: a bad value is named; f32 and bf16 are taken (on an f32 model the bf16 mode changes
 * nothing: it rounds the activations into bf16 and affine weights only) */
static void test_prefill_act(void) {
    int rc = sh_run("generate -m " M " -p 'Once upon a time' -n 4 --prefill-act f16", out, sizeof out);
    CHECK(rc == 2 && strstr(run_err(), "--prefill-act") && strstr(run_err(), "'f16'"),
          "--prefill-act f16 is refused naming the flag and the value (rc %d: %.80s)", rc, run_err());
    char a[256];
    rc = sh_run("generate -m " M " -p 'Once upon a time' -n 12 -q --prefill-act f32", a, sizeof a);
    int rc2 = sh_run("generate -m " M " -p 'Once upon a time' -n 12 -q --prefill-act bf16", out, sizeof out);
    CHECK(rc == 0 && rc2 == 0 && !strcmp(a, out) && !strncmp(out, ", there was a little girl named Lily.", 37),
          "--prefill-act f32 / bf16 on the f32 model: the same text (%.40s)", out);
}

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_setup(argv[0])) return 1;
    test_generate_output();
    test_chat_template();
    test_sampling();
    test_inputs();
    test_writes();
    test_nan_model();
    test_version();
    test_prefill_act();
    cli_cleanup();
    return CHECK_DONE();
}
