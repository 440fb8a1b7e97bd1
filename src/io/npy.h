/*
 * npy.h — NumPy .npy v1.0 files of float32 ('<f4', C order): the format
 * `logits --npy` writes and the golden tests read. The reader is strict:
 * magic, version, dtype, order, shape and the data size must all agree.
 * Reference: numpy/lib/format.py.
 */
#ifndef CINFER_NPY_H
#define CINFER_NPY_H
#include <stddef.h>
#include <stdint.h>
#include "cinfer.h"

#define NPY_MAX_DIMS 4
cinfer_status npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err, size_t n);
/* *data malloc'd; shape[NPY_MAX_DIMS] */
cinfer_status npy_read_f32(const char *path, float **data, int *ndim, int64_t *shape, char *err, size_t n);
/* the same for uint32 ('<u4') arrays (MLX's packed codes) */
cinfer_status npy_read_u32(const char *path, uint32_t **data, int *ndim, int64_t *shape, char *err, size_t n);
#endif
