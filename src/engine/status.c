/* status.c — names of the public status codes. */
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
