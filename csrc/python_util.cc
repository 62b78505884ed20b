// Python from TF's threads (see python_util.h).

#include "python_util.h"

#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/errors.h"

namespace torchbridge {

bool PythonFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

GilLock::GilLock() {
  const bool foreign = PyGILState_GetThisThreadState() == nullptr;
  state_ = PyGILState_Ensure();
  if (foreign) PyGILState_Ensure();  // never released: the state stays
}

PyRef UnusedIndices(const std::vector<bool>& required) {
  std::vector<long> unused;
  for (size_t i = 0; i < required.size(); ++i) {
    if (!required[i]) unused.push_back(static_cast<long>(i));
  }
  if (unused.empty()) return PyRef::Borrow(Py_None);
  PyRef tuple(PyTuple_New(static_cast<Py_ssize_t>(unused.size())));
  for (size_t k = 0; tuple && k < unused.size(); ++k) {
    PyObject* index = PyLong_FromLong(unused[k]);
    if (index == nullptr) return PyRef();
    PyTuple_SET_ITEM(tuple.get(), k, index);  // steals the reference
  }
  return tuple;
}

std::string PyObjectString(PyObject* obj) {
  if (obj == nullptr) return "";
  PyObject* str = PyObject_Str(obj);
  if (str == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  const char* utf8 = PyUnicode_AsUTF8(str);
  std::string result = utf8 ? utf8 : "<unprintable>";
  if (utf8 == nullptr) PyErr_Clear();
  Py_DECREF(str);
  return result;
}

absl::Status PythonErrorToStatus(const std::string& context) {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  if (type == nullptr) {
    return tensorflow::errors::Unknown(context,
                                       ": failed without a Python error");
  }
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) {
    PyException_SetTraceback(value, traceback);
  }

  const char* type_name =
      PyType_Check(type) ? reinterpret_cast<PyTypeObject*>(type)->tp_name
                         : "exception";
  std::string message = PyObjectString(value);

  std::string formatted;
  PyObject* tb_module = PyImport_ImportModule("traceback");
  if (tb_module != nullptr) {
    PyObject* lines = PyObject_CallMethod(
        tb_module, "format_exception", "OOO", type,
        value ? value : Py_None, traceback ? traceback : Py_None);
    if (lines != nullptr) {
      PyObject* empty = PyUnicode_FromString("");
      PyObject* joined = empty ? PyUnicode_Join(empty, lines) : nullptr;
      if (joined != nullptr) formatted = PyObjectString(joined);
      Py_XDECREF(joined);
      Py_XDECREF(empty);
      Py_DECREF(lines);
    }
    Py_DECREF(tb_module);
  }
  PyErr_Clear();

  absl::StatusCode code = absl::StatusCode::kUnknown;
  if (PyErr_GivenExceptionMatches(type, PyExc_ValueError) ||
      PyErr_GivenExceptionMatches(type, PyExc_TypeError)) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (PyErr_GivenExceptionMatches(type, PyExc_StopIteration)) {
    code = absl::StatusCode::kOutOfRange;
  } else if (PyErr_GivenExceptionMatches(type, PyExc_MemoryError)) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (PyErr_GivenExceptionMatches(type, PyExc_NotImplementedError)) {
    code = absl::StatusCode::kUnimplemented;
  }
  if (value != nullptr && PyObject_HasAttrString(value, "error_code") &&
      PyObject_HasAttrString(value, "node_def")) {  // tf.errors.OpError
    PyObject* error_code = PyObject_GetAttrString(value, "error_code");
    if (error_code != nullptr && PyLong_Check(error_code)) {
      long c = PyLong_AsLong(error_code);
      if (c > 0 && c <= 16) code = static_cast<absl::StatusCode>(c);
    }
    Py_XDECREF(error_code);
    PyErr_Clear();
  }

  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return absl::Status(
      code, absl::StrCat(context, ": the torch callback raised ", type_name,
                         ": ", message,
                         "\n\nPython traceback:\n", formatted));
}

namespace {
PythonHooks g_hooks;  // guarded by the GIL
}  // namespace

absl::Status GetPythonHooks(const PythonHooks** hooks) {
  if (g_hooks.dispatch == nullptr || g_hooks.registry == nullptr ||
      g_hooks.export_output == nullptr) {
    return tensorflow::errors::FailedPrecondition(
        "the torchbridge op library was loaded without its Python hooks; "
        "load it through torchbridge._native._build.load(), not "
        "tf.load_op_library()");
  }
  *hooks = &g_hooks;
  return absl::OkStatus();
}

}  // namespace torchbridge

extern "C" int torchbridge_set_python_hooks(PyObject* dispatch,
                                            PyObject* registry,
                                            PyObject* export_output) {
  using torchbridge::g_hooks;
  Py_XINCREF(dispatch);
  Py_XINCREF(registry);
  Py_XINCREF(export_output);
  Py_XSETREF(g_hooks.dispatch, dispatch);
  Py_XSETREF(g_hooks.registry, registry);
  Py_XSETREF(g_hooks.export_output, export_output);
  return 0;
}
