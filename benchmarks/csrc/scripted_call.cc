// The floor of benchmarks/scripted_native.py's no-Python bridge: a C++
// callback (csrc/native_callback.h) that hands back fresh, uncomputed
// torch tensors of the shapes given to `tbs_bare_new`, as
// benchmarks/bare_native.py's floor does from Python; and `tbs_linear`,
// the same floor with torch's own work of one `Linear` put back (what any
// bridge that runs torch in the call must run), and `tbs_linear_boxed`,
// the same through the dispatcher's boxed call (an IValue stack, as a
// runner that interprets an exported graph node by node calls each op).
// `tbs_bare_busy` makes a `tbs_bare` context's calls work a given time
// before they return (the floor with torch's time put back: spinning,
// writing over memory, or running torch matmuls).
// (The bridge itself runs torchbridge's own C++ call path,
// csrc/exported/exported_call.cc.)
//
// Shape lists are never freed: one per op signature, for the benchmarks.

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Shapes {
  std::vector<std::vector<int64_t>> outputs;
  // `tbs_bare_busy`: each call then works this long before it returns.
  int64_t busy_ns = 0;
  int kind = 0;  // 0 spins, 1 writes over `buffer`, 2 runs torch matmuls
  std::vector<char> buffer;
  at::Tensor a, b;
  int64_t calls = 0;
};

// Works for `shapes.busy_ns`, as `shapes.kind` says: spins on the clock
// alone (a long op, nothing else), writes over a buffer (a long op that
// evicts the caches' lines), or runs torch matmuls (torch's own work,
// its OpenMP team included).
void Busy(Shapes& shapes) {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::nanoseconds(shapes.busy_ns);
  uint64_t sum = 0;
  while (Clock::now() < end) {
    if (shapes.kind == 1) {
      for (size_t i = 0; i < shapes.buffer.size(); i += 64) shapes.buffer[i] += 1;
    } else if (shapes.kind == 2) {
      at::AutoGradMode no_grad(false);
      sum += static_cast<uint64_t>(at::mm(shapes.a, shapes.b).numel());
    }
  }
  (void)sum;
}

// `tbs_linear` and `tbs_linear_boxed` (`boxed`: aten::linear through the
// dispatcher's boxed call). Every input is adopted first, so that an error
// still frees them.
int Linear(const char* name, bool boxed, DLManagedTensor** inputs, int64_t num_inputs,
           DLManagedTensor** outputs, int64_t num_outputs, char* error, int64_t error_size) {
  std::vector<at::Tensor> args;
  for (int64_t i = 0; i < num_inputs; ++i) args.push_back(at::fromDLPack(inputs[i]));
  if (num_inputs < 3 || num_outputs != 1) {
    if (error_size > 0) {
      const std::string message =
          std::string(name) + ": takes (..., x, weight, bias), gives one output";
      std::strncpy(error, message.c_str(), static_cast<size_t>(error_size - 1));
      error[error_size - 1] = '\0';
    }
    return 1;
  }
  at::AutoGradMode no_grad(false);
  const at::Tensor& x = args[num_inputs - 3];
  const at::Tensor& weight = args[num_inputs - 2];
  const at::Tensor& bias = args[num_inputs - 1];
  if (!boxed) {
    outputs[0] = at::toDLPack(at::linear(x, weight, bias));
    return 0;
  }
  static const c10::OperatorHandle linear =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::linear", "");
  std::vector<c10::IValue> stack{x, weight, bias};
  linear.callBoxed(&stack);
  outputs[0] = at::toDLPack(stack.at(0).toTensor());
  return 0;
}

}  // namespace

extern "C" {

// A `tbs_bare` context: `num_outputs` shapes, their ranks in `ranks` and
// their dimensions one after the other in `dims`.
void* tbs_bare_new(int64_t num_outputs, const int64_t* ranks, const int64_t* dims) {
  auto* shapes = new Shapes;
  for (int64_t i = 0; i < num_outputs; ++i) {
    shapes->outputs.emplace_back(dims, dims + ranks[i]);
    dims += ranks[i];
  }
  return shapes;
}

int tbs_bare(void* context, DLManagedTensor** inputs, int64_t num_inputs,
             const uint8_t* required, DLManagedTensor** outputs,
             int64_t num_outputs, char* error, int64_t error_size) {
  (void)required;
  for (int64_t i = 0; i < num_inputs; ++i) inputs[i]->deleter(inputs[i]);
  const auto& shapes = static_cast<Shapes*>(context)->outputs;
  if (static_cast<int64_t>(shapes.size()) != num_outputs) {
    if (error_size > 0) {
      std::strncpy(error, "tbs_bare: the op's outputs are not the context's",
                   static_cast<size_t>(error_size - 1));
      error[error_size - 1] = '\0';
    }
    return 1;
  }
  for (int64_t i = 0; i < num_outputs; ++i) {
    outputs[i] = at::toDLPack(at::empty(shapes[i], at::kFloat));
  }
  auto& context_shapes = *static_cast<Shapes*>(context);
  ++context_shapes.calls;
  if (context_shapes.busy_ns > 0) Busy(context_shapes);
  return 0;
}

// Makes each later `tbs_bare` call of `context` work `busy_ns` (see
// Busy: `kind` 0 spins, 1 writes over `bytes` of memory, 2 runs torch
// matmuls of 128 x 128); returns how many calls it has had.
int64_t tbs_bare_busy(void* context, int64_t busy_ns, int kind, int64_t bytes) {
  auto& shapes = *static_cast<Shapes*>(context);
  shapes.busy_ns = busy_ns;
  shapes.kind = kind;
  shapes.buffer.assign(static_cast<size_t>(kind == 1 ? bytes : 0), 0);
  if (kind == 2 && !shapes.a.defined()) {
    shapes.a = at::randn({128, 128});
    shapes.b = at::randn({128, 128});
  }
  return shapes.calls;
}

// The last three inputs are a Linear's (x, weight, bias); its one output
// is at::linear of them, computed here with no autograd recording (the
// inputs before them, the bare op's placeholders, are dropped).
int tbs_linear(void* context, DLManagedTensor** inputs, int64_t num_inputs,
               const uint8_t* required, DLManagedTensor** outputs,
               int64_t num_outputs, char* error, int64_t error_size) {
  (void)context;
  (void)required;
  return Linear("tbs_linear", false, inputs, num_inputs, outputs, num_outputs, error,
                error_size);
}

// `tbs_linear`, with aten::linear called through the dispatcher's boxed
// call (its arguments and result on an IValue stack).
int tbs_linear_boxed(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                     const uint8_t* required, DLManagedTensor** outputs,
                     int64_t num_outputs, char* error, int64_t error_size) {
  (void)context;
  (void)required;
  return Linear("tbs_linear_boxed", true, inputs, num_inputs, outputs, num_outputs, error,
                error_size);
}

}  // extern "C"
