"""The variables that mirror a torch module's state, and calls through them.

Shared by `TorchModule` (plain `tf.Variable`s) and `keras.TorchLayer`
(`keras.Variable`s): both hand this class a dict of variables, and it runs
the torch module on their current values.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._frameworks import _compat
from torchbridge._frameworks import _compiled
from torchbridge._state import _distribute
from torchbridge._state import _exclusive
from torchbridge._state import _guard
from torchbridge._crossing import _exchange
from torchbridge import _call
from torchbridge._state import _module_checks
from torchbridge._state import _runner
from torchbridge._state import _swap
from torchbridge._runtime import _timeline
from torchbridge._state import _torch_views
from torchbridge._state import _torch_runner
from torchbridge._state import _weights
from torchbridge._state import _write_recorder


class TorchState:
  """A torch module whose parameters and buffers live in TF variables.

  Args:
    module: the torch `nn.Module`.
    owner_name: the wrapper's name, for errors.
    make_variable: `make_variable(name, initial_value_tf, trainable,
      aggregation)` -> a variable (`tf.Variable` or `keras.Variable`);
      `aggregation` is a `tf.VariableAggregation`, how replicas of a
      `tf.distribute` strategy combine their writes.
  """

  def __init__(
    self,
    module: torch.nn.Module,
    owner_name: str,
    make_variable: Callable[..., Any],
    run: str = "auto",
  ) -> None:
    _module_checks.check_module(module, owner_name)
    _distribute.check_strategy(owner_name)
    self.module = module
    self.name = owner_name
    params = dict(module.named_parameters())  # tied parameters appear once
    buffers = dict(module.named_buffers())
    _torch_views.lend_from_holders(list(params.values()) + list(buffers.values()))
    self.param_names = list(params)
    self.buffer_names = list(buffers)
    # state_dict name -> canonical name (tied parameters have several).
    by_id = {id(t): n for n, t in list(params.items()) + list(buffers.items())}
    self.state_names = {n: by_id[id(t)] for n, t in module.state_dict(keep_vars=True).items()}
    # torch modes -> the buffers the forward writes (learnt on a first call).
    self._mutated_buffers: dict[str, frozenset[str]] = {}
    # One forward at a time: a call swaps tensors into the shared module.
    self._lock = threading.RLock()
    self._exclusive = _exclusive.ExclusiveCalls(owner_name)  # read, op, assign
    self._slots = _swap.TensorSlots(module, self.param_names + self.buffer_names)
    self.torch_runner = _torch_runner.TorchRunner(self)  # torch, from C++
    # Graph calls as TF ops (run="auto" / "tf"), or None: always torch.
    self.runner = _runner.Runner(self, run) if run != "torch" else None
    self._modules = list(module.modules())
    self.variables: dict[str, Any] = {}  # tf.Variable or keras.Variable
    for n, t in list(params.items()) + list(buffers.items()):
      trainable = n in params and t.requires_grad
      value_tf = _exchange.tf_owned_copy(t)
      # Only buffers are written in replica context (by the forward).
      aggregation = (
        tf.VariableAggregation.NONE
        if n in params
        else _distribute.buffer_aggregation(value_tf.dtype)
      )
      self.variables[n] = make_variable(n, value_tf, trainable, aggregation)
    # Weights held once, by the variables: torch's tensors view them.
    self._views = _torch_views.TorchViews(
      self,
      module,
      {n: (t, self.variables[n]) for n, t in list(params.items()) + list(buffers.items())},
    )

  def take_views_back(self) -> None:
    """Takes back the torch module's views of the variables (lent when it
    was read: TF would copy each variable on its next update)."""
    views = self._views
    if views.lent:
      with self._lock:
        views.take_back()

  def sync_torch(self) -> torch.nn.Module:
    """Points the torch module's tensors at the variables; returns it.

    Zero-copy views of the current values, kept until the next bridged
    call (see `_torch_views.TorchViews`).
    """
    with self._lock:
      self._views.lend()
    return self.module

  @tf.autograph.experimental.do_not_convert
  def call(
    self, args: Sequence[Any], kwargs: dict[str, Any], training: Any, output_signature: Any = None
  ) -> Any:
    """Runs the forward on TF tensors; see `TorchModule.__call__`.

    `output_signature`: nothing is inferred while tracing, every buffer is
    written back. Reading buffers, the forward and writing them back are
    one step (eagerly under the lock, in a graph in a `tf.CriticalSection`
    when it may write one), except in a replica of several (the strategy
    aggregates the writes)."""
    if _distribute.in_replica_of_several():
      return self._call(args, kwargs, training, output_signature)
    if tf.executing_eagerly():
      with self._lock:
        return self._call(args, kwargs, training, output_signature)
    # No CriticalSection under XLA: TF's launch holds the variables' locks.
    if self._may_write_buffers(training) and not _compat.in_xla_context():
      return self._exclusive.run(
        lambda after_writes: self._call(args, kwargs, training, output_signature, after_writes)
      )
    return self._call(args, kwargs, training, output_signature)

  def _may_write_buffers(self, training: Any) -> bool:
    if not self.buffer_names:
      return False
    if training is not None and not isinstance(training, (bool, np.bool_)):
      return True  # refused in `_call`
    mode_key = self._mode_key(None if training is None else bool(training))
    return self._mutated_buffers.get(mode_key) != frozenset()

  def _call(
    self,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    training: Any,
    output_signature: Any,
    after_writes: list[Any] | None = None,
  ) -> Any:
    if training is not None:
      training = _module_checks.as_python_bool(training, self.name)
    elif not tf.executing_eagerly():
      # A graph keeps the modes it was traced with (refused once they change).
      _guard.hold_to_modes(self.module, self.name, self.take_views_back)
      training = [m.training for m in self._modules]
    call = _call.bind_arguments(self.name, (args, kwargs))
    _distribute.check_call_context(self.name, self.variables.values())
    mode_key = self._mode_key(training)
    if self.runner is not None and not tf.executing_eagerly():
      translated = self.runner.call(call, training, mode_key, self._mutated_buffers, after_writes)
      if translated is not _runner.TORCH:
        return translated
    if not tf.executing_eagerly():
      _call.check_not_xla(self.name)
      in_c = self.torch_runner.call_or_none(
        call, training, mode_key, self._mutated_buffers, after_writes, output_signature
      )
      if in_c is not None:
        return in_c
    names = self.param_names + self.buffer_names
    vars_tf = _compat.read_values([self.variables[n] for n in names])
    n_params, n_vars = len(self.param_names), len(names)

    def run(args_torch: list[torch.Tensor]) -> _call.Outputs:
      with self._lock:
        # Until the forward starts (spans only when the timeline is on: the
        # per-call path).
        bind = _timeline.span(_timeline.BIND) if _timeline.on else None
        views = self._views
        if views.lent:
          views.take_back()
        views.calls_running += 1
        if views.calls_running == 1:
          views.suspend_hooks()
        try:
          return locked_run(args_torch, bind)
        finally:
          if bind is not None:
            bind.stop()
          views.calls_running -= 1
          if not views.calls_running:
            views.resume_hooks()

    def locked_run(args_torch: list[torch.Tensor], bind: _timeline.Span | None) -> _call.Outputs:
      known_mutated = (
        frozenset(self.buffer_names)
        if output_signature is not None
        else self._mutated_buffers.get(mode_key)
      )
      buffers_torch = {}
      for n, b in zip(self.buffer_names, args_torch[n_params:n_vars]):
        if b.is_meta and b.dim() == 0:
          # Finding the output shapes on meta tensors while tracing: scalar
          # buffers (BatchNorm's num_batches_tracked, which its forward may
          # read with `.item()`) get their current value, on the CPU, where
          # torch lets 0-d tensors mix with any device.
          with tf.init_scope():
            b = _exchange.tensor_to_torch(tf.convert_to_tensor(self.variables[n])).cpu()
        # Buffers the forward may write get a private copy, so torch never
        # writes into a TF buffer behind TF's back; the copy is then
        # assigned to the variable (which adopts it without copying).
        if known_mutated is None or n in known_mutated:
          b = b.clone()
        buffers_torch[n] = b
      tensors = dict(zip(self.param_names, args_torch[:n_params]))
      tensors.update(buffers_torch)
      a, kw = call.substitute(args_torch[n_vars:])
      if bind is not None:
        bind.stop()
      saved_modes = _module_checks.set_modes(self.module, self._modules, training)
      try:
        if known_mutated is None:
          # The first call in this mode (eagerly, or on meta tensors while
          # tracing) finds the buffers the forward writes; later calls in
          # this mode copy and write back exactly those.
          versions = {n: b._version for n, b in buffers_torch.items()}
          with _compiled.run_uncompiled(), _write_recorder.WriteRecorder() as recorder:
            result, reassigned = self._slots.call(tensors, a, kw)
          known_mutated = frozenset(
            n
            for n, b in buffers_torch.items()
            if b._version != versions[n] or recorder.wrote(b) or n in reassigned
          )
        else:
          result, reassigned = self._slots.call(tensors, a, kw)
      except (RuntimeError, TypeError) as err:
        _module_checks.explain_dtype_error(err, self.name, self.module, args_torch[n_vars:])
        raise
      finally:
        if saved_modes is not None:
          _module_checks.restore_modes(saved_modes)
      # A buffer the forward replaced (`self.buf = ...`): the new tensor.
      for n, t in reassigned.items():
        if n in buffers_torch:
          buffers_torch[n] = t
      # The written buffers cross as extra outputs, to be assigned.
      return _call.Outputs(result, {n: b for n, b in buffers_torch.items() if n in known_mutated})

    # Eagerly with no tape: no gradients (as `call_bridged` narrows), no specs to find.
    differentiable = [False] * (n_vars + len(call.args_tf))
    if not (eager := tf.executing_eagerly()) or _compat.tape_could_record():
      differentiable = (
        [self.variables[n].trainable for n in self.param_names]
        + [False] * len(self.buffer_names)
        + [_call.is_differentiable(a.dtype) for a in call.args_tf]
      )
    extra_signature = None
    if output_signature is not None:
      extra_signature = {
        n: tf.TensorSpec(self.variables[n].shape, self.variables[n].dtype)
        for n in self.buffer_names
      }
    # Output specs found by a real run while tracing use the current weights.
    stand_ins = None if eager else [functools.partial(self._current_value, n) for n in names]
    outputs = _call.call_bridged(
      run,
      vars_tf + call.args_tf,
      self.name,
      output_signature=output_signature,
      differentiable=differentiable,
      extra_signature=extra_signature,
      stand_ins=None if stand_ins is None else stand_ins + [None] * len(call.args_tf),
    )
    self._mutated_buffers[mode_key] = frozenset(outputs.extra)
    for n, value_tf in outputs.extra.items():
      self.variables[n].assign(value_tf)
      if after_writes is not None:
        after_writes.append(tf.convert_to_tensor(self.variables[n]))
    return outputs.result

  def _current_value(self, name: str) -> torch.Tensor:
    with tf.init_scope():
      return _exchange.tensor_to_torch(tf.convert_to_tensor(self.variables[name]))

  def _mode_key(self, training: bool | list[bool] | None) -> str:
    if isinstance(training, list):
      return "".join("1" if mode else "0" for mode in training)
    if training is not None:
      return str(bool(training))
    return "".join("1" if m.training else "0" for m in self._modules)

  def get_weights(self) -> dict[str, np.ndarray]:
    """`{state_dict name: np.ndarray}`, copies of the current values."""
    return _weights.current(self.state_names, self.variables)

  def set_weights(self, weights: Mapping[str, Any]) -> None:
    """Sets every variable from `{state_dict name: array}`, all or nothing."""
    _weights.assign(weights, self.state_names, self.variables, self.name)
