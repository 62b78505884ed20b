// The C++ torch runner: a module's graph call captured with torch.export
// (torchbridge/_state/_torch_runner.py) and run from the native op's CPU
// kernel as C++ callbacks (../native_callback.h), with no GIL and no
// Python per call. A library of its own, built on first use
// (torchbridge/_native/_exported.py): torch's dispatcher headers cost the
// op's own build nothing. Its files, compiled as one unit:
//   - program.{h,cc}: the program's format, handed over node by node
//     (`tbe_*`, from torchbridge/_native/_exported_program.py);
//   - interpreter.cc: runs it as eager torch runs the graph, one boxed
//     dispatcher call per node, which records autograd as an eager call does;
//   - records.{h,cc}: what a forward keeps for its backward, and how long;
//   - this file: the op's callbacks, the forward and the backward
//     (torch's autograd), and their results handed to TF.
//
// `tbe_forward` runs the program (recording autograd when the op's handle
// output, output 0, is consumed) and returns the handle and the outputs;
// `tbe_backward` takes the handle and one gradient per output and returns
// the gradients of the program's arguments that the graph consumes. The
// handle is a one-byte torch tensor whose memory's deleter frees the
// forward's record when TF frees the handle. Programs are never freed (a
// handle's deleter may run after its op's graph is gone): one per captured
// signature.

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "adopt_rules.h"
#include "program.h"
#include "records.h"

namespace torchbridge::exported {
namespace {

// One forward op under XLA: its module, whether a tape recorded it when it
// was traced, and how many backward ops were traced for it (set from Python
// as they are). Never freed, as programs are not.
struct XlaOp {
  Module* m = nullptr;
  std::atomic<int> record{0};
  std::atomic<int64_t> backwards{0};
};

// Results copied to be handed over (not adoptable as they are), and their
// bytes: tb.exchange_stats() reads them (tbe_copies).
std::atomic<int64_t> g_copies{0};
std::atomic<int64_t> g_copied_bytes{0};

void FreeAll(DLManagedTensor** tensors, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (tensors[i]) tensors[i]->deleter(tensors[i]);
    tensors[i] = nullptr;
  }
}

// Whether TF can adopt `t`'s memory as it is: adopt_rules.h's rule on the
// facts torch_interop.cc's ExportAsIs reads.
bool AdoptableAsIs(const at::Tensor& t) {
  const bool strided = t.layout() == at::kStrided;
  const int64_t numel = strided ? t.numel() : 0;
  const void* data = strided && numel ? t.data_ptr() : nullptr;
  return CanAdoptAsIs(strided, t.is_quantized(), t.is_conj() || t.is_neg(),
                      strided && t.is_contiguous(),
                      reinterpret_cast<uintptr_t>(data), numel);
}

// A DLPack tensor TF can adopt as it is (adopt_rules.h): `t` itself, else
// one copy, counted, as the Python path's `_adopt.tf_viewable` makes (lazy
// conjugation or negation resolved; a strided, offset or misaligned result
// copied dense and aligned).
DLManagedTensor* Export(at::Tensor t) {
  t = t.detach();
  bool copied = false;
  if (t.is_conj() || t.is_neg()) {  // its memory holds other values
    t = t.resolve_conj().resolve_neg();
    copied = true;
  }
  if (!AdoptableAsIs(t)) {
    t = t.clone(at::MemoryFormat::Contiguous);
    copied = true;
  }
  if (copied) {
    g_copies.fetch_add(1, std::memory_order_relaxed);
    g_copied_bytes.fetch_add(static_cast<int64_t>(t.nbytes()), std::memory_order_relaxed);
  }
  return at::toDLPack(t);
}

// A callback's failure: what it owned freed, the message written.
int Fail(DLManagedTensor** inputs, int64_t num_inputs,
         std::vector<DLManagedTensor*>* made, const std::exception& e,
         char* error, int64_t error_size) {
  FreeAll(inputs, num_inputs);
  FreeAll(made->data(), static_cast<int64_t>(made->size()));
  SetError(error, error_size, e.what());
  return 1;
}

bool Differentiable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
}

// The forward; `xla`: an op under XLA (the handle an id, see XlaOp).
int ForwardImpl(Module* m, XlaOp* xla, DLManagedTensor** inputs,
                int64_t num_inputs, const uint8_t* required,
                DLManagedTensor** outputs, int64_t num_outputs, char* error,
                int64_t error_size) {
  std::vector<DLManagedTensor*> made;
  if (num_outputs < 1) {  // the handle, then the module's outputs
    FreeAll(inputs, num_inputs);
    SetError(error, error_size, "an op with no handle output");
    return 1;
  }
  try {
    if (!m->finished) throw std::runtime_error("the program was not finished");
    if (num_inputs != m->num_inputs) {
      throw std::runtime_error("the op passes " + std::to_string(num_inputs) +
                               " arguments, the program takes " +
                               std::to_string(m->num_inputs));
    }
    if (m->num_threads > 0 && at::get_num_threads() != m->num_threads) {
      at::set_num_threads(m->num_threads);
    }
    const bool record = xla ? xla->record.load() != 0 : required[0] != 0;
    std::vector<at::Tensor> args;
    args.reserve(num_inputs);
    for (int64_t i = 0; i < num_inputs; ++i) {
      at::Tensor t = at::fromDLPack(inputs[i]);
      inputs[i] = nullptr;
      const bool leaf = record && i < static_cast<int64_t>(m->leaves.size()) && m->leaves[i] &&
                        Differentiable(t);
      args.push_back(leaf ? t.detach().requires_grad_(true) : t);
    }
    at::AutoGradMode grad_mode(record);
    std::vector<at::Tensor> outs = Run(*m, args);
    // Buffers' new values cross with no graph (as the Python path's).
    for (int64_t i = 0; i < m->num_state_outputs && i < static_cast<int64_t>(outs.size()); ++i) {
      outs[i] = outs[i].detach();
    }
    if (static_cast<int64_t>(outs.size()) + 1 != num_outputs) {
      SetError(error, error_size,
               "the program returned " + std::to_string(outs.size()) +
                   " tensors, the op declares " + std::to_string(num_outputs - 1));
      return 1;
    }
    for (const at::Tensor& out : outs) made.push_back(Export(out));
    DLManagedTensor* handle = nullptr;
    if (record) {
      auto rec = std::make_unique<Record>();
      rec->args = std::move(args);
      rec->outs = std::move(outs);
      handle = xla ? Export(MakeIdHandle(&m->records, std::move(rec), xla->backwards.load()))
                   : at::toDLPack(MakeHandle(&m->records, std::move(rec)));
    } else if (xla) {
      handle = Export(at::zeros({1}, at::kLong));  // no record (id 0)
    }
    outputs[0] = handle;
    for (size_t i = 0; i < made.size(); ++i) outputs[i + 1] = made[i];
    return 0;
  } catch (const std::exception& e) {
    return Fail(inputs, num_inputs, &made, e, error, error_size);
  }
}

// The backward; `by_id`: the handle is an id (an op under XLA), and the
// record is dropped once its last traced backward has run.
int BackwardImpl(Module* m, bool by_id, DLManagedTensor** inputs,
                 int64_t num_inputs, const uint8_t* required,
                 DLManagedTensor** outputs, int64_t num_outputs, char* error,
                 int64_t error_size) {
  std::vector<DLManagedTensor*> made;
  if (num_inputs < 1) {
    SetError(error, error_size, "an op with no handle input");
    return 1;
  }
  try {
    if (m->num_threads > 0 && at::get_num_threads() != m->num_threads) {
      at::set_num_threads(m->num_threads);
    }
    std::vector<at::Tensor> in;
    for (int64_t i = 0; i < num_inputs; ++i) {
      in.push_back(at::fromDLPack(inputs[i]));
      inputs[i] = nullptr;
    }
    std::unique_ptr<Record> last;  // a record under XLA, taken by its last backward
    Record* rec = FindRecord(&m->records, in[0], by_id, &last);
    if (rec == nullptr) {
      SetError(error, error_size,
               by_id ? "no forward record for this handle under XLA (no tape "
                       "recorded the forward when it was traced, or its "
                       "traced backwards already ran)"
                     : "no forward record for this handle");
      return 1;
    }
    // Under XLA, with dimensions unknown when it was traced, the op passes
    // after those one empty tensor per forward argument, whose shape tells
    // XLA's compiler that of the argument's gradient (not read here).
    const int64_t carriers =
        num_inputs - static_cast<int64_t>(rec->outs.size()) - 1;
    if (num_outputs != static_cast<int64_t>(rec->args.size()) ||
        (carriers != 0 && carriers != num_outputs)) {
      SetError(error, error_size,
               "the op's inputs (the handle, one gradient per output) or "
               "outputs (one per forward argument) do not match its forward");
      return 1;
    }
    // Outputs with no graph (integer, or not depending on a leaf) give
    // nothing; arguments with no path from the outputs get zeros.
    std::vector<at::Tensor> outs, dys, wanted;
    std::vector<int64_t> index;
    for (size_t i = 0; i < rec->outs.size(); ++i) {
      if (rec->outs[i].requires_grad()) {
        outs.push_back(rec->outs[i]);
        dys.push_back(in[i + 1]);
      }
    }
    std::vector<int64_t> zeros;  // asked for, but no leaf (an eager op asks for all)
    for (int64_t k = 0; k < num_outputs; ++k) {
      if (!required[k]) continue;
      if (!rec->args[k].requires_grad()) {
        zeros.push_back(k);
        continue;
      }
      wanted.push_back(rec->args[k]);
      index.push_back(k);
    }
    std::vector<at::Tensor> grads;
    if (!outs.empty() && !wanted.empty()) {
      // The graph is kept: a persistent tape may ask for this backward again
      // (it goes with the handle).
      grads = torch::autograd::grad(outs, wanted, dys, /*retain_graph=*/true,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } else {
      grads.resize(wanted.size());
    }
    std::vector<DLManagedTensor*> result(num_outputs, nullptr);
    for (size_t j = 0; j < wanted.size(); ++j) {
      at::Tensor g = grads[j].defined() ? grads[j] : at::zeros_like(wanted[j]);
      result[index[j]] = Export(g);
      made.push_back(result[index[j]]);
    }
    for (int64_t k : zeros) {
      result[k] = Export(at::zeros_like(rec->args[k]));
      made.push_back(result[k]);
    }
    for (int64_t k = 0; k < num_outputs; ++k) outputs[k] = result[k];
    return 0;
  } catch (const std::exception& e) {
    return Fail(inputs, num_inputs, &made, e, error, error_size);
  }
}

}  // namespace

// C linkage inside the namespace: ctypes finds them by their plain names.
extern "C" {

// Results copied to be handed over so far: counts[0] tensors, counts[1] bytes.
void tbe_copies(int64_t* counts) {
  counts[0] = g_copies.load(std::memory_order_relaxed);
  counts[1] = g_copied_bytes.load(std::memory_order_relaxed);
}

int tbe_forward(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                const uint8_t* required, DLManagedTensor** outputs,
                int64_t num_outputs, char* error, int64_t error_size) {
  return ForwardImpl(static_cast<Module*>(context), nullptr, inputs, num_inputs,
                     required, outputs, num_outputs, error, error_size);
}

int tbe_backward(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                 const uint8_t* required, DLManagedTensor** outputs,
                 int64_t num_outputs, char* error, int64_t error_size) {
  return BackwardImpl(static_cast<Module*>(context), false, inputs, num_inputs,
                      required, outputs, num_outputs, error, error_size);
}

// Under XLA: the context of one forward op (see XlaOp), and its callbacks.
void* tbe_xla_op_new(void* module, int record) {
  auto* op = new XlaOp;
  op->m = static_cast<Module*>(module);
  op->record = record;
  return op;
}

void tbe_xla_op_set_backwards(void* op, int64_t backwards) {
  static_cast<XlaOp*>(op)->backwards = backwards;
}

int tbe_forward_xla(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                    const uint8_t* required, DLManagedTensor** outputs,
                    int64_t num_outputs, char* error, int64_t error_size) {
  auto* op = static_cast<XlaOp*>(context);
  return ForwardImpl(op->m, op, inputs, num_inputs, required, outputs,
                     num_outputs, error, error_size);
}

int tbe_backward_xla(void* context, DLManagedTensor** inputs,
                     int64_t num_inputs, const uint8_t* required,
                     DLManagedTensor** outputs, int64_t num_outputs,
                     char* error, int64_t error_size) {
  return BackwardImpl(static_cast<Module*>(context), true, inputs, num_inputs,
                      required, outputs, num_outputs, error, error_size);
}

}  // extern "C"

}  // namespace torchbridge::exported
