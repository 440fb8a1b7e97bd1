/*
 * cli-run.h — runs the `cinfer` binary of the test's own build folder
 * (argv[0]'s ../cinfer) with stdout and stderr captured, for the tests of
 * the commands (test-score-cli.c, test-cli-text.c).
 */
#ifndef CINFER_CLI_RUN_H
#define CINFER_CLI_RUN_H
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char cli[512];

/* sets cli from argv[0]; 0 when the binary is missing */
static inline int cli_find(const char *argv0) {
    char self[512];
    snprintf(self, sizeof self, "%s", argv0);
    snprintf(cli, sizeof cli, "%s/../cinfer", dirname(self));
    return access(cli, X_OK) == 0;
}

/* runs `cinfer ARGS`, stdout into out[cap], stderr into er[cap]; returns the exit status (-1: killed) */
static inline int run(const char *args, char *out, char *er, size_t cap) {
    char cmd[4096], fo[64], fe[64];
    snprintf(fo, sizeof fo, "/tmp/cinfer-cli-%d.out", (int)getpid());
    snprintf(fe, sizeof fe, "/tmp/cinfer-cli-%d.err", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", cli, args, fo, fe);
    int st = system(cmd);
    const char *files[2] = {fo, fe};
    char *bufs[2] = {out, er};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "r");
        size_t n = f ? fread(bufs[i], 1, cap - 1, f) : 0;
        bufs[i][n] = 0;
        if (f) fclose(f);
        unlink(files[i]);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#endif
