/*
 * lt-sweep.cu — can cuBLASLt's algorithm choice beat the backend's cublasGemmEx on the skinny
 * GEMMs of batched decode? Measured, to decide whether src/backend/cuda/gemm.cu should autotune.
 *
 * y[n][m] = x[n][k] . w[m][k]^T, w and x bf16, y f32, f32 compute. "base" is the call gemm.cu
 * makes: column-major cublasGemmEx(OP_T, OP_N, m, n, k, ..., CUBLAS_GEMM_DEFAULT) with a 32 MiB
 * cublasSetWorkspace. "lt" is every algorithm cublasLtMatmulAlgoGetHeuristic returns (up to 32,
 * 32 MiB workspace) for the same column-major problem ("lt0": the heuristic's first choice);
 * "row" the same for the problem posed row-major (CUBLASLT_ORDER_ROW: A = x, B = w, TRANSB = T).
 * Shapes: the seven matrices of a llama-3-8b layer and the fused qkv / gateup, n rows each.
 * Each shape is timed over enough copies of w, taken in turn, to exceed 3x L2 (the weights come
 * from HBM, as in decode, which reads each weight once a step). A timing is a CUDA graph of R
 * calls (as the backend replays a step), replayed once to warm up, then twice timed with events.
 * An algorithm whose single direct call is over 3x the best single call so far is not timed
 * further; each (shape, n, posing) has a wall-time budget, the whole run a deadline.
 * Printed per (shape, n): us and weight GB/s (m*k*2 bytes / time) of base and the best algo, the
 * best algo's config (cublasLtMatmulAlgoConfigAttributes_t: a = algo id, t = tile id, st = stages
 * id, sk = split-k, r = reduction scheme, sw = CTA swizzle, co = custom option, in = inner shape,
 * cl = cluster shape; the ids are cublasLt.h's enums); per n, a layer's GEMM time (separate and
 * fused matrices) x 32 layers = ms per decode step, base vs best per shape (min of base and all
 * Lt), next to the weight bytes / device-to-device copy bandwidth (read + written / time).
 *
 * build: nvcc -O2 -arch=sm_90 [-cudart static] -o lt-sweep bench/gpu/lt-sweep.cu -lcublasLt -lcublas
 * usage: lt-sweep [rows...]   or LT_ROWS="8 32" lt-sweep   (default rows: 1 8 16 32 64)
 *        LT_REPS (calls per graph, default 20, rounded up to a whole cycle of copies),
 *        LT_BUDGET_MS (per shape, n and posing, default 400), LT_DEADLINE_S (default 75: after
 *        it only base is timed), LT_ALL=1 (a JSON line for every algorithm, not only the best).
 *        Lines starting '{' are JSON, one per measurement (grep '^{').
 */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_)); exit(1); } } while (0)

static const size_t WS = (size_t)32 << 20;
static const int MAXALGO = 32, LAYERS = 32;
struct Shape { const char *name; int m, k; };
static const Shape SH[] = {{"q", 4096, 4096},    {"k", 1024, 4096},   {"v", 1024, 4096},
                           {"o", 4096, 4096},    {"gate", 14336, 4096}, {"up", 14336, 4096},
                           {"down", 4096, 14336}, {"qkv", 6144, 4096}, {"gateup", 28672, 4096}};
static const int NSH = sizeof SH / sizeof SH[0];
static const int SEP[] = {0, 1, 2, 3, 4, 5, 6}, FUSED[] = {7, 3, 8, 6};

static cudaStream_t st;
static cudaEvent_t e0, e1;
static cublasHandle_t blas;
static cublasLtHandle_t lt;
static void *ws;
static __nv_bfloat16 *pool, *xd;
static float *yd;
static size_t l2;
static int reps, ncopy;   /* ncopy: copies of the current shape's w */
static const float one = 1.0f, zero = 0.0f;
static const char *gpu;

static double now_s() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int env_int(const char *n, int d) { const char *s = getenv(n); return s && *s ? atoi(s) : d; }
static int copies(const Shape &s) {
    size_t b = (size_t)s.m * s.k * 2, c = (3 * l2 + b - 1) / b;
    return c < 2 ? 2 : (int)c;
}

__global__ void k_fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = ((unsigned)i ^ (unsigned)(i >> 32) * 0x9e3779b9u) * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.0625f);
    }
}

struct Call {   /* one GEMM: base (lt = 0) or one cublasLt algorithm in one posing */
    int lt, row, m, n, k;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    const cublasLtMatmulAlgo_t *algo;
};
static cublasStatus_t issue(const Call &c, int copy) {
    const void *w = pool + (size_t)copy * c.m * c.k;
    if (!c.lt)
        return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, c.m, c.n, c.k, &one, w, CUDA_R_16BF, c.k, xd, CUDA_R_16BF, c.k, &zero, yd,
                            CUDA_R_32F, c.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return cublasLtMatmul(lt, c.op, &one, c.row ? (const void *)xd : w, c.a, c.row ? w : (const void *)xd, c.b, &zero, yd, c.c, yd,
                          c.c, c.algo, ws, WS, st);
}

/* us of one call, averaged over 2 replays of a graph of R calls (a whole number of cycles over
   the copies of w) after one warm-up replay; -1: the call failed, -2: its single call (*single,
   us, the second of two direct calls) was over screen (0: no screen) */
static double time_call(const Call &c, double *single, double screen) {
    int R = (reps + ncopy - 1) / ncopy * ncopy;
    if (issue(c, 0) != CUBLAS_STATUS_SUCCESS) { cudaGetLastError(); return -1; }
    CK(cudaEventRecord(e0, st));
    cublasStatus_t s = issue(c, 1 % ncopy);
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));   /* a sticky (kernel) error ends the run here */
    if (s != CUBLAS_STATUS_SUCCESS || cudaGetLastError() != cudaSuccess) return -1;
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    *single = ms * 1e3;
    if (screen > 0 && *single > screen) return -2;
    cudaGraph_t g = NULL;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    bool ok = true;
    for (int i = 0; i < R && ok; i++) ok = issue(c, i % ncopy) == CUBLAS_STATUS_SUCCESS;
    cudaError_t e = cudaStreamEndCapture(st, &g);
    if (!ok || e != cudaSuccess || !g) {
        if (g) CK(cudaGraphDestroy(g));
        cudaGetLastError();
        return -1;
    }
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e0, st));
    for (int j = 0; j < 2; j++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms * 1e3 / (2.0 * R);
}

struct Cfg { int id, sk; unsigned tile, stages, red, swz, custom; unsigned short inner, cluster; };
static Cfg get_cfg(const cublasLtMatmulAlgo_t *a) {
    Cfg c;
    size_t w;
    memset(&c, 0, sizeof c);
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.sk, sizeof c.sk, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.red, sizeof c.red, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swz, sizeof c.swz, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof c.inner, &w));
    CB(cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster, &w));
    return c;
}
static const char *cfg_str(const Cfg &c, char *b, size_t n) {
    snprintf(b, n, "a=%d t=%u st=%u sk=%d r=%u sw=%u co=%u in=%u cl=%u", c.id, c.tile, c.stages, c.sk, c.red, c.swz, c.custom, c.inner,
             c.cluster);
    return b;
}
static const char *cfg_json(const Cfg &c, char *b, size_t n) {
    snprintf(b, n, "\"algo\":%d,\"tile\":%u,\"stages\":%u,\"splitk\":%d,\"reduction\":%u,\"swizzle\":%u,\"custom\":%u,\"inner\":%u,\"cluster\":%u",
             c.id, c.tile, c.stages, c.sk, c.red, c.swz, c.custom, c.inner, c.cluster);
    return b;
}

struct Sweep { double best, first; Cfg cfg; size_t wsz; int nret, nok, nscreen, nbudget; };
/* every heuristic algorithm of one posing (row: row-major); best = -1 if none ran */
static Sweep sweep(const Shape &s, int n, int row, double *best_single, double deadline, double budget, int all) {
    Sweep r;
    memset(&r, 0, sizeof r);
    r.best = r.first = -1;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulPreference_t pref;
    int32_t ta = row ? CUBLAS_OP_N : CUBLAS_OP_T, tb = row ? CUBLAS_OP_T : CUBLAS_OP_N, ord = CUBLASLT_ORDER_ROW;
    uint64_t wsb = WS;
    CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (row) {   /* A = x [n][k], B = w [m][k] (op T), D = y [n][m], all row-major */
        CB(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, n, s.k, s.k));
        CB(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.m, s.k, s.k));
        CB(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n, s.m, s.m));
        CB(cublasLtMatrixLayoutSetAttribute(a, CUBLASLT_MATRIX_LAYOUT_ORDER, &ord, sizeof ord));
        CB(cublasLtMatrixLayoutSetAttribute(b, CUBLASLT_MATRIX_LAYOUT_ORDER, &ord, sizeof ord));
        CB(cublasLtMatrixLayoutSetAttribute(c, CUBLASLT_MATRIX_LAYOUT_ORDER, &ord, sizeof ord));
    } else {     /* gemm.cu's: A = w as k x m (op T), B = x as k x n, D = y as m x n, column-major */
        CB(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, s.k, s.m, s.k));
        CB(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.k, n, s.k));
        CB(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, s.m, n, s.m));
    }
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t h[MAXALGO];
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, MAXALGO, h, &r.nret) != CUBLAS_STATUS_SUCCESS) r.nret = 0;
    double t0 = now_s();
    for (int i = 0; i < r.nret; i++) {
        if (h[i].state != CUBLAS_STATUS_SUCCESS) continue;
        if (i > 0 && (now_s() - t0 > budget || now_s() > deadline)) { r.nbudget = r.nret - i; break; }
        Call call = {1, row, s.m, n, s.k, op, a, b, c, &h[i].algo};
        double single = 0, us = time_call(call, &single, i == 0 ? 0 : 3 * *best_single + 20);
        if (us == -2) r.nscreen++;
        if (us < 0) continue;
        r.nok++;
        if (single < *best_single) *best_single = single;
        if (i == 0) r.first = us;
        Cfg cf = get_cfg(&h[i].algo);
        if (r.best < 0 || us < r.best) r.best = us, r.cfg = cf, r.wsz = h[i].workspaceSize;
        if (all) {
            char j[256];
            printf("{\"bench\":\"lt-sweep\",\"kind\":\"algo\",\"shape\":\"%s\",\"m\":%d,\"k\":%d,\"n\":%d,\"posing\":\"%s\",\"rank\":%d,"
                   "\"us\":%.2f,\"gbs\":%.0f,\"waves\":%.2f,\"ws\":%zu,%s}\n", s.name, s.m, s.k, n, row ? "row" : "lt", i, us,
                   2.0 * s.m * s.k / us / 1e3, h[i].wavesCount, h[i].workspaceSize, cfg_json(cf, j, sizeof j));
        }
    }
    CB(cublasLtMatmulPreferenceDestroy(pref));
    CB(cublasLtMatrixLayoutDestroy(a));
    CB(cublasLtMatrixLayoutDestroy(b));
    CB(cublasLtMatrixLayoutDestroy(c));
    CB(cublasLtMatmulDescDestroy(op));
    return r;
}

int main(int argc, char **argv) {
    double t_start = now_s();
    std::vector<int> rows;
    const char *rs = getenv("LT_ROWS");
    if (argc > 1) for (int i = 1; i < argc; i++) rows.push_back(atoi(argv[i]));
    else if (rs && *rs) for (char *p = (char *)rs, *e; *p; p = e) { long v = strtol(p, &e, 10); if (e == p) { e++; continue; } rows.push_back((int)v); }
    else rows = {1, 8, 16, 32, 64};
    int maxn = 0;
    for (int n : rows) {
        if (n < 1 || n > 4096) { fprintf(stderr, "lt-sweep: rows must be 1..4096 (got %d)\n", n); return 1; }
        if (n > maxn) maxn = n;
    }
    reps = env_int("LT_REPS", 20);
    if (reps < 1) reps = 1;
    double budget = env_int("LT_BUDGET_MS", 400) / 1e3, deadline = t_start + env_int("LT_DEADLINE_S", 75);
    int all = env_int("LT_ALL", 0);

    cudaDeviceProp prop;
    int l2i;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaDeviceGetAttribute(&l2i, cudaDevAttrL2CacheSize, 0));
    gpu = prop.name;
    l2 = (size_t)l2i;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* ceiling: 1 GiB device-to-device copy */
    size_t big = (size_t)1 << 30;
    char *cp;
    float ms;
    CK(cudaMalloc(&cp, 2 * big));
    CK(cudaMemcpyAsync(cp + big, cp, big, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(cp + big, cp, big, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaFree(cp));
    double bw = 2.0 * 5 * big / (ms * 1e-3) / 1e9;   /* GB/s, read + written */
    printf("lt-sweep: %s, %d SMs, L2 %.0f MiB, cuBLAS %d, cuBLASLt %zu\n", gpu, prop.multiProcessorCount, l2 / 1048576.0, CUBLAS_VERSION,
           cublasLtGetVersion());
    printf("ceiling: copy 1 GiB device-to-device %.0f GB/s (read + written; %.0f GB/s of reads)\n", bw, bw / 2);
    printf("{\"bench\":\"lt-sweep\",\"kind\":\"ceiling\",\"gpu\":\"%s\",\"copy_gbs\":%.1f,\"l2\":%zu}\n", gpu, bw, l2);

    size_t pool_el = 0;
    int maxk = 0, maxm = 0;
    for (int i = 0; i < NSH; i++) {
        size_t el = (size_t)copies(SH[i]) * SH[i].m * SH[i].k;
        if (el > pool_el) pool_el = el;
        if (SH[i].k > maxk) maxk = SH[i].k;
        if (SH[i].m > maxm) maxm = SH[i].m;
    }
    CK(cudaMalloc(&pool, pool_el * 2));
    CK(cudaMalloc(&xd, (size_t)maxn * maxk * 2));
    CK(cudaMalloc(&yd, (size_t)maxn * maxm * 4));
    CK(cudaMalloc(&ws, WS));
    k_fill<<<1024, 256, 0, st>>>(pool, pool_el, 1);
    CK(cudaGetLastError());
    k_fill<<<256, 256, 0, st>>>(xd, (size_t)maxn * maxk, 2);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
    CB(cublasCreate(&blas));
    CB(cublasSetStream(blas, st));
    CB(cublasSetWorkspace(blas, ws, WS));
    CB(cublasLtCreate(&lt));

    std::vector<double> base(NSH), best(NSH);
    for (int n : rows) {
        printf("\n%-6s %5s %5s %3s %3s | %8s %6s | %8s %8s %8s | %8s %6s %6s | %-4s %-50s | %s\n", "shape", "m", "k", "n", "cp", "base us",
               "GB/s", "lt0 us", "lt us", "row us", "best us", "GB/s", "speed", "from", "best algo config", "ok/returned lt, row");
        for (int si = 0; si < NSH; si++) {
            const Shape &s = SH[si];
            ncopy = copies(s);
            double single = 0, gb = 2.0 * s.m * s.k / 1e3;   /* weight bytes / 1e3: / us = GB/s */
            Call call = {0, 0, s.m, n, s.k, NULL, NULL, NULL, NULL, NULL};
            base[si] = time_call(call, &single, 0);
            if (base[si] < 0) { fprintf(stderr, "lt-sweep: cublasGemmEx failed for %s n=%d\n", s.name, n); return 1; }
            Sweep c = {}, r = {};
            c.best = c.first = r.best = r.first = -1;
            bool late = now_s() > deadline;
            if (!late) c = sweep(s, n, 0, &single, deadline, budget, all);
            if (!late) r = sweep(s, n, 1, &single, deadline, budget, all);
            bool from_row = r.best > 0 && (c.best < 0 || r.best < c.best);
            const Sweep &b = from_row ? r : c;
            best[si] = b.best > 0 && b.best < base[si] ? b.best : base[si];
            char cs[128], cj[256];
            if (b.best > 0) cfg_str(b.cfg, cs, sizeof cs), cfg_json(b.cfg, cj, sizeof cj);
            else snprintf(cs, sizeof cs, "%s", late ? "(deadline: not swept)" : "(no algorithm ran)"), snprintf(cj, sizeof cj, "\"algo\":-1");
            printf("%-6s %5d %5d %3d %3d | %8.1f %6.0f | %8.1f %8.1f %8.1f | %8.1f %6.0f %5.2fx | %-4s %-50s | %d/%d, %d/%d%s\n", s.name, s.m,
                   s.k, n, ncopy, base[si], gb / base[si], c.first, c.best, r.best, b.best, b.best > 0 ? gb / b.best : -1.0,
                   b.best > 0 ? base[si] / b.best : 0.0, from_row ? "row" : "lt", cs, c.nok, c.nret, r.nok, r.nret,
                   c.nbudget + r.nbudget ? " (budget cut)" : "");
            printf("{\"bench\":\"lt-sweep\",\"kind\":\"shape\",\"gpu\":\"%s\",\"shape\":\"%s\",\"m\":%d,\"k\":%d,\"n\":%d,\"copies\":%d,"
                   "\"base_us\":%.2f,\"base_gbs\":%.0f,\"lt0_us\":%.2f,\"lt_us\":%.2f,\"row_us\":%.2f,\"best_us\":%.2f,\"best_gbs\":%.0f,"
                   "\"speedup\":%.3f,\"posing\":\"%s\",\"ws\":%zu,%s,\"lt_ok\":%d,\"lt_returned\":%d,\"lt_screened\":%d,\"row_ok\":%d,"
                   "\"row_returned\":%d,\"row_screened\":%d,\"budget_cut\":%d}\n", gpu, s.name, s.m, s.k, n, ncopy, base[si], gb / base[si],
                   c.first, c.best, r.best, b.best, b.best > 0 ? gb / b.best : -1.0, b.best > 0 ? base[si] / b.best : 0.0,
                   from_row ? "row" : "lt", b.wsz, cj, c.nok, c.nret, c.nscreen, r.nok, r.nret, r.nscreen, c.nbudget + r.nbudget);
            fflush(stdout);
        }
        for (int f = 0; f < 2; f++) {
            const int *set = f ? FUSED : SEP;
            int cnt = f ? 4 : 7;
            double sb = 0, sc = 0, bytes = 0;
            for (int i = 0; i < cnt; i++) sb += base[set[i]], sc += best[set[i]], bytes += 2.0 * SH[set[i]].m * SH[set[i]].k;
            double ceil_ms = LAYERS * bytes / (bw * 1e9) * 1e3;
            printf("layer n=%-3d %-26s base %8.1f us, best %8.1f us (%5.2fx) | x%d layers: %6.2f -> %6.2f ms/step; "
                   "ceiling %.2f GB / %.0f GB/s = %.2f ms\n", n, f ? "fused qkv,o,gateup,down:" : "separate q,k,v,o,gate,up,down:", sb, sc,
                   sb / sc, LAYERS, LAYERS * sb / 1e3, LAYERS * sc / 1e3, LAYERS * bytes / 1e9, bw, ceil_ms);
            printf("{\"bench\":\"lt-sweep\",\"kind\":\"layer\",\"gpu\":\"%s\",\"n\":%d,\"layout\":\"%s\",\"base_us\":%.2f,\"best_us\":%.2f,"
                   "\"base_ms_step\":%.3f,\"best_ms_step\":%.3f,\"weight_gb_step\":%.3f,\"ceiling_ms_step\":%.3f}\n", gpu, n,
                   f ? "fused" : "separate", sb, sc, LAYERS * sb / 1e3, LAYERS * sc / 1e3, LAYERS * bytes / 1e9, ceil_ms);
        }
        fflush(stdout);
    }
    printf("\nlt-sweep: %.1f s%s\n", now_s() - t_start, now_s() > deadline ? " (deadline reached: later shapes timed base only)" : "");
    CB(cublasLtDestroy(lt));
    CB(cublasDestroy(blas));
    CK(cudaFree(pool));
    CK(cudaFree(xd));
    CK(cudaFree(yd));
    CK(cudaFree(ws));
    return 0;
}
