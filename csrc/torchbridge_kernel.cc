// The kernels of TorchbridgeCall (registered in torchbridge_op.cc): each call
//   1. wraps every input as a DLPack tensor holding a reference on the TF
//      buffer (adopted_buffer.h), and, with the GIL, hands Python torch
//      tensors (torch_interop.h) or DLPack capsules;
//   2. calls the registered Python callable (call_core.h, which the XLA
//      custom call's host calls share, host_call.cc): directly on the CPU kernel of a
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

#include <string>
#include <vector>

#include "call_core.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/denormal.h"
#include "torch_thread.h"

#if TORCHBRIDGE_GPU
#include "xla/stream_executor/stream.h"
#endif

namespace torchbridge {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::errors::InvalidArgument;

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

}  // namespace

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
