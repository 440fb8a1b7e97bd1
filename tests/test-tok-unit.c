/*
 * test-tok-unit.c — tokenizer.json features that the real tokenizer files of
 * ../shared do not exercise, on small hand-made files: the five Split
 * behaviours and invert, added-token lstrip/rstrip/single_word/normalized,
 * Metaspace (prepend schemes, split) and its decoder, ByteLevel with the
 * GPT-2 regex and a prefix space, unk with and without fuse_unk, NFC,
 * continuing_subword_prefix, TemplateProcessing with EOS and
 * tokenizer_config.json's add_bos_token/add_eos_token, the no-decoder join.
 *
 * Expected results follow HF tokenizers' documented semantics (Split
 * behaviours as in normalizer.rs, AddedVocabulary::find_matches, Metaspace
 * pre_tokenize/decode); the parity against HF itself is test-tokenizer.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "cinfer.h"

static char dir[256];

static void write_file(const char *name, const char *s) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fputs(s, f);
    fclose(f);
}

/* builds a tokenizer.json: vocab = the space-separated pieces (ids in order),
 * merges = JSON array text, extra = more top-level members (may be "") */
static cinfer_tokenizer *make(const char *pieces, const char *merges, const char *model_extra, const char *extra,
                              const char *config) {
    static char json[16384];
    char vocab[8192] = "";
    int id = 0;
    char *copy = strdup(pieces);
    for (char *p = strtok(copy, " "); p; p = strtok(NULL, " ")) {
        char e[128];
        snprintf(e, sizeof e, "%s\"%s\": %d", id ? ", " : "", p, id);
        strcat(vocab, e);
        id++;
    }
    free(copy);
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": {%s}, \"merges\": %s%s%s}%s%s}", vocab,
             merges, *model_extra ? ", " : "", model_extra, *extra ? ", " : "", extra);
    write_file("tokenizer.json", json);
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    if (config) write_file("tokenizer_config.json", config);
    else unlink(p);
    cinfer_tokenizer *t = NULL;
    char err[512];
    if (cinfer_tokenizer_load(dir, &t, err, sizeof err)) printf("  load failed: %s\n%s\n", err, json);
    return t;
}

/* encodes and joins the pieces with '|' */
static const char *enc(const cinfer_tokenizer *t, const char *text, int add_special) {
    static char out[4096];
    out[0] = 0;
    if (!t) return "(no tokenizer)";
    int32_t *ids;
    int n;
    if (cinfer_tokenize(t, text, strlen(text), add_special, 1, &ids, &n)) return "(error)";
    for (int i = 0; i < n; i++) {
        if (i) strcat(out, "|");
        strcat(out, cinfer_token_piece(t, ids[i]));
    }
    free(ids);
    return out;
}

static const char *dec(const cinfer_tokenizer *t, const char *pieces_bar) {
    static char out[4096];
    int32_t ids[64];
    int n = 0;
    char *copy = strdup(pieces_bar);
    for (char *p = strtok(copy, "|"); p && n < 64; p = strtok(NULL, "|"))
        for (int id = 0; id < cinfer_tokenizer_n_vocab(t); id++)
            if (cinfer_token_piece(t, id) && !strcmp(cinfer_token_piece(t, id), p)) { ids[n++] = id; break; }
    free(copy);
    char *s = NULL;
    if (cinfer_detokenize(t, ids, n, 0, &s)) return "(error)";
    snprintf(out, sizeof out, "%s", s);
    free(s);
    return out;
}

#define EXPECT(got, want, what) do { const char *g_ = (got); \
    CHECK(!strcmp(g_, want), "%s: got \"%s\" want \"%s\"", what, g_, want); } while (0)

static void split_behaviours(void) {
    const char *v = "a b c - a- b- -- -c -b";
    const char *m = "[\"a -\", \"b -\", \"- -\", \"- c\", \"- b\"]";
    static const struct { const char *beh; int invert; const char *want; } cases[] = {
        {"Isolated", 0, "a|-|b|-|-|c"},
        {"Removed", 0, "a|b|c"},
        {"MergedWithPrevious", 0, "a-|b-|-|c"},
        {"MergedWithNext", 0, "a|-b|-|-c"},
        {"Contiguous", 0, "a|-|b|--|c"},
        {"Removed", 1, "-|-|-"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char extra[300];
        snprintf(extra, sizeof extra, "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, "
                 "\"behavior\": \"%s\", \"invert\": %s}", cases[i].beh, cases[i].invert ? "true" : "false");
        cinfer_tokenizer *t = make(v, m, "", extra, NULL);
        char what[100];
        snprintf(what, sizeof what, "Split %s invert=%d", cases[i].beh, cases[i].invert);
        EXPECT(enc(t, "a-b--c", 0), cases[i].want, what);
        cinfer_tokenizer_free(t);
    }
    /* no pre-tokenizer: one word, merges by rank */
    cinfer_tokenizer *t = make(v, m, "", "", NULL);
    EXPECT(enc(t, "a-b--c", 0), "a-|b-|-c", "no pre-tokenizer: merges by rank over the whole word");
    cinfer_tokenizer_free(t);
}

static void added_flags(void) {
    const char *v = "a b x < > \xe2\x96\x81";
    static const struct { const char *flags, *text, *want, *what; } cases[] = {
        {"", "a <x> b", "a|\xe2\x96\x81|<x>|\xe2\x96\x81|b", "added token, no flags"},
        {"\"lstrip\": true", "a <x> b", "a|<x>|\xe2\x96\x81|b", "lstrip eats the space before"},
        {"\"rstrip\": true", "a <x> b", "a|\xe2\x96\x81|<x>|b", "rstrip eats the space after"},
        {"\"lstrip\": true, \"rstrip\": true", "a  <x>  b", "a|<x>|b", "lstrip+rstrip eat runs"},
        {"\"single_word\": true", "a<x>b", "a|<|x|>|b", "single_word does not match inside a word"},
        {"\"single_word\": true", "a <x> b", "a|\xe2\x96\x81|<x>|\xe2\x96\x81|b", "single_word matches between spaces"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char extra[500];
        snprintf(extra, sizeof extra, "\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
                 "\"content\": \"\xe2\x96\x81\"}, \"added_tokens\": [{\"id\": 6, \"content\": \"<x>\", \"special\": true, "
                 "\"normalized\": false%s%s}]", *cases[i].flags ? ", " : "", cases[i].flags);
        cinfer_tokenizer *t = make(v, "[]", "", extra, NULL);
        EXPECT(enc(t, cases[i].text, 0), cases[i].want, cases[i].what);
        cinfer_tokenizer_free(t);
    }
    /* normalized added token: matched after the normalizer, content normalized too */
    cinfer_tokenizer *t = make("a b x < >", "[]", "",
        "\"normalizer\": {\"type\": \"Lowercase\"}, \"added_tokens\": [{\"id\": 5, \"content\": \"<X>\", "
        "\"special\": false, \"normalized\": true}]", NULL);
    EXPECT(enc(t, "A<X>B<x>", 0), "a|<X>|b|<X>", "normalized added token matches normalized text");
    cinfer_tokenizer_free(t);
    t = make("a b x < >", "[]", "",
        "\"normalizer\": {\"type\": \"Lowercase\"}, \"added_tokens\": [{\"id\": 5, \"content\": \"<X>\", "
        "\"special\": false, \"normalized\": false}]", NULL);
    EXPECT(enc(t, "A<X>B<x>", 0), "a|<X>|b|<|x|>", "non-normalized added token matches raw text only");
    cinfer_tokenizer_free(t);
    /* specials as plain text still match non-special added tokens */
    t = make("a < > s n", "[]", "",
        "\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\", \"special\": true}, "
        "{\"id\": 6, \"content\": \"<n>\", \"special\": false}]", NULL);
    int32_t *ids;
    int n;
    cinfer_tokenize(t, "<s><n>", 6, 0, 0, &ids, &n);
    CHECK(n == 4 && ids[3] == 6, "parse_special=0: <s> as text (%d ids), <n> still added", n);
    free(ids);
    cinfer_tokenizer_free(t);
}

static void metaspace(void) {
    const char *v = "a b \xe2\x96\x81 \xe2\x96\x81""a \xe2\x96\x81""b";
    const char *m = "[\"\xe2\x96\x81 a\", \"\xe2\x96\x81 b\"]";
    static const struct { const char *scheme, *text, *want; } cases[] = {
        {"always", "a b", "\xe2\x96\x81""a|\xe2\x96\x81""b"},
        {"never", "a b", "a|\xe2\x96\x81""b"},
        {"first", "a b", "\xe2\x96\x81""a|\xe2\x96\x81""b"},
        {"first", "<x>a b", "<x>|a|\xe2\x96\x81""b"},
        {"always", "<x>a b", "<x>|\xe2\x96\x81""a|\xe2\x96\x81""b"},
        {"always", " a", "\xe2\x96\x81""a"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char extra[600];
        snprintf(extra, sizeof extra, "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", "
                 "\"prepend_scheme\": \"%s\", \"split\": true}, \"decoder\": {\"type\": \"Metaspace\", "
                 "\"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"%s\", \"split\": true}, "
                 "\"added_tokens\": [{\"id\": 5, \"content\": \"<x>\", \"special\": true}]", cases[i].scheme, cases[i].scheme);
        cinfer_tokenizer *t = make(v, m, "", extra, NULL);
        char what[100];
        snprintf(what, sizeof what, "Metaspace %s \"%s\"", cases[i].scheme, cases[i].text);
        EXPECT(enc(t, cases[i].text, 0), cases[i].want, what);
        if (i == 0) EXPECT(dec(t, "\xe2\x96\x81""a|\xe2\x96\x81""b"), "a b", "Metaspace decoder drops the first prefix");
        if (i == 1) EXPECT(dec(t, "\xe2\x96\x81""a|\xe2\x96\x81""b"), " a b", "Metaspace decoder (never) keeps it");
        cinfer_tokenizer_free(t);
    }
}

static void bytelevel(void) {
    /* Ġ = U+0120 stands for the space byte */
    const char *v = "h i y o u \xc4\xa0 \xc4\xa0h \xc4\xa0hi \xc4\xa0y \xc4\xa0yo \xc4\xa0you";
    const char *m = "[\"\xc4\xa0 h\", \"\xc4\xa0h i\", \"\xc4\xa0 y\", \"\xc4\xa0y o\", \"\xc4\xa0yo u\"]";
    cinfer_tokenizer *t = make(v, m, "", "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
                               "\"use_regex\": true}, \"decoder\": {\"type\": \"ByteLevel\"}", NULL);
    EXPECT(enc(t, "hi you", 0), "\xc4\xa0hi|\xc4\xa0you", "ByteLevel add_prefix_space + GPT-2 regex");
    EXPECT(dec(t, "\xc4\xa0hi|\xc4\xa0you"), " hi you", "ByteLevel decoder maps Ġ back to a space");
    cinfer_tokenizer_free(t);
    t = make(v, m, "", "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
             "\"use_regex\": true}", NULL);
    EXPECT(enc(t, "hi you", 0), "h|i|\xc4\xa0you", "ByteLevel without prefix space");
    EXPECT(dec(t, "h|i|\xc4\xa0you"), "h i \xc4\xa0you", "no decoder: pieces joined with spaces");
    cinfer_tokenizer_free(t);
}

static void unk_and_norm(void) {
    cinfer_tokenizer *t = make("a <unk>", "[]", "\"unk_token\": \"<unk>\", \"fuse_unk\": true", "", NULL);
    EXPECT(enc(t, "axyza", 0), "a|<unk>|a", "fuse_unk fuses a run of unknown chars");
    cinfer_tokenizer_free(t);
    t = make("a <unk>", "[]", "\"unk_token\": \"<unk>\", \"fuse_unk\": false", "", NULL);
    EXPECT(enc(t, "axya", 0), "a|<unk>|<unk>|a", "one unk per unknown char without fuse_unk");
    cinfer_tokenizer_free(t);
    t = make("a", "[]", "", "", NULL);
    EXPECT(enc(t, "axa", 0), "a|a", "without unk_token unknown chars are dropped");
    cinfer_tokenizer_free(t);
    t = make("e \xc3\xa9", "[]", "", "\"normalizer\": {\"type\": \"NFC\"}", NULL);
    EXPECT(enc(t, "e\xcc\x81""e", 0), "\xc3\xa9|e", "NFC composes e + combining acute");
    cinfer_tokenizer_free(t);
    t = make("a ##b ##c ab abc", "[\"a ##b\", \"ab ##c\"]", "\"continuing_subword_prefix\": \"##\"", "", NULL);
    EXPECT(enc(t, "abc", 0), "abc", "continuing_subword_prefix: merged tokens drop the prefix");
    EXPECT(enc(t, "ac", 0), "a|##c", "continuing_subword_prefix on non-first chars");
    cinfer_tokenizer_free(t);
}

static void post_processing(void) {
    const char *tp = "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "
        "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], "
        "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}, "
        "\"</s>\": {\"id\": \"</s>\", \"ids\": [2], \"tokens\": [\"</s>\"]}}}, "
        "\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}, {\"id\": 2, \"content\": \"</s>\", \"special\": true}]";
    cinfer_tokenizer *t = make("a <s> </s>", "[]", "", tp, NULL);
    EXPECT(enc(t, "a", 1), "<s>|a|</s>", "TemplateProcessing adds BOS and EOS");
    EXPECT(enc(t, "a", 0), "a", "add_special=0 adds nothing");
    CHECK(cinfer_tokenizer_bos(t) == 1 && cinfer_tokenizer_eos(t) == -1, "bos from the template, eos unknown without config");
    cinfer_tokenizer_free(t);
    t = make("a <s> </s>", "[]", "", tp, "{\"add_bos_token\": false, \"add_eos_token\": true, \"bos_token\": \"<s>\", "
             "\"eos_token\": {\"content\": \"</s>\"}}");
    EXPECT(enc(t, "a", 1), "a|</s>", "tokenizer_config add_bos_token/add_eos_token override the template");
    CHECK(cinfer_tokenizer_bos(t) == 1 && cinfer_tokenizer_eos(t) == 2, "bos/eos ids from tokenizer_config (string or {content})");
    char *s = NULL;
    int32_t ids[] = {1, 0, 2};
    cinfer_detokenize(t, ids, 3, 1, &s);
    CHECK(s && !strcmp(s, "a"), "skip_special drops BOS/EOS (\"%s\")", s ? s : "");
    free(s);
    cinfer_tokenizer_free(t);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cinfer-tokunit-XXXXXX");
    if (!mkdtemp(dir)) { printf("FAIL mkdtemp\n"); return 1; }
    split_behaviours();
    added_flags();
    metaspace();
    bytelevel();
    unk_and_norm();
    post_processing();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return CHECK_DONE();
}
