// The host calls of the XLA custom call (csrc/xla/xla_call.cc, a library of
// its own, which gets torchbridge_host_call's address from the loader): one
// TorchbridgeCall under tf.function(jit_compile=True) runs the callback the
// CPU kernel runs (call_core.h), on the torch thread, on zero-copy views of
// XLA's input buffers (lent for the call: what torch keeps beyond it gets a
// copy of its own), and copies each output into XLA's result buffer. Every
// copy is counted in exchange_stats().
//
// And the shapes XLA compiles for: an op traced with unknown dimensions
// (Keras traces with an unknown batch) declares partial output shapes; XLA
// compiles it per concrete input shape, and its kernel asks
// torchbridge_host_output_shapes for the outputs' shapes at those, which
// Python finds (torchbridge/_native/_callbacks.py's output_shapes).

#include <Python.h>  // first, as Python asks

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "adopt_rules.h"
#include "call_core.h"
#include "tensorflow/core/platform/denormal.h"
#include "torch_thread.h"

namespace torchbridge {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::errors::InvalidArgument;

// Copies made by host calls (torchbridge_host_call): results written into
// XLA's buffers, and inputs copied out of them.
std::atomic<int64_t> g_host_copies{0};
std::atomic<int64_t> g_host_bytes{0};

// _callbacks.output_shapes (a strong reference; set by the loader, with the
// GIL, through torchbridge_set_output_shapes_hook; read with the GIL).
PyObject* g_output_shapes_hook = nullptr;

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

// A tuple of `n` Python ints; an empty PyRef (a Python error set) on failure.
PyRef IntTuple(const int64_t* values, int64_t n) {
  PyRef tuple(PyTuple_New(static_cast<Py_ssize_t>(n)));
  for (int64_t k = 0; tuple && k < n; ++k) {
    PyObject* item = PyLong_FromLongLong(values[k]);
    if (item == nullptr) return PyRef();
    PyTuple_SET_ITEM(tuple.get(), k, item);  // steals the reference
  }
  return tuple;
}

// The output shapes of callback `callback_id`'s op at concrete input shapes
// (see torchbridge_host_output_shapes): Python's
// output_shapes(id, input shapes, input dtypes, declared shapes) returns
// one list of ints per output. Needs the GIL.
absl::Status OutputShapes(const std::string& where, int64_t callback_id,
                          int64_t num_inputs, const int32_t* input_dtypes,
                          const int32_t* input_ranks, const int64_t* input_dims,
                          int64_t num_outputs, const int32_t* output_ranks,
                          int64_t* output_dims) {
  if (g_output_shapes_hook == nullptr) {
    return tensorflow::errors::FailedPrecondition(
        where, ": the op library has no Python function to find output "
        "shapes with (the loader connects it: load torchbridge's XLA library "
        "through torchbridge)");
  }
  PyRef shapes(PyList_New(static_cast<Py_ssize_t>(num_inputs)));
  PyRef dtypes(PyList_New(static_cast<Py_ssize_t>(num_inputs)));
  PyRef declared(PyList_New(static_cast<Py_ssize_t>(num_outputs)));
  PyRef id(PyLong_FromLongLong(callback_id));
  if (!shapes || !dtypes || !declared || !id) return PythonErrorToStatus(where);
  const int64_t* dims = input_dims;
  for (int64_t i = 0; i < num_inputs; ++i) {
    PyRef shape = IntTuple(dims, input_ranks[i]);
    PyRef dtype(PyLong_FromLong(input_dtypes[i]));
    if (!shape || !dtype) return PythonErrorToStatus(where);
    PyList_SET_ITEM(shapes.get(), i, shape.release());
    PyList_SET_ITEM(dtypes.get(), i, dtype.release());
    dims += input_ranks[i];
  }
  dims = output_dims;
  for (int64_t i = 0; i < num_outputs; ++i) {
    PyRef shape = IntTuple(dims, output_ranks[i]);  // -1: unknown
    if (!shape) return PythonErrorToStatus(where);
    PyList_SET_ITEM(declared.get(), i, shape.release());
    dims += output_ranks[i];
  }
  PyRef result(PyObject_CallFunctionObjArgs(g_output_shapes_hook, id.get(),
                                            shapes.get(), dtypes.get(),
                                            declared.get(), nullptr));
  if (!result) return PythonErrorToStatus(where);
  PyRef outer(PySequence_Fast(result.get(), "output shapes: not a sequence"));
  if (!outer) return PythonErrorToStatus(where);
  if (PySequence_Fast_GET_SIZE(outer.get()) != num_outputs) {
    return InvalidArgument(where, ": found ",
                           PySequence_Fast_GET_SIZE(outer.get()),
                           " output shapes for ", num_outputs, " outputs");
  }
  int64_t* out = output_dims;
  for (int64_t i = 0; i < num_outputs; ++i) {
    PyRef shape(PySequence_Fast(PySequence_Fast_GET_ITEM(outer.get(), i),
                                "an output shape: not a sequence"));
    if (!shape) return PythonErrorToStatus(where);
    if (PySequence_Fast_GET_SIZE(shape.get()) != output_ranks[i]) {
      return InvalidArgument(where, ": output ", i, " was found of rank ",
                             PySequence_Fast_GET_SIZE(shape.get()),
                             ", declared of rank ", output_ranks[i]);
    }
    for (int32_t d = 0; d < output_ranks[i]; ++d) {
      const long long size =
          PyLong_AsLongLong(PySequence_Fast_GET_ITEM(shape.get(), d));
      if (size == -1 && PyErr_Occurred()) return PythonErrorToStatus(where);
      if (size < 0) {
        return InvalidArgument(where, ": output ", i,
                               " was found with an unknown dimension");
      }
      *out++ = size;
    }
  }
  return absl::OkStatus();
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

// The entry point of the XLA kernel (csrc/xla/, which gets its address from
// the loader) for an op whose declared output shapes are not all known: the
// outputs' shapes when its `num_inputs` inputs have `input_dtypes` (TF's
// DataType codes) and the shapes `input_ranks` and `input_dims` (each
// input's dimensions, one after the other). `output_dims` holds each
// output's declared dimensions (-1 where unknown; `output_ranks` theirs) and
// gets the ones found, all known. Runs Python on the torch thread, as the
// host calls do. Returns 0, or a TF error code with the message in `error`
// (NUL-terminated).
int torchbridge_host_output_shapes(const char* name, int64_t callback_id,
                                   int64_t num_inputs,
                                   const int32_t* input_dtypes,
                                   const int32_t* input_ranks,
                                   const int64_t* input_dims,
                                   int64_t num_outputs,
                                   const int32_t* output_ranks,
                                   int64_t* output_dims, char* error,
                                   int64_t error_size) {
  const std::string where = std::string("TorchbridgeCall '") +
                            (name ? name : "?") +
                            "' under XLA (finding its output shapes)";
  absl::Status status;
  if (!Py_IsInitialized()) {
    status = tensorflow::errors::FailedPrecondition(
        "TorchbridgeCall needs a running Python interpreter");
  } else {
    auto run = [&] {
      GilLock gil;
      status = OutputShapes(where, callback_id, num_inputs, input_dtypes,
                            input_ranks, input_dims, num_outputs,
                            output_ranks, output_dims);
    };
    TorchThread& thread = TorchThread::Get();
    if (!thread.enabled() || thread.OnThisThread()) {
      run();
    } else {
      thread.Run(run);
    }
  }
  if (status.ok()) return 0;
  if (error && error_size > 0) {
    std::string text(status.message());
    std::snprintf(error, static_cast<size_t>(error_size), "%s", text.c_str());
  }
  return static_cast<int>(status.code());
}

// The loader's (ctypes.PyDLL, so with the GIL): the Python function
// torchbridge_host_output_shapes calls. Keeps a reference. Returns 0.
int torchbridge_set_output_shapes_hook(PyObject* hook) {
  Py_XINCREF(hook);
  Py_XSETREF(g_output_shapes_hook, hook);
  return 0;
}

// Copies host calls made: {results and inputs copied, bytes}.
void torchbridge_host_copies(int64_t* counts) {
  counts[0] = g_host_copies.load(std::memory_order_relaxed);
  counts[1] = g_host_bytes.load(std::memory_order_relaxed);
}
}  // extern "C"

}  // namespace torchbridge
