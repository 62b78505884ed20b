// The C++ torch runner's program: a torch.export graph as a list of steps
// over numbered slots. Python hands it over node by node (program.cc, from
// torchbridge/_native/_exported_program.py); the interpreter
// (interpreter.cc) runs it; the callbacks (exported_call.cc) run it for the
// op and keep its records (records.h).

#ifndef TORCHBRIDGE_CSRC_EXPORTED_PROGRAM_H_
#define TORCHBRIDGE_CSRC_EXPORTED_PROGRAM_H_

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "records.h"

namespace torchbridge::exported {

// An argument's value: a constant, or the slot a node's result is in.
struct Value {
  bool is_slot = false;
  bool wrap = false;  // a number passed for a Tensor: a 0-d "wrapped number"
  int64_t slot = 0;
  c10::IValue constant;
};

// The list kinds of the schemas' list arguments.
enum ListKind : int64_t {
  kInts = 0, kDoubles = 1, kBools = 2, kTensors = 3, kOptionalTensors = 4
};

struct Arg {
  bool is_list = false;
  int64_t list_kind = kInts;
  Value value;               // not a list
  std::vector<Value> items;  // a list, built per call unless all constant
};

// Python's arithmetic and comparisons on sizes (torch.export's SymInts).
enum IntOp : int64_t {
  kAdd, kSub, kMul, kFloorDiv, kMod, kLt, kLe, kGt, kGe, kEq, kNe, kNeg, kTrueDiv
};

struct Step {
  enum Kind { kOp, kGetItem, kArith } kind = kOp;
  std::optional<c10::OperatorHandle> op;
  std::vector<Arg> args;
  int64_t first_out = 0;  // the slot of its first result
  int64_t num_out = 0;
  int64_t index = 0;  // kGetItem: the element; kArith: the IntOp
};

// One captured signature's program. Never freed (a handle's deleter may run
// after its op's graph is gone): one per captured signature.
struct Module {
  int64_t num_inputs = 0;  // slots [0, num_inputs): the program's arguments
  int64_t num_slots = 0;
  std::vector<Step> steps;
  std::vector<int64_t> outputs;   // the slots of the program's results
  int64_t num_state_outputs = 0;  // leading results: buffers' new values
  std::vector<uint8_t> leaves;    // arguments that get gradients (floating)
  bool finished = false;
  int num_threads = 0;  // the user's torch thread count, for the calling thread
  Records records;      // its forwards' records, for their backwards
};

// A number as eager torch passes it for a Tensor argument (`x * 2.0`): a
// 0-d tensor marked as a wrapped number, so type promotion treats it as a
// Python scalar.
at::Tensor WrappedNumber(const c10::IValue& number);

// A list argument of `kind` (a ListKind) made of `items`, read from `slots`.
c10::IValue BuildList(int64_t kind, const std::vector<Value>& items,
                      const std::vector<c10::IValue>& slots);

// Runs the program on `args` (in slot order); returns its results.
std::vector<at::Tensor> Run(const Module& m, std::vector<at::Tensor> args);

// `message` into the caller's `error` (at most `size` bytes, NUL-terminated).
inline void SetError(char* error, int64_t size, const std::string& message) {
  if (size <= 0) return;
  std::strncpy(error, message.c_str(), static_cast<size_t>(size - 1));
  error[size - 1] = '\0';
}

}  // namespace torchbridge::exported

#endif  // TORCHBRIDGE_CSRC_EXPORTED_PROGRAM_H_
