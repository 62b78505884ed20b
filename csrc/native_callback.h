// C++ callbacks: a TorchbridgeCall op whose callback_id has a C function
// registered here runs that function instead of Python (CPU kernel only),
// with no GIL and no Python object made. For code that runs a torch model
// without Python: the C++ torch runner, which runs the graph calls of
// `TorchModule(..., run="torch")` captured with torch.export (exported/, a
// library of its own built by torchbridge/_native/_exported.py), and the
// benchmarks' no-Python bridge (benchmarks/scripted_native.py).
//
// The ABI is C and DLPack, so the library that registers a callback needs
// none of this library's headers, TF's or torch's in common.
// RunNativeCallback is the kernel's side of a call.

#ifndef TORCHBRIDGE_CSRC_NATIVE_CALLBACK_H_
#define TORCHBRIDGE_CSRC_NATIVE_CALLBACK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "adopted_buffer.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace torchbridge {

// Called with `num_inputs` DLPack tensors over the op's inputs (it owns each
// from the call on, also on failure: it calls their deleters, or hands them
// to a framework that will) and `required[i]` != 0 for each of the op's
// `num_outputs` outputs that the running graph consumes. On success it
// returns 0 and sets `outputs[i]` to a DLPack tensor TF can adopt as it is
// (adopt_rules.h: dense row-major, 64-byte aligned, the declared dtype and
// shape, on the CPU), or to nullptr for an output not required; their deleters must not
// need the GIL. On failure it returns non-zero, writes a message (at most
// `error_size` bytes, NUL-terminated) to `error`, and sets no output.
using NativeCallback = int (*)(void* context, DLManagedTensor** inputs,
                               int64_t num_inputs, const uint8_t* required,
                               DLManagedTensor** outputs, int64_t num_outputs,
                               char* error, int64_t error_size);

struct NativeCallbackEntry {
  NativeCallback function = nullptr;
  void* context = nullptr;
};

// The callback registered for `callback_id`: true and `*entry` set, or
// false (the op then calls Python). Lock-free while none is registered.
bool FindNativeCallback(int64_t callback_id, NativeCallbackEntry* entry);

// Runs `native` on `inputs` (which it takes over) for the CPU kernel of op
// `where`, whose outputs have `types` and, unless empty, `shapes`, and of
// which the graph consumes those `required` says. Checks every output as
// the kernel checks Python's, and fills `outputs` only if all pass; on a
// failure it frees what the callback made and returns the error.
absl::Status RunNativeCallback(
    const NativeCallbackEntry& native, const std::string& where,
    const std::vector<bool>& required,
    const std::vector<tensorflow::DataType>& types,
    const std::vector<tensorflow::PartialTensorShape>& shapes,
    std::vector<DLManagedTensor*>* inputs, std::vector<Managed>* outputs);

}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_NATIVE_CALLBACK_H_
