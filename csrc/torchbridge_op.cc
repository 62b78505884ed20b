// TorchbridgeCall: a TensorFlow op whose kernel calls back into Python (torch)
// and exchanges tensors with it through DLPack, without copies.
//
// The kernel (the CPU kernel's work runs on the torch thread of
// torch_thread.h while TF's thread waits)
//   1. wraps every input tensor as a DLPack capsule (named "dltensor") that
//      holds a reference on the TF buffer until the consumer calls its deleter;
//   2. takes the GIL, calls `torchbridge._native._dispatch(callback_id,
//      capsules, unused_outputs)` (on a GPU: `..., cuda_stream,
//      cuda_device)`), and releases the GIL again. `unused_outputs` is None,
//      or a tuple of the indices of the outputs that nothing in the graph
//      consumes (the executor knows: OpKernelContext::output_required);
//      Python may return None for those, and the op then produces nothing
//      there;
//   3. checks the returned capsules (count, dtype, shape, device, alignment,
//      layout) and adopts each as an output through a TensorBuffer that owns
//      the DLManagedTensor and calls its deleter when TF frees the buffer.
// Every failure is a TF error: a bad output never aborts the process, and a
// Python exception comes back with its type, message and traceback.
//
// The registry of Python callables lives in Python (torchbridge/_native.py);
// the only Python object this file keeps is the dispatcher function, cached
// under the GIL.
//
// Build: torchbridge/_native.py compiles this file on first use, with the
// flags of the installed TensorFlow (tf.sysconfig) and the Python headers.
// The GPU kernel is compiled only with -DTORCHBRIDGE_GPU=1 (set by the loader
// when TensorFlow was built with CUDA); it needs no CUDA headers.

#include <Python.h>  // first, as Python asks

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

#if TORCHBRIDGE_GPU
#include "xla/stream_executor/stream.h"
#endif

#include "torch_thread.h"

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

#ifndef TORCHBRIDGE_TORCH_INTEROP
#define TORCHBRIDGE_TORCH_INTEROP 0
#endif
#if TORCHBRIDGE_TORCH_INTEROP
#include "torch_interop.h"
#endif

// How many tensors crossed without a copy through torch_interop (inputs
// handed to Python as torch tensors, outputs adopted as they were);
// torchbridge.exchange_stats() adds it to its own count.
static std::atomic<int64_t> g_zero_copy_count{0};

extern "C" int64_t torchbridge_zero_copy_count() {
  return g_zero_copy_count.load(std::memory_order_relaxed);
}

// Whether this build hands torch tensors to Python itself (torch_interop).
extern "C" int torchbridge_has_torch_interop() {
  return TORCHBRIDGE_TORCH_INTEROP;
}

namespace torchbridge {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::DataTypeString;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorBuffer;
using ::tensorflow::TensorShape;

// TF's CPU kernels assume buffers aligned to EIGEN_MAX_ALIGN_BYTES (64).
constexpr uintptr_t kAlignment = 64;

constexpr char kCapsuleName[] = "dltensor";
constexpr char kUsedCapsuleName[] = "used_dltensor";
constexpr char kVersionedCapsuleName[] = "dltensor_versioned";
constexpr char kUsedVersionedCapsuleName[] = "used_dltensor_versioned";

// ---------------------------------------------------------------------------
// Dtypes

bool ToDLDataType(DataType dt, DLDataType* out) {
  uint8_t code;
  uint8_t bits;
  switch (dt) {
    case tensorflow::DT_HALF: code = kDLFloat; bits = 16; break;
    case tensorflow::DT_BFLOAT16: code = kDLBfloat; bits = 16; break;
    case tensorflow::DT_FLOAT: code = kDLFloat; bits = 32; break;
    case tensorflow::DT_DOUBLE: code = kDLFloat; bits = 64; break;
    case tensorflow::DT_INT8: code = kDLInt; bits = 8; break;
    case tensorflow::DT_INT16: code = kDLInt; bits = 16; break;
    case tensorflow::DT_INT32: code = kDLInt; bits = 32; break;
    case tensorflow::DT_INT64: code = kDLInt; bits = 64; break;
    case tensorflow::DT_UINT8: code = kDLUInt; bits = 8; break;
    case tensorflow::DT_UINT16: code = kDLUInt; bits = 16; break;
    case tensorflow::DT_UINT32: code = kDLUInt; bits = 32; break;
    case tensorflow::DT_UINT64: code = kDLUInt; bits = 64; break;
    case tensorflow::DT_BOOL: code = kDLBool; bits = 8; break;
    case tensorflow::DT_COMPLEX64: code = kDLComplex; bits = 64; break;
    case tensorflow::DT_COMPLEX128: code = kDLComplex; bits = 128; break;
    default: return false;
  }
  out->code = code;
  out->bits = bits;
  out->lanes = 1;
  return true;
}

bool DLDataTypeMatches(DataType dt, const DLDataType& got) {
  DLDataType want;
  if (!ToDLDataType(dt, &want)) return false;
  if (got.lanes != 1 || got.bits != want.bits) return false;
  if (got.code == want.code) return true;
  // Older producers export bool as uint8.
  return dt == tensorflow::DT_BOOL && got.code == kDLUInt;
}

std::string DLDataTypeString(const DLDataType& t) {
  const char* code;
  switch (t.code) {
    case kDLInt: code = "int"; break;
    case kDLUInt: code = "uint"; break;
    case kDLFloat: code = "float"; break;
    case kDLBfloat: code = "bfloat"; break;
    case kDLComplex: code = "complex"; break;
    case kDLBool: code = "bool"; break;
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

// ---------------------------------------------------------------------------
// GIL and deleters

// Whether Python is shutting down (then taking the GIL from another thread
// can block for ever or end the thread).
bool PythonFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Takes the GIL for a scope. On a thread Python did not create (TF's
// executor and thread-pool threads), the first GilLock makes a Python thread
// state and keeps it for the life of the thread, instead of making and
// destroying one on every call as a bare PyGILState_Ensure/Release pair
// does: a fresh thread state costs the callback several microseconds and
// runs it cold (empty frame stack, empty threading.local()s). Threads that
// Python made have a thread state already, which Python deletes when they
// end; those are left alone. The kept thread states of TF's threads are
// freed with the interpreter (TF's thread pools live as long as the
// process).
class GilLock {
 public:
  GilLock() {
    const bool foreign = PyGILState_GetThisThreadState() == nullptr;
    state_ = PyGILState_Ensure();
    if (foreign) PyGILState_Ensure();  // never released: the state stays
  }
  ~GilLock() { PyGILState_Release(state_); }
  GilLock(const GilLock&) = delete;
  GilLock& operator=(const GilLock&) = delete;

 private:
  PyGILState_STATE state_;
};

// An exported (producer-owned) DLPack tensor, legacy or versioned.
struct Managed {
  DLManagedTensor* legacy = nullptr;
  DLManagedTensorVersioned* versioned = nullptr;
  // Made by torch_interop::ExportAsIs: its deleter drops a torch storage,
  // which needs no GIL (torch takes it itself where a storage's memory
  // belongs to a Python object).
  bool gil_free = false;
  // Made by torch_interop::ExportAsIs (owned here from the start, rather
  // than taken from a capsule).
  bool exported = false;

  const DLTensor& tensor() const {
    return legacy ? legacy->dl_tensor : versioned->dl_tensor;
  }
  explicit operator bool() const { return legacy || versioned; }

  // Calls the producer's deleter. The caller holds the GIL or knows that
  // Python is not running.
  void DeleteNow() {
    if (legacy && legacy->deleter) legacy->deleter(legacy);
    if (versioned && versioned->deleter) versioned->deleter(versioned);
    legacy = nullptr;
    versioned = nullptr;
  }

  // Calls the deleter from any thread. Producers' deleters may touch Python
  // objects (torch's drops a tensor that may own a Python object), so the
  // GIL is taken while Python runs. During interpreter shutdown the tensor
  // is leaked instead: the process is ending, and taking the GIL then is
  // not safe.
  void DeleteFromAnyThread() {
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
};

// A TF buffer over memory owned by a DLPack producer (torch). TF sees it as
// memory it does not own, so it never reuses it in place for another op's
// output (torch may still hold the tensor, e.g. for a backward pass).
class DLPackBuffer : public TensorBuffer {
 public:
  DLPackBuffer(void* data, size_t size, Managed managed, bool on_host)
      : TensorBuffer(data), size_(size), managed_(managed), on_host_(on_host) {}
  ~DLPackBuffer() override { managed_.DeleteFromAnyThread(); }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(
      tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(size_));
    proto->set_allocated_bytes(static_cast<int64_t>(size_));
    proto->set_allocator_name("torchbridge_dlpack");
    proto->set_ptr(reinterpret_cast<uintptr_t>(data()));
  }
  bool OwnsMemory() const override { return false; }
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return on_host_ ? tsl::AllocatorMemoryType::kHostPageable
                    : tsl::AllocatorMemoryType::kDevice;
  }

 private:
  const size_t size_;
  Managed managed_;
  const bool on_host_;
};

// ---------------------------------------------------------------------------
// Inputs: TF tensor -> DLPack capsule

struct InputContext {
  Tensor tensor;  // holds a reference on the TF buffer
  std::vector<int64_t> shape;
  DLManagedTensor managed;
};

void DeleteInputContext(DLManagedTensor* self) {
  delete static_cast<InputContext*>(self->manager_ctx);
}

// Called when the capsule dies; the deleter runs only if no consumer took
// the tensor (a consumer renames the capsule and calls the deleter itself).
void InputCapsuleDestructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed && managed->deleter) managed->deleter(managed);
}

absl::Status WrapInput(const Tensor& tensor, DLDevice device, int index,
                       DLManagedTensor** out) {
  DLDataType dtype;
  if (!ToDLDataType(tensor.dtype(), &dtype)) {
    return tensorflow::errors::InvalidArgument(
        "input ", index, " has dtype ", DataTypeString(tensor.dtype()),
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

// ---------------------------------------------------------------------------
// Python errors -> TF errors

std::string PyObjectString(PyObject* obj) {
  if (obj == nullptr) return "";
  PyObject* str = PyObject_Str(obj);
  if (str == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  const char* utf8 = PyUnicode_AsUTF8(str);
  std::string result = utf8 ? utf8 : "<unprintable>";
  if (utf8 == nullptr) PyErr_Clear();
  Py_DECREF(str);
  return result;
}

// Formats the pending Python exception (and clears it) as a TF error with
// the exception's type, message and traceback. The error code follows
// tf.py_function's (TypeError/ValueError -> InvalidArgument, StopIteration ->
// OutOfRange, MemoryError -> ResourceExhausted, NotImplementedError ->
// Unimplemented, others -> Unknown); a tf.errors.OpError raised in Python
// keeps its own code.
absl::Status PythonErrorToStatus(const std::string& context) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  if (type == nullptr) {
    return tensorflow::errors::Unknown(context,
                                       ": failed without a Python error");
  }
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) {
    PyException_SetTraceback(value, traceback);
  }

  const char* type_name =
      PyType_Check(type) ? reinterpret_cast<PyTypeObject*>(type)->tp_name
                         : "exception";
  std::string message = PyObjectString(value);

  std::string formatted;
  PyObject* tb_module = PyImport_ImportModule("traceback");
  if (tb_module != nullptr) {
    PyObject* lines = PyObject_CallMethod(
        tb_module, "format_exception", "OOO", type,
        value ? value : Py_None, traceback ? traceback : Py_None);
    if (lines != nullptr) {
      PyObject* empty = PyUnicode_FromString("");
      PyObject* joined = empty ? PyUnicode_Join(empty, lines) : nullptr;
      if (joined != nullptr) formatted = PyObjectString(joined);
      Py_XDECREF(joined);
      Py_XDECREF(empty);
      Py_DECREF(lines);
    }
    Py_DECREF(tb_module);
  }
  PyErr_Clear();

  absl::StatusCode code = absl::StatusCode::kUnknown;
  if (PyErr_GivenExceptionMatches(type, PyExc_ValueError) ||
      PyErr_GivenExceptionMatches(type, PyExc_TypeError)) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (PyErr_GivenExceptionMatches(type, PyExc_StopIteration)) {
    code = absl::StatusCode::kOutOfRange;
  } else if (PyErr_GivenExceptionMatches(type, PyExc_MemoryError)) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (PyErr_GivenExceptionMatches(type, PyExc_NotImplementedError)) {
    code = absl::StatusCode::kUnimplemented;
  }
  if (value != nullptr && PyObject_HasAttrString(value, "error_code") &&
      PyObject_HasAttrString(value, "node_def")) {  // tf.errors.OpError
    PyObject* error_code = PyObject_GetAttrString(value, "error_code");
    if (error_code != nullptr && PyLong_Check(error_code)) {
      long c = PyLong_AsLong(error_code);
      if (c > 0 && c <= 16) code = static_cast<absl::StatusCode>(c);
    }
    Py_XDECREF(error_code);
    PyErr_Clear();
  }

  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return absl::Status(
      code, absl::StrCat(context, ": the torch callback raised ", type_name,
                         ": ", message,
                         "\n\nPython traceback:\n", formatted));
}

// ---------------------------------------------------------------------------
// Functions of torchbridge._native the kernel calls, cached under the GIL
// (the GIL is their lock).

PyObject* g_dispatch = nullptr;       // _dispatch: runs a callback
PyObject* g_registry = nullptr;       // _registry: callback id -> callable
PyObject* g_export_output = nullptr;  // _export_output: a torch output as a
                                      // capsule TF can adopt (copies if need)

PyObject* GetNativeFunction(const char* name, PyObject** cache) {
  // Borrowed; needs the GIL.
  if (*cache != nullptr) return *cache;
  PyObject* module = PyImport_ImportModule("torchbridge._native");
  if (module == nullptr) return nullptr;
  PyObject* function = PyObject_GetAttrString(module, name);
  Py_DECREF(module);
  if (function == nullptr) return nullptr;
  // The import may have released the GIL and let another thread get here
  // first: keep one.
  if (*cache == nullptr) {
    *cache = function;
  } else {
    Py_DECREF(function);
  }
  return *cache;
}

// ---------------------------------------------------------------------------
// The kernel

template <bool kGpu>
class TorchbridgeCallOp : public OpKernel {
 public:
  explicit TorchbridgeCallOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("callback_id", &callback_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &out_types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &out_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("torch_tensors", &torch_tensors_));
    std::vector<int32_t> whole;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("whole_tensor_outputs", &whole));
    whole_outputs_.assign(out_types_.size(), false);
    for (int32_t i : whole) {
      OP_REQUIRES(ctx, i >= 0 && i < static_cast<int32_t>(out_types_.size()),
                  tensorflow::errors::InvalidArgument(
                      "TorchbridgeCall: whole_tensor_outputs index ", i,
                      " out of range for ", out_types_.size(), " outputs"));
      whole_outputs_[i] = true;
    }
    OP_REQUIRES(ctx, !torch_tensors_ || TORCHBRIDGE_TORCH_INTEROP,
                tensorflow::errors::Unimplemented(
                    "TorchbridgeCall: torch_tensors=True needs a library "
                    "built with torch_interop.cc"));
    OP_REQUIRES(
        ctx, out_shapes_.empty() || out_shapes_.size() == out_types_.size(),
        tensorflow::errors::InvalidArgument(
            "TorchbridgeCall: ", out_shapes_.size(), " output_shapes for ",
            out_types_.size(), " outputs"));
    for (DataType dt : out_types_) {
      DLDataType unused;
      OP_REQUIRES(ctx, ToDLDataType(dt, &unused),
                  tensorflow::errors::InvalidArgument(
                      "TorchbridgeCall: output dtype ", DataTypeString(dt),
                      " cannot come from torch through DLPack"));
    }
  }

  // Run inline by the executor rather than handed to another thread: the
  // thread that waits on the graph (and gave up the GIL to do so) then often
  // runs the callback itself, with no thread switch and no GIL handover.
  bool IsExpensive() override { return false; }

  // The CPU kernel hands the call to the torch thread (torch_thread.h) and
  // waits, so the executor goes on inline on this thread afterwards (an
  // asynchronous kernel's successors are handed to TF's pool instead: one
  // more thread hop per call, measured ~50 us here). The GPU kernel's calls
  // stay on TF's thread, which holds TF's CUDA stream (CUDA kernels do not
  // use torch's OpenMP teams).
  void Compute(OpKernelContext* ctx) override {
    TorchThread& thread = TorchThread::Get();
    if (kGpu || !thread.enabled() || thread.OnThisThread()) {
      Run(ctx);
      return;
    }
    thread.Run([this, ctx] { Run(ctx); });
  }

 private:
  void Run(OpKernelContext* ctx) {
    const int num_inputs = ctx->num_inputs();
    const int num_outputs = static_cast<int>(out_types_.size());
    // Errors go to ctx->SetStatus: TF's OP_REQUIRES macros are not for
    // asynchronous kernels (TF checks it).
    if (!Py_IsInitialized()) {
      ctx->SetStatus(tensorflow::errors::FailedPrecondition(
          "TorchbridgeCall needs a running Python interpreter"));
      return;
    }

    void* stream = nullptr;
    int device_id = 0;
    if (kGpu) {
#if TORCHBRIDGE_GPU
      auto* device_context = ctx->op_device_context();
      if (!device_context || !device_context->stream()) {
        ctx->SetStatus(tensorflow::errors::Internal(
            "TorchbridgeCall: no GPU stream for this op"));
        return;
      }
      stream = device_context->stream()->platform_specific_handle().stream;
      device_id = ctx->device()->parsed_name().id;
#endif
    }

    // The inputs as DLPack tensors (no GIL needed yet).
    std::vector<DLManagedTensor*> inputs(num_inputs, nullptr);
    absl::Status status;
    for (int i = 0; i < num_inputs && status.ok(); ++i) {
      status = WrapInput(ctx->input(i), InputDevice(ctx, i, device_id), i,
                         &inputs[i]);
    }

    std::vector<bool> required(num_outputs);
    for (int i = 0; i < num_outputs; ++i) required[i] = ctx->output_required(i);

    std::vector<Managed> outputs(num_outputs);
    {
      GilLock gil;
      if (!status.ok()) {
        for (DLManagedTensor* m : inputs) {
          if (m) m->deleter(m);
        }
      } else {
        status =
            CallPython(ctx, &inputs, required, stream, device_id, &outputs);
      }
    }
    if (!status.ok()) {
      ctx->SetStatus(status);
      return;
    }

    for (int i = 0; i < num_outputs; ++i) {
      if (!outputs[i]) continue;  // an unused output Python left out (None)
      const DLTensor& t = outputs[i].tensor();
      TensorShape shape;
      for (int32_t d = 0; d < t.ndim; ++d) shape.AddDim(t.shape[d]);
      if (shape.num_elements() == 0) {
        // Nothing to share: TF makes its own empty tensor.
        outputs[i].DeleteFromAnyThread();
        Tensor* out = nullptr;
        status = ctx->allocate_output(i, shape, &out);
        if (!status.ok()) {
          for (int j = i + 1; j < num_outputs; ++j) {
            outputs[j].DeleteFromAnyThread();
          }
          ctx->SetStatus(status);
          return;
        }
        continue;
      }
      void* data = static_cast<char*>(t.data) + t.byte_offset;
      const size_t bytes =
          shape.num_elements() * tensorflow::DataTypeSize(out_types_[i]);
      const bool on_host = t.device.device_type != kDLCUDA;
      tensorflow::core::RefCountPtr<TensorBuffer> buffer(
          new DLPackBuffer(data, bytes, outputs[i], on_host));
      outputs[i] = Managed();  // the buffer owns it now
      ctx->set_output(i, Tensor(out_types_[i], shape, std::move(buffer)));
    }
  }

  DLDevice InputDevice(OpKernelContext* ctx, int i, int device_id) const {
    if (kGpu && ctx->input_memory_type(i) != tensorflow::HOST_MEMORY) {
      return DLDevice{kDLCUDA, device_id};
    }
    return DLDevice{kDLCPU, 0};
  }

  DLDevice OutputDevice(OpKernelContext* ctx, int i, int device_id) const {
    if (kGpu && ctx->output_memory_type(i) != tensorflow::HOST_MEMORY) {
      return DLDevice{kDLCUDA, device_id};
    }
    return DLDevice{kDLCPU, 0};
  }

  std::string Where() const {
    return absl::StrCat("TorchbridgeCall '", name(), "'");
  }

  // Runs the Python callback. Needs the GIL. Takes ownership of `inputs`
  // (their capsules own them); fills `outputs` only if every output passes
  // its checks.
  absl::Status CallPython(OpKernelContext* ctx,
                          std::vector<DLManagedTensor*>* inputs,
                          const std::vector<bool>& required, void* stream,
                          int device_id, std::vector<Managed>* outputs) {
    PyObject* args = PyList_New(static_cast<Py_ssize_t>(inputs->size()));
    if (args == nullptr) {
      for (DLManagedTensor* m : *inputs) m->deleter(m);
      return PythonErrorToStatus(Where());
    }
    bool ok = true;
    for (size_t i = 0; i < inputs->size(); ++i) {
      DLManagedTensor* m = (*inputs)[i];
      if (!ok) {
        m->deleter(m);
        continue;
      }
      PyObject* arg = nullptr;
#if TORCHBRIDGE_TORCH_INTEROP
      if (torch_tensors_) {
        arg = torch_interop::TensorFromDLPack(m);  // owns m, also on failure
        ok = arg != nullptr;
        if (ok) PyList_SET_ITEM(args, i, arg);  // steals the reference
        continue;
      }
#endif
      arg = PyCapsule_New(m, kCapsuleName, InputCapsuleDestructor);
      if (arg == nullptr) {
        ok = false;
        m->deleter(m);
        continue;
      }
      PyList_SET_ITEM(args, i, arg);  // steals the reference
    }
    if (ok && torch_tensors_) {
      g_zero_copy_count.fetch_add(static_cast<int64_t>(inputs->size()),
                                  std::memory_order_relaxed);
    }
    inputs->clear();
    if (!ok) {
      Py_DECREF(args);
      return PythonErrorToStatus(Where());
    }

    PyObject* id = PyLong_FromLongLong(callback_id_);
    PyObject* unused = UnusedOutputs(required);
    PyObject* result = nullptr;
    if (id != nullptr && unused != nullptr) {
      if (torch_tensors_ && !kGpu) {
        result = CallRegistered(id, args, unused);
      } else {
        result = CallDispatch(id, args, unused, stream, device_id);
      }
    }
    Py_XDECREF(id);
    Py_XDECREF(unused);
    Py_DECREF(args);
    if (result == nullptr) return PythonErrorToStatus(Where());
    absl::Status status =
        AdoptOutputs(ctx, result, required, device_id, outputs);
    Py_DECREF(result);  // unconsumed capsules release their tensors
    return status;
  }

  // The CPU kernel of a torch_tensors op calls its callback directly:
  // `callback(tensors, unused)`. A new reference, or nullptr with a Python
  // error set.
  PyObject* CallRegistered(PyObject* id, PyObject* args,
                           PyObject* unused) const {
    PyObject* registry = GetNativeFunction("_registry", &g_registry);
    if (registry == nullptr) return nullptr;
    PyObject* callback = PyDict_GetItemWithError(registry, id);  // borrowed
    if (callback == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      // Not registered: _dispatch raises the error that says why.
      return CallDispatch(id, args, unused, nullptr, 0);
    }
    Py_INCREF(callback);  // the registry may drop it while it runs
    PyObject* result =
        PyObject_CallFunctionObjArgs(callback, args, unused, nullptr);
    Py_DECREF(callback);
    return result;
  }

  // `torchbridge._native._dispatch(id, args, unused[, stream, device,
  // torch_tensors])`: a new reference, or nullptr with a Python error set.
  PyObject* CallDispatch(PyObject* id, PyObject* args, PyObject* unused,
                         void* stream, int device_id) const {
    PyObject* dispatch = GetNativeFunction("_dispatch", &g_dispatch);
    if (dispatch == nullptr) return nullptr;
    if (!kGpu) {
      return PyObject_CallFunctionObjArgs(dispatch, id, args, unused,
                                          nullptr);
    }
    PyObject* result = nullptr;
    PyObject* py_stream =
        PyLong_FromUnsignedLongLong(reinterpret_cast<uintptr_t>(stream));
    PyObject* py_device = PyLong_FromLong(device_id);
    if (py_stream && py_device) {
      result = PyObject_CallFunctionObjArgs(
          dispatch, id, args, unused, py_stream, py_device,
          torch_tensors_ ? Py_True : Py_False, nullptr);
    }
    Py_XDECREF(py_stream);
    Py_XDECREF(py_device);
    return result;
  }

  // None when every output is used, else a tuple of the unused indices (a
  // new reference; nullptr with a Python error set if it cannot be made).
  static PyObject* UnusedOutputs(const std::vector<bool>& required) {
    std::vector<long> unused;
    for (size_t i = 0; i < required.size(); ++i) {
      if (!required[i]) unused.push_back(static_cast<long>(i));
    }
    if (unused.empty()) {
      Py_INCREF(Py_None);
      return Py_None;
    }
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(unused.size()));
    if (tuple == nullptr) return nullptr;
    for (size_t k = 0; k < unused.size(); ++k) {
      PyObject* index = PyLong_FromLong(unused[k]);
      if (index == nullptr) {
        Py_DECREF(tuple);
        return nullptr;
      }
      PyTuple_SET_ITEM(tuple, k, index);  // steals the reference
    }
    return tuple;
  }

  absl::Status AdoptOutputs(OpKernelContext* ctx, PyObject* result,
                            const std::vector<bool>& required, int device_id,
                            std::vector<Managed>* outputs) {
    const size_t n = out_types_.size();
    if (result == Py_None && n == 0) return absl::OkStatus();
    if (!PyList_Check(result) && !PyTuple_Check(result)) {
      return tensorflow::errors::InvalidArgument(
          Where(), ": the torch callback must return a list of ",
          torch_tensors_ ? "torch tensors" : "DLPack capsules", ", got ",
          Py_TYPE(result)->tp_name);
    }
    const Py_ssize_t got = PySequence_Fast_GET_SIZE(result);
    if (static_cast<size_t>(got) != n) {
      return tensorflow::errors::InvalidArgument(
          Where(), ": the torch callback returned ", got, " tensors, but ", n,
          " outputs were declared (Tout) when the graph was built. The torch "
          "code must return the same structure on every call.");
    }
    // Each output as a DLPack capsule (a new reference in `capsules`), or
    // as a tensor torch_interop exported (`taken[i].exported`).
    std::vector<PyObject*> capsules(n, nullptr);
    std::vector<Managed> taken(n);
    absl::Status status = CollectOutputs(ctx, PySequence_Fast_ITEMS(result),
                                         required, device_id, &capsules,
                                         &taken);
    if (status.ok()) {
      for (size_t i = 0; i < n; ++i) {
        if (!taken[i]) continue;  // None for an unused output
        if (capsules[i] != nullptr) {
          // Consumed, per the DLPack protocol: the capsule no longer
          // deletes it.
          PyCapsule_SetName(capsules[i], taken[i].legacy
                                             ? kUsedCapsuleName
                                             : kUsedVersionedCapsuleName);
        }
        (*outputs)[i] = taken[i];
      }
    } else {
      // Capsules keep their tensors and release them when Python drops
      // them; exported ones are released here.
      for (Managed& m : taken) {
        if (m.exported) m.DeleteNow();
      }
    }
    for (PyObject* capsule : capsules) Py_XDECREF(capsule);
    return status;
  }

  // Checks every output and finds its DLPack tensor, taking nothing from a
  // capsule yet (see AdoptOutputs).
  absl::Status CollectOutputs(OpKernelContext* ctx, PyObject** items,
                              const std::vector<bool>& required, int device_id,
                              std::vector<PyObject*>* capsules,
                              std::vector<Managed>* taken) {
    const size_t n = out_types_.size();
    for (size_t i = 0; i < n; ++i) {
      PyObject* item = items[i];
      if (item == Py_None && !required[i]) continue;  // nothing consumes it
      const DLDevice device = OutputDevice(ctx, i, device_id);
      Managed& m = (*taken)[i];
#if TORCHBRIDGE_TORCH_INTEROP
      if (torch_tensors_ && !PyCapsule_CheckExact(item)) {
        const bool whole = whole_outputs_[i];
        m.legacy = torch_interop::ExportAsIs(item, device.device_type,
                                             device.device_id, whole);
        if (m.legacy != nullptr) {
          // Releasing a whole tensor may free its Python object.
          m.gil_free = !whole;
          m.exported = true;
          g_zero_copy_count.fetch_add(1, std::memory_order_relaxed);
        } else {
          // Anything else: the Python side makes a capsule TF can adopt
          // (one counted copy), or raises the error that explains why not.
          TF_RETURN_IF_ERROR(ExportInPython(
              item, i, device.device_type == kDLCUDA ? device_id : -1,
              &(*capsules)[i]));
          item = (*capsules)[i];
        }
      }
#endif
      if (!m) {
        Py_XINCREF(item);
        Py_XSETREF((*capsules)[i], item);
        TF_RETURN_IF_ERROR(FromCapsule(item, i, &m));
      }
      for (size_t j = 0; j < i; ++j) {
        if ((*taken)[j] && (*taken)[j].legacy == m.legacy &&
            (*taken)[j].versioned == m.versioned) {
          return tensorflow::errors::InvalidArgument(
              Where(), ": outputs ", j, " and ", i, " from the torch callback "
              "are the same DLPack capsule; each output needs its own "
              "(call torch.utils.dlpack.to_dlpack once per output).");
        }
      }
      TF_RETURN_IF_ERROR(CheckOutput(i, m.tensor(), device));
    }
    return absl::OkStatus();
  }

  // The DLPack tensor of an unused capsule (not taken yet).
  absl::Status FromCapsule(PyObject* item, size_t i, Managed* m) const {
    if (PyCapsule_IsValid(item, kCapsuleName)) {
      m->legacy = static_cast<DLManagedTensor*>(
          PyCapsule_GetPointer(item, kCapsuleName));
    } else if (PyCapsule_IsValid(item, kVersionedCapsuleName)) {
      auto* v = static_cast<DLManagedTensorVersioned*>(
          PyCapsule_GetPointer(item, kVersionedCapsuleName));
      if (v != nullptr && v->version.major != 1) {
        return tensorflow::errors::InvalidArgument(
            Where(), ": output ", i, " is a DLPack capsule of major version ",
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
        Where(), ": output ", i, " from the torch callback is a ", what,
        ", not an unused DLPack capsule ('dltensor'); return "
        "torch.utils.dlpack.to_dlpack(tensor) for each output.");
  }

  // `torchbridge._native._export_output(item, i, gpu)`: a new capsule in
  // `*capsule`. `gpu` is the CUDA device the output belongs on, -1 for host
  // memory.
  absl::Status ExportInPython(PyObject* item, size_t i, int gpu,
                              PyObject** capsule) const {
    PyObject* export_output =
        GetNativeFunction("_export_output", &g_export_output);
    if (export_output == nullptr) {
      return PythonErrorToStatus(absl::StrCat(
          Where(), " (importing torchbridge._native._export_output)"));
    }
    PyObject* index = PyLong_FromSize_t(i);
    PyObject* py_gpu = gpu >= 0 ? PyLong_FromLong(gpu) : Py_NewRef(Py_None);
    PyObject* result =
        index && py_gpu ? PyObject_CallFunctionObjArgs(export_output, item,
                                                       index, py_gpu, nullptr)
                        : nullptr;
    Py_XDECREF(index);
    Py_XDECREF(py_gpu);
    if (result == nullptr) return PythonErrorToStatus(Where());
    Py_XSETREF(*capsule, result);
    return absl::OkStatus();
  }

  absl::Status CheckOutput(size_t i, const DLTensor& t,
                           DLDevice expected_device) const {
    const DataType dt = out_types_[i];
    if (!DLDataTypeMatches(dt, t.dtype)) {
      return tensorflow::errors::InvalidArgument(
          Where(), ": output ", i, " from the torch callback has dtype ",
          DLDataTypeString(t.dtype), ", but ", DataTypeString(dt),
          " was declared (Tout) when the graph was built. Return the "
          "declared dtype.");
    }
    if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
      return tensorflow::errors::InvalidArgument(
          Where(), ": output ", i, " has an invalid DLPack shape");
    }
    int64_t numel = 1;
    for (int32_t d = 0; d < t.ndim; ++d) {
      if (t.shape[d] < 0) {
        return tensorflow::errors::InvalidArgument(
            Where(), ": output ", i, " has a negative dimension ",
            DimsString(t.ndim, t.shape));
      }
      numel *= t.shape[d];
    }
    if (!out_shapes_.empty()) {
      const PartialTensorShape& want = out_shapes_[i];
      bool compatible = want.unknown_rank() || want.dims() == t.ndim;
      for (int32_t d = 0; compatible && !want.unknown_rank() && d < t.ndim;
           ++d) {
        const int64_t w = want.dim_size(d);
        compatible = w < 0 || w == t.shape[d];
      }
      if (!compatible) {
        return tensorflow::errors::InvalidArgument(
            Where(), ": output ", i, " from the torch callback has shape ",
            DimsString(t.ndim, t.shape), ", but ", want.DebugString(),
            " was declared (output_shapes) when the graph was built. Return "
            "that shape, or declare data-dependent dimensions as None.");
      }
    }
    if (numel == 0) return absl::OkStatus();  // nothing is read
    const bool device_ok =
        t.device.device_type == expected_device.device_type &&
        (expected_device.device_type == kDLCPU ||
         t.device.device_id == expected_device.device_id);
    if (!device_ok) {
      return tensorflow::errors::InvalidArgument(
          Where(), ": output ", i, " from the torch callback is on DLPack "
          "device (type ", static_cast<int>(t.device.device_type), ", id ",
          t.device.device_id, "), but this kernel needs device (type ",
          static_cast<int>(expected_device.device_type), ", id ",
          expected_device.device_id, ") (1 = CPU, 2 = CUDA). Move the "
          "tensor to the op's device.");
    }
    if (t.strides != nullptr) {
      int64_t expected = 1;
      for (int32_t d = t.ndim - 1; d >= 0; --d) {
        if (t.shape[d] != 1 && t.strides[d] != expected) {
          return tensorflow::errors::InvalidArgument(
              Where(), ": output ", i, " from the torch callback is not "
              "contiguous (shape ", DimsString(t.ndim, t.shape), ", strides ",
              DimsString(t.ndim, t.strides), "); TF needs dense row-major "
              "memory. Return x.contiguous() (or x.clone()).");
        }
        expected *= t.shape[d];
      }
    }
    const uintptr_t address =
        reinterpret_cast<uintptr_t>(t.data) + t.byte_offset;
    if (address % kAlignment != 0) {
      return tensorflow::errors::InvalidArgument(
          Where(), ": output ", i, " from the torch callback is not ",
          kAlignment, "-byte aligned (address 0x", absl::Hex(address),
          "); TF kernels require ", kAlignment, "-byte aligned buffers and "
          "would crash on it. Return an aligned copy (x.clone()).");
    }
    return absl::OkStatus();
  }

  int64_t callback_id_ = 0;
  // Python gets torch tensors and may return torch tensors (torch_interop),
  // instead of DLPack capsules both ways.
  bool torch_tensors_ = false;
  // Per output: TF holds the torch tensor itself (its Python object lives as
  // long as TF's buffer), not only its memory.
  std::vector<bool> whole_outputs_;
  std::vector<DataType> out_types_;
  std::vector<PartialTensorShape> out_shapes_;
};

}  // namespace

REGISTER_OP("TorchbridgeCall")
    .Input("inputs: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .Attr("output_shapes: list(shape) = []")
    .Attr("callback_id: int")
    .Attr("torch_tensors: bool = false")
    .Attr("whole_tensor_outputs: list(int) = []")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      if (shapes.empty()) {
        for (int i = 0; i < c->num_outputs(); ++i) {
          c->set_output(i, c->UnknownShape());
        }
        return absl::OkStatus();
      }
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return tensorflow::errors::InvalidArgument(
            "TorchbridgeCall: ", shapes.size(), " output_shapes for ",
            c->num_outputs(), " outputs");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        tensorflow::shape_inference::ShapeHandle s;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &s));
        c->set_output(i, s);
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
Calls the Python callable registered as `callback_id` in torchbridge._native,
handing it the inputs as DLPack capsules and adopting the DLPack capsules it
returns as outputs, without copies.
)doc");

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
