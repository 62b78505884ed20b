// The program's format as Python hands it over (program.h): the `tbe_*`
// entry points torchbridge/_native/_exported_program.py calls, through
// ctypes, for each node of the exported ATen graph in its order, then
// `tbe_finish`, which checks every node against its op's schema.

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "program.h"

namespace torchbridge::exported {
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

// C linkage inside the namespace: ctypes finds them by their plain names.
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

}  // extern "C"

}  // namespace torchbridge::exported
