"""Which buffers a torch forward writes, found by watching the ops it runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchbridge._frameworks import _compat

_UNANNOTATED_STATS_WRITERS = frozenset(
  ("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm")
)


# The base is torch's TorchDispatchMode, found where this torch keeps it.
class WriteRecorder(_compat.torch_dispatch_mode()):  # type: ignore[misc]
  """Records the storages that the torch ops run under it write to.

  A write shows in the op's schema (`Tensor(a!)`), except for the batch
  norm kernels, which update the running statistics in place undeclared
  (and leave the version counters alone).
  """

  def __init__(self) -> None:
    super().__init__()
    self._storages: set[int] = set()

  def wrote(self, tensor_torch: torch.Tensor) -> bool:
    return _storage_key(tensor_torch) in self._storages

  def _record(self, value: Any) -> None:
    for t in value if isinstance(value, (list, tuple)) else [value]:
      if isinstance(t, torch.Tensor):
        self._storages.add(_storage_key(t))

  def __torch_dispatch__(
    self,
    func: torch._ops.OpOverload,
    types: Sequence[type],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
  ) -> Any:
    kwargs = kwargs or {}
    schema = func._schema
    for k, arg in enumerate(schema.arguments):
      if arg.alias_info is not None and arg.alias_info.is_write:
        self._record(args[k] if k < len(args) else kwargs.get(arg.name))
    if schema.name in _UNANNOTATED_STATS_WRITERS and len(args) > 5 and args[5]:
      self._record([args[3], args[4]])
    return func(*args, **kwargs)


def _storage_key(tensor_torch: torch.Tensor) -> int:
  # The storage's identity (not its address: empty storages share one).
  return tensor_torch.untyped_storage()._cdata  # pylint: disable=protected-access
