"""`torch_function`: a torch callable as a differentiable TF op."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge import _call
from torchbridge._frameworks import _compat
from torchbridge._runtime import _timeline


def torch_function(
  fn: Callable[..., Any] | None = None, *, output_signature: Any = None, name: str | None = None
) -> Any:
  """Makes a torch callable usable as a differentiable TF function.

  The wrapped function takes TF tensors (`tf.Tensor`, `tf.Variable`,
  `np.ndarray`) anywhere in its arguments, nested in tuples, lists, dicts and
  namedtuples; torch sees them as torch tensors sharing their memory. Other
  arguments (numbers, strings, torch tensors, objects) reach torch as they
  are, as static values. The torch result, a torch tensor or a nest of them,
  comes back as TF tensors sharing torch's memory.

  Eagerly, the torch code runs directly, with no `tf.py_function`. Inside
  `tf.function` it runs as one stateful op (the native op `TorchbridgeCall`,
  or a `tf.py_function` where that is unavailable), and its
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
  Under `tf.function(jit_compile=True)` (CPU) the call is an XLA custom
  call running the same torch code; output shapes unknown while tracing are
  found when XLA compiles it for concrete shapes.

  Args:
    fn: a callable taking and returning torch tensors. Left out, the call
      returns a decorator: `@tb.torch_function(output_signature=...)`.
    output_signature: optional `tf.TensorSpec` or nest of them, in the
      structure `fn` returns; skips shape inference on meta tensors.
    name: name of the op in TF graphs; defaults to `fn.__name__`.

  Returns:
    A callable taking TF tensors and returning TF tensors (or, when `fn`
      is left out, a decorator that makes one).

  Raises:
    TypeError: `fn` is not callable, or `output_signature` holds a leaf
      that is not a `tf.TensorSpec`.

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
    >>> @tb.torch_function(output_signature=tf.TensorSpec([None], tf.float32))
    ... def double(x):
    ...   return x * 2
    >>> tf.function(double)(x).numpy()
    array([0., 2.], dtype=float32)
  """
  if fn is None:
    return functools.partial(torch_function, output_signature=output_signature, name=name)
  if not callable(fn):
    raise TypeError(
      f"torch_function() expected a callable taking torch tensors, got "
      f"{fn!r} of type {type(fn).__name__}. Use it as a decorator, "
      "`@tb.torch_function`, or call `tb.torch_function(fn)`."
    )
  return TorchFunction(fn, output_signature=output_signature, name=name)


class TorchFunction:
  """A torch callable wrapped by `torch_function`."""

  # Set by functools.update_wrapper, or in its place for a function without
  # a signature.
  __wrapped__: Callable[..., Any]
  __signature__: inspect.Signature

  def __init__(
    self, fn: Callable[..., Any], output_signature: Any = None, name: str | None = None
  ) -> None:
    functools.update_wrapper(self, fn)
    try:
      inspect.signature(fn)
    except (TypeError, ValueError):
      # A builtin or pybind function (`torch.sin`, a C++ extension's) has no
      # signature; `tf.function(f)` asks for one and would fail, so it gets
      # (*args, **kwargs).
      del self.__wrapped__
      self.__signature__ = inspect.Signature(
        [
          inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL),
          inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD),
        ]
      )
    self._fn = fn
    self._output_signature = _call.check_output_signature(output_signature, "torch_function()")
    self._name = name or getattr(fn, "__name__", None) or type(fn).__name__

  def __get__(self, instance: object, owner: type | None = None) -> Any:
    if instance is None:
      return self
    bound: Callable[..., Any] = self  # __call__ is typed Any: TF's decorator is untyped
    return functools.partial(bound, instance)

  def __tf_tracing_type__(self, context: Any) -> Any:
    # Passed as an argument of a tf.function, an object with `__wrapped__`
    # (set by functools.update_wrapper) is traced as the function it wraps,
    # so the tf.function would call the raw torch code on symbolic tensors.
    del context
    return _compat.weakref_trace_type()(weakref.ref(self))

  # Not converted by autograph when called from a tf.function: the bridge's
  # own Python would otherwise run as converted code on every call.
  @tf.autograph.experimental.do_not_convert
  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    call = _call.bind_arguments(self._name, (args, kwargs))
    if not tf.executing_eagerly():
      _call.check_not_xla(self._name)

    if call.only_tensors:  # f(x, y): the torch views are the arguments
      fn = self._fn

      def run(args_torch: Sequence[torch.Tensor]) -> Any:
        if not _timeline.on:  # the per-call path: no span to skip
          return fn(*args_torch)
        with _timeline.span(_timeline.FORWARD):
          return fn(*args_torch)
    else:

      def run(args_torch: Sequence[torch.Tensor]) -> Any:
        a, kw = call.substitute(args_torch)
        if not _timeline.on:
          return self._fn(*a, **kw)
        with _timeline.span(_timeline.FORWARD):
          return self._fn(*a, **kw)

    return _call.call_bridged(run, call.args_tf, self._name, self._output_signature)
