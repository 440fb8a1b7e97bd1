/*
 * main.c — entry point of the `cinfer` CLI: dispatches to one subcommand.
 * The only place in the tree that exits the process.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "cli.h"

static const cli_cmd commands[] = {
    {"generate", cmd_generate, "generate text after a prompt (streams; --json for one object)"},
    {"logits", cmd_logits, "print top-k logits per position, or write them as .npy"},
    {"tokenize", cmd_tokenize, "text -> token ids and pieces"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"template", cmd_template, "render the model's chat template"},
    {"chat", cmd_chat, "interactive chat through the chat template"},
    {"perplexity", cmd_perplexity, "perplexity of a model on a data file (mlx_lm.perplexity)"},
    {"kl", cmd_kl, "KL divergence of a model against a base model (llama.cpp's report)"},
    {"cache-prompt", cmd_cache_prompt, "prefill a prompt and save an mlx-lm prompt-cache file"},
    {"convert", cmd_convert, "quantize / dequantize / cast a model like mlx_lm.convert (MLX affine format)"},
    {"logprobs", cmd_logprobs, "summed log-probs of responses given prompts (DPO pairs: margin)"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (continuous batching, prefix reuse)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: cinfer COMMAND [options]   (cinfer COMMAND --help for its flags; cinfer --version)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

/* a command's output is only as good as its last write: a full disk or a
 * closed pipe is exit 1 with a message, never a silent truncation */
static int finish_stdout(const char *cmd, int rc) {
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int err = errno;
    if (fclose(stdout) != 0 && !bad) { bad = 1; err = errno; }
    if (!bad) return rc;
    fprintf(stderr, "cinfer %s: writing the output failed: %s\n", cmd, strerror(err ? err : EIO));
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish_stdout("help", 0);
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("cinfer %s\n", cinfer_version());
        return finish_stdout("version", 0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return finish_stdout(argv[1], commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "cinfer: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
