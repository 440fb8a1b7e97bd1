/*
 * blas-shim.c — a plain-C stand-in for the three OpenBLAS entry points the
 * CPU backend calls (cblas_sgemm, openblas_set/get_num_threads), linked only
 * into the GPU test and benchmark binaries (tests/gpu/build.sh): the GPU
 * machine has no OpenBLAS, and the CPU backend there only serves as the
 * reference for tiny models. Row-major or column-major, any transposes;
 * accumulates in double. Not for speed.
 */
#include <cblas.h>

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb, const blasint M,
                 const blasint N, const blasint K, const float alpha, const float *A, const blasint lda, const float *B,
                 const blasint ldb, const float beta, float *C, const blasint ldc) {
    for (blasint i = 0; i < M; i++)
        for (blasint j = 0; j < N; j++) {
            double s = 0;
            for (blasint k = 0; k < K; k++) {
                float a, b;
                if (order == CblasRowMajor) {
                    a = ta == CblasNoTrans ? A[(long)i * lda + k] : A[(long)k * lda + i];
                    b = tb == CblasNoTrans ? B[(long)k * ldb + j] : B[(long)j * ldb + k];
                } else {
                    a = ta == CblasNoTrans ? A[(long)k * lda + i] : A[(long)i * lda + k];
                    b = tb == CblasNoTrans ? B[(long)j * ldb + k] : B[(long)k * ldb + j];
                }
                s += (double)a * b;
            }
            float *c = order == CblasRowMajor ? &C[(long)i * ldc + j] : &C[(long)j * ldc + i];
            *c = (float)(alpha * s + (beta != 0.0f ? beta * *c : 0.0));
        }
}

void openblas_set_num_threads(int n) { (void)n; }
int openblas_get_num_threads(void) { return 1; }
