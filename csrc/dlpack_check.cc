// DLPack dtypes and the adoption check on TF's side (see dlpack_check.h).

#include "dlpack_check.h"

#include "absl/strings/str_cat.h"
#include "adopt_rules.h"
#include "tensorflow/core/platform/errors.h"

namespace torchbridge {

using ::tensorflow::DataType;

bool ToDLDataType(DataType dt, DLDataType* out) {
  switch (dt) {
#define TORCHBRIDGE_CASE(tf_type, dl_code, nbits, name) \
  case tensorflow::tf_type:                             \
    out->code = dl_code;                                \
    out->bits = nbits;                               \
    break;
    TORCHBRIDGE_DTYPES(TORCHBRIDGE_CASE)
#undef TORCHBRIDGE_CASE
    default:
      return false;
  }
  out->lanes = 1;
  return true;
}

const char* DtypeTable() {
  static const std::string* table = [] {
    auto* s = new std::string;
#define TORCHBRIDGE_ENTRY(tf_type, dl_code, nbits, name) \
  absl::StrAppend(s, s->empty() ? "" : ",", name, ":", static_cast<int>(dl_code), ":", \
                  nbits);
    TORCHBRIDGE_DTYPES(TORCHBRIDGE_ENTRY)
#undef TORCHBRIDGE_ENTRY
    return s;
  }();
  return table->c_str();
}

std::string DLDataTypeString(const DLDataType& t) {
  const char* code;
  switch (t.code) {
    case kCodeInt: code = "int"; break;
    case kCodeUInt: code = "uint"; break;
    case kCodeFloat: code = "float"; break;
    case kCodeBfloat: code = "bfloat"; break;
    case kCodeComplex: code = "complex"; break;
    case kCodeBool: code = "bool"; break;
    default: code = "code?"; break;
  }
  std::string s = absl::StrCat(code, t.bits);
  if (t.lanes != 1) absl::StrAppend(&s, "x", t.lanes);
  return s;
}

std::string DimsString(int32_t ndim, const int64_t* shape) {
  std::string s = "[";
  for (int32_t i = 0; i < ndim; ++i) {
    absl::StrAppend(&s, i ? ", " : "", shape ? shape[i] : -1);
  }
  return s + "]";
}

namespace {

bool DtypeMatches(DataType dt, const DLDataType& got) {
  DLDataType want;
  if (!ToDLDataType(dt, &want)) return false;
  if (got.lanes != 1 || got.bits != want.bits) return false;
  if (got.code == want.code) return true;
  // Older producers export bool as uint8.
  return dt == tensorflow::DT_BOOL && got.code == kCodeUInt;
}

}  // namespace

absl::Status CheckAdoptable(const std::string& where, size_t i,
                            const DLTensor& t, DataType dtype,
                            bool check_shape,
                            const tensorflow::PartialTensorShape& want,
                            DLDevice device) {
  using tensorflow::errors::InvalidArgument;
  if (!DtypeMatches(dtype, t.dtype)) {
    return InvalidArgument(
        where, ": output ", i, " from the torch callback has dtype ",
        DLDataTypeString(t.dtype), ", but ", tensorflow::DataTypeString(dtype),
        " was declared (Tout) when the graph was built. Return the declared "
        "dtype.");
  }
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    return InvalidArgument(where, ": output ", i,
                           " has an invalid DLPack shape");
  }
  int64_t numel = 1;
  for (int32_t d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) {
      return InvalidArgument(where, ": output ", i,
                             " has a negative dimension ",
                             DimsString(t.ndim, t.shape));
    }
    numel *= t.shape[d];
  }
  if (check_shape) {
    bool compatible = want.unknown_rank() || want.dims() == t.ndim;
    for (int32_t d = 0; compatible && !want.unknown_rank() && d < t.ndim;
         ++d) {
      const int64_t w = want.dim_size(d);
      compatible = w < 0 || w == t.shape[d];
    }
    if (!compatible) {
      return InvalidArgument(
          where, ": output ", i, " from the torch callback has shape ",
          DimsString(t.ndim, t.shape), ", but ", want.DebugString(),
          " was declared (output_shapes) when the graph was built. Return "
          "that shape, or declare data-dependent dimensions as None.");
    }
  }
  if (numel == 0) return absl::OkStatus();  // nothing is read
  const bool device_ok =
      t.device.device_type == device.device_type &&
      (device.device_type == kDLCPU || t.device.device_id == device.device_id);
  if (!device_ok) {
    return InvalidArgument(
        where, ": output ", i, " from the torch callback is on DLPack device "
        "(type ", static_cast<int>(t.device.device_type), ", id ",
        t.device.device_id, "), but this kernel needs device (type ",
        static_cast<int>(device.device_type), ", id ", device.device_id,
        ") (1 = CPU, 2 = CUDA). Move the tensor to the op's device.");
  }
  if (!IsDenseRowMajor(t.ndim, t.shape, t.strides)) {
    return InvalidArgument(
        where, ": output ", i, " from the torch callback is not contiguous "
        "(shape ", DimsString(t.ndim, t.shape), ", strides ",
        DimsString(t.ndim, t.strides), "); TF needs dense row-major memory. "
        "Return x.contiguous() (or x.clone()).");
  }
  const uintptr_t address = reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
  if (!IsAligned(address, numel)) {
    return InvalidArgument(
        where, ": output ", i, " from the torch callback is not ", kAlignment,
        "-byte aligned (address 0x", absl::Hex(address), "); TF kernels "
        "require ", kAlignment, "-byte aligned buffers and would crash on it. "
        "Return an aligned copy (x.clone()).");
  }
  return absl::OkStatus();
}

}  // namespace torchbridge
