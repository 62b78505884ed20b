// Zero-copy memory crossing (see adopted_buffer.h).

#include "adopted_buffer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/errors.h"

namespace torchbridge {

std::atomic<int64_t> g_zero_copy_count{0};

void Managed::DeleteNow() {
  if (legacy && legacy->deleter) legacy->deleter(legacy);
  if (versioned && versioned->deleter) versioned->deleter(versioned);
  legacy = nullptr;
  versioned = nullptr;
}

void Managed::DeleteFromAnyThread() {
  if (!*this) return;
  if (!Py_IsInitialized()) {
    DeleteNow();
    return;
  }
  if (PythonFinalizing()) {
    legacy = nullptr;
    versioned = nullptr;
    return;
  }
  if (gil_free) {
    DeleteNow();
    return;
  }
  GilLock gil;
  DeleteNow();
}

void DLPackBuffer::FillAllocationDescription(
    tensorflow::AllocationDescription* proto) const {
  proto->set_requested_bytes(static_cast<int64_t>(size_));
  proto->set_allocated_bytes(static_cast<int64_t>(size_));
  proto->set_allocator_name("torchbridge_dlpack");
  proto->set_ptr(reinterpret_cast<uintptr_t>(data()));
}

namespace {

struct InputContext {
  tensorflow::Tensor tensor;  // holds a reference on the TF buffer
  std::vector<int64_t> shape;
  DLManagedTensor managed;
};

void DeleteInputContext(DLManagedTensor* self) {
  delete static_cast<InputContext*>(self->manager_ctx);
}

}  // namespace

void InputCapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed && managed->deleter) managed->deleter(managed);
}

absl::Status WrapInput(const tensorflow::Tensor& tensor, DLDevice device,
                       int index, DLManagedTensor** out) {
  DLDataType dtype;
  if (!ToDLDataType(tensor.dtype(), &dtype)) {
    return tensorflow::errors::InvalidArgument(
        "input ", index, " has dtype ",
        tensorflow::DataTypeString(tensor.dtype()),
        ", which DLPack cannot carry to torch");
  }
  auto* ctx = new InputContext{tensor, {}, {}};
  const int ndim = tensor.dims();
  ctx->shape.resize(ndim);
  for (int i = 0; i < ndim; ++i) ctx->shape[i] = tensor.dim_size(i);
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = tensor.NumElements() ? ctx->tensor.data() : nullptr;
  t.device = device;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = ndim ? ctx->shape.data() : nullptr;
  t.strides = nullptr;  // dense row-major
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = DeleteInputContext;
  *out = &ctx->managed;
  return absl::OkStatus();
}

absl::Status FromCapsule(const std::string& where, PyObject* item, size_t i,
                         Managed* m) {
  if (PyCapsule_IsValid(item, kCapsuleName)) {
    m->legacy = static_cast<DLManagedTensor*>(
        PyCapsule_GetPointer(item, kCapsuleName));
  } else if (PyCapsule_IsValid(item, kVersionedCapsuleName)) {
    auto* v = static_cast<DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(item, kVersionedCapsuleName));
    if (v != nullptr && v->version.major != 1) {
      return tensorflow::errors::InvalidArgument(
          where, ": output ", i, " is a DLPack capsule of major version ",
          v->version.major, "; this op reads version 1");
    }
    m->versioned = v;
  }
  if (*m) return absl::OkStatus();
  std::string what = Py_TYPE(item)->tp_name;
  if (PyCapsule_CheckExact(item)) {
    const char* cname = PyCapsule_GetName(item);
    what = absl::StrCat("capsule named '", cname ? cname : "", "'");
    PyErr_Clear();
  }
  return tensorflow::errors::InvalidArgument(
      where, ": output ", i, " from the torch callback is a ", what,
      ", not an unused DLPack capsule ('dltensor'); return "
      "torch.utils.dlpack.to_dlpack(tensor) for each output.");
}

void MarkCapsuleUsed(PyObject* capsule, const Managed& m) {
  PyCapsule_SetName(capsule,
                    m.legacy ? kUsedCapsuleName : kUsedVersionedCapsuleName);
}

absl::Status AdoptAsOutput(tensorflow::OpKernelContext* ctx, int index,
                           tensorflow::DataType dtype, Managed* m) {
  const DLTensor& t = m->tensor();
  tensorflow::TensorShape shape;
  for (int32_t d = 0; d < t.ndim; ++d) shape.AddDim(t.shape[d]);
  if (shape.num_elements() == 0) {
    // Nothing to share: TF makes its own empty tensor.
    m->DeleteFromAnyThread();
    tensorflow::Tensor* out = nullptr;
    return ctx->allocate_output(index, shape, &out);
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  const size_t bytes =
      shape.num_elements() * tensorflow::DataTypeSize(dtype);
  const bool on_host = t.device.device_type != kDLCUDA;
  tensorflow::core::RefCountPtr<tensorflow::TensorBuffer> buffer(
      new DLPackBuffer(data, bytes, *m, on_host));
  *m = Managed();  // the buffer owns it now
  ctx->set_output(index, tensorflow::Tensor(dtype, shape, std::move(buffer)));
  return absl::OkStatus();
}

}  // namespace torchbridge
