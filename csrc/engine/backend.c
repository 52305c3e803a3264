/* backend.c: which backend serves a device type. */
#include "backend.h"

const pxt_backend *pxt_backend_for(pxt_device_type type) {
    switch (type) {
    case PXT_CPU: return pxt_cpu_backend();
#ifdef PXT_WITH_CUDA
    case PXT_CUDA: return pxt_cuda_backend();
#endif
    default: return NULL;
    }
}
