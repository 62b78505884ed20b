// The C++ torch runner's interpreter: runs a program (program.h) as eager
// torch runs its graph, one boxed dispatcher call per ATen node, which
// records autograd as an eager call does; lists, getitem and the arithmetic
// on sizes (torch.export's SymInts) in between, as Python computes them.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "program.h"

namespace torchbridge::exported {
namespace {

c10::IValue Resolve(const Value& v, const std::vector<c10::IValue>& slots) {
  if (!v.is_slot) return v.constant;
  return v.wrap ? c10::IValue(WrappedNumber(slots[v.slot])) : slots[v.slot];
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

}  // namespace

at::Tensor WrappedNumber(const c10::IValue& number) {
  at::Tensor t = number.isDouble() ? at::scalar_tensor(number.toDouble(), at::kDouble)
                 : number.isBool() ? at::scalar_tensor(number.toBool(), at::kBool)
                                   : at::scalar_tensor(number.toInt(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
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

}  // namespace torchbridge::exported
