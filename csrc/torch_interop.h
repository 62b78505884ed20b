// The part of the native op that talks to torch's C++ API directly
// (torch_interop.cc), declared with plain C types only: that file includes
// torch's headers, torchbridge_op.cc includes TensorFlow's, and no file
// includes both.
//
// torchbridge_op.cc compiles without it when torch's headers cannot be had
// (TORCHBRIDGE_TORCH_INTEROP=0); the op then hands DLPack capsules to Python
// only.

#ifndef TORCHBRIDGE_CSRC_TORCH_INTEROP_H_
#define TORCHBRIDGE_CSRC_TORCH_INTEROP_H_

#include <Python.h>

#include <cstdint>

struct DLManagedTensor;

namespace torchbridge {
namespace torch_interop {

// A new torch.Tensor (a new reference) over the memory of `managed`, which
// it takes over: `managed->deleter` runs when torch frees the tensor. Needs
// the GIL. On failure returns nullptr with a Python error set, and `managed`
// has been deleted.
PyObject* TensorFromDLPack(DLManagedTensor* managed);

// As TensorFromDLPack, for memory that is only lent for a call (an XLA
// buffer): `*token` receives a weak reference to the tensor's storage, for
// DetachIfEscaped once the call is over.
PyObject* TensorFromLentDLPack(DLManagedTensor* managed, void** token);

// Ends a lent input's loan (and frees `token`): if torch still holds its
// storage (a tensor saved for the backward, or kept by the user's code),
// the storage's memory is replaced by an owned copy, which every tensor over
// it sees from then on, and the number of bytes copied is returned; 0 when
// nothing holds it. -1 if the copy failed (out of memory): the storage then
// still points into the lent memory. No GIL needed.
int64_t DetachIfEscaped(void* token);

// For an exact torch.Tensor that TF can adopt as it is (strided, dense
// row-major, 64-byte aligned unless empty, no lazy conjugation or negation,
// on device `device_type` (DLPack's: 1 CPU, 2 CUDA) with index `device_id`
// for CUDA), a DLManagedTensor over its memory. It keeps only the tensor's
// storage alive, so releasing it needs no GIL and torch's Python object dies
// with Python's last reference; with `whole_tensor`, it keeps the tensor
// itself, and torch then keeps its Python object (and the attributes set on
// it) alive as long as TF holds the memory, as torch's own DLPack export
// does. nullptr, with no Python error, for anything else (the caller then
// takes the general, Python-side route). Needs the GIL.
DLManagedTensor* ExportAsIs(PyObject* object, int device_type, int device_id,
                            bool whole_tensor);

}  // namespace torch_interop
}  // namespace torchbridge

#endif  // TORCHBRIDGE_CSRC_TORCH_INTEROP_H_
