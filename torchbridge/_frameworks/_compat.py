"""Every private TensorFlow, Keras and torch API torchbridge uses, in one place.

Each is reached through a feature test, so that a framework release that
moves or drops one fails here, at the first use, with an error that names
the API, the versions found and the way out, rather than somewhere deep in a
call. Where a public equivalent exists it is used instead (and listed here
for the record): `torch.compiled_with_cxx11_abi`,
`tf.distribute.has_strategy`, `Module.register_forward_pre_hook`.

Tested on the pinned set (TF 2.21, torch 2.13) and `make test-user`'s.
"""

from __future__ import annotations

import functools
import importlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf


F = TypeVar("F", bound=Callable[..., Any])


class MissingAPIError(RuntimeError):
  """A private framework API torchbridge relies on is gone or moved."""


def _missing(what: str, framework: str, detail: str = "") -> MissingAPIError:
  versions = f"TensorFlow {tf.__version__}, torch {torch.__version__}"
  return MissingAPIError(
    f"torchbridge needs {what} from {framework}, which this installation "
    f"({versions}) does not have{': ' + detail if detail else ''}. "
    "Install the versions torchbridge supports (setup.py: torch >= 2.3, tensorflow "
    ">= 2.16) or one this release was tested with, and report the versions that failed."
  )


def _attribute(module_name: str, name: str, framework: str) -> Any:
  try:
    return getattr(importlib.import_module(module_name), name)
  except (ImportError, AttributeError) as err:
    raise _missing(f"{module_name}.{name}", framework, str(err)) from err


# ---------------------------------------------------------------------------
# TensorFlow


@functools.cache
def _tf_record() -> Callable[[], bool]:
  return _attribute("tensorflow.python.eager.record", "could_possibly_record", "TensorFlow")


def tape_could_record() -> bool:
  """Whether a `tf.GradientTape` (or a backward function) may record now:
  TF's own test before recording a custom gradient (no public API)."""
  return _tf_record()()


@functools.cache
def _resource_variable_type() -> Any:
  return _attribute("tensorflow.python.ops.resource_variable_ops", "ResourceVariable", "TensorFlow")


def read_values(variables: list[Any]) -> list[tf.Tensor]:
  """`[tf.convert_to_tensor(v) for v in variables]`, faster where it can be.

  Eagerly, with no tape that could record the reads, a plain `tf.Variable`
  is read by one raw `ReadVariableOp` (6 us against 15 us through its
  Python); other variables, graphs and taped code take the general path."""
  if not tf.executing_eagerly() or tape_could_record():
    return [tf.convert_to_tensor(v) for v in variables]
  plain = (_resource_variable_type(), _watched_type())
  return [
    tf.raw_ops.ReadVariableOp(resource=v._handle, dtype=v.dtype)  # a read: no write callback
    if type(v) in plain and getattr(v, "_caching_device", None) is None
    else tf.convert_to_tensor(v)
    for v in variables
  ]


def watch_handle(variable: Any, on_handle: Callable[[], None]) -> bool:
  """`variable` (plain, or a `keras.Variable`'s) calls `on_handle()` where an
  op may write it (its `handle` taken outside a read); False if it cannot."""
  inner = getattr(variable, "_value", variable)
  if type(inner) is not _resource_variable_type():  # pylint: disable=unidiomatic-typecheck
    return False
  inner.__class__ = _watched_type()
  inner._torchbridge_on_handle = on_handle  # pylint: disable=protected-access
  return True


_READING = threading.local()


@functools.cache
def _watched_type() -> type:
  class WatchedVariable(_resource_variable_type()):  # type: ignore[misc]
    @property
    def handle(self) -> Any:
      if not getattr(_READING, "on", False):
        self._torchbridge_on_handle()
      return self._handle

    def _read_variable_op(self, no_copy: bool = False) -> Any:
      reading, _READING.on = getattr(_READING, "on", False), True
      try:
        return super()._read_variable_op(no_copy)
      finally:
        _READING.on = reading

  return WatchedVariable


@functools.cache
def _should_record() -> Callable[[list[Any]], bool]:
  return _attribute("tensorflow.python.eager.record", "should_record_backprop", "TensorFlow")


def tape_watches(tensor_tf: tf.Tensor) -> bool:
  """Whether a recording tape watches `tensor_tf` (eagerly)."""
  return _should_record()([tensor_tf])


@functools.cache
def _xla_context_test() -> Callable[[Any], bool]:
  return _attribute(
    "tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext", "TensorFlow"
  )


def in_xla_context() -> bool:
  """Whether the graph being traced (or a parent) is compiled by XLA."""
  return _xla_context_test()(tf.compat.v1.get_default_graph())


def eager_device_name() -> str:
  """The eager caller's device scope, visible while a call traces ("": none)."""
  context = _attribute("tensorflow.python.eager.context", "context", "TensorFlow")()
  return context.device_name or ""


@functools.cache
def weakref_trace_type() -> type:
  """TF's trace type that makes a tf.function argument trace by identity."""
  return _attribute("tensorflow.core.function.trace_type.default_types", "Weakref", "TensorFlow")


def no_dependency_tracking(method: F) -> F:
  """`tf.Module` method decorator: attributes set inside are not tracked
  (tf.__internal__, TF's semi-public name for it)."""
  try:
    decorator = tf.__internal__.tracking.no_automatic_dependency_tracking
  except AttributeError as err:
    raise _missing(
      "tf.__internal__.tracking.no_automatic_dependency_tracking", "TensorFlow", str(err)
    ) from err
  return decorator(method)


def wait_for_async_eager() -> None:
  """Waits for TF's asynchronous eager executor, if it is on."""
  if tf.config.experimental.get_synchronous_execution():
    return
  _attribute("tensorflow.python.eager.context", "async_wait", "TensorFlow")()


# ---------------------------------------------------------------------------
# Keras


def keras_in_safe_mode() -> bool | None:
  """Whether Keras deserializes in safe mode now (no public accessor)."""
  return _attribute("keras.src.saving.serialization_lib", "in_safe_mode", "Keras")()


# ---------------------------------------------------------------------------
# torch


@functools.cache
def torch_dispatch_mode() -> type:
  """torch's `TorchDispatchMode` base class (torch.utils._python_dispatch)."""
  return _attribute("torch.utils._python_dispatch", "TorchDispatchMode", "torch")


def disabled_torch_function_impl() -> Callable[..., Any]:
  """What a torch.Tensor subclass sets as `__torch_function__` to behave as
  a plain tensor (torch's own subclasses do the same)."""
  impl = getattr(torch._C, "_disabled_torch_function_impl", None)  # pylint: disable=protected-access
  if impl is None:
    raise _missing("torch._C._disabled_torch_function_impl", "torch")
  return impl


def module_tensor_tables(module: torch.nn.Module) -> tuple[dict[str, Any], dict[str, Any]]:
  """The dicts in which `module` (not its children) holds its parameters and
  buffers, to swap tensors in place without `setattr`'s checks."""
  params, buffers = getattr(module, "_parameters", None), getattr(module, "_buffers", None)
  if not (isinstance(params, dict) and isinstance(buffers, dict)):
    raise _missing("torch.nn.Module._parameters / _buffers dicts", "torch")
  return params, buffers


def forward_pre_hook_table(module: torch.nn.Module) -> dict[int, Any]:
  """The dict of `module`'s forward pre-hooks, by handle id (to take a hook
  out and put it back without re-registering it)."""
  table = getattr(module, "_forward_pre_hooks", None)
  if not isinstance(table, dict):
    raise _missing("torch.nn.Module._forward_pre_hooks", "torch")
  return table


# The capsule-level DLPack import (torch.utils.dlpack.from_dlpack, a Python
# wrapper, serves where it is gone).
_from_capsule = getattr(torch._C, "_from_dlpack", None)  # pylint: disable=protected-access
if _from_capsule is None:
  import torch.utils.dlpack  # pylint: disable=g-import-not-at-top

  _from_capsule = torch.utils.dlpack.from_dlpack
torch_from_capsule: Callable[[Any], torch.Tensor] = _from_capsule

# What torch.autograd.grad does around the engine call, for _vjp's fast
# path. Optional: without them _vjp calls torch.autograd.grad.
autograd_engine = getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)
stash_obj_in_tls = getattr(torch._C, "_stash_obj_in_tls", None)  # pylint: disable=protected-access
remove_obj_from_tls = getattr(torch._C, "_remove_obj_from_tls", None)  # pylint: disable=protected-access

# Grad mode set by one C call (`torch.set_grad_enabled` makes a Python
# object each time); the public one serves where it is gone.
set_grad_enabled: Callable[[bool], Any] = getattr(
  torch._C,  # pylint: disable=protected-access
  "_set_grad_enabled",
  torch.set_grad_enabled,
)


def in_saved_model_trace() -> bool:
  """Whether `tf.saved_model.save` is tracing the function being built."""
  from tensorflow.python.saved_model import save_context  # pylint: disable=import-outside-toplevel

  return save_context.in_save_context()


_HELD = "torchbridge_held"  # the graph collection of `held_by_graph`


def held_by_graph(
  function: Callable[..., Any], graph: Any, on_death: Callable[[Any], None] | None = None
) -> Callable[..., Any]:
  """`graph` holds `function`; returns a callable that runs it while it
  lives and holds it only weakly. `on_death(ref)` runs when it dies, with
  its graph. For what a process-wide table holds for a graph (TF's gradient
  registry, its `tf.py_function` bodies, the native op's callbacks): a
  function whose closure reaches the graph's tensors would otherwise keep
  the graph, and the bridged module, alive for the process."""
  ref = weakref.ref(function, on_death)
  graph.add_to_collection(_HELD, function)  # graphs take no attributes

  def call(*args: Any) -> Any:
    target = ref()
    if target is None:  # its graph is gone
      raise RuntimeError("the graph that held this torchbridge function was collected")
    return target(*args)

  return call


@functools.cache
def _gradient_registry() -> dict[str, Any]:
  registry = _attribute("tensorflow.python.framework.ops", "_gradient_registry", "TensorFlow")
  table = getattr(registry, "_registry", None)
  if not isinstance(table, dict):
    raise _missing("ops._gradient_registry._registry (a dict)", "TensorFlow")
  return table


def gradient_dies_with_graph(outputs_tf: list[Any]) -> list[Any]:
  """Lets a graph-mode `tf.custom_gradient` call's gradient function die
  with its graph; returns the call's `outputs_tf`.

  `tf.custom_gradient` registers its gradient function in TF's process-wide
  registry ("CustomGradient-N") and nothing removes it; its closure holds
  the outputs, so their graph and all it holds would live as long as the
  process. Here the graph holds the function (`held_by_graph`) and the
  registry only a weak reference, removed with it."""
  if tf.executing_eagerly() or not outputs_tf:
    return outputs_tf
  op = outputs_tf[0].op
  try:
    name = op.get_attr("_gradient_op_type").decode()
  except (ValueError, AttributeError):
    return outputs_tf  # not a custom gradient's outputs
  table = _gradient_registry()
  entry = table.get(name)
  if not isinstance(entry, dict) or getattr(entry.get("type"), "_torchbridge_weak", False):
    return outputs_tf

  def drop(_: Any, table: dict[str, Any] = table, name: str = name) -> None:
    table.pop(name, None)

  weak_grad_fn = held_by_graph(entry["type"], op.graph, drop)
  weak_grad_fn._torchbridge_weak = True  # type: ignore[attr-defined]
  entry["type"] = weak_grad_fn
  return outputs_tf


def function_graph() -> Any:
  """The graph of the `tf.function` being traced, outside any `tf.cond` /
  `tf.while_loop` branch (a call-time capture there cannot compile with XLA)."""
  from tensorflow.python.ops import control_flow_v2_func_graphs as cf  # pylint: disable=import-outside-toplevel

  graph = tf.compat.v1.get_default_graph()
  while isinstance(graph, cf.ControlFlowFuncGraph) and graph.outer_graph is not None:
    graph = graph.outer_graph
  return graph


# What `ExportedProgram.run_decompositions` does to an op, for the capture's
# skip of it (`_translate/_export.py`). Each answers "it may change the op"
# where the API is gone: the capture then decomposes, as before.


def op_has_python_kernel(op: Any) -> bool:
  """Whether a torch op has a kernel registered from Python for a key
  other than Meta (`run_decompositions` runs them: multi_margin_loss's
  Autograd kernel decomposes it)."""
  kernels = getattr(op, "py_kernels", None)
  if not isinstance(kernels, dict):
    return True
  return bool(set(kernels) - {torch._C.DispatchKey.Meta})  # pylint: disable=protected-access


def op_is_composite(op: Any) -> bool:
  """Whether a torch op has a CompositeImplicitAutograd kernel (one that
  `run_decompositions` decomposes unless it preserves the op)."""
  has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)  # pylint: disable=protected-access
  return has_kernel is None or bool(has_kernel(op.name(), "CompositeImplicitAutograd"))


def export_preserves_composite(op: Any) -> bool:
  """Whether `run_decompositions` keeps a CompositeImplicitAutograd op its
  table leaves out (it decomposes some whatever the table says:
  batch_norm)."""
  try:
    from torch._export import utils  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  is_preservable = getattr(utils, "_is_preservable_cia_op", None)
  return bool(is_preservable is not None and is_preservable(op))


def is_optional_type(schema_type: Any) -> bool:
  """A torch schema argument type `T?` (torch's private `torch._C` types)."""
  return isinstance(schema_type, torch._C.OptionalType)  # pylint: disable=protected-access


def is_list_type(schema_type: Any) -> bool:
  """A torch schema argument type `T[]`."""
  return isinstance(schema_type, torch._C.ListType)  # pylint: disable=protected-access


def is_tensor_type(schema_type: Any) -> bool:
  """A torch schema argument type `Tensor`."""
  return isinstance(schema_type, torch._C.TensorType)  # pylint: disable=protected-access


def export_unmet_guard(program: Any) -> str | None:
  """A guard `torch.export` took on the program's dynamic sizes that its
  range constraints do not imply (`Ne(s0, 8)`), or None."""
  shape_env = _attribute("torch.export.exported_program", "_get_shape_env", "torch")(
    program.graph_module
  )
  bound_sympy = _attribute("torch.utils._sympy.value_ranges", "bound_sympy", "torch")
  for guard in [] if shape_env is None else shape_env.guards:
    bound = bound_sympy(guard.expr.xreplace(shape_env.replacements), program.range_constraints)
    if not (bound.lower and bound.upper):  # not true for every size allowed
      return str(guard.expr)
  return None


def export_saved_without_weights(program: Any, file: Any) -> None:
  """`torch.export.save(program, file)` with its state dict as meta
  tensors: shapes and dtypes only."""
  weights = program._state_dict  # pylint: disable=protected-access
  program._state_dict = {  # pylint: disable=protected-access
    name: torch.nn.Parameter(torch.empty_like(t, device="meta"), t.requires_grad)
    if isinstance(t, torch.nn.Parameter)
    else torch.empty_like(t, device="meta")
    for name, t in weights.items()
  }
  try:
    torch.export.save(program, file)
  finally:
    program._state_dict = weights  # pylint: disable=protected-access
