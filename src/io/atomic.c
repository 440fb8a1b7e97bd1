/*
 * atomic.c — durable whole-file writes: the bytes go to a temporary file
 * beside the destination (".tmp.<pid>.<n>.<name>", so a crashed writer's
 * leftovers can be recognised by their pid), which is fsynced, renamed over
 * the destination and the directory fsynced (cf_write_target and
 * cf_rename_durable of util.c). A reader sees the old file or the new one,
 * never a mix; after a crash, at worst a temporary.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include "util.h"

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

cinfer_status cf_write_atomic(const char *path, const void *buf, size_t len, char *err, size_t n) {
    char *target = NULL;
    cinfer_status st = cf_write_target(path, &target, err, n);
    if (st) return st;
    unsigned rnd = 0;   /* tells apart two threads of one process writing one path */
    if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd) rnd = (unsigned)(cf_now() * 1e9);
    const char *slash = strrchr(target, '/');
    size_t dl = slash ? (size_t)(slash - target) + 1 : 0, tl = strlen(target) + 64;
    char *tmp = malloc(tl);
    if (!tmp) { free(target); return cf_err(err, n, CINFER_ENOMEM, "out of memory"); }
    snprintf(tmp, tl, "%.*s.tmp.%ld.%u.%s", (int)dl, target, (long)getpid(), rnd, target + dl);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) st = cf_err(err, n, CINFER_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    else {
        if (write_all(fd, buf, len) || fsync(fd)) st = cf_err(err, n, CINFER_EIO, "%s: write failed: %s", tmp, strerror(errno));
        if (close(fd) && !st) st = cf_err(err, n, CINFER_EIO, "%s: close failed: %s", tmp, strerror(errno));
        if (!st && cf_rename_durable(tmp, target)) st = cf_err(err, n, CINFER_EIO, "%s: cannot rename into place: %s", target, strerror(errno));
        if (st) unlink(tmp);
    }
    free(tmp);
    free(target);
    return st;
}
