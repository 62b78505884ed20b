// What one TorchbridgeCall call runs, apart from TF's OpKernel: the
// callback (a C++ one without the GIL, else Python), the inputs handed over
// as torch tensors or capsules, and every output checked before it is
// taken. The kernels (torchbridge_kernel.cc) and the XLA custom call's host
// calls (host_call.cc) run it.

#ifndef TORCHBRIDGE_CSRC_CALL_CORE_H_
#define TORCHBRIDGE_CSRC_CALL_CORE_H_

#include <Python.h>  // first, as Python asks

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adopted_buffer.h"
#include "dlpack_check.h"
#include "native_callback.h"
#include "python_util.h"
#include "timeline.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

#ifndef TORCHBRIDGE_TORCH_INTEROP
#define TORCHBRIDGE_TORCH_INTEROP 0
#endif
#if TORCHBRIDGE_TORCH_INTEROP
#include "torch_interop.h"
#endif

namespace torchbridge {
namespace call_core {

using ::tensorflow::DataType;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::errors::InvalidArgument;

// Where one call's outputs go: device per output, and which are consumed.
struct CallContext {
  OpKernelContext* ctx;
  void* stream = nullptr;  // TF's CUDA stream (the GPU kernel)
  int device_id = 0;
  std::vector<bool> required;
};

// One TorchbridgeCall op's attributes and its call.
template <bool kGpu>
class CallCore {
 public:
  CallCore() = default;
  CallCore(std::string name, int64_t callback_id, bool torch_tensors,
           std::vector<DataType> out_types,
           std::vector<PartialTensorShape> out_shapes)
      : name_(std::move(name)),
        callback_id_(callback_id),
        torch_tensors_(torch_tensors),
        whole_outputs_(out_types.size(), false),
        out_types_(std::move(out_types)),
        out_shapes_(std::move(out_shapes)) {}

  // Runs the callback on `inputs` (taken over): a C++ callback without the
  // GIL where one is registered (CPU), else Python. Fills `outputs` only if
  // every output passes its checks.
  absl::Status RunCallback(const CallContext& call,
                           std::vector<DLManagedTensor*>* inputs,
                           std::vector<Managed>* outputs) {
    if (NativeCallbackEntry native;
        !kGpu && FindNativeCallback(callback_id_, &native)) {
      timeline::Span callback(timeline::kNativeCallback);  // no GIL, no Python
      return RunNativeCallback(native, Where(), call.required, out_types_,
                               out_shapes_, inputs, outputs);
    }
    timeline::Span gil_wait(timeline::kAcquireGil);
    GilLock gil;
    gil_wait.Stop();
    timeline::Span callback(timeline::kCallback);
    return CallPython(call, inputs, outputs);
  }

  const std::vector<DataType>& out_types() const { return out_types_; }
  void set_lent_tokens(std::vector<void*>* tokens) { lent_tokens_ = tokens; }

 protected:
  DLDevice Device(const CallContext& call, int i, bool output) const {
    if (call.ctx == nullptr) return DLDevice{kDLCPU, 0};  // a host call
    const auto memory = output ? call.ctx->output_memory_type(i)
                               : call.ctx->input_memory_type(i);
    if (kGpu && memory != tensorflow::HOST_MEMORY) {
      return DLDevice{kDLCUDA, call.device_id};
    }
    return DLDevice{kDLCPU, 0};
  }

  std::string Where() const {
    return absl::StrCat("TorchbridgeCall '", name_, "'");
  }

  // The inputs as a Python list (each takes over its DLPack tensor, also on
  // failure). Needs the GIL.
  PyRef InputList(std::vector<DLManagedTensor*>* inputs) const {
    PyRef args(PyList_New(static_cast<Py_ssize_t>(inputs->size())));
    for (size_t i = 0; i < inputs->size(); ++i) {
      DLManagedTensor* m = (*inputs)[i];
      if (!args) {
        m->deleter(m);
        continue;
      }
      PyObject* arg;
#if TORCHBRIDGE_TORCH_INTEROP
      if (torch_tensors_ && lent_tokens_ != nullptr) {
        void* token = nullptr;
        arg = torch_interop::TensorFromLentDLPack(m, &token);  // owns m
        if (token) lent_tokens_->push_back(token);
      } else if (torch_tensors_) {
        arg = torch_interop::TensorFromDLPack(m);  // owns m, also on failure
      } else
#endif
      {
        arg = PyCapsule_New(m, kCapsuleName, InputCapsuleDestructor);
        if (arg == nullptr) m->deleter(m);
      }
      if (arg == nullptr) {
        args = PyRef();
        continue;
      }
      PyList_SET_ITEM(args.get(), i, arg);  // steals the reference
    }
    if (args && torch_tensors_) {
      g_zero_copy_count.fetch_add(static_cast<int64_t>(inputs->size()),
                                  std::memory_order_relaxed);
    }
    inputs->clear();
    return args;
  }

  // Runs the Python callback. Needs the GIL. Fills `outputs` only if every
  // output passes its checks.
  absl::Status CallPython(const CallContext& call,
                          std::vector<DLManagedTensor*>* inputs,
                          std::vector<Managed>* outputs) {
    const PythonHooks* hooks = nullptr;
    absl::Status status = GetPythonHooks(&hooks);
    if (!status.ok()) {
      for (DLManagedTensor* m : *inputs) m->deleter(m);
      return status;
    }
    PyRef args = InputList(inputs);
    PyRef id(PyLong_FromLongLong(callback_id_));
    PyRef unused = UnusedIndices(call.required);
    if (!args || !id || !unused) return PythonErrorToStatus(Where());
    PyRef result;
    PyObject* callback = nullptr;
    if (torch_tensors_ && !kGpu) {
      // The CPU kernel of a torch_tensors op calls the callable directly.
      callback = PyDict_GetItemWithError(hooks->registry, id.get());
      if (callback == nullptr && PyErr_Occurred()) {
        return PythonErrorToStatus(Where());
      }
    }
    if (callback != nullptr) {
      PyRef keep = PyRef::Borrow(callback);  // the registry may drop it
      result = PyRef(PyObject_CallFunctionObjArgs(callback, args.get(),
                                                  unused.get(), nullptr));
    } else if (!kGpu) {
      // _dispatch raises the error that says why one is not registered.
      result = PyRef(PyObject_CallFunctionObjArgs(
          hooks->dispatch, id.get(), args.get(), unused.get(), nullptr));
    } else {
      PyRef stream(PyLong_FromUnsignedLongLong(
          reinterpret_cast<uintptr_t>(call.stream)));
      PyRef device(PyLong_FromLong(call.device_id));
      if (stream && device) {
        result = PyRef(PyObject_CallFunctionObjArgs(
            hooks->dispatch, id.get(), args.get(), unused.get(), stream.get(),
            device.get(), torch_tensors_ ? Py_True : Py_False, nullptr));
      }
    }
    if (!result) return PythonErrorToStatus(Where());
    // Unconsumed capsules release their tensors when `result` goes.
    return TakeOutputs(call, *hooks, result.get(), outputs);
  }

  // Checks every output of `result` and, only if all pass, takes each
  // one's DLPack tensor into `outputs`.
  absl::Status TakeOutputs(const CallContext& call, const PythonHooks& hooks,
                           PyObject* result, std::vector<Managed>* outputs) {
    const size_t n = out_types_.size();
    if (result == Py_None && n == 0) return absl::OkStatus();
    if (!PyList_Check(result) && !PyTuple_Check(result)) {
      return InvalidArgument(
          Where(), ": the torch callback must return a list of ",
          torch_tensors_ ? "torch tensors" : "DLPack capsules", ", got ",
          Py_TYPE(result)->tp_name);
    }
    const Py_ssize_t got = PySequence_Fast_GET_SIZE(result);
    if (static_cast<size_t>(got) != n) {
      return InvalidArgument(
          Where(), ": the torch callback returned ", got, " tensors, but ", n,
          " outputs were declared (Tout) when the graph was built. The torch "
          "code must return the same structure on every call.");
    }
    std::vector<PyRef> capsules(n);
    std::vector<Managed> taken(n);
    absl::Status status;
    PyObject** items = PySequence_Fast_ITEMS(result);
    for (size_t i = 0; i < n && status.ok(); ++i) {
      status = CollectOutput(call, hooks, items[i], i, &capsules[i], &taken);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!status.ok()) {
        // Capsules keep their tensors and release them when Python drops
        // them; exported ones are released here.
        if (taken[i].exported) taken[i].DeleteNow();
        continue;
      }
      if (!taken[i]) continue;  // None for an unused output
      if (capsules[i]) MarkCapsuleUsed(capsules[i].get(), taken[i]);
      (*outputs)[i] = taken[i];
    }
    return status;
  }

  // Finds output i's DLPack tensor (taking nothing from a capsule yet) and
  // checks it.
  absl::Status CollectOutput(const CallContext& call, const PythonHooks& hooks,
                             PyObject* item, size_t i, PyRef* capsule,
                             std::vector<Managed>* taken) const {
    if (item == Py_None && !call.required[i]) return absl::OkStatus();
    const DLDevice device = Device(call, static_cast<int>(i), /*output=*/true);
    Managed& m = (*taken)[i];
#if TORCHBRIDGE_TORCH_INTEROP
    if (torch_tensors_ && !PyCapsule_CheckExact(item)) {
      m.legacy = torch_interop::ExportAsIs(item, device.device_type,
                                           device.device_id, whole_outputs_[i]);
      if (m.legacy != nullptr) {
        // Releasing a whole tensor may free its Python object.
        m.gil_free = !whole_outputs_[i];
        m.exported = true;
        g_zero_copy_count.fetch_add(1, std::memory_order_relaxed);
      } else {
        // Anything else: Python makes a capsule TF can adopt (one counted
        // copy), or raises the error that explains why not.
        PyRef index(PyLong_FromSize_t(i));
        PyRef gpu(device.device_type == kDLCUDA ? PyLong_FromLong(device.device_id)
                                                : Py_NewRef(Py_None));
        if (index && gpu) {
          *capsule = PyRef(PyObject_CallFunctionObjArgs(
              hooks.export_output, item, index.get(), gpu.get(), nullptr));
        }
        if (!*capsule) return PythonErrorToStatus(Where());
        item = capsule->get();
      }
    }
#endif
    if (!m) {
      *capsule = PyRef::Borrow(item);
      TF_RETURN_IF_ERROR(FromCapsule(Where(), item, i, &m));
    }
    for (size_t j = 0; j < i; ++j) {
      if ((*taken)[j] && (*taken)[j].legacy == m.legacy &&
          (*taken)[j].versioned == m.versioned) {
        return InvalidArgument(
            Where(), ": outputs ", j, " and ", i, " from the torch callback "
            "are the same DLPack capsule; each output needs its own (call "
            "torch.utils.dlpack.to_dlpack once per output).");
      }
    }
    const bool check_shape = !out_shapes_.empty();
    return CheckAdoptable(Where(), i, m.tensor(), out_types_[i], check_shape,
                          check_shape ? out_shapes_[i] : PartialTensorShape(),
                          device);
  }

  std::string name_;
  // A host call's inputs are lent (XLA's buffers): each torch tensor's
  // storage is tracked here, to be detached from them after the call
  // (torch_interop::DetachIfEscaped).
  std::vector<void*>* lent_tokens_ = nullptr;
  int64_t callback_id_ = 0;
  // Python gets torch tensors and may return torch tensors (torch_interop),
  // instead of DLPack capsules both ways.
  bool torch_tensors_ = false;
  // Per output: TF holds the torch tensor itself (its Python object lives as
  // long as TF's buffer), not only its memory.
  std::vector<bool> whole_outputs_;
  std::vector<DataType> out_types_;
  std::vector<PartialTensorShape> out_shapes_;};

}  // namespace call_core

using call_core::CallContext;
using call_core::CallCore;

}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_CALL_CORE_H_
