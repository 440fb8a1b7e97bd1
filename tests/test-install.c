/*
 * test-install.c — the library as a user installs it: `make install
 * PREFIX=<temp>` from this test's build folder, then a small program built
 * through pkg-config against the shared library (cinfer.pc) and against the
 * static one (cinfer-static.pc) loads the shipped model and predicts ','
 * after "Once upon a time" (transformers' top token, id 432). The shared
 * library has SONAME libcinfer.so.0 and exports only cinfer_* symbols.
 */
#include <limits.h>
#include "check.h"
#include "cli-run.h"

static const char *prog =
    "#include <cinfer.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
    "int main(int argc, char **argv) {\n"
    "    cinfer_model *m; cinfer_ctx *c; char err[512]; float lg[512];\n"
    "    int32_t ids[] = {1, 403, 407, 261, 378};\n"
    "    if (argc < 2 || cinfer_model_load(argv[1], NULL, &m, err, sizeof err)) { puts(err); return 1; }\n"
    "    if (cinfer_ctx_new(m, NULL, &c, err, sizeof err) || cinfer_eval(c, ids, 5, 0, lg)) return 1;\n"
    "    int best = 0;\n"
    "    for (int i = 1; i < 512; i++) if (lg[i] > lg[best]) best = i;\n"
    "    printf(\"%d %s\\n\", best, cinfer_version());\n"
    "    cinfer_ctx_free(c); cinfer_model_free(m);\n"
    "    return 0;\n}\n";

/* runs a shell command, its output (first line) into out */
static int sh(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

int main(int argc, char **argv) {
    (void)argc;
    if (!cli_setup(argv[0])) return 1;
    char build[PATH_MAX], cwd[PATH_MAX], cmd[8192], out[8192];
    snprintf(build, sizeof build, "%s", cli);
    *strrchr(build, '/') = 0;   /* cli is BUILD/tests/../cinfer */
    if (!getcwd(cwd, sizeof cwd)) return 1;
#if defined(__SANITIZE_ADDRESS__)
    const char *san = "SAN=1", *cflags = "-fsanitize=address,undefined";
#else
    const char *san = "", *cflags = "";
#endif
#ifdef CINFER_CUDA
    const char *cuda = "CUDA=1";   /* the configuration this build was made with: install rebuilds nothing */
#else
    const char *cuda = "CUDA=0";
#endif
    snprintf(cmd, sizeof cmd, "make -s install BUILD=%s %s %s PREFIX=%s/prefix > %s/make.log 2>&1", build, san, cuda, cli_tmp, cli_tmp);
    int rc = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/prefix/lib/libcinfer.so.0", cli_tmp);
    CHECK(rc == 0 && access(cmd, F_OK) == 0, "make install PREFIX=<temp> installs libcinfer.so.0 (rc %d)", rc);
    snprintf(cmd, sizeof cmd, "readelf -d %s/prefix/lib/libcinfer.so | grep SONAME", cli_tmp);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "[libcinfer.so.0]"), "SONAME libcinfer.so.0: %s", out);
    snprintf(cmd, sizeof cmd, "nm -D --defined-only %s/prefix/lib/libcinfer.so | awk '{print $3}' | grep -v '^cinfer_' | wc -l", cli_tmp);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0 && atoi(out) == 0, "only cinfer_* symbols are exported (%d others)", atoi(out));
    snprintf(cmd, sizeof cmd, "%s/prog.c", cli_tmp);
    FILE *f = fopen(cmd, "w");
    if (f) { fputs(prog, f); fclose(f); }
    const char *pcs[2] = {"cinfer", "cinfer-static"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "cd %s && export PKG_CONFIG_PATH=%s/prefix/lib/pkgconfig && cc %s prog.c $(pkg-config --cflags --libs %s) -o prog%d "
                 "> build%d.log 2>&1 && LD_LIBRARY_PATH=%s/prefix/lib ./prog%d %s/models/stories260k",
                 cli_tmp, cli_tmp, cflags, pcs[i], i, i, cli_tmp, i, cwd);
        rc = sh(cmd, out, sizeof out);
        CHECK(rc == 0 && !strncmp(out, "432 ", 4), "a program built with pkg-config %s predicts ',' (432): %s", pcs[i], out);
    }
    cli_cleanup();
    return CHECK_DONE();
}
