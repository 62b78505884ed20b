// DLPack on TF's side: the DLPack header (TF ships one), capsule names, the
// dtype mapping (from adopt_rules.h) and the check that a DLPack tensor is
// one TF can adopt as a declared output.

#ifndef TORCHBRIDGE_CSRC_DLPACK_CHECK_H_
#define TORCHBRIDGE_CSRC_DLPACK_CHECK_H_

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

#if __has_include("external/dlpack/include/dlpack/dlpack.h")
#include "external/dlpack/include/dlpack/dlpack.h"  // shipped with TF
#elif __has_include("dlpack/dlpack.h")
#include "dlpack/dlpack.h"
#else
// The DLPack ABI, as far as this file uses it (legacy v0.x structs and the
// v1 versioned one).
extern "C" {
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 } DLDeviceType;
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;
typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
} DLDataTypeCode;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
}
#endif

namespace torchbridge {

constexpr char kCapsuleName[] = "dltensor";
constexpr char kUsedCapsuleName[] = "used_dltensor";
constexpr char kVersionedCapsuleName[] = "dltensor_versioned";
constexpr char kUsedVersionedCapsuleName[] = "used_dltensor_versioned";

// The DLPack type of a TF dtype; false for a dtype that does not cross.
bool ToDLDataType(tensorflow::DataType dt, DLDataType* out);

// "float32", "int64x4", ...
std::string DLDataTypeString(const DLDataType& t);

// "[2, 3]"
std::string DimsString(int32_t ndim, const int64_t* shape);

// OK when `t` can become output `index` of the op `where` as it is: of dtype
// `dtype`, of a shape compatible with `shape` (`check_shape` false: any), on
// `device`, dense row-major and aligned (adopt_rules.h). Otherwise an
// InvalidArgument error that names the output, what it got, what was
// declared, and the fix.
absl::Status CheckAdoptable(const std::string& where, size_t index,
                            const DLTensor& t, tensorflow::DataType dtype,
                            bool check_shape,
                            const tensorflow::PartialTensorShape& shape,
                            DLDevice device);

// The dtype table as text, "name:code:bits,...", for the loader's check that
// the Python side agrees (torchbridge_dtype_table()).
const char* DtypeTable();

}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_DLPACK_CHECK_H_
