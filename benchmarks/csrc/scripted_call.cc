// The floor of benchmarks/scripted_native.py's no-Python bridge: a C++
// callback (csrc/native_callback.h) that hands back fresh, uncomputed
// torch tensors of the shapes given to `tbs_bare_new`, as
// benchmarks/bare_native.py's floor does from Python; and `tbs_linear`,
// the same floor with torch's own work of one `Linear` put back (what any
// bridge that runs torch in the call must run), and `tbs_linear_boxed`,
// the same through the dispatcher's boxed call (an IValue stack, as a
// runner that interprets an exported graph node by node calls each op).
// (The bridge itself runs torchbridge's own C++ call path,
// csrc/exported/exported_call.cc.)
//
// Shape lists are never freed: one per op signature, for the benchmarks.

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Shapes {
  std::vector<std::vector<int64_t>> outputs;
};

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
  return 0;
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
