"""`torch_function`: a torch callable as a differentiable TF op."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf

from torchbridge._call import _bridge
from torchbridge._crossing import _adopt
from torchbridge._frameworks import _compat
from torchbridge._crossing import _exchange
from torchbridge._call import _saved
from torchbridge._call import _signature
from torchbridge._runtime import _timeline

_XLA_UNSUPPORTED = """\
{name} cannot run inside a tf.function compiled with XLA (jit_compile=True):
XLA compiles the whole function to device code, which cannot call back into
Python and PyTorch. Compile without XLA instead: `tf.function(fn)` or
`tf.function(fn, jit_compile=False)`, and in Keras `model.compile(...,
jit_compile=False)`. The rest of the model can stay compiled if it lives in a
separate tf.function. To run a trained `tb.TorchModule` under XLA, translate
it into TF ops that read the same variables: `tb.translate(module,
input_signature)` (README, "Serving without torch")."""


def torch_function(fn: Callable[..., Any] | None = None, *,
                   output_signature: Any = None,
                   name: str | None = None) -> Any:
  """Makes a torch callable usable as a differentiable TF function.

  The wrapped function takes TF tensors (`tf.Tensor`, `tf.Variable`,
  `np.ndarray`) anywhere in its arguments, nested in tuples, lists, dicts and
  namedtuples; torch sees them as torch tensors sharing their memory. Other
  arguments (numbers, strings, torch tensors, objects) reach torch as they
  are, as static values. The torch result, a torch tensor or a nest of them,
  comes back as TF tensors sharing torch's memory.

  Eagerly, the torch code runs directly, with no `tf.py_function`. Inside
  `tf.function` it runs as one stateful op (a `tf.py_function`), and its
  outputs carry static shapes: torchbridge runs the code once on torch "meta"
  tensors while tracing, which costs no computation; dimensions that depend
  on unknown (None) input dimensions stay unknown. Code that cannot run on
  meta tensors needs `output_signature`.

  Gradients flow to every floating argument (not to integer ones) and are
  computed by torch autograd on the graph saved by the forward, which is
  never run again. The backward is itself differentiable, so nested
  `GradientTape`s give higher-order gradients. Exceptions raised by the torch
  code reach the caller: as they are eagerly, and inside `tf.function` as a TF
  error whose message holds the original type, message and traceback.
  `tf.function(jit_compile=True)` is not supported (XLA cannot call Python).

  Args:
    fn: a callable taking and returning torch tensors.
    output_signature: optional `tf.TensorSpec` or nest of them, in the
      structure `fn` returns; skips shape inference on meta tensors.
    name: name of the op in TF graphs; defaults to `fn.__name__`.

  Returns:
    A callable taking TF tensors and returning TF tensors.

  Examples:
    >>> import torch, tensorflow as tf, torchbridge as tb
    >>> @tb.torch_function
    ... def scaled_sin(x, scale):
    ...   return torch.sin(x) * scale
    >>> x = tf.constant([0.0, 1.0])
    >>> with tf.GradientTape() as tape:
    ...   tape.watch(x)
    ...   y = scaled_sin(x, 2.0)
    >>> tape.gradient(y, x).numpy().round(4)  # 2 cos(x)
    array([2.    , 1.0806], dtype=float32)
  """
  if fn is None:
    return functools.partial(
        torch_function, output_signature=output_signature, name=name)
  if not callable(fn):
    raise TypeError(
        f"torch_function() expected a callable taking torch tensors, got "
        f"{fn!r} of type {type(fn).__name__}. Use it as a decorator, "
        "`@tb.torch_function`, or call `tb.torch_function(fn)`.")
  return TorchFunction(fn, output_signature=output_signature, name=name)


class TorchFunction:
  """A torch callable wrapped by `torch_function`."""

  def __init__(self, fn, output_signature=None, name=None):
    functools.update_wrapper(self, fn)
    try:
      inspect.signature(fn)
    except (TypeError, ValueError):
      # A builtin or pybind function (`torch.sin`, a C++ extension's) has no
      # signature; `tf.function(f)` asks for one and would fail, so it gets
      # (*args, **kwargs).
      del self.__wrapped__
      self.__signature__ = inspect.Signature([
          inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
          inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])
    self._fn = fn
    self._output_signature = check_output_signature(output_signature,
                                                    "torch_function()")
    self._name = name or getattr(fn, "__name__", None) or type(fn).__name__

  def __get__(self, instance, owner=None):
    if instance is None:
      return self
    return functools.partial(self, instance)

  def __tf_tracing_type__(self, context):
    # Passed as an argument of a tf.function, an object with `__wrapped__`
    # (set by functools.update_wrapper) is traced as the function it wraps,
    # so the tf.function would call the raw torch code on symbolic tensors.
    del context
    return _compat.weakref_trace_type()(weakref.ref(self))

  # Not converted by autograph when called from a tf.function: the bridge's
  # own Python would otherwise run as converted code on every call.
  @tf.autograph.experimental.do_not_convert
  def __call__(self, *args, **kwargs):
    call = bind_arguments(self._name, (args, kwargs))
    if not tf.executing_eagerly():
      check_not_xla(self._name)

    if call.only_tensors:  # f(x, y): the torch views are the arguments
      fn = self._fn

      def run(args_torch):
        with _timeline.span(_timeline.FORWARD):
          return fn(*args_torch)
    else:
      def run(args_torch):
        a, kw = call.substitute(args_torch)
        with _timeline.span(_timeline.FORWARD):
          return self._fn(*a, **kw)

    return call_bridged(run, call.args_tf, self._name, self._output_signature)


class _BoundCall:
  """A call's arguments, split into TF tensors and static values."""

  def __init__(self, structure, flat, positions, args_tf):
    self._structure = structure
    self._flat = flat
    self._positions = positions
    self.args_tf = args_tf
    # The common call, f(x, y) with tensors only, needs no nest packing.
    args, kwargs = structure
    self.only_tensors = (not kwargs and len(args) == len(flat) ==
                          len(positions))

  def substitute(self, args_torch):
    """The original arguments with torch tensors in the TF tensors' places."""
    if self.only_tensors:
      return tuple(args_torch), {}
    flat = list(self._flat)
    for pos, arg_torch in zip(self._positions, args_torch):
      flat[pos] = arg_torch
    return tf.nest.pack_sequence_as(self._structure, flat)


def bind_arguments(name, structure):
  """Finds the TF tensors in a nest of call arguments."""
  flat = tf.nest.flatten(structure)
  positions, args_tf = [], []
  for pos, leaf in enumerate(flat):
    _exchange.check_tf_leaf(leaf, f"{name}()")
    if _exchange.is_tf_tensor(leaf):
      arg_tf = tf.convert_to_tensor(leaf)
      if not _adopt.has_torch_dtype(arg_tf.dtype):
        raise TypeError(
            f"{name}() received a tensor of dtype {arg_tf.dtype.name} (shape "
            f"{arg_tf.shape}), which torch has no dtype for. Convert it "
            "first, e.g. `tf.cast(x, tf.float32)`, or `tf.strings.to_number` "
            "for strings.")
      positions.append(pos)
      args_tf.append(arg_tf)
  return _BoundCall(structure, flat, positions, args_tf)


def check_output_signature(output_signature, owner):
  """Returns `output_signature` if it is None or a nest of tf.TensorSpec;
  raises a TypeError that shows the form otherwise."""
  if output_signature is not None:
    for spec in tf.nest.flatten(output_signature):
      if not isinstance(spec, tf.TensorSpec):
        raise TypeError(
            f"{owner} output_signature must hold tf.TensorSpec leaves, got "
            f"{spec!r}. Example: output_signature=(tf.TensorSpec([None, 4], "
            "tf.float32), tf.TensorSpec([], tf.int64)).")
  return output_signature


def check_not_xla(name):
  """Raises if the graph being traced is compiled by XLA."""
  if _compat.in_xla_context():
    raise NotImplementedError(_XLA_UNSUPPORTED.format(name=name))


@dataclasses.dataclass
class Outputs:
  """What a bridged forward may return besides a plain result.

  `result` is the user's result (a nest of torch tensors, numbers, None);
  `extra` maps names to torch tensors that cross as further outputs, outside
  the result (a module's buffers that the forward wrote). The names must be
  the same on every run of one call site (they are learnt on the first).
  `call_bridged` returns an `Outputs` of TF tensors for it.
  """
  result: object
  extra: dict = dataclasses.field(default_factory=dict)


@tf.autograph.experimental.do_not_convert
def call_bridged(run, args_tf, name, output_signature=None,
                 differentiable=None, extra_signature=None, stand_ins=None):
  """Calls `run(args_torch) -> result` through the bridge.

  Args:
    run: the torch computation, given torch views of `args_tf`; returns a
      nest of torch tensors (numbers and None allowed), or an `Outputs`.
    args_tf: flat list of TF tensors.
    name: for errors and graph op names.
    output_signature: optional nest of `tf.TensorSpec` of run's result.
    differentiable: optional list of bools, one per argument of `args_tf`:
      which may get gradients (default: the floating ones). Of those, only
      the ones a gradient can be asked for become torch leaves: eagerly, the
      arguments a tape watches; in a graph, those not under
      `tf.stop_gradient`.
    extra_signature: with `output_signature`, the `tf.TensorSpec`s of the
      `Outputs.extra` that `run` returns, by name.
    stand_ins: optional list, one per argument: None, or a callable giving
      the torch tensor to use for it if the output specs must be found by
      running `run` for real while tracing (see `_signature`).

  Returns:
    The result of `run` as a nest of TF tensors (None leaves stay None), or,
    when `run` returns an `Outputs`, an `Outputs` of TF tensors.
  """
  layout = {}  # set by the first run: where the tensors sit in the result

  def flat_outputs(args_torch):
    result = run(args_torch)
    extra = None
    if isinstance(result, Outputs):
      result, extra = result.result, result.extra
    if layout.get("single") and isinstance(result, torch.Tensor):
      outs_torch = [result]  # the common result, after the first call
    else:
      outs_torch = _flatten_result(result, name, layout)
    names = layout.setdefault("extra_names",
                              None if extra is None else list(extra))
    if extra is not None:
      if list(extra) != names:
        raise RuntimeError(
            f"{name}: the forward's extra outputs changed from {names} to "
            f"{list(extra)} between runs of one traced call; this is a bug "
            "in torchbridge, please report it.")
      outs_torch = outs_torch + list(extra.values())
    return outs_torch

  if differentiable is None:
    differentiable = [_bridge.is_differentiable(a.dtype) for a in args_tf]
  differentiable = _bridge.can_get_gradients(args_tf, differentiable)

  no_leaves = [None] * len(args_tf)

  # Positions of arguments torch refused to record a gradient for (a loss's
  # target: "not differentiable with respect to argument 'target'"),
  # learnt on a first failing call; they get no gradient (None eagerly,
  # zeros from a graph).
  refused = set()

  def compute(args_torch, record, unused=None):  # pylint: disable=unused-argument
    if not record:
      return _saved.Saved(infer(args_torch), no_leaves, has_graph=False)
    leaves = [a.requires_grad_(k not in refused) if diff else None
              for k, (a, diff) in enumerate(zip(args_torch, differentiable))]
    while True:
      try:
        return _saved.Saved(infer(args_torch), leaves, has_graph=True)
      except RuntimeError as err:
        # The message names the argument, not its position: take the
        # differentiable arguments out from the last (targets come last)
        # until torch accepts the call.
        left = [k for k, leaf in enumerate(leaves)
                if leaf is not None and leaf.requires_grad]
        if "is not differentiable with respect to" not in str(err) or \
            not left:
          raise
        refused.add(left[-1])
        leaves[left[-1]].requires_grad_(False)

  def infer(args_torch):  # compute's outputs alone (inference in a graph)
    outs_torch = flat_outputs(args_torch)
    _check_unmodified(args_torch, name)
    return outs_torch

  op_name = _op_name(name)
  if tf.executing_eagerly():
    outs_tf = _bridge.call(compute, args_tf, name=op_name,
                           differentiable=differentiable)
  else:
    if output_signature is not None:
      out_specs = _flatten_signature(output_signature, layout)
      how = _signature.DECLARED
      if extra_signature is not None:
        layout["extra_names"] = list(extra_signature)
        out_specs = out_specs + list(extra_signature.values())
    else:
      out_specs, how = _signature.infer(
          flat_outputs, [tf.TensorSpec(a.shape, a.dtype) for a in args_tf],
          name, stand_ins)
    outs_tf = _bridge.call(compute, args_tf, out_specs, name=op_name,
                           differentiable=differentiable, infer=infer,
                           specs_found=how)
  n_result = layout["n_tensors"]
  result = _pack_result(layout, outs_tf[:n_result])
  if layout.get("extra_names") is not None:
    return Outputs(result, dict(zip(layout["extra_names"],
                                    outs_tf[n_result:])))
  return result


def _check_unmodified(args_torch, name):
  """Raises if the torch code wrote into an argument (a view of TF memory)."""
  for k, arg_torch in enumerate(args_torch):
    if arg_torch._version:  # fresh views start at 0; in-place ops count up
      raise RuntimeError(
          f"{name} modified its tensor argument {k} (shape "
          f"{tuple(arg_torch.shape)}, dtype {arg_torch.dtype}) in place. Its "
          "torch tensor shares memory with a TF tensor, and TF tensors must "
          "never change (TF may hand the same buffer to other ops): the TF "
          "tensor now holds the modified values. Use out-of-place ops "
          "(`x = x + 1`, not `x.add_(1)`), or copy first (`x = x.clone()`).")


def _output_tensor(leaf, name):
  """One leaf of a torch result as the torch tensor that crosses (None for
  None): the one place that says what a torch callable may return."""
  if isinstance(leaf, torch.Tensor) or leaf is None:
    return leaf
  if isinstance(leaf, (bool, int, float, complex, np.number, np.bool_)):
    # A Python or numpy number: a scalar of torch's dtype for it (int64,
    # the default float dtype, complex64, bool).
    return torch.tensor(leaf)
  raise _signature.ResultError(
      f"{name} returned a {type(leaf).__name__} ({leaf!r}) inside its "
      "result; torchbridge passes back torch tensors, numbers (or None) "
      "only. Return it as a tensor, e.g. `torch.tensor(value)`.")


def _flatten_result(result, name, layout):
  flat = [_output_tensor(leaf, name) for leaf in tf.nest.flatten(result)]
  tensors = [leaf for leaf in flat if leaf is not None]
  layout.setdefault("structure", result)
  layout.setdefault("is_tensor", [leaf is not None for leaf in flat])
  layout.setdefault("n_tensors", len(tensors))
  layout.setdefault("single", isinstance(layout["structure"], torch.Tensor))
  return tensors


def _flatten_signature(output_signature, layout):
  flat = tf.nest.flatten(output_signature)
  layout.update(structure=output_signature, is_tensor=[True] * len(flat),
                n_tensors=len(flat),
                single=isinstance(output_signature, tf.TensorSpec))
  return flat


def _pack_result(layout, outs_tf):
  outs = iter(outs_tf)
  flat = [next(outs) if is_tensor else None for is_tensor in layout["is_tensor"]]
  return tf.nest.pack_sequence_as(layout["structure"], flat)


def _op_name(name):
  cleaned = re.sub(r"[^A-Za-z0-9_.\-/]", "_", name).lstrip("_-/") or "torch"
  return cleaned
