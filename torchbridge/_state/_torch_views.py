"""The weights held once: a wrapped torch module's tensors as views of its
TF variables between bridged calls (see `TorchViews`)."""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch  # before TensorFlow, as everywhere in torchbridge
import tensorflow as tf
from torch.utils.hooks import RemovableHandle

from torchbridge._frameworks import _compat
from torchbridge._crossing import _exchange
from torchbridge._crossing import _stats
from torchbridge._state import _before_calls

_HOLDERS: dict[
  int, tuple[weakref.ref[torch.Tensor], weakref.ref[TorchViews]]
] = {}  # id(torch tensor) -> (weakref to it, weakref to TorchViews)

# A torch tensor and the variable (tf.Variable or keras.Variable) it views.
_Pair = tuple[torch.Tensor, Any]


class TorchViews:
  """The torch module's own tensors, pointed at its variables' values.

  TF copies a variable's buffer before an in-place update when anything
  else references it (`PrepareToUpdateVariable`), so a torch view kept
  across an optimizer step would cost a copy of the weights per step and go
  stale. The module's tensors are therefore lent zero-copy views of the
  current values only between bridged calls: right after wrapping, when
  `torch_module` is read, and when the torch module or any submodule is
  called or its `state_dict()` taken outside a bridged call (hooks, taken
  out during bridged calls).
  A bridged call takes them back, leaving placeholders that hold no memory
  (one element, NaN for floating dtypes, broadcast to the tensor's shape);
  calls never read these tensors, they swap the variables' values into the
  module's slots. While taken back, each tensor's class is a subclass of its
  own (`_lending_class`) whose `copy.deepcopy` and pickling (`torch.save`)
  lend the views first, so copies hold the values.

  When the wrapper is garbage collected, the torch tensors get copies of
  the last values (counted as copies in `exchange_stats()`) and the hooks
  are removed, so a torch module outlives its
  wrapper intact. A tensor held by another live wrapper (a module wrapped
  twice, or a submodule of a wrapped module) is first pointed at that
  wrapper's current values (`lend_from_holders`).
  """

  def __init__(self, state: object, module: torch.nn.Module, pairs: dict[str, _Pair]) -> None:
    # canonical name -> (torch tensor, variable)
    self._pairs = pairs
    self.lent = False
    # Every variable watched (`watch_variables`): lent views are current.
    self.watched = False
    self.calls_running = 0
    ref = weakref.ref(self)
    for t, _ in pairs.values():
      _HOLDERS[id(t)] = (weakref.ref(t, _forget(id(t))), ref)
    hooks: list[RemovableHandle] = []
    # (the module's forward pre-hook dict, key, hook): taken out during
    # bridged calls, where the hooks would only cost time.
    self._forward_hooks: list[tuple[dict[int, Any], int, Any]] = []
    for sub in module.modules():
      handle = sub.register_forward_pre_hook(_LendOnUse(ref, "forward"))
      hooks.append(handle)
      table = _compat.forward_pre_hook_table(sub)
      self._forward_hooks.append((table, handle.id, table[handle.id]))
      hooks.append(sub.register_state_dict_pre_hook(_LendOnUse(ref, "state_dict")))
    self.lend()
    finalizer = weakref.finalize(state, _copy_back, list(pairs.values()), hooks)
    finalizer.atexit = False  # at exit nothing reads the torch module again

  def lend(self) -> None:
    """Points every torch tensor at a zero-copy view of its variable (no
    work where the views lent are current: lent and watched)."""
    if self.lent and self.watched:
      return
    with tf.init_scope(), torch.no_grad():
      pairs = list(self._pairs.values())
      values_tf = _compat.read_values([var for _, var in pairs])
      for (t, _), value_tf in zip(pairs, values_tf):
        t.data = _exchange.tensor_to_torch(value_tf)
        original = getattr(type(t), "_torchbridge_original_class", None)
        if original is not None:
          t.__class__ = original
    self.lent = True
    if self.watched:  # current until taken back: torch calls need no hook
      self.suspend_hooks()

  def hook_ids(self) -> set[int]:
    """The ids of the forward hooks these views put on the module."""
    return {id(hook) for _, _, hook in self._forward_hooks}

  def suspend_hooks(self) -> None:
    """Takes the forward hooks out for a bridged call."""
    for table, key, _ in self._forward_hooks:
      table.pop(key, None)

  def resume_hooks(self) -> None:
    """Puts the forward hooks back, first in each module's order (none
    while the views lent are current)."""
    if self.lent and self.watched:
      return
    for table, key, hook in self._forward_hooks:
      table[key] = hook
      move_to_end = getattr(table, "move_to_end", None)
      if move_to_end is not None:
        move_to_end(key, last=False)

  def take_back(self) -> None:
    """Replaces the views with placeholders (no-op when none are lent)."""
    if not self.lent:
      return
    with torch.no_grad():
      for t, _ in self._pairs.values():
        t.data = _placeholder(t)
        t.__class__ = _lending_class(type(t))
    self.lent = False
    if not self.calls_running:  # a bridged call puts them back after it
      self.resume_hooks()


def watch_variables(views: TorchViews, take_back: Callable[[], None]) -> None:
  """Keeps lent views current: every op that reads or writes a variable
  takes its handle (`_compat.watch_handle`), and then `take_back()` runs,
  eagerly at once, and before each call of a graph being traced. An update
  while a view is lent would otherwise copy the variable's buffer (or
  `assign` swap in a new one), and a torch module held by the user would
  compute with the old values; with the views taken back the update
  needs no copy, and the next torch call lends the new values. Sets
  `views.watched` where every variable could be watched (not a
  distributed one): `lend` then skips views already lent."""
  # Held weakly, by the variables and by every graph that takes them.
  owner = weakref.ref(take_back.__self__)  # type: ignore[attr-defined]
  method = take_back.__func__  # type: ignore[attr-defined]

  def take_back_now() -> None:
    state = owner()
    if state is not None:
      method(state)

  def on_handle() -> None:
    if tf.executing_eagerly():
      take_back_now()
    else:
      _before_calls.before_each_call(("views", id(take_back_now)), take_back_now)

  watched = [_compat.watch_handle(var, on_handle) for _, var in views._pairs.values()]
  views.watched = all(watched)
  if views.watched and views.lent:
    views.suspend_hooks()


class _LendOnUse:
  """A hook on each torch submodule: lends the views when torch code uses
  the module outside a bridged call (a forward, `state_dict()`).

  Pickled or deep-copied with the module (`torch.save(module)`,
  `copy.deepcopy(module)`), it becomes a no-op that needs no torchbridge
  to load: the copy is a plain torch module.
  """

  def __init__(self, views_ref: weakref.ref[TorchViews], kind: str) -> None:
    self._views_ref = views_ref
    self._kind = kind

  def __call__(self, module: torch.nn.Module, *unused: object) -> None:
    views = self._views_ref()
    if views is not None and not views.lent and not views.calls_running:
      views.lend()

  def __reduce__(self) -> tuple[Any, ...]:
    if self._kind == "forward":  # `{}.get(module, args)` returns args
      return getattr, ({}, "get")
    return functools.partial, (slice,)  # takes three arguments, unused


_LENDING_CLASSES: dict[type, type] = {}


def _lending_class(cls: type[torch.Tensor]) -> type[torch.Tensor]:
  """A subclass of a torch tensor class whose deepcopy and pickling first
  lend the views of the wrapper holding the tensor (see `TorchViews`)."""
  if "_torchbridge_original_class" in cls.__dict__:
    return cls
  lending = _LENDING_CLASSES.get(cls)
  if lending is None:
    lending = type(
      cls.__name__,
      (cls,),
      {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_torchbridge_original_class": cls,
        "__torch_function__": _compat.disabled_torch_function_impl(),
        "__deepcopy__": _deepcopy_lent,
        "__reduce_ex__": _reduce_ex_lent,
      },
    )
    _LENDING_CLASSES[cls] = lending
  return lending


def _lend_or_restore(tensor_torch: torch.Tensor) -> None:
  lend_from_holders([tensor_torch])
  original = getattr(type(tensor_torch), "_torchbridge_original_class", None)
  if original is not None:  # no live holder: nothing to lend
    tensor_torch.__class__ = original


def _deepcopy_lent(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
  _lend_or_restore(self)
  return copy.deepcopy(self, memo)


def _reduce_ex_lent(self: torch.Tensor, protocol: int) -> Any:
  _lend_or_restore(self)
  return self.__reduce_ex__(protocol)


def lend_from_holders(tensors_torch: Iterable[torch.Tensor]) -> None:
  """Points tensors that another live wrapper holds at its values."""
  for t in tensors_torch:
    entry = _HOLDERS.get(id(t))
    if entry is not None and entry[0]() is t:
      holder = entry[1]()
      if holder is not None:
        holder.lend()


def _forget(key: int) -> Callable[[object], None]:
  def callback(_: object) -> None:
    entry = _HOLDERS.get(key)
    if entry is not None and entry[0]() is None:
      del _HOLDERS[key]

  return callback


def _copy_back(pairs: Sequence[_Pair], hooks: Sequence[RemovableHandle]) -> None:
  """Gives torch tensors copies of their variables' last values."""
  for handle in hooks:
    handle.remove()
  # On a thread of its own, which starts eager and with no tape: garbage
  # collection runs this wherever it happens, e.g. while a tf.Graph is the
  # default (inside tf.saved_model.save), or inside another call's
  # tf.custom_gradient, whose variable watcher would record these reads
  # and fail that call ("grad_fn must accept keyword argument
  # 'variables'", seen in tests/test_ppo.py).
  copied: list[int] = []
  copier = threading.Thread(target=_copy_values, args=(pairs, copied))
  copier.start()
  copier.join()
  # Counted here, not on the copier: the collection that runs this may
  # have interrupted this thread inside the counters' lock (reentrant).
  for nbytes in copied:
    _stats.count(nbytes)


def _copy_values(pairs: Sequence[_Pair], copied: list[int]) -> None:
  with tf.init_scope(), torch.no_grad():
    for t, var in pairs:
      # A copy, counted as one (not as the zero-copy view it is made from).
      t.data = _exchange.tensor_to_torch(tf.convert_to_tensor(var), counted=False).clone()
      copied.append(t.numel() * t.element_size())
      original = getattr(type(t), "_torchbridge_original_class", None)
      if original is not None:
        t.__class__ = original


def _placeholder(tensor_torch: torch.Tensor) -> torch.Tensor:
  fill = float("nan") if tensor_torch.is_floating_point() or tensor_torch.is_complex() else 0
  one = torch.full((), fill, dtype=tensor_torch.dtype, device=tensor_torch.device)
  return one.expand(tensor_torch.shape)


# Kernels that update the running statistics (arguments 3 and 4) in place when
# their `training` argument (5) is true, with no write annotation in their
# schema, and so without bumping the tensors' version counters.
