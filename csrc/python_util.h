// Python from C++ threads TF owns: the GIL, an owning reference, Python
// exceptions as TF errors, and the Python functions the kernel calls (handed
// over once at load by torchbridge/_native/_build.py, as TF's py_func registers
// its trampoline, rather than imported by private name).

#ifndef TORCHBRIDGE_CSRC_PYTHON_UTIL_H_
#define TORCHBRIDGE_CSRC_PYTHON_UTIL_H_

#include <Python.h>  // first, as Python asks

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace torchbridge {

// Whether Python is shutting down (then taking the GIL from another thread
// can block for ever or end the thread).
bool PythonFinalizing();

// Takes the GIL for a scope. On a thread Python did not create (TF's
// executor and pool threads), the first GilLock makes a Python thread state
// and keeps it for the life of the thread, instead of making and destroying
// one on every call as a bare PyGILState_Ensure/Release pair does: a fresh
// thread state costs the callback several microseconds and runs it cold
// (empty frame stack, empty threading.local()s). Threads that Python made
// have a thread state already, which Python deletes when they end; those are
// left alone. The kept thread states of TF's threads are freed with the
// interpreter (TF's thread pools live as long as the process).
class GilLock {
 public:
  GilLock();
  ~GilLock() { PyGILState_Release(state_); }
  GilLock(const GilLock&) = delete;
  GilLock& operator=(const GilLock&) = delete;

 private:
  PyGILState_STATE state_;
};

// An owned (strong) Python reference, released when it goes out of scope.
// Use it with the GIL held.
class PyRef {
 public:
  PyRef() = default;
  // Takes over a new reference (nullptr allowed: a failed Python call).
  explicit PyRef(PyObject* owned) : object_(owned) {}
  static PyRef Borrow(PyObject* borrowed) {
    Py_XINCREF(borrowed);
    return PyRef(borrowed);
  }
  ~PyRef() { Py_XDECREF(object_); }
  PyRef(PyRef&& other) noexcept : object_(other.release()) {}
  PyRef& operator=(PyRef&& other) noexcept {
    if (this != &other) Py_XSETREF(object_, other.release());
    return *this;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;

  PyObject* get() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }
  // Gives the reference up to the caller.
  PyObject* release() {
    PyObject* object = object_;
    object_ = nullptr;
    return object;
  }

 private:
  PyObject* object_ = nullptr;
};

// str(obj), or "<unprintable>".
std::string PyObjectString(PyObject* obj);

// None when every flag is set, else a tuple of the indices of those that
// are not (an op's unused outputs); an empty PyRef with a Python error set
// on failure. Needs the GIL.
PyRef UnusedIndices(const std::vector<bool>& required);

// Formats the pending Python exception (and clears it) as a TF error with
// the exception's type, message and traceback. The error code follows
// tf.py_function's (TypeError/ValueError -> InvalidArgument, StopIteration ->
// OutOfRange, MemoryError -> ResourceExhausted, NotImplementedError ->
// Unimplemented, others -> Unknown); a tf.errors.OpError raised in Python
// keeps its own code.
absl::Status PythonErrorToStatus(const std::string& context);

// The Python functions of torchbridge/_native/_loader.py the kernel calls (borrowed
// references the library keeps; null until the loader hands them over).
struct PythonHooks {
  PyObject* dispatch = nullptr;       // _dispatch: runs a callback
  PyObject* registry = nullptr;       // _registry: callback id -> callable
  PyObject* export_output = nullptr;  // _export_output: an output TF cannot
                                      // adopt as it is, as a capsule
};
// Needs the GIL. OK when the loader has set them, else an error that says so.
absl::Status GetPythonHooks(const PythonHooks** hooks);

}  // namespace torchbridge

// The loader's entry point (ctypes.PyDLL, so with the GIL): keeps a
// reference to each. Returns 0.
extern "C" int torchbridge_set_python_hooks(PyObject* dispatch,
                                            PyObject* registry,
                                            PyObject* export_output);

#endif  // TORCHBRIDGE_CSRC_PYTHON_UTIL_H_
