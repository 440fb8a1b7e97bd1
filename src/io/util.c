/*
 * util.c — implementation of util.h: errors, checked sizes, whole-file reads,
 * paths, atomic-write targets, clocks and the process's peak resident set.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include "util.h"

cinfer_status cf_err(char *err, size_t n, cinfer_status s, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return s;
}

int cf_mul_ok(size_t a, size_t b, size_t *out) {
    if (a && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

cinfer_status cf_read_file(const char *path, char **out, size_t *len, char *err, size_t n) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return cf_err(err, n, CINFER_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return cf_err(err, n, CINFER_EIO, "%s: not a regular file", path);
    }
    size_t sz = (size_t)st.st_size;
    char *buf = malloc(sz + 1);
    if (!buf) { fclose(f); return cf_err(err, n, CINFER_ENOMEM, "%s: out of memory (%zu bytes)", path, sz); }
    size_t got = fread(buf, 1, sz, f);
    fclose(f);
    if (got != sz) { free(buf); return cf_err(err, n, CINFER_EIO, "%s: short read", path); }
    buf[sz] = 0;
    *out = buf;
    if (len) *len = sz;
    return CINFER_OK;
}

char *cf_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int cf_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

cinfer_status cf_write_target(const char *path, char **target, char *err, size_t n) {
    struct stat st;
    *target = NULL;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT) return cf_err(err, n, CINFER_EIO, "%s: %s", path, strerror(errno));
        *target = strdup(path);
    } else if (S_ISLNK(st.st_mode)) {
        char *real = realpath(path, NULL);
        if (!real || stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(real);
            return cf_err(err, n, CINFER_EIO, "%s: not a regular file (a link to a missing or special file); cinfer writes only regular files", path);
        }
        *target = real;
    } else if (!S_ISREG(st.st_mode)) {
        return cf_err(err, n, CINFER_EIO, "%s: not a regular file (a device, FIFO, socket or directory); cinfer writes only regular files", path);
    } else {
        *target = strdup(path);
    }
    return *target ? CINFER_OK : cf_err(err, n, CINFER_ENOMEM, "out of memory");
}

int cf_rename_durable(const char *tmp, const char *target) {
    if (rename(tmp, target) != 0) return -1;
    const char *slash = strrchr(target, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - target) + 1 : 1, slash ? target : ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }   /* best effort: some filesystems refuse it */
    return 0;
}

double cf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t cf_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024;
}
