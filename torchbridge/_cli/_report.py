"""What `python -m torchbridge info` reports: the set-up and the active path.

`report()` gathers, as a dict of plain values: the versions of everything
the bridge depends on, the native op (loaded or not, from which file,
complete or fallback and why), the import-order fix for triton, the thread
settings of both frameworks, the GPUs each one sees, and which runner each
`TorchModule` of the process took in graph calls. `format_text()`
lays it out for a terminal. Each probe that fails says so in its own field
rather than failing the report (`info` exits 0 whenever it can report).

Examples:
  >>> from torchbridge._cli import _report
  >>> info = _report.report(load_native=False)
  >>> sorted(info)
  ['gpus', 'import_order', 'native_op', 'runners', 'threads', 'versions']
  >>> info["versions"]["torchbridge"] == __import__("torchbridge").__version__
  True
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import warnings
from typing import Any

import torch  # noqa: F401  (before tensorflow)
import tensorflow as tf

from torchbridge._frameworks import _load_order
from torchbridge._native import _loader
from torchbridge._native import _build
from torchbridge._native import _compiler
from torchbridge._native import _exported
from torchbridge._runners import _record
from torchbridge._runtime import _torch_thread


def report(load_native: bool = True) -> dict[str, dict[str, Any]]:
  """The set-up as a dict (see the module docstring).

  Args:
    load_native: load the native op to say which one is active, building
      it first if no build is cached (the build announces itself on
      stderr). False: report only what the cache holds.
  """
  return {
    "versions": _versions(),
    "native_op": _native_op(load_native),
    "import_order": _import_order(),
    "threads": _threads(),
    "gpus": _gpus(),
    "runners": _runners_report(),
  }


def _runners_report() -> dict[str, Any]:
  """Which runner each module's graph calls took in this process (empty
  in the command line's own process: call `report()` from the program)."""
  choices = _record.choices()
  return {
    "default": 'run="auto": the exact TF translation where it holds, else torch',
    "capture": "torch.export, once per signature, checked against torch",
    "torch_runner": (
      "Python path for every graph call (TORCHBRIDGE_TORCH_RUNNER=python)"
      if os.environ.get("TORCHBRIDGE_TORCH_RUNNER", "").lower() == "python"
      else "C++ (the capture's ATen graph run from the op) where it can, else Python"
    ),
    "modules": {name: _runner_line(entry) for name, entry in choices.items()}
    or "none yet in this process",
    # torch's whole error behind a module's one-line reason, where there is one.
    "details": {name: entry["detail"] for name, entry in choices.items() if entry.get("detail")},
  }


def _runner_line(entry: dict[str, Any]) -> str:
  line = entry["runner"]
  if entry.get("path"):
    line += f" from {entry['path']}"
  if entry.get("reason"):
    line += f" ({entry['reason']})"
  if entry.get("path_reason"):
    line += f"; Python path: {entry['path_reason']}"
  return line


def format_text(info: dict[str, dict[str, Any]]) -> str:
  """`report()` as aligned `key: value` lines under section headings."""
  lines = []
  for section, values in info.items():
    lines.append(section.replace("_", " "))
    width = max(len(k) for k in values)
    for key, value in values.items():
      lines.append(f"  {key.ljust(width)}  {_plain(value)}")
  return "\n".join(lines)


def _plain(value: object) -> str:
  if value is None:
    return "-"
  if isinstance(value, bool):
    return "yes" if value else "no"
  if isinstance(value, (list, tuple)):
    return ", ".join(str(v) for v in value) or "none"
  return str(value)


def _distribution_version(*names: str) -> str | None:
  for name in names:
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


def _versions() -> dict[str, Any]:
  package = sys.modules["torchbridge"]
  try:
    import keras  # pylint: disable=import-outside-toplevel

    keras_version = keras.__version__
  except ImportError:
    keras_version = None
  return {
    "torchbridge": package.__version__,
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    # From the installed metadata: importing triton here would be the
    # very load the import-order fix guards.
    "triton": _distribution_version("triton", "pytorch-triton"),
    "tensorflow": tf.__version__,
    "keras": keras_version,
    "python": platform.python_version(),
    "platform": platform.platform(),
    "compiler": _compiler.compiler_version(),
  }


def _native_op(load: bool) -> dict[str, Any]:
  disabled = os.environ.get(_loader.DISABLE_ENV, "").strip() not in ("", "0")
  try:
    cached = _build.library_path()
  except _build.BuildError as err:
    return {"active": False, "reason": str(err)}
  if load or disabled:
    _loader.load()  # disabled: only says so
  path = _loader.loaded_from()
  loaded = path is not None
  if not loaded and cached.is_file() and not disabled:
    path = cached  # built, not loaded: --no-build
  record = _build.build_record(path) if path else {}
  if loaded:
    kind = (
      "complete" if _loader.has_torch_interop() else "fallback (DLPack capsules through Python)"
    )
  elif path:
    kind = "complete" if record.get("complete") else "fallback"
  else:
    kind = None
  return {
    "active": loaded,
    "call_path": "native op" if loaded else "tf.py_function",
    "status": _loader.status()
    if load or disabled
    else (
      "built, not loaded (--no-build)"
      if path
      else "not built yet: it builds on first use, or run `python -m torchbridge build`"
    ),
    "library": str(path) if path else None,
    "kind": kind,
    "complete": record.get("complete", kind == "complete") if kind else None,
    "fallback_reason": record.get("reason"),
    "build_log": record.get("log"),
    "build_seconds": record.get("seconds"),
    "built": record.get("built"),
    "torch_runner_library": _torch_runner_library(),
    "xla_library": _xla_library(),
    "cache_dir": str(_build.cache_dir()),
    "disabled_by": f"{_loader.DISABLE_ENV}={os.environ[_loader.DISABLE_ENV]}" if disabled else None,
  }


def _torch_runner_library() -> str:
  """Where the C++ torch runner's library stands (never built here:
  `python -m torchbridge build` builds it)."""
  if _exported.loaded_from() is not None:
    return f"loaded from {_exported.loaded_from()}"
  try:
    cached = _exported.library_path()
  except _build.BuildError as err:
    return f"unavailable (graph calls that run torch take the Python path): {err}"
  if cached.is_file():
    return f"built, loaded on the first graph call that runs torch: {cached}"
  return (
    "not built yet: it builds on the first graph call that runs torch, "
    "or run `python -m torchbridge build`"
  )


def _xla_library() -> str:
  """Where the XLA custom call's library stands (never built here)."""
  from torchbridge._native import _xla  # pylint: disable=import-outside-toplevel

  if _xla.loaded_from() is not None:
    return f"loaded from {_xla.loaded_from()}"
  try:
    cached = _xla.library_path()
  except Exception as err:  # pylint: disable=broad-except
    return f"unavailable (bridged calls under jit_compile=True are refused): {err}"
  if cached.is_file():
    return f"built, loaded on the first bridged call traced under jit_compile=True: {cached}"
  return (
    "not built yet: it builds on the first bridged call traced under "
    "jit_compile=True, or run `python -m torchbridge build`"
  )


def _import_order() -> dict[str, Any]:
  path = _load_order.triton_library_path()
  preload_off = os.environ.get(_load_order.PRELOAD_ENV, "1") == "0"
  if path is None:
    state = "not needed: triton is not installed"
  elif preload_off:
    state = f"off ({_load_order.PRELOAD_ENV}=0)"
  elif _load_order.preloaded_triton():
    state = "active: triton's library was loaded before TensorFlow's"
  else:
    state = "not needed: triton's library was already loaded"
  return {"triton_library": path, "preload": state}


def _threads() -> dict[str, Any]:
  return {
    "torch_intra_op": torch.get_num_threads(),
    "torch_inter_op": torch.get_num_interop_threads(),
    "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads() or "default (0)",
    "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads() or "default (0)",
    "torch_thread": "on (one thread runs bridged graph calls)"
    if _torch_thread.ENABLED
    else "off (TORCHBRIDGE_TORCH_THREAD=0)",
    "torch_thread_spin": _torch_thread.spin_setting(),
    "cpu_count": os.cpu_count(),
  }


def _gpus() -> dict[str, Any]:
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      torch_gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except (RuntimeError, AssertionError) as err:
      torch_gpus = [f"none ({err})"]
  try:
    tf_gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
  except (RuntimeError, ValueError) as err:
    tf_gpus = [f"none ({err})"]
  note = "; ".join(" ".join(str(w.message).split())[:200] for w in caught)
  return {
    "torch": torch_gpus,
    "tensorflow": tf_gpus,
    "torch_note": note or None,
    "tf_cuda_build": bool(_compiler.gpu_build()),
  }  # pylint: disable=protected-access
