// The kernels of TorchbridgeCall (registered in torchbridge_op.cc): each call
//   1. wraps every input as a DLPack tensor holding a reference on the TF
//      buffer (adopted_buffer.h), and, with the GIL, hands Python torch
//      tensors (torch_interop.h) or DLPack capsules;
//   2. calls the registered Python callable: directly on the CPU kernel of a
//      torch_tensors op, else through torchbridge._native._loader._dispatch, with
//      the indices of the outputs nothing in the graph consumes (Python may
//      return None there) and on a GPU TF's CUDA stream and device index
//      (or, on the CPU, a C++ callback with no GIL: native_callback.h);
//   3. checks every output (dlpack_check.h) and adopts it as a TF buffer
//      without a copy; an output TF cannot adopt as it is goes to Python's
//      _export_output (one counted copy, or the error that says why not).
// Every failure is a TF error: a bad output never aborts the process, and a
// Python exception comes back with its type, message and traceback.
//
// The CPU kernel's work runs on the torch thread (torch_thread.h) while TF's
// thread waits; the GPU kernel's stays on TF's thread, which holds TF's CUDA
// stream.

#include <Python.h>  // first, as Python asks

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <cstring>
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
#include "tensorflow/core/platform/denormal.h"
#include "torch_thread.h"

#if TORCHBRIDGE_GPU
#include "xla/stream_executor/stream.h"
#endif

#ifndef TORCHBRIDGE_TORCH_INTEROP
#define TORCHBRIDGE_TORCH_INTEROP 0
#endif
#if TORCHBRIDGE_TORCH_INTEROP
#include "torch_interop.h"
#endif

namespace torchbridge {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
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

// What one TorchbridgeCall op calls and how its outputs are checked, apart
// from TF's OpKernel: the kernels below, and the host calls of the XLA
// custom call (csrc/xla/, through torchbridge_host_call), run the same
// callback the same way.
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

template <bool kGpu>
class TorchbridgeCallOp : public OpKernel, private CallCore<kGpu> {
  using Core = CallCore<kGpu>;
  using Core::callback_id_;
  using Core::Device;
  using Core::name_;
  using Core::out_shapes_;
  using Core::out_types_;
  using Core::torch_tensors_;
  using Core::whole_outputs_;

 public:
  explicit TorchbridgeCallOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    name_ = name();
    OP_REQUIRES_OK(ctx, ctx->GetAttr("callback_id", &callback_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &out_types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &out_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("torch_tensors", &torch_tensors_));
    std::vector<int32_t> whole;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("whole_tensor_outputs", &whole));
    whole_outputs_.assign(out_types_.size(), false);
    for (int32_t i : whole) {
      OP_REQUIRES(ctx, i >= 0 && i < static_cast<int32_t>(out_types_.size()),
                  InvalidArgument("TorchbridgeCall: whole_tensor_outputs "
                                  "index ", i, " out of range for ",
                                  out_types_.size(), " outputs"));
      whole_outputs_[i] = true;
    }
    OP_REQUIRES(ctx, !torch_tensors_ || TORCHBRIDGE_TORCH_INTEROP,
                tensorflow::errors::Unimplemented(
                    "TorchbridgeCall: torch_tensors=True needs a library "
                    "built with torch_interop.cc"));
    OP_REQUIRES(ctx,
                out_shapes_.empty() || out_shapes_.size() == out_types_.size(),
                InvalidArgument("TorchbridgeCall: ", out_shapes_.size(),
                                " output_shapes for ", out_types_.size(),
                                " outputs"));
    for (DataType dt : out_types_) {
      DLDataType unused;
      OP_REQUIRES(ctx, ToDLDataType(dt, &unused),
                  InvalidArgument("TorchbridgeCall: output dtype ",
                                  tensorflow::DataTypeString(dt),
                                  " cannot come from torch through DLPack"));
    }
  }


  // Run inline by the executor rather than handed to another thread: the
  // thread that waits on the graph (and gave up the GIL to do so) then often
  // runs the op itself, with no thread switch.
  bool IsExpensive() override { return false; }

  // The CPU kernel hands the call to the torch thread and waits, so the
  // executor goes on inline on this thread afterwards (an asynchronous
  // kernel's successors are handed to TF's pool instead: one more thread hop
  // per call, measured ~50 us here). CUDA kernels do not use torch's OpenMP
  // teams, so the GPU kernel's calls stay here.
  void Compute(OpKernelContext* ctx) override {
    timeline::Span kernel(timeline::kKernel);
    TorchThread& thread = TorchThread::Get();
    if (kGpu || !thread.enabled() || thread.OnThisThread()) {
      Run(ctx);
      return;
    }
    timeline::Span wait(timeline::kWaitTorchThread);
    thread.Run([this, ctx] {
      timeline::Span run(timeline::kTorchThreadRun);
      Run(ctx);
    });
  }

 private:
  // Errors go to ctx->SetStatus (TF's OP_REQUIRES macros are for Compute's
  // own thread).
  void Run(OpKernelContext* ctx) {
    if (!Py_IsInitialized()) {
      ctx->SetStatus(tensorflow::errors::FailedPrecondition(
          "TorchbridgeCall needs a running Python interpreter"));
      return;
    }
    CallContext call{ctx};
    if (kGpu) {
#if TORCHBRIDGE_GPU
      auto* device_context = ctx->op_device_context();
      if (!device_context || !device_context->stream()) {
        ctx->SetStatus(tensorflow::errors::Internal(
            "TorchbridgeCall: no GPU stream for this op"));
        return;
      }
      call.stream = device_context->stream()->platform_specific_handle().stream;
      call.device_id = ctx->device()->parsed_name().id;
#endif
    }
    const int num_outputs = static_cast<int>(out_types_.size());
    for (int i = 0; i < num_outputs; ++i) {
      call.required.push_back(ctx->output_required(i));
    }

    // The inputs as DLPack tensors (no GIL needed yet).
    std::vector<DLManagedTensor*> inputs(ctx->num_inputs(), nullptr);
    absl::Status status;
    timeline::Span wrap(timeline::kWrapInputs);
    for (int i = 0; i < ctx->num_inputs() && status.ok(); ++i) {
      status = WrapInput(ctx->input(i), Device(call, i, /*output=*/false), i,
                         &inputs[i]);
    }
    wrap.Stop();
    std::vector<Managed> outputs(num_outputs);
    // Torch's default, not TF's: subnormal floats are kept (TF's threads
    // flush them to zero; on the torch thread this is already so).
    tensorflow::port::ScopedDontFlushDenormal keep_subnormals;
    if (!status.ok()) {
      for (DLManagedTensor* m : inputs) {
        if (m) m->deleter(m);  // a reference on a TF buffer: no GIL needed
      }
    } else {
      status = Core::RunCallback(call, &inputs, &outputs);
    }
    timeline::Span adopt(timeline::kAdoptOutputs);
    for (int i = 0; i < num_outputs && status.ok(); ++i) {
      if (outputs[i]) {  // else an unused output Python left out (None)
        status = AdoptAsOutput(ctx, i, out_types_[i], &outputs[i]);
      }
    }
    for (Managed& m : outputs) m.DeleteFromAnyThread();  // after a failure
    if (!status.ok()) ctx->SetStatus(status);
  }
};

// Copies made by host calls (torchbridge_host_call): results written into
// XLA's buffers, and inputs copied out of them.
std::atomic<int64_t> g_host_copies{0};
std::atomic<int64_t> g_host_bytes{0};

// The TF dtype of a DLPack dtype (the ones adopt_rules.h lets cross).
bool FromDLDataType(const DLDataType& dl, DataType* out) {
  static const DataType kTypes[] = {
      tensorflow::DT_FLOAT,     tensorflow::DT_DOUBLE,   tensorflow::DT_HALF,
      tensorflow::DT_BFLOAT16,  tensorflow::DT_INT8,     tensorflow::DT_INT16,
      tensorflow::DT_INT32,     tensorflow::DT_INT64,    tensorflow::DT_UINT8,
      tensorflow::DT_UINT16,    tensorflow::DT_UINT32,   tensorflow::DT_UINT64,
      tensorflow::DT_BOOL,      tensorflow::DT_COMPLEX64,
      tensorflow::DT_COMPLEX128};
  for (DataType dt : kTypes) {
    DLDataType t;
    if (ToDLDataType(dt, &t) && t.code == dl.code && t.bits == dl.bits &&
        t.lanes == dl.lanes) {
      *out = dt;
      return true;
    }
  }
  return false;
}

// An owned, 64-byte-aligned copy of a lent DLPack tensor.
struct OwnedCopy {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
  void* memory = nullptr;
};

void DeleteOwnedCopy(DLManagedTensor* m) {
  auto* copy = static_cast<OwnedCopy*>(m->manager_ctx);
  std::free(copy->memory);
  delete copy;
}

// Replaces each of `inputs` (dense row-major) by an owned copy (counted).
absl::Status CopyInputs(std::vector<DLManagedTensor*>* inputs) {
  absl::Status status;
  for (DLManagedTensor*& m : *inputs) {
    if (!status.ok()) continue;
    const DLTensor& t = m->dl_tensor;
    int64_t bytes = (t.dtype.bits * t.dtype.lanes + 7) / 8;
    for (int32_t d = 0; d < t.ndim; ++d) bytes *= t.shape[d];
    auto copy = std::make_unique<OwnedCopy>();
    copy->shape.assign(t.shape, t.shape + t.ndim);
    const size_t rounded =
        (static_cast<size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
    copy->memory = std::aligned_alloc(kAlignment, rounded ? rounded : kAlignment);
    if (copy->memory == nullptr) {
      status = tensorflow::errors::ResourceExhausted(
          "TorchbridgeCall under XLA: out of memory copying an input");
      continue;
    }
    if (bytes) {
      std::memcpy(copy->memory,
                  static_cast<const char*>(t.data) + t.byte_offset,
                  static_cast<size_t>(bytes));
    }
    copy->managed.dl_tensor = t;
    copy->managed.dl_tensor.data = copy->memory;
    copy->managed.dl_tensor.byte_offset = 0;
    copy->managed.dl_tensor.strides = nullptr;
    copy->managed.dl_tensor.shape = copy->shape.data();
    copy->managed.manager_ctx = copy.get();
    copy->managed.deleter = DeleteOwnedCopy;
    m->deleter(m);
    m = &copy.release()->managed;
    g_host_copies.fetch_add(1, std::memory_order_relaxed);
    g_host_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (!status.ok()) {
    for (DLManagedTensor* m : *inputs) m->deleter(m);
    inputs->clear();
  }
  return status;
}

// One host call (see torchbridge_host_call): the callback run as the CPU
// kernel runs it, each output then copied into `results`.
absl::Status HostCall(const std::string& name, int64_t callback_id,
                      bool torch_tensors, bool inputs_copied,
                      std::vector<DLManagedTensor*>* inputs,
                      DLTensor* results, int64_t num_results) {
  std::vector<DataType> types(num_results);
  std::vector<PartialTensorShape> shapes(num_results);
  absl::Status status;
  for (int64_t i = 0; i < num_results && status.ok(); ++i) {
    if (!FromDLDataType(results[i].dtype, &types[i])) {
      status = InvalidArgument("TorchbridgeCall '", name, "' under XLA: result ",
                               i, " has dtype ",
                               DLDataTypeString(results[i].dtype),
                               ", which torch has none for");
      break;
    }
    status = PartialTensorShape::BuildPartialTensorShape(
        absl::Span<const int64_t>(results[i].shape, results[i].ndim),
        &shapes[i]);
  }
  if (!status.ok()) {
    for (DLManagedTensor* m : *inputs) m->deleter(m);
    return status;
  }
  CallCore<false> core(name, callback_id, torch_tensors, std::move(types),
                       std::move(shapes));
  CallContext call{nullptr};
  call.required.assign(num_results, true);  // XLA does not say
  // The inputs are XLA's buffers, lent for the call only. Torch tensors over
  // them are detached after the call if torch still holds them; a C++
  // callback (or a library without torch's side) gets copies instead.
  std::vector<void*> lent;
  NativeCallbackEntry native;
  const bool track = torch_tensors && TORCHBRIDGE_TORCH_INTEROP &&
                     !FindNativeCallback(callback_id, &native);
  if (inputs_copied) {
    // owned by the caller's copies already
  } else if (track) {
    core.set_lent_tokens(&lent);
  } else {
    status = CopyInputs(inputs);
  }
  std::vector<Managed> outputs(num_results);
  if (status.ok()) status = core.RunCallback(call, inputs, &outputs);
  for (int64_t i = 0; i < num_results && status.ok(); ++i) {
    const DLTensor& from = outputs[i].tensor();
    int64_t bytes = (from.dtype.bits * from.dtype.lanes + 7) / 8;
    for (int32_t d = 0; d < from.ndim; ++d) bytes *= from.shape[d];
    if (bytes > 0) {
      std::memcpy(results[i].data,
                  static_cast<const char*>(from.data) + from.byte_offset,
                  static_cast<size_t>(bytes));
    }
    g_host_copies.fetch_add(1, std::memory_order_relaxed);
    g_host_bytes.fetch_add(bytes, std::memory_order_relaxed);
    // Checked and counted as adoptable as it is, but copied here.
    if (outputs[i].exported) {
      g_zero_copy_count.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  for (Managed& m : outputs) m.DeleteFromAnyThread();
#if TORCHBRIDGE_TORCH_INTEROP
  // After the outputs (which may view an input) are gone.
  for (void* token : lent) {
    const int64_t copied = torch_interop::DetachIfEscaped(token);
    if (copied > 0) {
      g_host_copies.fetch_add(1, std::memory_order_relaxed);
      g_host_bytes.fetch_add(copied, std::memory_order_relaxed);
      g_zero_copy_count.fetch_sub(1, std::memory_order_relaxed);
    } else if (copied < 0 && status.ok()) {
      status = tensorflow::errors::ResourceExhausted(
          "TorchbridgeCall '", name, "' under XLA: out of memory copying an "
          "input that torch keeps beyond the call");
    }
  }
#endif
  for (Managed& m : outputs) m.DeleteFromAnyThread();
  return status;
}

}  // namespace

extern "C" {

// The entry point of the XLA custom call's host handler (csrc/xla/, which
// gets its address from the loader): runs callback `callback_id` on
// `num_inputs` DLPack tensors (taken over, also on failure) as the CPU kernel
// would, on the torch thread, and copies its outputs into `results` (XLA's
// result buffers: dtype and shape as declared, dense row-major). The
// inputs are XLA's buffers, lent for the call: torch tensors over them that
// torch keeps beyond it get a copy of their own (counted). `inputs_copied`:
// the caller copied them already. Returns 0,
// or a TF error code with the message in `error` (NUL-terminated).
int torchbridge_host_call(const char* name, int64_t callback_id,
                          int torch_tensors, DLManagedTensor** inputs,
                          int64_t num_inputs, DLTensor* results,
                          int64_t num_results, int inputs_copied,
                          char* error, int64_t error_size) {
  std::vector<DLManagedTensor*> ins(inputs, inputs + num_inputs);
  absl::Status status;
  if (!Py_IsInitialized()) {
    for (DLManagedTensor* m : ins) m->deleter(m);
    status = tensorflow::errors::FailedPrecondition(
        "TorchbridgeCall needs a running Python interpreter");
  } else {
    auto run = [&] {
      tensorflow::port::ScopedDontFlushDenormal keep_subnormals;
      status = HostCall(name ? name : "?", callback_id, torch_tensors != 0,
                        inputs_copied != 0, &ins, results, num_results);
    };
    timeline::Span kernel(timeline::kKernel);
    TorchThread& thread = TorchThread::Get();
    if (!thread.enabled() || thread.OnThisThread()) {
      run();
    } else {
      timeline::Span wait(timeline::kWaitTorchThread);
      thread.Run([&] {
        timeline::Span on_thread(timeline::kTorchThreadRun);
        run();
      });
    }
  }
  if (status.ok()) return 0;
  if (error && error_size > 0) {
    std::string text(status.message());
    std::snprintf(error, static_cast<size_t>(error_size), "%s", text.c_str());
  }
  return static_cast<int>(status.code());
}

// Copies host calls made: {results and inputs copied, bytes}.
void torchbridge_host_copies(int64_t* counts) {
  counts[0] = g_host_copies.load(std::memory_order_relaxed);
  counts[1] = g_host_bytes.load(std::memory_order_relaxed);
}


}  // extern "C"

REGISTER_KERNEL_BUILDER(Name("TorchbridgeCall").Device(tensorflow::DEVICE_CPU),
                        TorchbridgeCallOp<false>);

#if TORCHBRIDGE_GPU
// Inputs and outputs stay in GPU memory (int32, which TF keeps in host memory
// on GPUs, travels as CPU tensors); the callback gets TF's CUDA stream for
// this op and must queue its work on it (torch.cuda.ExternalStream).
REGISTER_KERNEL_BUILDER(Name("TorchbridgeCall").Device(tensorflow::DEVICE_GPU),
                        TorchbridgeCallOp<true>);
#endif

}  // namespace torchbridge
