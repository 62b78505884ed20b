"""The variables that mirror a torch module's state, and calls through them.

Shared by `TorchModule` (plain `tf.Variable`s) and `keras.TorchLayer`
(`keras.Variable`s): both hand this class a dict of variables, and it runs
the torch module on their current values through the bridge
(`call_bridged`, the Python path). Which calls take it is the runners'
choice (`_runners/`), which also read the state through it: the module
held still for a capture (`held`), the buffers a call wrote (`assign_writes`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch  # noqa: F401  (before TensorFlow, as everywhere in torchbridge)
import tensorflow as tf

from torchbridge._state import _bridged_call
from torchbridge._state import _distribute
from torchbridge._state import _exclusive
from torchbridge._crossing import _exchange
from torchbridge._state import _module_checks
from torchbridge._state import _swap
from torchbridge._state import _torch_views
from torchbridge._state import _weights


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
    # Every name a forward may read a tensor by -> canonical name: the
    # state_dict's, and the canonical names themselves (non-persistent
    # buffers, such as Hugging Face's position ids, are in no state_dict).
    self.tensor_names = {**{n: n for n in list(params) + list(buffers)}, **self.state_names}
    # torch modes -> the buffers the forward writes (learnt on a first call).
    self._mutated_buffers: dict[str, frozenset[str]] = {}
    # One forward at a time: a call swaps tensors into the shared module.
    self.lock = threading.RLock()
    self.exclusive = _exclusive.ExclusiveCalls(owner_name)  # read, op, assign
    self._slots = _swap.TensorSlots(module, self.param_names + self.buffer_names)
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
    _torch_views.watch_variables(self._views, self.take_views_back)

  def take_views_back(self) -> None:
    """Takes back the torch module's views of the variables (lent when it
    was read: TF would copy each variable on its next update)."""
    views = self._views
    if views.lent:
      with self.lock:
        views.take_back()

  def sync_torch(self) -> torch.nn.Module:
    """Points the torch module's tensors at the variables; returns it.

    Zero-copy views of the current values, kept until the next bridged
    call (see `_torch_views.TorchViews`).
    """
    with self.lock:
      self._views.lend()
    return self.module

  @contextlib.contextmanager
  def held(self, training: bool | list[bool]) -> Iterator[None]:
    """The module as a graph call would run it, for a capture: under its
    lock, its tensors viewing the variables' values, torchbridge's own
    hooks suspended, the call's modes set."""
    with self.lock:
      views = self._views
      views.lend()
      views.suspend_hooks()
      saved = _module_checks.set_modes(self.module, self._modules, training)
      try:
        yield
      finally:
        if saved is not None:
          _module_checks.restore_modes(saved)
        views.resume_hooks()

  def own_hooks(self) -> frozenset[int]:
    """The ids of the forward hooks torchbridge put on the module."""
    return frozenset(self._views.hook_ids())

  def trainable(self) -> list[bool]:
    """Per variable (parameters, then buffers): whether it gets a gradient."""
    return [self.variables[n].trainable for n in self.param_names] + [False] * len(
      self.buffer_names
    )

  def plain_variables(self) -> dict[str, tf.Variable]:
    """The variables as `tf.Variable`s, by canonical name (a
    `keras.Variable` of a TorchLayer holds one)."""
    return {n: v if isinstance(v, tf.Variable) else v.value for n, v in self.variables.items()}

  def modes(self) -> list[bool]:
    """The train/eval flag of the module and every submodule, now."""
    return [m.training for m in self._modules]

  def may_write_buffers(self, training: Any) -> bool:
    """Whether a call in this mode may write a buffer (not known yet: yes)."""
    if not self.buffer_names:
      return False
    if training is not None and not isinstance(training, (bool, np.bool_)):
      return True  # refused by the call
    mode_key = self.mode_key(None if training is None else bool(training))
    return self._mutated_buffers.get(mode_key) != frozenset()

  def assign_writes(
    self, writes: Mapping[str, tf.Tensor], mode_key: str, after_writes: list[Any] | None
  ) -> None:
    """Assigns the buffers a call wrote to their variables, noted for the
    mode; their new values appended to `after_writes` (the call's critical
    section)."""
    self._mutated_buffers[mode_key] = frozenset(writes)
    for name, value_tf in writes.items():
      variable = self.variables[name]
      variable.assign(value_tf)
      if after_writes is not None:
        after_writes.append(tf.convert_to_tensor(variable))

  def call_bridged(
    self,
    call: Any,
    training: bool | list[bool] | None,
    mode_key: str,
    output_signature: Any,
    after_writes: list[Any] | None,
  ) -> Any:
    """The call through the bridge (`_bridged_call.py`): the forward's
    Python on zero-copy views of the variables; the buffers it wrote
    assigned."""
    return _bridged_call.call_bridged(
      self, call, training, mode_key, output_signature, after_writes
    )

  def current_value(self, name: str) -> torch.Tensor:
    """The variable `name`'s value now, as torch sees it (outside any graph)."""
    with tf.init_scope():
      return _exchange.tensor_to_torch(tf.convert_to_tensor(self.variables[name]))

  def mode_key(self, training: bool | list[bool] | None) -> str:
    """The torch modes of a call as a key (one character per submodule)."""
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
