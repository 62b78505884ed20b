// The lifetimes of the C++ torch runner's records (records.h). Outside XLA
// a forward's handle is a one-byte torch tensor whose memory's deleter frees
// the record when TF frees the handle, so a persistent tape may ask for the
// backward again while it holds the handle. Under XLA (jit_compile=True) the
// handle is an int64 id, and its record is dropped by the last of the
// backwards traced with it.

#include "records.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "adopt_rules.h"
#include "program.h"

namespace torchbridge::exported {
namespace {

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

}  // namespace

at::Tensor MakeHandle(Records* records, std::unique_ptr<Record> record) {
  // Aligned as every buffer TF adopts must be (adopt_rules.h).
  void* memory = std::aligned_alloc(kAlignment, kAlignment);
  if (memory == nullptr) throw std::bad_alloc();
  {
    std::lock_guard<std::mutex> lock(records->mutex);
    records->by_handle[memory] = std::move(record);
    ++records->made;
  }
  return at::from_blob(
      memory, {1},
      [records](void* p) {
        std::unique_ptr<Record> dropped;  // freed outside the lock
        {
          std::lock_guard<std::mutex> lock(records->mutex);
          auto it = records->by_handle.find(p);
          if (it != records->by_handle.end()) {
            dropped = std::move(it->second);
            records->by_handle.erase(it);
          }
        }
        std::free(p);
      },
      at::TensorOptions().dtype(at::kChar));
}

at::Tensor MakeIdHandle(Records* records, std::unique_ptr<Record> record,
                        int64_t backwards) {
  at::Tensor handle = at::empty({1}, at::kLong);
  std::lock_guard<std::mutex> lock(records->mutex);
  const int64_t id = records->next_id++;
  handle.data_ptr<int64_t>()[0] = id;
  records->by_id[id] = {std::move(record), backwards > 0 ? backwards : 1};
  ++records->made;
  WarnIfMany(static_cast<int64_t>(records->by_id.size()));
  return handle;
}

Record* FindRecord(Records* records, const at::Tensor& handle, bool by_id,
                   std::unique_ptr<Record>* last) {
  std::lock_guard<std::mutex> lock(records->mutex);
  if (!by_id) {
    auto it = records->by_handle.find(handle.data_ptr());
    return it != records->by_handle.end() ? it->second.get() : nullptr;
  }
  auto it = records->by_id.find(handle.data_ptr<int64_t>()[0]);
  if (it == records->by_id.end()) return nullptr;
  Record* record = it->second.first.get();
  if (--it->second.second <= 0) {
    *last = std::move(it->second.first);
    records->by_id.erase(it);
  }
  return record;
}

// C linkage inside the namespace: ctypes finds it by its plain name.
extern "C" {

// Records alive (`made`: 0), or made so far (`made`: 1).
int64_t tbe_records(void* module, int made) {
  Records& records = static_cast<Module*>(module)->records;
  std::lock_guard<std::mutex> lock(records.mutex);
  return made ? records.made
              : static_cast<int64_t>(records.by_handle.size() + records.by_id.size());
}

}  // extern "C"

}  // namespace torchbridge::exported
