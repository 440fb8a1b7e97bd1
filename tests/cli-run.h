/*
 * cli-run.h — running the `cinfer` binary from a test as a user would: the
 * binary beside the test's build folder, stdout captured, stderr kept in a
 * file of the test's temporary folder, the exit status returned.
 */
#ifndef CINFER_CLI_RUN_H
#define CINFER_CLI_RUN_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char cli_bin[600], cli_tmp[64];

/* finds build/cinfer from argv[0] (build/tests/test-x) and makes a temp dir */
static inline int cli_setup(const char *argv0) {
    snprintf(cli_bin, sizeof cli_bin, "%s", argv0);
    char *s = strrchr(cli_bin, '/');
    if (s) *s = 0;
    strncat(cli_bin, "/../cinfer", sizeof cli_bin - strlen(cli_bin) - 1);
    snprintf(cli_tmp, sizeof cli_tmp, "/tmp/cinfer-cli-XXXXXX");
    return mkdtemp(cli_tmp) != NULL;
}

/* runs `cinfer ARGS` through the shell; stdout -> out[cap], stderr -> cli_tmp/err */
static inline int run(const char *args, char *out, size_t cap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s %s 2>%s/err", cli_bin, args, cli_tmp);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    while (fgetc(p) != EOF) {}
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* the stderr of the last run() (static buffer) */
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
