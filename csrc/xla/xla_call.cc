// TorchbridgeCall under XLA (tf.function(jit_compile=True)): a library of its
// own, built on first use by torchbridge/_native/_xla.py and loaded after the
// op's library (csrc/), so that programs that never compile with XLA never
// pay its build.
//
//   - An XLA kernel of the op on XLA_CPU_JIT (REGISTER_KERNEL_BUILDER, which
//     works whether this library loads before or after TF registers its own
//     JIT kernels) emits one xla::CustomCall, "torchbridge_call", with the
//     typed FFI (API_VERSION_TYPED_FFI), the op's callback id and name as
//     attributes, and default (row-major) layouts for its operands and
//     results. XLA compiles it per concrete input shape: an output whose
//     shape was not fully known when the graph was traced (Keras traces
//     with an unknown batch) gets its shape then, from the op library's
//     torchbridge_host_output_shapes (set by the loader through
//     torchbridge_xla_set_output_shapes), which asks Python for the
//     outputs' shapes at those input shapes (torch on meta tensors).
//   - Its host handler (XLA_FFI_REGISTER_HANDLER on "Host") hands the call to
//     the op library's torchbridge_host_call (its address is set by the
//     loader through torchbridge_xla_set_host_call), which runs the same
//     callback as the CPU kernel (the C++ torch runner's, or Python) on the
//     torch thread and copies each output into XLA's result buffer.
//
// The inputs are zero-copy views of XLA's buffers, lent for the call: XLA
// reuses its buffers as soon as the custom call returns, so the op library
// gives each one torch keeps beyond the call (saved for the backward) a copy
// of its own, swapped under torch's storage (counted).
//
// Built with TF's compile flags plus external/highwayhash and
// external/farmhash_archive/src under TF's include dir, and linked with
// libtensorflow_cc.so.2, where the XLA symbols live. No Python, no torch.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/compiler/tf2xla/type_util.h"
#include "tensorflow/compiler/tf2xla/xla_op_kernel.h"
#include "tensorflow/compiler/tf2xla/xla_op_registry.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla/hlo/builder/xla_builder.h"
#include "xla/shape_util.h"

#include "external/dlpack/include/dlpack/dlpack.h"  // shipped with TF

namespace xla::ffi {
// Defined in libtensorflow_cc.so.2 (xla/ffi/ffi_api.h, not included: its
// internal headers clash with the external API's).
const XLA_FFI_Api* GetXlaFfiApi();
}  // namespace xla::ffi

namespace torchbridge_xla {
namespace {

namespace ffi = ::xla::ffi;

constexpr char kTarget[] = "torchbridge_call";

// csrc/torchbridge_kernel.cc's torchbridge_host_call.
using HostCall = int (*)(const char* name, int64_t callback_id,
                         int torch_tensors, DLManagedTensor** inputs,
                         int64_t num_inputs, DLTensor* results,
                         int64_t num_results, int inputs_copied, char* error,
                         int64_t error_size);
std::atomic<HostCall> g_host_call{nullptr};
std::atomic<int64_t> g_calls{0};

// csrc/host_call.cc's torchbridge_host_output_shapes.
using OutputShapes = int (*)(const char* name, int64_t callback_id,
                             int64_t num_inputs, const int32_t* input_dtypes,
                             const int32_t* input_ranks,
                             const int64_t* input_dims, int64_t num_outputs,
                             const int32_t* output_ranks, int64_t* output_dims,
                             char* error, int64_t error_size);
std::atomic<OutputShapes> g_output_shapes{nullptr};

// ---------------------------------------------------------------------------
// The XLA kernel

class TorchbridgeCallXlaOp : public tensorflow::XlaOpKernel {
 public:
  explicit TorchbridgeCallXlaOp(tensorflow::OpKernelConstruction* ctx)
      : XlaOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("callback_id", &callback_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &out_types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &out_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("torch_tensors", &torch_tensors_));
  }

  void Compile(tensorflow::XlaOpKernelContext* ctx) override {
    const std::string where =
        absl::StrCat("TorchbridgeCall '", name(), "' under XLA");
    OP_REQUIRES(ctx, out_shapes_.size() == out_types_.size(),
                tensorflow::errors::InvalidArgument(
                    where, ": the op declares no output shapes; XLA needs "
                    "every output's shape when it compiles"));
    std::vector<xla::XlaOp> operands;
    std::vector<xla::Shape> operand_shapes;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      auto shape = ctx->InputXlaShape(i);
      OP_REQUIRES_OK(ctx, shape.status());
      OP_REQUIRES(ctx, shape->is_static(),
                  tensorflow::errors::InvalidArgument(
                      where, ": input ", i, " has a dynamic shape (",
                      shape->ToString(), "). ", kFix));
      operands.push_back(ctx->Input(i));
      operand_shapes.push_back(xla::ShapeUtil::MakeShapeWithDescendingLayout(
          shape->element_type(), shape->dimensions()));
    }
    std::vector<tensorflow::PartialTensorShape> out_shapes = out_shapes_;
    bool all_known = true;
    for (const auto& shape : out_shapes) all_known &= shape.IsFullyDefined();
    if (!all_known) {
      OP_REQUIRES_OK(ctx, FindOutputShapes(ctx, where, operand_shapes,
                                           &out_shapes));
    }
    std::vector<xla::Shape> result_shapes;
    for (size_t i = 0; i < out_types_.size(); ++i) {
      xla::PrimitiveType type;
      OP_REQUIRES_OK(ctx,
                     tensorflow::DataTypeToPrimitiveType(out_types_[i], &type));
      result_shapes.push_back(xla::ShapeUtil::MakeShapeWithDescendingLayout(
          type, out_shapes[i].dim_sizes()));
    }
    // The typed FFI's attributes, as an MLIR dictionary. Op names hold
    // [A-Za-z0-9_.\-/] only: no quoting needed.
    const std::string config = absl::StrCat(
        "{callback_id = ", callback_id_, " : i64, torch_tensors = ",
        torch_tensors_ ? 1 : 0, " : i32, name = \"", name(), "\"}");
    xla::XlaOp call = xla::CustomCallWithLayout(
        ctx->builder(), kTarget, operands,
        xla::ShapeUtil::MakeTupleShape(result_shapes), operand_shapes, config,
        /*has_side_effect=*/true, /*output_operand_aliasing=*/{},
        /*literal=*/nullptr, xla::CustomCallSchedule::SCHEDULE_NONE,
        xla::CustomCallApiVersion::API_VERSION_TYPED_FFI);
    for (size_t i = 0; i < out_types_.size(); ++i) {
      ctx->SetOutput(static_cast<int>(i), xla::GetTupleElement(call, i));
    }
  }

 private:
  static constexpr char kFix[] =
      "A torch call under XLA (jit_compile=True) needs static shapes when "
      "XLA compiles it (XLA's bounded dynamic shapes are not supported): "
      "compile without XLA (jit_compile=False).";

  // Fills the dimensions of `shapes` (the declared ones, each of known
  // rank) that were unknown when the graph was traced: the op library asks
  // Python for the outputs' shapes at the concrete `operand_shapes`; each
  // must agree with the declared one.
  absl::Status FindOutputShapes(
      tensorflow::XlaOpKernelContext* ctx, const std::string& where,
      const std::vector<xla::Shape>& operand_shapes,
      std::vector<tensorflow::PartialTensorShape>* shapes) const {
    OutputShapes find = g_output_shapes.load(std::memory_order_acquire);
    if (find == nullptr) {
      return tensorflow::errors::FailedPrecondition(
          where, ": the XLA library was loaded without the op library's "
          "entry point for output shapes (load it through torchbridge, not "
          "tf.load_op_library alone)");
    }
    std::vector<int32_t> in_types, in_ranks, out_ranks;
    std::vector<int64_t> in_dims, out_dims;
    for (size_t i = 0; i < operand_shapes.size(); ++i) {
      in_types.push_back(static_cast<int32_t>(ctx->input_type(i)));
      const auto dims = operand_shapes[i].dimensions();
      in_ranks.push_back(static_cast<int32_t>(dims.size()));
      in_dims.insert(in_dims.end(), dims.begin(), dims.end());
    }
    for (size_t i = 0; i < shapes->size(); ++i) {
      const auto& shape = (*shapes)[i];
      if (shape.unknown_rank()) {
        return tensorflow::errors::InvalidArgument(
            where, ": output ", i, " has an unknown rank; give the "
            "tf.function an input_signature with known ranks, or declare "
            "the outputs (output_signature)");
      }
      out_ranks.push_back(shape.dims());
      for (int d = 0; d < shape.dims(); ++d) out_dims.push_back(shape.dim_size(d));
    }
    char message[8192] = {0};
    const int rc = find(name().c_str(), callback_id_,
                        static_cast<int64_t>(in_ranks.size()), in_types.data(),
                        in_ranks.data(), in_dims.data(),
                        static_cast<int64_t>(out_ranks.size()),
                        out_ranks.data(), out_dims.data(), message,
                        static_cast<int64_t>(sizeof(message)));
    if (rc != 0) {
      message[sizeof(message) - 1] = '\0';
      return absl::Status(static_cast<absl::StatusCode>(rc), message);
    }
    size_t at = 0;
    for (size_t i = 0; i < shapes->size(); ++i) {
      tensorflow::PartialTensorShape found, merged;
      TF_RETURN_IF_ERROR(tensorflow::PartialTensorShape::BuildPartialTensorShape(
          absl::Span<const int64_t>(out_dims.data() + at, out_ranks[i]), &found));
      at += out_ranks[i];
      if (!(*shapes)[i].MergeWith(found, &merged).ok() ||
          !merged.IsFullyDefined()) {
        return tensorflow::errors::InvalidArgument(
            where, ": output ", i, " was declared ", (*shapes)[i].DebugString(),
            " when the graph was traced, and was found ", found.DebugString(),
            " for the input shapes XLA compiles");
      }
      (*shapes)[i] = merged;
    }
    return absl::OkStatus();
  }

  int64_t callback_id_ = 0;
  bool torch_tensors_ = false;
  std::vector<tensorflow::DataType> out_types_;
  std::vector<tensorflow::PartialTensorShape> out_shapes_;
};

REGISTER_KERNEL_BUILDER(Name("TorchbridgeCall").Device(tensorflow::DEVICE_CPU_XLA_JIT),
                        TorchbridgeCallXlaOp);

// ---------------------------------------------------------------------------
// The host handler

bool ToDLDataType(ffi::DataType type, DLDataType* out) {
  switch (type) {
#define TB_DL(ffi_type, code, bits)        \
  case ffi::DataType::ffi_type:            \
    *out = DLDataType{code, bits, 1};      \
    return true;
    TB_DL(PRED, kDLBool, 8)
    TB_DL(S8, kDLInt, 8)
    TB_DL(S16, kDLInt, 16)
    TB_DL(S32, kDLInt, 32)
    TB_DL(S64, kDLInt, 64)
    TB_DL(U8, kDLUInt, 8)
    TB_DL(U16, kDLUInt, 16)
    TB_DL(U32, kDLUInt, 32)
    TB_DL(U64, kDLUInt, 64)
    TB_DL(F16, kDLFloat, 16)
    TB_DL(F32, kDLFloat, 32)
    TB_DL(F64, kDLFloat, 64)
    TB_DL(BF16, kDLBfloat, 16)
    TB_DL(C64, kDLComplex, 64)
    TB_DL(C128, kDLComplex, 128)
#undef TB_DL
    default:
      return false;
  }
}

// An input: a DLPack view of an XLA buffer, lent for the call (the op
// library detaches what torch keeps beyond it).
struct InputView {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
};

void DeleteInputView(DLManagedTensor* m) {
  delete static_cast<InputView*>(m->manager_ctx);
}

ffi::Error MakeInput(const ffi::AnyBuffer& buffer, int index,
                     DLManagedTensor** out) {
  auto view = std::make_unique<InputView>();
  DLDataType dtype;
  if (!ToDLDataType(buffer.element_type(), &dtype)) {
    return ffi::Error::InvalidArgument(absl::StrCat(
        "torchbridge: input ", index, " of an XLA custom call has a dtype "
        "torch has none for (XLA type ",
        static_cast<int>(buffer.element_type()), ")"));
  }
  const auto dims = buffer.dimensions();
  view->shape.assign(dims.begin(), dims.end());
  DLTensor& t = view->managed.dl_tensor;
  t.data = buffer.untyped_data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(view->shape.size());
  t.dtype = dtype;
  t.shape = view->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  view->managed.manager_ctx = view.get();
  view->managed.deleter = DeleteInputView;
  *out = &view.release()->managed;
  return ffi::Error::Success();
}

ffi::Error HostCallImpl(ffi::RemainingArgs args, ffi::RemainingRets rets,
                        int64_t callback_id, int32_t torch_tensors,
                        std::string_view name) {
  HostCall host_call = g_host_call.load(std::memory_order_acquire);
  if (host_call == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "torchbridge: the XLA library was loaded without the "
                      "op library's entry point (load it through "
                      "torchbridge, not tf.load_op_library alone)");
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
  std::vector<DLManagedTensor*> inputs;
  inputs.reserve(args.size());
  ffi::Error error;
  for (size_t i = 0; i < args.size() && error.success(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (!buffer) {
      error = ffi::Error::Internal("torchbridge: an XLA argument is not a buffer");
      break;
    }
    DLManagedTensor* m = nullptr;
    error = MakeInput(*buffer, static_cast<int>(i), &m);
    if (m) inputs.push_back(m);
  }
  std::vector<DLTensor> results(rets.size());
  std::vector<std::vector<int64_t>> shapes(rets.size());
  for (size_t i = 0; i < rets.size() && error.success(); ++i) {
    auto ret = rets.get<ffi::AnyBuffer>(i);
    if (!ret) {
      error = ffi::Error::Internal("torchbridge: an XLA result is not a buffer");
      break;
    }
    ffi::AnyBuffer buffer = **ret;
    DLTensor& t = results[i];
    if (!ToDLDataType(buffer.element_type(), &t.dtype)) {
      error = ffi::Error::InvalidArgument(
          "torchbridge: an XLA result has a dtype torch has none for");
      break;
    }
    const auto dims = buffer.dimensions();
    shapes[i].assign(dims.begin(), dims.end());
    t.data = buffer.untyped_data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shapes[i].size());
    t.shape = shapes[i].data();
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  if (!error.success()) {
    for (DLManagedTensor* m : inputs) m->deleter(m);
    return error;
  }
  const std::string op_name(name);
  char message[8192] = {0};
  const int rc = host_call(op_name.c_str(), callback_id, torch_tensors,
                           inputs.data(), static_cast<int64_t>(inputs.size()),
                           results.data(), static_cast<int64_t>(results.size()),
                           /*inputs_copied=*/0, message,
                           static_cast<int64_t>(sizeof(message)));
  if (rc != 0) {
    message[sizeof(message) - 1] = '\0';
    return ffi::Error(static_cast<XLA_FFI_Error_Code>(rc), message);
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER(kTorchbridgeHostCall, HostCallImpl,
                       ffi::Ffi::Bind()
                           .RemainingArgs()
                           .RemainingRets()
                           .Attr<int64_t>("callback_id")
                           .Attr<int32_t>("torch_tensors")
                           .Attr<std::string_view>("name"));

XLA_FFI_REGISTER_HANDLER(xla::ffi::GetXlaFfiApi(), kTarget, "Host",
                         kTorchbridgeHostCall);

}  // namespace
}  // namespace torchbridge_xla

extern "C" {

// The loader hands over the op library's torchbridge_host_call.
void torchbridge_xla_set_host_call(void* host_call) {
  torchbridge_xla::g_host_call.store(
      reinterpret_cast<torchbridge_xla::HostCall>(host_call),
      std::memory_order_release);
}

// The loader hands over the op library's torchbridge_host_output_shapes.
void torchbridge_xla_set_output_shapes(void* output_shapes) {
  torchbridge_xla::g_output_shapes.store(
      reinterpret_cast<torchbridge_xla::OutputShapes>(output_shapes),
      std::memory_order_release);
}

// Host calls XLA made so far (tests).
int64_t torchbridge_xla_calls() {
  return torchbridge_xla::g_calls.load(std::memory_order_relaxed);
}

}  // extern "C"
