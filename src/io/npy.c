/*
 * npy.c — see npy.h. Writes through a temporary file, synced and renamed into
 * place, so a failed write never leaves a half file under the requested name;
 * only a regular file (or nothing) is replaced, never a device or FIFO.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "io/npy.h"
#include "util.h"

cinfer_status npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err, size_t n) {
    if (ndim < 1 || ndim > NPY_MAX_DIMS) return cf_err(err, n, CINFER_EINVAL, "%s: %d dims not supported", path, ndim);
    char hdr[256], dims[160] = "";
    size_t count = 1;
    for (int i = 0, k = 0; i < ndim; i++) {
        k += snprintf(dims + k, sizeof dims - k, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
        count *= (size_t)shape[i];
    }
    if (ndim > 1) dims[strlen(dims) - 1] = 0;   /* (a, b) rather than (a, b,) */
    int h = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    int total = 10 + h + 1, pad = (64 - total % 64) % 64;
    char *target = NULL;
    cinfer_status st = cf_write_target(path, &target, err, n);
    if (st) return st;
    size_t plen = strlen(target);
    char *tmp = malloc(plen + 8);
    if (!tmp) { free(target); return cf_err(err, n, CINFER_ENOMEM, "out of memory"); }
    snprintf(tmp, plen + 8, "%s.tmp", target);
    FILE *f = fopen(tmp, "wb");
    if (!f) { free(tmp); free(target); return cf_err(err, n, CINFER_EIO, "%s: cannot create: %s", path, strerror(errno)); }
    uint16_t hl = (uint16_t)(h + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)h, f) == (size_t)h;
    for (int i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && fwrite(data, sizeof(float), count, f) == count;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;   /* on disk before the name points at it */
    ok = (fclose(f) == 0) && ok;
    if (!ok || cf_rename_durable(tmp, target) != 0) {
        st = cf_err(err, n, CINFER_EIO, "%s: write failed: %s", path, strerror(errno));
        remove(tmp);
    }
    free(tmp);
    free(target);
    return st;
}

/* a 4-byte element array of dtype descr ("<f4", "<u4") */
static cinfer_status read4(const char *path, const char *descr, void **data, int *ndim, int64_t *shape, char *err, size_t n) {
    *data = NULL;
    char *buf;
    size_t len;
    cinfer_status st = cf_read_file(path, &buf, &len, err, n);
    if (st) return st;
    st = cf_err(err, n, CINFER_EFORMAT, "%s: not a %s C-order .npy v1 file", path, descr[1] == 'f' ? "float32" : "uint32");
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) || buf[6] != 1) goto out;
    size_t hl = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8);
    if (10 + hl > len) goto out;
    char *hdr = strndup(buf + 10, hl);
    if (!hdr) goto out;
    char *sh = strstr(hdr, "'shape': (");
    char want[24];
    snprintf(want, sizeof want, "'descr': '%s'", descr);
    if (strstr(hdr, want) && strstr(hdr, "'fortran_order': False") && sh) {
        char *p = sh + 10;
        int nd = 0;
        size_t count = 1;
        while (*p && *p != ')' && nd < NPY_MAX_DIMS) {
            char *e;
            long long v = strtoll(p, &e, 10);
            if (e == p || v < 0) break;
            shape[nd++] = v;
            if (!cf_mul_ok(count, (size_t)v, &count)) break;
            p = e;
            while (*p == ',' || *p == ' ') p++;
        }
        if (*p == ')' && nd > 0 && count <= (len - 10 - hl) / 4 && count * 4 == len - 10 - hl) {
            *data = malloc(count * sizeof(float) + 1);
            if (*data) {
                memcpy(*data, buf + 10 + hl, count * sizeof(float));
                *ndim = nd;
                st = CINFER_OK;
            }
        }
    }
    free(hdr);
out:
    free(buf);
    return st;
}

cinfer_status npy_read_f32(const char *path, float **data, int *ndim, int64_t *shape, char *err, size_t n) {
    void *d;
    cinfer_status st = read4(path, "<f4", &d, ndim, shape, err, n);
    *data = d;
    return st;
}

cinfer_status npy_read_u32(const char *path, uint32_t **data, int *ndim, int64_t *shape, char *err, size_t n) {
    void *d;
    cinfer_status st = read4(path, "<u4", &d, ndim, shape, err, n);
    *data = d;
    return st;
}
