/* dlpack.h: the DLPack ABI (v1.x, with the legacy unversioned struct), as the
 * DLPack specification defines it. Only what pyxtts exchanges is declared. */
#ifndef PXT_DLPACK_H
#define PXT_DLPACK_H

#include <stdint.h>

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ull << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1ull << 1)

typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 } DLDeviceType;
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 } DLDataTypeCode;

typedef struct {
    int32_t device_type; /* DLDeviceType */
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code; /* DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means C-contiguous */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif /* PXT_DLPACK_H */
