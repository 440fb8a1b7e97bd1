/*
 * cmd-tokenize.c — `cinfer tokenize`, `cinfer detokenize`, `cinfer template`:
 * the tokenizer and chat template of a model directory (or of a directory
 * holding only tokenizer.json / tokenizer_config.json), from the shell.
 *
 * Output is exact: `detokenize` and `template` print the text byte for byte
 * (detokenize adds one newline unless -n); `tokenize --json` prints
 * {"ids": [...], "pieces": [...]}. Errors name the problem and exit 1;
 * usage errors exit 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", f);
        else if (*p == '\r') fputs("\\r", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static cinfer_tokenizer *load_tok(const char *cmd, const char *dir) {
    cinfer_tokenizer *t = NULL;
    char err[1024];
    cinfer_status st = cinfer_tokenizer_load(dir, &t, err, sizeof err);
    if (st) {
        fprintf(stderr, "cinfer %s: %s\n", cmd, err);
        return NULL;
    }
    return t;
}

static int missing_value(const char *cmd, const char *flag) {
    fprintf(stderr, "cinfer %s: %s needs a value (see cinfer %s --help)\n", cmd, flag, cmd);
    return 2;
}

static const char *tokenize_help =
    "usage: cinfer tokenize -m DIR [options] TEXT|-\n"
    "Encodes TEXT (\"-\": read standard input) with DIR's tokenizer.json and prints one\n"
    "line per token: id and piece (as a JSON string), then the count.\n"
    "  -m, --model DIR     model directory, or a directory with only tokenizer files\n"
    "  --json              print {\"ids\": [...], \"pieces\": [...]}\n"
    "  --ids               print only the ids, space-separated, on one line\n"
    "  --no-bos-eos        do not add the post-processor's BOS/EOS tokens\n"
    "  --plain-specials    encode special-token text (e.g. <|im_start|>) as plain text\n"
    "  -f, --file PATH     read the text from PATH\n";

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *file = NULL;
    int json = 0, ids_only = 0, add = 1, parse = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(tokenize_help, stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (++i >= argc) return missing_value("tokenize", a); dir = argv[i]; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { if (++i >= argc) return missing_value("tokenize", a); file = argv[i]; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--ids")) ids_only = 1;
        else if (!strcmp(a, "--no-bos-eos")) add = 0;
        else if (!strcmp(a, "--plain-specials")) parse = 0;
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "cinfer tokenize: unknown option '%s'\n%s", a, tokenize_help); return 2; }
        else if (!text) text = a;
        else { fprintf(stderr, "cinfer tokenize: one TEXT argument expected (quote it)\n"); return 2; }
    }
    if (!dir) { fprintf(stderr, "cinfer tokenize: -m DIR is required\n%s", tokenize_help); return 2; }
    if (!text && !file) { fprintf(stderr, "cinfer tokenize: TEXT (or - or --file) is required\n%s", tokenize_help); return 2; }
    if (text && file) { fprintf(stderr, "cinfer tokenize: give TEXT or --file, not both\n"); return 2; }
    size_t len;
    char *buf = NULL;
    if (file || !strcmp(text, "-")) {
        const char *p = file ? file : "-";
        const char *why;
        buf = cli_read_file(p, &len, &why);
        if (!buf) { fprintf(stderr, "cinfer tokenize: cannot read %s: %s\n", file ? file : "standard input", why); return 1; }
        text = buf;
    } else len = strlen(text);
    cinfer_tokenizer *t = load_tok("tokenize", dir);
    if (!t) { free(buf); return 1; }
    int32_t *ids = NULL;
    int n = 0;
    cinfer_status st = cinfer_tokenize(t, text, len, add, parse, &ids, &n);
    if (st) {
        fprintf(stderr, "cinfer tokenize: %s\n", cinfer_status_str(st));
        cinfer_tokenizer_free(t);
        free(buf);
        return 1;
    }
    if (json) {
        printf("{\"ids\": [");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("], \"pieces\": [");
        for (int i = 0; i < n; i++) {
            if (i) printf(", ");
            json_str(stdout, cinfer_token_piece(t, ids[i]) ? cinfer_token_piece(t, ids[i]) : "");
        }
        printf("]}\n");
    } else if (ids_only) {
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
    } else {
        for (int i = 0; i < n; i++) {
            printf("%8d  ", ids[i]);
            json_str(stdout, cinfer_token_piece(t, ids[i]) ? cinfer_token_piece(t, ids[i]) : "");
            printf("\n");
        }
        printf("%d tokens\n", n);
    }
    free(ids);
    cinfer_tokenizer_free(t);
    free(buf);
    return 0;
}

static const char *detokenize_help =
    "usage: cinfer detokenize -m DIR [options] ID... | -\n"
    "Decodes token ids (arguments, or whitespace/comma-separated on standard input\n"
    "with \"-\") to text with DIR's tokenizer decoder and prints it.\n"
    "  -m, --model DIR     model directory, or a directory with only tokenizer files\n"
    "  --skip-special      drop special tokens (BOS, EOS, <|im_start|>, ...)\n"
    "  -n                  no newline after the text\n";

static int parse_id(const char *s, int32_t *out) {
    char *e;
    long v = strtol(s, &e, 10);
    if (!*s || *e || v < 0 || v > 0x7fffffff) return 0;
    *out = (int32_t)v;
    return 1;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL;
    int skip = 0, nl = 1, from_stdin = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(argc + 1));
    int n = 0;
    if (!ids) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(detokenize_help, stdout); free(ids); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (++i >= argc) { free(ids); return missing_value("detokenize", a); } dir = argv[i]; }
        else if (!strcmp(a, "--skip-special")) skip = 1;
        else if (!strcmp(a, "-n")) nl = 0;
        else if (!strcmp(a, "-")) from_stdin = 1;
        else if (!parse_id(a, &ids[n])) {
            fprintf(stderr, "cinfer detokenize: '%s' is not a token id or option\n%s", a, detokenize_help);
            free(ids);
            return 2;
        } else n++;
    }
    if (!dir) { fprintf(stderr, "cinfer detokenize: -m DIR is required\n%s", detokenize_help); free(ids); return 2; }
    if (from_stdin) {
        size_t len;
        const char *why;
        char *buf = cli_read_file("-", &len, &why);
        if (!buf) { fprintf(stderr, "cinfer detokenize: cannot read standard input: %s\n", why); free(ids); return 1; }
        size_t cap = (size_t)n + len / 2 + 1;
        int32_t *more = realloc(ids, cap * sizeof *more);
        if (!more) { free(buf); free(ids); return 1; }
        ids = more;
        for (char *tok = strtok(buf, " \t\r\n,[]"); tok; tok = strtok(NULL, " \t\r\n,[]")) {
            if (!parse_id(tok, &ids[n])) {
                fprintf(stderr, "cinfer detokenize: '%s' on standard input is not a token id\n", tok);
                free(buf); free(ids);
                return 2;
            }
            n++;
        }
        free(buf);
    }
    cinfer_tokenizer *t = load_tok("detokenize", dir);
    if (!t) { free(ids); return 1; }
    int nv = cinfer_tokenizer_n_vocab(t);
    for (int i = 0; i < n; i++)
        if (ids[i] >= nv) {
            fprintf(stderr, "cinfer detokenize: id %d is out of range (vocabulary has %d ids)\n", ids[i], nv);
            cinfer_tokenizer_free(t);
            free(ids);
            return 1;
        }
    char *text = NULL;
    cinfer_status st = cinfer_detokenize(t, ids, n, skip, &text);
    if (st) fprintf(stderr, "cinfer detokenize: %s\n", cinfer_status_str(st));
    else {
        fputs(text, stdout);
        if (nl) fputc('\n', stdout);
    }
    free(text);
    cinfer_tokenizer_free(t);
    free(ids);
    return st ? 1 : 0;
}

static const char *template_help =
    "usage: cinfer template -m DIR --messages FILE [options]\n"
    "Renders DIR's chat template (tokenizer_config.json) and prints the prompt exactly.\n"
    "  -m, --model DIR          model directory, or a directory with only tokenizer files\n"
    "  --messages FILE          JSON array of {\"role\", \"content\", ...} (\"-\": standard input)\n"
    "  --add-generation-prompt  end with the assistant turn's opening\n"
    "  --tools FILE             JSON array of tool definitions\n"
    "  --kwargs JSON            extra template variables, e.g. '{\"enable_thinking\": false}'\n"
    "  --tokenize               print the prompt's token ids instead (no BOS/EOS added)\n";

int cmd_template(int argc, char **argv) {
    const char *dir = NULL, *msgs = NULL, *tools = NULL, *kwargs = NULL;
    int agp = 0, tokenize = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(template_help, stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (++i >= argc) return missing_value("template", a); dir = argv[i]; }
        else if (!strcmp(a, "--messages")) { if (++i >= argc) return missing_value("template", a); msgs = argv[i]; }
        else if (!strcmp(a, "--tools")) { if (++i >= argc) return missing_value("template", a); tools = argv[i]; }
        else if (!strcmp(a, "--kwargs")) { if (++i >= argc) return missing_value("template", a); kwargs = argv[i]; }
        else if (!strcmp(a, "--add-generation-prompt")) agp = 1;
        else if (!strcmp(a, "--tokenize")) tokenize = 1;
        else { fprintf(stderr, "cinfer template: unknown argument '%s'\n%s", a, template_help); return 2; }
    }
    if (!dir || !msgs) { fprintf(stderr, "cinfer template: -m DIR and --messages FILE are required\n%s", template_help); return 2; }
    const char *why;
    char *mj = cli_read_file(msgs, NULL, &why), *tj = NULL;
    if (!mj) { fprintf(stderr, "cinfer template: cannot read %s: %s\n", msgs, why); return 1; }
    if (tools && !(tj = cli_read_file(tools, NULL, &why))) {
        fprintf(stderr, "cinfer template: cannot read %s: %s\n", tools, why);
        free(mj);
        return 1;
    }
    cinfer_tokenizer *t = load_tok("template", dir);
    if (!t) { free(mj); free(tj); return 1; }
    char err[1024] = "", *out = NULL;
    cinfer_status st = cinfer_chat_render(t, mj, tj, kwargs, agp, &out, err, sizeof err);
    if (st) fprintf(stderr, "cinfer template: %s\n", err[0] ? err : cinfer_status_str(st));
    else if (tokenize) {
        int32_t *ids = NULL;
        int n = 0;
        st = cinfer_tokenize(t, out, strlen(out), 0, 1, &ids, &n);
        if (st) fprintf(stderr, "cinfer template: %s\n", cinfer_status_str(st));
        for (int i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        if (!st) printf("\n");
        free(ids);
    } else fputs(out, stdout);
    free(out);
    cinfer_tokenizer_free(t);
    free(mj);
    free(tj);
    return st ? 1 : 0;
}
