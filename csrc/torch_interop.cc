// torch's side of the native op: TF buffers become torch tensors, and torch
// tensors become TF buffers, in C++ (see torch_interop.h).
//
// Through Python's DLPack functions, each crossing costs a capsule, a
// Python-level call, and at release a detour through the tensor's Python
// object (torch keeps an exported tensor's Python object alive, so freeing
// the TF buffer later has to take the GIL and free that object too). Here an
// input becomes a torch.Tensor in one C++ call, and an output that TF can
// use as it is hands TF its storage only: torch's Python object dies with
// the callback, and releasing the TF buffer is a reference-count decrement
// on the storage.
//
// Compiled on its own, with torch's headers (torch.utils.cpp_extension's
// include paths) and the standard they require (-std=c++20 since torch
// 2.14), and none of TF's; linked against torch's libraries. The builder
// (torchbridge/_native/_build.py) builds without this file when that fails,
// and says why.

#include "torch_interop.h"

#include "adopt_rules.h"

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <cstring>
#include <exception>
#include <vector>

namespace torchbridge {
namespace torch_interop {
namespace {



// Owns what an exported DLManagedTensor points into: the storage (and the
// tensor only when asked: torch would then keep its Python object alive)
// and the shape.
struct ExportContext {
  c10::Storage storage;
  at::Tensor tensor;
  std::vector<int64_t> shape;
  DLManagedTensor managed;
};

void DeleteExportContext(DLManagedTensor* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
}

void SetPythonError(const char* what) {
  PyErr_SetString(PyExc_RuntimeError, what);
}

}  // namespace

PyObject* TensorFromDLPack(DLManagedTensor* managed) {
  try {
    // at::fromDLPack owns `managed` from here on, also when it throws.
    at::Tensor tensor = at::fromDLPack(managed);
    if (tensor.is_cuda()) torch::utils::device_lazy_init(at::kCUDA);
    return THPVariable_Wrap(std::move(tensor));
  } catch (const c10::Error& err) {
    SetPythonError(err.what_without_backtrace());
  } catch (const std::exception& err) {
    SetPythonError(err.what());
  }
  return nullptr;
}

PyObject* TensorFromLentDLPack(DLManagedTensor* managed, void** token) {
  *token = nullptr;
  try {
    at::Tensor tensor = at::fromDLPack(managed);
    *token = new c10::weak_intrusive_ptr<c10::StorageImpl>(
        tensor.storage().getWeakStorageImpl());
    return THPVariable_Wrap(std::move(tensor));
  } catch (const c10::Error& err) {
    SetPythonError(err.what_without_backtrace());
  } catch (const std::exception& err) {
    SetPythonError(err.what());
  }
  return nullptr;
}

int64_t DetachIfEscaped(void* token) {
  if (token == nullptr) return 0;
  auto* weak = static_cast<c10::weak_intrusive_ptr<c10::StorageImpl>*>(token);
  c10::intrusive_ptr<c10::StorageImpl> storage = weak->lock();
  delete weak;
  if (!storage) return 0;
  try {
    const size_t bytes = storage->nbytes();
    at::DataPtr copy = c10::GetCPUAllocator()->allocate(bytes);
    if (bytes) std::memcpy(copy.get(), storage->data(), bytes);
    // Drops the lent memory's DataPtr (its DLPack deleter runs).
    storage->set_data_ptr_noswap(std::move(copy));
    return static_cast<int64_t>(bytes);
  } catch (...) {
    return -1;
  }
}

DLManagedTensor* ExportAsIs(PyObject* object, int device_type, int device_id,
                            bool whole_tensor) {
  if (!THPVariable_CheckExact(object)) return nullptr;
  try {
    const at::Tensor& t = THPVariable_Unpack(object);
    if (!t.defined() || !t.has_storage()) return nullptr;
    const at::Device device = t.device();
    const bool device_ok =
        (device_type == kDLCPU && device.is_cpu()) ||
        (device_type == kDLCUDA && device.is_cuda() &&
         device.index() == device_id);
    if (!device_ok) return nullptr;
    const bool strided = t.layout() == at::kStrided;
    const int64_t numel = strided ? t.numel() : 0;
    void* data = strided && numel ? t.data_ptr() : nullptr;
    if (!CanAdoptAsIs(strided, t.is_quantized(), t.is_conj() || t.is_neg(),
                      strided && t.is_contiguous(),
                      reinterpret_cast<uintptr_t>(data), numel)) {
      return nullptr;
    }
    DLDataType dtype = at::getDLDataType(t);  // throws for dtypes it lacks

    auto* ctx = new ExportContext{t.storage(),
                                  whole_tensor ? t : at::Tensor(),
                                  t.sizes().vec(), {}};
    DLTensor& dl = ctx->managed.dl_tensor;
    dl.data = data;
    dl.device = DLDevice{static_cast<DLDeviceType>(device_type),
                         device_type == kDLCUDA ? device_id : 0};
    dl.ndim = static_cast<int32_t>(ctx->shape.size());
    dl.dtype = dtype;
    dl.shape = ctx->shape.empty() ? nullptr : ctx->shape.data();
    dl.strides = nullptr;  // dense row-major, checked above
    dl.byte_offset = 0;
    ctx->managed.manager_ctx = ctx;
    ctx->managed.deleter = DeleteExportContext;
    return &ctx->managed;
  } catch (...) {
    // Anything unusual (a dtype DLPack lacks, a tensor without data) takes
    // the Python-side route, which raises the error that explains it.
    return nullptr;
  }
}

}  // namespace torch_interop
}  // namespace torchbridge
