/*
 * atomic.c — durable whole-file writes: the bytes go to a temporary file in
 * the destination's directory (".tmp.<pid>.<n>.<name>", so a crashed
 * writer's leftovers can be recognised by their pid), which is fsynced,
 * renamed over the destination and the directory fsynced. A reader sees the
 * old file or the new one, never a mix; after a crash, at worst a temporary.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <string.h>
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

cinfer_status cf_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return CINFER_EIO;
    int r = fsync(fd);
    close(fd);
    return r ? CINFER_EIO : CINFER_OK;
}

cinfer_status cf_write_atomic(const char *path, const void *buf, size_t len, char *err, size_t n) {
    unsigned rnd = 0;   /* tells apart two threads of one process writing one path */
    if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd) rnd = (unsigned)(cf_now() * 1e9);
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0;
    char *dir = malloc(dl + 2), *tmp = malloc(strlen(path) + 64);
    if (!dir || !tmp) { free(dir); free(tmp); return cf_err(err, n, CINFER_ENOMEM, "out of memory"); }
    if (slash) { memcpy(dir, path, dl ? dl : 1); dir[dl ? dl : 1] = 0; }
    else strcpy(dir, ".");
    snprintf(tmp, strlen(path) + 64, "%.*s%s.tmp.%ld.%u.%s", (int)dl, path, slash ? "/" : "", (long)getpid(),
             rnd, slash ? slash + 1 : path);
    cinfer_status st = CINFER_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) st = cf_err(err, n, CINFER_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    else {
        if (write_all(fd, buf, len) || fsync(fd)) st = cf_err(err, n, CINFER_EIO, "%s: write failed: %s", tmp, strerror(errno));
        if (close(fd) && !st) st = cf_err(err, n, CINFER_EIO, "%s: close failed: %s", tmp, strerror(errno));
        if (!st && rename(tmp, path)) st = cf_err(err, n, CINFER_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
        if (st) unlink(tmp);
        else if (cf_fsync_dir(dir)) st = cf_err(err, n, CINFER_EIO, "%s: cannot fsync the directory", dir);
    }
    free(dir);
    free(tmp);
    return st;
}
