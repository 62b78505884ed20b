"""Running a torch module on tensors other than its own parameters and buffers.

What `torch.func.functional_call` does, for a module whose set of tensors is
known in advance: the places that hold each tensor (every submodule
attribute, tied tensors included) are found once, and a call only swaps
dict entries in and out. functional_call finds them again on every call,
which costs more than the forward of a small model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torchbridge._frameworks import _compat
from torchbridge._runtime import _timeline

if TYPE_CHECKING:
  import torch


class TensorSlots:
  """Where each parameter and buffer of a torch module is held.

  Args:
    module: the torch `nn.Module`.
    names: the canonical names (`named_parameters()` / `named_buffers()`,
      tied tensors once) of the tensors calls substitute.

  Examples:
    >>> import torch
    >>> net = torch.nn.Linear(2, 1)
    >>> own_weight = net.weight
    >>> slots = TensorSlots(net, ["weight", "bias"])
    >>> y, _ = slots.call({"weight": torch.ones(1, 2), "bias": torch.zeros(1)},
    ...                   (torch.tensor([[1.0, 2.0]]),), {})
    >>> y.tolist()
    [[3.0]]
    >>> net.weight is own_weight  # its own tensors are back
    True
  """

  def __init__(self, module: torch.nn.Module, names: Sequence[str]) -> None:
    by_id: dict[int, str] = {}
    for n, t in list(module.named_parameters()) + list(module.named_buffers()):
      by_id[id(t)] = n
    wanted = set(names)
    # (canonical name, the dict holding it, key): one per place, so a tied
    # tensor gets every one of its places.
    self._slots: list[tuple[str, dict[str, Any], str]] = []
    for _, sub in module.named_modules(remove_duplicate=False):
      for table in _compat.module_tensor_tables(sub):
        for key, t in table.items():
          if t is not None and by_id.get(id(t)) in wanted:
            self._slots.append((by_id[id(t)], table, key))
    self._module = module

  def call(
    self, tensors: Mapping[str, torch.Tensor], args: Sequence[Any], kwargs: Mapping[str, Any]
  ) -> tuple[Any, dict[str, torch.Tensor]]:
    """Runs `module(*args, **kwargs)` with `tensors` in place of its own.

    Args:
      tensors: `{canonical name: torch tensor}`.
      args, kwargs: the forward's arguments.

    Returns:
      `(result, reassigned)`: the forward's result, and `{canonical name:
        tensor}` for the tensors the forward replaced by assignment
        (`self.buf = ...`) instead of writing into them.
    """
    slots = self._slots
    originals = [table[key] for _, table, key in slots]
    try:
      for name, table, key in slots:
        table[key] = tensors[name]
      if _timeline.on:
        with _timeline.span(_timeline.FORWARD):
          result = self._module(*args, **kwargs)
      else:  # the per-call path: not even a no-op span
        result = self._module(*args, **kwargs)
      reassigned: dict[str, torch.Tensor] = {}
      for name, table, key in slots:
        if table[key] is not tensors[name]:
          reassigned[name] = table[key]
      return result, reassigned
    finally:
      for (_, table, key), original in zip(slots, originals):
        table[key] = original
