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
    char *metadata;           /* the last file's __metadata__ (string values only) as compact JSON, or NULL */
} st_set;

/* Opens dir/model.safetensors, or the shards of dir/model.safetensors.index.json. */
cinfer_status st_open_dir(const char *dir, st_set *s, char *err, size_t n);
/* Opens one file (appended to s). */
cinfer_status st_open_file(const char *path, st_set *s, char *err, size_t n);
/* Parses a safetensors image in memory (appended to s); buf stays the
 * caller's and must outlive s; name appears in messages. */
cinfer_status st_open_mem(const char *name, const void *buf, size_t len, st_set *s, char *err, size_t n);
void st_close(st_set *s);

/* One tensor to write. */
typedef struct st_wtensor {
    const char *name;
    const char *dtype;        /* header dtype: "F32", "BF16", ... */
    int ndim;
    const int64_t *shape;     /* [ndim] */
    const void *data;
    size_t nbytes;
} st_wtensor;
/* Serialises tensors (in the order given) and __metadata__ (a JSON object of
 * strings, NULL or "" for none; its keys keep their order) into a malloc'd
 * safetensors image *buf[*len]: u64 LE header length, the header padded with
 * spaces to a multiple of 8, then the data. */
cinfer_status st_write_mem(const st_wtensor *t, int n, const char *metadata_json, void **buf, size_t *len,
                           char *err, size_t n_err);
const st_tensor *st_find(const st_set *s, const char *name);
/* element size of a header dtype, 0 when unknown */
size_t st_dtype_size(const char *dtype);
#endif
