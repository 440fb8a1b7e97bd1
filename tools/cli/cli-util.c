/*
 * cli-util.c — helpers shared by the CLI commands: strict number parsing
 * with messages that name the flag, whole-file reads, model loading with the
 * library's error printed.
 */
#include <errno.h>
#include <stdarg.h>
#include <getopt.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

int cli_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
    char *e;
    errno = 0;
    long x = v ? strtol(v, &e, 10) : 0;
    if (!v || !*v || *e || errno || x < lo || x > hi) {
        fprintf(stderr, "cinfer %s: bad value for %s: '%s' (expected an integer in [%ld, %ld])\n", cmd, flag, v ? v : "", lo, hi);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int cli_float(const char *cmd, const char *flag, const char *v, float *out) {
    char *e;
    errno = 0;
    float x = v ? strtof(v, &e) : 0;
    if (!v || !*v || *e || errno || x != x) {
        fprintf(stderr, "cinfer %s: bad value for %s: '%s' (expected a number)\n", cmd, flag, v ? v : "");
        return 0;
    }
    *out = x;
    return 1;
}

int cli_parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, ok = 1;
    *n = 0;
    *ids = malloc(sizeof(int32_t) * cap);
    while (*ids && *s && ok) {
        char *e;
        long v = strtol(s, &e, 10);
        ok = e != s && v >= 0 && v <= 2147483647 && (!*e || *e == ',');
        if (ok && *n == cap) {
            int32_t *p = realloc(*ids, sizeof(int32_t) * (cap *= 2));
            if (!p) { ok = 0; break; }
            *ids = p;
        }
        if (ok) (*ids)[(*n)++] = (int32_t)v;
        s = *e ? e + 1 : e;
    }
    if (!*ids || !ok || *n == 0) {
        free(*ids);
        *ids = NULL;
        return 0;
    }
    return 1;
}

char *cli_read_file(const char *path, size_t *len, const char **why) {
    const char *dummy;
    if (!why) why = &dummy;
    *why = NULL;
    int std = !strcmp(path, "-");
    FILE *f = std ? stdin : fopen(path, "rb");
    if (!f) { *why = strerror(errno); return NULL; }
    struct stat sb;
    if (!std && (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode))) {   /* a FIFO or a device may never end */
        fclose(f);
        *why = "not a regular file";
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n + 1 < cap) break;
        if (cap >= CLI_MAX_INPUT) { free(buf); buf = NULL; *why = "too large (over 1 GiB)"; break; }
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; *why = "out of memory"; break; }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    if (!std) fclose(f);
    if (buf && bad) *why = "read error";
    if (!buf || bad) { free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* the option of argv named `a` ("--name[=v]" or "-x"): 1 takes a value, 0 a
 * flag, -1 unknown */
static int opt_kind(const char *a, const char *shortopts, const struct option *lo) {
    if (a[1] == '-') {
        size_t n = strcspn(a + 2, "=");
        for (const struct option *o = lo; o && o->name; o++)
            if (strlen(o->name) == n && !strncmp(o->name, a + 2, n)) return o->has_arg ? 1 : 0;
        return -1;
    }
    const char *p = a[1] && a[1] != ':' ? strchr(shortopts, a[1]) : NULL;
    return p ? p[1] == ':' : -1;
}

int cli_check_args(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *lo) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) return 1;
        if (a[0] != '-' || !a[1]) continue;
        int k = opt_kind(a, shortopts, lo);
        if (a[1] != '-' && a[2]) {   /* "-n5" is -n 5; "-ngl" is not -n gl (llama.cpp's flags are unknown here) */
            char *e;
            strtol(a + 2, &e, 10);
            if (k == 1 && !*e) continue;
            k = -1;
        }
        if (k < 0) { fprintf(stderr, "cinfer %s: unknown option '%s' (see cinfer %s --help)\n", cmd, a, cmd); return 0; }
        if (k == 1 && !(a[1] == '-' && strchr(a, '='))) {
            if (i + 1 >= argc) { fprintf(stderr, "cinfer %s: option '%s' needs a value\n", cmd, a); return 0; }
            i++;
        }
    }
    return 1;
}

void cli_bad_option(const char *cmd, char **argv, int opt) {
    (void)opt;
    fprintf(stderr, "cinfer %s: bad option '%s' (see cinfer %s --help)\n", cmd, argv[optind - 1], cmd);
}

cinfer_model *cli_load_model(const char *cmd, const char *dir, const char *device, int n_threads) {
    char err[1024];
    cinfer_load_opts o = {device, n_threads, 0};
    cinfer_model *m = NULL;
    cinfer_status st = cinfer_model_load(dir, &o, &m, err, sizeof err);
    if (st) {
        fprintf(stderr, "cinfer %s: %s\n", cmd, err);
        return NULL;
    }
    return m;
}

int cli_getopt_begin(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *lo) {
    optind = 1;
    opterr = 0;
    return cli_check_args(cmd, argc, argv, shortopts, lo);
}

int cli_no_more_args(const char *cmd, int argc, char **argv) {
    if (optind >= argc) return 1;
    fprintf(stderr, "cinfer %s: unexpected argument '%s' (every value belongs to a flag; see cinfer %s --help)\n", cmd, argv[optind], cmd);
    return 0;
}

void cli_json_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!b) { fputs("null", stdout); return; }   /* stdout's error flag is not set: say something valid */
    va_start(ap, fmt);
    vsnprintf(b, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int in_str = 0;
    for (char *p = b; *p; p++) {
        if (in_str) {
            if (*p == '\\' && p[1]) putchar(*p++);
            else if (*p == '"') in_str = 0;
            putchar(*p);
            continue;
        }
        if (*p == '"') in_str = 1;
        const char *w = *p == '-' ? p + 1 : p;
        if (!strncmp(w, "nan", 3) || !strncmp(w, "inf", 3)) {   /* printf's non-finite numbers */
            fputs("null", stdout);
            p = (char *)w + (strncmp(w, "infinity", 8) ? 2 : 7);
            continue;
        }
        putchar(*p);
    }
    free(b);
}

int cli_size(const char *v, size_t *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !(x > 0)) return 0;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mul > 1 && *end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || x * mul > 1e15 || x * mul < 1) return 0;
    *out = (size_t)(x * mul);
    return 1;
}

int cli_scoring_kv(const char *cmd, cinfer_ctx_opts *co) {
    /* quantizing turns rounding-level differences of a key into a different code: the batch-invariant
     * kernels keep every row's arithmetic the same whatever the batch and chunk sizes */
    if (co->kv_bits || co->kv_config) co->batch_invariant = 1;
    if (co->quantized_kv_start == -1) return 1;
    fprintf(stderr, "cinfer %s: --quantized-kv-start does not apply to scoring: with --kv-bits or --kv-config every key "
            "is quantized from token 0, before any query reads it (mlx-lm's QuantizedKVCache)\n", cmd);
    return 0;
}

int cli_kv_flag(const char *cmd, int code, const char *v, cinfer_ctx_opts *co) {
    switch (code) {
    case KV_MEMORY:
        if (cli_size(v, &co->kv_memory)) return 1;
        fprintf(stderr, "cinfer %s: bad value for --kv-memory: '%s' (a size such as 4G, 512M or a byte count)\n", cmd, v);
        return -1;
    case KV_DTYPE:
        if (!strcmp(v, "f32") || !strcmp(v, "f16") || !strcmp(v, "bf16")) { co->kv_dtype = v; return 1; }
        fprintf(stderr, "cinfer %s: bad value for --kv-dtype: '%s' (f32, f16 or bf16)\n", cmd, v);
        return -1;
    case KV_MAX_SIZE: return cli_int(cmd, "--max-kv-size", v, 2, 1 << 30, &co->max_kv_size) ? 1 : -1;
    case KV_PREFILL: return cli_int(cmd, "--prefill-step-size", v, 1, 1 << 30, &co->prefill_step_size) ? 1 : -1;
    case KV_BITS:
        if (!cli_int(cmd, "--kv-bits", v, 2, 8, &co->kv_bits)) return -1;
        if (co->kv_bits != 7) return 1;
        fprintf(stderr, "cinfer %s: bad value for --kv-bits: '%s' (2, 3, 4, 5, 6 or 8)\n", cmd, v);
        return -1;
    case KV_GROUP:
        if (!cli_int(cmd, "--kv-group-size", v, 32, 128, &co->kv_group_size)) return -1;
        if (co->kv_group_size == 32 || co->kv_group_size == 64 || co->kv_group_size == 128) return 1;
        fprintf(stderr, "cinfer %s: bad value for --kv-group-size: '%s' (32, 64 or 128)\n", cmd, v);
        return -1;
    case KV_QSTART: return cli_int(cmd, "--quantized-kv-start", v, 0, 1 << 30, &co->quantized_kv_start) ? 1 : -1;
    case KV_CONFIG: co->kv_config = v; return 1;
    case KV_KERNELS:
        if (!strcmp(v, "unfused") || !strcmp(v, "tiled-causal") || !strcmp(v, "tiled")) { co->kv_kernels = v; return 1; }
        fprintf(stderr, "cinfer %s: bad value for --kv-kernels: '%s' (unfused, tiled-causal or tiled)\n", cmd, v);
        return -1;
    case KV_ACT:
        if (!strcmp(v, "auto") || !strcmp(v, "f32") || !strcmp(v, "bf16")) { co->prefill_act = v; return 1; }
        fprintf(stderr, "cinfer %s: bad value for --prefill-act: '%s' (auto, f32 or bf16)\n", cmd, v);
        return -1;
    case KV_PAGE:
        if (cli_int(cmd, "--kv-page", v, 1, 65536, &co->kv_page) && !(co->kv_page & (co->kv_page - 1))) return 1;
        fprintf(stderr, "cinfer %s: bad value for --kv-page: '%s' (a power of two up to 65536)\n", cmd, v);
        return -1;
    default: return 0;
    }
}
