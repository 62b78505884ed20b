// The C++ torch runner: a module's graph call captured with torch.export
// (torchbridge/_state/_torch_runner.py) and run from the native op's CPU
// kernel as C++ callbacks (../native_callback.h), with no GIL and no
// Python per call. The exported ATen graph is handed over node by node
// (`tbe_*` below) and run as eager torch runs it: one boxed dispatcher call
// per node, which records autograd as an eager call does. A library of its
// own, built on first use (torchbridge/_native/_exported.py): torch's
// dispatcher headers cost the op's own build nothing.
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
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// An argument's value: a constant, or the slot a node's result is in.
struct Value {
  bool is_slot = false;
  bool wrap = false;  // a number passed for a Tensor: a 0-d "wrapped number"
  int64_t slot = 0;
  c10::IValue constant;
};

// A number as eager torch passes it for a Tensor argument (`x * 2.0`): a
// 0-d tensor marked as a wrapped number, so type promotion treats it as a
// Python scalar.
at::Tensor WrappedNumber(const c10::IValue& number) {
  at::Tensor t = number.isDouble() ? at::scalar_tensor(number.toDouble(), at::kDouble)
                 : number.isBool() ? at::scalar_tensor(number.toBool(), at::kBool)
                                   : at::scalar_tensor(number.toInt(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// The list kinds of the schemas' list arguments.
enum ListKind : int64_t { kInts = 0, kDoubles = 1, kBools = 2, kTensors = 3, kOptionalTensors = 4 };

struct Arg {
  bool is_list = false;
  int64_t list_kind = kInts;
  Value value;               // not a list
  std::vector<Value> items;  // a list, built per call unless all constant
};

// Python's arithmetic and comparisons on sizes (torch.export's SymInts).
enum IntOp : int64_t { kAdd, kSub, kMul, kFloorDiv, kMod, kLt, kLe, kGt, kGe, kEq, kNe, kNeg, kTrueDiv };

struct Step {
  enum Kind { kOp, kGetItem, kArith } kind = kOp;
  std::optional<c10::OperatorHandle> op;
  std::vector<Arg> args;
  int64_t first_out = 0;  // the slot of its first result
  int64_t num_out = 0;
  int64_t index = 0;  // kGetItem: the element; kArith: the IntOp
};

struct Record {
  std::vector<at::Tensor> args;  // the forward's arguments, leaves where floating
  std::vector<at::Tensor> outs;  // its outputs, and through them its graph
};

struct Module {
  int64_t num_inputs = 0;  // slots [0, num_inputs): the program's arguments
  int64_t num_slots = 0;
  std::vector<Step> steps;
  std::vector<int64_t> outputs;   // the slots of the program's results
  int64_t num_state_outputs = 0;  // leading results: buffers' new values
  std::vector<uint8_t> leaves;    // arguments that get gradients (floating)
  bool finished = false;
  int num_threads = 0;  // the user's torch thread count, for the calling thread
  std::mutex mutex;
  std::unordered_map<void*, std::unique_ptr<Record>> records;  // handle -> record
  int64_t records_made = 0;
  // Under XLA (jit_compile=True) the handle is an int64 id, and the record
  // lives here until as many backwards as were traced with it took it.
  std::unordered_map<int64_t, std::pair<std::unique_ptr<Record>, int64_t>> records_by_id;
  int64_t next_id = 1;
};

// One forward op under XLA: its module, whether a tape recorded it when it
// was traced, and how many backward ops were traced for it (set from Python
// as they are). Never freed, as programs are not.
struct XlaOp {
  Module* m = nullptr;
  std::atomic<int> record{0};
  std::atomic<int64_t> backwards{0};
};

c10::IValue Resolve(const Value& v, const std::vector<c10::IValue>& slots) {
  if (!v.is_slot) return v.constant;
  return v.wrap ? c10::IValue(WrappedNumber(slots[v.slot])) : slots[v.slot];
}

c10::IValue BuildList(int64_t kind, const std::vector<Value>& items,
                      const std::vector<c10::IValue>& slots) {
  switch (kind) {
    case kInts: {
      c10::List<int64_t> list;
      list.reserve(items.size());
      for (const Value& v : items) list.push_back(Resolve(v, slots).toInt());
      return list;
    }
    case kDoubles: {
      c10::List<double> list;
      for (const Value& v : items) list.push_back(Resolve(v, slots).toDouble());
      return list;
    }
    case kBools: {
      c10::List<bool> list;
      for (const Value& v : items) list.push_back(Resolve(v, slots).toBool());
      return list;
    }
    case kTensors: {
      c10::List<at::Tensor> list;
      list.reserve(items.size());
      for (const Value& v : items) list.push_back(Resolve(v, slots).toTensor());
      return list;
    }
    case kOptionalTensors: {
      c10::List<std::optional<at::Tensor>> list;
      for (const Value& v : items) {
        c10::IValue item = Resolve(v, slots);
        list.push_back(item.isNone() ? std::optional<at::Tensor>()
                                     : std::optional<at::Tensor>(item.toTensor()));
      }
      return list;
    }
  }
  throw std::runtime_error("unknown list kind " + std::to_string(kind));
}

c10::IValue Arithmetic(int64_t op, const c10::IValue& a, const c10::IValue& b) {
  if (op == kNeg) return a.isDouble() ? c10::IValue(-a.toDouble()) : c10::IValue(-a.toInt());
  const bool real = a.isDouble() || b.isDouble() || op == kTrueDiv;
  if (real) {
    const double x = a.isDouble() ? a.toDouble() : static_cast<double>(a.toInt());
    const double y = b.isDouble() ? b.toDouble() : static_cast<double>(b.toInt());
    switch (op) {
      case kAdd: return x + y;
      case kSub: return x - y;
      case kMul: return x * y;
      case kTrueDiv: return x / y;
      case kFloorDiv: return std::floor(x / y);
      case kMod: return x - std::floor(x / y) * y;
      case kLt: return x < y;
      case kLe: return x <= y;
      case kGt: return x > y;
      case kGe: return x >= y;
      case kEq: return x == y;
      case kNe: return x != y;
    }
  } else {
    const int64_t x = a.isBool() ? a.toBool() : a.toInt();
    const int64_t y = b.isBool() ? b.toBool() : b.toInt();
    switch (op) {
      case kAdd: return x + y;
      case kSub: return x - y;
      case kMul: return x * y;
      case kFloorDiv: {  // Python's: rounds toward minus infinity
        if (y == 0) throw std::runtime_error("integer division by zero");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return q;
      }
      case kMod: {
        if (y == 0) throw std::runtime_error("integer modulo by zero");
        int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return r;
      }
      case kLt: return x < y;
      case kLe: return x <= y;
      case kGt: return x > y;
      case kGe: return x >= y;
      case kEq: return x == y;
      case kNe: return x != y;
    }
  }
  throw std::runtime_error("unknown arithmetic " + std::to_string(op));
}

// Runs the program on `args` (in slot order); returns its results.
std::vector<at::Tensor> Run(const Module& m, std::vector<at::Tensor> args) {
  std::vector<c10::IValue> slots(static_cast<size_t>(m.num_slots));
  for (size_t i = 0; i < args.size(); ++i) slots[i] = std::move(args[i]);
  std::vector<c10::IValue> stack;  // a boxed call's arguments, then results
  for (const Step& step : m.steps) {
    switch (step.kind) {
      case Step::kOp: {
        stack.clear();
        stack.reserve(step.args.size());
        for (const Arg& arg : step.args) {
          if (arg.is_list) {
            stack.push_back(BuildList(arg.list_kind, arg.items, slots));
          } else {
            stack.push_back(Resolve(arg.value, slots));
          }
        }
        step.op->callBoxed(&stack);
        if (static_cast<int64_t>(stack.size()) != step.num_out) {
          throw std::runtime_error(step.op->schema().name() + " returned " +
                                   std::to_string(stack.size()) + " values, expected " +
                                   std::to_string(step.num_out));
        }
        for (int64_t j = 0; j < step.num_out; ++j) slots[step.first_out + j] = std::move(stack[j]);
        break;
      }
      case Step::kGetItem: {
        c10::IValue list = Resolve(step.args[0].value, slots);
        if (list.isTuple()) {
          slots[step.first_out] = list.toTupleRef().elements().at(step.index);
        } else {
          slots[step.first_out] = list.toListRef().at(step.index);
        }
        break;
      }
      case Step::kArith: {
        c10::IValue a = Resolve(step.args[0].value, slots);
        c10::IValue b = step.args.size() > 1 ? Resolve(step.args[1].value, slots) : a;
        slots[step.first_out] = Arithmetic(step.index, a, b);
        break;
      }
    }
  }
  std::vector<at::Tensor> outs;
  outs.reserve(m.outputs.size());
  for (int64_t slot : m.outputs) outs.push_back(slots[slot].toTensor());
  return outs;
}

// Results copied to be handed over (strided or misaligned), and their
// bytes: tb.exchange_stats() reads them (tbe_copies).
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

// Under XLA nothing frees a record whose traced backwards do not all run
// (an eager tape around the compiled function that is never asked): say so
// at 1,000 records waiting, and at each tenfold, as `_saved.own_id` does for
// the Python path.
void WarnIfMany(int64_t waiting) {
  if (waiting < 1000) return;
  int64_t mark = 1000;
  while (mark * 10 <= waiting) mark *= 10;
  if (waiting != mark) return;
  std::fprintf(
      stderr,
      "torchbridge: %lld records of torch calls compiled with XLA "
      "(jit_compile=True) are waiting for gradients that have not run. A "
      "tf.GradientTape outside the compiled function records each call, and "
      "one that is never asked (or a persistent one asked fewer times than "
      "TF traced its gradient) keeps that torch state for the life of the "
      "process. Open the GradientTape inside the jit-compiled function, or "
      "call it outside any tape (or under tape.stop_recording()).\n",
      static_cast<long long>(waiting));
}

// A handle under XLA: an int64 id of `record`, which lives until
// `backwards` (at least 1) backward calls took it.
at::Tensor MakeIdHandle(Module* m, std::unique_ptr<Record> record, int64_t backwards) {
  at::Tensor handle = at::empty({1}, at::kLong);
  std::lock_guard<std::mutex> lock(m->mutex);
  const int64_t id = m->next_id++;
  handle.data_ptr<int64_t>()[0] = id;
  m->records_by_id[id] = {std::move(record), backwards > 0 ? backwards : 1};
  ++m->records_made;
  WarnIfMany(static_cast<int64_t>(m->records_by_id.size()));
  return handle;
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

// Building a program, node by node, in the exported graph's order. The
// slots [0, num_inputs) hold the arguments; each node's results take the
// next slots, and the functions that begin a node return its first.
void* tbe_new(int64_t num_inputs, int64_t num_threads) {
  auto* m = new Module();
  m->num_inputs = m->num_slots = num_inputs;
  m->num_threads = static_cast<int>(num_threads);
  return m;
}

namespace {
int64_t Begin(Module* m, Step step, int64_t num_out) {
  step.first_out = m->num_slots;
  step.num_out = num_out;
  m->num_slots += num_out;
  m->steps.push_back(std::move(step));
  return m->steps.back().first_out;
}

void AddValue(Module* m, Value value) {
  Arg& arg = m->steps.back().args.back();
  if (arg.is_list) {
    arg.items.push_back(std::move(value));
  } else {
    arg.value = std::move(value);
  }
}

Value Constant(c10::IValue v) {
  Value value;
  value.constant = std::move(v);
  return value;
}
}  // namespace

// A call of the ATen op `name` (e.g. "aten::addmm") and `overload` ("" for
// the default) with `num_out` results; -1 and `error` if torch has no such op.
int64_t tbe_op(void* module, const char* name, const char* overload, int64_t num_out,
               char* error, int64_t error_size) {
  try {
    Step step;
    step.op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    return Begin(static_cast<Module*>(module), std::move(step), num_out);
  } catch (const std::exception& e) {
    SetError(error, error_size, e.what());
    return -1;
  }
}

// Element `index` of a list or tuple (one argument follows).
int64_t tbe_getitem(void* module, int64_t index) {
  Step step;
  step.kind = Step::kGetItem;
  step.index = index;
  return Begin(static_cast<Module*>(module), std::move(step), 1);
}

// Python's arithmetic on sizes (an IntOp; one or two arguments follow).
int64_t tbe_arith(void* module, int64_t op) {
  Step step;
  step.kind = Step::kArith;
  step.index = op;
  return Begin(static_cast<Module*>(module), std::move(step), 1);
}

// The next argument of the node begun last: a list of `list_kind`, or
// (-1) one value; the tbe_value_* calls that follow fill it.
void tbe_arg(void* module, int64_t list_kind) {
  Arg arg;
  arg.is_list = list_kind >= 0;
  arg.list_kind = list_kind;
  static_cast<Module*>(module)->steps.back().args.push_back(std::move(arg));
}

void tbe_value_slot(void* module, int64_t slot) {
  Value value;
  value.is_slot = true;
  value.slot = slot;
  AddValue(static_cast<Module*>(module), std::move(value));
}
// A number for a Tensor argument: from a slot, or (`kind` 0 int, 1 double,
// 2 bool) a constant.
void tbe_value_wrapped_slot(void* module, int64_t slot) {
  Value value;
  value.is_slot = true;
  value.wrap = true;
  value.slot = slot;
  AddValue(static_cast<Module*>(module), std::move(value));
}
void tbe_value_wrapped(void* module, int64_t kind, double v) {
  c10::IValue number = kind == 1   ? c10::IValue(v)
                       : kind == 2 ? c10::IValue(v != 0)
                                   : c10::IValue(static_cast<int64_t>(v));
  AddValue(static_cast<Module*>(module), Constant(WrappedNumber(number)));
}
void tbe_value_none(void* module) { AddValue(static_cast<Module*>(module), Constant({})); }
void tbe_value_int(void* module, int64_t v) {
  AddValue(static_cast<Module*>(module), Constant(v));
}
void tbe_value_double(void* module, double v) {
  AddValue(static_cast<Module*>(module), Constant(v));
}
void tbe_value_bool(void* module, int v) {
  AddValue(static_cast<Module*>(module), Constant(v != 0));
}
void tbe_value_str(void* module, const char* v) {
  AddValue(static_cast<Module*>(module), Constant(std::string(v)));
}
int tbe_value_device(void* module, const char* v, char* error, int64_t error_size) {
  try {
    AddValue(static_cast<Module*>(module), Constant(c10::Device(std::string(v))));
    return 0;
  } catch (const std::exception& e) {
    SetError(error, error_size, e.what());
    return 1;
  }
}

// The program's results (their slots; the first `num_state` are buffers'
// new values, handed back with no graph): checks every node's arguments
// against its op's schema. 0, or 1 and `error`.
int tbe_finish(void* module, const int64_t* outputs, int64_t num_outputs, int64_t num_state,
               const uint8_t* leaves, char* error, int64_t error_size) {
  auto* m = static_cast<Module*>(module);
  try {
    for (Step& step : m->steps) {
      if (step.kind == Step::kOp) {
        const auto& schema = step.op->schema();
        if (schema.arguments().size() != step.args.size() ||
            schema.returns().size() != static_cast<size_t>(step.num_out)) {
          throw std::runtime_error(schema.name() + "." + schema.overload_name() + " takes " +
                                   std::to_string(schema.arguments().size()) +
                                   " arguments and gives " +
                                   std::to_string(schema.returns().size()) +
                                   " results; the program has " +
                                   std::to_string(step.args.size()) + " and " +
                                   std::to_string(step.num_out));
        }
      }
      for (Arg& arg : step.args) {  // constant lists are built once
        if (!arg.is_list) continue;
        bool constant = true;
        for (const Value& v : arg.items) constant = constant && !v.is_slot;
        if (constant) {
          arg.value = Constant(BuildList(arg.list_kind, arg.items, {}));
          arg.is_list = false;
          arg.items.clear();
        }
      }
    }
    for (int64_t i = 0; i < num_outputs; ++i) {
      if (outputs[i] < 0 || outputs[i] >= m->num_slots) throw std::runtime_error("bad output slot");
      m->outputs.push_back(outputs[i]);
    }
    m->num_state_outputs = num_state;
    m->leaves.assign(leaves, leaves + m->num_inputs);
    m->finished = true;
    return 0;
  } catch (const std::exception& e) {
    SetError(error, error_size, e.what());
    return 1;
  }
}

// Results copied to be handed over so far: counts[0] tensors, counts[1] bytes.
void tbe_copies(int64_t* counts) {
  counts[0] = g_copies.load(std::memory_order_relaxed);
  counts[1] = g_copied_bytes.load(std::memory_order_relaxed);
}

// Records alive (`made`: 0), or made so far (`made`: 1).
int64_t tbe_records(void* module, int made) {
  auto* m = static_cast<Module*>(module);
  std::lock_guard<std::mutex> lock(m->mutex);
  return made ? m->records_made
              : static_cast<int64_t>(m->records.size() + m->records_by_id.size());
}

}  // extern "C"

namespace {

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
      handle = xla ? Export(MakeIdHandle(m, std::move(rec), xla->backwards.load()))
                   : at::toDLPack(MakeHandle(m, std::move(rec)));
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
    Record* rec = nullptr;
    std::unique_ptr<Record> last;  // a record under XLA, taken by its last backward
    {
      std::lock_guard<std::mutex> lock(m->mutex);
      if (by_id) {
        auto it = m->records_by_id.find(in[0].data_ptr<int64_t>()[0]);
        if (it != m->records_by_id.end()) {
          rec = it->second.first.get();
          if (--it->second.second <= 0) {
            last = std::move(it->second.first);
            m->records_by_id.erase(it);
          }
        }
      } else {
        auto it = m->records.find(in[0].data_ptr());
        if (it != m->records.end()) rec = it->second.get();
      }
    }
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

extern "C" {

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
