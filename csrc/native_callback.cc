// The registry of C++ callbacks (native_callback.h), their C entry points,
// and the kernel's side of a call.

#include "native_callback.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "dlpack_check.h"
#include "tensorflow/core/platform/errors.h"

namespace torchbridge {
namespace {

std::mutex g_native_mutex;
std::unordered_map<int64_t, NativeCallbackEntry>* g_callbacks = nullptr;
std::atomic<int64_t> g_native_count{0};  // entries in g_callbacks

}  // namespace

bool FindNativeCallback(int64_t callback_id, NativeCallbackEntry* entry) {
  if (g_native_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(g_native_mutex);
  auto it = g_callbacks->find(callback_id);
  if (it == g_callbacks->end()) return false;
  *entry = it->second;
  return true;
}

absl::Status RunNativeCallback(
    const NativeCallbackEntry& native, const std::string& where,
    const std::vector<bool>& required,
    const std::vector<tensorflow::DataType>& types,
    const std::vector<tensorflow::PartialTensorShape>& shapes,
    std::vector<DLManagedTensor*>* inputs, std::vector<Managed>* outputs) {
  const size_t n = types.size();
  std::vector<uint8_t> consumed(required.begin(), required.end());
  std::vector<DLManagedTensor*> made(n, nullptr);
  char error[1024] = {0};
  const int64_t num_inputs = static_cast<int64_t>(inputs->size());
  const int rc = native.function(native.context, inputs->data(), num_inputs,
                                 consumed.data(), made.data(),
                                 static_cast<int64_t>(n), error,
                                 static_cast<int64_t>(sizeof(error)));
  inputs->clear();  // the callback owns them now
  error[sizeof(error) - 1] = '\0';
  if (rc != 0) {
    return tensorflow::errors::Internal(where, ": its C++ callback failed: ",
                                        error);
  }
  absl::Status status;
  std::vector<Managed> taken(n);
  const DLDevice cpu{kDLCPU, 0};
  for (size_t i = 0; i < n; ++i) {
    Managed& m = taken[i];
    m.legacy = made[i];
    m.gil_free = true;  // the ABI's promise (native_callback.h)
    m.exported = true;
    if (!status.ok()) continue;
    if (!m) {
      if (required[i]) {
        status = tensorflow::errors::InvalidArgument(
            where, ": its C++ callback gave no tensor for output ", i,
            ", which the graph consumes");
      }
      continue;
    }
    const bool check_shape = !shapes.empty();
    status = CheckAdoptable(
        where, i, m.tensor(), types[i], check_shape,
        check_shape ? shapes[i] : tensorflow::PartialTensorShape(), cpu);
  }
  if (!status.ok()) {
    for (Managed& m : taken) {
      if (m) m.DeleteFromAnyThread();
    }
    return status;
  }
  // Every output adopted counts as a zero-copy crossing; a copy the
  // callback made to hand it over is its own.
  int64_t crossed = num_inputs;
  for (size_t i = 0; i < n; ++i) {
    if (taken[i]) ++crossed;
    (*outputs)[i] = taken[i];
  }
  g_zero_copy_count.fetch_add(crossed, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace torchbridge

extern "C" {

// Registers `function` (a torchbridge::NativeCallback) with `context` for
// the ops carrying `callback_id`; a null `function` removes the entry. The
// caller keeps `context` valid while the entry is registered and while any
// call that found it may still run (a call copies the entry and runs
// unlocked).
void torchbridge_set_native_callback(int64_t callback_id, void* function,
                                     void* context) {
  using torchbridge::g_callbacks;
  std::lock_guard<std::mutex> lock(torchbridge::g_native_mutex);
  if (g_callbacks == nullptr) {
    g_callbacks = new std::unordered_map<int64_t, torchbridge::NativeCallbackEntry>();
  }
  if (function == nullptr) {
    g_callbacks->erase(callback_id);
  } else {
    (*g_callbacks)[callback_id] = torchbridge::NativeCallbackEntry{
        reinterpret_cast<torchbridge::NativeCallback>(function), context};
  }
  torchbridge::g_native_count.store(static_cast<int64_t>(g_callbacks->size()),
                             std::memory_order_release);
}

// C++ callbacks registered now (tests read it).
int64_t torchbridge_native_callback_count() {
  return torchbridge::g_native_count.load(std::memory_order_acquire);
}

}  // extern "C"
