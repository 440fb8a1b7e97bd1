/*
 * check.h — the tiny harness every tests/test-*.c uses. Each CHECK prints one
 * "PASS name" or "FAIL name: why" line; tests/run.sh counts them. A test
 * binary exits non-zero when any check failed.
 */
#ifndef CINFER_CHECK_H
#define CINFER_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static int check_failed_ = 0, check_passed_ = 0;

#define CHECK(cond, ...) do { \
    if (cond) { check_passed_++; printf("PASS "); printf(__VA_ARGS__); printf("\n"); } \
    else { check_failed_++; printf("FAIL "); printf(__VA_ARGS__); \
           printf("  [%s:%d: %s]\n", __FILE__, __LINE__, #cond); } \
    fflush(stdout); } while (0)

#define CHECK_DONE() (printf("# %d passed, %d failed\n", check_passed_, check_failed_), \
                      check_failed_ ? 1 : 0)

/* the backend-generic tests (test-backend-ops, test-cache, test-seq) run on CUDA when
 * CINFER_TEST_DEVICE=cuda (tests/gpu/run.sh on the GPU machine), on the CPU otherwise */
static inline int test_on_cuda(void) {
    const char *d = getenv("CINFER_TEST_DEVICE");
    return d && !strcmp(d, "cuda");
}

/* ../shared next to the checkout, or $CINFER_SHARED. Missing, it is one FAIL
 * line that names it (never a silent skip); the default model ships in the
 * repository as models/stories260k and needs no ../shared. */
static inline const char *shared_dir(void) {
    static int told = 0;
    const char *s = getenv("CINFER_SHARED");
    s = s ? s : "../shared";
    FILE *f;
    char p[1024];
    snprintf(p, sizeof p, "%s/README.md", s);
    if (!told && !(f = fopen(p, "r"))) {
        told = 1;
        check_failed_++;
        printf("FAIL the shared test assets are missing: %s/README.md not found (put ../shared beside the "
               "checkout or set CINFER_SHARED=DIR)\n", s);
    } else if (!told) {
        told = 1;
        fclose(f);
    }
    return s;
}
#endif
