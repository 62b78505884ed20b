"""An exported program handed to the C++ torch runner, node by node.

`ExportedProgram` walks a `torch.export` graph (functional ATen ops) and
hands each node to the runner's library (`_exported.py`): the op, its
arguments in schema order (constants, or the slots of earlier results),
and the graph's outputs; each node then runs as one boxed call of its op
through torch's dispatcher. Nothing here runs at import.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Sequence
from typing import Any

import torch  # before tensorflow

from torchbridge._frameworks import _compat
from torchbridge._native import _callbacks
from torchbridge._native import _exported


class Unsupported(ValueError):
  """A node of the exported graph the C++ runner cannot call."""


# Python's arithmetic on sizes in an exported graph (csrc's IntOp codes).
_ARITHMETIC = {
  operator.add: 0,
  operator.sub: 1,
  operator.mul: 2,
  operator.floordiv: 3,
  operator.mod: 4,
  operator.lt: 5,
  operator.le: 6,
  operator.gt: 7,
  operator.ge: 8,
  operator.eq: 9,
  operator.ne: 10,
  operator.neg: 11,
  operator.truediv: 12,
}
_INTS, _DOUBLES, _BOOLS, _TENSORS, _OPTIONAL_TENSORS = range(5)
AS_RESHAPE = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)  # pylint: disable=protected-access
# c10's ScalarType, Layout and MemoryFormat codes, as boxed calls take them.
_SCALAR_TYPES = {
  torch.uint8: 0,
  torch.int8: 1,
  torch.int16: 2,
  torch.int32: 3,
  torch.int64: 4,
  torch.float16: 5,
  torch.float32: 6,
  torch.float64: 7,
  torch.complex64: 9,
  torch.complex128: 10,
  torch.bool: 11,
  torch.bfloat16: 15,
}
_LAYOUTS = {torch.strided: 0}
_MEMORY_FORMATS = {
  torch.contiguous_format: 0,
  torch.preserve_format: 1,
  torch.channels_last: 2,
  torch.channels_last_3d: 3,
}


class ExportedProgram:
  """An exported ATen graph loaded into the C++ runner.

  Args:
    graph: the `torch.fx.Graph` of `torch.export` (functional ATen ops).
    inputs: its placeholders' names, in the order the op passes them.
    num_state_outputs: its leading outputs that are buffers' new values.
    leaves: per input, whether it gets a gradient (torch records autograd
      for those only: a buffer is not differentiable to every op).
    num_threads: the user's torch thread count, for the thread that runs it.

  Raises:
    Unsupported: a node the runner cannot call (named).

  `forward` and `backward` are the callbacks of its two ops: the forward
  op takes the program's arguments and returns a one-byte handle and the
  outputs (with no record made when nothing consumes the handle); the
  backward op takes the handle and one gradient per output and returns one
  gradient per argument (those the graph consumes).
  """

  def __init__(
    self,
    graph: Any,
    inputs: Sequence[str],
    num_state_outputs: int,
    leaves: Sequence[bool],
    num_threads: int,
  ) -> None:
    lib = _exported.library()
    self._lib = lib
    context = lib.tbe_new(len(inputs), num_threads)
    self._context = context
    slots: dict[str, Any] = {n: k for k, n in enumerate(inputs)}
    outputs: list[int] = []
    for node in graph.nodes:
      if node.op == "placeholder":
        if node.name not in slots:
          raise Unsupported(f"the graph's input {node.name!r} is not passed to it")
      elif node.op == "call_function":
        slots[node.name] = self._add(node, slots)
      elif node.op == "output":
        for out in flat_outputs(node.args[0]):
          if not isinstance(out, torch.fx.Node) or not isinstance(slots.get(out.name), int):
            raise Unsupported(f"the graph returns {out!r}, which is not a tensor it computes")
          outputs.append(slots[out.name])
      else:
        raise Unsupported(f"a {node.op} node ({node.target})")
    error = ctypes.create_string_buffer(1024)
    array = (ctypes.c_int64 * max(1, len(outputs)))(*outputs)
    flags = bytes(int(bool(f)) for f in leaves).ljust(len(inputs), b"\0")
    if lib.tbe_finish(context, array, len(outputs), num_state_outputs, flags, error, len(error)):
      raise Unsupported(error.value.decode())
    self.num_outputs = len(outputs)
    self.graph, self.inputs = graph, list(inputs)  # for its output shapes under XLA
    self.forward = _callbacks.NativeCallback(
      _exported.address(lib.tbe_forward), context, owner=self
    )
    self.backward = _callbacks.NativeCallback(
      _exported.address(lib.tbe_backward), context, owner=self
    )
    self.backward_xla = _callbacks.NativeCallback(
      _exported.address(lib.tbe_backward_xla), context, owner=self
    )

  def forward_xla(self, record: bool) -> tuple[Any, Any]:
    """The callback of one forward op under XLA, whose handle is an int64
    id, and `set_backwards(n)`: how many backward ops were traced for it
    (its record is dropped once that many ran)."""
    op = self._lib.tbe_xla_op_new(self._context, int(record))
    callback = _callbacks.NativeCallback(
      _exported.address(self._lib.tbe_forward_xla), op, owner=self
    )
    return callback, lambda n: self._lib.tbe_xla_op_set_backwards(op, n)

  def _add(self, node: Any, slots: dict[str, Any]) -> Any:
    """Hands `node` to the program; returns its slot, or for a node of
    several results a tuple of theirs."""
    lib, context, target = self._lib, self._context, node.target
    if target is operator.getitem:
      source, index = node.args
      held = slots[source.name]
      if isinstance(held, tuple):  # an op of several results: no step
        return held[index]
      slot = lib.tbe_getitem(context, index)
      self._value_arg(slots, source)
      return slot
    if target in _ARITHMETIC:
      slot = lib.tbe_arith(context, _ARITHMETIC[target])
      for arg in node.args:
        self._value_arg(slots, arg)
      return slot
    schema = getattr(target, "_schema", None)
    if not isinstance(target, torch._ops.OpOverload) or schema is None:  # pylint: disable=protected-access
      raise Unsupported(f"{target} (not an ATen op) in node {node.name!r}")
    if target in AS_RESHAPE:
      # The graph is functional (nothing writes through a view), so a
      # reshape is the same value; a view that export's fake strides
      # allowed may not be on the real ones (T5: a view after a transpose).
      target = torch.ops.aten.reshape.default
      schema = target._schema  # pylint: disable=protected-access
    error = ctypes.create_string_buffer(1024)
    num_out = len(schema.returns)
    first = lib.tbe_op(
      context, schema.name.encode(), schema.overload_name.encode(), num_out, error, len(error)
    )
    if first < 0:
      raise Unsupported(f"{target}: {error.value.decode()}")
    given = dict(node.kwargs)
    for k, argument in enumerate(schema.arguments):
      if k < len(node.args) and not argument.kwarg_only:
        value = node.args[k]
      elif argument.name in given:
        value = given[argument.name]
      elif argument.has_default_value():
        value = argument.default_value
      else:
        raise Unsupported(f"{target}: argument {argument.name!r} is missing in {node.name!r}")
      self._argument(slots, argument.type, value, f"{target}'s {argument.name}")
    return tuple(range(first, first + num_out)) if num_out != 1 else first

  def _argument(self, slots: dict[str, Any], kind: Any, value: Any, where: str) -> None:
    """One argument of the schema type `kind` (torch's schema type object)."""
    lib, context = self._lib, self._context
    if _compat.is_optional_type(kind):
      if value is None:
        lib.tbe_arg(context, -1)
        lib.tbe_value_none(context)
        return
      kind = kind.getElementType()
    if _compat.is_list_type(kind):
      element = kind.getElementType()
      optional = _compat.is_optional_type(element)
      if optional:
        element = element.getElementType()
      list_kind = {
        "int": _INTS,
        "SymInt": _INTS,
        "float": _DOUBLES,
        "bool": _BOOLS,
        "Tensor": _OPTIONAL_TENSORS if optional else _TENSORS,
      }.get(str(element))
      if list_kind is None or (optional and list_kind != _OPTIONAL_TENSORS):
        raise Unsupported(f"{where}: a {kind} argument")
      lib.tbe_arg(context, list_kind)
      for item in value if isinstance(value, (list, tuple)) else [value]:
        self._value(slots, item, where)
      return
    if str(kind) == "Generator" and value is not None:
      raise Unsupported(f"{where}: a torch.Generator argument")
    lib.tbe_arg(context, -1)
    if _compat.is_tensor_type(kind) and _is_number(value):
      # A number for a Tensor (`x * 2.0`): passed as eager torch passes it.
      if isinstance(value, torch.fx.Node):
        lib.tbe_value_wrapped_slot(context, slots[value.name])
      elif isinstance(value, float):
        lib.tbe_value_wrapped(context, 1, value)
      elif isinstance(value, bool):
        lib.tbe_value_wrapped(context, 2, float(value))
      elif abs(value) < 2**53:
        lib.tbe_value_wrapped(context, 0, float(value))
      else:
        raise Unsupported(f"{where}: the integer {value} passed for a tensor")
      return
    self._value(slots, value, where)

  def _value_arg(self, slots: dict[str, Any], value: Any) -> None:
    self._lib.tbe_arg(self._context, -1)
    self._value(slots, value, "an operand")

  def _value(self, slots: dict[str, Any], value: Any, where: str) -> None:
    lib, context = self._lib, self._context
    if isinstance(value, torch.fx.Node):
      slot = slots.get(value.name)
      if not isinstance(slot, int):
        raise Unsupported(f"{where}: {value.name!r} is not one value")
      lib.tbe_value_slot(context, slot)
    elif value is None:
      lib.tbe_value_none(context)
    elif isinstance(value, bool):
      lib.tbe_value_bool(context, int(value))
    elif isinstance(value, int):
      lib.tbe_value_int(context, value)
    elif isinstance(value, float):
      lib.tbe_value_double(context, value)
    elif isinstance(value, str):
      lib.tbe_value_str(context, value.encode())
    elif isinstance(value, torch.dtype):
      lib.tbe_value_int(context, _code(_SCALAR_TYPES, value, where))
    elif isinstance(value, torch.layout):
      lib.tbe_value_int(context, _code(_LAYOUTS, value, where))
    elif isinstance(value, torch.memory_format):
      lib.tbe_value_int(context, _code(_MEMORY_FORMATS, value, where))
    elif isinstance(value, torch.device):
      error = ctypes.create_string_buffer(1024)
      if lib.tbe_value_device(context, str(value).encode(), error, len(error)):
        raise Unsupported(f"{where}: {error.value.decode()}")
    else:
      raise Unsupported(f"{where}: a {type(value).__name__} value ({value!r})")

  def records(self, made: bool = False) -> int:
    """Forward records alive (each freed with its handle), or made so far."""
    return int(self._lib.tbe_records(self._context, int(made)))


def _is_number(value: Any) -> bool:
  """A Python number, or a node computing one (a size)."""
  if isinstance(value, torch.fx.Node):
    return isinstance(value.meta.get("val"), (int, float, bool, torch.SymInt, torch.SymFloat))
  return isinstance(value, (int, float, bool))


def _code(table: dict[Any, int], value: Any, where: str) -> int:
  if value not in table:
    raise Unsupported(f"{where}: {value}")
  return table[value]


def flat_outputs(value: Any) -> list[Any]:
  if isinstance(value, (list, tuple)):
    return [x for v in value for x in flat_outputs(v)]
  return [value]
