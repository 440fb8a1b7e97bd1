/*
 * model-copy.h — test models made from the shipped models/stories260k: a
 * copy in a temp folder with one config.json key changed, or with NaN
 * written over one tensor (model.norm.weight) of its safetensors file.
 */
#ifndef CINFER_MODEL_COPY_H
#define CINFER_MODEL_COPY_H
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SHIPPED_MODEL "models/stories260k"

/* copies the model into parent/name (dir[n] gets the path); config.json's
 * `key` (may be NULL) is set to the JSON text `val` */
static inline void copy_model(const char *parent, const char *name, const char *key, const char *val, char *dir, size_t n) {
    char cmd[1024];
    snprintf(dir, n, "%s/%s", parent, name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp " SHIPPED_MODEL "/*.json " SHIPPED_MODEL "/model.safetensors %s/ && chmod -R u+w %s",
             dir, dir, dir);
    if (system(cmd)) printf("# copy to %s failed\n", dir);
    if (!key) return;
    snprintf(cmd, sizeof cmd, "%s/config.json", dir);
    json_t *c = json_load_file(cmd, 0, NULL), *v = json_loads(val, JSON_DECODE_ANY, NULL);
    if (c && v) json_object_set_new(c, key, v);
    if (c) json_dump_file(c, cmd, 0);
    json_decref(c);
}

/* a copy whose model.norm.weight is all NaN; 1 when written */
static inline int copy_model_nan(const char *parent, const char *name, char *dir, size_t n) {
    char path[1100];
    copy_model(parent, name, NULL, NULL, dir, n);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_RDWR), ok = 0;
    uint64_t hl = 0;
    if (fd >= 0 && pread(fd, &hl, 8, 0) == 8 && hl < 1 << 20) {
        char *h = calloc(1, hl + 1);
        json_t *j = h && pread(fd, h, hl, 8) == (ssize_t)hl ? json_loads(h, 0, NULL) : NULL;
        json_t *off = json_object_get(json_object_get(j, "model.norm.weight"), "data_offsets");
        if (off) {
            long a = (long)json_integer_value(json_array_get(off, 0)), b = (long)json_integer_value(json_array_get(off, 1));
            float nan = NAN;
            ok = 1;
            for (long p = a; p < b; p += 4) ok &= pwrite(fd, &nan, 4, (off_t)(8 + hl + p)) == 4;
        }
        json_decref(j);
        free(h);
    }
    if (fd >= 0) close(fd);
    return ok;
}
#endif
