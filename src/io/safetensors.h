/*
 * safetensors.h — memory-mapped safetensors files and sharded sets.
 *
 * A set is one model.safetensors or the shards named by
 * model.safetensors.index.json. Every file is mmap'd read-only; tensors point
 * into the maps. The header is hostile input: its length, every dtype, shape
 * and offset pair is checked against the file before any tensor is exposed.
 * A tensor whose bytes are not aligned to its element size in the file (a
 * header length that is not a multiple of 8) is copied once into an aligned
 * buffer, so kernels may always load elements directly.
 * Reference: https://github.com/huggingface/safetensors (format section).
 */
#ifndef CINFER_SAFETENSORS_H
#define CINFER_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "cinfer.h"

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    char *name;
    char dtype[8];            /* as in the header: "F32", "BF16", "U32", ... */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;         /* into the file's map */
    size_t nbytes;
    int file;                 /* index into st_set.paths */
    void *owned;              /* aligned copy when the file's data was misaligned, else NULL */
} st_tensor;

typedef struct st_set {
    int n_files;
    char **paths;             /* [n_files] */
    void **maps;              /* [n_files] */
    size_t *map_len;          /* [n_files] */
    int n;                    /* tensors */
    st_tensor *t;             /* [n], sorted by name */
    size_t total_bytes;
} st_set;

/* Opens dir/model.safetensors, or the shards of dir/model.safetensors.index.json. */
cinfer_status st_open_dir(const char *dir, st_set *s, char *err, size_t n);
/* Opens one file (appended to s). */
cinfer_status st_open_file(const char *path, st_set *s, char *err, size_t n);
void st_close(st_set *s);
const st_tensor *st_find(const st_set *s, const char *name);
/* element size of a header dtype, 0 when unknown */
size_t st_dtype_size(const char *dtype);
#endif
