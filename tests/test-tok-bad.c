/*
 * test-tok-bad.c — hostile and broken tokenizer files: every one must give
 * a clear error (a status and a message naming the problem), never a crash
 * or a leak (this test also runs under ASan+UBSan).
 *
 * Covers: no tokenizer.json (CINFER_ENOTFOUND, which the model loader relies
 * on), malformed and truncated JSON (every prefix of a real file), unknown
 * model/normalizer/pre-tokenizer/decoder types, a regex PCRE2 rejects,
 * merges naming missing tokens, out-of-range ids, wrong JSON types; and
 * bad arguments to the encode/decode functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"

static char dir[256];

static void write_file(const char *name, const char *s, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fwrite(s, 1, n, f);
    fclose(f);
}

static cinfer_status load_text(const char *json, char *err, size_t n) {
    write_file("tokenizer.json", json, strlen(json));
    cinfer_tokenizer *t = NULL;
    err[0] = 0;
    cinfer_status st = cinfer_tokenizer_load(dir, &t, err, n);
    cinfer_tokenizer_free(t);
    return st;
}

#define BASE_PRE "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void expect(const char *what, const char *json, cinfer_status want, const char *needle) {
    char err[512];
    cinfer_status st = load_text(json, err, sizeof err);
    CHECK(st == want && (!needle || strstr(err, needle)), "%s -> %s: %s", what, cinfer_status_str(st), err);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cinfer-tokbad-XXXXXX");
    if (!mkdtemp(dir)) { printf("FAIL mkdtemp\n"); return 1; }
    char err[512];
    cinfer_tokenizer *t = NULL;

    cinfer_status st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
    CHECK(st == CINFER_ENOTFOUND && !t && strstr(err, "tokenizer.json"), "empty dir -> ENOTFOUND: %s", err);
    st = cinfer_tokenizer_load("/nonexistent/dir", &t, err, sizeof err);
    CHECK(st == CINFER_ENOTFOUND && !t, "missing dir -> ENOTFOUND: %s", err);

    /* a minimal valid file loads and works */
    {
        const char *ok = BASE_PRE ", \"added_tokens\": [{\"id\": 3, \"content\": \"<x>\", \"special\": true}]}";
        write_file("tokenizer.json", ok, strlen(ok));
        st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
        CHECK(st == CINFER_OK, "minimal tokenizer loads (%s)", err);
        if (!st) {
            int32_t *ids;
            int n;
            st = cinfer_tokenize(t, "ab<x>ba", 7, 1, 1, &ids, &n);
            CHECK(!st && n == 4 && ids[0] == 2 && ids[1] == 3 && ids[2] == 1 && ids[3] == 0, "minimal encode: %d ids", n);
            free(ids);
            st = cinfer_tokenize(t, NULL, 0, 1, 1, &ids, &n);
            CHECK(!st && n == 0, "empty text encodes to nothing");
            free(ids);
            CHECK(cinfer_tokenize(t, NULL, 5, 1, 1, &ids, &n) == CINFER_EINVAL, "NULL text with a length is EINVAL");
            char *txt = NULL;
            int32_t bad[] = {0, 99};
            CHECK(cinfer_detokenize(t, bad, 2, 0, &txt) == CINFER_EINVAL && !txt, "out-of-range id is EINVAL");
            int32_t neg[] = {-1};
            CHECK(cinfer_detokenize(t, neg, 1, 0, &txt) == CINFER_EINVAL, "negative id is EINVAL");
            CHECK(cinfer_token_piece(t, 99) == NULL && cinfer_token_piece(t, -5) == NULL, "piece of a bad id is NULL");
            cinfer_detok_stream *s = cinfer_detok_stream_new(t, 0);
            const char *p = cinfer_detok_stream_push(s, 12345);
            CHECK(p && !*p, "stream ignores an unknown id");
            cinfer_detok_stream_free(s);
            cinfer_chat_render(t, "[]", NULL, NULL, 1, &txt, err, sizeof err);
            CHECK(txt == NULL && strstr(err, "chat template"), "no template: %s", err);
            cinfer_tokenizer_free(t);
            t = NULL;
        }
    }

    expect("not JSON", "this is not json", CINFER_EFORMAT, "JSON error");
    expect("empty file", "", CINFER_EFORMAT, "JSON error");
    expect("JSON array", "[1,2,3]", CINFER_EFORMAT, "model");
    expect("no model", "{\"version\": \"1.0\"}", CINFER_EFORMAT, "model");
    expect("unknown model type", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", CINFER_EUNSUPPORTED, "Unigram");
    expect("WordPiece", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", CINFER_EUNSUPPORTED, "WordPiece");
    expect("vocab not an object", "{\"model\": {\"type\": \"BPE\", \"vocab\": [1]}}", CINFER_EFORMAT, "vocab");
    expect("empty vocab", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", CINFER_EFORMAT, "empty");
    expect("string id", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}}}", CINFER_EFORMAT, "bad id");
    expect("negative id", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", CINFER_EFORMAT, "bad id");
    expect("huge id", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 4000000000}}}", CINFER_EFORMAT, "bad id");
    expect("fractional id", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}}}", CINFER_EFORMAT, "bad id");
    expect("merge of missing token", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a zz\"]}}",
           CINFER_EFORMAT, "missing");
    expect("merge result missing", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\", \"b\"]]}}",
           CINFER_EFORMAT, "missing");
    expect("merge without space", BASE_PRE "}" "", CINFER_OK, NULL);
    expect("merge without space (bad)", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}",
           CINFER_EFORMAT, "no space");
    expect("merge of wrong type", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [3]}}",
           CINFER_EFORMAT, "merge");
    expect("regex PCRE2 rejects", BASE_PRE ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(unclosed[\"}, "
           "\"behavior\": \"Isolated\", \"invert\": false}}", CINFER_EFORMAT, "PCRE2");
    expect("Split without pattern", BASE_PRE ", \"pre_tokenizer\": {\"type\": \"Split\", \"behavior\": \"Isolated\"}}",
           CINFER_EFORMAT, "pattern");
    expect("Split bad behavior", BASE_PRE ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
           "\"behavior\": \"Sideways\"}}", CINFER_EFORMAT, "behavior");
    expect("unknown normalizer", BASE_PRE ", \"normalizer\": {\"type\": \"BertNormalizer\"}}", CINFER_EUNSUPPORTED, "BertNormalizer");
    expect("unknown pre-tokenizer", BASE_PRE ", \"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}}", CINFER_EUNSUPPORTED, "UnicodeScripts");
    expect("unknown decoder", BASE_PRE ", \"decoder\": {\"type\": \"CTC\"}}", CINFER_EUNSUPPORTED, "CTC");
    expect("unknown post-processor", BASE_PRE ", \"post_processor\": {\"type\": \"Frobnicate\"}}", CINFER_EUNSUPPORTED, "Frobnicate");
    expect("normalizer without type", BASE_PRE ", \"normalizer\": {\"x\": 1}}", CINFER_EFORMAT, "type");
    expect("Replace regex rejected", BASE_PRE ", \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a{2,1}\"}, "
           "\"content\": \"b\"}}", CINFER_EFORMAT, "PCRE2");
    expect("added token bad id", BASE_PRE ", \"added_tokens\": [{\"id\": -4, \"content\": \"x\"}]}", CINFER_EFORMAT, "added_tokens");
    expect("added token no content", BASE_PRE ", \"added_tokens\": [{\"id\": 4}]}", CINFER_EFORMAT, "added_tokens");
    expect("added_tokens not a list", BASE_PRE ", \"added_tokens\": {\"id\": 4}}", CINFER_EFORMAT, "added_tokens");
    expect("template names unknown token", BASE_PRE ", \"post_processor\": {\"type\": \"TemplateProcessing\", "
           "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}}",
           CINFER_EFORMAT, "special");
    expect("template id out of range", BASE_PRE ", \"post_processor\": {\"type\": \"TemplateProcessing\", "
           "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [77]}}}}",
           CINFER_EFORMAT, "range");
    expect("deep nesting", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
           "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", CINFER_EFORMAT, "deep");
    expect("bad escape", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\q\": 0}}}", CINFER_EFORMAT, "escape");
    expect("bad unicode escape", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u12\": 0}}}", CINFER_EFORMAT, "escape");
    expect("trailing garbage", BASE_PRE "} x", CINFER_EFORMAT, "trailing");
    expect("lone surrogate is tolerated", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\ud800\": 0}}}", CINFER_OK, NULL);

    /* every prefix of a real tokenizer.json: a clean error each time */
    {
        char p[512];
        snprintf(p, sizeof p, "%s/models/stories260k/tokenizer.json", shared_dir());
        FILE *f = fopen(p, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            char *buf = malloc((size_t)n);
            size_t got = fread(buf, 1, (size_t)n, f);
            fclose(f);
            int bad = 0, step = 7;
            for (long k = 0; k < (long)got - 1; k += step) {
                write_file("tokenizer.json", buf, (size_t)k);
                st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
                if (st == CINFER_OK || t || !err[0]) bad++;
                cinfer_tokenizer_free(t);
                t = NULL;
            }
            CHECK(bad == 0, "all %ld truncations of stories260k tokenizer.json fail cleanly (%d did not)", (long)got / step, bad);
            write_file("tokenizer.json", buf, got);
            st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
            CHECK(st == CINFER_OK, "the whole file loads");
            cinfer_tokenizer_free(t);
            t = NULL;
            /* a broken tokenizer_config.json is an error too */
            write_file("tokenizer_config.json", "{\"bos_token\": ", 14);
            st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
            CHECK(st == CINFER_EFORMAT && strstr(err, "tokenizer_config.json"), "truncated tokenizer_config.json: %s", err);
            cinfer_tokenizer_free(t);
            free(buf);
        } else
            CHECK(0, "open %s", p);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return CHECK_DONE();
}
