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

/* shared helpers (cli-util.c) */
/* parses an int/float flag value; prints "cinfer CMD: bad value for FLAG" */
int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out);
int cli_float(const char *cmd, const char *flag, const char *v, float *out);
/* "1,2,3" -> malloc'd ids[n]; 0 (and *ids NULL) when empty or malformed */
int cli_parse_ids(const char *s, int32_t **ids, int *n);
/* reads a whole file ("-" = stdin) into a NUL-terminated buffer */
char *cli_read_file(const char *path, size_t *len);
/* loads a model dir, printing the error; NULL on failure */
cinfer_model *cli_load_model(const char *cmd, const char *dir, const char *device, int n_threads);
#endif
