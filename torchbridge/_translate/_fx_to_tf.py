"""Runs an exported torch graph (`torch.fx`, ATen ops) as TF ops.

The interpreter walks the graph once per TF trace: each `call_function`
node becomes the TF ops of its `_table` entry, with the node's recorded
dtype enforced on the result (torch's type promotion is in the graph's
records, not in TF's rules). Values stay channels-last between the ops that
allow it (`_channels_last`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from torchbridge._translate import _refusal
from torchbridge._translate._aten import _table
from torchbridge._translate import _channels_last

# The op tables: imported for the entries they register.
from torchbridge._translate._aten import _conv  # noqa: F401  pylint: disable=unused-import
from torchbridge._translate._aten import _nn  # noqa: F401  pylint: disable=unused-import
from torchbridge._translate._aten import _rnn  # noqa: F401  pylint: disable=unused-import
from torchbridge._translate._aten import _shape  # noqa: F401  pylint: disable=unused-import
from torchbridge._translate._aten import _index  # noqa: F401  pylint: disable=unused-import
from torchbridge._translate._aten import _elementwise  # noqa: F401  pylint: disable=unused-import

if TYPE_CHECKING:
  import torch.fx


def untranslated(
  graph: torch.fx.Graph, only: Callable[[Any], bool] | None = None
) -> dict[str, str]:
  """`{op name: reason}` for every node of `graph` that cannot become TF
  ops: no table entry, or one that refuses the node's arguments. `only`:
  just the ops it is true of (the ops decomposition keeps whole, on
  torch.export's graph before decomposing: a refusal found there holds
  after it)."""
  found: dict[str, str] = {}
  for node in graph.nodes:
    if node.op == "call_function":
      if only is not None and not only(node.target):
        continue
      key = _table.op_key(node.target)
      entry = _table.OPS.get(key)
      if entry is None:
        found.setdefault(key, "no TensorFlow translation")
      elif entry[2] is not None and (reason := entry[2](node)):
        found.setdefault(key, reason)
    elif only is None and node.op in ("call_module", "call_method", "get_attr"):
      found.setdefault(
        f"{node.op} {node.target}", "control flow or submodule call in the exported graph"
      )
  return found


def random_nodes(graph: torch.fx.Graph) -> list[str]:
  """The names of the nodes that draw random numbers (dropout)."""
  return [
    node.name
    for node in graph.nodes
    if node.op == "call_function" and _table.op_key(node.target) in _table.RANDOM
  ]


def run(
  graph: torch.fx.Graph,
  inputs: Mapping[str, Any],
  draws: Mapping[str, Any] | None = None,
  drawn: dict[str, Any] | None = None,
) -> list[tf.Tensor]:
  """The graph's outputs (a flat list of TF tensors).

  Args:
    graph: a `torch.fx.Graph` of ATen ops, as `torch.export` gives.
    inputs: `{placeholder name: TF tensor or tf.Variable}`.
    draws: optional `{random node name: its random draw}` (a dropout's
      keep mask) to use in place of TF's own, to compare with torch value
      for value.
    drawn: optional dict that receives `{random node name: its draw}`.
  """
  env: dict[torch.fx.Node, Any] = {}
  for node in graph.nodes:
    if node.op == "placeholder":
      env[node] = inputs[node.name]
    elif node.op == "call_function":
      if _table.op_key(node.target) in _table.RANDOM:
        env[node] = _call(node, env, draw=(draws or {}).get(node.name))
        if drawn is not None:
          drawn[node.name] = env[node][1]
      else:
        env[node] = _call(node, env)
    elif node.op == "output":
      outputs = node.args[0]
      return [_as_output(_value(o, env)) for o in outputs]
  raise ValueError("the exported graph has no output node")


def _call(node: torch.fx.Node, env: Mapping[torch.fx.Node, Any], **extra: Any) -> Any:
  fn, channels_last, _ = _table.OPS[_table.op_key(node.target)]
  args = _value(node.args, env)
  kwargs = {k: _value(v, env) for k, v in node.kwargs.items()}
  kwargs.update(extra)
  kwargs.pop("device", None)
  kwargs.pop("layout", None)
  kwargs.pop("pin_memory", None)
  if not channels_last:
    args = _channels_last.to_torch_layout(args)
    kwargs = _channels_last.to_torch_layout(kwargs)
  out = node.meta.get("val")
  where = f"{_table.op_key(node.target)} (node {node.name!r})"
  try:
    result = fn(out, *args, **kwargs)
  except _refusal.Refusal as err:  # a limit of the translation: say where
    raise _refusal.Refusal(err.what, f"{where}: {err.reason}") from err
  except Exception as err:  # a bug: not to be mistaken for a missing op
    raise _refusal.Refusal(
      "translation", f"{where}: its translation raised {type(err).__name__}: {err}"
    ) from err
  return _with_recorded_dtype(result, out)


def _value(arg: Any, env: Mapping[torch.fx.Node, Any]) -> Any:
  if isinstance(arg, (list, tuple)):
    return type(arg)(_value(a, env) for a in arg)
  if hasattr(arg, "op") and hasattr(arg, "meta"):  # an fx.Node
    return env[arg]
  return arg


def _with_recorded_dtype(result: Any, out: Any) -> Any:
  if isinstance(result, (tuple, list)) and isinstance(out, (tuple, list)):
    return type(result)(_with_recorded_dtype(r, o) for r, o in zip(result, out))
  dtype = getattr(out, "dtype", None)
  if dtype is None or not hasattr(out, "shape") or result is None:
    return result
  dtype_tf = _table.tf_dtype(dtype)
  if isinstance(result, _channels_last.ChannelsLast):
    if result.tensor_tf.dtype != dtype_tf:
      return _channels_last.ChannelsLast(tf.cast(result.tensor_tf, dtype_tf))
    return result
  if isinstance(result, (tf.Tensor, tf.Variable)):
    return result if result.dtype == dtype_tf else tf.cast(result, dtype_tf)
  return tf.constant(result, dtype_tf)  # a Python number for a 0-d tensor


def _as_output(value: Any) -> tf.Tensor:
  value = _channels_last.to_torch_layout(value)
  if isinstance(value, tf.Variable):
    return tf.identity(value)
  return tf.convert_to_tensor(value)
