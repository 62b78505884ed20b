// TorchbridgeCall: a TensorFlow op whose kernel calls back into Python
// (torch) and exchanges tensors with it through DLPack, without copies.
//
// This file registers the op and the library's C entry points, which the
// loader (torchbridge/_native/_build.py) reads with ctypes. The pieces, one
// role per file (see README.md here):
//   adopt_rules.h        what TF can adopt as it is: alignment, dtypes, layout
//   dlpack_check.{h,cc}  DLPack on TF's side: dtypes, the output check
//   adopted_buffer.{h,cc} inputs as DLPack tensors, outputs as TF buffers
//   python_util.{h,cc}   the GIL, PyRef, Python errors, the Python hooks
//   native_callback.{h,cc} C++ callbacks the CPU kernel runs in place of Python
//   torch_thread.h       the one thread that runs torch for the CPU kernel
//   torchbridge_kernel.cc the kernels
//   torch_interop.{h,cc} the only file with torch's C++ headers

#include <cstdint>
#include <vector>

#include "adopt_rules.h"
#include "adopted_buffer.h"
#include "dlpack_check.h"
#include "torch_thread.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

#ifndef TORCHBRIDGE_TORCH_INTEROP
#define TORCHBRIDGE_TORCH_INTEROP 0
#endif

extern "C" {

// Zero-copy crossings made in C++ so far.
int64_t torchbridge_zero_copy_count() {
  return torchbridge::g_zero_copy_count.load(std::memory_order_relaxed);
}

// Whether the library was built with torch_interop.cc.
int torchbridge_has_torch_interop() { return TORCHBRIDGE_TORCH_INTEROP; }

// The constants of adopt_rules.h, for the loader's check that the Python
// side agrees.
int64_t torchbridge_alignment() {
  return static_cast<int64_t>(torchbridge::kAlignment);
}
const char* torchbridge_dtype_table() { return torchbridge::DtypeTable(); }

// The torch thread's idle OpenMP team is released through `release`
// (omp_pause_resource_all), or kept if null (see torch_thread.h).
void torchbridge_set_team_release(void* release) {
  torchbridge::TorchThread::release_team.store(
      reinterpret_cast<int (*)(int)>(release), std::memory_order_release);
}

// Teams the torch thread released so far.
int64_t torchbridge_teams_released() {
  return torchbridge::TorchThread::Get().teams_released();
}

// Times the torch thread's hand-off found its core contended and stopped
// spinning for a while, and its spin mode (0 never, 1 always, -1 adaptive).
int64_t torchbridge_handoff_contended() {
  return torchbridge::TorchThread::Get().contended();
}
int64_t torchbridge_handoff_spin_mode() {
  return torchbridge::TorchThread::Get().spin_mode();
}

// Torch threads started so far, and calls that ran on TF's thread because
// the torch thread was busy too long (see torch_thread.h).
int64_t torchbridge_torch_threads_started() {
  return torchbridge::TorchThread::Get().started();
}
int64_t torchbridge_torch_thread_inline_fallbacks() {
  return torchbridge::TorchThread::Get().inline_fallbacks();
}

}  // extern "C"

namespace torchbridge {

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
      std::vector<tensorflow::PartialTensorShape> shapes;
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
Calls the Python callable registered as `callback_id` in torchbridge._native._loader,
handing it the inputs as torch tensors (`torch_tensors`) or DLPack capsules,
and adopts the tensors it returns as outputs, without copies.
)doc");

}  // namespace torchbridge
