/*
 * cli-run.h — runs the `cinfer` binary of the test's own build folder
 * (argv[0]'s ../cinfer) with stdout and stderr captured, for the tests of
 * the commands (test-score-cli.c, test-cli-text.c, test-cli.c,
 * test-cli-guards.c, test-install.c). run() captures both streams in files;
 * sh_run() runs ARGS through the shell as written (so "> /dev/full" or
 * "< file" in ARGS act on cinfer itself), stdout through a pipe and stderr
 * kept for run_err(), with a temp folder cli_tmp for the test's files.
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

static char cli_tmp[64];

/* cli_find and a fresh temp folder cli_tmp; 0 on failure */
static inline int cli_setup(const char *argv0) {
    snprintf(cli_tmp, sizeof cli_tmp, "/tmp/cinfer-cli-XXXXXX");
    return cli_find(argv0) && mkdtemp(cli_tmp) != NULL;
}

/* `cinfer ARGS` through the shell: stdout -> out[cap], stderr -> cli_tmp/err */
static inline int sh_run(const char *args, char *out, size_t cap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>%s/err", cli, args, cli_tmp);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    while (fgetc(p) != EOF) {}
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* the stderr of the last sh_run() (static buffer) */
static inline const char *run_err(void) {
    static char e[1 << 16];
    char p[128];
    snprintf(p, sizeof p, "%s/err", cli_tmp);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(e, 1, sizeof e - 1, f) : 0;
    e[n] = 0;
    if (f) fclose(f);
    return e;
}

static inline void cli_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cli_tmp);
    if (system(cmd)) printf("# could not remove %s\n", cli_tmp);
}
#endif
