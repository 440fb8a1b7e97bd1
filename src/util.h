/*
 * util.h — small internal helpers shared by every module: error messages
 * into caller buffers, checked allocation sizes, file reading, timing.
 */
#ifndef CINFER_UTIL_H
#define CINFER_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "cinfer.h"

/* Invariants that stay on in release builds. */
#define CF_ASSERT(c) do { if (!(c)) { fprintf(stderr, "cinfer: internal invariant failed: %s (%s:%d)\n", \
                                     #c, __FILE__, __LINE__); abort(); } } while (0)

/* formats into err[n] (err may be NULL) and returns s */
cinfer_status cf_err(char *err, size_t n, cinfer_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* a*b with overflow check: returns 0 on overflow */
int cf_mul_ok(size_t a, size_t b, size_t *out);
/* reads a whole regular file into a NUL-terminated malloc'd buffer */
cinfer_status cf_read_file(const char *path, char **out, size_t *len, char *err, size_t n);
/* path join into a malloc'd string */
char *cf_path(const char *dir, const char *name);
int cf_file_exists(const char *path);
/* Where an atomic write (temporary file + rename) of `path` may land: a
 * regular file or nothing -> *target = malloc'd path (a symlink's target
 * resolved, so the link stays a link). A device, FIFO, directory or dangling
 * link is refused (EIO, "not a regular file"): renaming over it would replace
 * the special file itself. */
cinfer_status cf_write_target(const char *path, char **target, char *err, size_t n);
/* renames the (already fsync'd) tmp onto target and syncs the directory */
int cf_rename_durable(const char *tmp, const char *target);
/* writes buf to path durably: a temporary ".tmp.<pid>.<n>.<name>" beside the
 * target (cf_write_target), fsync, cf_rename_durable (atomic.c) */
cinfer_status cf_write_atomic(const char *path, const void *buf, size_t len, char *err, size_t n);
double cf_now(void);          /* monotonic seconds */
/* a speed feature on by default: the environment variable name=0 turns it off (for comparisons) */
static inline int cf_knob_on(const char *name) {
    const char *v = getenv(name);
    return !(v && v[0] == '0' && !v[1]);
}
size_t cf_peak_rss(void);     /* bytes */
#endif
