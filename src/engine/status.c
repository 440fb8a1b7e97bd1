/* status.c — names of the public status codes, and the library version. */
#include "cinfer.h"

const char *cinfer_status_str(cinfer_status s) {
    switch (s) {
    case CINFER_OK: return "ok";
    case CINFER_EINVAL: return "invalid argument";
    case CINFER_EIO: return "I/O error";
    case CINFER_EFORMAT: return "format error";
    case CINFER_EUNSUPPORTED: return "unsupported";
    case CINFER_ENOMEM: return "out of memory";
    case CINFER_EBACKEND: return "backend error";
    case CINFER_ENOTFOUND: return "not found";
    }
    return "unknown status";
}

/* CINFER_VERSION comes from the Makefile; CINFER_GIT_REV when built in a checkout */
#ifndef CINFER_VERSION
#define CINFER_VERSION "0.0.0"
#endif
const char *cinfer_version(void) {
#ifdef CINFER_GIT_REV
    return CINFER_VERSION " (git " CINFER_GIT_REV ")";
#else
    return CINFER_VERSION;
#endif
}
