// A TorchScript module run from the native op's kernel with no Python: the
// C++ callbacks (csrc/native_callback.h) of benchmarks/scripted_native.py.
//
// `tbs_load` loads a module saved by `torch.jit.save` whose forward takes
// the op's inputs (the module's inputs, then its parameters) and returns a
// tensor or a tuple of tensors. `tbs_forward` runs it (recording autograd
// when the op's handle output, output 0, is consumed) and returns the
// handle and the outputs; `tbs_backward` takes the handle and one gradient
// per output and returns the gradients of the forward's arguments that the
// graph consumes. The handle is a one-byte torch tensor whose memory's
// deleter frees the forward's record when TF frees the handle.
//
// `tbs_bare` is the floor of such a bridge: a callback that hands back
// fresh, uncomputed torch tensors of the shapes given to `tbs_bare_new`,
// as benchmarks/bare_native.py's floor does from Python.
//
// For the benchmarks only: float inputs, fixed shapes, no double backward.
// Modules and shape lists are never freed (a handle's deleter may run
// after its forward's op is gone): one of each per traced shape.

#include <ATen/DLConvertor.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

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
  std::vector<at::Tensor> args;  // leaves that require grad
  std::vector<at::Tensor> outs;  // their graph
};

struct Module {
  torch::jit::Module module;
  std::mutex mutex;
  std::unordered_map<void*, std::unique_ptr<Record>> records;  // handle -> record
  int64_t records_made = 0;
};

struct Shapes {
  std::vector<std::vector<int64_t>> outputs;
};

void SetError(char* error, int64_t size, const std::string& message) {
  if (size <= 0) return;
  std::strncpy(error, message.c_str(), static_cast<size_t>(size - 1));
  error[size - 1] = '\0';
}

// A DLPack tensor TF can adopt as it is: dense row-major, 64-byte aligned.
DLManagedTensor* Export(at::Tensor t) {
  t = t.detach();
  if (!t.is_contiguous() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 != 0) {
    t = t.clone(at::MemoryFormat::Contiguous);
  }
  return at::toDLPack(t);
}

at::Tensor MakeHandle(Module* m, std::unique_ptr<Record> record) {
  void* memory = std::aligned_alloc(64, 64);
  {
    std::lock_guard<std::mutex> lock(m->mutex);
    m->records[memory] = std::move(record);
    ++m->records_made;
  }
  return at::from_blob(
      memory, {1},
      [m](void* p) {
        std::unique_ptr<Record> dropped;
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

}  // namespace

extern "C" {

void* tbs_load(const char* path, char* error, int64_t error_size) {
  try {
    auto* m = new Module{torch::jit::load(path)};
    m->module.eval();
    return m;
  } catch (const std::exception& e) {
    SetError(error, error_size, e.what());
    return nullptr;
  }
}

// Records alive (`made`: 0), or made so far (`made`: 1).
int64_t tbs_records(void* module, int made) {
  auto* m = static_cast<Module*>(module);
  std::lock_guard<std::mutex> lock(m->mutex);
  return made ? m->records_made : static_cast<int64_t>(m->records.size());
}

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
    SetError(error, error_size, "tbs_bare: the op's outputs are not the context's");
    return 1;
  }
  for (int64_t i = 0; i < num_outputs; ++i) {
    outputs[i] = at::toDLPack(at::empty(shapes[i], at::kFloat));
  }
  return 0;
}

int tbs_forward(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                const uint8_t* required, DLManagedTensor** outputs,
                int64_t num_outputs, char* error, int64_t error_size) {
  auto* m = static_cast<Module*>(context);
  std::vector<DLManagedTensor*> made;
  if (num_outputs < 1) {  // the handle, then the module's outputs
    for (int64_t i = 0; i < num_inputs; ++i) inputs[i]->deleter(inputs[i]);
    SetError(error, error_size, "tbs_forward: an op with no handle output");
    return 1;
  }
  try {
    const bool record = required[0] != 0;
    std::vector<at::Tensor> args;
    args.reserve(num_inputs);
    for (int64_t i = 0; i < num_inputs; ++i) {
      at::Tensor t = at::fromDLPack(inputs[i]);
      inputs[i] = nullptr;
      args.push_back(record ? t.detach().requires_grad_(true) : t);
    }
    std::vector<torch::jit::IValue> stack(args.begin(), args.end());
    at::AutoGradMode grad_mode(record);
    // TorchScript's interpreter op by op, as eager torch runs them: the
    // profiling executor's specializations and re-profiling made the TD3
    // step 2.4x slower here.
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
               "the module returned " + std::to_string(outs.size()) +
                   " tensors, the op declares " + std::to_string(num_outputs - 1));
      return 1;
    }
    for (size_t i = 0; i < outs.size(); ++i) made.push_back(Export(outs[i]));
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
    for (int64_t i = 0; i < num_inputs; ++i) {
      if (inputs[i]) inputs[i]->deleter(inputs[i]);
    }
    for (DLManagedTensor* d : made) d->deleter(d);
    SetError(error, error_size, e.what());
    return 1;
  }
}

int tbs_backward(void* context, DLManagedTensor** inputs, int64_t num_inputs,
                 const uint8_t* required, DLManagedTensor** outputs,
                 int64_t num_outputs, char* error, int64_t error_size) {
  auto* m = static_cast<Module*>(context);
  std::vector<DLManagedTensor*> made;
  try {
    std::vector<at::Tensor> in;
    if (num_inputs < 1) {
      SetError(error, error_size, "tbs_backward: an op with no handle input");
      return 1;
    }
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
               "tbs_backward: the op's inputs (the handle, one gradient per "
               "output) or outputs (one per forward argument) do not match "
               "its forward");
      return 1;
    }
    std::vector<at::Tensor> wanted;
    std::vector<int64_t> index;
    for (int64_t k = 0; k < num_outputs; ++k) {
      if (required[k]) {
        wanted.push_back(rec->args[k]);
        index.push_back(k);
      }
    }
    std::vector<at::Tensor> dys(in.begin() + 1, in.end());
    std::vector<at::Tensor> grads = torch::autograd::grad(
        rec->outs, wanted, dys, /*retain_graph=*/false, /*create_graph=*/false,
        /*allow_unused=*/true);
    std::vector<DLManagedTensor*> result(num_outputs, nullptr);
    for (size_t j = 0; j < grads.size(); ++j) {
      at::Tensor g = grads[j].defined() ? grads[j] : at::zeros_like(wanted[j]);
      result[index[j]] = Export(g);
      made.push_back(result[index[j]]);
    }
    for (int64_t k = 0; k < num_outputs; ++k) outputs[k] = result[k];
    return 0;
  } catch (const std::exception& e) {
    for (int64_t i = 0; i < num_inputs; ++i) {
      if (inputs[i]) inputs[i]->deleter(inputs[i]);
    }
    for (DLManagedTensor* d : made) d->deleter(d);
    SetError(error, error_size, e.what());
    return 1;
  }
}

}  // extern "C"
