// The one definition of what TF can adopt from torch without a copy: the
// alignment TF's kernels need, the dtypes DLPack carries between the two, and
// the layout rule. Plain C++ (no TensorFlow, torch or Python headers), so the
// TF side (dlpack_check.cc), the torch side (torch_interop.cc) and the C++
// torch runner (exported/exported_call.cc) include the same rule. The Python side has its twin in torchbridge/_crossing/_adopt.py; the
// loader (torchbridge/_native/_build.py) compares the two at load time through
// torchbridge_alignment() and torchbridge_dtype_table() (torchbridge_op.cc)
// and refuses a library that disagrees.

#ifndef TORCHBRIDGE_CSRC_ADOPT_RULES_H_
#define TORCHBRIDGE_CSRC_ADOPT_RULES_H_

#include <cstdint>

namespace torchbridge {

// TF's CPU kernels assume EIGEN_MAX_ALIGN_BYTES = 64: a misaligned buffer is
// accepted and a later kernel aborts the process (Check failed: IsAligned()).
constexpr uintptr_t kAlignment = 64;

// DLPack's type codes (dlpack.h's DLDataTypeCode), spelled out so that this
// header needs no DLPack header.
constexpr uint8_t kCodeInt = 0;
constexpr uint8_t kCodeUInt = 1;
constexpr uint8_t kCodeFloat = 2;
constexpr uint8_t kCodeBfloat = 4;
constexpr uint8_t kCodeComplex = 5;
constexpr uint8_t kCodeBool = 6;

// The dtypes that cross: X(TF DataType enumerator, DLPack code, bits, name).
// The names are TF's (tf.as_dtype(name)); torchbridge/_crossing/_adopt.py maps each to
// its torch dtype.
#define TORCHBRIDGE_DTYPES(X)            \
  X(DT_HALF, kCodeFloat, 16, "float16")  \
  X(DT_BFLOAT16, kCodeBfloat, 16, "bfloat16") \
  X(DT_FLOAT, kCodeFloat, 32, "float32") \
  X(DT_DOUBLE, kCodeFloat, 64, "float64") \
  X(DT_INT8, kCodeInt, 8, "int8")        \
  X(DT_INT16, kCodeInt, 16, "int16")     \
  X(DT_INT32, kCodeInt, 32, "int32")     \
  X(DT_INT64, kCodeInt, 64, "int64")     \
  X(DT_UINT8, kCodeUInt, 8, "uint8")     \
  X(DT_UINT16, kCodeUInt, 16, "uint16")  \
  X(DT_UINT32, kCodeUInt, 32, "uint32")  \
  X(DT_UINT64, kCodeUInt, 64, "uint64")  \
  X(DT_BOOL, kCodeBool, 8, "bool")       \
  X(DT_COMPLEX64, kCodeComplex, 64, "complex64") \
  X(DT_COMPLEX128, kCodeComplex, 128, "complex128")

// Whether `address` suits TF's kernels. An empty tensor is never read, so
// any address (or none) suits it.
inline bool IsAligned(uintptr_t address, int64_t numel) {
  return numel == 0 || address % kAlignment == 0;
}

// Whether strides (in elements; nullptr means dense) describe dense
// row-major memory. Size-1 dimensions may carry any stride, as in torch's
// own definition of contiguous.
inline bool IsDenseRowMajor(int32_t ndim, const int64_t* shape,
                            const int64_t* strides) {
  if (strides == nullptr) return true;
  int64_t expected = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

// The whole rule for a torch tensor, from facts either side can read: TF can
// adopt its memory as it is when it is a plain strided tensor (not sparse,
// not quantized, no lazy conjugation or negation) that is dense row-major
// and aligned.
inline bool CanAdoptAsIs(bool strided, bool quantized, bool lazy_conj_or_neg,
                         bool dense_row_major, uintptr_t address,
                         int64_t numel) {
  return strided && !quantized && !lazy_conj_or_neg && dense_row_major &&
         IsAligned(address, numel);
}

}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_ADOPT_RULES_H_
