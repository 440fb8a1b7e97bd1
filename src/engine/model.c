/*
 * model.c — cinfer_model_load: config -> architecture -> mapped weights ->
 * backend preparation -> optional tokenizer. Every failure leaves nothing
 * allocated and a message naming the file and the problem.
 */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/engine.h"
#include "io/quant-config.h"
#include "util.h"

void cinfer_model_free(cinfer_model *m) {
    if (!m) return;
    if (m->bc) {
        for (int i = 0; i < m->w.n_mats; i++) m->be->mat_release(m->bc, m->w.mats[i]);
        m->be->ctx_free(m->bc);
    }
    weights_free(&m->w);
    qc_free(m->cfg.quant);
    st_close(&m->st);
    cinfer_tokenizer_free(m->tok);
    free(m->dir);
    free(m);
}

#ifdef CINFER_CUDA
/* the CUDA runtime's C entry points (libcudart; cudaError_t is an enum), so
 * engine code needs no CUDA headers to say why the GPU is not usable */
extern int cudaDriverGetVersion(int *version);
extern int cudaGetDeviceCount(int *count);
extern const char *cudaGetErrorString(int error);
static void cuda_why(char *why, size_t n) {
    int v = 0, count = 0, e;
    if (cudaDriverGetVersion(&v) != 0 || v == 0) snprintf(why, n, "no NVIDIA driver is loaded (is this a GPU machine?)");
    else if ((e = cudaGetDeviceCount(&count)) != 0) snprintf(why, n, "%s (driver %d.%d)", cudaGetErrorString(e), v / 1000, v % 1000 / 10);
    else if (count < 1) snprintf(why, n, "no CUDA device found");
}
#else
static void cuda_why(char *why, size_t n) { snprintf(why, n, "built without CUDA"); }
#endif

static cinfer_status prepare(cinfer_model *m, char *err, size_t n) {
    model_weights *w = &m->w;
    int bad = 0;
    for (int i = 0; i < w->n_mats && !bad; i++) bad |= m->be->mat_prepare(m->bc, w->mats[i]);
    if (w->lm_head.data == w->tok_embd.data) w->lm_head = w->tok_embd;   /* tied: the prepared handle */
    char why[256] = "";
    if (bad && m->be->status) m->be->status(m->bc, why, sizeof why);
    return bad ? cf_err(err, n, CINFER_EBACKEND, "%s: could not prepare the weights on the %s backend%s%s", m->dir, m->be->name,
                        why[0] ? ": " : "", why)
               : CINFER_OK;
}

/* parameters (unpacked for affine matrices) and the stored types of the 2-D weights */
static void describe_weights(cinfer_model *m) {
    int64_t p = 0;
    for (int i = 0; i < m->st.n; i++) {
        int64_t e = 1;
        for (int d = 0; d < m->st.t[i].ndim; d++) e *= m->st.t[i].shape[d];
        p += e;
    }
    int seen[BE_N_DTYPES] = {0}, group = 0;
    be_dtype sdt = BE_F32;
    for (int i = 0; i < m->w.n_mats; i++) {
        const be_mat *w = m->w.mats[i];
        if (w->rows > 1) seen[w->dt] = 1;
        if (!be_traits(w->dt)->affine) continue;
        int64_t n = w->rows * w->cols, ng = n / w->group;
        p += n - n * be_traits(w->dt)->bits / 32 - 2 * ng;   /* the packed words, scales and biases counted above */
        group = w->group;
        sdt = w->sdt;
    }
    m->n_params = p;
    size_t k = 0;
    for (int t = 0; t < BE_N_DTYPES; t++)
        if (seen[t]) k += (size_t)snprintf(m->weight_types + k, sizeof m->weight_types - k, "%s%s", k ? "+" : "", be_dtype_name((be_dtype)t));
    if (group && k < sizeof m->weight_types)
        snprintf(m->weight_types + k, sizeof m->weight_types - k, " (affine g%d, %s scales)", group, be_dtype_name(sdt));
}

cinfer_status cinfer_model_load(const char *dir, const cinfer_load_opts *opts, cinfer_model **out, char *err, size_t n) {
    if (out) *out = NULL;
    if (!dir || !out) return cf_err(err, n, CINFER_EINVAL, "cinfer_model_load: NULL argument");
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return cf_err(err, n, CINFER_EIO, "%s: not a directory (expected a model directory with config.json)", dir);
    cinfer_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) { free(m); return cf_err(err, n, CINFER_ENOMEM, "out of memory"); }
    cinfer_status st = config_load(dir, arch_known, arch_supported(), &m->cfg, err, n);
    if (!st) {
        m->arch = arch_find(m->cfg.model_type);
        arch_adjust(m->arch, &m->cfg);
        st = qc_load(dir, &m->cfg.quant, err, n);
    }
    if (!st) {
        st = st_open_dir(dir, &m->st, err, n);
    }
    if (!st) st = arch_bind(m->arch, &m->cfg, &m->st, dir, &m->w, err, n);
    const char *dev = opts && opts->device ? opts->device : "cpu";
    if (!st) {
        if (!strcmp(dev, "cpu")) m->be = be_cpu();
        else if (!strcmp(dev, "cuda")) m->be = be_cuda();
        if (!m->be)
            st = cf_err(err, n, CINFER_EUNSUPPORTED, "device '%s' is not available in this build (%s)", dev,
                        strcmp(dev, "cuda") ? "use cpu or cuda" : "built without CUDA");
    }
    if (!st) {
        m->n_threads = opts && opts->n_threads > 0 ? opts->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (m->n_threads < 1) m->n_threads = 1;
        if (m->be->ctx_new(&m->bc, m->n_threads)) {
            char why[160] = "";
            if (!strcmp(dev, "cuda")) cuda_why(why, sizeof why);
            st = cf_err(err, n, CINFER_EBACKEND, "%s backend failed to start%s%s", m->be->name, why[0] ? ": " : "", why);
        }
    }
    if (!st) st = prepare(m, err, n);
    if (!st && !(opts && opts->no_tokenizer)) {
        cinfer_status ts = cinfer_tokenizer_load(dir, &m->tok, err, n);
        if (ts == CINFER_ENOTFOUND) m->tok = NULL;
        else st = ts;
    }
    if (st) {
        cinfer_model_free(m);
        return st;
    }
    snprintf(m->dtype_name, sizeof m->dtype_name, "%s", be_dtype_name(m->w.layers[0].wq.dt));
    describe_weights(m);
    for (int i = 0; i < m->cfg.n_eos; i++) m->eos[i] = m->cfg.eos[i];
    if (err && n) err[0] = 0;
    *out = m;
    return CINFER_OK;
}

void cinfer_model_get_info(const cinfer_model *m, cinfer_model_info *info) {
    const model_config *c = &m->cfg;
    memset(info, 0, sizeof *info);
    info->model_type = c->model_type;
    info->n_layer = c->n_layer;
    info->hidden = c->hidden;
    info->n_head = c->n_head;
    info->n_kv_head = c->n_kv_head;
    info->head_dim = c->head_dim;
    info->ffn = c->ffn;
    info->n_vocab = c->n_vocab;
    info->max_pos = c->max_pos;
    info->bos = c->bos;
    info->n_eos = c->n_eos;
    info->eos = m->eos;
    info->weight_dtype = m->dtype_name;
    info->weight_bytes = m->st.total_bytes;
    info->n_params = m->n_params;
    info->weight_types = m->weight_types;
    info->bits_per_weight = m->n_params ? 8.0 * (double)m->st.total_bytes / (double)m->n_params : 0;
}

const cinfer_tokenizer *cinfer_model_tokenizer(const cinfer_model *m) { return m->tok; }
