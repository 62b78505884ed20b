// Memory crossing between TF and torch without copies: TF inputs wrapped as
// DLPack tensors, and DLPack tensors from torch adopted as TF buffers.

#ifndef TORCHBRIDGE_CSRC_ADOPTED_BUFFER_H_
#define TORCHBRIDGE_CSRC_ADOPTED_BUFFER_H_

#include <Python.h>  // first, as Python asks

#include <atomic>
#include <cstdint>

#include "dlpack_check.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"

namespace torchbridge {

// Zero-copy crossings made in C++ (read by torchbridge.exchange_stats()
// through torchbridge_zero_copy_count()).
extern std::atomic<int64_t> g_zero_copy_count;

// An exported (producer-owned) DLPack tensor, legacy or versioned.
struct Managed {
  DLManagedTensor* legacy = nullptr;
  DLManagedTensorVersioned* versioned = nullptr;
  // Made by torch_interop::ExportAsIs: its deleter drops a torch storage,
  // which needs no GIL (torch takes it itself where a storage's memory
  // belongs to a Python object).
  bool gil_free = false;
  // Made by torch_interop::ExportAsIs (owned here from the start, rather
  // than taken from a capsule).
  bool exported = false;

  const DLTensor& tensor() const {
    return legacy ? legacy->dl_tensor : versioned->dl_tensor;
  }
  explicit operator bool() const { return legacy || versioned; }

  // Calls the producer's deleter. The caller holds the GIL or knows that
  // Python is not running.
  void DeleteNow();

  // Calls the deleter from any thread. Producers' deleters may touch Python
  // objects (torch's drops a tensor that may own a Python object), so the
  // GIL is taken while Python runs. During interpreter shutdown the tensor
  // is leaked instead: the process is ending, and taking the GIL then is
  // not safe.
  void DeleteFromAnyThread();
};

// A TF buffer over memory owned by a DLPack producer (torch). TF sees it as
// memory it does not own, so it never reuses it in place for another op's
// output (torch may still hold the tensor, e.g. for a backward pass).
class DLPackBuffer : public tensorflow::TensorBuffer {
 public:
  DLPackBuffer(void* data, size_t size, Managed managed, bool on_host)
      : TensorBuffer(data), size_(size), managed_(managed), on_host_(on_host) {}
  ~DLPackBuffer() override { managed_.DeleteFromAnyThread(); }

  size_t size() const override { return size_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(
      tensorflow::AllocationDescription* proto) const override;
  bool OwnsMemory() const override { return false; }
  tsl::AllocatorMemoryType GetMemoryType() const override {
    return on_host_ ? tsl::AllocatorMemoryType::kHostPageable
                    : tsl::AllocatorMemoryType::kDevice;
  }

 private:
  const size_t size_;
  Managed managed_;
  const bool on_host_;
};

// A DLPack tensor over `tensor`'s memory that holds a reference on its
// buffer until its deleter runs. An error for a dtype that does not cross.
absl::Status WrapInput(const tensorflow::Tensor& tensor, DLDevice device,
                       int index, DLManagedTensor** out);

// The destructor of an input capsule: deletes the tensor unless a consumer
// took it (a consumer renames the capsule and calls the deleter itself).
void InputCapsuleDestructor(PyObject* capsule);

// The DLPack tensor of a capsule no consumer has taken yet (taking nothing),
// or an error naming output `index` of `where` and what it was instead.
absl::Status FromCapsule(const std::string& where, PyObject* item,
                         size_t index, Managed* m);

// Marks a capsule's tensor as taken, as DLPack asks (the capsule no longer
// deletes it).
void MarkCapsuleUsed(PyObject* capsule, const Managed& m);

// A TF tensor of dtype `dtype` that owns `m`'s memory (and `m`); an empty
// tensor is made by TF instead (nothing to share).
absl::Status AdoptAsOutput(tensorflow::OpKernelContext* ctx, int index,
                           tensorflow::DataType dtype, Managed* m);

}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_ADOPTED_BUFFER_H_
