/*
 * cli.h — the cinfer command-line tool: one cmd_<name>() per subcommand, each
 * in its own file, dispatched from main.c. A command returns the process exit
 * status (0 ok, 1 runtime failure, 2 usage error) and never calls exit().
 */
#ifndef CINFER_CLI_H
#define CINFER_CLI_H
#include "cinfer.h"

typedef struct cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);  /* argv[0] is the command name */
    const char *summary;
} cli_cmd;

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_kl(int argc, char **argv);
int cmd_logprobs(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_cache_prompt(int argc, char **argv);
int cmd_convert(int argc, char **argv);

/* shared helpers (cli-util.c) */
/* parses an int/float flag value; prints "cinfer CMD: bad value for FLAG" */
int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out);
int cli_float(const char *cmd, const char *flag, const char *v, float *out);
/* "1,2,3" -> malloc'd ids[n]; 0 (and *ids NULL) when empty or malformed */
int cli_parse_ids(const char *s, int32_t **ids, int *n);
/* reads a whole file ("-" = stdin) into a NUL-terminated buffer; NULL and
 * *why (may be NULL) = the reason: "not a regular file", "too large", ... */
#define CLI_MAX_INPUT ((size_t)1 << 30)
char *cli_read_file(const char *path, size_t *len, const char **why);
/* checks argv before getopt: every option is known by its full name (no
 * "-ngl" read as -n gl) and has its value; prints one message naming the flag */
struct option;
int cli_check_args(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *lo);
/* cli_check_args, then getopt's state reset (optind 1, no getopt messages) */
int cli_getopt_begin(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *lo);
/* after getopt: a stray argument ("logits --tokens 1 2 3") is an error naming it */
int cli_no_more_args(const char *cmd, int argc, char **argv);
/* printf for JSON: a non-finite number (nan, inf) outside strings prints as null */
void cli_json_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* getopt's '?': names the argument */
void cli_bad_option(const char *cmd, char **argv, int opt);
/* The KV-cache flags of every command that runs a model: add CLI_KV_LONGOPTS
 * to the option table and CLI_KV_HELP to the help, and pass each option to
 * cli_kv_flag first: 1 = taken into *co, 0 = not a KV flag, -1 = bad value
 * (message printed). */
enum { KV_MEMORY = 0x200, KV_DTYPE, KV_MAX_SIZE, KV_PREFILL, KV_PAGE, KV_BITS, KV_GROUP, KV_QSTART, KV_CONFIG, KV_KERNELS, KV_ACT };
#define CLI_KV_LONGOPTS                                                                                      \
    {"kv-memory", 1, 0, KV_MEMORY}, {"kv-dtype", 1, 0, KV_DTYPE}, {"max-kv-size", 1, 0, KV_MAX_SIZE},       \
        {"prefill-step-size", 1, 0, KV_PREFILL}, {"kv-page", 1, 0, KV_PAGE}, {"kv-bits", 1, 0, KV_BITS},     \
        {"kv-group-size", 1, 0, KV_GROUP}, {"quantized-kv-start", 1, 0, KV_QSTART},                          \
        {"kv-config", 1, 0, KV_CONFIG}, {"kv-kernels", 1, 0, KV_KERNELS}, {"prefill-act", 1, 0, KV_ACT}
#define CLI_KV_HELP                                                                                          \
    "      --kv-memory SIZE       memory the KV cache may use, e.g. 4G, 512M (default: 75%% of what\n"       \
    "                             is available when the model starts)\n"                                     \
    "      --kv-dtype f32|f16|bf16  KV cache precision (default f32; --kv-f16 = f16)\n"                     \
    "      --max-kv-size N        keep the first 4 tokens and the most recent N-4 (mlx-lm's rotating\n"    \
    "                             cache): memory stays bounded and generation may pass the context\n"       \
    "      --prefill-step-size N  prompt tokens per forward when generating (default 2048)\n"               \
    "      --kv-page N            token slots per KV page, a power of two (default 128)\n"               \
    "      --kv-bits B            quantize the KV cache to B bits (2, 3, 4, 5, 6, 8; mlx-lm's\n"          \
    "                             QuantizedKVCache: MLX affine codes along head_dim; default off)\n"     \
    "      --kv-group-size G      values per scale and bias of the quantized cache (32, 64, 128;\n"      \
    "                             default 64)\n"                                                        \
    "      --quantized-kv-start N  generation: the cache converts once it holds N tokens (default\n"    \
    "                             5000 in generate/chat, 0 in serve); scoring quantizes from token 0\n" \
    "      --kv-config FILE       per-layer scheme instead of --kv-bits: a JSON list\n"                 \
    "                             [{\"layer_idx\": 0, \"bits\": 8, \"group_size\": 64}, ...]\n"     \
    "      --kv-kernels K         unfused (mlx-lm's quantized SDPA; default with --kv-bits),\n"         \
    "                             tiled-causal (default with --kv-config) or tiled\n"           \
    "      --prefill-act A        CPU: activations into the prompt/scoring matmuls: f32, bf16 or\n"  \
    "                             auto (default: bf16 for MLX-quantized weights where the CPU has\n"   \
    "                             AVX-512 BF16, on AMX tiles where it has them: 2-14x the f32 rate;\n" \
    "                             f32 otherwise; env CINFER_BF16_ACT=0|1)\n"
int cli_kv_flag(const char *cmd, int code, const char *v, cinfer_ctx_opts *co);
/* scoring commands: --kv-bits quantizes from token 0, so --quantized-kv-start is refused (0 + message);
 * a quantized cache turns on batch_invariant (results the same at every batch and chunk size) */
int cli_scoring_kv(const char *cmd, cinfer_ctx_opts *co);
/* "4G", "512M", "1.5GiB", "1000000" -> bytes; 0 on a malformed or absurd size */
int cli_size(const char *v, size_t *out);
/* loads a model dir, printing the error; NULL on failure */
cinfer_model *cli_load_model(const char *cmd, const char *dir, const char *device, int n_threads);

/* Cache state on disk (cmd-cache-prompt.c): --prompt-cache-file F (continue
 * from an mlx-lm prompt-cache file; the prompt is what follows it) and
 * --cache-dir DIR / --cache-dir-max-gb G (the persistent prefix tier). A
 * command adds CLI_CACHE_LONGOPTS and CLI_CACHE_HELP, passes options to
 * cli_cache_flag (as cli_kv_flag), then calls cli_cache_begin after creating
 * its context: it restores seq 0 and sets *skip to the prompt ids already in
 * the cache (feed ids + skip), and cli_cache_end after generating. */
enum { CACHE_FILE = 0x280, CACHE_DIR, CACHE_MAX_GB };
#define CLI_CACHE_LONGOPTS                                                                                   \
    {"prompt-cache-file", 1, 0, CACHE_FILE}, {"cache-dir", 1, 0, CACHE_DIR}, {"cache-dir-max-gb", 1, 0, CACHE_MAX_GB}
#define CLI_CACHE_HELP                                                                                       \
    "      --prompt-cache-file F  continue from an mlx-lm prompt-cache file (cinfer cache-prompt,\n"          \
    "                             mlx_lm.cache_prompt); the prompt is what follows the cached one\n"      \
    "      --cache-dir DIR        reuse and store prompt prefixes in DIR across runs\n"                    \
    "      --cache-dir-max-gb G   evict least recently used entries past G GB\n"
typedef struct cli_cache {
    const char *file, *dir;
    size_t max_bytes;
    int cached;          /* tokens taken from the file or the directory */
    int fed;             /* prompt tokens the tier step fed itself */
    double seconds;      /* time of that step */
    cinfer_tier *tier;
} cli_cache;
int cli_cache_flag(const char *cmd, int code, const char *v, cli_cache *cc);
/* mlx-lm's cut of a chat rendering at the user's text, given the same rendering with the text
 * "<query>": the part before the text's end (prefix: what cache-prompt caches) or from its start
 * (what generate feeds after a prompt-cache file); malloc'd, NULL (message printed) when the
 * template does not show the text */
char *cli_cache_cut(const char *cmd, const char *full, const char *test, int prefix);
int cli_cache_begin(const char *cmd, cli_cache *cc, cinfer_model *m, cinfer_ctx *c, const int32_t *ids, int n, int *skip);
/* opens cc->tier on cc->dir (once; its messages go to stderr as "cinfer CMD: ..."); 1 on failure (printed) */
int cli_tier_open(const char *cmd, cli_cache *cc, cinfer_model *m);
/* the tier flags alone, for commands with no prompt-cache file (logprobs); perplexity and kl take
 * them only to refuse them (score_cli_no_tier) */
#define CLI_TIER_LONGOPTS {"cache-dir", 1, 0, CACHE_DIR}, {"cache-dir-max-gb", 1, 0, CACHE_MAX_GB}
void cli_cache_end(cli_cache *cc, cinfer_gen_stats *s);
#endif
