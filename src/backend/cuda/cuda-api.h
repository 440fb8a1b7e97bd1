/*
 * cuda-api.h — the C-callable extras of the CUDA backend beyond its op table
 * (be_cuda() in backend/backend.h): helpers for tests and benchmarks only.
 * Declared here so C programs need no CUDA headers. All return 0 on success.
 */
#ifndef CINFER_CUDA_API_H
#define CINFER_CUDA_API_H
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills n elements of device memory dev (dtype dt) with mean + std * u,
 * u uniform in [-sqrt(3), sqrt(3)) from a counter hash of (seed, index):
 * random-weight benchmarks write their weights on the device this way. */
int cuda_fill_random(void *dev, be_dtype dt, size_t n, uint64_t seed, float mean, float std);

/* Fills an uploaded MLX affine matrix (codes, scales, biases) with random codes and scales and
 * biases that make weights of mean ~0 and standard deviation ~std. */
int cuda_fill_random_affine(const be_mat *m, uint64_t seed, float std);

/* Graph statistics of a CUDA backend context: steps captured and replayed. */
void cuda_graph_stats(const be_ctx *c, long *captures, long *replays);

/* Replays the context's captured decode step reps times back to back (the
 * staged inputs as last written) and reports the device time of one replay:
 * a step without its host-side work. */
int cuda_graph_replay_time(be_ctx *c, int reps, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
