// The C++ call path of `tb.TorchModule(..., torchscript=True)`: a module's
// forward traced to TorchScript (torch.jit.trace, its parameters and
// buffers as arguments before its inputs), run from the native op's CPU
// kernel as C++ callbacks (../native_callback.h), with no GIL and no
// Python per call. A library of its own, built on first use
// (torchbridge/_native/_traced.py): torch's TorchScript headers cost the
// op's own build nothing.
//
// `tbt_forward` runs the module (recording autograd when the op's handle
// output, output 0, is consumed) and returns the handle and the outputs;
// `tbt_backward` takes the handle and one gradient per output and returns
// the gradients of the forward's arguments that the graph consumes. The
// handle is a one-byte torch tensor whose memory's deleter frees the
// forward's record when TF frees the handle. Modules are never freed (a
// handle's deleter may run after its op's graph is gone): one per traced
// signature.

#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Record {
  std::vector<at::Tensor> args;  // the forward's arguments, leaves where floating
  std::vector<at::Tensor> outs;  // its outputs, and through them its graph
};

struct Module {
  torch::jit::Module module;
  int num_threads;  // the user's torch thread count, for the calling thread
  std::mutex mutex;
  std::unordered_map<void*, std::unique_ptr<Record>> records;  // handle -> record
  int64_t records_made = 0;
};

// Results copied to be handed over (strided or misaligned), and their
// bytes: tb.exchange_stats() reads them (tbt_copies).
std::atomic<int64_t> g_copies{0};
std::atomic<int64_t> g_copied_bytes{0};

void SetError(char* error, int64_t size, const std::string& message) {
  if (size <= 0) return;
  std::strncpy(error, message.c_str(), static_cast<size_t>(size - 1));
  error[size - 1] = '\0';
}

void FreeAll(DLManagedTensor** tensors, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (tensors[i]) tensors[i]->deleter(tensors[i]);
    tensors[i] = nullptr;
  }
}

// A DLPack tensor TF can adopt as it is: dense row-major, 64-byte aligned
// (a strided or offset result is copied once, as the Python path does).
DLManagedTensor* Export(at::Tensor t) {
  t = t.detach();
  if (!t.is_contiguous() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 != 0) {
    t = t.clone(at::MemoryFormat::Contiguous);
    g_copies.fetch_add(1, std::memory_order_relaxed);
    g_copied_bytes.fetch_add(static_cast<int64_t>(t.nbytes()), std::memory_order_relaxed);
  }
  return at::toDLPack(t);
}

at::Tensor MakeHandle(Module* m, std::unique_ptr<Record> record) {
  void* memory = std::aligned_alloc(64, 64);
  if (memory == nullptr) throw std::bad_alloc();
  {
    std::lock_guard<std::mutex> lock(m->mutex);
    m->records[memory] = std::move(record);
    ++m->records_made;
  }
  return at::from_blob(
      memory, {1},
      [m](void* p) {
        std::unique_ptr<Record> dropped;  // freed outside the lock
        {
          std::lock_guard<std::mutex> lock(m->mutex);
          auto it = m->records.find(p);
          if (it != m->records.end()) {
            dropped = std::move(it->second);
            m->records.erase(it);
          }
        }
        std::free(p);
      },
      at::TensorOptions().dtype(at::kChar));
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

}  // namespace

extern "C" {

// Loads a module saved by torch.jit.save; nullptr and `error` on failure.
void* tbt_load(const char* path, int64_t num_threads, char* error,
               int64_t error_size) {
  try {
    auto* m = new Module{torch::jit::load(path), static_cast<int>(num_threads)};
    m->module.eval();  // the traced graph holds the modes it was traced in
    return m;
  } catch (const std::exception& e) {
    SetError(error, error_size, e.what());
    return nullptr;
  }
}

// Results copied to be handed over so far: counts[0] tensors, counts[1] bytes.
void tbt_copies(int64_t* counts) {
  counts[0] = g_copies.load(std::memory_order_relaxed);
  counts[1] = g_copied_bytes.load(std::memory_order_relaxed);
}

// Records alive (`made`: 0), or made so far (`made`: 1).
int64_t tbt_records(void* module, int made) {
  auto* m = static_cast<Module*>(module);
  std::lock_guard<std::mutex> lock(m->mutex);
  return made ? m->records_made : static_cast<int64_t>(m->records.size());
}

int tbt_forward(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                const uint8_t* required, DLManagedTensor** outputs,
                int64_t num_outputs, char* error, int64_t error_size) {
  auto* m = static_cast<Module*>(context);
  std::vector<DLManagedTensor*> made;
  if (num_outputs < 1) {  // the handle, then the module's outputs
    FreeAll(inputs, num_inputs);
    SetError(error, error_size, "an op with no handle output");
    return 1;
  }
  try {
    if (m->num_threads > 0 && at::get_num_threads() != m->num_threads) {
      at::set_num_threads(m->num_threads);
    }
    const bool record = required[0] != 0;
    std::vector<at::Tensor> args;
    args.reserve(num_inputs);
    for (int64_t i = 0; i < num_inputs; ++i) {
      at::Tensor t = at::fromDLPack(inputs[i]);
      inputs[i] = nullptr;
      args.push_back(record && Differentiable(t) ? t.detach().requires_grad_(true) : t);
    }
    std::vector<torch::jit::IValue> stack(args.begin(), args.end());
    at::AutoGradMode grad_mode(record);
    // TorchScript's interpreter op by op, as eager torch runs them: its
    // profiling executor's specializations and re-profiling made the TD3
    // step 2.4x slower (benchmarks/scripted_native.py).
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    torch::jit::IValue result = m->module.forward(stack);
    std::vector<at::Tensor> outs;
    if (result.isTuple()) {
      for (const auto& v : result.toTupleRef().elements()) outs.push_back(v.toTensor());
    } else {
      outs.push_back(result.toTensor());
    }
    if (static_cast<int64_t>(outs.size()) + 1 != num_outputs) {
      SetError(error, error_size,
               "the traced module returned " + std::to_string(outs.size()) +
                   " tensors, the op declares " + std::to_string(num_outputs - 1));
      return 1;
    }
    for (const at::Tensor& out : outs) made.push_back(Export(out));
    DLManagedTensor* handle = nullptr;
    if (record) {
      auto rec = std::make_unique<Record>();
      rec->args = std::move(args);
      rec->outs = std::move(outs);
      handle = at::toDLPack(MakeHandle(m, std::move(rec)));
    }
    outputs[0] = handle;
    for (size_t i = 0; i < made.size(); ++i) outputs[i + 1] = made[i];
    return 0;
  } catch (const std::exception& e) {
    return Fail(inputs, num_inputs, &made, e, error, error_size);
  }
}

int tbt_backward(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                 const uint8_t* required, DLManagedTensor** outputs,
                 int64_t num_outputs, char* error, int64_t error_size) {
  auto* m = static_cast<Module*>(context);
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
    Record* rec = nullptr;
    {
      std::lock_guard<std::mutex> lock(m->mutex);
      auto it = m->records.find(in[0].data_ptr());
      if (it != m->records.end()) rec = it->second.get();
    }
    if (rec == nullptr) {
      SetError(error, error_size, "no forward record for this handle");
      return 1;
    }
    if (num_outputs != static_cast<int64_t>(rec->args.size()) ||
        num_inputs != static_cast<int64_t>(rec->outs.size()) + 1) {
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
    for (int64_t k = 0; k < num_outputs; ++k) {
      if (!required[k]) continue;
      if (!rec->args[k].requires_grad()) {
        SetError(error, error_size,
                 "a gradient was asked for argument " + std::to_string(k) +
                     ", which is not floating");
        return 1;
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
    for (int64_t k = 0; k < num_outputs; ++k) outputs[k] = result[k];
    return 0;
  } catch (const std::exception& e) {
    return Fail(inputs, num_inputs, &made, e, error, error_size);
  }
}

}  // extern "C"
